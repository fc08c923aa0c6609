//! Encoding `shaders/elementwise.wgsl`: unary activations, scale and binary ops.

use super::{u32_of, Encoder, Shader, WG};
use crate::backend::webgpu::params::ElementwiseParams;
use crate::backend::BackendKind;
use crate::backend::{BinaryOp, OpSpec, UnaryOp};
use crate::error::{Error, Result};

impl Encoder<'_> {
    /// Records one op of this family reading `raw` and writing `out`.
    pub(super) fn elementwise(
        &mut self,
        spec: &OpSpec,
        out: &wgpu::Buffer,
        raw: &[&wgpu::Buffer],
    ) -> Result<()> {
        let op = spec.kind().name();
        match spec {
            OpSpec::Unary { op: f, len } => {
                let (entry, factor) = match f {
                    UnaryOp::Silu => ("silu", 0.0),
                    UnaryOp::GeluTanh => ("gelu_tanh", 0.0),
                    UnaryOp::GeluErf => ("gelu_erf", 0.0),
                    UnaryOp::Sigmoid => ("sigmoid", 0.0),
                    UnaryOp::Scale(s) => ("scale", *s),
                    UnaryOp::Softcap(cap) => ("softcap", *cap),
                };
                let p = ElementwiseParams {
                    len: u32_of(op, "len", *len)?,
                    rhs_len: 1,
                    factor,
                    ..Default::default()
                };
                let grid = self.grid(op, (*len as u64).div_ceil(WG))?;
                self.run(Shader::Elementwise, entry, &p, out, &raw[..1], grid)
            }
            OpSpec::Binary {
                op: f,
                len,
                rhs_len,
            } => {
                let entry = match f {
                    BinaryOp::Add => "add",
                    BinaryOp::Mul => "mul",
                    BinaryOp::SwiGlu => "swiglu",
                };
                let p = ElementwiseParams {
                    len: u32_of(op, "len", *len)?,
                    rhs_len: u32_of(op, "rhs_len", *rhs_len)?,
                    ..Default::default()
                };
                let grid = self.grid(op, (*len as u64).div_ceil(WG))?;
                self.run(Shader::Elementwise, entry, &p, out, &raw[..2], grid)
            }
            _ => Err(Error::backend(
                BackendKind::Wgpu,
                format!("{op} is not encoded by kernels/elementwise.rs"),
            )),
        }
    }
}
