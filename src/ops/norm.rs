//! Normalisations over the last axis: RMS norm and layer norm.

use super::{dispatch, expect_dtype, expect_finite, expect_min_rank};
use crate::backend::OpSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Checks a norm's input `x`, its per-column parameters and `eps` (also for the norms the fused
/// products fold in).
pub(super) fn check(
    op: &'static str,
    x: &Tensor,
    params: &[(&'static str, &Tensor)],
    eps: f32,
) -> Result<()> {
    expect_dtype(op, "x", x, DType::F32)?;
    expect_min_rank(op, x, 1)?;
    expect_finite(op, "eps", eps)?;
    if eps < 0.0 {
        return Err(Error::invalid(op, format!("`eps` must be ≥ 0, got {eps}")));
    }
    for (name, p) in params {
        expect_dtype(op, name, p, DType::F32)?;
        if p.dims() != [x.shape().last_dim()] {
            return Err(Error::shape(
                op,
                format!("`{name}` must be a vector as long as the last axis of `x`"),
                &[x.shape(), p.shape()],
            ));
        }
    }
    Ok(())
}

/// RMS normalisation over the last axis: `x / sqrt(mean(x²) + eps) · weight`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    check("rms_norm", x, &[("weight", weight)], eps)?;
    let spec = OpSpec::RmsNorm {
        rows: x.shape().rows(),
        cols: x.shape().last_dim(),
        eps,
    };
    dispatch(
        "rms_norm",
        spec,
        &[x, weight],
        x.shape().clone(),
        DType::F32,
        None,
    )
}

/// Layer normalisation over the last axis: `(x − mean) / sqrt(var + eps) · weight + bias`.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
    check("layer_norm", x, &[("weight", weight), ("bias", bias)], eps)?;
    let spec = OpSpec::LayerNorm {
        rows: x.shape().rows(),
        cols: x.shape().last_dim(),
        eps,
    };
    dispatch(
        "layer_norm",
        spec,
        &[x, weight, bias],
        x.shape().clone(),
        DType::F32,
        None,
    )
}
