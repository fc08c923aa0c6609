//! Rotary position embedding.

use super::{dispatch, expect_dtype};
use crate::backend::{OpSpec, RopeLayout};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Rotary position embedding of `x` `[tokens, heads, head_dim]` at `positions` (u32
/// `[tokens]`) with the rotary frequencies `inv_freq` (f32 `[head_dim/2]`: pair `i` turns by
/// `position · inv_freq[i]`) and the element pairing `layout` ([`RopeLayout::HalfSplit`] for
/// Hugging Face Llama weights). A model's frequencies, rope scaling included, come from
/// `LlamaConfig::rope`; [`rope_inv_freq`] is the unscaled table.
pub fn rope(
    x: &Tensor,
    positions: &Tensor,
    inv_freq: &Tensor,
    layout: RopeLayout,
) -> Result<Tensor> {
    expect_dtype("rope", "x", x, DType::F32)?;
    expect_dtype("rope", "positions", positions, DType::U32)?;
    expect_dtype("rope", "inv_freq", inv_freq, DType::F32)?;
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
    if inv_freq.dims() != [head_dim / 2] {
        return Err(Error::shape(
            "rope",
            "`inv_freq` must hold one frequency per rotated pair ([head_dim / 2])",
            &[x.shape(), inv_freq.shape()],
        ));
    }
    let spec = OpSpec::Rope {
        rows,
        heads,
        head_dim,
        layout,
    };
    dispatch(
        "rope",
        spec,
        &[x, positions, inv_freq],
        x.shape().clone(),
        DType::F32,
        None,
    )
}

/// The unscaled rotary frequencies `theta^(−2i/head_dim)` for `i < head_dim/2`, computed in
/// f64 and rounded to f32 (Llama's `default` rope type with base `theta`).
pub fn rope_inv_freq(theta: f64, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| theta.powf(-2.0 * i as f64 / head_dim as f64) as f32)
        .collect()
}
