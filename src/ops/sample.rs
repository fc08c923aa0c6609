//! Drawing tokens from logits on the device.

use super::{dispatch, expect_dtype, expect_min_rank};
use crate::backend::{OpSpec, SampleParams};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// One token per row of `logits` (f32 `[..., vocab]`), drawn with temperature, top-k and
/// top-p as [`SampleParams`] defines, using one number in `[0, 1)` per row from `uniform`
/// (f32, the shape of `logits` without its last axis). The output is u32 with that shape.
///
/// With the same logits and numbers every backend draws the same token, except where rounding
/// puts a number or a top-p cut within rounding of a boundary. Greedy parameters
/// (`temperature ≤ 0`) ignore `uniform`. On a GPU nothing is read back: the ids can feed the
/// next step's embedding directly.
pub fn sample(logits: &Tensor, uniform: &Tensor, params: SampleParams) -> Result<Tensor> {
    const OP: &str = "sample";
    expect_dtype(OP, "logits", logits, DType::F32)?;
    expect_dtype(OP, "uniform", uniform, DType::F32)?;
    expect_min_rank(OP, logits, 1)?;
    let vocab = logits.shape().last_dim();
    let dims = logits.dims();
    let out_shape = Shape::from(&dims[..dims.len() - 1]);
    if vocab == 0 || uniform.shape() != &out_shape {
        return Err(Error::shape(
            OP,
            "needs logits [..., vocab ≥ 1] and one uniform number per row",
            &[logits.shape(), uniform.shape()],
        ));
    }
    if params.top_p.is_nan() {
        return Err(Error::invalid(OP, "top_p is NaN"));
    }
    let spec = OpSpec::Sample {
        rows: out_shape.numel(),
        vocab,
        params,
    };
    let bound = u32::try_from(vocab).ok();
    dispatch(OP, spec, &[logits, uniform], out_shape, DType::U32, bound)
}
