//! Reading a Hugging Face `tokenizer.json` (BPE models). Every field that changes the ids is
//! read; a type or option webtensor does not implement is an error that names it.

use serde_json::Value;

use super::bpe::{piece_ids, Merges};
use super::split::{self, Behavior, Normalizer, PreStep, Prepend};
use super::{AddedToken, Encoding, Parts, PieceKind, Tokenizer};
use webtensor::error::{Error, Result};

/// Reads a JSON field that must be a boolean when present.
fn flag(v: &Value, key: &str, default: bool) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// The `type` of a component, or an error naming where it is missing.
fn kind<'a>(v: &'a Value, what: &str, bad: &dyn Fn(String) -> Error) -> Result<&'a str> {
    v["type"]
        .as_str()
        .ok_or_else(|| bad(format!("the {what} has no `type`")))
}

/// A `Split`/`Replace` pattern: `{"String": ...}` or `{"Regex": ...}`, as a regex.
fn pattern(v: &Value, what: &str, bad: &dyn Fn(String) -> Error) -> Result<fancy_regex::Regex> {
    if let Some(s) = v["String"].as_str() {
        split::regex(&fancy_regex::escape(s), what)
    } else if let Some(r) = v["Regex"].as_str() {
        split::regex(r, what)
    } else {
        Err(bad(format!("the {what} has no String or Regex pattern")))
    }
}

fn normalizers(v: &Value, out: &mut Vec<Normalizer>, bad: &dyn Fn(String) -> Error) -> Result<()> {
    if v.is_null() {
        return Ok(());
    }
    let n = match kind(v, "normalizer", bad)? {
        "Sequence" => {
            for n in v["normalizers"].as_array().into_iter().flatten() {
                normalizers(n, out, bad)?;
            }
            return Ok(());
        }
        "Prepend" => Normalizer::Prepend(
            v["prepend"]
                .as_str()
                .ok_or_else(|| bad("Prepend normalizer without `prepend`".into()))?
                .into(),
        ),
        "Replace" => {
            let content = v["content"]
                .as_str()
                .ok_or_else(|| bad("Replace normalizer without `content`".into()))?
                .to_string();
            match v["pattern"]["String"].as_str() {
                Some(s) => Normalizer::Replace(s.into(), content),
                None => Normalizer::ReplaceRegex(
                    pattern(&v["pattern"], "Replace normalizer", bad)?,
                    content,
                ),
            }
        }
        "NFC" => Normalizer::Nfc,
        "NFD" => Normalizer::Nfd,
        "NFKC" => Normalizer::Nfkc,
        "NFKD" => Normalizer::Nfkd,
        "Lowercase" => Normalizer::Lowercase,
        "Strip" => Normalizer::Strip {
            left: flag(v, "strip_left", true),
            right: flag(v, "strip_right", true),
        },
        other => {
            return Err(bad(format!(
                "normalizer type {other:?} is not supported (webtensor reads Sequence, Prepend, \
                 Replace, NFC, NFD, NFKC, NFKD, Lowercase and Strip)"
            )))
        }
    };
    out.push(n);
    Ok(())
}

fn pre_steps(v: &Value, out: &mut Vec<PreStep>, bad: &dyn Fn(String) -> Error) -> Result<()> {
    if v.is_null() {
        return Ok(());
    }
    let behavior = |v: &Value, default: Behavior| -> Result<Behavior> {
        match v["behavior"].as_str() {
            None => Ok(default),
            Some(b) => {
                Behavior::parse(b).ok_or_else(|| bad(format!("split behavior {b:?} is not known")))
            }
        }
    };
    let step = match kind(v, "pre_tokenizer", bad)? {
        "Sequence" => {
            for p in v["pretokenizers"].as_array().into_iter().flatten() {
                pre_steps(p, out, bad)?;
            }
            return Ok(());
        }
        "Split" => PreStep::Split {
            regex: pattern(&v["pattern"], "Split pre-tokenizer", bad)?,
            behavior: behavior(v, Behavior::Isolated)?,
            invert: flag(v, "invert", false),
        },
        "ByteLevel" => PreStep::ByteLevel {
            add_prefix_space: flag(v, "add_prefix_space", true),
            regex: if flag(v, "use_regex", true) {
                Some(split::regex(split::GPT2_PATTERN, "ByteLevel")?)
            } else {
                None
            },
        },
        "Digits" => PreStep::Split {
            regex: split::regex(
                if flag(v, "individual_digits", false) {
                    r"\p{N}"
                } else {
                    r"\p{N}+"
                },
                "Digits",
            )?,
            behavior: Behavior::Isolated,
            invert: false,
        },
        "Punctuation" => PreStep::Split {
            // Rust's ASCII punctuation (which includes symbols like `$+<=>^|~`) and
            // Unicode's punctuation categories, as `tokenizers` tests them.
            regex: split::regex(r"[\p{P}!-/:-@\[-`{-~]", "Punctuation")?,
            behavior: behavior(v, Behavior::Isolated)?,
            invert: false,
        },
        "Metaspace" => {
            let replacement = v["replacement"].as_str().unwrap_or("▁");
            let mut chars = replacement.chars();
            let (Some(replacement), None) = (chars.next(), chars.next()) else {
                return Err(bad(format!(
                    "Metaspace replacement {replacement:?} is not one character"
                )));
            };
            let prepend = match v["prepend_scheme"].as_str() {
                Some("always") => Prepend::Always,
                Some("first") => Prepend::First,
                Some("never") => Prepend::Never,
                Some(other) => {
                    return Err(bad(format!(
                        "Metaspace prepend_scheme {other:?} is not known"
                    )))
                }
                // Older files: a boolean.
                None if flag(v, "add_prefix_space", true) => Prepend::Always,
                None => Prepend::Never,
            };
            PreStep::Metaspace {
                replacement,
                prepend,
                split: flag(v, "split", true),
            }
        }
        other => {
            return Err(bad(format!(
                "pre-tokenizer type {other:?} is not supported (webtensor reads Sequence, \
                 Split, ByteLevel, Digits, Punctuation and Metaspace)"
            )))
        }
    };
    out.push(step);
    Ok(())
}

/// How the decoder turns pieces into text: the piece encoding, and whether the leading
/// space of the whole text is dropped.
fn decoder(v: &Value, bad: &dyn Fn(String) -> Error) -> Result<(Option<Encoding>, bool)> {
    if v.is_null() {
        return Ok((None, false));
    }
    Ok(match kind(v, "decoder", bad)? {
        "ByteLevel" => (Some(Encoding::ByteLevel), false),
        "Metaspace" => {
            let strip = !matches!(v["prepend_scheme"].as_str(), Some("never"))
                && flag(v, "add_prefix_space", true);
            (Some(Encoding::SentencePiece), strip)
        }
        "Replace" => {
            if v["pattern"]["String"].as_str() != Some("▁") || v["content"].as_str() != Some(" ")
            {
                return Err(bad(format!(
                    "Replace decoder {v} is not supported (only ▁ → space)"
                )));
            }
            (Some(Encoding::SentencePiece), false)
        }
        "ByteFallback" | "Fuse" => (None, false),
        "Strip" => {
            let start = v["start"].as_u64().unwrap_or(0);
            if v["content"].as_str() != Some(" ") || start > 1 || v["stop"].as_u64() != Some(0) {
                return Err(bad(format!(
                    "Strip decoder {v} is not supported (only one leading space)"
                )));
            }
            (None, start == 1)
        }
        "Sequence" => {
            let mut encoding = None;
            let mut strip = false;
            for d in v["decoders"].as_array().into_iter().flatten() {
                let (e, s) = decoder(d, bad)?;
                encoding = encoding.or(e);
                strip |= s;
            }
            (encoding, strip)
        }
        other => {
            return Err(bad(format!(
                "decoder type {other:?} is not supported (webtensor reads ByteLevel, Metaspace, \
                 and Sequences of Replace, ByteFallback, Fuse and Strip)"
            )))
        }
    })
}

/// The ids a post-processor puts around a single text: `(prefix, suffix)`, or `None` when
/// there is no post-processor.
fn post_processor(
    v: &Value,
    bad: &dyn Fn(String) -> Error,
) -> Result<Option<(Vec<u32>, Vec<u32>)>> {
    if v.is_null() {
        return Ok(None);
    }
    Ok(Some(match kind(v, "post_processor", bad)? {
        "ByteLevel" => (Vec::new(), Vec::new()),
        "Sequence" => {
            let (mut pre, mut post) = (Vec::new(), Vec::new());
            for p in v["processors"].as_array().into_iter().flatten() {
                if let Some((a, b)) = post_processor(p, bad)? {
                    pre.extend(a);
                    post.extend(b);
                }
            }
            (pre, post)
        }
        "TemplateProcessing" => {
            let (mut pre, mut post) = (Vec::new(), Vec::new());
            let mut seen_text = false;
            for item in v["single"].as_array().into_iter().flatten() {
                if item.get("Sequence").is_some() {
                    seen_text = true;
                    continue;
                }
                let name = item["SpecialToken"]["id"]
                    .as_str()
                    .ok_or_else(|| bad(format!("template item {item} is not understood")))?;
                let ids = v["special_tokens"][name]["ids"]
                    .as_array()
                    .ok_or_else(|| bad(format!("template token {name:?} has no ids")))?;
                for id in ids {
                    let id = id
                        .as_u64()
                        .and_then(|i| u32::try_from(i).ok())
                        .ok_or_else(|| bad(format!("template token {name:?}: bad id {id}")))?;
                    if seen_text {
                        post.push(id);
                    } else {
                        pre.push(id);
                    }
                }
            }
            (pre, post)
        }
        other => {
            return Err(bad(format!(
                "post-processor type {other:?} is not supported (webtensor reads ByteLevel, \
                 TemplateProcessing and Sequence)"
            )))
        }
    }))
}

/// Places `piece` at `id` in the table, refusing ids the file's entries cannot reach (an id
/// is an index: 2^40 must not allocate terabytes) and two texts for one id.
fn place(
    pieces: &mut [String],
    kinds: &mut [PieceKind],
    piece: &str,
    id: &Value,
    kind: PieceKind,
    bad: &dyn Fn(String) -> Error,
) -> Result<u32> {
    let limit = pieces.len();
    let index = id
        .as_u64()
        .filter(|&i| (i as usize) < limit && i <= u32::MAX as u64)
        .ok_or_else(|| {
            bad(format!(
                "the token {piece:?} has id {id}, but the file has {limit} tokens: ids must be \
                 below that"
            ))
        })? as usize;
    if !pieces[index].is_empty() && pieces[index] != piece {
        return Err(bad(format!(
            "id {index} is given to both {:?} and {piece:?}",
            pieces[index]
        )));
    }
    pieces[index] = piece.to_string();
    if kind != PieceKind::Normal {
        kinds[index] = kind;
    }
    Ok(index as u32)
}

impl Tokenizer {
    /// Reads a Hugging Face `tokenizer.json` (BPE models); `source` names it in errors.
    pub fn from_json(text: &str, source: &str) -> Result<Tokenizer> {
        let bad = |reason: String| Error::model_file(source, reason);
        let v: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let model = &v["model"];
        match model["type"].as_str() {
            Some("BPE") => {}
            None if model["merges"].is_array() => {}
            other => {
                return Err(bad(format!(
                    "tokenizer model {other:?}; webtensor reads BPE tokenizers"
                )))
            }
        }
        if model["dropout"].as_f64().is_some_and(|d| d != 0.0) {
            return Err(bad(
                "BPE dropout is set; webtensor tokenizes deterministically".into(),
            ));
        }
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if model[key].as_str().is_some_and(|s| !s.is_empty()) {
                return Err(bad(format!("BPE `{key}` is not supported")));
            }
        }
        let vocab = model["vocab"]
            .as_object()
            .ok_or_else(|| bad("`model.vocab` is missing".into()))?;
        let added = v["added_tokens"].as_array().map_or(&[][..], Vec::as_slice);
        // Ids index a table: it is as long as the file has entries, no longer.
        let total = vocab.len() + added.len();
        let mut pieces = vec![String::new(); total];
        let mut kinds = vec![PieceKind::Normal; total];
        for (piece, id) in vocab {
            place(&mut pieces, &mut kinds, piece, id, PieceKind::Normal, &bad)?;
        }
        let mut added_tokens = Vec::new();
        for t in added {
            let content = t["content"]
                .as_str()
                .ok_or_else(|| bad(format!("added token {t} has no content")))?;
            if flag(t, "single_word", false) {
                return Err(bad(format!(
                    "added token {content:?} is `single_word`, which webtensor does not match"
                )));
            }
            let special = flag(t, "special", false);
            let kind = if special {
                PieceKind::Control
            } else {
                PieceKind::Literal
            };
            let id = place(&mut pieces, &mut kinds, content, &t["id"], kind, &bad)?;
            added_tokens.push(AddedToken {
                id,
                special,
                lstrip: flag(t, "lstrip", false),
                rstrip: flag(t, "rstrip", false),
            });
        }
        // Trailing ids nobody took are not part of the vocabulary.
        while pieces.last().is_some_and(String::is_empty) {
            pieces.pop();
            kinds.pop();
        }
        let ids = piece_ids(&pieces);
        // "a b" strings, or ["a", "b"] pairs in newer files.
        let merges = model["merges"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| match m {
                Value::String(s) => s
                    .split_once(' ')
                    .ok_or_else(|| bad(format!("merge {s:?} is not two pieces"))),
                Value::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
                    (Some(a), Some(b)) => Ok((a, b)),
                    _ => Err(bad(format!("merge {m} is not two pieces"))),
                },
                other => Err(bad(format!("merge {other} is not two pieces"))),
            });
        let merges = Merges::ranked(merges, &ids, &bad)?;
        let unk = match model["unk_token"].as_str() {
            None => None,
            Some(u) => Some(
                *ids.get(u)
                    .ok_or_else(|| bad(format!("unk_token {u:?} is not in the vocab")))?,
            ),
        };
        let mut normalizer_list = Vec::new();
        normalizers(&v["normalizer"], &mut normalizer_list, &bad)?;
        let mut pre = Vec::new();
        pre_steps(&v["pre_tokenizer"], &mut pre, &bad)?;
        let (encoding, strip_leading_space) = decoder(&v["decoder"], &bad)?;
        let byte_level_pre = pre.iter().any(|s| matches!(s, PreStep::ByteLevel { .. }));
        let encoding = match encoding {
            Some(e) => e,
            None if byte_level_pre => Encoding::ByteLevel,
            None => {
                return Err(bad(
                    "the decoder does not say how pieces become text (ByteLevel or ▁ spaces)"
                        .into(),
                ))
            }
        };
        let (prefix, suffix) = match post_processor(&v["post_processor"], &bad)? {
            Some((pre, post)) => (Some(pre), post),
            None => (None, Vec::new()),
        };
        for &id in prefix.iter().flatten().chain(&suffix) {
            if id as usize >= pieces.len() {
                return Err(bad(format!(
                    "the post-processor adds id {id}, beyond the vocabulary"
                )));
            }
        }
        let bos = prefix.as_ref().and_then(|p| p.first().copied());
        Tokenizer::build(Parts {
            pieces,
            kinds,
            encoding,
            normalizers: normalizer_list,
            pre,
            merges,
            ignore_merges: flag(model, "ignore_merges", false),
            byte_fallback: flag(model, "byte_fallback", false),
            unk,
            fuse_unk: flag(model, "fuse_unk", false),
            added: added_tokens,
            prefix,
            suffix,
            strip_leading_space,
            stop: Vec::new(),
            bos,
            eos: None,
        })
    }
}
