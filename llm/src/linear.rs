//! How the engine's linear layers multiply: which [`Activations`] a product with a weight of
//! a given dtype uses, under the model's [`ActivationMode`].
//!
//! llama.cpp rounds the activations of a product with block-quantized weights to `Q8_0`
//! blocks and runs integer dot products; BitNet rounds them to int8 with one scale per row
//! for ternary weights. That is the default here too ([`ActivationMode::Integer`]): on a CPU
//! the integer products read the packed weights several times faster than f32 activations
//! against decoded weights. [`ActivationMode::F32`] keeps the activations as they are (the
//! exact product of the stored weights), for comparison.
//!
//! The K-quants and `IQ4_XS` take `Q8_K` activations (256 values and an f32 scale), as in
//! llama.cpp; `Q4_1`/`Q5_1` take `Q8_0` ones, whose values are llama.cpp's `Q8_1` (which also
//! stores each block's sum, rounded to f16; here the sum is exact).

use std::fmt;

use webtensor::backend::Activations;
use webtensor::dtype::DType;
use webtensor::error::{Error, Result};
use webtensor::ops;
use webtensor::quant;
use webtensor::tensor::Tensor;

/// How a model's linear layers treat their activations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationMode {
    /// `Q8_0` activations for the 32-value formats (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`,
    /// `IQ4_NL`), `Q8_K` for the K-quants and `IQ4_XS`, per-row int8 for ternary weights
    /// (llama.cpp's and BitNet's choices); f32 for f32 and f16 weights.
    #[default]
    Integer,
    /// f32 activations for every weight.
    F32,
}

impl ActivationMode {
    /// Parses `int` or `f32` (a command-line value).
    pub fn parse(value: &str) -> Result<ActivationMode> {
        match value {
            "int" | "integer" => Ok(ActivationMode::Integer),
            "f32" => Ok(ActivationMode::F32),
            other => Err(Error::invalid(
                "activations",
                format!("`{other}` is not an activation mode; use `int` or `f32`"),
            )),
        }
    }

    /// The activations a product with a `weight`-dtype matrix uses in this mode.
    pub fn for_weight(self, weight: DType) -> Activations {
        match (self, weight) {
            (ActivationMode::Integer, w)
                if quant::has_block_ints(w) || quant::has_offset_ints(w) =>
            {
                Activations::Q8_0
            }
            (ActivationMode::Integer, w) if quant::kquants::is_super_block(w) => Activations::Q8_K,
            (ActivationMode::Integer, w) if w.is_ternary() => Activations::I8,
            _ => Activations::F32,
        }
    }

    /// One line naming the path each weight dtype of `weights` takes, e.g.
    /// `q4_0 weights × q8_0 activations`: the same on every backend, whose kernels all take
    /// llama.cpp's rounding for its formats (wgpu's group-decoded ones too).
    pub fn describe(self, weights: impl IntoIterator<Item = DType>) -> String {
        let mut dtypes: Vec<DType> = Vec::new();
        for d in weights {
            if !dtypes.contains(&d) {
                dtypes.push(d);
            }
        }
        let parts: Vec<String> = dtypes
            .iter()
            .map(|&d| {
                let act = match self.for_weight(d) {
                    Activations::Q8_0 => "q8_0",
                    Activations::Q8_K => "q8_k",
                    Activations::I8 => "per-row i8",
                    Activations::F16 => "f16",
                    Activations::F32 => "f32",
                };
                format!("{d} weights × {act} activations")
            })
            .collect();
        parts.join(", ")
    }
}

impl fmt::Display for ActivationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ActivationMode::Integer => "int",
            ActivationMode::F32 => "f32",
        })
    }
}

/// `x · wᵀ` for a linear layer's weight `w` `[n, k]` in its stored dtype, with the
/// activations `mode` picks for that dtype.
pub fn linear(x: &Tensor, w: &Tensor, mode: ActivationMode) -> Result<Tensor> {
    match mode.for_weight(w.dtype()) {
        Activations::F32 => ops::matmul_t(x, w),
        act => ops::qmatmul_t(x, w, act),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_mode_quantizes_only_block_weights() {
        let int = ActivationMode::Integer;
        assert_eq!(int.for_weight(DType::Q4_0), Activations::Q8_0);
        assert_eq!(int.for_weight(DType::Q8_0), Activations::Q8_0);
        assert_eq!(int.for_weight(DType::TQ2_0), Activations::I8);
        assert_eq!(int.for_weight(DType::F16), Activations::F32);
        assert_eq!(int.for_weight(DType::F32), Activations::F32);
        assert_eq!(int.for_weight(DType::Q5_0), Activations::Q8_0);
        assert_eq!(int.for_weight(DType::IQ4_NL), Activations::Q8_0);
        assert_eq!(int.for_weight(DType::Q4_K), Activations::Q8_K);
        assert_eq!(int.for_weight(DType::Q6_K), Activations::Q8_K);
        assert_eq!(int.for_weight(DType::IQ4_XS), Activations::Q8_K);
        assert_eq!(int.for_weight(DType::Q4_1), Activations::Q8_0);
        assert_eq!(int.for_weight(DType::Q5_1), Activations::Q8_0);
        assert_eq!(
            ActivationMode::F32.for_weight(DType::Q4_0),
            Activations::F32
        );
        assert!(ActivationMode::parse("f16").is_err());
        assert_eq!(
            int.describe([DType::Q4_0, DType::Q4_0, DType::F32]),
            "q4_0 weights × q8_0 activations, f32 weights × f32 activations"
        );
    }

    #[test]
    fn the_legacy_llama_cpp_formats_take_q8_0_activations_on_every_backend() {
        // wgpu, too, now multiplies their decoded groups by `Q8_0` activations.
        assert_eq!(
            ActivationMode::Integer.describe([DType::Q4_1, DType::Q5_0, DType::Q6_K]),
            "q4_1 weights × q8_0 activations, q5_0 weights × q8_0 activations, \
             q6_k weights × q8_k activations"
        );
        assert_eq!(
            ActivationMode::Integer.describe([DType::Q5_1, DType::IQ4_NL]),
            "q5_1 weights × q8_0 activations, iq4_nl weights × q8_0 activations"
        );
        assert_eq!(
            ActivationMode::F32.describe([DType::Q4_1]),
            "q4_1 weights × f32 activations"
        );
    }
}
