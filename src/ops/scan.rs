//! Scans along one axis: the linear recurrence of state-space models (with its gradients),
//! the cumulative product in log space, and the cumulative log-sum-exp.
//!
//! A tensor is viewed as `[outer, len, inner]` around the scanned axis, so any axis of any
//! rank works without a transpose. Backends run these as real parallel scans (the wgpu one is
//! a three-phase, work-efficient scan across workgroups), not as one loop per channel.

use super::{dispatch, expect_dtype};
use crate::backend::{OpSpec, ScanOp};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// `(outer, len, inner)` of `x` around `axis`, or an error naming `op`.
fn view(op: &'static str, x: &Tensor, axis: usize) -> Result<(usize, usize, usize)> {
    let dims = x.dims();
    if axis >= dims.len() {
        return Err(Error::invalid(
            op,
            format!(
                "axis {axis} is out of range for a tensor of rank {} ({})",
                dims.len(),
                x.shape()
            ),
        ));
    }
    Ok((
        dims[..axis].iter().product(),
        dims[axis],
        dims[axis + 1..].iter().product(),
    ))
}

/// The shape of `x` without `axis`: the shape of a scan's initial state.
fn state_shape(x: &Tensor, axis: usize) -> Shape {
    let mut dims = x.dims().to_vec();
    dims.remove(axis);
    Shape::from(dims)
}

fn expect_same_shape(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::shape(
            op,
            "the operands must have the same shape",
            &[a.shape(), b.shape()],
        ));
    }
    Ok(())
}

fn expect_state(op: &'static str, x: &Tensor, h0: &Tensor, axis: usize) -> Result<()> {
    let want = state_shape(x, axis);
    if *h0.shape() != want {
        return Err(Error::shape(
            op,
            format!("the initial state must have the shape of `a` without axis {axis}, {want}"),
            &[x.shape(), h0.shape()],
        ));
    }
    Ok(())
}

/// `h_t = a_t · h_{t−1} + b_t` along `axis`, with `h_{−1} = h0` (shaped like `a` without
/// `axis`): the recurrence of linear RNNs and state-space models. Returns every `h_t`.
///
/// Backends run it as a parallel scan over spans of steps; with infinite inputs that may give
/// NaN where the sequential recurrence gives ±∞ (see [`ScanOp::Linear`]).
pub fn linear_scan(a: &Tensor, b: &Tensor, h0: &Tensor, axis: usize) -> Result<Tensor> {
    const OP: &str = "linear_scan";
    for (name, t) in [("a", a), ("b", b), ("h0", h0)] {
        expect_dtype(OP, name, t, DType::F32)?;
    }
    expect_same_shape(OP, a, b)?;
    let (outer, len, inner) = view(OP, a, axis)?;
    expect_state(OP, a, h0, axis)?;
    let spec = OpSpec::Scan {
        op: ScanOp::Linear,
        outer,
        len,
        inner,
    };
    dispatch(OP, spec, &[a, b, h0], a.shape().clone(), DType::F32, None)
}

/// `exp(cumsum(ln a))` along `axis`: a cumulative product that cannot overflow its
/// intermediate sums (a negative `a` gives NaN from there on, a zero gives 0).
pub fn log_cumprod(a: &Tensor, axis: usize) -> Result<Tensor> {
    unary_scan("log_cumprod", ScanOp::LogCumprod, a, axis)
}

/// `ln(cumsum(exp(x)))` along `axis`, computed stably (a running maximum), as the
/// normaliser of log-space recurrences.
pub fn logcumsumexp(x: &Tensor, axis: usize) -> Result<Tensor> {
    unary_scan("logcumsumexp", ScanOp::LogCumSumExp, x, axis)
}

fn unary_scan(op: &'static str, scan: ScanOp, x: &Tensor, axis: usize) -> Result<Tensor> {
    expect_dtype(op, "x", x, DType::F32)?;
    let (outer, len, inner) = view(op, x, axis)?;
    let spec = OpSpec::Scan {
        op: scan,
        outer,
        len,
        inner,
    };
    dispatch(op, spec, &[x], x.shape().clone(), DType::F32, None)
}

/// Gradients of [`linear_scan`]: given its inputs `a`, `h0`, its output `h` and the gradient
/// of a loss with respect to `h`, returns `(grad_a, grad_b, grad_h0)`.
///
/// With `g_t = grad_h_t + a_{t+1} · g_{t+1}` (a reverse scan, itself parallel):
/// `grad_b = g`, `grad_a_t = g_t · h_{t−1}` (`h_{−1} = h0`), `grad_h0 = a_0 · g_0`.
pub fn linear_scan_backward(
    a: &Tensor,
    h0: &Tensor,
    h: &Tensor,
    grad_h: &Tensor,
    axis: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "linear_scan_backward";
    for (name, t) in [("a", a), ("h0", h0), ("h", h), ("grad_h", grad_h)] {
        expect_dtype(OP, name, t, DType::F32)?;
    }
    expect_same_shape(OP, a, h)?;
    expect_same_shape(OP, a, grad_h)?;
    let (outer, len, inner) = view(OP, a, axis)?;
    expect_state(OP, a, h0, axis)?;
    let g = dispatch(
        OP,
        OpSpec::Scan {
            op: ScanOp::LinearAdjoint,
            outer,
            len,
            inner,
        },
        &[a, grad_h],
        a.shape().clone(),
        DType::F32,
        None,
    )?;
    let grad_a = dispatch(
        OP,
        OpSpec::ScanGradA { outer, len, inner },
        &[&g, h, h0],
        a.shape().clone(),
        DType::F32,
        None,
    )?;
    let grad_h0 = if len == 0 {
        Tensor::zeros(a.device(), h0.shape().clone())?
    } else {
        dispatch(
            OP,
            OpSpec::ScanGradInit { outer, len, inner },
            &[a, &g],
            h0.shape().clone(),
            DType::F32,
            None,
        )?
    };
    Ok((grad_a, g, grad_h0))
}
