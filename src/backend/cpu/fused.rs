//! The cpu kernels of the fused decode ops: the products through the backend's own product
//! kernels (packed weights, repacked copies, integer activations quantized once for gate and
//! up), their epilogue (SiLU gate,
//! residual) applied to the product's output in place, and attention that reads the KV pool's
//! rows through the row list, one task per query head, with no copy of the keys.

use super::quant::{self, PreparedActivations};
use super::{matmul, simd, threads, CpuBackend};
use crate::backend::host::Weight;
use crate::backend::{Activations, AttentionSpec, LinearSpec, Storage};
use crate::dtype::DType;

impl CpuBackend {
    /// `act(a) · wᵀ` `[m, n]` for a packed weight, with the activations prepared once by
    /// the caller: the repacked copy of the weight where the repacked kernels run.
    pub(super) fn packed_product(
        &self,
        prepared: &PreparedActivations,
        (w, weight): (&[u8], &Storage),
        format: DType,
        act: Activations,
        (m, n, k): (usize, usize, usize),
    ) -> Vec<f32> {
        let repacked = match weight {
            Storage::Host(weight) => self
                .repacked
                .get(self.simd, weight, (format, w), act, (n, k)),
            _ => None,
        };
        let w = (w, repacked.as_deref());
        quant::qmatmul_prepared(self.simd, prepared, w, format, act, (m, n, k))
    }

    /// `act(a) · wᵀ` `[m, n]` with the kernel the unfused op would use; packed weights take
    /// the activations `prepared` once for every product of `a`.
    fn product(
        &self,
        a: &[f32],
        prepared: &PreparedActivations,
        w: Weight<'_>,
        l: &LinearSpec,
    ) -> Vec<f32> {
        match w {
            Weight::F32(w) => {
                let spec = l.f32_product();
                matmul::matmul(self.simd, a, w, &spec)
            }
            Weight::Packed(bytes, storage) => self.packed_product(
                prepared,
                (bytes, storage),
                l.format,
                l.activations,
                (l.m, l.n, l.k),
            ),
        }
    }

    /// The activations of a fused product, prepared once (nothing to prepare for f32
    /// weights).
    fn prepare(&self, a: &[f32], w: Weight<'_>, l: &LinearSpec) -> PreparedActivations {
        match w {
            Weight::F32(_) => PreparedActivations::Float(Vec::new()),
            Weight::Packed(..) => quant::prepare(self.simd, a, l.activations, l.k),
        }
    }

    /// [`crate::backend::OpSpec::SwigluLinear`]: the gate's output becomes the result.
    pub(super) fn swiglu_linear_kernel(
        &self,
        a: &[f32],
        (gate, up): (Weight<'_>, Weight<'_>),
        l: &LinearSpec,
    ) -> Vec<f32> {
        let prepared = self.prepare(a, gate, l);
        let mut g = self.product(a, &prepared, gate, l);
        let u = self.product(a, &prepared, up, l);
        for (g, u) in g.iter_mut().zip(&u) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
        g
    }

    /// [`crate::backend::OpSpec::LinearResidual`]: the residual added into the product's
    /// output.
    pub(super) fn linear_residual_kernel(
        &self,
        a: &[f32],
        w: Weight<'_>,
        residual: &[f32],
        l: &LinearSpec,
    ) -> Vec<f32> {
        let prepared = self.prepare(a, w, l);
        let mut y = self.product(a, &prepared, w, l);
        for (y, r) in y.iter_mut().zip(residual) {
            *y += r;
        }
        y
    }
}

/// Row `r` of a `[pool_rows, hd]` pool, or `None` beyond it.
fn pool_row(pool: &[f32], r: u32, hd: usize, pool_rows: usize) -> Option<&[f32]> {
    let r = r as usize;
    (r < pool_rows).then(|| &pool[r * hd..(r + 1) * hd])
}

/// [`crate::backend::OpSpec::PagedAttention`]: one task per (query, head) row of the output,
/// its scores in one buffer per task, keys and values read from the pool rows in place.
pub(super) fn paged_attention(
    level: simd::SimdLevel,
    q: &[f32],
    (keys, values): (&[f32], &[f32]),
    rows: &[u32],
    s: &AttentionSpec,
) -> Vec<f32> {
    let hd = s.head_dim;
    let group = s.heads / s.kv_heads;
    let mut out = vec![0f32; s.t * s.heads * hd];
    // Each output row reads about 2·n rows of the pool.
    let weight = 2 * s.n.max(1);
    threads::for_each_row(&mut out, hd, weight, |row, dst| {
        let (i, h) = (row / s.heads, row % s.heads);
        let (start, end) = s.visible(i);
        let pool_rows = &rows[(h / group) * s.stride..][start..end];
        let qh = &q[row * hd..(row + 1) * hd];
        let mut scores: Vec<f32> = pool_rows
            .iter()
            .map(|&r| {
                pool_row(keys, r, hd, s.pool_rows).map_or(f32::NAN, |k| {
                    let score = simd::dot(level, qh, k) * s.scale;
                    match s.softcap {
                        Some(cap) => cap * (score / cap).tanh(),
                        None => score,
                    }
                })
            })
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0f32;
        for x in scores.iter_mut() {
            *x = (*x - max).exp();
            total += *x;
        }
        let inv = 1.0 / total;
        for (&p, &r) in scores.iter().zip(pool_rows) {
            match pool_row(values, r, hd, s.pool_rows) {
                Some(v) => simd::axpy(level, p * inv, v, dst),
                None => dst.fill(f32::NAN),
            }
        }
    });
    out
}
