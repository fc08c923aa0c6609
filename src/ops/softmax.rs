//! Softmax over the last axis, plain and with a causal mask.

use super::{dispatch, expect_dtype, expect_min_rank};
use crate::backend::OpSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Numerically stable softmax over the last axis.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    expect_dtype("softmax", "x", x, DType::F32)?;
    expect_min_rank("softmax", x, 1)?;
    let spec = OpSpec::Softmax {
        rows: x.shape().rows(),
        cols: x.shape().last_dim(),
        causal: None,
    };
    dispatch("softmax", spec, &[x], x.shape().clone(), DType::F32, None)
}

/// Softmax over the last axis of attention scores `[..., queries, keys]` with a causal mask:
/// query `i` sees keys `j ≤ i + keys − queries` (the queries are the last ones of the
/// sequence, as when decoding with a KV cache); masked entries are exactly 0.
pub fn softmax_causal(x: &Tensor) -> Result<Tensor> {
    expect_dtype("softmax_causal", "x", x, DType::F32)?;
    expect_min_rank("softmax_causal", x, 2)?;
    let d = x.dims();
    let (queries, keys) = (d[d.len() - 2], d[d.len() - 1]);
    if queries > keys {
        return Err(Error::shape(
            "softmax_causal",
            format!(
                "needs queries ≤ keys in the last two axes, got {queries} queries over {keys} keys"
            ),
            &[x.shape()],
        ));
    }
    let causal = (queries > 0).then_some(queries);
    let spec = OpSpec::Softmax {
        rows: x.shape().rows(),
        cols: keys,
        causal,
    };
    dispatch(
        "softmax_causal",
        spec,
        &[x],
        x.shape().clone(),
        DType::F32,
        None,
    )
}
