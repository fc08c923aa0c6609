//! Encoding Data movement: `shaders/permute.wgsl` and `shaders/concat.wgsl` (concat, narrow, scatter_rows).

use super::{u32_of, Encoder, Shader, WG};
use crate::backend::spec::permute_strides;
use crate::backend::webgpu::params::{ConcatParams, PermuteParams};
use crate::backend::BackendKind;
use crate::backend::OpSpec;
use crate::error::{Error, Result};

impl Encoder<'_> {
    /// Records one op of this family reading `raw` and writing `out`.
    pub(super) fn movement(
        &mut self,
        spec: &OpSpec,
        out: &wgpu::Buffer,
        raw: &[&wgpu::Buffer],
    ) -> Result<()> {
        let op = spec.kind().name();
        match spec {
            OpSpec::Permute { in_shape, perm } => {
                if in_shape.len() > OpSpec::MAX_PERMUTE_RANK || perm.len() != in_shape.len() {
                    return Err(Error::invalid(
                        "permute",
                        format!("rank {} with permutation {perm:?}", in_shape.len()),
                    ));
                }
                let (out_shape, strides) = permute_strides(in_shape, perm);
                let len: usize = out_shape.iter().product();
                let mut p = PermuteParams {
                    len: u32_of(op, "len", len)?,
                    rank: in_shape.len() as u32,
                    ..Default::default()
                };
                for d in 0..8 {
                    p.shape[d] = u32_of(op, "dimension", out_shape.get(d).copied().unwrap_or(1))?;
                    p.strides[d] = u32_of(op, "stride", strides.get(d).copied().unwrap_or(0))?;
                }
                let grid = self.grid(op, (len as u64).div_ceil(WG))?;
                self.run(Shader::Permute, "permute", &p, out, &raw[..1], grid)
            }
            OpSpec::Concat {
                rows,
                a_cols,
                b_cols,
            } => {
                let len = rows * (a_cols + b_cols);
                let p = ConcatParams {
                    len: u32_of(op, "len", len)?,
                    a_cols: u32_of(op, "a_cols", *a_cols)?,
                    b_cols: u32_of(op, "b_cols", *b_cols)?,
                    width: 0,
                };
                let grid = self.grid(op, (len as u64).div_ceil(WG))?;
                self.run(Shader::Concat, "concat", &p, out, &raw[..2], grid)
            }
            OpSpec::Narrow {
                rows,
                cols,
                start,
                len,
            } => {
                let total = rows * len;
                let p = ConcatParams {
                    len: u32_of(op, "len", total)?,
                    a_cols: u32_of(op, "cols", *cols)?,
                    b_cols: u32_of(op, "start", *start)?,
                    width: u32_of(op, "width", *len)?,
                };
                let grid = self.grid(op, (total as u64).div_ceil(WG))?;
                self.run(Shader::Concat, "narrow", &p, out, &raw[..1], grid)
            }
            OpSpec::ScatterRows { rows, cols, count } => {
                let len = count * cols;
                let p = ConcatParams {
                    len: u32_of(op, "len", len)?,
                    a_cols: u32_of(op, "cols", *cols)?,
                    b_cols: u32_of(op, "rows", *rows)?,
                    width: 0,
                };
                u32_of(op, "rows·cols", rows * cols)?;
                let grid = self.grid(op, (len as u64).div_ceil(WG))?;
                self.run(Shader::Concat, "scatter_rows", &p, out, &raw[..2], grid)
            }
            _ => Err(Error::backend(
                BackendKind::Wgpu,
                format!("{op} is not encoded by kernels/movement.rs"),
            )),
        }
    }
}
