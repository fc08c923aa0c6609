//! Quantized and f16 data: converting to and from f32, products with packed weights, and the
//! exact integer core of ternary layers. Byte layouts are in [`crate::quant`].

use super::{dispatch, expect_dtype, expect_min_rank};
use crate::backend::{Activations, OpSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant;
use crate::shape::Shape;
use crate::tensor::{expect_storage_len, Tensor};

/// Rounds an f32 tensor to `format` (`F16` or a block format such as `Q8_0`, `Q4_0`,
/// `Q4_1`, `Q5_0`, `Q5_1`, `TQ1_0`, `TQ2_0`, `TernaryPlanes`), bit for bit as GGUF's reference
/// quantizers do. Block formats need a last dimension that is a multiple of the block length
/// (32 or 256). The K-quants and the `IQ4` formats are read, not written: no quantizer.
pub fn quantize(x: &Tensor, format: DType) -> Result<Tensor> {
    expect_dtype("quantize", "x", x, DType::F32)?;
    if !quant::can_quantize(format) {
        return Err(Error::invalid(
            "quantize",
            format!(
                "cannot quantize to {format}; the targets are {}",
                quant::quantize_targets()
            ),
        ));
    }
    expect_min_rank("quantize", x, 1)?;
    expect_storage_len("quantize", format, x.shape())?;
    let spec = OpSpec::Quantize {
        format,
        rows: x.shape().rows(),
        cols: x.shape().last_dim(),
    };
    dispatch("quantize", spec, &[x], x.shape().clone(), format, None)
}

/// Expands an `F16`, `BF16` or block-format tensor to f32 (exactly: every stored value is an
/// f32).
pub fn dequantize(x: &Tensor) -> Result<Tensor> {
    let format = x.dtype();
    if !quant::is_weight_format(format) {
        return Err(Error::invalid(
            "dequantize",
            format!("{format} is not f16, bf16 or a block format"),
        ));
    }
    expect_min_rank("dequantize", x, 1)?;
    let spec = OpSpec::Dequantize {
        format,
        rows: x.shape().rows(),
        cols: x.shape().last_dim(),
    };
    dispatch(
        "dequantize",
        spec,
        &[x],
        x.shape().clone(),
        DType::F32,
        None,
    )
}

/// `a · wᵀ` for activations `a` `[..., k]` and a packed weight `w` `[n, k]` (`F16`, `BF16` or a block
/// format, as GGUF stores a linear layer): output f32 `[..., n]`. `activations` chooses how
/// `a` enters the product (see [`Activations`]): f32 or f16 as they are, or rounded to
/// `Q8_0` blocks, to per-row int8 or to `Q8_K` super-blocks first, which lets integer dot
/// products run (llama.cpp's and BitNet's way) at the cost of that rounding. The weight is read packed on every backend.
pub fn qmatmul_t(a: &Tensor, w: &Tensor, activations: Activations) -> Result<Tensor> {
    const OP: &str = "qmatmul_t";
    let format = w.dtype();
    if !quant::is_weight_format(format) {
        return Err(Error::invalid(
            OP,
            format!(
                "the weight must be f16, bf16 or a block format, not {format}; use matmul_t for f32"
            ),
        ));
    }
    let a_dtype = if activations == Activations::F16 {
        DType::F16
    } else {
        DType::F32
    };
    expect_dtype(OP, "a", a, a_dtype)?;
    expect_min_rank(OP, a, 1)?;
    if w.shape().rank() != 2 {
        return Err(Error::shape(
            OP,
            "the weight must be one [n, k] matrix",
            &[a.shape(), w.shape()],
        ));
    }
    let (n, k) = (w.dims()[0], w.dims()[1]);
    if a.shape().last_dim() != k {
        return Err(Error::shape(
            OP,
            format!(
                "the last axes of `a` and `w` must match (k = {} vs {k})",
                a.shape().last_dim()
            ),
            &[a.shape(), w.shape()],
        ));
    }
    if matches!(activations, Activations::Q8_0 | Activations::I8) && !int_weights(format) {
        return Err(Error::invalid(
            OP,
            format!(
                "int8 activations need weights of int8 values times block scales (q8_0, \
                 q4_0, q4_1, q5_0, q5_1, iq4_nl or ternary); {format} weights take f32 or \
                 (the K-quants) q8_k activations"
            ),
        ));
    }
    if activations == Activations::Q8_K && !quant::kquants::is_super_block(format) {
        return Err(Error::invalid(
            OP,
            format!("q8_k activations go with the K-quants and iq4_xs, not {format} weights"),
        ));
    }
    let mut out_dims = a.dims()[..a.shape().rank() - 1].to_vec();
    out_dims.push(n);
    let out_shape = Shape::from(out_dims);
    if k == 0 {
        return Tensor::zeros(a.device(), out_shape);
    }
    let spec = OpSpec::QMatmul {
        format,
        activations,
        m: a.shape().rows(),
        n,
        k,
    };
    dispatch(OP, spec, &[a, w], out_shape, DType::F32, None)
}

/// Whether products with `format` weights may take int8 activations: its blocks are int8
/// values with one scale (and minimum) per 32 ([`quant::has_block_ints`],
/// [`quant::has_offset_ints`]) or ternary.
pub(crate) fn int_weights(format: DType) -> bool {
    quant::has_block_ints(format) || quant::has_offset_ints(format) || format.is_ternary()
}

/// The exact integer dot products of ternary weights `w` `[n, k]` (`TQ1_0`, `TQ2_0` or
/// `TernaryPlanes`) with int8 activations `x` `[..., k]`: i32 `[..., n]`,
/// `Σ trit(w) · x`, block scales not applied. Multiply by the scales yourself, or use
/// [`qmatmul_t`] with [`Activations::I8`] for the whole scaled layer.
pub fn ternary_dot(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    const OP: &str = "ternary_dot";
    if !w.dtype().is_ternary() {
        return Err(Error::invalid(
            OP,
            format!(
                "`w` must be tq1_0, tq2_0 or ternary_planes, not {}",
                w.dtype()
            ),
        ));
    }
    expect_dtype(OP, "x", x, DType::I8)?;
    expect_min_rank(OP, x, 1)?;
    if w.shape().rank() != 2 || w.dims()[1] != x.shape().last_dim() {
        return Err(Error::shape(
            OP,
            "`w` must be [n, k] with k the last axis of `x`",
            &[w.shape(), x.shape()],
        ));
    }
    let (n, k) = (w.dims()[0], w.dims()[1]);
    let mut out_dims = x.dims()[..x.shape().rank() - 1].to_vec();
    out_dims.push(n);
    let out_shape = Shape::from(out_dims);
    if k == 0 {
        return Tensor::from_vec(x.device(), vec![0i32; out_shape.numel()], out_shape);
    }
    let spec = OpSpec::TernaryDot {
        format: w.dtype(),
        m: x.shape().rows(),
        n,
        k,
    };
    dispatch(OP, spec, &[w, x], out_shape, DType::I32, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    /// bf16 weights kept as stored: on the cpu backend their product and dequantization equal
    /// the reference backend's on the same values widened to f32 (the GPU backends' are
    /// conformance rows: `group_decoded_products`).
    #[test]
    fn bf16_weights_multiply_as_their_widened_values() {
        let (m, n, k) = (3, 5, 64);
        let values: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        // bfloat16 keeps an f32's high half: truncate, then the widened values are exact.
        let bits: Vec<u16> = values.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let widened: Vec<f32> = bits.iter().map(|&b| quant::bf16_value(b)).collect();
        assert!(
            widened.iter().zip(&values).any(|(w, v)| w != v),
            "the rounding shows"
        );
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
            .collect();

        let cpu = Device::cpu();
        let w = Tensor::from_bytes(&cpu, DType::BF16, bytes.clone(), [n, k]).unwrap();
        let a = Tensor::from_slice(&cpu, &x, [m, k]).unwrap();
        let got = crate::ops::matmul_t(&a, &w)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(dequantize(&w).unwrap().to_vec::<f32>().unwrap(), widened);

        let reference = Device::reference();
        let w32 = Tensor::from_slice(&reference, &widened, [n, k]).unwrap();
        let a32 = Tensor::from_slice(&reference, &x, [m, k]).unwrap();
        let want = crate::ops::matmul_t(&a32, &w32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }
}
