//! Layout changes: transpose, permute and concatenation into a new contiguous tensor.

use super::{dispatch, expect_dtype};
use crate::backend::OpSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Reorders the axes: output axis `d` is input axis `perm[d]`. The result is a contiguous
/// copy. Works for f32 and u32 tensors of rank ≤ 6.
pub fn permute(x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    let rank = x.shape().rank();
    let mut seen = vec![false; rank];
    let valid = perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
    if !valid {
        return Err(Error::invalid(
            "permute",
            format!(
                "{perm:?} is not a permutation of the {rank} axes of a {} tensor",
                x.shape()
            ),
        ));
    }
    if rank > OpSpec::MAX_PERMUTE_RANK {
        return Err(Error::invalid(
            "permute",
            format!(
                "rank {rank} is above the supported {}",
                OpSpec::MAX_PERMUTE_RANK
            ),
        ));
    }
    let out_shape = Shape::from(perm.iter().map(|&p| x.dims()[p]).collect::<Vec<_>>());
    let spec = OpSpec::Permute {
        in_shape: x.dims().to_vec(),
        perm: perm.to_vec(),
    };
    dispatch("permute", spec, &[x], out_shape, x.dtype(), x.index_bound())
}

/// Swaps axes `dim0` and `dim1` into a contiguous copy.
pub fn transpose(x: &Tensor, dim0: usize, dim1: usize) -> Result<Tensor> {
    let rank = x.shape().rank();
    if dim0 >= rank || dim1 >= rank {
        return Err(Error::invalid(
            "transpose",
            format!("axes ({dim0}, {dim1}) out of range for a rank-{rank} tensor"),
        ));
    }
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(dim0, dim1);
    permute(x, &perm)
}

/// `a` and `b` joined along `axis`: every other dimension must match; both f32 or both u32.
pub fn concat(a: &Tensor, b: &Tensor, axis: usize) -> Result<Tensor> {
    const OP: &str = "concat";
    expect_words(OP, "a", a)?;
    expect_dtype(OP, "b", b, a.dtype())?;
    let (ad, bd) = (a.dims(), b.dims());
    if axis >= ad.len() || ad.len() != bd.len() {
        return Err(Error::shape(
            OP,
            format!("both operands need the same rank, above {axis}"),
            &[a.shape(), b.shape()],
        ));
    }
    let others_match = ad
        .iter()
        .zip(bd)
        .enumerate()
        .all(|(d, (x, y))| d == axis || x == y);
    if !others_match {
        return Err(Error::shape(
            OP,
            format!("every dimension but axis {axis} must match"),
            &[a.shape(), b.shape()],
        ));
    }
    let inner: usize = ad[axis + 1..].iter().product();
    let rows: usize = ad[..axis].iter().product();
    let mut out = ad.to_vec();
    out[axis] += bd[axis];
    let spec = OpSpec::Concat {
        rows,
        a_cols: ad[axis] * inner,
        b_cols: bd[axis] * inner,
    };
    let bound = a.index_bound().zip(b.index_bound()).map(|(x, y)| x.max(y));
    dispatch(OP, spec, &[a, b], Shape::from(out), a.dtype(), bound)
}

/// Fails unless `t` is f32 or u32 (the 32-bit-word dtypes the copy ops move).
pub(super) fn expect_words(op: &'static str, argument: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() == DType::U32 {
        return Ok(());
    }
    expect_dtype(op, argument, t, DType::F32)
}

/// `len` entries of `x` along `axis` from `start` (f32 or u32): a contiguous copy.
pub fn narrow(x: &Tensor, axis: usize, start: usize, len: usize) -> Result<Tensor> {
    const OP: &str = "narrow";
    expect_words(OP, "x", x)?;
    let dims = x.dims();
    if axis >= dims.len() || start.checked_add(len).is_none_or(|end| end > dims[axis]) {
        return Err(Error::shape(
            OP,
            format!(
                "entries {start}..{} of axis {axis} are out of range",
                start.saturating_add(len)
            ),
            &[x.shape()],
        ));
    }
    let inner: usize = dims[axis + 1..].iter().product();
    let mut out = dims.to_vec();
    out[axis] = len;
    let spec = OpSpec::Narrow {
        rows: dims[..axis].iter().product(),
        cols: dims[axis] * inner,
        start: start * inner,
        len: len * inner,
    };
    // The bound of a u32 tensor is one past its largest value (`embedding` names that value
    // when it is out of range): a part of the tensor may not hold it.
    let whole = len == dims[axis];
    let bound = x.index_bound().filter(|_| whole);
    dispatch(OP, spec, &[x], Shape::from(out), x.dtype(), bound)
}
