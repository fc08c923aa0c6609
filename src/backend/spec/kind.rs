//! [`OpKind`]: the op families, by name, for capability lists, fallback decisions and
//! benchmarks.

use std::fmt;

/// The op families, for capability lists, fallback decisions and benchmarks.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub enum OpKind {
    /// Elementwise add.
    Add,
    /// Elementwise multiply.
    Mul,
    /// Multiply by a scalar.
    Scale,
    /// SiLU activation.
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// GELU, exact erf form.
    GeluErf,
    /// The logistic sigmoid.
    Sigmoid,
    /// Soft-capping `cap · tanh(x / cap)`.
    Softcap,
    /// silu(a)·b.
    SwiGlu,
    /// RMS normalisation.
    RmsNorm,
    /// Layer normalisation.
    LayerNorm,
    /// Softmax over the last axis.
    Softmax,
    /// Rotary position embedding.
    Rope,
    /// Matrix product.
    Matmul,
    /// Embedding gather.
    Embedding,
    /// Transpose / permute into a contiguous copy.
    Permute,
    /// Argmax over the last axis.
    Argmax,
    /// f32 to f16 or a block format.
    Quantize,
    /// f16 or a block format to f32.
    Dequantize,
    /// Matrix product with f16, block-quantized or ternary weights.
    QMatmul,
    /// Exact integer dot products of ternary weights and int8 activations.
    TernaryDot,
    /// Linear recurrence scan `h_t = a_t·h_{t−1} + b_t`.
    LinearScan,
    /// Cumulative product in log space.
    LogCumprod,
    /// Cumulative log-sum-exp.
    LogCumSumExp,
    /// Gradients of the linear scan.
    ScanBackward,
    /// Concatenation along an axis.
    Concat,
    /// A slice along an axis.
    Narrow,
    /// Rows written in place at given slots (KV cache writes).
    ScatterRows,
    /// Drawing a token from logits: temperature, top-k, top-p.
    Sample,
    /// A linear layer's product of RMS-normed activations (the norm folded in).
    NormLinear,
    /// The same product written in place into rows of a KV pool.
    NormLinearInto,
    /// gate·up·SiLU of a feed-forward block as one product.
    SwigluLinear,
    /// A linear layer's product with the residual added.
    LinearResidual,
    /// Attention over a paged KV cache, read in place.
    PagedAttention,
}

impl OpKind {
    /// Every op family.
    pub const ALL: [OpKind; 34] = [
        OpKind::Add,
        OpKind::Mul,
        OpKind::Scale,
        OpKind::Silu,
        OpKind::GeluTanh,
        OpKind::GeluErf,
        OpKind::Sigmoid,
        OpKind::Softcap,
        OpKind::SwiGlu,
        OpKind::RmsNorm,
        OpKind::LayerNorm,
        OpKind::Softmax,
        OpKind::Rope,
        OpKind::Matmul,
        OpKind::Embedding,
        OpKind::Permute,
        OpKind::Argmax,
        OpKind::Quantize,
        OpKind::Dequantize,
        OpKind::QMatmul,
        OpKind::TernaryDot,
        OpKind::LinearScan,
        OpKind::LogCumprod,
        OpKind::LogCumSumExp,
        OpKind::ScanBackward,
        OpKind::Concat,
        OpKind::Narrow,
        OpKind::ScatterRows,
        OpKind::Sample,
        OpKind::NormLinear,
        OpKind::NormLinearInto,
        OpKind::SwigluLinear,
        OpKind::LinearResidual,
        OpKind::PagedAttention,
    ];

    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Add => "add",
            OpKind::Mul => "mul",
            OpKind::Scale => "scale",
            OpKind::Silu => "silu",
            OpKind::GeluTanh => "gelu_tanh",
            OpKind::GeluErf => "gelu_erf",
            OpKind::Sigmoid => "sigmoid",
            OpKind::Softcap => "softcap",
            OpKind::SwiGlu => "swiglu",
            OpKind::RmsNorm => "rms_norm",
            OpKind::LayerNorm => "layer_norm",
            OpKind::Softmax => "softmax",
            OpKind::Rope => "rope",
            OpKind::Matmul => "matmul",
            OpKind::Embedding => "embedding",
            OpKind::Permute => "permute",
            OpKind::Argmax => "argmax",
            OpKind::Quantize => "quantize",
            OpKind::Dequantize => "dequantize",
            OpKind::QMatmul => "qmatmul",
            OpKind::TernaryDot => "ternary_dot",
            OpKind::LinearScan => "linear_scan",
            OpKind::LogCumprod => "log_cumprod",
            OpKind::LogCumSumExp => "logcumsumexp",
            OpKind::ScanBackward => "scan_backward",
            OpKind::Concat => "concat",
            OpKind::Narrow => "narrow",
            OpKind::ScatterRows => "scatter_rows",
            OpKind::Sample => "sample",
            OpKind::NormLinear => "rms_norm_linear",
            OpKind::NormLinearInto => "rms_norm_linear_into",
            OpKind::SwigluLinear => "swiglu_linear",
            OpKind::LinearResidual => "linear_residual",
            OpKind::PagedAttention => "paged_attention",
        }
    }

    /// The fused decode ops: [`crate::ops`] runs each as a composition of other ops on a
    /// backend without its kernel, instead of falling back to another backend.
    pub const FUSED: [OpKind; 5] = [
        OpKind::NormLinear,
        OpKind::NormLinearInto,
        OpKind::SwigluLinear,
        OpKind::LinearResidual,
        OpKind::PagedAttention,
    ];

    /// Parses a name as printed by [`OpKind::name`].
    pub fn parse(name: &str) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
