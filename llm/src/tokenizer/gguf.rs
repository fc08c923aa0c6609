//! Reading the vocabulary of a GGUF file (`tokenizer.ggml.*`) the way llama.cpp does: model
//! `llama` (SentencePiece, merged by score), `gpt2` (byte-level BPE, merged by rank, split
//! by the patterns of `tokenizer.ggml.pre`) or `gemma4` (BPE merged by rank over
//! SentencePiece-style pieces).

use super::bpe::{piece_ids, Merges};
use super::split::{self, Behavior, Normalizer, PreStep, GPT2_PATTERN};
use super::{AddedToken, Encoding, Parts, PieceKind, Tokenizer};
use crate::chat::ChatTemplate;
use crate::gguf::{Gguf, GgufArray, GgufItem, GgufValue};
use webtensor::error::{Error, Result};

/// Llama 3's pattern: digits in groups of up to three, newlines kept apart.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with single digits.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The patterns llama.cpp applies one after the other for a `tokenizer.ggml.pre` value, and
/// whether a piece that is a whole vocabulary entry skips the merges.
fn pre_patterns(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => (vec![LLAMA3], true),
        "dbrx" | "smaug-bpe" => (vec![LLAMA3], false),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" => (vec![QWEN2], false),
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" => (vec![GPT2_PATTERN], false),
        "starcoder" | "refact" | "smollm" | "command-r" | "codeshell" | "exaone" => {
            (vec![r"\p{N}", GPT2_PATTERN], false)
        }
        "falcon" => (
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2_PATTERN, "[0-9][0-9][0-9]"],
            false,
        ),
        "default" => (
            vec![
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_PATTERN,
                r"\p{N}+",
                "[0-9][0-9][0-9]",
            ],
            false,
        ),
        "deepseek-coder" => (
            vec![
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                "[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ],
            false,
        ),
        _ => return None,
    })
}

/// llama.cpp's token types.
const TYPE_UNKNOWN: u64 = 2;
const TYPE_CONTROL: u64 = 3;
const TYPE_USER_DEFINED: u64 = 4;
const TYPE_BYTE: u64 = 6;

impl Tokenizer {
    /// Reads the vocabulary of a GGUF file (`tokenizer.ggml.*`: model `gpt2`, `llama` or
    /// `gemma4`).
    pub fn from_gguf(gguf: &Gguf, source: &str) -> Result<Tokenizer> {
        let bad = |reason: String| Error::model_file(source, reason);
        let meta = |key: &str| gguf.metadata.get(key);
        let pieces: Vec<String> = meta("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .ok_or_else(|| bad("no tokenizer.ggml.tokens".into()))?
            .iter()
            .map(|p| p.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("tokenizer.ggml.tokens holds a non-string".into()))?;
        let n = pieces.len();
        let array = |key: &str| -> Result<Option<&GgufArray>> {
            match meta(key) {
                None => Ok(None),
                Some(v) => match v.as_array() {
                    Some(a) if a.len() == n => Ok(Some(a)),
                    _ => Err(bad(format!(
                        "{key} is not an array of {n} values, one per token"
                    ))),
                },
            }
        };
        let types: Vec<u64> = match array("tokenizer.ggml.token_type")? {
            Some(t) => t
                .iter()
                .map(|v| {
                    v.as_u64()
                        .ok_or_else(|| bad("a token type is not a number".into()))
                })
                .collect::<Result<_>>()?,
            None => vec![1; n],
        };
        let id_of = |key: &str| -> Result<Option<u32>> {
            match meta(&format!("tokenizer.ggml.{key}")) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(id) if (id as usize) < n => Ok(Some(id as u32)),
                    // llama.cpp writes -1 (as u32::MAX) for "none".
                    Some(id) if id == u32::MAX as u64 || id == u64::MAX => Ok(None),
                    _ => Err(bad(format!(
                        "tokenizer.ggml.{key} = {v:?} is not a token id below {n}"
                    ))),
                },
            }
        };
        let flag = |key: &str| {
            meta(&format!("tokenizer.ggml.{key}")).and_then(|v| match v {
                GgufValue::Bool(b) => Some(*b),
                _ => None,
            })
        };
        let bos = id_of("bos_token_id")?;
        let eos = id_of("eos_token_id")?;
        let unk = id_of("unknown_token_id")?;
        let mut stop: Vec<u32> = Vec::new();
        for key in ["eot_token_id", "eom_token_id"] {
            stop.extend(id_of(key)?);
        }
        let kinds: Vec<PieceKind> = types
            .iter()
            .zip(&pieces)
            .map(|(&t, p)| match t {
                TYPE_CONTROL | TYPE_UNKNOWN => PieceKind::Control,
                TYPE_USER_DEFINED => PieceKind::Literal,
                TYPE_BYTE => super::parse_byte_token(p).map_or(PieceKind::Normal, PieceKind::Byte),
                _ => PieceKind::Normal,
            })
            .collect();
        // Control tokens are matched only when asked; user-defined ones always (llama.cpp's
        // parse_special).
        let added: Vec<AddedToken> = types
            .iter()
            .enumerate()
            .filter(|(_, &t)| matches!(t, TYPE_CONTROL | TYPE_UNKNOWN | TYPE_USER_DEFINED))
            .map(|(i, &t)| AddedToken {
                id: i as u32,
                special: t != TYPE_USER_DEFINED,
                lstrip: false,
                rstrip: false,
            })
            .collect();
        let model = meta("tokenizer.ggml.model")
            .and_then(GgufValue::as_str)
            .unwrap_or("llama");
        let with_prefix = |add: bool| -> Result<Option<Vec<u32>>> {
            match (add, bos) {
                (false, _) => Ok(Some(Vec::new())),
                (true, Some(b)) => Ok(Some(vec![b])),
                (true, None) => Err(bad(
                    "tokenizer.ggml.add_bos_token is set but there is no bos_token_id".into(),
                )),
            }
        };
        // `tokenizer.ggml.merges`: "left right" pairs, ranked by their order.
        let ranked_merges = |pieces: &[String]| -> Result<Merges> {
            let ids = piece_ids(pieces);
            let merges = array_any(meta("tokenizer.ggml.merges")).map(|m| {
                m.as_str()
                    .and_then(|s| s.split_once(' '))
                    .ok_or_else(|| bad(format!("merge {m:?} is not two pieces")))
            });
            Merges::ranked(merges, &ids, &bad)
        };
        let suffix = match (flag("add_eos_token").unwrap_or(false), eos) {
            (true, Some(e)) => vec![e],
            _ => Vec::new(),
        };
        let parts = match model {
            "llama" => {
                let scores: Vec<f32> = match array("tokenizer.ggml.scores")? {
                    Some(s) => s
                        .iter()
                        .map(|v| v.as_f64().map(|x| x as f32))
                        .collect::<Option<_>>()
                        .ok_or_else(|| bad("a token score is not a number".into()))?,
                    None => vec![0.0; n],
                };
                let space_prefix = flag("add_space_prefix").unwrap_or(true);
                let mut normalizers = Vec::new();
                if space_prefix {
                    normalizers.push(Normalizer::Prepend(split::SPACE_MARK.to_string()));
                }
                normalizers.push(Normalizer::Replace(
                    " ".into(),
                    split::SPACE_MARK.to_string(),
                ));
                Parts {
                    pieces,
                    kinds,
                    encoding: Encoding::SentencePiece,
                    normalizers,
                    pre: Vec::new(),
                    merges: Merges::Scored(scores),
                    ignore_merges: false,
                    byte_fallback: true,
                    unk,
                    fuse_unk: false,
                    added,
                    prefix: with_prefix(flag("add_bos_token").unwrap_or(true))?,
                    suffix,
                    strip_leading_space: space_prefix,
                    stop,
                    bos,
                    eos,
                }
            }
            "gpt2" => {
                // llama.cpp reads a missing pre-tokenizer as "default".
                let pre_name = meta("tokenizer.ggml.pre")
                    .and_then(GgufValue::as_str)
                    .unwrap_or("default");
                let (patterns, ignore_merges) = pre_patterns(pre_name).ok_or_else(|| {
                    bad(format!(
                        "tokenizer.ggml.pre = {pre_name:?} is a pre-tokenizer webtensor does not \
                         know; it reads llama-bpe (llama3), qwen2, gpt-2, mpt, starcoder, \
                         smollm, refact, falcon, deepseek-coder and default"
                    ))
                })?;
                let mut pre = patterns
                    .iter()
                    .map(|p| {
                        Ok(PreStep::Split {
                            regex: split::regex(p, "tokenizer.ggml.pre")?,
                            behavior: Behavior::Isolated,
                            invert: false,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                pre.push(PreStep::ByteLevel {
                    add_prefix_space: false,
                    regex: None,
                });
                let merges = ranked_merges(&pieces)?;
                let default_bos = ignore_merges;
                Parts {
                    pieces,
                    kinds,
                    encoding: Encoding::ByteLevel,
                    normalizers: Vec::new(),
                    pre,
                    merges,
                    ignore_merges,
                    byte_fallback: false,
                    unk,
                    fuse_unk: false,
                    added,
                    prefix: with_prefix(flag("add_bos_token").unwrap_or(default_bos))?,
                    suffix,
                    strip_leading_space: false,
                    stop,
                    bos,
                    eos,
                }
            }
            "gemma4" => {
                // Gemma 4's: BPE merged by rank over the text's own UTF-8 with each space
                // written as ▁ (no space added in front), split only between runs of newlines
                // and the rest; a byte without a piece falls back to `<0xXX>`. (llama.cpp takes
                // a run of newlines that is a piece whole; the merges reach every such piece
                // of this vocabulary anyway, so plain BPE gives the same ids.)
                let merges = ranked_merges(&pieces)?;
                Parts {
                    pieces,
                    kinds,
                    encoding: Encoding::SentencePiece,
                    normalizers: vec![Normalizer::Replace(
                        " ".into(),
                        split::SPACE_MARK.to_string(),
                    )],
                    pre: vec![PreStep::Split {
                        regex: split::regex(r"[^\n]+|\n+", "the gemma4 pre-tokenizer")?,
                        behavior: Behavior::Isolated,
                        invert: false,
                    }],
                    merges,
                    ignore_merges: false,
                    byte_fallback: true,
                    unk,
                    fuse_unk: false,
                    added,
                    prefix: with_prefix(flag("add_bos_token").unwrap_or(true))?,
                    suffix,
                    strip_leading_space: false,
                    stop,
                    bos,
                    eos,
                }
            }
            other => {
                return Err(bad(format!(
                    "tokenizer model {other:?}; webtensor reads \"gpt2\", \"llama\" and \"gemma4\" \
                     vocabularies"
                )))
            }
        };
        let mut t = Tokenizer::build(parts)?;
        if let Some(template) = meta("tokenizer.chat_template").and_then(GgufValue::as_str) {
            let origin = format!("{source} (`tokenizer.chat_template`)");
            t.set_chat_template(Some(ChatTemplate::new(template, origin)), None, None);
        }
        Ok(t)
    }
}

/// The elements of an optional array value (none when absent or not an array).
fn array_any(v: Option<&GgufValue>) -> impl Iterator<Item = GgufItem<'_>> {
    v.and_then(GgufValue::as_array)
        .into_iter()
        .flat_map(GgufArray::iter)
}
