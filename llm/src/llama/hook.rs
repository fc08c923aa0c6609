//! Debug hooks: the intermediate tensors of a forward pass a caller can look at.

use webtensor::error::{Error, Result};
use webtensor::tensor::Tensor;

/// A debug hook: called with (point, layer index, tensor) for the hooked intermediates.
pub type Hook = Box<dyn Fn(HookPoint, usize, &Tensor) + Send + Sync>;

/// The intermediate tensors a [`Hook`] can see. Per layer: [`HookPoint::AttnNorm`], `Q`, `K`,
/// `V` (after rotary embedding, `[t, heads, head_dim]`), `Attention` (before the output
/// projection), `AttnOut`, `FfnNorm`, `FfnOut`, `Residual` (the layer's output). Once per
/// pass, with layer index 0: `Embedding`, `FinalNorm`, `Logits`. On a model split over
/// several devices, `AttnNorm`, `Q`, `K`, `V`, `Attention` and `FfnNorm` are rank 0's (its
/// heads); the others are whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookPoint {
    /// The token embeddings.
    Embedding,
    /// The attention block's normalized input.
    AttnNorm,
    /// Rotated queries.
    Q,
    /// Rotated keys.
    K,
    /// Values.
    V,
    /// Attention output before the output projection.
    Attention,
    /// After the output projection (summed over the ranks).
    AttnOut,
    /// The FFN block's normalized input.
    FfnNorm,
    /// The FFN output (summed over the ranks).
    FfnOut,
    /// The layer's output.
    Residual,
    /// The final norm's output.
    FinalNorm,
    /// The logits.
    Logits,
}

impl HookPoint {
    /// Every point, in forward order.
    pub const ALL: [HookPoint; 12] = [
        HookPoint::Embedding,
        HookPoint::AttnNorm,
        HookPoint::Q,
        HookPoint::K,
        HookPoint::V,
        HookPoint::Attention,
        HookPoint::AttnOut,
        HookPoint::FfnNorm,
        HookPoint::FfnOut,
        HookPoint::Residual,
        HookPoint::FinalNorm,
        HookPoint::Logits,
    ];

    /// The point's name (`attn_norm`, `q`, ...), as [`HookPoint::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            HookPoint::Embedding => "embedding",
            HookPoint::AttnNorm => "attn_norm",
            HookPoint::Q => "q",
            HookPoint::K => "k",
            HookPoint::V => "v",
            HookPoint::Attention => "attention",
            HookPoint::AttnOut => "attn_out",
            HookPoint::FfnNorm => "ffn_norm",
            HookPoint::FfnOut => "ffn_out",
            HookPoint::Residual => "residual",
            HookPoint::FinalNorm => "final_norm",
            HookPoint::Logits => "logits",
        }
    }

    /// The point of that name; the error lists the names.
    pub fn parse(name: &str) -> Result<HookPoint> {
        HookPoint::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = HookPoint::ALL.iter().map(|p| p.name()).collect();
                Error::invalid(
                    "set_hook",
                    format!(
                        "no hook point `{name}`; the points are {}",
                        names.join(", ")
                    ),
                )
            })
    }
}
