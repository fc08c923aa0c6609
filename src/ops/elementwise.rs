//! Elementwise ops: add, mul, scale, silu, gelu (tanh and erf), swiglu.

use super::{dispatch, expect_dtype, expect_finite};
use crate::backend::{BinaryOp, OpSpec, UnaryOp};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn unary(name: &'static str, x: &Tensor, op: UnaryOp) -> Result<Tensor> {
    expect_dtype(name, "x", x, DType::F32)?;
    let spec = OpSpec::Unary {
        op,
        len: x.shape().numel(),
    };
    dispatch(name, spec, &[x], x.shape().clone(), DType::F32, None)
}

/// `b` must have `a`'s shape or a suffix of it (`[4096]` against `[seq, 4096]`); it repeats
/// along the leading axes.
fn binary(name: &'static str, a: &Tensor, b: &Tensor, op: BinaryOp) -> Result<Tensor> {
    expect_dtype(name, "a", a, DType::F32)?;
    expect_dtype(name, "b", b, DType::F32)?;
    let (ad, bd) = (a.dims(), b.dims());
    if bd.len() > ad.len() || ad[ad.len() - bd.len()..] != *bd {
        return Err(Error::shape(
            name,
            "`b` must have the shape of `a` or of its trailing axes",
            &[a.shape(), b.shape()],
        ));
    }
    let (len, rhs_len) = (a.shape().numel(), b.shape().numel());
    if rhs_len == 0 && len != 0 {
        return Err(Error::shape(
            name,
            "`b` is empty but `a` is not",
            &[a.shape(), b.shape()],
        ));
    }
    dispatch(
        name,
        OpSpec::Binary { op, len, rhs_len },
        &[a, b],
        a.shape().clone(),
        DType::F32,
        None,
    )
}

/// `a + b`, with `b` repeated along `a`'s leading axes when it has only its trailing ones.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary("add", a, b, BinaryOp::Add)
}

/// `a · b` elementwise, with `b` repeated along `a`'s leading axes when it has only its
/// trailing ones.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary("mul", a, b, BinaryOp::Mul)
}

/// `silu(a) · b`: the gated activation of a Llama feed-forward block.
pub fn swiglu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary("swiglu", a, b, BinaryOp::SwiGlu)
}

/// `x · factor`.
pub fn scale(x: &Tensor, factor: f32) -> Result<Tensor> {
    expect_finite("scale", "factor", factor)?;
    unary("scale", x, UnaryOp::Scale(factor))
}

/// Soft-capping at `cap`: `cap · tanh(x / cap)`, every value within ±cap (Gemma 2's
/// attention scores and final logits). `cap` must be finite and not 0.
pub fn softcap(x: &Tensor, cap: f32) -> Result<Tensor> {
    expect_finite("softcap", "cap", cap)?;
    if cap == 0.0 {
        return Err(crate::error::Error::invalid(
            "softcap",
            "a cap of 0 divides by zero; give the cap the model's config names",
        ));
    }
    unary("softcap", x, UnaryOp::Softcap(cap))
}

/// SiLU (swish): `x · sigmoid(x)`.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    unary("silu", x, UnaryOp::Silu)
}

/// GELU, tanh approximation (GPT-2, `gelu_pytorch_tanh`).
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    unary("gelu", x, UnaryOp::GeluTanh)
}

/// GELU, exact: `0.5·x·(1 + erf(x/√2))`.
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    unary("gelu_erf", x, UnaryOp::GeluErf)
}

/// The logistic sigmoid `1 / (1 + e^(−x))`, each value in `[0, 1]` (gates, scores).
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    unary("sigmoid", x, UnaryOp::Sigmoid)
}
