//! The packed, register-blocked f32 GEMM behind `a·b` and `a·bᵀ` when `a` has several rows
//! (prefill, batched attention), in the GotoBLAS layout:
//!
//! - `a` is packed once into panels of `mr` rows, `k` deep, element `(r, p)` at `p·mr + r`;
//! - each task owns a block of at most `nc` output columns and, for each `kc`-deep slice of
//!   `k`, packs that block of `op(b)` into panels of [`NR`] columns (`(p, c)` at `p·NR + c`,
//!   256 KiB that stay in L2), then runs a micro-kernel that keeps an `mr × NR` tile of the
//!   output in registers for every pair of panels and adds it into the task's output block.
//!
//! Only the packing of `b` and the block shape ([`RhsLayout::block`]) know whether `b` is
//! `[k, n]` or `[n, k]`; the micro-kernels and everything else are shared. The task's output
//! block is padded to whole panels and short last panels are padded with zeros, so `m`, `n`
//! and `k` need not be multiples of anything.

use super::parallel::{for_each_row, map_tasks};
use super::simd::SimdLevel;

/// Output columns per micro-kernel tile (two AVX2 vectors, one AVX-512 vector).
const NR: usize = 16;

/// How the right-hand matrix is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RhsLayout {
    /// `b[k, n]`: the product is `a·b`.
    Plain,
    /// `b[n, k]`: the product is `a·bᵀ`.
    Transposed,
}

impl RhsLayout {
    /// The packed block of `op(b)` one task handles at a time, `(kc, nc)`: `kc` deep and at
    /// most `nc` wide, 256 KiB either way so it stays in L2. Each is long along the axis `b`
    /// stores contiguously, so packing reads long runs: `a·b` 64 deep × 1024 wide (rows of
    /// `b`), `a·bᵀ` 512 deep × 128 wide (rows of `bᵀ`'s columns).
    fn block(self) -> (usize, usize) {
        match self {
            RhsLayout::Plain => (64, 1024),
            RhsLayout::Transposed => (512, 128),
        }
    }
}

/// A micro-kernel: `c[r·ldc + j] += Σ_p a[p·mr + r] · b[p·NR + j]` for `r < mr`, `j < NR`
/// over the `kc` steps the two panels hold (`a.len() = kc·mr`, `b.len() = kc·NR`).
type MicroKernel = fn(a: &[f32], b: &[f32], c: &mut [f32], ldc: usize);

/// The micro-kernels for `level` with their row counts `mr`, best first.
fn micro_kernels(level: SimdLevel) -> &'static [(MicroKernel, usize)] {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => &[(x86::kernel_avx512::<12>, 12), (x86::kernel_avx512::<8>, 8)],
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => &[(x86::kernel_avx2::<6>, 6), (x86::kernel_avx2::<4>, 4)],
        _ => &[(kernel_portable, 4)],
    }
}

/// The micro-kernel for `m` rows: the one whose panels pad `m` least (every padded row
/// costs a full row of work), the best on a tie.
fn micro_kernel(level: SimdLevel, m: usize) -> (MicroKernel, usize) {
    let kernels = micro_kernels(level);
    let mut best = kernels[0];
    for &(kernel, mr) in kernels {
        if m.next_multiple_of(mr) < m.next_multiple_of(best.1) {
            best = (kernel, mr);
        }
    }
    best
}

/// Checks that `c` holds the `mr × NR` tile a micro-kernel adds into.
fn check_tile(c: &[f32], mr: usize, ldc: usize) {
    assert!(ldc >= NR && c.len() >= (mr - 1) * ldc + NR);
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
    let (kernel, mr) = micro_kernel(level, m);
    let (kc_max, nc_max) = layout.block();
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
    // Column blocks: at most nc_max wide, and enough of them to balance the threads.
    let nc = n
        .div_ceil(super::parallel::threads() * 4)
        .next_multiple_of(NR)
        .clamp(NR, nc_max);
    let blocks = n.div_ceil(nc);
    // A product of k costs about k/8 element copies (8-wide FMA).
    let tiles = map_tasks(blocks, m * n * k / 8, |blk| {
        let j0 = blk * nc;
        let width = nc.min(n - j0);
        let b_panels = width.div_ceil(NR);
        // The task's output block, padded to whole panels: row stride `ldc`.
        let ldc = b_panels * NR;
        let mut packed_b = vec![0f32; b_panels * NR * kc_max.min(k)];
        let mut tile = vec![0f32; a_panels * mr * ldc];
        for p0 in (0..k).step_by(kc_max) {
            let kc = kc_max.min(k - p0);
            pack_b(level, b, layout, n, k, j0, width, p0, kc, &mut packed_b);
            for ip in 0..a_panels {
                let a_panel = &packed_a[ip * mr * k + p0 * mr..ip * mr * k + (p0 + kc) * mr];
                for jp in 0..b_panels {
                    let b_panel = &packed_b[jp * NR * kc..(jp + 1) * NR * kc];
                    kernel(a_panel, b_panel, &mut tile[ip * mr * ldc + jp * NR..], ldc);
                }
            }
        }
        tile
    });
    for (blk, tile) in tiles.iter().enumerate() {
        let j0 = blk * nc;
        let width = nc.min(n - j0);
        let ldc = width.next_multiple_of(NR);
        for i in 0..m {
            out[i * n + j0..i * n + j0 + width].copy_from_slice(&tile[i * ldc..i * ldc + width]);
        }
    }
}

/// Packs columns `j0..j0 + width` and depths `p0..p0 + kc` of `op(b)` into `NR`-wide panels
/// (`(p, c)` of panel `jp` at `jp·NR·kc + p·NR + c`), zeros past the last column.
#[allow(clippy::too_many_arguments)]
fn pack_b(
    level: SimdLevel,
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
                // Rows of `b` past the last column repeat it; `transpose_into` reads `cols`.
                let rows: [&[f32]; NR] =
                    std::array::from_fn(|c| &b[(j + c.min(cols - 1)) * k + p0..][..kc]);
                transpose_into(level, &rows[..cols], panel);
            }
        }
    }
}

/// `panel[p·NR + c] = rows[c][p]` for every `c < rows.len() ≤ NR` and `p < kc`, zeros in the
/// columns past `rows.len()` (`panel.len() = kc·NR`, every row `kc` long).
fn transpose_into(level: SimdLevel, rows: &[&[f32]], panel: &mut [f32]) {
    let kc = panel.len() / NR;
    assert!(rows.len() <= NR && rows.iter().all(|r| r.len() == kc));
    if rows.len() < NR {
        panel.fill(0.0);
    }
    // Whole groups of eight rows in registers where the level allows, the rest here.
    let done = match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 => x86::transpose_groups(rows, panel),
        _ => 0,
    };
    for (c, row) in rows.iter().enumerate().skip(done) {
        for (p, &v) in row.iter().enumerate() {
            panel[p * NR + c] = v;
        }
    }
}

/// The micro-kernel in plain Rust (4 × 16), which compilers vectorise where they can: the
/// scalar level, NEON and wasm `simd128`. It defines what the x86 kernels must agree with.
fn kernel_portable(a: &[f32], b: &[f32], c: &mut [f32], ldc: usize) {
    const MR: usize = 4;
    check_tile(c, MR, ldc);
    let mut acc = [[0f32; NR]; MR];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for r in 0..MR {
            for j in 0..NR {
                acc[r][j] += ap[r] * bp[j];
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (d, &s) in c[r * ldc..r * ldc + NR].iter_mut().zip(row) {
            *d += s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{check_tile, NR};
    use std::arch::x86_64::*;

    /// `MR` × 16 with AVX2+FMA (`MR` = 6 or 4): `2·MR` accumulators, two loads of `b` and
    /// `MR` broadcasts of `a` per step.
    pub(super) fn kernel_avx2<const MR: usize>(a: &[f32], b: &[f32], c: &mut [f32], ldc: usize) {
        check_tile(c, MR, ldc);
        // SAFETY: `micro_kernel` selects this only at the Avx2 level, which runtime detection
        // (or `WEBTENSOR_CPU_SIMD`, checked against it) confirmed; `c` holds the tile.
        unsafe { avx2::<MR>(a, b, c, ldc) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2<const MR: usize>(a: &[f32], b: &[f32], c: &mut [f32], ldc: usize) {
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
            // SAFETY: row r of the tile holds NR = 16 floats at `r·ldc` (checked by the caller).
            unsafe {
                let p = c.as_mut_ptr().add(r * ldc);
                _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), pair[0]));
                let p = p.add(8);
                _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), pair[1]));
            }
        }
    }

    /// `MR` × 16 with AVX-512F (`MR` = 12 or 8): `MR` accumulators, one load of `b` and `MR`
    /// broadcasts of `a` per step.
    pub(super) fn kernel_avx512<const MR: usize>(a: &[f32], b: &[f32], c: &mut [f32], ldc: usize) {
        check_tile(c, MR, ldc);
        // SAFETY: as `kernel_avx2`, at the Avx512 level.
        unsafe { avx512::<MR>(a, b, c, ldc) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn avx512<const MR: usize>(a: &[f32], b: &[f32], c: &mut [f32], ldc: usize) {
        let mut acc = [_mm512_setzero_ps(); MR];
        for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
            // SAFETY: `bp` holds NR = 16 floats.
            let bv = unsafe { _mm512_loadu_ps(bp.as_ptr()) };
            for r in 0..MR {
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(ap[r]), bv, acc[r]);
            }
        }
        for (r, v) in acc.iter().enumerate() {
            // SAFETY: row r of the tile holds NR = 16 floats at `r·ldc` (checked by the caller).
            unsafe {
                let p = c.as_mut_ptr().add(r * ldc);
                _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), *v));
            }
        }
    }

    /// [`super::transpose_into`] for whole groups of eight rows (returns how many rows it
    /// wrote): each 8 × 8 block loaded as eight vectors and transposed in registers with AVX2,
    /// depths past the last whole block written one by one.
    pub(super) fn transpose_groups(rows: &[&[f32]], panel: &mut [f32]) -> usize {
        let kc = panel.len() / NR;
        assert!(rows.len() <= NR && rows.iter().all(|r| r.len() == kc));
        let mut c0 = 0;
        while c0 + 8 <= rows.len() {
            let group: [&[f32]; 8] = std::array::from_fn(|t| rows[c0 + t]);
            // SAFETY: the caller selects this only at the Avx2 level or above (runtime
            // detected); every row is `kc` long and `c0 + 8 ≤ NR`, checked above.
            let p = unsafe { transpose8_avx2(group, panel, c0) };
            for (t, row) in group.iter().enumerate() {
                for (q, &v) in row.iter().enumerate().skip(p) {
                    panel[q * NR + c0 + t] = v;
                }
            }
            c0 += 8;
        }
        c0
    }

    /// Rows `c0..c0 + 8` of the panel for the depths of whole 8 × 8 blocks; returns the first
    /// depth it left.
    ///
    /// # Safety
    /// The CPU must support AVX2; every row must be `panel.len() / NR` long and `c0 + 8 ≤ NR`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn transpose8_avx2(rows: [&[f32]; 8], panel: &mut [f32], c0: usize) -> usize {
        let kc = rows[0].len();
        let mut p = 0;
        while p + 8 <= kc {
            // SAFETY: each row holds at least `p + 8` floats.
            let v = rows.map(|r| unsafe { _mm256_loadu_ps(r.as_ptr().add(p)) });
            // Interleave pairs of rows, then pairs of pairs, then swap 128-bit halves.
            let t0 = _mm256_unpacklo_ps(v[0], v[1]);
            let t1 = _mm256_unpackhi_ps(v[0], v[1]);
            let t2 = _mm256_unpacklo_ps(v[2], v[3]);
            let t3 = _mm256_unpackhi_ps(v[2], v[3]);
            let t4 = _mm256_unpacklo_ps(v[4], v[5]);
            let t5 = _mm256_unpackhi_ps(v[4], v[5]);
            let t6 = _mm256_unpacklo_ps(v[6], v[7]);
            let t7 = _mm256_unpackhi_ps(v[6], v[7]);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let out = [
                _mm256_permute2f128_ps::<0x20>(s0, s4),
                _mm256_permute2f128_ps::<0x20>(s1, s5),
                _mm256_permute2f128_ps::<0x20>(s2, s6),
                _mm256_permute2f128_ps::<0x20>(s3, s7),
                _mm256_permute2f128_ps::<0x31>(s0, s4),
                _mm256_permute2f128_ps::<0x31>(s1, s5),
                _mm256_permute2f128_ps::<0x31>(s2, s6),
                _mm256_permute2f128_ps::<0x31>(s3, s7),
            ];
            for (q, v) in out.iter().enumerate() {
                // SAFETY: depth p + q < kc, so `(p + q)·NR + c0 + 8 ≤ kc·NR ≤ panel.len()`.
                unsafe { _mm256_storeu_ps(panel.as_mut_ptr().add((p + q) * NR + c0), *v) };
            }
            p += 8;
        }
        p
    }
}
