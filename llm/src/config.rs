//! [`LlamaConfig`]: the hyper-parameters of a Llama-family decoder, read from a Hugging Face
//! `config.json` or from GGUF metadata, and checked before any weight is touched.
//!
//! A `config.json` key that could change the numbers and that the engine does not implement is
//! an error naming it: every key must be read or known to be harmless
//! ([`Architecture::knows_key`]).

use serde::Deserialize;
use serde_json::{Map, Value};

use super::arch::Architecture;
use super::rope::{Rope, RopeScaling};
use webtensor::error::{Error, Result};

/// The shape and numerics of a Llama-family model (see [`Architecture`]).
#[derive(Clone, Debug, PartialEq, Deserialize, serde::Serialize)]
pub struct LlamaConfig {
    /// Which member of the family (from `architectures` / `model_type`).
    #[serde(skip_deserializing)]
    pub architecture: Architecture,
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
    /// Activation of the feed-forward gate: `silu`, or for Gemma 2 (its `hidden_activation`)
    /// `gelu_pytorch_tanh`.
    #[serde(default = "default_act", alias = "hidden_activation")]
    pub hidden_act: String,
    /// Gemma 2: the attention scale is `1/√query_pre_attn_scalar` (else `1/√head_dim`).
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 2: attention scores soft-capped as `cap · tanh(score / cap)` before the softmax.
    #[serde(default)]
    pub attn_logit_softcapping: Option<f32>,
    /// Gemma 2: the logits soft-capped as `cap · tanh(logit / cap)`.
    #[serde(default)]
    pub final_logit_softcapping: Option<f32>,
    /// Rotary embedding: base and scaling (`rope_theta`, `rope_scaling`, `rope_parameters`);
    /// with [`LlamaConfig::local_rope`], that of the full-attention layers only.
    #[serde(skip_deserializing)]
    pub rope: Rope,
    /// Gemma 3: the rotary embedding of the sliding-window layers (`rope_local_base_freq`,
    /// `rope_parameters.sliding_attention`); `None` where every layer has [`LlamaConfig::rope`].
    #[serde(skip_deserializing)]
    pub local_rope: Option<Rope>,
    /// Per layer, the sliding attention window (a query sees itself and the `w − 1` keys
    /// before it), or `None` for full causal attention.
    #[serde(skip_deserializing)]
    pub layer_windows: Vec<Option<usize>>,
    /// Per layer, whether its q and k get the rotary embedding: false for the layers
    /// SmolLM3's `no_rope_layers` marks 0, true for every layer of the other architectures.
    #[serde(skip_deserializing)]
    pub layer_rope: Vec<bool>,
    /// Whether the q/k/v projections have biases (always for Qwen2).
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
    /// A shorter context than the model's, chosen by the user ([`LlamaConfig::limit_context`],
    /// the command line's `--ctx`) to bound cache memory; never read from a file.
    #[serde(skip)]
    pub context_limit: Option<usize>,
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
        let fail = |reason: String| Error::Config {
            source_name: source.to_string(),
            reason,
        };
        let value: Value =
            serde_json::from_str(text).map_err(|e| fail(format!("not valid JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| fail("not a JSON object".into()))?;
        let architecture = Architecture::from_config(
            obj.get("architectures"),
            obj.get("model_type").and_then(Value::as_str),
            source,
        )?;
        if let Some(key) = obj.keys().find(|k| !architecture.knows_key(k)) {
            return Err(fail(format!(
                "`{key}` is not a setting webtensor implements for {}; it may change the \
                 model's numbers, so the model is refused rather than run differently",
                architecture.class_name()
            )));
        }
        let mut config = LlamaConfig::deserialize(&value)
            .map_err(|e| fail(format!("not a Llama-family config.json: {e}")))?;
        config.architecture = architecture;
        if architecture.is_gemma() {
            if obj
                .get("use_bidirectional_attention")
                .and_then(Value::as_bool)
                == Some(true)
            {
                return Err(fail(
                    "`use_bidirectional_attention` = true: only causal attention is supported"
                        .into(),
                ));
            }
            // Gemma ties its embeddings unless the config says otherwise (transformers
            // leaves the default out of a saved config).
            if !obj.contains_key("tie_word_embeddings") {
                config.tie_word_embeddings = true;
            }
            if !obj.contains_key("hidden_activation") && !obj.contains_key("hidden_act") {
                config.hidden_act = "gelu_pytorch_tanh".into();
            }
            if !obj.contains_key("query_pre_attn_scalar") {
                config.query_pre_attn_scalar = Some(256.0);
            }
        }
        let original = match obj.get("original_max_position_embeddings") {
            Some(v) if !v.is_null() => Some(v.as_f64().ok_or_else(|| {
                fail(format!(
                    "`original_max_position_embeddings` = {v} is not a number"
                ))
            })?),
            _ => None,
        };
        if architecture == Architecture::Gemma3 {
            let [full, sliding] =
                Rope::gemma3_from_json(obj, config.max_position_embeddings, source)?;
            config.rope = full;
            config.local_rope = Some(sliding);
        } else {
            config.rope = Rope::from_json(obj, config.max_position_embeddings, original, source)?;
        }
        let longrope = matches!(
            config.rope.scaling,
            RopeScaling::None | RopeScaling::LongRope { .. }
        );
        if architecture == Architecture::Phi3 && !longrope {
            // Transformers runs Phi-3's scaled types (`su`, `yarn`) as `longrope`.
            return Err(fail(
                "`rope_parameters.rope_type`: Phi-3's rope scaling is longrope (with short and \
                 long factors); give rope_type \"longrope\""
                    .into(),
            ));
        }
        let layers = plausible_layers(config.num_hidden_layers, source)?;
        config.layer_windows = layer_windows(obj, architecture, layers, source)?;
        config.layer_rope = layer_rope(obj, architecture, layers, source)?;
        if architecture.always_qkv_bias() {
            config.attention_bias = true;
        }
        if obj.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
            return Err(fail(
                "`mlp_bias` = true: feed-forward biases are not supported".into(),
            ));
        }
        config.validate(source)?;
        Ok(config)
    }

    /// The longest sequence the model runs: `max_position_embeddings`, times the factor of
    /// `dynamic` rope scaling (which exists to run past it).
    /// At most [`LlamaConfig::context_limit`] when one is set.
    pub fn context_len(&self) -> usize {
        let natural = self.own_context_len();
        self.context_limit
            .map_or(natural, |limit| natural.min(limit))
    }

    /// The context the model's files give it, whatever [`LlamaConfig::context_limit`] says.
    pub fn own_context_len(&self) -> usize {
        match self.rope.scaling {
            RopeScaling::Dynamic { factor } if factor > 1.0 => {
                (self.max_position_embeddings as f64 * factor) as usize
            }
            _ => self.max_position_embeddings,
        }
    }

    /// Runs the model with a context of `tokens` instead of its own (caches and prompts are
    /// bounded by it). Tokens past the model's own context would run positions it was not
    /// trained for, so more than that is refused, and so is 0.
    pub fn limit_context(&mut self, tokens: usize) -> Result<()> {
        let natural = self.own_context_len();
        if tokens == 0 || tokens > natural {
            return Err(Error::invalid(
                "context",
                format!("a context of {tokens} tokens: this model runs 1 to {natural}"),
            ));
        }
        self.context_limit = Some(tokens);
        Ok(())
    }

    /// Whether `layer` rotates its q and k ([`LlamaConfig::layer_rope`]).
    pub fn uses_rope(&self, layer: usize) -> bool {
        self.layer_rope.get(layer).copied().unwrap_or(true)
    }

    /// The sliding attention window of `layer`, if it has one.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.layer_windows.get(layer).copied().flatten()
    }

    /// Whether `layer` rotates by [`LlamaConfig::local_rope`] (a Gemma 3 sliding-window
    /// layer) rather than by [`LlamaConfig::rope`].
    pub fn uses_local_rope(&self, layer: usize) -> bool {
        self.local_rope.is_some() && self.window(layer).is_some()
    }

    /// Whether the feed-forward gate is tanh GELU (GeGLU, Gemma 2) rather than SiLU.
    pub fn gelu_gate(&self) -> bool {
        self.hidden_act == "gelu_pytorch_tanh"
    }

    /// The multiplier of every attention score `q · k`: `1/√query_pre_attn_scalar` where the
    /// config gives it (Gemma 2), else `1/√head_dim`; times yarn's attention factor squared
    /// (yarn scales the rotated q and k).
    pub fn attention_scale(&self) -> f32 {
        let base = self.query_pre_attn_scalar.unwrap_or(self.head_dim() as f64);
        (self.rope.attention_factor().powi(2) / base.sqrt()) as f32
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
        let fail = |field: &str, why: String| Err(Error::config_field(source, field, why));
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
        for (field, rope) in [
            ("rope_theta", Some(&self.rope)),
            ("rope_local_base_freq", self.local_rope.as_ref()),
        ] {
            if let Some(theta) = rope.map(|r| r.theta) {
                if !(theta.is_finite() && theta > 1.0) {
                    return fail(field, format!("= {theta} must be above 1"));
                }
            }
        }
        if let Some((short, long)) = self.rope.pair_factors() {
            if short != hd / 2 || long != hd / 2 {
                return fail(
                    "rope_parameters.short_factor",
                    format!(
                        "and long_factor give {short} and {long} values; the head width {hd} \
                         needs {} each",
                        hd / 2
                    ),
                );
            }
        }
        // Settings given per layer must give one per layer.
        for (key, len) in [
            ("layer_types", self.layer_windows.len()),
            ("no_rope_layers", self.layer_rope.len()),
        ] {
            if len != self.num_hidden_layers {
                return fail(
                    key,
                    format!(
                        "gives {len} layers; num_hidden_layers = {}",
                        self.num_hidden_layers
                    ),
                );
            }
        }
        if self.layer_windows.contains(&Some(0)) {
            return fail("sliding_window", "must be at least 1".into());
        }
        let act = match self.architecture.is_gemma() {
            true => "gelu_pytorch_tanh",
            false => "silu",
        };
        if self.hidden_act != act {
            return fail(
                "hidden_act",
                format!(
                    "= {:?} is not supported for {} (only {act:?})",
                    self.hidden_act,
                    self.architecture.class_name()
                ),
            );
        }
        if let Some(s) = self.query_pre_attn_scalar {
            if !(s.is_finite() && s > 0.0) {
                return fail("query_pre_attn_scalar", format!("= {s} must be positive"));
            }
        }
        for (field, cap) in [
            ("attn_logit_softcapping", self.attn_logit_softcapping),
            ("final_logit_softcapping", self.final_logit_softcapping),
        ] {
            if let Some(cap) = cap {
                if !(cap.is_finite() && cap > 0.0) {
                    return fail(field, format!("= {cap} must be positive"));
                }
            }
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

/// The most decoder layers a config may declare. The largest published models have a few
/// hundred; the bound keeps a lying count from reaching per-layer allocations before the
/// weights are checked against it (`files.rs` then requires the tensors of every layer).
pub(crate) const MAX_LAYERS: usize = 1 << 16;

/// `layers`, or an error naming `num_hidden_layers` when it is beyond [`MAX_LAYERS`].
pub(crate) fn plausible_layers(layers: usize, source: &str) -> Result<usize> {
    if layers > MAX_LAYERS {
        return Err(Error::Config {
            source_name: source.to_string(),
            reason: format!(
                "`num_hidden_layers` = {layers} is more than the {MAX_LAYERS} layers webtensor \
                 accepts; the file is damaged or not a model"
            ),
        });
    }
    Ok(layers)
}

/// The attention window of each layer, as transformers derives it for `arch`: Mistral and
/// Phi-3 apply `sliding_window` (Mistral's default 4096) to every layer; Qwen2/3 only with
/// `use_sliding_window`, to the layers `layer_types` marks `sliding_attention` or else to those
/// from `max_window_layers` (default 28) on; Gemma 2 to the layers `layer_types` marks, by
/// default every even one (window 4096); Gemma 3 to those `layer_types` marks, by default all
/// but every `sliding_window_pattern`-th (6). Llama and OLMo 2 have none; SmolLM3's are
/// refused ([`smollm3_full_attention`]).
fn layer_windows(
    obj: &Map<String, Value>,
    arch: Architecture,
    layers: usize,
    source: &str,
) -> Result<Vec<Option<usize>>> {
    let fail = |field: &str, why: String| Error::config_field(source, field, why);
    let count = |key: &str, default: Option<usize>| -> Result<Option<usize>> {
        match obj.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| fail(key, format!("= {v} is not a whole number that fits"))),
        }
    };
    // Each layer's window from transformers' `layer_types`.
    let typed = |types: &[Value], window: Option<usize>| {
        types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(None),
                Some("sliding_attention") => Ok(window),
                _ => Err(fail(
                    "layer_types",
                    format!(
                        "has {t}; only \"full_attention\" and \"sliding_attention\" are \
                         supported"
                    ),
                )),
            })
            .collect::<Result<Vec<_>>>()
    };
    let windows = match arch {
        Architecture::Llama | Architecture::Olmo2 => vec![None; layers],
        // Without `layer_types`, transformers' default: even layers slide, odd ones see all.
        Architecture::Gemma2 => {
            let window = count("sliding_window", Some(4096))?;
            match obj.get("layer_types") {
                Some(Value::Array(types)) => typed(types, window)?,
                None | Some(Value::Null) => (0..layers)
                    .map(|i| if i % 2 == 0 { window } else { None })
                    .collect(),
                Some(other) => return Err(fail("layer_types", format!("= {other} is not a list"))),
            }
        }
        Architecture::Gemma3 => {
            // A sliding layer without a window would still rotate by the local base in
            // transformers, which the engine ties to the window: refused.
            let window = count("sliding_window", Some(4096))?.ok_or_else(|| {
                fail(
                    "sliding_window",
                    "= null is not supported for Gemma 3; give the window".into(),
                )
            })?;
            let window = Some(window);
            match obj.get("layer_types") {
                Some(Value::Array(types)) => typed(types, window)?,
                None | Some(Value::Null) => {
                    let pattern = count("sliding_window_pattern", Some(6))?
                        .filter(|&p| p > 0)
                        .ok_or_else(|| {
                            fail("sliding_window_pattern", "must be at least 1".into())
                        })?;
                    (0..layers)
                        .map(|i| match (i + 1) % pattern {
                            0 => None,
                            _ => window,
                        })
                        .collect()
                }
                Some(other) => return Err(fail("layer_types", format!("= {other} is not a list"))),
            }
        }
        Architecture::SmolLM3 => smollm3_full_attention(obj, layers, source)?,
        Architecture::Mistral => vec![count("sliding_window", Some(4096))?; layers],
        Architecture::Phi3 => vec![count("sliding_window", None)?; layers],
        Architecture::Qwen2 | Architecture::Qwen3 => {
            let enabled = match obj.get("use_sliding_window") {
                None | Some(Value::Null) => false,
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| fail("use_sliding_window", format!("= {v} is not a boolean")))?,
            };
            let window = if enabled {
                count("sliding_window", Some(4096))?
            } else {
                None
            };
            match obj.get("layer_types") {
                Some(Value::Array(types)) => typed(types, window)?,
                None | Some(Value::Null) => {
                    let first = count("max_window_layers", Some(28))?.unwrap_or(0);
                    (0..layers)
                        .map(|i| if i >= first { window } else { None })
                        .collect()
                }
                Some(other) => return Err(fail("layer_types", format!("= {other} is not a list"))),
            }
        }
    };
    Ok(windows)
}

/// SmolLM3's layers, each with full attention, or an error naming the setting that would give
/// one a window: transformers slides a window over the layers without rope when
/// `use_sliding_window` and `sliding_window` are both set (or where `layer_types` says so).
/// llama.cpp runs SmolLM3 without windows and no published checkpoint uses them, so they are
/// refused rather than run untested.
fn smollm3_full_attention(
    obj: &Map<String, Value>,
    layers: usize,
    source: &str,
) -> Result<Vec<Option<usize>>> {
    let fail = |field: &str, why: String| Error::config_field(source, field, why);
    let unsupported = "SmolLM3's sliding windows are not supported";
    match obj.get("layer_types") {
        Some(Value::Array(types)) => {
            if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                return Err(fail("layer_types", format!("has {t}: {unsupported}")));
            }
            return Ok(vec![None; types.len()]);
        }
        None | Some(Value::Null) => {}
        Some(other) => return Err(fail("layer_types", format!("= {other} is not a list"))),
    }
    let enabled = obj.get("use_sliding_window").and_then(Value::as_bool) == Some(true);
    let window = obj.get("sliding_window").is_some_and(|w| !w.is_null());
    if enabled && window {
        return Err(fail("use_sliding_window", format!("= true: {unsupported}")));
    }
    Ok(vec![None; layers])
}

/// Whether each layer rotates q and k: for SmolLM3 its `no_rope_layers` (1 = rope, 0 = none)
/// or, without it, transformers' default from `no_rope_layer_interval` (every
/// `interval`-th layer without rope, default 4); every layer for the other architectures.
fn layer_rope(
    obj: &Map<String, Value>,
    arch: Architecture,
    layers: usize,
    source: &str,
) -> Result<Vec<bool>> {
    let fail = |field: &str, why: String| Error::config_field(source, field, why);
    if arch != Architecture::SmolLM3 {
        return Ok(vec![true; layers]);
    }
    match obj.get("no_rope_layers") {
        Some(Value::Array(flags)) => flags
            .iter()
            .map(|f| match f.as_u64() {
                Some(1) => Ok(true),
                Some(0) => Ok(false),
                _ => Err(fail(
                    "no_rope_layers",
                    format!("has {f}; only 1 (rope) and 0 (no rope) are meaningful"),
                )),
            })
            .collect(),
        None | Some(Value::Null) => {
            let interval = match obj.get("no_rope_layer_interval") {
                None | Some(Value::Null) => 4,
                Some(v) => v.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                    fail(
                        "no_rope_layer_interval",
                        format!("= {v} is not a positive whole number"),
                    )
                })?,
            };
            Ok((0..layers as u64)
                .map(|i| (i + 1) % interval != 0)
                .collect())
        }
        Some(other) => Err(fail("no_rope_layers", format!("= {other} is not a list"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"{"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "eos_token_id": [7, 8]}"#;

    #[test]
    fn a_context_limit_bounds_the_context_within_the_models_own() {
        let mut c = LlamaConfig::from_json(TINY, "config.json").unwrap();
        assert_eq!(c.context_len(), 2048);
        c.limit_context(100).unwrap();
        assert_eq!(c.context_len(), 100);
        for bad in [0, 2049] {
            let e = c.limit_context(bad).unwrap_err().to_string();
            assert!(e.contains("1 to 2048"), "{e}");
            assert_eq!(c.context_len(), 100, "a refused limit keeps the old one");
        }
        c.limit_context(2048).unwrap();
        assert_eq!(c.context_len(), 2048);
    }

    #[test]
    fn reads_a_hugging_face_config() {
        let c = LlamaConfig::from_json(TINY, "config.json").unwrap();
        assert_eq!((c.head_dim(), c.kv_dim(), c.q_dim()), (16, 32, 64));
        assert_eq!(c.eos_token_id, Some(7));
        assert_eq!(c.rope, Rope::default());
        // As the browser API hands it to JavaScript.
        let js = serde_json::to_value(&c).unwrap();
        assert_eq!(js["architecture"], "llama");
        assert_eq!(js["rope"]["scaling"]["rope_type"], "none");
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

    #[test]
    fn refuses_what_would_change_the_numbers() {
        for (extra, named) in [
            (r#""architectures": ["GemmaForCausalLM"]"#, "architectures"),
            (r#""model_type": "gpt2""#, "model_type"),
            (r#""mlp_bias": true"#, "mlp_bias"),
            (r#""logit_scale": 0.5"#, "logit_scale"),
            (r#""sliding_window": 16"#, "sliding_window"),
            (r#""rope_parameters": {"rope_type": "su"}"#, "rope_type"),
        ] {
            let json = TINY.replace("\"vocab_size\"", &format!("{extra}, \"vocab_size\""));
            let err = LlamaConfig::from_json(&json, "config.json")
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{extra}: {err}");
        }
    }

    #[test]
    fn qwen2_has_biases_and_windows_per_layer() {
        let json = TINY.replace(
            "\"vocab_size\"",
            r#""model_type": "qwen2", "use_sliding_window": true, "sliding_window": 5,
               "max_window_layers": 1, "vocab_size""#,
        );
        let c = LlamaConfig::from_json(&json, "config.json").unwrap();
        assert!(c.attention_bias);
        assert_eq!((c.window(0), c.window(1)), (None, Some(5)));
    }
}
