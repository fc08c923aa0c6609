//! Quantized data on the cpu: quantize and dequantize row by row in parallel, products with
//! packed weights, and exact ternary dot products.
//!
//! Products decode four weight rows at a time into a small per-thread buffer (f32 for f32/f16
//! activations, int8 plus one scale per 32 values for the quantizing modes, a super-block's
//! integers, scales and offsets for `Q8_K`) and reuse it for every activation row, so the
//! weights stream from memory once per column block.

use super::act_quant::{quantize_i8, quantize_q8_k};
use super::int_dot::{dot_i8, dot_q8, dot_q8_k, dot_q_rows, reads_in_place, sums_of_16, BitSliced};
use super::kquant_dot::{self, Q8KRows};
use super::repack::{Repacked, GROUP};
use super::simd::{dot4, SimdLevel};
use super::threads::{for_each_row, map_tasks};
use crate::backend::Activations;
use crate::dtype::DType;
use crate::quant::kquants::{self, SuperBlockInts};
use crate::quant::{self, ternary};

/// Weight rows handled by one task of a product with several activation rows, at most.
const COLUMN_BLOCK: usize = 64;

/// Weight rows per task of a prefill product: [`COLUMN_BLOCK`], or fewer (a multiple of the
/// repacked group) so that a narrow matrix still makes four tasks per thread; SmolLM-135M's
/// 192-row key projection made three tasks of 64, one thread idle a third of the time.
fn prefill_columns(n: usize) -> usize {
    n.div_ceil(4 * super::threads::threads())
        .next_multiple_of(GROUP)
        .clamp(GROUP, COLUMN_BLOCK)
}

/// Weight rows handled by one task of a one-row product (decode): small, so that two threads
/// get even shares of a few hundred rows.
const DECODE_COLUMN_BLOCK: usize = 16;

/// `Quantize`: each row independently.
pub fn quantize(format: DType, x: &[f32], cols: usize) -> Vec<u8> {
    let row_bytes = format.row_bytes(cols);
    let mut out = vec![0u8; x.len() / cols.max(1) * row_bytes];
    for_each_row(&mut out, row_bytes, 8, |r, row| {
        quant::quantize(format, &x[r * cols..(r + 1) * cols], row)
    });
    out
}

/// `Dequantize`: each row independently.
pub fn dequantize(format: DType, bytes: &[u8], cols: usize) -> Vec<f32> {
    let row_bytes = format.row_bytes(cols);
    let rows = bytes.len().checked_div(row_bytes).unwrap_or(0);
    let mut out = vec![0f32; rows * cols];
    for_each_row(&mut out, cols, 2, |r, row| {
        quant::dequantize(format, &bytes[r * row_bytes..(r + 1) * row_bytes], row)
    });
    out
}

/// Activations prepared for the product: f32 values, or int8 values with one scale per 32
/// (per 256 for `Q8_K`). Prepared once, they serve several products of the same input (gate
/// and up).
pub(super) enum PreparedActivations {
    Float(Vec<f32>),
    Int { q: Vec<i8>, d: Vec<f32> },
}

pub(super) fn prepare(
    level: SimdLevel,
    a: &[f32],
    act: Activations,
    k: usize,
) -> PreparedActivations {
    let per_row_scale = match act {
        Activations::F32 | Activations::F16 => return PreparedActivations::Float(a.to_vec()),
        Activations::Q8_0 => false,
        Activations::I8 => true,
        Activations::Q8_K => {
            let mut q = vec![0i8; a.len()];
            let d = a
                .chunks(256)
                .zip(q.chunks_mut(256))
                .map(|(x, q)| quantize_q8_k(level, x, q))
                .collect();
            return PreparedActivations::Int { q, d };
        }
    };
    let chunks = k / 32;
    let mut q = vec![0i8; a.len()];
    let mut d = vec![0f32; a.len() / k * chunks];
    for ((x, q), d) in a.chunks(k).zip(q.chunks_mut(k)).zip(d.chunks_mut(chunks)) {
        if per_row_scale {
            d.fill(quantize_i8(level, x, q));
        } else {
            for ((x, q), d) in x.chunks(32).zip(q.chunks_mut(32)).zip(d.iter_mut()) {
                *d = quantize_i8(level, x, q);
            }
        }
    }
    PreparedActivations::Int { q, d }
}

/// Decodes weight row `j` into f32 values.
fn decode_f32(format: DType, w: &[u8], k: usize, j: usize, out: &mut [f32]) {
    let row_bytes = format.row_bytes(k);
    quant::dequantize(format, &w[j * row_bytes..(j + 1) * row_bytes], out);
}

/// Decodes ternary weight row `j` into its trits and one scale per 32 values.
fn decode_trits(format: DType, (w, k, j): (&[u8], usize, usize), q: &mut [i8], d: &mut [f32]) {
    let row_bytes = format.row_bytes(k);
    let row = &w[j * row_bytes..(j + 1) * row_bytes];
    let mut t = [0i8; ternary::BLOCK];
    for ((b, q), d) in row
        .chunks_exact(format.block_bytes())
        .zip(q.chunks_mut(ternary::BLOCK))
        .zip(d.chunks_mut(ternary::BLOCK / 32))
    {
        d.fill(ternary::block_trits(format, b, &mut t));
        q.copy_from_slice(&t);
    }
}

/// `QMatmul`: the activations already [`prepare`]d from `a` `[m, k]` (f32), `w` packed
/// `[n, k]`, or its interleaved copy `repacked` where the repacked kernels run (used when
/// it [`takes`](Repacked::takes) `act`).
pub(super) fn qmatmul_prepared(
    level: SimdLevel,
    prepared: &PreparedActivations,
    (w, repacked): (&[u8], Option<&Repacked>),
    format: DType,
    act: Activations,
    (m, n, k): (usize, usize, usize),
) -> Vec<f32> {
    if let (Some(rep), PreparedActivations::Int { q, d }) = (repacked, prepared) {
        if rep.takes(act) && rep.rows() == n {
            return repacked_product(rep, (q, d), m, n, k);
        }
    }
    // `Q8_K` activations' sums of 16, once for every task.
    let q8_k_sums = match prepared {
        PreparedActivations::Int { q, .. } if act == Activations::Q8_K => sums_of_16(q),
        _ => Vec::new(),
    };
    // Columns `j0..j0 + width` of every row into `tile` (`[m, width]`).
    let column_block = |j0: usize, tile: &mut [f32]| {
        let width = tile.len() / m;
        let j1 = j0 + width;
        match prepared {
            PreparedActivations::Float(a) => {
                let mut rows = vec![0f32; 4 * k];
                for j in (j0..j1).step_by(4) {
                    let group = (j1 - j).min(4);
                    for g in 0..group {
                        decode_f32(format, w, k, j + g, &mut rows[g * k..(g + 1) * k]);
                    }
                    let r = |g: usize| &rows[g.min(group - 1) * k..(g.min(group - 1) + 1) * k];
                    for i in 0..m {
                        let sums = dot4(level, &a[i * k..(i + 1) * k], [r(0), r(1), r(2), r(3)]);
                        for (g, &s) in sums.iter().enumerate().take(group) {
                            tile[i * width + (j - j0) + g] = s;
                        }
                    }
                }
            }
            PreparedActivations::Int { q: aq, d: ad } if reads_in_place(format) => {
                // The blocks are read in place; this block's weight rows stay in cache while
                // every activation row passes over them.
                let chunks = k / 32;
                let row_bytes = format.row_bytes(k);
                let rows = &w[j0 * row_bytes..j1 * row_bytes];
                // Two activation rows at a time share each weight block's unpacking.
                for (pair, out) in tile.chunks_mut(2 * width).enumerate() {
                    let (i, acts) = (2 * pair, out.len() / width);
                    let a = (
                        &aq[i * k..(i + acts) * k],
                        &ad[i * chunks..(i + acts) * chunks],
                        acts,
                    );
                    dot_q_rows(level, format, a, rows, row_bytes, width, out);
                }
            }
            PreparedActivations::Int { q, d }
                if act == Activations::Q8_K && kquant_dot::reads_packed(format) =>
            {
                // The weight rows read in place, each super-block unpacked once for up to four
                // products.
                let row_bytes = format.row_bytes(k);
                let acts = Q8KRows {
                    q,
                    d,
                    sums: &q8_k_sums,
                    k,
                };
                let mut dots = [0f32; kquant_dot::MAX_SLOTS];
                if m == 1 {
                    // Decode: four weight rows at a time against the one activation row.
                    for j in (j0..j1).step_by(kquant_dot::MAX_SLOTS) {
                        let count = (j1 - j).min(kquant_dot::MAX_SLOTS);
                        let rows = (&w[j * row_bytes..j1 * row_bytes], row_bytes, count);
                        kquant_dot::dot_rows(level, format, rows, &acts, (0, 1), &mut dots);
                        tile[j - j0..j - j0 + count].copy_from_slice(&dots[..count]);
                    }
                    return;
                }
                // Prefill: each weight row against four activation rows at a time.
                for j in j0..j1 {
                    let row = (&w[j * row_bytes..(j + 1) * row_bytes], row_bytes, 1);
                    for i in (0..m).step_by(kquant_dot::MAX_SLOTS) {
                        let count = (m - i).min(kquant_dot::MAX_SLOTS);
                        kquant_dot::dot_rows(level, format, row, &acts, (i, count), &mut dots);
                        for (r, &s) in dots[..count].iter().enumerate() {
                            tile[(i + r) * width + (j - j0)] = s;
                        }
                    }
                }
            }
            PreparedActivations::Int { q: aq, d: ad } if act == Activations::Q8_K => {
                // Each weight row's super-blocks read once as integers, for every activation
                // row.
                let blocks = k / 256;
                let row_bytes = format.row_bytes(k);
                let mut ints = vec![SuperBlockInts::default(); blocks];
                let sums = &q8_k_sums;
                for j in j0..j1 {
                    let row = &w[j * row_bytes..(j + 1) * row_bytes];
                    for (b, out) in row.chunks_exact(format.block_bytes()).zip(&mut ints) {
                        kquants::super_block_ints(format, b, out);
                    }
                    for i in 0..m {
                        let (aq, ad) = (&aq[i * k..(i + 1) * k], &ad[i * blocks..(i + 1) * blocks]);
                        let sums = &sums[i * k / 16..(i + 1) * k / 16];
                        tile[i * width + (j - j0)] = dot_q8_k(level, aq, ad, sums, &ints);
                    }
                }
            }
            PreparedActivations::Int { q: aq, d: ad } => {
                // The ternary formats, with per-row int8 activations.
                let chunks = k / 32;
                let mut wq = vec![0i8; k];
                let mut wd = vec![0f32; chunks];
                for j in j0..j1 {
                    decode_trits(format, (w, k, j), &mut wq, &mut wd);
                    for i in 0..m {
                        let (aq, ad) = (&aq[i * k..(i + 1) * k], &ad[i * chunks..(i + 1) * chunks]);
                        tile[i * width + (j - j0)] = dot_q8(level, aq, ad, &wq, &wd);
                    }
                }
            }
        }
    };
    let mut out = vec![0f32; m * n];
    if m == 1 {
        // Decode: each block of columns is a slice of the one output row, written in place.
        // A weight row costs about k/8 copies of an output element (int8 dots).
        for_each_row(&mut out, DECODE_COLUMN_BLOCK, k / 8, |blk, tile| {
            column_block(blk * DECODE_COLUMN_BLOCK, tile)
        });
        return out;
    }
    let cb = prefill_columns(n);
    let tiles = map_tasks(n.div_ceil(cb), m * n * k / 8, |blk| {
        let j0 = blk * cb;
        let mut tile = vec![0f32; m * (n - j0).min(cb)];
        column_block(j0, &mut tile);
        tile
    });
    for (blk, tile) in tiles.iter().enumerate() {
        let j0 = blk * cb;
        let width = (n - j0).min(cb);
        for i in 0..m {
            out[i * n + j0..i * n + j0 + width].copy_from_slice(&tile[i * width..(i + 1) * width]);
        }
    }
    out
}

/// `a · wᵀ` with the activations `(q, d)` (`m` rows of `k`, `Q8_0` or `Q8_K` as the
/// repacked weight [`takes`](Repacked::takes)) and the repacked weight: decode splits the
/// output row across threads by groups of rows, written in place; prefill gives each task a
/// block of columns and runs four activation rows at a time.
fn repacked_product(
    rep: &Repacked,
    (q, d): (&[i8], &[f32]),
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let sums = rep.activation_sums(q);
    let mut out = vec![0f32; m * n];
    if m == 1 {
        let per_task = DECODE_COLUMN_BLOCK / GROUP;
        for_each_row(&mut out, DECODE_COLUMN_BLOCK, k / 8, |blk, tile| {
            let groups = blk * per_task..(blk + 1) * per_task;
            rep.product::<1>((q, d, &sums), 0, groups, tile, 0)
        });
        return out;
    }
    let cb = prefill_columns(n);
    let per_task = cb / GROUP;
    let tiles = map_tasks(n.div_ceil(cb), m * n * k / 8, |blk| {
        let width = (n - blk * cb).min(cb);
        let groups = blk * per_task..(blk + 1) * per_task;
        let mut tile = vec![0f32; m * width];
        let mut i = 0;
        while i < m {
            let acts = (q, d, &sums[..]);
            let out = &mut tile[i * width..];
            if m - i >= 4 {
                rep.product::<4>(acts, i, groups.clone(), out, width);
                i += 4;
            } else {
                rep.product::<1>(acts, i, groups.clone(), out, width);
                i += 1;
            }
        }
        tile
    });
    for (blk, tile) in tiles.iter().enumerate() {
        let j0 = blk * cb;
        let width = tile.len() / m;
        for i in 0..m {
            out[i * n + j0..i * n + j0 + width].copy_from_slice(&tile[i * width..(i + 1) * width]);
        }
    }
    out
}

/// `TernaryDot`: exact integer sums. Bit-planes use AND + popcount against the activations'
/// bit-planes; the GGUF formats decode to int8 and use the SIMD int8 dot.
pub fn ternary_dot(
    level: SimdLevel,
    w: &[u8],
    x: &[i8],
    format: DType,
    m: usize,
    n: usize,
    k: usize,
) -> Vec<i32> {
    let row_bytes = format.row_bytes(k);
    let mut out = vec![0i32; m * n];
    if format == DType::TernaryPlanes {
        let sliced: Vec<BitSliced> = x.chunks(k).map(BitSliced::new).collect();
        for_each_row(&mut out, n, k / 8, |i, row| {
            for (j, o) in row.iter_mut().enumerate() {
                *o = w[j * row_bytes..(j + 1) * row_bytes]
                    .chunks_exact(format.block_bytes())
                    .enumerate()
                    .map(|(b, block)| {
                        let mut words = [0u32; 16];
                        for (w, bytes) in words.iter_mut().zip(block[4..].chunks_exact(4)) {
                            *w = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                        }
                        sliced[i].dot_planes(8 * b, &words[..8], &words[8..])
                    })
                    .sum();
            }
        });
        return out;
    }
    let mut trits = vec![0i8; n * k];
    for_each_row(&mut trits, k, 4, |j, row| {
        let mut t = [0i8; ternary::BLOCK];
        for (b, dst) in w[j * row_bytes..(j + 1) * row_bytes]
            .chunks_exact(format.block_bytes())
            .zip(row.chunks_mut(ternary::BLOCK))
        {
            ternary::block_trits(format, b, &mut t);
            dst.copy_from_slice(&t);
        }
    });
    for_each_row(&mut out, n, k / 8, |i, row| {
        let xr = &x[i * k..(i + 1) * k];
        for (j, o) in row.iter_mut().enumerate() {
            *o = dot_i8(level, xr, &trits[j * k..(j + 1) * k]);
        }
    });
    out
}
