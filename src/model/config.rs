//! [`LlamaConfig`]: the hyper-parameters of a Llama-family decoder, read from a Hugging Face
//! `config.json` or from GGUF metadata, and checked before any weight is touched.

use serde::Deserialize;

use crate::error::{Error, Result};

/// The shape and numerics of a Llama-family model (Llama 2/3, TinyLlama, SmolLM, Qwen2-style
/// grouped-query attention).
#[derive(Clone, Debug, PartialEq, Deserialize, serde::Serialize)]
pub struct LlamaConfig {
    /// Tokens in the vocabulary (rows of the embedding).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the feed-forward block.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than the query heads).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Width of one head; `hidden_size / num_attention_heads` when absent.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Longest sequence the model was trained for.
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    /// Epsilon of the RMS norms.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    /// Activation of the feed-forward gate; only `silu` is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Base of the rotary frequencies.
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    /// Whether the q/k/v projections have biases (Qwen2 style).
    #[serde(default)]
    pub attention_bias: bool,
    /// Whether the output projection reuses the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence token.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token.
    #[serde(default, deserialize_with = "first_id")]
    pub eos_token_id: Option<u32>,
}

fn default_max_positions() -> usize {
    2048
}
fn default_eps() -> f32 {
    1e-6
}
fn default_act() -> String {
    "silu".into()
}
fn default_theta() -> f32 {
    10_000.0
}

/// `eos_token_id` is a number or (Llama 3) a list of them; the first is the one used.
fn first_id<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Ids {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(match Option::<Ids>::deserialize(d)? {
        Some(Ids::One(id)) => Some(id),
        Some(Ids::Many(ids)) => ids.first().copied(),
        None => None,
    })
}

impl LlamaConfig {
    /// Parses a Hugging Face `config.json`; `source` names the file in errors.
    pub fn from_json(text: &str, source: &str) -> Result<LlamaConfig> {
        let config: LlamaConfig = serde_json::from_str(text).map_err(|e| Error::Config {
            source_name: source.to_string(),
            reason: format!("not a Llama config.json: {e}"),
        })?;
        config.validate(source)?;
        Ok(config)
    }

    /// Key/value heads (the query heads when the config does not say).
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Width of the keys (and values) of one token: `kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads() * self.head_dim()
    }

    /// Width of the queries of one token: `heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim()
    }

    /// Rejects a config the engine cannot run, naming the field; `source` names the file.
    pub fn validate(&self, source: &str) -> Result<()> {
        let fail = |field: &str, why: String| {
            Err(Error::Config {
                source_name: source.to_string(),
                reason: format!("`{field}` {why}"),
            })
        };
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return fail(field, "must be at least 1".into());
            }
        }
        let kv = self.kv_heads();
        if kv == 0 || !self.num_attention_heads.is_multiple_of(kv) {
            return fail(
                "num_key_value_heads",
                format!(
                    "= {kv} must divide num_attention_heads = {}",
                    self.num_attention_heads
                ),
            );
        }
        let hd = self.head_dim();
        if hd == 0 || !hd.is_multiple_of(2) {
            return fail(
                "head_dim",
                format!("= {hd} must be even and at least 2 (rotary pairs)"),
            );
        }
        // Products of sizes from a file must not wrap: a wrapped q_dim of 0 would accept
        // empty weight tensors. Each is a tensor's element count, so it must fit in memory.
        for (field, a, b) in [
            (
                "num_attention_heads · head_dim",
                self.num_attention_heads,
                hd,
            ),
            ("num_key_value_heads · head_dim", kv, hd),
            (
                "vocab_size · hidden_size",
                self.vocab_size,
                self.hidden_size,
            ),
            (
                "intermediate_size · hidden_size",
                self.intermediate_size,
                self.hidden_size,
            ),
        ] {
            if a.checked_mul(b).is_none_or(|n| n > isize::MAX as usize / 4) {
                return fail(
                    field,
                    format!("= {a} · {b} is larger than any tensor can be"),
                );
            }
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return fail(
                "hidden_size",
                format!(
                    "= {} is not a multiple of num_attention_heads = {}; give head_dim",
                    self.hidden_size, self.num_attention_heads
                ),
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return fail(
                "rms_norm_eps",
                format!("= {} must be positive", self.rms_norm_eps),
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return fail(
                "rope_theta",
                format!("= {} must be positive", self.rope_theta),
            );
        }
        if self.hidden_act != "silu" {
            return fail(
                "hidden_act",
                format!("= {:?} is not supported (only \"silu\")", self.hidden_act),
            );
        }
        for (field, id) in [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
        ] {
            if let Some(id) = id {
                if id as usize >= self.vocab_size {
                    return fail(
                        field,
                        format!("= {id} is not below vocab_size = {}", self.vocab_size),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"{"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "eos_token_id": [7, 8]}"#;

    #[test]
    fn reads_a_hugging_face_config() {
        let c = LlamaConfig::from_json(TINY, "config.json").unwrap();
        assert_eq!((c.head_dim(), c.kv_dim(), c.q_dim()), (16, 32, 64));
        assert_eq!(c.eos_token_id, Some(7));
        assert_eq!(c.rope_theta, 10_000.0);
    }

    #[test]
    fn names_the_inconsistent_field() {
        let bad = TINY.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
        let err = LlamaConfig::from_json(&bad, "config.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("num_key_value_heads"), "{err}");
        let bad = TINY.replace("\"hidden_size\": 64", "\"hidden_size\": 66");
        let err = LlamaConfig::from_json(&bad, "config.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("hidden_size"), "{err}");
    }
}
