//! The cpu backend's non-matmul ops. Each matches its definition in [`crate::backend::OpSpec`];
//! reductions over a row accumulate in f64 so long rows stay as exact as the reference.

use super::threads::for_each_row;
use crate::backend::spec::{permute_strides, rope_pair};
use crate::backend::{BinaryOp, RopeLayout, UnaryOp};

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Unary elementwise ops.
pub fn unary(op: UnaryOp, x: &[f32]) -> Vec<f32> {
    let mut out = x.to_vec();
    let f = move |v: f32| -> f32 {
        match op {
            UnaryOp::Silu => v * sigmoid(v),
            UnaryOp::GeluTanh => {
                const C: f32 = 0.797_884_6; // √(2/π)
                0.5 * v * (1.0 + (C * (v + 0.044715 * v * v * v)).tanh())
            }
            UnaryOp::GeluErf => 0.5 * v * (1.0 + libm::erff(v * std::f32::consts::FRAC_1_SQRT_2)),
            UnaryOp::Sigmoid => sigmoid(v),
            UnaryOp::Scale(s) => v * s,
            UnaryOp::Softcap(cap) => cap * (v / cap).tanh(),
        }
    };
    for_each_row(&mut out, 4096, 4, |_, chunk| {
        chunk.iter_mut().for_each(|v| *v = f(*v))
    });
    out
}

/// Binary elementwise ops with `b` repeating every `b.len()` elements.
pub fn binary(op: BinaryOp, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut out = a.to_vec();
    let f = move |x: f32, y: f32| -> f32 {
        match op {
            BinaryOp::Add => x + y,
            BinaryOp::Mul => x * y,
            BinaryOp::SwiGlu => x * sigmoid(x) * y,
        }
    };
    // Rows as long as b, so b lines up with every row.
    let row = if b.len() >= 1024 {
        b.len()
    } else {
        b.len() * (1024 / b.len())
    };
    for_each_row(&mut out, row, 2, |_, chunk| {
        for (i, v) in chunk.iter_mut().enumerate() {
            *v = f(*v, b[i % b.len()]);
        }
    });
    out
}

/// `x / sqrt(mean(x²) + eps) · w` per row.
pub fn rms_norm(x: &[f32], w: &[f32], cols: usize, eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    for_each_row(&mut out, cols, 4, |_, row| {
        let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / cols as f64;
        let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
        row.iter_mut().zip(w).for_each(|(v, &g)| *v = *v * inv * g);
    });
    out
}

/// `(x − mean) / sqrt(var + eps) · w + b` per row.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], cols: usize, eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    for_each_row(&mut out, cols, 6, |_, row| {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for ((v, &g), &c) in row.iter_mut().zip(w).zip(b) {
            *v = ((*v as f64 - mean) * inv) as f32 * g + c;
        }
    });
    out
}

/// Stable softmax per row, with an optional causal mask (`Some(queries)`).
pub fn softmax(x: &[f32], cols: usize, causal: Option<usize>) -> Vec<f32> {
    let mut out = x.to_vec();
    for_each_row(&mut out, cols, 8, |r, row| {
        let visible = match causal {
            Some(q) => (r % q + cols - q + 1).min(cols),
            None => cols,
        };
        let (live, masked) = row.split_at_mut(visible);
        let max = live.iter().fold(f32::NEG_INFINITY, |m, &v| {
            if v.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(v)
            }
        });
        let mut sum = 0f64;
        for v in live.iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
        let inv = (1.0 / sum) as f32;
        live.iter_mut().for_each(|v| *v *= inv);
        masked.fill(0.0);
    });
    out
}

/// Rotary embedding; the angle of each (row, pair) is computed once and shared by the heads.
pub fn rope(
    x: &[f32],
    positions: &[u32],
    inv_freq: &[f32],
    heads: usize,
    head_dim: usize,
    layout: RopeLayout,
) -> Vec<f32> {
    let mut out = x.to_vec();
    for_each_row(&mut out, heads * head_dim, 8, |r, row| {
        for (i, &f) in inv_freq.iter().enumerate() {
            let (sin, cos) = ((positions[r] as f32 * f) as f64).sin_cos();
            let (i0, i1) = rope_pair(layout, head_dim, i);
            for head in row.chunks_mut(head_dim) {
                let (x0, x1) = (head[i0] as f64, head[i1] as f64);
                head[i0] = (x0 * cos - x1 * sin) as f32;
                head[i1] = (x0 * sin + x1 * cos) as f32;
            }
        }
    });
    out
}

/// Rows of `table` at `ids`; NaN rows for ids out of range.
pub fn embedding(table: &[f32], ids: &[u32], vocab: usize, dim: usize) -> Vec<f32> {
    let mut out = vec![0f32; ids.len() * dim];
    for_each_row(&mut out, dim, 1, |r, row| {
        let id = ids[r] as usize;
        if id < vocab {
            row.copy_from_slice(&table[id * dim..(id + 1) * dim]);
        } else {
            row.fill(f32::NAN);
        }
    });
    out
}

/// A contiguous permuted copy, one output row (last axis) at a time.
pub fn permute<T: Copy + Send + Sync + Default>(
    x: &[T],
    in_shape: &[usize],
    perm: &[usize],
) -> Vec<T> {
    let (out_shape, strides) = permute_strides(in_shape, perm);
    let mut out = vec![T::default(); x.len()];
    let last = *out_shape.last().unwrap_or(&1);
    let last_stride = *strides.last().unwrap_or(&1);
    for_each_row(&mut out, last, 1, |r, row| {
        // Start of this output row in the input.
        let mut rem = r;
        let mut base = 0;
        for d in (0..out_shape.len().saturating_sub(1)).rev() {
            base += (rem % out_shape[d]) * strides[d];
            rem /= out_shape[d];
        }
        for (j, v) in row.iter_mut().enumerate() {
            *v = x[base + j * last_stride];
        }
    });
    out
}

/// Index of the maximum per row: first on ties, first NaN if any.
pub fn argmax(x: &[f32], cols: usize) -> Vec<u32> {
    let rows = x.len() / cols;
    let mut out = vec![0u32; rows];
    for_each_row(&mut out, 1, cols, |r, slot| {
        let row = &x[r * cols..(r + 1) * cols];
        let mut best = 0usize;
        for (j, &v) in row.iter().enumerate() {
            if v.is_nan() {
                best = j;
                break;
            }
            if v > row[best] {
                best = j;
            }
        }
        slot[0] = best as u32;
    });
    out
}

/// `ScanGradA`: `g_t · h_{t−1}` with `h_{−1} = h0`, over `[outer, len, inner]`.
pub fn scan_grad_a(g: &[f32], h: &[f32], h0: &[f32], len: usize, inner: usize) -> Vec<f32> {
    let mut out = vec![0f32; g.len()];
    for_each_row(&mut out, inner.max(1), 1, |row, dst| {
        let (o, t) = (row / len.max(1), row % len.max(1));
        let base = row * inner;
        for (i, d) in dst.iter_mut().enumerate() {
            let prev = if t == 0 {
                h0[o * inner + i]
            } else {
                h[base - inner + i]
            };
            *d = g[base + i] * prev;
        }
    });
    out
}

/// `Concat`: each output row is `a`'s row then `b`'s, rows in parallel.
pub fn concat<T: Copy + Default + Send + Sync>(
    a: &[T],
    b: &[T],
    rows: usize,
    a_cols: usize,
    b_cols: usize,
) -> Vec<T> {
    let width = a_cols + b_cols;
    let mut out = vec![T::default(); rows * width];
    for_each_row(&mut out, width, 1, |r, row| {
        row[..a_cols].copy_from_slice(&a[r * a_cols..(r + 1) * a_cols]);
        row[a_cols..].copy_from_slice(&b[r * b_cols..(r + 1) * b_cols]);
    });
    out
}

/// `Narrow`: columns `start..start + len` of each row of width `cols`.
pub fn narrow<T: Copy + Default + Send + Sync>(
    x: &[T],
    cols: usize,
    start: usize,
    len: usize,
) -> Vec<T> {
    let rows = x.len().checked_div(cols).unwrap_or(0);
    let mut out = vec![T::default(); rows * len];
    for_each_row(&mut out, len, 1, |r, row| {
        row.copy_from_slice(&x[r * cols + start..r * cols + start + len]);
    });
    out
}
