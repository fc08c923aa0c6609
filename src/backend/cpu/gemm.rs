//! The packed, register-blocked f32 GEMM behind `a·b` and `a·bᵀ` when `a` has several rows
//! (prefill, batched attention), in the GotoBLAS layout:
//!
//! - `a` is packed once into panels of `mr` rows, `k` deep, element `(r, p)` at `p·mr + r`;
//! - each task owns a block of at most [`NC`] output columns and, for each [`KC`]-deep slice
//!   of `k`, packs that block of `op(b)` into panels of `NR` columns (`(p, c)` at
//!   `p·NR + c`, a few hundred KiB that stay in L2, in a buffer each thread keeps), then for
//!   every pair of panels runs a micro-kernel that keeps an `mr × NR` tile of the output in
//!   registers and stores (first slice) or adds (later slices) it straight into `out`.
//!
//! The AVX-512 kernel is 12 × 32 (two vectors per row, so two loads of `b` feed 24 FMAs);
//! AVX2 and the portable kernel are 6 × 16 and 4 × 16. Only the packing of `b` knows whether
//! `b` is `[k, n]` or `[n, k]`; at the AVX-512 level it packs `[n, k]` with 16 × 16
//! in-register transposes. Short last panels are padded with zeros and edge tiles go through
//! a small buffer, so `m`, `n` and `k` need not be multiples of anything.

use super::simd::SimdLevel;
use super::threads::{for_each_row, map_tasks, threads, SendPtr};

/// Depth of one packed slice: a `KC × NR` panel of `b` (32 KiB at most) stays in L1 while
/// every panel of `a` meets it.
const KC: usize = 256;

/// Most output columns one task owns: its packed `KC × NC` block of `b` (256 KiB) stays in L2.
const NC: usize = 256;

/// The largest `mr` any micro-kernel uses.
const MAX_MR: usize = 12;

/// The largest `nr` (output columns per tile) any micro-kernel uses.
const MAX_NR: usize = 32;

/// How many rows of a plain `b` ahead of the one being packed the packing prefetches: the
/// rows of a block lie `n` floats apart, too far for the hardware prefetcher to follow.
#[cfg(target_arch = "x86_64")]
const PREFETCH_ROWS: usize = 16;

/// How the right-hand matrix is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RhsLayout {
    /// `b[k, n]`: the product is `a·b`.
    Plain,
    /// `b[n, k]`: the product is `a·bᵀ`.
    Transposed,
}

/// A micro-kernel with an `mr × NR` tile: `c[r·ldc + j] (+)= Σ_p a[p·mr + r] · b[p·NR + j]`
/// over the `kc` steps the two panels hold (`a.len() = kc·mr`, `b.len() = kc·NR`), adding to
/// `c` when `accumulate`.
///
/// # Safety
/// `c` must point at `mr` rows of `NR` writable floats, `ldc` apart.
type MicroKernel = unsafe fn(&[f32], &[f32], *mut f32, usize, bool);

/// Packs 16 columns of a transposed `b` (`src[c·k ..]` is column `c` at the slice's first
/// depth, `kc` depths) into a panel whose depths lie `nr` apart with SIMD transposes, and
/// returns how many depths it packed (a multiple of 16; `pack_b` packs the rest).
type Transposer = fn(src: &[f32], k: usize, kc: usize, nr: usize, panel: &mut [f32]) -> usize;

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
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let shape = Shape {
        a,
        b,
        layout,
        m,
        n,
        k,
    };
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => blocked::<32>(
            shape,
            x86::kernel_avx512,
            12,
            Some(x86::pack_transposed_avx512),
            out,
        ),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => blocked::<16>(shape, x86::kernel_avx2, 6, None, out),
        _ => blocked::<16>(shape, kernel_portable, 4, None, out),
    }
}

/// The operands of one product.
#[derive(Clone, Copy)]
struct Shape<'a> {
    a: &'a [f32],
    b: &'a [f32],
    layout: RhsLayout,
    m: usize,
    n: usize,
    k: usize,
}

/// The blocked product with an `mr × NR` micro-kernel; `transposer`, where the level has one,
/// packs full panels of a transposed `b`.
fn blocked<const NR: usize>(
    shape: Shape,
    kernel: MicroKernel,
    mr: usize,
    transposer: Option<Transposer>,
    out: &mut [f32],
) {
    let Shape { a, m, n, k, .. } = shape;
    let a_panels = m.div_ceil(mr);
    let mut packed_a = vec![0f32; a_panels * mr * k];
    for_each_row(&mut packed_a, mr * k, 1, |panel, dst| {
        for r in 0..mr.min(m - panel * mr) {
            let row = &a[(panel * mr + r) * k..(panel * mr + r + 1) * k];
            for (p, &v) in row.iter().enumerate() {
                dst[p * mr + r] = v;
            }
        }
    });
    // Column blocks: at most NC wide, and enough of them to balance the threads.
    let nc = n.div_ceil(threads() * 4).next_multiple_of(NR).clamp(NR, NC);
    let blocks = n.div_ceil(nc);
    let out_ptr = SendPtr(out.as_mut_ptr());
    // A product of k costs about k/8 element copies (8-wide FMA).
    map_tasks(blocks, m * n * k / 8, |blk| {
        let j0 = blk * nc;
        let width = nc.min(n - j0);
        let b_panels = width.div_ceil(NR);
        PACKED_B.with_borrow_mut(|packed_b| {
            packed_b.resize(b_panels * NR * KC.min(k), 0.0);
            let mut edge = [0f32; MAX_MR * MAX_NR];
            for p0 in (0..k).step_by(KC) {
                let kc = KC.min(k - p0);
                pack_b::<NR>(shape, j0, width, p0, kc, transposer, packed_b);
                let accumulate = p0 > 0;
                for jp in 0..b_panels {
                    let b_panel = &packed_b[jp * NR * kc..(jp + 1) * NR * kc];
                    let cols = NR.min(width - jp * NR);
                    for ip in 0..a_panels {
                        let a_panel =
                            &packed_a[ip * mr * k + p0 * mr..ip * mr * k + (p0 + kc) * mr];
                        let rows = mr.min(m - ip * mr);
                        let corner = (ip * mr) * n + j0 + jp * NR;
                        if rows == mr && cols == NR {
                            // SAFETY: the full mr × NR tile at `corner` lies inside `out`
                            // (rows and columns checked just above), and only this task
                            // writes columns j0..j0 + width.
                            unsafe {
                                kernel(a_panel, b_panel, out_ptr.get().add(corner), n, accumulate)
                            };
                        } else {
                            // SAFETY: `edge` holds MAX_MR ≥ mr rows of NR ≤ MAX_NR floats.
                            unsafe { kernel(a_panel, b_panel, edge.as_mut_ptr(), NR, false) };
                            for r in 0..rows {
                                // SAFETY: row r's first `cols` columns at `corner` lie inside
                                // `out` and belong to this task, as above.
                                let dst = unsafe {
                                    std::slice::from_raw_parts_mut(
                                        out_ptr.get().add(corner + r * n),
                                        cols,
                                    )
                                };
                                store_row(dst, &edge[r * NR..r * NR + cols], accumulate);
                            }
                        }
                    }
                }
            }
        });
    });
}

thread_local! {
    /// Each thread's packed block of `op(b)`, kept between calls so a GEMM allocates (and the
    /// kernel zeroes) no fresh pages for it.
    static PACKED_B: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Stores `src` into `dst` (the first depth slice) or adds it (the later ones).
fn store_row(dst: &mut [f32], src: &[f32], accumulate: bool) {
    if accumulate {
        dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
    } else {
        dst.copy_from_slice(src);
    }
}

/// Packs columns `j0..j0 + width` and depths `p0..p0 + kc` of `op(b)` into `NR`-wide panels
/// (`(p, c)` of panel `jp` at `jp·NR·kc + p·NR + c`), zeros past the last column.
fn pack_b<const NR: usize>(
    shape: Shape,
    j0: usize,
    width: usize,
    p0: usize,
    kc: usize,
    transposer: Option<Transposer>,
    dst: &mut [f32],
) {
    let Shape {
        b, layout, n, k, ..
    } = shape;
    let panels = width.div_ceil(NR);
    if layout == RhsLayout::Plain {
        // Row by row of `b`, so each depth reads one contiguous run of `width` floats.
        for p in 0..kc {
            let row = &b[(p0 + p) * n + j0..][..width];
            #[cfg(target_arch = "x86_64")]
            if let Some(ahead) = b.get((p0 + p + PREFETCH_ROWS) * n + j0..) {
                for line in ahead[..width.min(ahead.len())].chunks(16) {
                    // SAFETY: a prefetch hint of memory inside `b`; it reads nothing.
                    unsafe {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                            line.as_ptr().cast(),
                        )
                    };
                }
            }
            for jp in 0..panels {
                let d = &mut dst[jp * NR * kc + p * NR..][..NR];
                match row[jp * NR..].first_chunk::<NR>() {
                    Some(src) => *<&mut [f32; NR]>::try_from(d).expect("NR floats") = *src,
                    None => {
                        let cols = width - jp * NR;
                        d[..cols].copy_from_slice(&row[jp * NR..]);
                        d[cols..].fill(0.0);
                    }
                }
            }
        }
        return;
    }
    for (jp, panel) in dst.chunks_exact_mut(NR * kc).take(panels).enumerate() {
        let cols = NR.min(width - jp * NR);
        let j = j0 + jp * NR;
        // Depths `..done` of a full panel are packed by SIMD transposes, 16 columns at a
        // time; the rest below.
        let mut done = 0;
        if let (Some(transpose), true) = (transposer, cols == NR) {
            for half in (0..NR).step_by(16) {
                done = transpose(&b[(j + half) * k + p0..], k, kc, NR, &mut panel[half..]);
            }
        }
        if cols < NR {
            panel.fill(0.0);
        }
        for c in 0..cols {
            let src = &b[(j + c) * k + p0..][..kc];
            for (p, &v) in src.iter().enumerate().skip(done) {
                panel[p * NR + c] = v;
            }
        }
    }
}

/// The micro-kernel in plain Rust (4 × 16), which compilers vectorise where they can: the
/// scalar level, NEON and wasm `simd128`. It defines what the x86 kernels must agree with.
///
/// # Safety
/// As [`MicroKernel`], with `mr = 4`.
unsafe fn kernel_portable(a: &[f32], b: &[f32], c: *mut f32, ldc: usize, accumulate: bool) {
    const MR: usize = 4;
    const NR: usize = 16;
    let mut acc = [[0f32; NR]; MR];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for r in 0..MR {
            for j in 0..NR {
                acc[r][j] += ap[r] * bp[j];
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        // SAFETY: the caller gives MR rows of NR floats, `ldc` apart.
        let dst = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), NR) };
        store_row(dst, row, accumulate);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// 6 × 16 with AVX2+FMA: twelve accumulators, two loads of `b` and six broadcasts of `a`
    /// per step.
    ///
    /// # Safety
    /// As [`super::MicroKernel`] with `mr = 6`, at the Avx2 level (which runtime detection, or
    /// the option `cpu.simd` checked against it, confirmed).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn kernel_avx2(
        a: &[f32],
        b: &[f32],
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        const MR: usize = 6;
        const NR: usize = 16;
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
            // SAFETY: row r of `c` holds NR = 16 floats (the caller's contract).
            unsafe {
                let row = c.add(r * ldc);
                let (mut lo, mut hi) = (pair[0], pair[1]);
                if accumulate {
                    lo = _mm256_add_ps(lo, _mm256_loadu_ps(row));
                    hi = _mm256_add_ps(hi, _mm256_loadu_ps(row.add(8)));
                }
                _mm256_storeu_ps(row, lo);
                _mm256_storeu_ps(row.add(8), hi);
            }
        }
    }

    /// 12 × 32 with AVX-512F: 24 accumulators, two loads of `b` and twelve broadcasts of `a`
    /// per step.
    ///
    /// # Safety
    /// As [`super::MicroKernel`] with `mr = 12`, `NR = 32`, at the Avx512 level.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn kernel_avx512(
        a: &[f32],
        b: &[f32],
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        const MR: usize = 12;
        const NR: usize = 32;
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
            // SAFETY: `bp` holds NR = 32 floats.
            let (b0, b1) = unsafe {
                (
                    _mm512_loadu_ps(bp.as_ptr()),
                    _mm512_loadu_ps(bp.as_ptr().add(16)),
                )
            };
            for r in 0..MR {
                let av = _mm512_set1_ps(ap[r]);
                acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
            }
        }
        for (r, pair) in acc.iter().enumerate() {
            // SAFETY: row r of `c` holds NR = 32 floats (the caller's contract).
            unsafe {
                let row = c.add(r * ldc);
                let (mut lo, mut hi) = (pair[0], pair[1]);
                if accumulate {
                    lo = _mm512_add_ps(lo, _mm512_loadu_ps(row));
                    hi = _mm512_add_ps(hi, _mm512_loadu_ps(row.add(16)));
                }
                _mm512_storeu_ps(row, lo);
                _mm512_storeu_ps(row.add(16), hi);
            }
        }
    }

    /// The [`super::Transposer`] of the Avx512 level: 16 depths at a time with in-register
    /// 16 × 16 transposes.
    pub(super) fn pack_transposed_avx512(
        src: &[f32],
        k: usize,
        kc: usize,
        nr: usize,
        panel: &mut [f32],
    ) -> usize {
        let whole = kc / 16 * 16;
        assert!(
            whole == 0 || (src.len() >= 15 * k + whole && panel.len() >= (whole - 1) * nr + 16)
        );
        // SAFETY: bounds asserted just above; `gemm` hands this out only at the Avx512 level.
        unsafe { transposed_avx512(src, k, whole, nr, panel) };
        whole
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn transposed_avx512(src: &[f32], k: usize, whole: usize, nr: usize, panel: &mut [f32]) {
        for p in (0..whole).step_by(16) {
            // SAFETY (all loads and stores): row c < 16 reads src[c·k + p ..][..16] and depth
            // d < 16 writes panel[(p + d)·nr ..][..16], inside the asserted bounds.
            let r: [__m512; 16] =
                std::array::from_fn(|c| unsafe { _mm512_loadu_ps(src.as_ptr().add(c * k + p)) });
            let t: [__m512; 16] = std::array::from_fn(|i| {
                let (x, y) = (r[i & !1], r[i | 1]);
                if i % 2 == 0 {
                    _mm512_unpacklo_ps(x, y)
                } else {
                    _mm512_unpackhi_ps(x, y)
                }
            });
            // u[4i + q], lane L: column 4L + q of rows 4i..4i + 4.
            let u: [__m512; 16] = std::array::from_fn(|idx| {
                let (i, q) = (idx / 4, idx % 4);
                let (x, y) = (
                    _mm512_castps_pd(t[4 * i + q / 2]),
                    _mm512_castps_pd(t[4 * i + 2 + q / 2]),
                );
                _mm512_castpd_ps(if q % 2 == 0 {
                    _mm512_unpacklo_pd(x, y)
                } else {
                    _mm512_unpackhi_pd(x, y)
                })
            });
            for q in 0..4 {
                let v0 = _mm512_shuffle_f32x4::<0x88>(u[q], u[4 + q]);
                let v1 = _mm512_shuffle_f32x4::<0xDD>(u[q], u[4 + q]);
                let w0 = _mm512_shuffle_f32x4::<0x88>(u[8 + q], u[12 + q]);
                let w1 = _mm512_shuffle_f32x4::<0xDD>(u[8 + q], u[12 + q]);
                let cols = [
                    (q, _mm512_shuffle_f32x4::<0x88>(v0, w0)),
                    (8 + q, _mm512_shuffle_f32x4::<0xDD>(v0, w0)),
                    (4 + q, _mm512_shuffle_f32x4::<0x88>(v1, w1)),
                    (12 + q, _mm512_shuffle_f32x4::<0xDD>(v1, w1)),
                ];
                for (d, v) in cols {
                    unsafe { _mm512_storeu_ps(panel.as_mut_ptr().add((p + d) * nr), v) };
                }
            }
        }
    }
}
