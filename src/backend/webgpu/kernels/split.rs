//! Tensors larger than one storage binding: the weight rows of a product or the table of an
//! embedding gather, split into row ranges that each fit `max_storage_buffer_binding_size`.
//!
//! A buffer may be larger than a binding (up to `max_buffer_size`, e.g. 128 MiB against 2 GiB
//! on lavapipe and in many browsers), and a 128k-vocabulary LM head often is. Such a weight is
//! uploaded whole; each op that reads it is recorded as one op per row range, each binding
//! only its range ([`Window`]):
//! - a product `x · Wᵀ` over W's rows `r0..r1` gives the output columns `r0..r1`: written in
//!   place when the output is one row (decode), else into a temporary `[rows, r1 − r0]` whose
//!   rows are copied into place;
//! - an embedding gather over the table's rows `r0..r1` writes only the outputs whose ids fall
//!   in that range (the first range also writes the NaN of an id past the vocabulary).
//!
//! Every range starts at a multiple of `min_storage_buffer_offset_alignment` in the weights
//! and, for a one-row output, in the output.

use super::{Encoder, Operand};
use crate::backend::webgpu::recorder::Window;
use crate::backend::webgpu::GpuBuffer;
use crate::backend::BackendKind;
use crate::backend::{MatmulSpec, OpSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The operand of `spec` whose rows may be split across bindings: (input index, rows, bytes
/// per row), for the products against a `[n, k]` weight and the embedding gather.
pub(in crate::backend::webgpu) fn split_operand(spec: &OpSpec) -> Option<(usize, usize, u64)> {
    match *spec {
        OpSpec::Matmul(MatmulSpec {
            rhs_transposed: true,
            rhs_batched: false,
            n,
            k,
            ..
        }) => Some((1, n, 4 * k as u64)),
        OpSpec::QMatmul { format, n, k, .. } => {
            let units = format.storage_len(k, k)?;
            Some((1, n, (units * format.unit_bytes()) as u64))
        }
        OpSpec::Embedding { vocab, dim, .. } => Some((0, vocab, 4 * dim as u64)),
        _ => None,
    }
}

/// Rows of a split product's output (0 for a gather, whose output is never bound in ranges).
fn output_rows(spec: &OpSpec) -> usize {
    match *spec {
        OpSpec::Matmul(ref m) => m.batch * m.m,
        OpSpec::QMatmul { m, .. } => m,
        _ => 0,
    }
}

/// Whether the split op's output is one row, bound one range of columns at a time.
fn one_output_row(spec: &OpSpec) -> bool {
    output_rows(spec) == 1
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The smallest positive r with `r · bytes` a multiple of `align`.
fn rows_to_align(bytes: u64, align: u64) -> u64 {
    align / gcd(align, bytes)
}

impl Encoder<'_> {
    /// The bytes of `buffer` a kernel sees: its window's size when it is bound as one.
    pub(super) fn bound_size(&self, buffer: &wgpu::Buffer) -> u64 {
        self.windows
            .iter()
            .find(|w| &w.buffer == buffer)
            .map_or(buffer.size(), |w| w.size)
    }

    /// Records `spec`, whose input `index` (`rows` rows of `row_bytes`) is larger than one
    /// binding, as one op per row range (see the module docs).
    pub(super) fn split_rows(
        &mut self,
        spec: &OpSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
        (index, rows, row_bytes): (usize, usize, u64),
    ) -> Result<()> {
        let op = spec.kind().name();
        let (max, limit_name) = self.ctx.max_binding();
        let align = u64::from(self.ctx.limits.min_storage_buffer_offset_alignment.max(4));
        // Rows per range: whole aligned steps in the weights and, when the output is one row
        // bound in ranges too, in the output; with room for the last range's padding.
        let a = rows_to_align(row_bytes, align);
        let b = if one_output_row(spec) {
            rows_to_align(4, align)
        } else {
            1
        };
        let step = a / gcd(a, b) * b;
        let per = (max.saturating_sub(16) / row_bytes.max(1)) / step * step;
        if per == 0 {
            return Err(Error::TensorTooLarge {
                op,
                backend: BackendKind::Wgpu,
                bytes: row_bytes * step,
                limit_name,
                limit: max,
            });
        }
        let weight = inputs[index];
        let total = weight.buffer.size();
        let per = per as usize;
        // The windows of the op's other operands stay; each range's go after it. (Windows are
        // looked up first to last, so a range's come first.)
        let kept = self.windows.clone();
        for r0 in (0..rows).step_by(per) {
            let count = per.min(rows - r0);
            let offset = r0 as u64 * row_bytes;
            // The last range runs to the end of the buffer (whole vec4s).
            let size = if r0 + count == rows {
                total - offset
            } else {
                count as u64 * row_bytes
            };
            let mut part = inputs.to_vec();
            part[index].len = (size / weight.dtype.unit_bytes() as u64) as usize;
            self.windows.insert(
                0,
                Window {
                    buffer: weight.buffer.clone(),
                    offset,
                    size,
                },
            );
            let done = self.encode_range(spec, out, &part, r0, count);
            self.windows.clone_from(&kept);
            done?;
        }
        Ok(())
    }

    /// Records `spec` over the weight rows `r0..r0 + count` (the weight's window is set).
    fn encode_range(
        &mut self,
        spec: &OpSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
        r0: usize,
        count: usize,
    ) -> Result<()> {
        let op = spec.kind().name();
        let n = match *spec {
            OpSpec::Embedding {
                vocab,
                dim,
                count: ids,
                ..
            } => {
                return self.embedding(op, (vocab, dim, ids), (r0, count), out, inputs);
            }
            OpSpec::Matmul(ref m) => m.n,
            OpSpec::QMatmul { n, .. } => n,
            _ => {
                return Err(Error::backend(
                    BackendKind::Wgpu,
                    format!("{op}: cannot be split"),
                ))
            }
        };
        let part = match *spec {
            OpSpec::Matmul(ref m) => OpSpec::Matmul(MatmulSpec {
                m: m.batch * m.m,
                batch: 1,
                n: count,
                ..*m
            }),
            OpSpec::QMatmul {
                format,
                activations,
                m,
                k,
                ..
            } => OpSpec::QMatmul {
                format,
                activations,
                m,
                n: count,
                k,
            },
            _ => unreachable!("matched above"),
        };
        if one_output_row(spec) {
            // One output row: the range's columns are consecutive.
            let offset = r0 as u64 * 4;
            let size = if r0 + count == n {
                out.size() - offset
            } else {
                count as u64 * 4
            };
            self.windows.insert(
                1,
                Window {
                    buffer: out.clone(),
                    offset,
                    size,
                },
            );
            return self.encode(&part, out, inputs);
        }
        let out_rows = output_rows(spec);
        let len = out_rows * count;
        let pool = self.recorder.pool().clone();
        let bytes = len as u64 * 4;
        let temp = GpuBuffer::new(pool.take(pool.size_class(bytes)), len, DType::F32, &pool);
        // A captured step keeps its temporaries (`capture.rs`).
        if let Some(log) = self.recorder.capture() {
            log.pin(&[&temp]);
        }
        self.encode(&part, temp.raw(), inputs)?;
        for row in 0..out_rows {
            self.recorder.copy_region(
                self.ctx,
                (temp.raw(), (row * count) as u64 * 4),
                (out, (row * n + r0) as u64 * 4),
                count as u64 * 4,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_row_steps() {
        assert_eq!(rows_to_align(4, 256), 64);
        assert_eq!(rows_to_align(18 * 18, 256), 64);
        assert_eq!(rows_to_align(256, 256), 1);
        assert_eq!(rows_to_align(34 * 4, 256), 32);
    }
}
