//! [`LlamaConfig`] from a GGUF file's metadata (`{arch}.*` keys, as llama.cpp's
//! `convert_hf_to_gguf.py` writes them) and its `rope_freqs.weight` tensor.
//!
//! Like `config.json`, every `{arch}.*` key must be one the engine reads or one known not to
//! change the numbers; any other is an error naming it.

use super::arch::Architecture;
use super::gguf::{Gguf, GgufArray, GgufValue};
use super::rope::{Rope, RopeScaling};
use super::LlamaConfig;
use webtensor::error::{Error, Result};

/// `{arch}.*` keys read here, or harmless.
const KNOWN_KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "vocab_size",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scale_linear",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
    "rope.scaling.attn_factor",
    "rope.scaling.yarn_attn_factor",
    "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow",
];

/// The keys read for Gemma 2 only (refused for the other architectures, which do not cap).
const GEMMA2_KEYS: &[&str] = &["attn_logit_softcapping", "final_logit_softcapping"];

/// The keys read for Gemma 3 only: its final cap (the converter refuses an attention cap), and
/// the rope base of its sliding-window layers, which llama.cpp reads (10 000 without it).
const GEMMA3_KEYS: &[&str] = &["final_logit_softcapping", "rope.freq_base_swa"];

impl LlamaConfig {
    /// The config of a GGUF file: its metadata, and `bytes` (the file) for the
    /// `rope_freqs.weight` tensor; `name` names the file in errors.
    pub fn from_gguf(g: &Gguf, bytes: &[u8], name: &str) -> Result<LlamaConfig> {
        let arch_name = g
            .metadata
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .unwrap_or("llama")
            .to_string();
        let architecture = Architecture::from_gguf(&arch_name, name)?;
        let prefix = format!("{arch_name}.");
        let gemma2 = architecture == Architecture::Gemma2;
        let gemma3 = architecture == Architecture::Gemma3;
        let known = |rest: &str| {
            KNOWN_KEYS.contains(&rest)
                || (gemma2 && GEMMA2_KEYS.contains(&rest))
                || (gemma3 && GEMMA3_KEYS.contains(&rest))
        };
        if let Some(key) = g
            .metadata
            .keys()
            .find(|k| k.strip_prefix(&prefix).is_some_and(|rest| !known(rest)))
        {
            return Err(Error::model_file(
                name,
                format!(
                    "metadata `{key}` is not a setting webtensor implements; it may change the \
                     model's numbers, so the file is refused rather than run differently"
                ),
            ));
        }
        let get = |key: &str| g.metadata.get(&format!("{prefix}{key}"));
        let bad = |key: &str, why: &str| {
            Error::model_file(name, format!("metadata `{prefix}{key}` {why}"))
        };
        let opt_int = |key: &str| -> Result<Option<usize>> {
            get(key)
                .map(|v| {
                    let n = v
                        .as_u64()
                        .ok_or_else(|| bad(key, "is not a whole number"))?;
                    // Never truncated (a 32-bit build, a lying file).
                    usize::try_from(n).map_err(|_| bad(key, &format!("= {n} is too large")))
                })
                .transpose()
        };
        let int = |key: &str| opt_int(key)?.ok_or_else(|| bad(key, "is missing"));
        let float = |key: &str| -> Result<Option<f64>> {
            get(key)
                .map(|v| v.as_f64().ok_or_else(|| bad(key, "is not a number")))
                .transpose()
        };
        let token_id = |key: &str| -> Result<Option<u32>> {
            let full = format!("tokenizer.ggml.{key}");
            match g.metadata.get(&full).and_then(GgufValue::as_u64) {
                None => Ok(None),
                // An id beyond u32 is refused, never truncated to a smaller one.
                Some(v) => u32::try_from(v).map(Some).map_err(|_| {
                    Error::model_file(name, format!("metadata `{full}` = {v} is not a token id"))
                }),
            }
        };
        let vocab_size = match opt_int("vocab_size")? {
            Some(v) => v,
            None => g
                .metadata
                .get("tokenizer.ggml.tokens")
                .and_then(GgufValue::as_array)
                .map(GgufArray::len)
                .ok_or_else(|| {
                    Error::model_file(name, "metadata `tokenizer.ggml.tokens` is missing")
                })?,
        };
        let heads = int("attention.head_count")?;
        let hidden = int("embedding_length")?;
        let head_dim = opt_int("attention.key_length")?.or(opt_int("rope.dimension_count")?);
        let dim = head_dim.unwrap_or(hidden / heads.max(1));
        for key in [
            "attention.key_length",
            "attention.value_length",
            "rope.dimension_count",
        ] {
            if let Some(v) = opt_int(key)? {
                if v != dim {
                    return Err(bad(
                        key,
                        &format!(
                            "= {v} differs from the head width {dim}; partial rotary embedding \
                             and different key/value widths are not supported"
                        ),
                    ));
                }
            }
        }
        let layers = super::config::plausible_layers(int("block_count")?, name)?;
        let window = opt_int("attention.sliding_window")?.filter(|&w| w > 0);
        if window.is_some() && architecture == Architecture::SmolLM3 {
            return Err(bad(
                "attention.sliding_window",
                "is given: SmolLM3's sliding windows are not supported",
            ));
        }
        let max_positions = opt_int("context_length")?.unwrap_or(2048);
        // Gemma 2 alternates: even layers slide, odd ones see everything; Gemma 3 has every
        // sixth layer see everything (llama.cpp's patterns, which the converter does not write).
        let full_attention =
            |i: usize| (gemma2 && i % 2 == 1) || (gemma3 && (i + 1).is_multiple_of(6));
        let layer_windows = (0..layers)
            .map(|i| if full_attention(i) { None } else { window })
            .collect();
        // llama.cpp's Gemma 3 sliding layers rotate by their own base, unscaled.
        let local_rope = match gemma3 {
            true => Some(Rope {
                theta: float("rope.freq_base_swa")?.unwrap_or(10_000.0),
                scaling: RopeScaling::None,
            }),
            false => None,
        };
        let cap = |key: &str| -> Result<Option<f32>> { Ok(float(key)?.map(|c| c as f32)) };
        let config = LlamaConfig {
            architecture,
            vocab_size,
            hidden_size: hidden,
            intermediate_size: int("feed_forward_length")?,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: opt_int("attention.head_count_kv")?,
            head_dim,
            max_position_embeddings: max_positions,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5) as f32,
            hidden_act: match architecture.is_gemma() {
                true => "gelu_pytorch_tanh",
                false => "silu",
            }
            .into(),
            query_pre_attn_scalar: architecture
                .is_gemma()
                .then(|| gemma_query_scalar(architecture, layers, hidden, heads, dim)),
            attn_logit_softcapping: cap("attn_logit_softcapping")?,
            final_logit_softcapping: cap("final_logit_softcapping")?,
            rope: rope_of(g, bytes, &prefix, name, dim)?,
            local_rope,
            layer_windows,
            layer_rope: layer_rope(architecture, layers),
            attention_bias: g.tensors.contains_key("blk.0.attn_q.bias"),
            tie_word_embeddings: !g.tensors.contains_key("output.weight"),
            bos_token_id: token_id("bos_token_id")?,
            eos_token_id: token_id("eos_token_id")?,
            context_limit: None,
        };
        config.validate(name)?;
        Ok(config)
    }
}

/// Gemma's `query_pre_attn_scalar`, which llama.cpp's converter does not write: llama.cpp's
/// own rule, `hidden / heads` for the 27B models (Gemma 2's 46 layers, whose config says 144;
/// Gemma 3's 62, whose config says 168) and the head width otherwise (what the other sizes'
/// configs say). A GGUF file of a checkpoint whose config says something else runs as
/// llama.cpp runs it, not as transformers does.
fn gemma_query_scalar(
    architecture: Architecture,
    layers: usize,
    hidden: usize,
    heads: usize,
    head_dim: usize,
) -> f64 {
    let largest = match architecture {
        Architecture::Gemma2 => layers == 46,
        _ => layers == 62,
    };
    if largest {
        (hidden / heads.max(1)) as f64
    } else {
        head_dim as f64
    }
}

/// Whether each layer rotates q and k. The converter does not write SmolLM3's
/// `no_rope_layers`; llama.cpp runs every fourth layer without rope (transformers' default
/// `no_rope_layer_interval`), and so does the engine.
fn layer_rope(architecture: Architecture, layers: usize) -> Vec<bool> {
    let without_rope =
        |i: usize| architecture == Architecture::SmolLM3 && (i + 1).is_multiple_of(4);
    (0..layers).map(|i| !without_rope(i)).collect()
}

/// The rope settings of GGUF metadata (`{prefix}rope.*`) and the `rope_freqs.weight` tensor.
fn rope_of(g: &Gguf, bytes: &[u8], prefix: &str, name: &str, head_dim: usize) -> Result<Rope> {
    let key = |k: &str| format!("{prefix}{k}");
    let get = |k: &str| g.metadata.get(&key(k));
    let bad = |k: &str, why: &str| Error::model_file(name, format!("metadata `{}` {why}", key(k)));
    let float = |k: &str| -> Result<Option<f64>> {
        get(k)
            .map(|v| v.as_f64().ok_or_else(|| bad(k, "is not a number")))
            .transpose()
    };
    let required = |k: &str| float(k)?.ok_or_else(|| bad(k, "is missing"));
    let theta = float("rope.freq_base")?.unwrap_or(10_000.0);
    let kind = match get("rope.scaling.type") {
        None => None,
        Some(v) => Some(
            v.as_str()
                .ok_or_else(|| bad("rope.scaling.type", "is not a string"))?,
        ),
    };
    let mut scaling = match kind {
        None | Some("none") => match float("rope.scale_linear")? {
            Some(f) if f != 1.0 => RopeScaling::Linear { factor: f },
            _ => RopeScaling::None,
        },
        Some("linear") => RopeScaling::Linear {
            factor: required("rope.scaling.factor")?,
        },
        Some("yarn") => {
            let factor = required("rope.scaling.factor")?;
            let attention_factor = match float("rope.scaling.yarn_attn_factor")? {
                Some(a) => a,
                None if factor > 1.0 => 0.1 * factor.ln() + 1.0,
                None => 1.0,
            };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: required("rope.scaling.original_context_length")?,
                beta_fast: float("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: float("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                attention_factor,
                truncate: true,
            }
        }
        Some(other) => {
            return Err(bad(
                "rope.scaling.type",
                &format!("= {other:?} is not supported (none, linear and yarn are)"),
            ))
        }
    };
    // Phi-3's `longrope`: the converter writes the two factor lists as tensors and the
    // attention factor it computed.
    let factors = |tensor: &str| -> Result<Option<Vec<f32>>> {
        let Some(t) = g.tensors.get(tensor) else {
            return Ok(None);
        };
        if t.shape != [head_dim / 2] {
            return Err(Error::model_file(
                name,
                format!(
                    "`{tensor}` has shape {:?}; the head width needs [{}]",
                    t.shape,
                    head_dim / 2
                ),
            ));
        }
        let values = t.to_f32(bytes);
        if values.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
            return Err(Error::model_file(
                name,
                format!("`{tensor}` holds a factor that is not a positive number"),
            ));
        }
        Ok(Some(values))
    };
    let long = factors("rope_factors_long.weight")?;
    let short = factors("rope_factors_short.weight")?;
    let attn_factor = float("rope.scaling.attn_factor")?;
    match (long, short) {
        (None, None) => {
            if attn_factor.is_some_and(|a| a != 1.0) {
                return Err(bad(
                    "rope.scaling.attn_factor",
                    "is not supported without longrope factors (only 1)",
                ));
            }
        }
        (Some(long), Some(short)) if scaling == RopeScaling::None => {
            let widen = |v: Vec<f32>| v.into_iter().map(f64::from).collect();
            scaling = RopeScaling::LongRope {
                short_factor: widen(short),
                long_factor: widen(long),
                original_max_position_embeddings: required("rope.scaling.original_context_length")?,
                attention_factor: attn_factor.unwrap_or(1.0),
            };
        }
        _ => {
            return Err(Error::model_file(
                name,
                "`rope_factors_long.weight` and `rope_factors_short.weight` must come together, \
                 and without another rope scaling",
            ))
        }
    }
    if let Some(t) = g.tensors.get("rope_freqs.weight") {
        if scaling != RopeScaling::None {
            return Err(Error::model_file(
                name,
                "`rope_freqs.weight` and `rope.scaling.type` are both given; only one can scale",
            ));
        }
        if t.shape != [head_dim / 2] {
            return Err(Error::model_file(
                name,
                format!(
                    "`rope_freqs.weight` has shape {:?}; the head width needs [{}]",
                    t.shape,
                    head_dim / 2
                ),
            ));
        }
        let factors = t.to_f32(bytes);
        if factors.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
            return Err(Error::model_file(
                name,
                "`rope_freqs.weight` holds a factor that is not a positive number",
            ));
        }
        scaling = RopeScaling::Factors { factors };
    }
    Ok(Rope { theta, scaling })
}
