//! Reductions over the last axis: argmax.

use super::{dispatch, expect_dtype, expect_min_rank};
use crate::backend::OpSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// The index of the largest value along the last axis (u32, shape without the last axis):
/// the first on ties, the first NaN when a row has one (as numpy does).
pub fn argmax(x: &Tensor) -> Result<Tensor> {
    expect_dtype("argmax", "x", x, DType::F32)?;
    expect_min_rank("argmax", x, 1)?;
    let cols = x.shape().last_dim();
    if cols == 0 {
        return Err(Error::shape(
            "argmax",
            "the last axis is empty: there is no maximum",
            &[x.shape()],
        ));
    }
    let dims = x.dims();
    let out_shape = Shape::from(&dims[..dims.len() - 1]);
    let bound = u32::try_from(cols).ok();
    let spec = OpSpec::Argmax {
        rows: x.shape().rows(),
        cols,
    };
    dispatch("argmax", spec, &[x], out_shape, DType::U32, bound)
}
