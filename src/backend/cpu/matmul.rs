//! Matrix products on the cpu. From [`GEMM_MIN_ROWS`] rows of `a` (prefill, batched
//! attention) both `a·b` and `a·bᵀ` run the packed GEMM of `gemm.rs`; below it (decode's
//! vector-by-matrix products) `a·bᵀ` runs SIMD dot products over cache-sized column blocks and
//! `a·b` SIMD axpy over cache-sized slices of the output row, which read `b` once without
//! packing it.

use super::gemm::{gemm, RhsLayout};
use super::simd::{axpy, axpy4, dot4, SimdLevel};
use super::threads::{map_tasks, threads};
use crate::backend::MatmulSpec;

/// Columns of `bᵀ` handled by one task: `COLUMN_BLOCK · k` floats of `b` stay in L2 while
/// every row of `a` passes over them.
const COLUMN_BLOCK: usize = 64;

/// From this many rows of `a` the packed GEMM pays for packing `b`: each packed value then
/// meets at least this many rows.
const GEMM_MIN_ROWS: usize = 8;

/// `out[b] = a[b] · op(rhs[b])` as [`MatmulSpec`] defines it.
pub fn matmul(level: SimdLevel, a: &[f32], rhs: &[f32], m: &MatmulSpec) -> Vec<f32> {
    let mut out = vec![0f32; m.batch * m.m * m.n];
    let rhs_stride = if m.rhs_batched { m.n * m.k } else { 0 };
    for b in 0..m.batch {
        let a_mat = &a[b * m.m * m.k..(b + 1) * m.m * m.k];
        let r_mat = &rhs[b * rhs_stride..b * rhs_stride + m.n * m.k];
        let out_mat = &mut out[b * m.m * m.n..(b + 1) * m.m * m.n];
        if m.m >= GEMM_MIN_ROWS {
            let layout = if m.rhs_transposed {
                RhsLayout::Transposed
            } else {
                RhsLayout::Plain
            };
            gemm(level, a_mat, r_mat, layout, out_mat, m.m, m.n, m.k);
        } else if m.rhs_transposed {
            a_bt(level, a_mat, r_mat, out_mat, m.m, m.n, m.k);
        } else {
            a_b(level, a_mat, r_mat, out_mat, m.m, m.n, m.k);
        }
    }
    out
}

/// `out[m, n] = a[m, k] · b[n, k]ᵀ`. Parallel over blocks of columns; each block's rows of
/// `b` are reused by every row of `a`, four columns at a time.
fn a_bt(level: SimdLevel, a: &[f32], b: &[f32], out: &mut [f32], m: usize, n: usize, k: usize) {
    let blocks = n.div_ceil(COLUMN_BLOCK);
    // A dot product of k costs about k/8 element copies (8-wide FMA).
    let results = map_tasks(blocks, m * n * k / 8, |blk| {
        let j0 = blk * COLUMN_BLOCK;
        let j1 = (j0 + COLUMN_BLOCK).min(n);
        let width = j1 - j0;
        let mut tile = vec![0f32; m * width];
        for i in 0..m {
            let a_row = &a[i * k..(i + 1) * k];
            let mut j = j0;
            while j < j1 {
                // Groups of four columns; a short last group repeats its final column.
                let cols = [
                    j,
                    (j + 1).min(j1 - 1),
                    (j + 2).min(j1 - 1),
                    (j + 3).min(j1 - 1),
                ];
                let rows = cols.map(|c| &b[c * k..(c + 1) * k]);
                let sums = dot4(level, a_row, rows);
                for (t, &s) in sums.iter().enumerate().take(j1 - j) {
                    tile[i * width + (j - j0) + t] = s;
                }
                j += 4;
            }
        }
        tile
    });
    for (blk, tile) in results.iter().enumerate() {
        let j0 = blk * COLUMN_BLOCK;
        let width = tile.len() / m.max(1);
        for i in 0..m {
            out[i * n + j0..i * n + j0 + width].copy_from_slice(&tile[i * width..(i + 1) * width]);
        }
    }
}

/// Output columns of one `a·b` task: its slice of every output row (4 KiB of f32 per row)
/// stays in L1 while the rows of `b` pass over it.
const AXPY_COLUMNS: usize = 1024;

/// The shallowest depth slice of `a·b` worth a task of its own: its partial sums cost one
/// more pass over the output slice.
const MIN_AXPY_DEPTH: usize = 256;

/// `out[m, n] = a[m, k] · b[k, n]`, reading `b` once without packing it. Tasks own a slice of
/// at most [`AXPY_COLUMNS`] columns and a slice of the depth, so that even one row (decode)
/// splits across threads; each task adds four rows of `b` at a time into its slice of every
/// output row ([`axpy4`]), and the depth slices' partial sums are added at the end.
fn a_b(level: SimdLevel, a: &[f32], b: &[f32], out: &mut [f32], m: usize, n: usize, k: usize) {
    let slices = n.div_ceil(AXPY_COLUMNS);
    // Enough tasks to balance the threads, none shallower than MIN_AXPY_DEPTH.
    let wanted = (threads() * 4).div_ceil(slices.max(1));
    let depth_parts = wanted.min(k / MIN_AXPY_DEPTH).max(1);
    let depth = k.div_ceil(depth_parts).next_multiple_of(4).max(4);
    let depth_parts = k.div_ceil(depth).max(1);
    // One axpy element is about one element copy of `b` and a fused multiply-add.
    let tiles = map_tasks(slices * depth_parts, m * n * k, |task| {
        let (j0, p0) = (
            (task / depth_parts) * AXPY_COLUMNS,
            (task % depth_parts) * depth,
        );
        let (width, p1) = (AXPY_COLUMNS.min(n - j0), (p0 + depth).min(k));
        let mut tile = vec![0f32; m * width];
        let b_row = |p: usize| &b[p * n + j0..p * n + j0 + width];
        let mut p = p0;
        while p + 4 <= p1 {
            let rows = [b_row(p), b_row(p + 1), b_row(p + 2), b_row(p + 3)];
            for (i, dst) in tile.chunks_exact_mut(width).enumerate() {
                let alpha = [0, 1, 2, 3].map(|t| a[i * k + p + t]);
                axpy4(level, alpha, rows, dst);
            }
            p += 4;
        }
        for p in p..p1 {
            for (i, dst) in tile.chunks_exact_mut(width).enumerate() {
                axpy(level, a[i * k + p], b_row(p), dst);
            }
        }
        tile
    });
    for (task, tile) in tiles.iter().enumerate() {
        let j0 = (task / depth_parts) * AXPY_COLUMNS;
        let width = AXPY_COLUMNS.min(n - j0);
        for (i, src) in tile.chunks_exact(width).enumerate() {
            let dst = &mut out[i * n + j0..i * n + j0 + width];
            if task % depth_parts == 0 {
                dst.copy_from_slice(src);
            } else {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
            }
        }
    }
}
