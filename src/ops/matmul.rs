//! Matrix products, batched: `a · b` and `a · bᵀ`.

use super::{dispatch, expect_dtype};
use crate::backend::{Activations, MatmulSpec, OpSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// `a · b` for `a` `[..., m, k]` and `b` `[..., k, n]` (or `[k, n]`, shared by every batch).
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    product("matmul", a, b, false)
}

/// `a · bᵀ` for `a` `[..., m, k]` and `b` `[..., n, k]` (or `[n, k]`, shared by every batch):
/// a linear layer with weights stored `[out_features, in_features]`. With `m = 1` this is the
/// matrix-vector product of LLM decoding.
///
/// A packed weight `b` (`F16`, `BF16` or a block format such as `Q8_0`) runs
/// [`qmatmul_t`](super::qmatmul_t) with the activations used as they are.
pub fn matmul_t(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if crate::quant::is_weight_format(b.dtype()) {
        let activations = if a.dtype() == DType::F16 {
            Activations::F16
        } else {
            Activations::F32
        };
        return super::qmatmul_t(a, b, activations);
    }
    product("matmul_t", a, b, true)
}

fn product(op: &'static str, a: &Tensor, b: &Tensor, rhs_transposed: bool) -> Result<Tensor> {
    expect_dtype(op, "a", a, DType::F32)?;
    expect_dtype(op, "b", b, DType::F32)?;
    let (ad, bd) = (a.dims(), b.dims());
    if ad.len() < 2 || bd.len() < 2 {
        return Err(Error::shape(
            op,
            "both operands need rank ≥ 2",
            &[a.shape(), b.shape()],
        ));
    }
    let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
    let (b_rows, b_cols) = (bd[bd.len() - 2], bd[bd.len() - 1]);
    let (kb, n) = if rhs_transposed {
        (b_cols, b_rows)
    } else {
        (b_rows, b_cols)
    };
    if k != kb {
        let what = if rhs_transposed {
            "the last axes of `a` and `b`"
        } else {
            "the last axis of `a` and the second-last of `b`"
        };
        return Err(Error::shape(
            op,
            format!("{what} must match (k = {k} vs {kb})"),
            &[a.shape(), b.shape()],
        ));
    }
    let batch_dims = &ad[..ad.len() - 2];
    let rhs_batched = bd.len() > 2;
    if rhs_batched && bd[..bd.len() - 2] != *batch_dims {
        return Err(Error::shape(
            op,
            "`b` must be a single matrix or have the same batch axes as `a`",
            &[a.shape(), b.shape()],
        ));
    }
    let batch: usize = batch_dims.iter().product();
    let mut out_dims = batch_dims.to_vec();
    out_dims.extend([m, n]);
    let out_shape = Shape::from(out_dims);
    if k == 0 {
        // An empty sum: every output element is 0.
        return Tensor::zeros(a.device(), out_shape);
    }
    let spec = OpSpec::Matmul(MatmulSpec {
        batch,
        m,
        n,
        k,
        rhs_transposed,
        rhs_batched,
    });
    dispatch(op, spec, &[a, b], out_shape, DType::F32, None)
}
