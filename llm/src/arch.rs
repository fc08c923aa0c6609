//! [`Architecture`]: the Llama-family variants the engine runs, how a Hugging Face
//! `config.json` or a GGUF file names them, and which `config.json` keys each one may carry.

use webtensor::error::{Error, Result};

/// A decoder of the Llama family. They share the forward pass (RMS norms, rotary attention
/// with grouped-query heads, a SwiGLU feed-forward block) and differ in a few details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama 2/3/3.1/3.2, TinyLlama, SmolLM/SmolLM2 (`LlamaForCausalLM`).
    #[default]
    Llama,
    /// Mistral: Llama with an optional sliding attention window.
    Mistral,
    /// Qwen2/2.5: q/k/v projections always have biases.
    Qwen2,
    /// Qwen3: an RMS norm over each head of q and k before the rotary embedding.
    Qwen3,
    /// Phi-3: q/k/v stored as one `qkv_proj`, gate and up as one `gate_up_proj`.
    Phi3,
    /// SmolLM3: Llama whose layers marked 0 in `no_rope_layers` attend without the rotary
    /// embedding.
    SmolLM3,
    /// OLMo 2: no norms before the attention and feed-forward blocks; instead an RMS norm of
    /// each block's output before the residual add, and RMS norms of the whole q and k
    /// projections (all heads together) before the rotary embedding.
    Olmo2,
    /// Gemma 2: a GeGLU feed-forward block (tanh GELU), RMS norms whose weights apply as
    /// `1 + w` before and after each block, embeddings scaled by √hidden, soft-capped
    /// attention scores and final logits, an attention scale of `query_pre_attn_scalar`, and
    /// layers alternating between a sliding window and full attention.
    Gemma2,
    /// Gemma 3 (text): Gemma 2 with per-head q/k RMS norms (`1 + w`) before the rotary
    /// embedding, a rope base of its own for the sliding-window layers (the full-attention
    /// ones alone scaled), five sliding layers to each full one by default, and no
    /// soft-capping unless the config asks for it.
    Gemma3,
}

/// Where q and k go through an RMS norm between their projection and the rotary embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// Nowhere.
    None,
    /// Over each head (Qwen3): one weight of `[head_dim]` for every head.
    PerHead,
    /// Over the whole projection, all heads together (OLMo 2): weights of `[q_dim]` and
    /// `[kv_dim]`.
    Whole,
}

/// Every architecture, for messages.
const ALL: [(Architecture, &str, &str, &str); 9] = [
    (Architecture::Llama, "LlamaForCausalLM", "llama", "llama"),
    (
        Architecture::Mistral,
        "MistralForCausalLM",
        "mistral",
        "llama",
    ),
    (Architecture::Qwen2, "Qwen2ForCausalLM", "qwen2", "qwen2"),
    (Architecture::Qwen3, "Qwen3ForCausalLM", "qwen3", "qwen3"),
    (Architecture::Phi3, "Phi3ForCausalLM", "phi3", "phi3"),
    (
        Architecture::SmolLM3,
        "SmolLM3ForCausalLM",
        "smollm3",
        "smollm3",
    ),
    (Architecture::Olmo2, "Olmo2ForCausalLM", "olmo2", "olmo2"),
    (
        Architecture::Gemma2,
        "Gemma2ForCausalLM",
        "gemma2",
        "gemma2",
    ),
    (
        Architecture::Gemma3,
        "Gemma3ForCausalLM",
        "gemma3_text",
        "gemma3",
    ),
];

/// `config.json` keys that do not change the numbers of a forward pass (training settings,
/// bookkeeping, generation defaults, token ids the engine reads elsewhere).
const HARMLESS_KEYS: &[&str] = &[
    "_name_or_path",
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "initializer_range",
    "attention_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "id2label",
    "label2id",
    "tokenizer_class",
    "is_decoder",
    "is_encoder_decoder",
    "tie_encoder_decoder",
    "add_cross_attention",
    "max_length",
    "min_length",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "num_beams",
    "use_bfloat16",
    "chat_template",
    "pretraining_tp",
    "chunk_size_feed_forward",
    "problem_type",
    "finetuning_task",
    "prefix",
    "sep_token_id",
    "decoder_start_token_id",
    "cross_attention_hidden_size",
    "task_specific_params",
    "torchscript",
    "tf_legacy_loss",
    "output_scores",
    "return_dict_in_generate",
    "num_return_sequences",
    "num_beam_groups",
    "diversity_penalty",
    "length_penalty",
    "early_stopping",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "typical_p",
    // Where remote code lives (Phi-3's `auto_map`), and keys of nanotron exports (SmolLM2)
    // and Qwen2.5 that transformers' own classes do not read either.
    "auto_map",
    "is_llama_config",
    "rope_interleaved",
    "use_mrope",
];

/// `config.json` keys the engine reads (for every architecture).
const READ_KEYS: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "hidden_act",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
];

impl Architecture {
    /// The architecture a `config.json` names in `architectures` (its one entry) or, without
    /// it, in `model_type`; `Err` names the field and the architecture when it is not one of
    /// ours (or when the two disagree).
    pub fn from_config(
        architectures: Option<&serde_json::Value>,
        model_type: Option<&str>,
        source: &str,
    ) -> Result<Architecture> {
        let fail = |field: &str, why: String| Error::config_field(source, field, why);
        let supported = || {
            ALL.iter()
                .map(|(_, class, _, _)| *class)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let by_class = match architectures {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => {
                let names: Vec<&str> = v
                    .as_array()
                    .map(|a| a.iter().filter_map(|n| n.as_str()).collect())
                    .unwrap_or_default();
                let [name] = names[..] else {
                    return Err(fail(
                        "architectures",
                        format!("= {v} must list exactly one architecture name"),
                    ));
                };
                let arch = ALL.iter().find(|(_, class, _, _)| *class == name);
                Some(arch.map(|a| a.0).ok_or_else(|| {
                    fail(
                        "architectures",
                        format!(
                            "= [{name:?}] is not supported; webtensor runs {}",
                            supported()
                        ),
                    )
                })?)
            }
        };
        let by_type = match model_type {
            None => None,
            Some(t) => Some(
                ALL.iter()
                    .find(|(_, _, mt, _)| *mt == t)
                    .map(|a| a.0)
                    .ok_or_else(|| {
                        fail(
                            "model_type",
                            format!("= {t:?} is not supported; webtensor runs {}", supported()),
                        )
                    })?,
            ),
        };
        match (by_class, by_type) {
            (Some(a), Some(b)) if a != b => Err(fail(
                "model_type",
                format!(
                    "= {:?} disagrees with `architectures` = [{:?}]",
                    b.model_type(),
                    a.class_name()
                ),
            )),
            (Some(a), _) | (None, Some(a)) => Ok(a),
            // Older Llama exports carry neither.
            (None, None) => Ok(Architecture::Llama),
        }
    }

    /// The architecture of a GGUF file's `general.architecture`. The converter writes Mistral
    /// as `llama`.
    pub fn from_gguf(name: &str, source: &str) -> Result<Architecture> {
        ALL.iter()
            .find(|(a, _, _, gguf)| *gguf == name && *a != Architecture::Mistral)
            .map(|a| a.0)
            .ok_or_else(|| {
                let supported: Vec<&str> = ALL
                    .iter()
                    .filter(|a| a.0 != Architecture::Mistral)
                    .map(|a| a.3)
                    .collect();
                Error::model_file(
                    source,
                    format!(
                        "metadata `general.architecture` = {name:?} is not supported; webtensor \
                         runs {}",
                        supported.join(", ")
                    ),
                )
            })
    }

    /// The transformers class name (`LlamaForCausalLM`, ...).
    pub fn class_name(self) -> &'static str {
        ALL.iter().find(|a| a.0 == self).map_or("?", |a| a.1)
    }

    /// The `model_type` of its `config.json`.
    pub fn model_type(self) -> &'static str {
        ALL.iter().find(|a| a.0 == self).map_or("?", |a| a.2)
    }

    /// Whether q/k/v have biases whatever `attention_bias` says (Qwen2).
    pub fn always_qkv_bias(self) -> bool {
        self == Architecture::Qwen2
    }

    /// Where q and k are RMS-normed before the rotary embedding.
    pub fn qk_norm(self) -> QkNorm {
        match self {
            Architecture::Qwen3 | Architecture::Gemma3 => QkNorm::PerHead,
            Architecture::Olmo2 => QkNorm::Whole,
            _ => QkNorm::None,
        }
    }

    /// Whether the attention and feed-forward blocks' inputs are RMS-normed (every
    /// architecture but OLMo 2).
    pub fn pre_norms(self) -> bool {
        self != Architecture::Olmo2
    }

    /// Whether the attention and feed-forward blocks' outputs are RMS-normed before the
    /// residual add (OLMo 2, Gemma 2 and 3).
    pub fn post_norms(self) -> bool {
        matches!(
            self,
            Architecture::Olmo2 | Architecture::Gemma2 | Architecture::Gemma3
        )
    }

    /// Whether this is Gemma 2 or 3, which share GeGLU, `query_pre_attn_scalar`, soft-capping
    /// settings, `layer_types` and tied embeddings by default.
    pub fn is_gemma(self) -> bool {
        matches!(self, Architecture::Gemma2 | Architecture::Gemma3)
    }

    /// Whether a Hugging Face checkpoint's RMS norm weights `w` apply as `1 + w` (Gemma 2 and
    /// 3, q/k norms included; llama.cpp's converter adds the 1 when it writes a GGUF file, so
    /// those apply as stored).
    pub fn norm_plus_one(self) -> bool {
        self.is_gemma()
    }

    /// Whether the embedding rows are multiplied by √hidden before the first layer (Gemma 2
    /// and 3).
    pub fn scales_embedding(self) -> bool {
        self.is_gemma()
    }

    /// Whether llama.cpp's converter permutes the q and k rows of its GGUF files (it does for
    /// the architectures it runs with llama.cpp's interleaved rope), so that rope pairs are
    /// neighbouring values rather than the two halves of a head.
    pub fn gguf_interleaved_rope(self) -> bool {
        matches!(
            self,
            Architecture::Llama | Architecture::Mistral | Architecture::SmolLM3
        )
    }

    /// The fewest tensors one decoder layer has in a file: two norms and the attention and
    /// feed-forward matrices, fused in Phi-3 (`qkv_proj`, `gate_up_proj`). A file with fewer
    /// than this many per declared layer lies about its layer count.
    pub fn min_tensors_per_layer(self) -> usize {
        if self.fused_projections() {
            6
        } else {
            9
        }
    }

    /// Whether q/k/v and gate/up are stored fused (`qkv_proj`, `gate_up_proj`).
    pub fn fused_projections(self) -> bool {
        self == Architecture::Phi3
    }

    /// Whether `key` of a `config.json` is one the engine reads or one that cannot change
    /// the numbers, for this architecture.
    pub fn knows_key(self, key: &str) -> bool {
        let own: &[&str] = match self {
            Architecture::Llama => &[],
            Architecture::Mistral => &["sliding_window"],
            Architecture::Qwen2 | Architecture::Qwen3 => &[
                "use_sliding_window",
                "sliding_window",
                "max_window_layers",
                "layer_types",
            ],
            Architecture::Phi3 => &["sliding_window", "original_max_position_embeddings"],
            Architecture::SmolLM3 => &[
                "use_sliding_window",
                "sliding_window",
                "max_window_layers",
                "layer_types",
                "no_rope_layers",
                "no_rope_layer_interval",
            ],
            Architecture::Olmo2 => &[],
            Architecture::Gemma2 => &[
                "sliding_window",
                "layer_types",
                "hidden_activation",
                "query_pre_attn_scalar",
                "attn_logit_softcapping",
                "final_logit_softcapping",
                // Read by `LlamaConfig::from_json`, which refuses `true`.
                "use_bidirectional_attention",
                "cache_implementation",
            ],
            Architecture::Gemma3 => &[
                "sliding_window",
                "layer_types",
                "hidden_activation",
                "query_pre_attn_scalar",
                "attn_logit_softcapping",
                "final_logit_softcapping",
                // Read by `LlamaConfig::from_json`, which refuses `true`.
                "use_bidirectional_attention",
                "cache_implementation",
                // Read by `Rope::gemma3_from_json`.
                "rope_local_base_freq",
                // The layer pattern without `layer_types` (transformers' default 6).
                "sliding_window_pattern",
                // What transformers 5 saves of the pattern beside `layer_types`; it reads
                // `layer_types` back, never this.
                "_sliding_window_pattern",
            ],
        };
        HARMLESS_KEYS.contains(&key) || READ_KEYS.contains(&key) || own.contains(&key)
    }
}
