//! The one dispatcher of the host backends (`reference` and `cpu`).
//!
//! Both keep tensors in host memory and differ only in their kernels, so the plumbing around
//! the kernels lives here once: the [`Backend`] methods (upload, download, in-place
//! `scatter_rows`), the match over [`OpSpec`] that reads each input as the slice its kernel
//! takes, the dtype fan-out of the data-movement ops (`permute`, `concat`, `narrow` on f32 or
//! u32), the widening of f16 activations before a quantized product, and sampling (one
//! definition, [`SampleParams::sample`], for both). A host backend implements
//! [`HostKernels`] and gets [`Backend`] from the blanket impl below.
//!
//! The match stays exhaustive: a new [`OpSpec`] variant fails to compile here until it is
//! dispatched, and a new [`HostKernels`] method fails to compile in each host backend until
//! that backend supplies the kernel.

use std::borrow::Cow;
use std::sync::Arc;

use super::{
    host_data, Activations, AttentionSpec, Backend, BackendInfo, BackendKind, BinaryOp, HostData,
    HostInputs, LinearSpec, MatmulSpec, OpSpec, RopeLayout, ScanOp, Storage, UnaryOp,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Element types the data-movement kernels (`permute`, `concat`, `narrow`) are written over.
pub trait Plain: Copy + Default + Send + Sync + 'static {}
impl Plain for f32 {}
impl Plain for u32 {}

/// A scan's view `(outer, len, inner)`: `outer` independent groups of `len` steps over
/// `inner` channels.
pub type ScanView = (usize, usize, usize);

/// A linear layer's weight as a fused op's kernel reads it.
#[derive(Clone, Copy)]
pub enum Weight<'a> {
    /// f32 values `[n, k]`.
    F32(&'a [f32]),
    /// Packed bytes of the spec's format, and the storage they come from (for a backend that
    /// caches a repacked copy per weight).
    Packed(&'a [u8], &'a Storage),
}

/// The kernels of a host backend, one per op, over host slices in the layout [`OpSpec`]
/// documents. Each returns the op's whole output.
pub trait HostKernels: std::fmt::Debug + Send + Sync + 'static {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// What [`Backend::info`] reports.
    fn info(&self) -> BackendInfo;
    /// The first `len` storage units of `x` (the copy-bandwidth ceiling of benchmarks).
    fn copy(&self, x: &HostData, len: usize) -> HostData {
        x.prefix(len)
    }

    /// [`OpSpec::Unary`].
    fn unary(&self, op: UnaryOp, x: &[f32]) -> Vec<f32>;
    /// [`OpSpec::Binary`] (`b` broadcast over `a` by repetition).
    fn binary(&self, op: BinaryOp, a: &[f32], b: &[f32]) -> Vec<f32>;
    /// [`OpSpec::RmsNorm`].
    fn rms_norm(&self, x: &[f32], w: &[f32], cols: usize, eps: f32) -> Vec<f32>;
    /// [`OpSpec::LayerNorm`].
    fn layer_norm(&self, x: &[f32], w: &[f32], b: &[f32], cols: usize, eps: f32) -> Vec<f32>;
    /// [`OpSpec::Softmax`].
    fn softmax(&self, x: &[f32], cols: usize, causal: Option<usize>) -> Vec<f32>;
    /// [`OpSpec::Rope`].
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &[f32],
        positions: &[u32],
        inv_freq: &[f32],
        heads: usize,
        head_dim: usize,
        layout: RopeLayout,
    ) -> Vec<f32>;
    /// [`OpSpec::Matmul`].
    fn matmul(&self, a: &[f32], b: &[f32], m: &MatmulSpec) -> Vec<f32>;
    /// [`OpSpec::Embedding`].
    fn embedding(&self, table: &[f32], ids: &[u32], vocab: usize, dim: usize) -> Vec<f32>;
    /// [`OpSpec::Permute`].
    fn permute<T: Plain>(&self, x: &[T], in_shape: &[usize], perm: &[usize]) -> Vec<T>;
    /// [`OpSpec::Argmax`].
    fn argmax(&self, x: &[f32], cols: usize) -> Vec<u32>;
    /// [`OpSpec::Quantize`]: rows of `cols` values into `format` blocks.
    fn quantize(&self, format: DType, x: &[f32], cols: usize) -> Vec<u8>;
    /// [`OpSpec::Dequantize`]: rows of `cols` values from `format` bytes (also widens f16
    /// activations, with `cols` 1).
    fn dequantize(&self, format: DType, bytes: &[u8], cols: usize) -> Vec<f32>;
    /// [`OpSpec::QMatmul`], with f16 activations already widened to f32. `weight` is the
    /// storage the bytes `w` come from, for a backend that caches a repacked copy per weight.
    #[allow(clippy::too_many_arguments)]
    fn qmatmul(
        &self,
        a: &[f32],
        w: &[u8],
        weight: &Storage,
        format: DType,
        act: Activations,
        m: usize,
        n: usize,
        k: usize,
    ) -> Vec<f32>;
    /// [`OpSpec::SwigluLinear`].
    fn swiglu_linear(
        &self,
        a: &[f32],
        gate: Weight<'_>,
        up: Weight<'_>,
        l: &LinearSpec,
    ) -> Vec<f32>;
    /// [`OpSpec::LinearResidual`].
    fn linear_residual(
        &self,
        a: &[f32],
        w: Weight<'_>,
        residual: &[f32],
        l: &LinearSpec,
    ) -> Vec<f32>;
    /// [`OpSpec::PagedAttention`].
    fn paged_attention(
        &self,
        q: &[f32],
        pools: (&[f32], &[f32]),
        rows: &[u32],
        spec: &AttentionSpec,
    ) -> Vec<f32>;
    /// [`OpSpec::Concat`].
    fn concat<T: Plain>(
        &self,
        a: &[T],
        b: &[T],
        rows: usize,
        a_cols: usize,
        b_cols: usize,
    ) -> Vec<T>;
    /// [`OpSpec::Narrow`].
    fn narrow<T: Plain>(
        &self,
        x: &[T],
        rows: usize,
        cols: usize,
        start: usize,
        len: usize,
    ) -> Vec<T>;
    /// [`OpSpec::Scan`]: `y` and `h0` are empty for the ops that take fewer inputs.
    fn scan(&self, op: ScanOp, view: ScanView, x: &[f32], y: &[f32], h0: &[f32]) -> Vec<f32>;
    /// [`OpSpec::ScanGradA`].
    fn scan_grad_a(&self, view: ScanView, g: &[f32], h: &[f32], h0: &[f32]) -> Vec<f32>;
    /// [`OpSpec::ScanGradInit`].
    fn scan_grad_init(&self, view: ScanView, a: &[f32], g: &[f32]) -> Vec<f32>;
    /// [`OpSpec::TernaryDot`]: exact integer dots of ternary weight rows and i8 activations.
    #[allow(clippy::too_many_arguments)]
    fn ternary_dot(
        &self,
        w: &[u8],
        x: &[i8],
        format: DType,
        m: usize,
        n: usize,
        k: usize,
    ) -> Vec<i32>;
}

impl<K: HostKernels> Backend for K {
    fn kind(&self) -> BackendKind {
        HostKernels::kind(self)
    }

    fn info(&self) -> BackendInfo {
        HostKernels::info(self)
    }

    fn upload(&self, data: HostData) -> Result<Storage> {
        Ok(Storage::Host(Arc::new(data)))
    }

    fn download(&self, storage: &Storage) -> Result<HostData> {
        host_data(HostKernels::kind(self), storage).cloned()
    }

    fn copy(&self, x: &Storage, len: usize) -> Result<Storage> {
        let host = host_data(HostKernels::kind(self), x)?;
        Ok(Storage::Host(Arc::new(HostKernels::copy(self, host, len))))
    }

    fn copy_into(
        &self,
        (src, from): (&Storage, usize),
        (target, at): (&mut Storage, usize),
        units: usize,
    ) -> Result<()> {
        let kind = HostKernels::kind(self);
        let source = host_data(kind, src)?;
        let unit = source.dtype().unit_bytes();
        let Storage::Host(target) = target else {
            return Err(Error::backend(
                kind,
                "copy_into: the target is not in host memory",
            ));
        };
        // Shared host data (a clone elsewhere) is copied first: the write is this handle's.
        let target = Arc::make_mut(target);
        target.bytes_mut()[at * unit..(at + units) * unit]
            .copy_from_slice(&source.bytes()[from * unit..(from + units) * unit]);
        Ok(())
    }

    fn write_into(
        &self,
        spec: &OpSpec,
        targets: &mut [&mut Storage],
        inputs: &[&Storage],
    ) -> Result<()> {
        let kind = HostKernels::kind(self);
        let wrong_targets = || {
            Error::backend(
                kind,
                format!("{} writes {} targets", spec.kind(), spec.targets()),
            )
        };
        let wrong_inputs = || Error::backend(kind, format!("{}: missing inputs", spec.kind()));
        if targets.len() != spec.targets() {
            return Err(wrong_targets());
        }
        if let Some(stores) = spec.paired_stores() {
            // The two stores, one after the other: the op's definition.
            for (target, (store, picks)) in targets.iter_mut().zip(stores) {
                let inputs = picks
                    .iter()
                    .map(|&i| inputs.get(i).copied().ok_or_else(wrong_inputs))
                    .collect::<Result<Vec<_>>>()?;
                self.write_into(&store, &mut [&mut **target], &inputs)?;
            }
            return Ok(());
        }
        let [target] = targets else {
            return Err(wrong_targets());
        };
        match *spec {
            OpSpec::NormLinearInto {
                l,
                head_dim,
                pool_rows,
                ..
            } => {
                // The product, its heads-first rows, then the scatter: the op's definition.
                let (product, slots) = inputs.split_at(inputs.len().saturating_sub(1));
                let slots = slots.first().copied().ok_or_else(wrong_inputs)?;
                let y = execute(self, &OpSpec::NormLinear(l), product)?;
                let HostData::F32(y) = y else {
                    return Err(Error::backend(kind, "a product not f32"));
                };
                let heads = l.n / head_dim;
                let rows = self.permute(&y, &[l.m, heads, head_dim], &[1, 0, 2]);
                let rows = Storage::Host(Arc::new(HostData::F32(rows)));
                let scatter = OpSpec::ScatterRows {
                    rows: pool_rows,
                    cols: head_dim,
                    count: heads * l.m,
                };
                scatter_rows(kind, &scatter, target, &[&rows, slots])
            }
            _ => scatter_rows(kind, spec, target, inputs),
        }
    }

    fn execute(&self, spec: &OpSpec, inputs: &[&Storage]) -> Result<Storage> {
        Ok(Storage::Host(Arc::new(execute(self, spec, inputs)?)))
    }
}

/// Runs `spec` with the kernels of `k`.
fn execute<K: HostKernels>(k: &K, spec: &OpSpec, inputs: &[&Storage]) -> Result<HostData> {
    let kind = HostKernels::kind(k);
    let input = HostInputs::new(kind, spec, inputs);
    Ok(match spec {
        OpSpec::Unary { op, .. } => HostData::F32(k.unary(*op, input.f32(0)?)),
        OpSpec::Binary { op, .. } => HostData::F32(k.binary(*op, input.f32(0)?, input.f32(1)?)),
        OpSpec::RmsNorm { cols, eps, .. } => {
            HostData::F32(k.rms_norm(input.f32(0)?, input.f32(1)?, *cols, *eps))
        }
        OpSpec::LayerNorm { cols, eps, .. } => {
            HostData::F32(k.layer_norm(input.f32(0)?, input.f32(1)?, input.f32(2)?, *cols, *eps))
        }
        OpSpec::Softmax { cols, causal, .. } => {
            HostData::F32(k.softmax(input.f32(0)?, *cols, *causal))
        }
        OpSpec::Rope {
            heads,
            head_dim,
            layout,
            ..
        } => HostData::F32(k.rope(
            input.f32(0)?,
            input.u32(1)?,
            input.f32(2)?,
            *heads,
            *head_dim,
            *layout,
        )),
        OpSpec::Matmul(m) => HostData::F32(k.matmul(input.f32(0)?, input.f32(1)?, m)),
        OpSpec::Embedding {
            vocab, dim, format, ..
        } if *format != DType::F32 => HostData::F32(packed_embedding(
            k,
            input.bytes(0, *format)?,
            input.u32(1)?,
            *vocab,
            (*format, *dim),
        )),
        OpSpec::Embedding { vocab, dim, .. } => {
            HostData::F32(k.embedding(input.f32(0)?, input.u32(1)?, *vocab, *dim))
        }
        OpSpec::Permute { in_shape, perm } => match input.data(0)? {
            HostData::F32(x) => HostData::F32(k.permute(x, in_shape, perm)),
            HostData::U32(x) => HostData::U32(k.permute(x, in_shape, perm)),
            HostData::Bytes(d, _) => return Err(Error::backend(kind, format!("permute of {d}"))),
        },
        OpSpec::Argmax { cols, .. } => HostData::U32(k.argmax(input.f32(0)?, *cols)),
        OpSpec::Sample { vocab, params, .. } => {
            HostData::U32(params.sample(input.f32(0)?, input.f32(1)?, *vocab))
        }
        OpSpec::ScatterRows { .. } | OpSpec::NormLinearInto { .. } => {
            return Err(Error::backend(
                kind,
                format!("{} runs in place (write_into)", spec.kind()),
            ))
        }
        OpSpec::Quantize { format, cols, .. } => {
            HostData::Bytes(*format, k.quantize(*format, input.f32(0)?, *cols).into())
        }
        OpSpec::Dequantize { format, cols, .. } => {
            HostData::F32(k.dequantize(*format, input.bytes(0, *format)?, *cols))
        }
        OpSpec::QMatmul {
            format,
            activations,
            m,
            n,
            k: depth,
        } => {
            let widened;
            let a = match activations {
                Activations::F16 => {
                    widened = k.dequantize(DType::F16, input.bytes(0, DType::F16)?, 1);
                    &widened[..]
                }
                _ => input.f32(0)?,
            };
            let w = input.bytes(1, *format)?;
            HostData::F32(k.qmatmul(a, w, inputs[1], *format, *activations, *m, *n, *depth))
        }
        OpSpec::Concat {
            rows,
            a_cols,
            b_cols,
        } => match (input.data(0)?, input.data(1)?) {
            (HostData::U32(a), HostData::U32(b)) => {
                HostData::U32(k.concat(a, b, *rows, *a_cols, *b_cols))
            }
            _ => HostData::F32(k.concat(input.f32(0)?, input.f32(1)?, *rows, *a_cols, *b_cols)),
        },
        OpSpec::Narrow {
            rows,
            cols,
            start,
            len,
        } => match input.data(0)? {
            HostData::U32(x) => HostData::U32(k.narrow(x, *rows, *cols, *start, *len)),
            _ => HostData::F32(k.narrow(input.f32(0)?, *rows, *cols, *start, *len)),
        },
        OpSpec::Scan {
            op,
            outer,
            len,
            inner,
        } => {
            let view = (*outer, *len, *inner);
            let x = input.f32(0)?;
            let y = match op {
                ScanOp::Linear | ScanOp::LinearAdjoint => input.f32(1)?,
                _ => &[],
            };
            let h0 = match op {
                ScanOp::Linear => input.f32(2)?,
                _ => &[],
            };
            HostData::F32(k.scan(*op, view, x, y, h0))
        }
        OpSpec::ScanGradA { outer, len, inner } => HostData::F32(k.scan_grad_a(
            (*outer, *len, *inner),
            input.f32(0)?,
            input.f32(1)?,
            input.f32(2)?,
        )),
        OpSpec::ScanGradInit { outer, len, inner } => {
            HostData::F32(k.scan_grad_init((*outer, *len, *inner), input.f32(0)?, input.f32(1)?))
        }
        OpSpec::TernaryDot {
            format,
            m,
            n,
            k: depth,
        } => {
            let x: &[i8] = bytemuck::cast_slice(input.bytes(1, DType::I8)?);
            let dots = k.ternary_dot(input.bytes(0, *format)?, x, *format, *m, *n, *depth);
            HostData::Bytes(DType::I32, bytemuck::cast_slice(&dots).to_vec().into())
        }
        OpSpec::NormLinear(l) => {
            let a = normed(k, &input, 2, l)?;
            let y = match weight(&input, inputs, 1, l.format)? {
                Weight::F32(w) => k.matmul(&a, w, &l.f32_product()),
                Weight::Packed(w, storage) => {
                    k.qmatmul(&a, w, storage, l.format, l.activations, l.m, l.n, l.k)
                }
            };
            HostData::F32(match l.rope {
                Some(r) => {
                    let (positions, inv_freq) = (input.u32(3)?, input.f32(4)?);
                    k.rope(
                        &y,
                        positions,
                        inv_freq,
                        l.n / r.head_dim,
                        r.head_dim,
                        r.layout,
                    )
                }
                None => y,
            })
        }
        OpSpec::SwigluLinear(l) => HostData::F32(k.swiglu_linear(
            &normed(k, &input, 3, l)?,
            weight(&input, inputs, 1, l.format)?,
            weight(&input, inputs, 2, l.format)?,
            l,
        )),
        OpSpec::LinearResidual(l) => HostData::F32(k.linear_residual(
            input.f32(0)?,
            weight(&input, inputs, 1, l.format)?,
            input.f32(2)?,
            l,
        )),
        OpSpec::PagedAttention(a) => HostData::F32(k.paged_attention(
            input.f32(0)?,
            (input.f32(1)?, input.f32(2)?),
            input.u32(3)?,
            a,
        )),
    })
}

/// Input `i`, a weight of `format`, as [`Weight`].
/// The activations (input 0) of a fused product, RMS-normed with the weight at input
/// `norm_input` when the spec has a norm (the host kernels take them normed).
fn normed<'a, K: HostKernels>(
    k: &K,
    input: &HostInputs<'a>,
    norm_input: usize,
    l: &LinearSpec,
) -> Result<Cow<'a, [f32]>> {
    let a = input.f32(0)?;
    Ok(match l.norm {
        Some(n) => Cow::Owned(k.rms_norm(a, input.f32(norm_input)?, l.k, n.eps)),
        None => Cow::Borrowed(a),
    })
}

fn weight<'a>(
    input: &HostInputs<'a>,
    inputs: &[&'a Storage],
    i: usize,
    format: DType,
) -> Result<Weight<'a>> {
    Ok(match format {
        DType::F32 => Weight::F32(input.f32(i)?),
        _ => Weight::Packed(input.bytes(i, format)?, inputs[i]),
    })
}

/// [`OpSpec::ScatterRows`] on host storage: a copy of each row to its slot. `target` must not
/// be shared (the op layer makes sure). Also the [`Backend::write_into`] fallback of backends
/// without an in-place kernel, through the reference backend.
pub(crate) fn scatter_rows(
    backend: BackendKind,
    spec: &OpSpec,
    target: &mut Storage,
    inputs: &[&Storage],
) -> Result<()> {
    let OpSpec::ScatterRows { rows, cols, count } = *spec else {
        return Err(Error::backend(
            backend,
            format!("{} is not an in-place op", spec.kind()),
        ));
    };
    let input = HostInputs::new(backend, spec, inputs);
    let slots = input.u32(1)?;
    let Storage::Host(host) = target else {
        return Err(Error::backend(
            backend,
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
                backend,
                format!("scatter_rows of {} rows into {}", src.dtype(), dst.dtype()),
            ))
        }
    }
    Ok(())
}

/// [`OpSpec::Embedding`] of a packed table: the rows of `ids` gathered as stored, then
/// dequantized together (an id `≥ vocab` gives a row of NaN).
fn packed_embedding<K: HostKernels>(
    k: &K,
    table: &[u8],
    ids: &[u32],
    vocab: usize,
    (format, dim): (DType, usize),
) -> Vec<f32> {
    let row_bytes = format.row_bytes(dim);
    let mut rows = Vec::with_capacity(ids.len() * row_bytes);
    for &id in ids {
        match table.get(id as usize * row_bytes..(id as usize + 1) * row_bytes) {
            Some(row) if (id as usize) < vocab => rows.extend_from_slice(row),
            _ => rows.resize(rows.len() + row_bytes, 0),
        }
    }
    let mut out = k.dequantize(format, &rows, dim);
    for (i, &id) in ids.iter().enumerate() {
        if id as usize >= vocab {
            out[i * dim..(i + 1) * dim].fill(f32::NAN);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::reference::ReferenceBackend;

    /// Runs `spec` on both host backends and checks each against `want`, worked out by hand:
    /// the dispatcher is shared by the oracle and the backend tested against it, so comparing
    /// the two cannot catch a fault here.
    fn check(spec: OpSpec, inputs: &[HostData], want: HostData) {
        let storages: Vec<Storage> = inputs
            .iter()
            .map(|d| Storage::Host(Arc::new(d.clone())))
            .collect();
        let refs: Vec<&Storage> = storages.iter().collect();
        let backends: [&dyn Backend; 2] = [&ReferenceBackend, &CpuBackend::new()];
        for b in backends {
            let out = b.execute(&spec, &refs).unwrap();
            assert_eq!(out.as_host().unwrap(), &want, "{spec:?} on {}", b.kind());
        }
    }

    #[test]
    fn data_movement_fans_out_over_f32_and_u32() {
        let ids = HostData::U32(vec![1, 2, 3, 4, 5, 6]);
        let xs = HostData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let transpose = || OpSpec::Permute {
            in_shape: vec![2, 3],
            perm: vec![1, 0],
        };
        check(
            transpose(),
            std::slice::from_ref(&ids),
            HostData::U32(vec![1, 4, 2, 5, 3, 6]),
        );
        check(
            transpose(),
            std::slice::from_ref(&xs),
            HostData::F32(vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]),
        );
        let narrow = || OpSpec::Narrow {
            rows: 2,
            cols: 3,
            start: 1,
            len: 2,
        };
        check(
            narrow(),
            std::slice::from_ref(&ids),
            HostData::U32(vec![2, 3, 5, 6]),
        );
        check(
            narrow(),
            std::slice::from_ref(&xs),
            HostData::F32(vec![2.0, 3.0, 5.0, 6.0]),
        );
        let concat = || OpSpec::Concat {
            rows: 2,
            a_cols: 3,
            b_cols: 1,
        };
        check(
            concat(),
            &[ids, HostData::U32(vec![7, 8])],
            HostData::U32(vec![1, 2, 3, 7, 4, 5, 6, 8]),
        );
        check(
            concat(),
            &[xs, HostData::F32(vec![7.0, 8.0])],
            HostData::F32(vec![1.0, 2.0, 3.0, 7.0, 4.0, 5.0, 6.0, 8.0]),
        );
    }

    #[test]
    fn f16_activations_are_widened_before_a_quantized_product() {
        // Activations 1.5 and -2 as f16; one F16 "weight" row of 0.5 and 0.25.
        let f16 = |v: &[f32]| {
            let b: Vec<u8> = v
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect();
            HostData::Bytes(DType::F16, b.into())
        };
        let spec = OpSpec::QMatmul {
            format: DType::F16,
            activations: Activations::F16,
            m: 1,
            n: 1,
            k: 2,
        };
        // 1.5 * 0.5 + (-2) * 0.25 = 0.25
        check(
            spec,
            &[f16(&[1.5, -2.0]), f16(&[0.5, 0.25])],
            HostData::F32(vec![0.25]),
        );
    }
}
