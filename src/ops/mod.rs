//! The ops: argument checks, then dispatch to a backend.
//!
//! Each op family lives in its own file. An op checks its inputs' shapes and dtypes, returns a
//! typed [`Error`](crate::Error) when they do not fit, describes the work as an
//! [`OpSpec`](crate::backend::OpSpec) and hands it to [`dispatch`], which picks the backend
//! (the device's primary, or a fallback), moves inputs there if needed, and wraps the output.

mod elementwise;
mod embedding;
mod fused;
mod layout;
mod matmul;
mod norm;
mod quant;
mod reduce;
mod rope;
mod sample;
mod scan;
mod scatter;
mod softmax;

pub use elementwise::{add, gelu, gelu_erf, mul, scale, sigmoid, silu, softcap, swiglu};
pub use embedding::embedding;
pub use fused::{
    folds_rms_norm_linears, linear_residual, linears_of_normed, paged_attention,
    rms_norm_linear_into, rms_norm_linears, rms_norm_linears_into, rms_norm_swiglu_linear,
    swiglu_linear, NormProduct, RmsNormParams, Rotary,
};
pub use layout::{concat, narrow, permute, transpose};
pub use matmul::{matmul, matmul_t};
pub use norm::{layer_norm, rms_norm};
pub use quant::{dequantize, qmatmul_t, quantize, ternary_dot};
pub use reduce::argmax;
pub use rope::{rope, rope_inv_freq};
pub use sample::sample;
pub use scan::{linear_scan, linear_scan_backward, log_cumprod, logcumsumexp};
pub use scatter::scatter_rows;
pub use softmax::{softmax, softmax_causal};

pub use crate::backend::{Activations, RopeLayout, SampleParams};

use crate::backend::OpSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Runs `spec` on `inputs` and returns a tensor of `shape` and `dtype`.
///
/// Every input must belong to the same device. The op runs on the first backend of the device's
/// chain that supports it; inputs are moved there when they live elsewhere. An output with no
/// elements is produced without running anything.
pub(crate) fn dispatch(
    op_name: &'static str,
    spec: OpSpec,
    inputs: &[&Tensor],
    shape: Shape,
    dtype: DType,
    index_bound: Option<u32>,
) -> Result<Tensor> {
    let device = inputs[0].device();
    expect_same_device(op_name, device, &inputs[1..])?;
    check_inputs(&spec, inputs)?;
    let backend = device.backend_for(spec.kind(), inputs[0].dtype()).clone();
    let moved = inputs
        .iter()
        .map(|t| t.to_backend(&backend))
        .collect::<Result<Vec<_>>>()?;
    let storage = if shape.numel() == 0 {
        backend.upload(crate::backend::HostData::empty(dtype))?
    } else {
        let storages: Vec<_> = moved.iter().map(|t| t.storage()).collect();
        backend.execute(&spec, &storages)?
    };
    Ok(Tensor::from_parts(
        storage,
        shape,
        dtype,
        backend,
        device.clone(),
        index_bound,
    ))
}

/// Runs the in-place `spec` on `targets` (as many as [`OpSpec::targets`], on the backend that
/// holds the first) reading `inputs`. When another tensor shares a target's memory, that
/// target is copied first, so the write changes `targets` only.
pub(crate) fn dispatch_in_place(
    op_name: &'static str,
    spec: OpSpec,
    targets: &mut [&mut Tensor],
    inputs: &[&Tensor],
) -> Result<()> {
    let Some(first) = targets.first() else {
        return Err(Error::invalid(op_name, "an in-place op needs a target"));
    };
    let (device, backend) = (first.device().clone(), first.backend().clone());
    if targets.len() != spec.targets() {
        return Err(Error::invalid(
            op_name,
            format!("writes {} targets, got {}", spec.targets(), targets.len()),
        ));
    }
    let others: Vec<&Tensor> = targets[1..].iter().map(|t| &**t).collect();
    expect_same_device(op_name, &device, &others)?;
    if others.iter().any(|t| t.backend().kind() != backend.kind()) {
        return Err(Error::invalid(
            op_name,
            "its targets live on different backends of the device",
        ));
    }
    expect_same_device(op_name, &device, inputs)?;
    check_inputs(&spec, inputs)?;
    let moved = inputs
        .iter()
        .map(|t| t.to_backend(&backend))
        .collect::<Result<Vec<_>>>()?;
    let storages: Vec<_> = moved.iter().map(|t| t.storage()).collect();
    let mut written = targets
        .iter_mut()
        .map(|t| t.storage_for_write())
        .collect::<Result<Vec<_>>>()?;
    backend.write_into(&spec, &mut written, &storages)
}

/// Fails unless the tensors are the inputs `spec` reads ([`OpSpec::inputs`]): checked here
/// once, so no backend checks dtypes or lengths again.
fn check_inputs(spec: &OpSpec, inputs: &[&Tensor]) -> Result<()> {
    let found: Vec<_> = inputs
        .iter()
        .map(|t| (t.dtype(), t.shape().numel()))
        .collect();
    spec.check_inputs(&found)
}

/// Fails unless every tensor of `others` lives on `device`.
fn expect_same_device(op: &'static str, device: &crate::Device, others: &[&Tensor]) -> Result<()> {
    match others.iter().find(|t| !t.device().same(device)) {
        Some(t) => Err(Error::DeviceMismatch {
            op,
            first: format!("{:?}", device),
            second: format!("{:?}", t.device()),
        }),
        None => Ok(()),
    }
}

/// Fails unless `t` has dtype `expected`.
pub(crate) fn expect_dtype(
    op: &'static str,
    argument: &'static str,
    t: &Tensor,
    expected: DType,
) -> Result<()> {
    if t.dtype() != expected {
        return Err(Error::DTypeMismatch {
            op,
            argument,
            expected,
            got: t.dtype(),
        });
    }
    Ok(())
}

/// Fails unless `t` has at least `rank` dimensions.
pub(crate) fn expect_min_rank(op: &'static str, t: &Tensor, rank: usize) -> Result<()> {
    if t.shape().rank() < rank {
        return Err(Error::shape(
            op,
            format!("needs a tensor of rank ≥ {rank}"),
            &[t.shape()],
        ));
    }
    Ok(())
}

/// Fails unless `v` is finite: epsilons, scales and thetas must be real numbers.
pub(crate) fn expect_finite(op: &'static str, name: &str, v: f32) -> Result<()> {
    if !v.is_finite() {
        return Err(Error::invalid(
            op,
            format!("`{name}` must be finite, got {v}"),
        ));
    }
    Ok(())
}
