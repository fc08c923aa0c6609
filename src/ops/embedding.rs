//! Embedding lookup.

use super::{dispatch, expect_dtype};
use crate::backend::OpSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Gathers rows of `table` `[vocab, dim]` at `ids` (u32, any shape); the output has shape
/// `ids.shape + [dim]`.
///
/// Ids known on the host (tensors made from slices, argmax results) are checked and an id
/// `≥ vocab` is an error. An out-of-range id computed on a GPU cannot be checked without a
/// readback; its row is NaN, so the mistake shows instead of reading other memory.
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    expect_dtype("embedding", "table", table, DType::F32)?;
    expect_dtype("embedding", "ids", ids, DType::U32)?;
    let &[vocab, dim] = table.dims() else {
        return Err(Error::shape(
            "embedding",
            "`table` must be [vocab, dim]",
            &[table.shape()],
        ));
    };
    if let Some(bound) = ids.index_bound() {
        if bound as usize > vocab {
            return Err(Error::invalid(
                "embedding",
                format!(
                    "id {} is out of range for a table of {vocab} rows",
                    bound - 1
                ),
            ));
        }
    }
    let count = ids.shape().numel();
    let mut out_dims = ids.dims().to_vec();
    out_dims.push(dim);
    let spec = OpSpec::Embedding { vocab, dim, count };
    dispatch(
        "embedding",
        spec,
        &[table, ids],
        Shape::from(out_dims),
        DType::F32,
        None,
    )
}
