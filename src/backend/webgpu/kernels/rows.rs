//! Encoding Row ops: `shaders/norm.wgsl` (RMS and layer norm), `softmax.wgsl`, `rope.wgsl`, `argmax.wgsl`.

use super::{u32_of, Encoder, Shader, ARGMAX_SHORT_COLS, LOOP_BUDGET, SOFTMAX_SHORT_COLS, WG};
use crate::backend::webgpu::context::MvShape;
use crate::backend::webgpu::params::{ArgmaxParams, NormParams, RopeParams, SoftmaxParams};
use crate::backend::BackendKind;
use crate::backend::OpSpec;
use crate::error::{Error, Result};

impl Encoder<'_> {
    /// Records one op of this family reading `raw` and writing `out`.
    pub(super) fn rows(
        &mut self,
        spec: &OpSpec,
        out: &wgpu::Buffer,
        raw: &[&wgpu::Buffer],
    ) -> Result<()> {
        let op = spec.kind().name();
        match spec {
            OpSpec::RmsNorm { rows, cols, eps } | OpSpec::LayerNorm { rows, cols, eps } => {
                let layer = matches!(spec, OpSpec::LayerNorm { .. });
                let p = NormParams {
                    rows: u32_of(op, "rows", *rows)?,
                    cols: u32_of(op, "cols", *cols)?,
                    eps: *eps,
                    ..Default::default()
                };
                if layer {
                    let grid = self.grid(op, *rows as u64)?;
                    return self.run(Shader::Norm, "layer_norm", &p, out, &raw[..3], grid);
                }
                // One lane per row runs two loops over it (the loop budget).
                if self.ctx.mv_shape() == MvShape::Lanes && 2 * cols < LOOP_BUDGET {
                    let grid = self.grid(op, (*rows as u64).div_ceil(64))?;
                    return self.run(Shader::Norm, "rms_norm_rows", &p, out, &raw[..2], grid);
                }
                let grid = self.grid(op, *rows as u64)?;
                self.run(Shader::Norm, "rms_norm", &p, out, &raw[..2], grid)
            }
            OpSpec::Softmax { rows, cols, causal } => {
                let q = match causal {
                    Some(q) if *q == 0 || q > cols => {
                        return Err(Error::invalid(
                            "softmax",
                            format!("causal queries {q} must be in 1..={cols}"),
                        ))
                    }
                    Some(q) => *q,
                    None => 0,
                };
                let p = SoftmaxParams {
                    rows: u32_of(op, "rows", *rows)?,
                    cols: u32_of(op, "cols", *cols)?,
                    causal_q: u32_of(op, "causal", q)?,
                    ..Default::default()
                };
                if *cols <= SOFTMAX_SHORT_COLS {
                    let grid = self.grid(op, (*rows as u64).div_ceil(64))?;
                    self.run(Shader::Softmax, "softmax_short", &p, out, &raw[..1], grid)
                } else {
                    let grid = self.grid(op, *rows as u64)?;
                    self.run(Shader::Softmax, "softmax", &p, out, &raw[..1], grid)
                }
            }
            OpSpec::Rope {
                rows,
                heads,
                head_dim,
                layout,
                ..
            } => {
                if !head_dim.is_multiple_of(2) {
                    return Err(Error::invalid(
                        "rope",
                        format!("head_dim {head_dim} must be even"),
                    ));
                }
                let interleaved = matches!(layout, crate::backend::RopeLayout::Interleaved);
                let p = RopeParams {
                    rows: u32_of(op, "rows", *rows)?,
                    heads: u32_of(op, "heads", *heads)?,
                    head_dim: u32_of(op, "head_dim", *head_dim)?,
                    interleaved: interleaved as u32,
                };
                let pairs = (*rows as u64) * (*heads as u64) * (*head_dim as u64 / 2);
                u32_of(op, "pairs", pairs as usize)?;
                let grid = self.grid(op, pairs.div_ceil(WG))?;
                self.run(Shader::Rope, "rope", &p, out, &raw[..3], grid)
            }
            OpSpec::Argmax { rows, cols } => {
                let p = ArgmaxParams {
                    rows: u32_of(op, "rows", *rows)?,
                    cols: u32_of(op, "cols", *cols)?,
                    ..Default::default()
                };
                if *cols <= ARGMAX_SHORT_COLS {
                    let grid = self.grid(op, (*rows as u64).div_ceil(WG))?;
                    self.run(Shader::Argmax, "argmax_short", &p, out, &raw[..1], grid)
                } else {
                    let grid = self.grid(op, *rows as u64)?;
                    self.run(Shader::Argmax, "argmax", &p, out, &raw[..1], grid)
                }
            }
            _ => Err(Error::backend(
                BackendKind::Wgpu,
                format!("{op} is not encoded by kernels/rows.rs"),
            )),
        }
    }
}
