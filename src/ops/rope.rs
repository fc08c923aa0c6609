//! Rotary position embedding.

use super::{dispatch, expect_dtype, expect_finite};
use crate::backend::{OpSpec, RopeLayout};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// Rotary position embedding of `x` `[tokens, heads, head_dim]` at `positions` (u32
/// `[tokens]`), with base `theta` (`rope_theta`) and the element pairing `layout`
/// ([`RopeLayout::HalfSplit`] for Hugging Face Llama weights).
pub fn rope(x: &Tensor, positions: &Tensor, theta: f32, layout: RopeLayout) -> Result<Tensor> {
    expect_dtype("rope", "x", x, DType::F32)?;
    expect_dtype("rope", "positions", positions, DType::U32)?;
    expect_finite("rope", "theta", theta)?;
    if theta <= 1.0 {
        return Err(Error::invalid(
            "rope",
            format!("`theta` must be > 1, got {theta}"),
        ));
    }
    let &[rows, heads, head_dim] = x.dims() else {
        return Err(Error::shape(
            "rope",
            "`x` must be [tokens, heads, head_dim]",
            &[x.shape()],
        ));
    };
    if head_dim % 2 != 0 {
        return Err(Error::shape("rope", "head_dim must be even", &[x.shape()]));
    }
    if positions.dims() != [rows] {
        return Err(Error::shape(
            "rope",
            "`positions` must hold one position per token (the first axis of `x`)",
            &[x.shape(), positions.shape()],
        ));
    }
    let spec = OpSpec::Rope {
        rows,
        heads,
        head_dim,
        theta,
        layout,
    };
    dispatch(
        "rope",
        spec,
        &[x, positions],
        x.shape().clone(),
        DType::F32,
        None,
    )
}
