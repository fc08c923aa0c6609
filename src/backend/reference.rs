//! The reference backend: plain scalar Rust, f64 arithmetic and accumulation.
//!
//! This is the oracle. It is written for obviousness, not speed: every other backend is tested
//! against it, so each op here reads like its definition in [`OpSpec`]'s docs.

mod fused;

use super::host::{HostKernels, Plain, Weight};
use super::spec::{permute_strides, rope_pair};
use super::{
    Activations, AttentionSpec, BackendInfo, BackendKind, BinaryOp, DeviceClass, LinearSpec,
    MatmulSpec, RopeLayout, SampleParams, ScanOp, Storage, UnaryOp,
};
use crate::dtype::DType;
use crate::quant::{self, ternary};

/// The scalar oracle backend. Always present.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReferenceBackend;

impl HostKernels for ReferenceBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Reference
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: BackendKind::Reference,
            class: DeviceClass::Cpu,
            device_name: "scalar f64 oracle".into(),
            vendor: String::new(),
            driver: String::new(),
            api: "native".into(),
            features: vec![],
            limits: vec![],
            threads: Some(1),
            simd: None,
            missing_ops: vec![],
            f16_path: "widened to f64".into(),
            reductions: String::new(),
            prefill: String::new(),
            profiler: String::new(),
            options: vec![],
            variants: vec![],
        }
    }

    fn unary(&self, op: UnaryOp, x: &[f32]) -> Vec<f32> {
        unary(op, x)
    }

    fn binary(&self, op: BinaryOp, a: &[f32], b: &[f32]) -> Vec<f32> {
        binary(op, a, b)
    }

    fn rms_norm(&self, x: &[f32], w: &[f32], cols: usize, eps: f32) -> Vec<f32> {
        rms_norm(x, w, cols, eps)
    }

    fn layer_norm(&self, x: &[f32], w: &[f32], b: &[f32], cols: usize, eps: f32) -> Vec<f32> {
        layer_norm(x, w, b, cols, eps)
    }

    fn softmax(&self, x: &[f32], cols: usize, causal: Option<usize>) -> Vec<f32> {
        softmax(x, cols, causal)
    }

    fn rope(
        &self,
        x: &[f32],
        positions: &[u32],
        inv_freq: &[f32],
        heads: usize,
        head_dim: usize,
        layout: RopeLayout,
    ) -> Vec<f32> {
        rope(x, positions, inv_freq, heads, head_dim, layout)
    }

    fn matmul(&self, a: &[f32], b: &[f32], m: &MatmulSpec) -> Vec<f32> {
        matmul(a, b, m)
    }

    fn embedding(&self, table: &[f32], ids: &[u32], vocab: usize, dim: usize) -> Vec<f32> {
        embedding(table, ids, vocab, dim)
    }

    fn permute<T: Plain>(&self, x: &[T], in_shape: &[usize], perm: &[usize]) -> Vec<T> {
        permute(x, in_shape, perm)
    }

    fn argmax(&self, x: &[f32], cols: usize) -> Vec<u32> {
        argmax(x, cols)
    }

    fn quantize(&self, format: DType, x: &[f32], _cols: usize) -> Vec<u8> {
        let mut out = vec![0u8; x.len() / format.block_len() * format.block_bytes()];
        quant::quantize(format, x, &mut out);
        out
    }

    fn dequantize(&self, format: DType, bytes: &[u8], _cols: usize) -> Vec<f32> {
        let mut out = vec![0f32; bytes.len() / format.block_bytes() * format.block_len()];
        quant::dequantize(format, bytes, &mut out);
        out
    }

    fn qmatmul(
        &self,
        a: &[f32],
        w: &[u8],
        _weight: &Storage,
        format: DType,
        act: Activations,
        m: usize,
        n: usize,
        k: usize,
    ) -> Vec<f32> {
        let mut dequantized = vec![0f32; n * k];
        quant::dequantize(format, w, &mut dequantized);
        qmatmul(a, &dequantized, act, m, n, k)
    }

    fn swiglu_linear(
        &self,
        a: &[f32],
        gate: Weight<'_>,
        up: Weight<'_>,
        l: &LinearSpec,
    ) -> Vec<f32> {
        fused::swiglu_linear(a, gate, up, l)
    }

    fn linear_residual(
        &self,
        a: &[f32],
        w: Weight<'_>,
        residual: &[f32],
        l: &LinearSpec,
    ) -> Vec<f32> {
        fused::linear_residual(a, w, residual, l)
    }

    fn paged_attention(
        &self,
        q: &[f32],
        pools: (&[f32], &[f32]),
        rows: &[u32],
        spec: &AttentionSpec,
    ) -> Vec<f32> {
        fused::paged_attention(q, pools, rows, spec)
    }

    fn concat<T: Plain>(
        &self,
        a: &[T],
        b: &[T],
        rows: usize,
        a_cols: usize,
        b_cols: usize,
    ) -> Vec<T> {
        concat(a, b, rows, a_cols, b_cols)
    }

    fn narrow<T: Plain>(
        &self,
        x: &[T],
        rows: usize,
        cols: usize,
        start: usize,
        len: usize,
    ) -> Vec<T> {
        narrow(x, rows, cols, start, len)
    }

    fn scan(
        &self,
        op: ScanOp,
        (outer, len, inner): (usize, usize, usize),
        x: &[f32],
        y: &[f32],
        h0: &[f32],
    ) -> Vec<f32> {
        let view = ScanView { outer, len, inner };
        match op {
            ScanOp::Linear => view.linear(x, y, h0),
            ScanOp::LinearAdjoint => view.adjoint(x, y),
            ScanOp::LogCumprod => view.log_cumprod(x),
            ScanOp::LogCumSumExp => view.logcumsumexp(x),
        }
    }

    fn scan_grad_a(
        &self,
        (outer, len, inner): (usize, usize, usize),
        g: &[f32],
        h: &[f32],
        h0: &[f32],
    ) -> Vec<f32> {
        let view = ScanView { outer, len, inner };
        let mut out = vec![0f32; g.len()];
        view.each_channel(|c, at| {
            for t in 0..view.len {
                let prev = if t == 0 { h0[c] } else { h[at(t - 1)] };
                out[at(t)] = (g[at(t)] as f64 * prev as f64) as f32;
            }
        });
        out
    }

    fn scan_grad_init(
        &self,
        (outer, len, inner): (usize, usize, usize),
        a: &[f32],
        g: &[f32],
    ) -> Vec<f32> {
        let view = ScanView { outer, len, inner };
        let mut out = vec![0f32; outer * inner];
        view.each_channel(|c, at| {
            out[c] = (a[at(0)] as f64 * g[at(0)] as f64) as f32;
        });
        out
    }

    fn ternary_dot(
        &self,
        w: &[u8],
        x: &[i8],
        format: DType,
        m: usize,
        n: usize,
        k: usize,
    ) -> Vec<i32> {
        ternary_dot(w, x, format, m, n, k)
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn unary(op: UnaryOp, x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            let v = v as f64;
            let y = match op {
                UnaryOp::Silu => v * sigmoid(v),
                UnaryOp::GeluTanh => {
                    let c = (2.0 / std::f64::consts::PI).sqrt();
                    0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())
                }
                UnaryOp::GeluErf => 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)),
                UnaryOp::Sigmoid => sigmoid(v),
                UnaryOp::Scale(s) => v * s as f64,
                UnaryOp::Softcap(cap) => cap as f64 * (v / cap as f64).tanh(),
            };
            y as f32
        })
        .collect()
}

fn binary(op: BinaryOp, a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter()
        .enumerate()
        .map(|(i, &x)| {
            let (x, y) = (x as f64, b[i % b.len()] as f64);
            let r = match op {
                BinaryOp::Add => x + y,
                BinaryOp::Mul => x * y,
                BinaryOp::SwiGlu => x * sigmoid(x) * y,
            };
            r as f32
        })
        .collect()
}

fn rms_norm(x: &[f32], w: &[f32], cols: usize, eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols.max(1)) {
        let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        out.extend(
            row.iter()
                .zip(w)
                .map(|(&v, &g)| (v as f64 * inv * g as f64) as f32),
        );
    }
    out
}

fn layer_norm(x: &[f32], w: &[f32], b: &[f32], cols: usize, eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols.max(1)) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        out.extend(
            row.iter()
                .zip(w.iter().zip(b))
                .map(|(&v, (&g, &c))| ((v as f64 - mean) * inv * g as f64 + c as f64) as f32),
        );
    }
    out
}

fn softmax(x: &[f32], cols: usize, causal: Option<usize>) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for (r, row) in x.chunks(cols.max(1)).enumerate() {
        // Keys visible to this row: all, or up to the causal limit.
        let visible = match causal {
            Some(q) => (r % q + cols - q + 1).min(cols),
            None => cols,
        };
        let max = row[..visible].iter().fold(f64::NEG_INFINITY, |m, &v| {
            if v.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(v as f64)
            }
        });
        let exps: Vec<f64> = row[..visible]
            .iter()
            .map(|&v| (v as f64 - max).exp())
            .collect();
        let sum: f64 = exps.iter().sum();
        out.extend(exps.iter().map(|e| (e / sum) as f32));
        out.extend(std::iter::repeat_n(0.0, cols - visible));
    }
    out
}

fn rope(
    x: &[f32],
    positions: &[u32],
    inv_freq: &[f32],
    heads: usize,
    head_dim: usize,
    layout: super::RopeLayout,
) -> Vec<f32> {
    let mut out = x.to_vec();
    let row_len = heads * head_dim;
    for (r, &pos) in positions.iter().enumerate() {
        for (i, &f) in inv_freq.iter().enumerate() {
            let angle = (pos as f32 * f) as f64;
            let (sin, cos) = angle.sin_cos();
            let (i0, i1) = rope_pair(layout, head_dim, i);
            for h in 0..heads {
                let base = r * row_len + h * head_dim;
                let (x0, x1) = (x[base + i0] as f64, x[base + i1] as f64);
                out[base + i0] = (x0 * cos - x1 * sin) as f32;
                out[base + i1] = (x0 * sin + x1 * cos) as f32;
            }
        }
    }
    out
}

fn matmul(a: &[f32], rhs: &[f32], m: &MatmulSpec) -> Vec<f32> {
    let mut out = vec![0f32; m.batch * m.m * m.n];
    let rhs_stride = if m.rhs_batched { m.n * m.k } else { 0 };
    for b in 0..m.batch {
        let a_mat = &a[b * m.m * m.k..];
        let r_mat = &rhs[b * rhs_stride..];
        for i in 0..m.m {
            for j in 0..m.n {
                let mut acc = 0f64;
                for p in 0..m.k {
                    let r = if m.rhs_transposed {
                        r_mat[j * m.k + p]
                    } else {
                        r_mat[p * m.n + j]
                    };
                    acc += a_mat[i * m.k + p] as f64 * r as f64;
                }
                out[(b * m.m + i) * m.n + j] = acc as f32;
            }
        }
    }
    out
}

/// Rows of `a` (width `a_cols`) each followed by the same row of `b`.
fn concat<T: Copy>(a: &[T], b: &[T], rows: usize, a_cols: usize, b_cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    for r in 0..rows {
        out.extend_from_slice(&a[r * a_cols..(r + 1) * a_cols]);
        out.extend_from_slice(&b[r * b_cols..(r + 1) * b_cols]);
    }
    out
}

/// Columns `start..start + len` of each of `rows` rows of width `cols`.
fn narrow<T: Copy>(x: &[T], rows: usize, cols: usize, start: usize, len: usize) -> Vec<T> {
    (0..rows)
        .flat_map(|r| x[r * cols + start..r * cols + start + len].iter().copied())
        .collect()
}

/// The `[outer, len, inner]` view of a scan.
struct ScanView {
    outer: usize,
    len: usize,
    inner: usize,
}

impl ScanView {
    /// Calls `f(channel, index_of)` for each of the `outer · inner` channels, where
    /// `index_of(t)` is the flat index of step `t` of that channel.
    fn each_channel(&self, mut f: impl FnMut(usize, &dyn Fn(usize) -> usize)) {
        for o in 0..self.outer {
            for i in 0..self.inner {
                let at = |t: usize| (o * self.len + t) * self.inner + i;
                f(o * self.inner + i, &at);
            }
        }
    }

    fn linear(&self, a: &[f32], b: &[f32], h0: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; a.len()];
        self.each_channel(|c, at| {
            let mut h = h0[c] as f64;
            for t in 0..self.len {
                h = a[at(t)] as f64 * h + b[at(t)] as f64;
                out[at(t)] = h as f32;
            }
        });
        out
    }

    fn adjoint(&self, a: &[f32], grad: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; a.len()];
        self.each_channel(|_, at| {
            let mut g = 0f64;
            for t in (0..self.len).rev() {
                let next = if t + 1 < self.len {
                    a[at(t + 1)] as f64
                } else {
                    0.0
                };
                g = grad[at(t)] as f64 + next * g;
                out[at(t)] = g as f32;
            }
        });
        out
    }

    fn log_cumprod(&self, a: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; a.len()];
        self.each_channel(|_, at| {
            let mut sum = 0f64;
            for t in 0..self.len {
                sum += (a[at(t)] as f64).ln();
                out[at(t)] = sum.exp() as f32;
            }
        });
        out
    }

    fn logcumsumexp(&self, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        self.each_channel(|_, at| {
            // The running sum is s · e^m.
            let (mut m, mut s) = (f64::NEG_INFINITY, 0f64);
            for t in 0..self.len {
                let v = x[at(t)] as f64;
                if v > m {
                    s = s * (m - v).exp() + 1.0;
                    m = v;
                } else if v != f64::NEG_INFINITY || v.is_nan() {
                    s += (v - m).exp();
                }
                out[at(t)] = (m + s.ln()) as f32;
            }
        });
        out
    }
}

/// `out[i, j] = Σ act(a)[i, :] · w[j, :]` in f64, `w` already dequantized.
fn qmatmul(a: &[f32], w: &[f32], act: Activations, m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        let row = act.effective(&a[i * k..(i + 1) * k]);
        for j in 0..n {
            let w_row = &w[j * k..(j + 1) * k];
            let acc: f64 = row.iter().zip(w_row).map(|(&x, &y)| x * y as f64).sum();
            out[i * n + j] = acc as f32;
        }
    }
    out
}

/// `Σ trit(w[j, :]) · x[i, :]` as exact integers.
fn ternary_dot(w: &[u8], x: &[i8], format: DType, m: usize, n: usize, k: usize) -> Vec<i32> {
    let mut trits = vec![0i8; n * k];
    for (b, t) in w
        .chunks_exact(format.block_bytes())
        .zip(trits.chunks_exact_mut(ternary::BLOCK))
    {
        let mut block = [0i8; ternary::BLOCK];
        ternary::block_trits(format, b, &mut block);
        t.copy_from_slice(&block);
    }
    let mut out = vec![0i32; m * n];
    for i in 0..m {
        for j in 0..n {
            let acc: i64 = (0..k)
                .map(|p| trits[j * k + p] as i64 * x[i * k + p] as i64)
                .sum();
            out[i * n + j] = acc as i32;
        }
    }
    out
}

fn embedding(table: &[f32], ids: &[u32], vocab: usize, dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * dim);
    for &id in ids {
        let id = id as usize;
        if id < vocab {
            out.extend_from_slice(&table[id * dim..(id + 1) * dim]);
        } else {
            out.extend(std::iter::repeat_n(f32::NAN, dim));
        }
    }
    out
}

fn permute<T: Copy>(x: &[T], in_shape: &[usize], perm: &[usize]) -> Vec<T> {
    let (out_shape, strides) = permute_strides(in_shape, perm);
    let n: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(n);
    for linear in 0..n {
        let mut rem = linear;
        let mut src = 0;
        for d in (0..out_shape.len()).rev() {
            src += (rem % out_shape[d]) * strides[d];
            rem /= out_shape[d];
        }
        out.push(x[src]);
    }
    out
}

fn argmax(x: &[f32], cols: usize) -> Vec<u32> {
    x.chunks(cols.max(1))
        .map(|row| {
            let mut best = 0usize;
            for (j, &v) in row.iter().enumerate() {
                if v.is_nan() {
                    return j as u32;
                }
                if v > row[best] {
                    best = j;
                }
            }
            best as u32
        })
        .collect()
}

/// One row of [`OpSpec::Sample`], step by step as [`SampleParams`] defines it: every kept
/// entry found by sorting, weights and sums in f64.
pub fn sample_row(x: &[f32], params: &SampleParams, u: f32) -> u32 {
    let mut order: Vec<usize> = (0..x.len()).filter(|&i| !x[i].is_nan()).collect();
    // Decreasing value, then increasing index.
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    let Some(&first) = order.first() else {
        return 0;
    };
    let max = x[first];
    if params.is_greedy() || max == f32::INFINITY {
        return first as u32;
    }
    let t = params.temperature as f64;
    let weight = |i: usize| ((x[i] as f64 - max as f64) / t).exp();
    let mut threshold = x[*order.last().unwrap_or(&first)];
    let k = params.top_k as usize;
    if k > 0 && k < order.len() {
        threshold = x[order[k - 1]];
    }
    if params.top_p < 1.0 {
        let kept: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| x[i] >= threshold)
            .collect();
        let total: f64 = kept.iter().map(|&i| weight(i)).sum();
        let goal = params.top_p.max(0.0) as f64 * total;
        let mut sum = 0.0;
        for &i in &kept {
            sum += weight(i);
            if sum >= goal {
                threshold = x[i];
                break;
            }
        }
    }
    let kept: Vec<usize> = (0..x.len()).filter(|&i| x[i] >= threshold).collect();
    let total: f64 = kept.iter().map(|&i| weight(i)).sum();
    let target = u as f64 * total;
    let mut sum = 0.0;
    for &i in &kept {
        sum += weight(i);
        if sum > target {
            return i as u32;
        }
    }
    kept.last().map_or(first as u32, |&i| i as u32)
}
