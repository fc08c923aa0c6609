//! The oracle of the fused decode ops: each sum in f64 from the effective activations and the
//! dequantized weights, rounded to f32 once at the end.

use super::sigmoid;
use crate::backend::host::Weight;
use crate::backend::{AttentionSpec, LinearSpec};
use crate::quant;

/// `act(a) · wᵀ` `[m, n]` in f64, unrounded.
fn product(a: &[f32], w: Weight<'_>, l: &LinearSpec) -> Vec<f64> {
    let (m, n, k) = (l.m, l.n, l.k);
    let w: Vec<f32> = match w {
        Weight::F32(w) => w[..n * k].to_vec(),
        Weight::Packed(bytes, _) => {
            let mut out = vec![0f32; n * k];
            let used = n * k / l.format.block_len() * l.format.block_bytes();
            quant::dequantize(l.format, &bytes[..used], &mut out);
            out
        }
    };
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        let row = l.activations.effective(&a[i * k..(i + 1) * k]);
        for j in 0..n {
            let w_row = &w[j * k..(j + 1) * k];
            out[i * n + j] = row.iter().zip(w_row).map(|(&x, &y)| x * y as f64).sum();
        }
    }
    out
}

/// [`crate::backend::OpSpec::SwigluLinear`].
pub(super) fn swiglu_linear(
    a: &[f32],
    gate: Weight<'_>,
    up: Weight<'_>,
    l: &LinearSpec,
) -> Vec<f32> {
    let g = product(a, gate, l);
    let u = product(a, up, l);
    g.iter()
        .zip(&u)
        .map(|(&g, &u)| (g * sigmoid(g) * u) as f32)
        .collect()
}

/// [`crate::backend::OpSpec::LinearResidual`].
pub(super) fn linear_residual(
    a: &[f32],
    w: Weight<'_>,
    residual: &[f32],
    l: &LinearSpec,
) -> Vec<f32> {
    product(a, w, l)
        .iter()
        .zip(residual)
        .map(|(&y, &r)| (r as f64 + y) as f32)
        .collect()
}

/// [`crate::backend::OpSpec::PagedAttention`].
pub(super) fn paged_attention(
    q: &[f32],
    (keys, values): (&[f32], &[f32]),
    rows: &[u32],
    s: &AttentionSpec,
) -> Vec<f32> {
    let hd = s.head_dim;
    let group = s.heads / s.kv_heads;
    // A row beyond the pool reads as NaN, as an embedding id beyond the table does.
    let pool_row = |pool: &[f32], row: u32| -> Vec<f64> {
        let r = row as usize;
        if r < s.pool_rows {
            pool[r * hd..(r + 1) * hd]
                .iter()
                .map(|&v| v as f64)
                .collect()
        } else {
            vec![f64::NAN; hd]
        }
    };
    let mut out = vec![0f32; s.t * s.heads * hd];
    for i in 0..s.t {
        let (start, end) = s.visible(i);
        for h in 0..s.heads {
            let g = h / group;
            let at = (i * s.heads + h) * hd;
            let qh = &q[at..at + hd];
            let scores: Vec<f64> = (start..end)
                .map(|j| {
                    let key = pool_row(keys, rows[g * s.stride + j]);
                    let dot: f64 = qh.iter().zip(&key).map(|(&a, b)| a as f64 * b).sum();
                    s.capped(dot * s.scale as f64)
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|&x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let mut acc = vec![0f64; hd];
            for (j, w) in (start..end).zip(&weights) {
                let value = pool_row(values, rows[g * s.stride + j]);
                for (a, v) in acc.iter_mut().zip(&value) {
                    *a += w / total * v;
                }
            }
            for (o, a) in out[at..at + hd].iter_mut().zip(&acc) {
                *o = *a as f32;
            }
        }
    }
    out
}
