//! The reference backend: plain scalar Rust, f64 arithmetic and accumulation.
//!
//! This is the oracle. It is written for obviousness, not speed: every other backend is tested
//! against it, so each op here reads like its definition in [`OpSpec`]'s docs.

use std::sync::Arc;

use super::spec::{permute_strides, rope_pair};
use super::{
    host_data, Activations, Backend, BackendInfo, BackendKind, BinaryOp, DeviceClass, HostData,
    HostInputs, MatmulSpec, OpSpec, SampleParams, ScanOp, Storage, UnaryOp,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{self, ternary};

/// The scalar oracle backend. Always present.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReferenceBackend;

impl Backend for ReferenceBackend {
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
        }
    }

    fn upload(&self, data: HostData) -> Result<Storage> {
        Ok(Storage::Host(Arc::new(data)))
    }

    fn download(&self, storage: &Storage) -> Result<HostData> {
        host_data(BackendKind::Reference, storage).cloned()
    }

    fn copy(&self, x: &Storage, len: usize) -> Result<Storage> {
        let host = self.download(x)?;
        Ok(Storage::Host(Arc::new(host.prefix(len))))
    }

    fn write_into(&self, spec: &OpSpec, target: &mut Storage, inputs: &[&Storage]) -> Result<()> {
        scatter_rows_host(BackendKind::Reference, spec, target, inputs)
    }

    fn execute(&self, spec: &OpSpec, inputs: &[&Storage]) -> Result<Storage> {
        let input = HostInputs::new(BackendKind::Reference, spec, inputs);
        let out = match spec {
            OpSpec::Unary { op, .. } => HostData::F32(unary(*op, input.f32(0)?)),
            OpSpec::Binary { op, .. } => HostData::F32(binary(*op, input.f32(0)?, input.f32(1)?)),
            OpSpec::RmsNorm { cols, eps, .. } => {
                HostData::F32(rms_norm(input.f32(0)?, input.f32(1)?, *cols, *eps))
            }
            OpSpec::LayerNorm { cols, eps, .. } => HostData::F32(layer_norm(
                input.f32(0)?,
                input.f32(1)?,
                input.f32(2)?,
                *cols,
                *eps,
            )),
            OpSpec::Softmax { cols, causal, .. } => {
                HostData::F32(softmax(input.f32(0)?, *cols, *causal))
            }
            OpSpec::Rope {
                heads,
                head_dim,
                layout,
                ..
            } => HostData::F32(rope(
                input.f32(0)?,
                input.u32(1)?,
                input.f32(2)?,
                *heads,
                *head_dim,
                *layout,
            )),
            OpSpec::Matmul(m) => HostData::F32(matmul(input.f32(0)?, input.f32(1)?, m)),
            OpSpec::Embedding { vocab, dim, .. } => {
                HostData::F32(embedding(input.f32(0)?, input.u32(1)?, *vocab, *dim))
            }
            OpSpec::Permute { in_shape, perm } => match input.data(0)? {
                HostData::F32(x) => HostData::F32(permute(x, in_shape, perm)),
                HostData::U32(x) => HostData::U32(permute(x, in_shape, perm)),
                HostData::Bytes(d, _) => {
                    return Err(crate::Error::backend(
                        "reference",
                        format!("permute of {d}"),
                    ))
                }
            },
            OpSpec::Argmax { cols, .. } => HostData::U32(argmax(input.f32(0)?, *cols)),
            OpSpec::Sample { vocab, params, .. } => {
                let rows = input.f32(0)?.chunks(*vocab);
                let drawn = rows
                    .zip(input.f32(1)?)
                    .map(|(row, &u)| sample_row(row, params, u));
                HostData::U32(drawn.collect())
            }
            OpSpec::ScatterRows { .. } => {
                return Err(Error::backend(
                    "reference",
                    "scatter_rows runs in place (write_into)",
                ))
            }
            OpSpec::Quantize { format, .. } => {
                let mut out = vec![0u8; spec.output_len()];
                quant::quantize(*format, input.f32(0)?, &mut out);
                HostData::Bytes(*format, out)
            }
            OpSpec::Dequantize { format, rows, cols } => {
                let mut out = vec![0f32; rows * cols];
                quant::dequantize(*format, input.bytes(0, *format)?, &mut out);
                HostData::F32(out)
            }
            OpSpec::QMatmul {
                format,
                activations,
                m,
                n,
                k,
            } => {
                let a = match activations {
                    Activations::F16 => {
                        let bytes = input.bytes(0, DType::F16)?;
                        let mut a = vec![0f32; bytes.len() / 2];
                        quant::dequantize(DType::F16, bytes, &mut a);
                        a
                    }
                    _ => input.f32(0)?.to_vec(),
                };
                let mut w = vec![0f32; n * k];
                quant::dequantize(*format, input.bytes(1, *format)?, &mut w);
                HostData::F32(qmatmul(&a, &w, *activations, *m, *n, *k))
            }
            OpSpec::Concat {
                rows,
                a_cols,
                b_cols,
            } => match (input.data(0)?, input.data(1)?) {
                (HostData::U32(a), HostData::U32(b)) => {
                    HostData::U32(concat(a, b, *rows, *a_cols, *b_cols))
                }
                _ => HostData::F32(concat(
                    input.f32(0)?,
                    input.f32(1)?,
                    *rows,
                    *a_cols,
                    *b_cols,
                )),
            },
            OpSpec::Narrow {
                rows,
                cols,
                start,
                len,
            } => match input.data(0)? {
                HostData::U32(x) => HostData::U32(narrow(x, *rows, *cols, *start, *len)),
                _ => HostData::F32(narrow(input.f32(0)?, *rows, *cols, *start, *len)),
            },
            OpSpec::Scan {
                op,
                outer,
                len,
                inner,
            } => {
                let view = ScanView {
                    outer: *outer,
                    len: *len,
                    inner: *inner,
                };
                HostData::F32(match op {
                    ScanOp::Linear => view.linear(input.f32(0)?, input.f32(1)?, input.f32(2)?),
                    ScanOp::LinearAdjoint => view.adjoint(input.f32(0)?, input.f32(1)?),
                    ScanOp::LogCumprod => view.log_cumprod(input.f32(0)?),
                    ScanOp::LogCumSumExp => view.logcumsumexp(input.f32(0)?),
                })
            }
            OpSpec::ScanGradA { outer, len, inner } => {
                let (g, h, h0) = (input.f32(0)?, input.f32(1)?, input.f32(2)?);
                let view = ScanView {
                    outer: *outer,
                    len: *len,
                    inner: *inner,
                };
                let mut out = vec![0f32; g.len()];
                view.each_channel(|c, at| {
                    for t in 0..view.len {
                        let prev = if t == 0 { h0[c] } else { h[at(t - 1)] };
                        out[at(t)] = (g[at(t)] as f64 * prev as f64) as f32;
                    }
                });
                HostData::F32(out)
            }
            OpSpec::ScanGradInit { outer, len, inner } => {
                let (a, g) = (input.f32(0)?, input.f32(1)?);
                let view = ScanView {
                    outer: *outer,
                    len: *len,
                    inner: *inner,
                };
                let mut out = vec![0f32; outer * inner];
                view.each_channel(|c, at| {
                    out[c] = (a[at(0)] as f64 * g[at(0)] as f64) as f32;
                });
                HostData::F32(out)
            }
            OpSpec::TernaryDot { format, m, n, k } => {
                let dots = ternary_dot(
                    input.bytes(0, *format)?,
                    input.bytes(1, DType::I8)?,
                    *format,
                    *m,
                    *n,
                    *k,
                );
                HostData::Bytes(DType::I32, bytemuck::cast_slice(&dots).to_vec())
            }
        };
        Ok(Storage::Host(Arc::new(out)))
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
                UnaryOp::Scale(s) => v * s as f64,
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
fn ternary_dot(w: &[u8], x: &[u8], format: DType, m: usize, n: usize, k: usize) -> Vec<i32> {
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
                .map(|p| trits[j * k + p] as i64 * x[i * k + p] as i8 as i64)
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

/// [`OpSpec::ScatterRows`] on host storage, for the host backends (`reference`, `cpu`): a copy
/// of each row to its slot. `target` must not be shared (the op layer makes sure).
pub(crate) fn scatter_rows_host(
    backend: BackendKind,
    spec: &OpSpec,
    target: &mut Storage,
    inputs: &[&Storage],
) -> Result<()> {
    let OpSpec::ScatterRows { rows, cols, count } = *spec else {
        return Err(Error::backend(
            backend.name(),
            format!("{} is not an in-place op", spec.kind()),
        ));
    };
    let input = HostInputs::new(backend, spec, inputs);
    let slots = input.u32(1)?;
    let Storage::Host(host) = target else {
        return Err(Error::backend(
            backend.name(),
            "scatter_rows: the target is not in host memory",
        ));
    };
    fn scatter<T: Copy>(dst: &mut [T], src: &[T], slots: &[u32], rows: usize, cols: usize) {
        for (i, &slot) in slots.iter().enumerate() {
            let slot = slot as usize;
            if slot < rows {
                dst[slot * cols..(slot + 1) * cols].copy_from_slice(&src[i * cols..(i + 1) * cols]);
            }
        }
    }
    let slots = &slots[..count];
    match (Arc::make_mut(host), input.data(0)?) {
        (HostData::F32(dst), HostData::F32(src)) => scatter(dst, src, slots, rows, cols),
        (HostData::U32(dst), HostData::U32(src)) => scatter(dst, src, slots, rows, cols),
        (dst, src) => {
            return Err(Error::backend(
                backend.name(),
                format!("scatter_rows of {} rows into {}", src.dtype(), dst.dtype()),
            ))
        }
    }
    Ok(())
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
