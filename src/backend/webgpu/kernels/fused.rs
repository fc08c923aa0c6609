//! Encoding the fused decode ops that have wgpu kernels. [`OpSpec::LinearResidual`]: the
//! product with packed weights adds the residual as the `mv` kernel's epilogue, so a decode
//! projection and its residual connection are one dispatch; off that kernel (f32 weights,
//! long rows) the product is followed by `add_residual`. The other fused ops
//! ([`UNFUSED`]) are composed from other ops by `ops`.

use super::quant::Product;
use super::{Encoder, Operand};
use crate::backend::{LinearSpec, OpKind, OpSpec};
use crate::dtype::DType;
use crate::error::Result;

/// The fused ops without a wgpu kernel yet: `ops` composes them here from other ops.
pub(in crate::backend::webgpu) const UNFUSED: [OpKind; 2] =
    [OpKind::SwigluLinear, OpKind::PagedAttention];

impl Encoder<'_> {
    /// Records `out = residual + act(a) · wᵀ`; `inputs` are `a`, `w`, `residual` and, when
    /// the backend allocated it, the int8-activation buffer.
    pub(super) fn linear_residual(
        &mut self,
        l: &LinearSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        let (a, w, residual) = (inputs[0].buffer, inputs[1].buffer, inputs[2].buffer);
        if l.format == DType::F32 {
            let spec = OpSpec::Matmul(l.f32_product());
            self.encode(&spec, out, &inputs[..2])?;
            return self.add_residual(l.m, l.n, out, residual);
        }
        let product = Product {
            format: l.format,
            activations: l.activations,
            m: l.m,
            n: l.n,
            k: l.k,
        };
        let temp = inputs.get(3).map(|t| t.buffer);
        self.qmatmul(product, out, [a, w], temp, Some(residual))
    }
}
