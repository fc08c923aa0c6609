//! The op set as JavaScript functions over tensors (`opAdd(a, b)`, `opRmsNorm(x, w, eps)`,
//! ...). Each has the meaning documented in the library (`webtensor::ops`); bad shapes,
//! dtypes and arguments throw an `Error` with the library's message.

use wasm_bindgen::prelude::*;
use webtensor::backend::{Activations, RopeLayout};
use webtensor::{ops, DType};

use crate::error::{js, js_error};
use crate::tensor::Tensor;

fn wrap(r: webtensor::Result<webtensor::Tensor>) -> Result<Tensor, JsValue> {
    Ok(Tensor { inner: js(r)? })
}

/// `a + b`, elementwise (`b` may broadcast over `a`'s leading rows).
#[wasm_bindgen(js_name = opAdd)]
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::add(&a.inner, &b.inner))
}

/// `a · b`, elementwise (`b` may broadcast over `a`'s leading rows).
#[wasm_bindgen(js_name = opMul)]
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::mul(&a.inner, &b.inner))
}

/// `silu(a) · b`, elementwise.
#[wasm_bindgen(js_name = opSwiglu)]
pub fn swiglu(a: &Tensor, b: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::swiglu(&a.inner, &b.inner))
}

/// `x · factor`.
#[wasm_bindgen(js_name = opScale)]
pub fn scale(x: &Tensor, factor: f32) -> Result<Tensor, JsValue> {
    wrap(ops::scale(&x.inner, factor))
}

/// `x · sigmoid(x)`.
#[wasm_bindgen(js_name = opSilu)]
pub fn silu(x: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::silu(&x.inner))
}

/// GELU, tanh approximation.
#[wasm_bindgen(js_name = opGelu)]
pub fn gelu(x: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::gelu(&x.inner))
}

/// GELU with the exact erf.
#[wasm_bindgen(js_name = opGeluErf)]
pub fn gelu_erf(x: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::gelu_erf(&x.inner))
}

/// Soft-capping at `cap`: `cap · tanh(x / cap)`.
#[wasm_bindgen(js_name = opSoftcap)]
pub fn softcap(x: &Tensor, cap: f32) -> Result<Tensor, JsValue> {
    wrap(ops::softcap(&x.inner, cap))
}

/// The logistic sigmoid `1 / (1 + e^(−x))`.
#[wasm_bindgen(js_name = opSigmoid)]
pub fn sigmoid(x: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::sigmoid(&x.inner))
}

/// RMS norm of each row of `x`, times `weight` (the last dimension).
#[wasm_bindgen(js_name = opRmsNorm)]
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor, JsValue> {
    wrap(ops::rms_norm(&x.inner, &weight.inner, eps))
}

/// Layer norm of each row of `x`, times `weight` plus `bias`.
#[wasm_bindgen(js_name = opLayerNorm)]
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor, JsValue> {
    wrap(ops::layer_norm(&x.inner, &weight.inner, &bias.inner, eps))
}

/// Softmax over the last dimension.
#[wasm_bindgen(js_name = opSoftmax)]
pub fn softmax(x: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::softmax(&x.inner))
}

/// Softmax of `[.., q, k]` scores where query `i` sees keys `0..=i + (k - q)`.
#[wasm_bindgen(js_name = opSoftmaxCausal)]
pub fn softmax_causal(x: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::softmax_causal(&x.inner))
}

/// Rotary embedding of `x` `[tokens, heads, head_dim]` at u32 `positions` with the unscaled
/// frequencies of base `theta`; `layout` is `"half"` (Hugging Face) or `"interleaved"` (GGUF).
#[wasm_bindgen(js_name = opRope)]
pub fn rope(x: &Tensor, positions: &Tensor, theta: f32, layout: &str) -> Result<Tensor, JsValue> {
    let layout = match layout {
        "half" | "half_split" => RopeLayout::HalfSplit,
        "interleaved" => RopeLayout::Interleaved,
        other => {
            return Err(js_error(format!(
                "rope: layout `{other}` is neither \"half\" nor \"interleaved\""
            )))
        }
    };
    if !(theta.is_finite() && theta > 1.0) {
        return Err(js_error(format!("rope: `theta` must be > 1, got {theta}")));
    }
    let head_dim = x.inner.dims().last().copied().unwrap_or(0);
    let freqs = ops::rope_inv_freq(theta as f64, head_dim);
    let inv_freq = wrap(webtensor::Tensor::from_vec(
        x.inner.device(),
        freqs,
        [head_dim / 2],
    ))?;
    wrap(ops::rope(
        &x.inner,
        &positions.inner,
        &inv_freq.inner,
        layout,
    ))
}

/// `a · b` (batched over leading dimensions).
#[wasm_bindgen(js_name = opMatmul)]
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::matmul(&a.inner, &b.inner))
}

/// `a · bᵀ` (batched over leading dimensions).
#[wasm_bindgen(js_name = opMatmulT)]
pub fn matmul_t(a: &Tensor, b: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::matmul_t(&a.inner, &b.inner))
}

/// Rows of `table` picked by u32 `ids`.
#[wasm_bindgen(js_name = opEmbedding)]
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::embedding(&table.inner, &ids.inner))
}

/// The axes of `x` reordered by `perm`.
#[wasm_bindgen(js_name = opPermute)]
pub fn permute(x: &Tensor, perm: Vec<usize>) -> Result<Tensor, JsValue> {
    wrap(ops::permute(&x.inner, &perm))
}

/// `a` and `b` joined along `axis`.
#[wasm_bindgen(js_name = opConcat)]
pub fn concat(a: &Tensor, b: &Tensor, axis: usize) -> Result<Tensor, JsValue> {
    wrap(ops::concat(&a.inner, &b.inner, axis))
}

/// `len` entries of `x` along `axis` from `start`.
#[wasm_bindgen(js_name = opNarrow)]
pub fn narrow(x: &Tensor, axis: usize, start: usize, len: usize) -> Result<Tensor, JsValue> {
    wrap(ops::narrow(&x.inner, axis, start, len))
}

/// The index of the largest value of each row (u32).
#[wasm_bindgen(js_name = opArgmax)]
pub fn argmax(x: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::argmax(&x.inner))
}

/// `h_t = a_t · h_{t-1} + b_t` along `axis`, from `h0`.
#[wasm_bindgen(js_name = opLinearScan)]
pub fn linear_scan(a: &Tensor, b: &Tensor, h0: &Tensor, axis: usize) -> Result<Tensor, JsValue> {
    wrap(ops::linear_scan(&a.inner, &b.inner, &h0.inner, axis))
}

/// The cumulative product of `a` along `axis`, in log space.
#[wasm_bindgen(js_name = opLogCumprod)]
pub fn log_cumprod(a: &Tensor, axis: usize) -> Result<Tensor, JsValue> {
    wrap(ops::log_cumprod(&a.inner, axis))
}

/// `ln Σ_{s≤t} exp(x_s)` along `axis`.
#[wasm_bindgen(js_name = opLogcumsumexp)]
pub fn logcumsumexp(x: &Tensor, axis: usize) -> Result<Tensor, JsValue> {
    wrap(ops::logcumsumexp(&x.inner, axis))
}

/// f32 `x` packed into `format` (`"q8_0"`, `"q4_0"`, `"tq1_0"`, `"tq2_0"`, `"f16"`, ...),
/// byte for byte as GGUF's reference quantizers.
#[wasm_bindgen(js_name = opQuantize)]
pub fn quantize(x: &Tensor, format: &str) -> Result<Tensor, JsValue> {
    let dtype = DType::parse(format)
        .ok_or_else(|| js_error(format!("quantize: unknown format `{format}`")))?;
    wrap(ops::quantize(&x.inner, dtype))
}

/// Packed `x` unpacked to f32.
#[wasm_bindgen(js_name = opDequantize)]
pub fn dequantize(x: &Tensor) -> Result<Tensor, JsValue> {
    wrap(ops::dequantize(&x.inner))
}

/// Activations `a` times packed weights `w`ᵀ; `activations` is `"f32"` (exact), `"f16"` (an
/// f16 `a`, widened),
/// `"q8_0"`, `"i8"` or `"q8_k"` (activations rounded to int8 first, integer dot products).
#[wasm_bindgen(js_name = opQmatmulT)]
pub fn qmatmul_t(a: &Tensor, w: &Tensor, activations: &str) -> Result<Tensor, JsValue> {
    let activations = match activations {
        "f32" | "" => Activations::F32,
        "f16" => Activations::F16,
        "q8_0" => Activations::Q8_0,
        "i8" => Activations::I8,
        "q8_k" => Activations::Q8_K,
        other => {
            return Err(js_error(format!(
                "qmatmul_t: activations `{other}` are not \"f32\", \"f16\", \"q8_0\", \
                 \"i8\" or \"q8_k\""
            )))
        }
    };
    wrap(ops::qmatmul_t(&a.inner, &w.inner, activations))
}
