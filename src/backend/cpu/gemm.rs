//! The packed, register-blocked f32 GEMM behind `a·b` and `a·bᵀ` when `a` has several rows
//! (prefill, batched attention), in the GotoBLAS layout:
//!
//! - `a` is packed once into panels of `mr` rows, `k` deep, element `(r, p)` at `p·mr + r`;
//! - each task owns a block of at most [`NC`] output columns and, for each [`KC`]-deep slice
//!   of `k`, packs that block of `op(b)` into panels of [`NR`] columns (`(p, c)` at
//!   `p·NR + c`, a few hundred KiB that stay in L2), then runs a micro-kernel that keeps an
//!   `mr × NR` tile of the output in registers for every pair of panels.
//!
//! Only the packing of `b` knows whether `b` is `[k, n]` or `[n, k]`; the micro-kernel and
//! everything else are shared. Short last panels are padded with zeros, so `m`, `n` and `k`
//! need not be multiples of anything.

use super::parallel::{for_each_row, map_tasks};
use super::simd::SimdLevel;

/// Output columns per micro-kernel tile (two AVX2 vectors, one AVX-512 vector).
const NR: usize = 16;

/// Depth of one packed slice: an `mr × KC` panel of `a` stays in L1 while it meets every
/// panel of `b`.
const KC: usize = 256;

/// Most output columns one task owns: its packed `KC × NC` block of `b` (256 KiB) stays in L2.
const NC: usize = 256;

/// The largest `mr` any micro-kernel uses.
const MAX_MR: usize = 12;

/// How the right-hand matrix is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RhsLayout {
    /// `b[k, n]`: the product is `a·b`.
    Plain,
    /// `b[n, k]`: the product is `a·bᵀ`.
    Transposed,
}

/// A micro-kernel: `c[r·NR + j] = Σ_p a[p·mr + r] · b[p·NR + j]` over the `kc` steps the two
/// panels hold (`a.len() = kc·mr`, `b.len() = kc·NR`).
type MicroKernel = fn(&[f32], &[f32], &mut [f32; MAX_MR * NR]);

/// The micro-kernel for `level` and its row count `mr`.
fn micro_kernel(level: SimdLevel) -> (MicroKernel, usize) {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => (x86::kernel_avx512, 12),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => (x86::kernel_avx2, 6),
        _ => (kernel_portable, 4),
    }
}

/// `out[m, n] = a[m, k] · op(b)` (`out` is overwritten).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    level: SimdLevel,
    a: &[f32],
    b: &[f32],
    layout: RhsLayout,
    out: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let (kernel, mr) = micro_kernel(level);
    let a_panels = m.div_ceil(mr);
    let mut packed_a = vec![0f32; a_panels * mr * k];
    if k > 0 {
        for_each_row(&mut packed_a, mr * k, 1, |panel, dst| {
            for r in 0..mr.min(m - panel * mr) {
                let row = &a[(panel * mr + r) * k..(panel * mr + r + 1) * k];
                for (p, &v) in row.iter().enumerate() {
                    dst[p * mr + r] = v;
                }
            }
        });
    }
    // Column blocks: at most NC wide, and enough of them to balance the threads.
    let nc = n
        .div_ceil(super::parallel::threads() * 4)
        .next_multiple_of(NR)
        .clamp(NR, NC);
    let blocks = n.div_ceil(nc);
    // A product of k costs about k/8 element copies (8-wide FMA).
    let tiles = map_tasks(blocks, m * n * k / 8, |blk| {
        let j0 = blk * nc;
        let width = nc.min(n - j0);
        let b_panels = width.div_ceil(NR);
        let mut packed_b = vec![0f32; b_panels * NR * KC.min(k)];
        let mut tile = vec![0f32; m * width];
        let mut c = [0f32; MAX_MR * NR];
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            pack_b(b, layout, n, k, j0, width, p0, kc, &mut packed_b);
            for ip in 0..a_panels {
                let a_panel = &packed_a[ip * mr * k + p0 * mr..ip * mr * k + (p0 + kc) * mr];
                let rows = mr.min(m - ip * mr);
                for jp in 0..b_panels {
                    kernel(a_panel, &packed_b[jp * NR * kc..(jp + 1) * NR * kc], &mut c);
                    let cols = NR.min(width - jp * NR);
                    for r in 0..rows {
                        let dst = &mut tile[(ip * mr + r) * width + jp * NR..][..cols];
                        for (d, &s) in dst.iter_mut().zip(&c[r * NR..r * NR + cols]) {
                            *d += s;
                        }
                    }
                }
            }
        }
        tile
    });
    for (blk, tile) in tiles.iter().enumerate() {
        let j0 = blk * nc;
        let width = nc.min(n - j0);
        for i in 0..m {
            out[i * n + j0..i * n + j0 + width].copy_from_slice(&tile[i * width..(i + 1) * width]);
        }
    }
}

/// Packs columns `j0..j0 + width` and depths `p0..p0 + kc` of `op(b)` into `NR`-wide panels
/// (`(p, c)` of panel `jp` at `jp·NR·kc + p·NR + c`), zeros past the last column.
#[allow(clippy::too_many_arguments)]
fn pack_b(
    b: &[f32],
    layout: RhsLayout,
    n: usize,
    k: usize,
    j0: usize,
    width: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
) {
    for (jp, panel) in dst
        .chunks_exact_mut(NR * kc)
        .take(width.div_ceil(NR))
        .enumerate()
    {
        let cols = NR.min(width - jp * NR);
        let j = j0 + jp * NR;
        match layout {
            RhsLayout::Plain => {
                for (p, d) in panel.chunks_exact_mut(NR).enumerate() {
                    let src = &b[(p0 + p) * n + j..][..cols];
                    d[..cols].copy_from_slice(src);
                    d[cols..].fill(0.0);
                }
            }
            RhsLayout::Transposed => {
                if cols < NR {
                    panel.fill(0.0);
                }
                for c in 0..cols {
                    let src = &b[(j + c) * k + p0..][..kc];
                    for (p, &v) in src.iter().enumerate() {
                        panel[p * NR + c] = v;
                    }
                }
            }
        }
    }
}

/// The micro-kernel in plain Rust (4 × 16), which compilers vectorise where they can: the
/// scalar level, NEON and wasm `simd128`. It defines what the x86 kernels must agree with.
fn kernel_portable(a: &[f32], b: &[f32], c: &mut [f32; MAX_MR * NR]) {
    const MR: usize = 4;
    let mut acc = [[0f32; NR]; MR];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for r in 0..MR {
            for j in 0..NR {
                acc[r][j] += ap[r] * bp[j];
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        c[r * NR..(r + 1) * NR].copy_from_slice(row);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MAX_MR, NR};
    use std::arch::x86_64::*;

    /// 6 × 16 with AVX2+FMA: twelve accumulators, two loads of `b` and six broadcasts of `a`
    /// per step.
    pub(super) fn kernel_avx2(a: &[f32], b: &[f32], c: &mut [f32; MAX_MR * NR]) {
        // SAFETY: `micro_kernel` selects this only at the Avx2 level, which runtime detection
        // (or `WEBTENSOR_CPU_SIMD`, checked against it) confirmed.
        unsafe { avx2(a, b, c) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(a: &[f32], b: &[f32], c: &mut [f32; MAX_MR * NR]) {
        const MR: usize = 6;
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
            // SAFETY: `bp` holds NR = 16 floats.
            let (b0, b1) = unsafe {
                (
                    _mm256_loadu_ps(bp.as_ptr()),
                    _mm256_loadu_ps(bp.as_ptr().add(8)),
                )
            };
            for r in 0..MR {
                let av = _mm256_set1_ps(ap[r]);
                acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
            }
        }
        for (r, pair) in acc.iter().enumerate() {
            // SAFETY: row r of `c` holds NR = 16 floats (r < 6 ≤ MAX_MR).
            unsafe {
                _mm256_storeu_ps(c.as_mut_ptr().add(r * NR), pair[0]);
                _mm256_storeu_ps(c.as_mut_ptr().add(r * NR + 8), pair[1]);
            }
        }
    }

    /// 12 × 16 with AVX-512F: twelve accumulators, one load of `b` and twelve broadcasts of
    /// `a` per step.
    pub(super) fn kernel_avx512(a: &[f32], b: &[f32], c: &mut [f32; MAX_MR * NR]) {
        // SAFETY: as `kernel_avx2`, at the Avx512 level.
        unsafe { avx512(a, b, c) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(a: &[f32], b: &[f32], c: &mut [f32; MAX_MR * NR]) {
        const MR: usize = 12;
        let mut acc = [_mm512_setzero_ps(); MR];
        for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
            // SAFETY: `bp` holds NR = 16 floats.
            let bv = unsafe { _mm512_loadu_ps(bp.as_ptr()) };
            for r in 0..MR {
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(ap[r]), bv, acc[r]);
            }
        }
        for (r, v) in acc.iter().enumerate() {
            // SAFETY: row r of `c` holds NR = 16 floats (r < 12 = MAX_MR).
            unsafe { _mm512_storeu_ps(c.as_mut_ptr().add(r * NR), *v) };
        }
    }
}
