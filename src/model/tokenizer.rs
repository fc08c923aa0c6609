//! Tokenizers of Llama-family models, from a Hugging Face `tokenizer.json` or from a GGUF
//! vocabulary:
//!
//! * byte-level BPE (GPT-2 style: Llama 3, Qwen2, SmolLM, the built-in model): text is split
//!   into words by the GPT-2 pattern, each byte becomes a printable character, and merges
//!   apply in rank order;
//! * SentencePiece BPE (Llama 2, TinyLlama): spaces become `▁`, a `▁` is prepended, pieces
//!   merge by score (GGUF) or merge rank (`tokenizer.json`), and characters outside the
//!   vocabulary fall back to `<0xNN>` byte tokens.
//!
//! [`StreamDecoder`] turns ids back into text piece by piece without ever splitting a
//! multi-byte character.

use std::collections::HashMap;

use serde_json::Value;

use super::gguf::Gguf;
use crate::error::{Error, Result};

/// SentencePiece's word-boundary mark.
const SPACE_MARK: char = '▁';

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    ByteLevel,
    SentencePiece,
}

/// How adjacent pieces merge.
#[derive(Clone, Debug)]
enum Merges {
    /// By rank in a merge list (lower first).
    Ranked(HashMap<(u32, u32), u32>),
    /// By the score of the merged piece (higher first), as SentencePiece vocabularies give.
    Scored(Vec<f32>),
}

/// A text ↔ token-id mapping.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    kind: Kind,
    pieces: Vec<String>,
    ids: HashMap<String, u32>,
    merges: Merges,
    special: Vec<bool>,
    /// For byte-level: the printable character standing for each byte, and back.
    byte_char: [char; 256],
    char_byte: HashMap<char, u8>,
    /// For SentencePiece: the `<0xNN>` token of each byte, where present.
    byte_token: [Option<u32>; 256],
}

/// GPT-2's printable stand-ins for bytes: printable Latin-1 bytes stand for themselves, the
/// others map to code points from 256 up, in byte order.
fn byte_chars() -> [char; 256] {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b).unwrap_or('\0')
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\0')
        };
    }
    out
}

/// The words of GPT-2's pre-tokenizer pattern
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn split_words(text: &str) -> Vec<&str> {
    #[derive(PartialEq, Clone, Copy)]
    enum Class {
        Letter,
        Number,
        Space,
        Other,
    }
    let class = |c: char| {
        if c.is_alphabetic() {
            Class::Letter
        } else if c.is_numeric() {
            Class::Number
        } else if c.is_whitespace() {
            Class::Space
        } else {
            Class::Other
        }
    };
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let byte_at = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
    let mut words = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let rest = &text[chars[i].0..];
        if let Some(c) = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
            .iter()
            .find(|c| rest.starts_with(**c))
        {
            let n = c.chars().count();
            words.push(&text[byte_at(i)..byte_at(i + n)]);
            i += n;
            continue;
        }
        let c = chars[i].1;
        let mut start_class = class(c);
        let mut j = i;
        if c == ' ' {
            if let Some(&(_, next)) = chars.get(i + 1) {
                if class(next) != Class::Space {
                    start_class = class(next);
                    j = i + 1;
                }
            }
        }
        if start_class == Class::Space {
            let mut k = i;
            while k < chars.len() && class(chars[k].1) == Class::Space {
                k += 1;
            }
            // `\s+(?!\S)`: leave the last space to prefix the next word.
            if k < chars.len() && k - i > 1 {
                k -= 1;
            }
            words.push(&text[byte_at(i)..byte_at(k)]);
            i = k;
            continue;
        }
        while j < chars.len() && class(chars[j].1) == start_class {
            j += 1;
        }
        words.push(&text[byte_at(i)..byte_at(j)]);
        i = j;
    }
    words
}

fn parse_byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

impl Tokenizer {
    fn new(kind: Kind, pieces: Vec<String>, merges: Merges, special: Vec<bool>) -> Tokenizer {
        let ids = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), i as u32))
            .collect();
        let byte_char = byte_chars();
        let char_byte = byte_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let mut byte_token = [None; 256];
        for (i, p) in pieces.iter().enumerate() {
            if let Some(b) = parse_byte_token(p) {
                byte_token[b as usize] = Some(i as u32);
            }
        }
        Tokenizer {
            kind,
            pieces,
            ids,
            merges,
            special,
            byte_char,
            char_byte,
            byte_token,
        }
    }

    /// Reads a Hugging Face `tokenizer.json` (BPE models); `source` names it in errors.
    pub fn from_json(text: &str, source: &str) -> Result<Tokenizer> {
        let bad = |reason: String| Error::model_file(source, reason);
        let v: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let model = &v["model"];
        if model["type"].as_str() != Some("BPE") {
            return Err(bad(format!(
                "tokenizer model {:?}; webtensor reads BPE tokenizers",
                model["type"]
            )));
        }
        let vocab = model["vocab"]
            .as_object()
            .ok_or_else(|| bad("`model.vocab` is missing".into()))?;
        let mut pieces = vec![String::new(); vocab.len()];
        let mut special = vec![false; vocab.len()];
        let mut place = |piece: &str, id: u64, is_special: bool| -> Result<()> {
            let id = id as usize;
            if id >= pieces.len() {
                pieces.resize(id + 1, String::new());
                special.resize(id + 1, false);
            }
            pieces[id] = piece.to_string();
            special[id] |= is_special;
            Ok(())
        };
        for (piece, id) in vocab {
            let id = id
                .as_u64()
                .ok_or_else(|| bad(format!("vocab entry {piece:?} has no id")))?;
            place(piece, id, false)?;
        }
        for t in v["added_tokens"].as_array().into_iter().flatten() {
            if let (Some(content), Some(id)) = (t["content"].as_str(), t["id"].as_u64()) {
                place(content, id, t["special"].as_bool().unwrap_or(false))?;
            }
        }
        let byte_level = v["pre_tokenizer"].to_string().contains("ByteLevel")
            || v["decoder"].to_string().contains("ByteLevel");
        let kind = if byte_level {
            Kind::ByteLevel
        } else {
            Kind::SentencePiece
        };
        let mut tokenizer = Tokenizer::new(kind, pieces, Merges::Ranked(HashMap::new()), special);
        let mut ranks = HashMap::new();
        for (rank, m) in model["merges"].as_array().into_iter().flatten().enumerate() {
            // "a b" strings, or ["a", "b"] pairs in newer files.
            let (a, b) = match m {
                Value::String(s) => s
                    .split_once(' ')
                    .ok_or_else(|| bad(format!("merge {s:?} is not two pieces")))?,
                Value::Array(p) if p.len() == 2 => (
                    p[0].as_str().unwrap_or_default(),
                    p[1].as_str().unwrap_or_default(),
                ),
                other => return Err(bad(format!("merge {other} is not two pieces"))),
            };
            match (tokenizer.ids.get(a), tokenizer.ids.get(b)) {
                (Some(&x), Some(&y)) => {
                    ranks.entry((x, y)).or_insert(rank as u32);
                }
                _ => {
                    return Err(bad(format!(
                        "merge \"{a} {b}\" names a piece not in the vocab"
                    )))
                }
            }
        }
        tokenizer.merges = Merges::Ranked(ranks);
        Ok(tokenizer)
    }

    /// Reads the vocabulary of a GGUF file (`tokenizer.ggml.*`: model `gpt2` or `llama`).
    pub fn from_gguf(gguf: &Gguf, source: &str) -> Result<Tokenizer> {
        let bad = |reason: String| Error::model_file(source, reason);
        let meta = |key: &str| gguf.metadata.get(key);
        let pieces: Vec<String> = meta("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .ok_or_else(|| bad("no tokenizer.ggml.tokens".into()))?
            .iter()
            .map(|p| p.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("tokenizer.ggml.tokens holds a non-string".into()))?;
        let special: Vec<bool> = match meta("tokenizer.ggml.token_type").and_then(|v| v.as_array())
        {
            // 3 = control tokens.
            Some(types) => types.iter().map(|t| t.as_u64() == Some(3)).collect(),
            None => vec![false; pieces.len()],
        };
        let model = meta("tokenizer.ggml.model")
            .and_then(|v| v.as_str())
            .unwrap_or("llama");
        match model {
            "gpt2" => {
                let mut t = Tokenizer::new(
                    Kind::ByteLevel,
                    pieces,
                    Merges::Ranked(HashMap::new()),
                    special,
                );
                let mut ranks = HashMap::new();
                for (rank, m) in meta("tokenizer.ggml.merges")
                    .and_then(|v| v.as_array())
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let (a, b) = m
                        .as_str()
                        .and_then(|s| s.split_once(' '))
                        .ok_or_else(|| bad(format!("merge {m:?} is not two pieces")))?;
                    if let (Some(&x), Some(&y)) = (t.ids.get(a), t.ids.get(b)) {
                        ranks.entry((x, y)).or_insert(rank as u32);
                    }
                }
                t.merges = Merges::Ranked(ranks);
                Ok(t)
            }
            "llama" => {
                let scores: Vec<f32> =
                    match meta("tokenizer.ggml.scores").and_then(|v| v.as_array()) {
                        Some(s) => s.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
                        None => vec![0.0; pieces.len()],
                    };
                Ok(Tokenizer::new(
                    Kind::SentencePiece,
                    pieces,
                    Merges::Scored(scores),
                    special,
                ))
            }
            other => Err(bad(format!(
                "tokenizer model {other:?}; webtensor reads \"gpt2\" and \"llama\" vocabularies"
            ))),
        }
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The id of a piece, if it is in the vocabulary (`"<s>"`, `"</s>"`, ...).
    pub fn id(&self, piece: &str) -> Option<u32> {
        self.ids.get(piece).copied()
    }

    /// Which of two adjacent pieces merge first: lower is earlier.
    fn priority(&self, a: u32, b: u32) -> Option<(f32, u32)> {
        let merged = || {
            let mut s = self.pieces[a as usize].clone();
            s.push_str(&self.pieces[b as usize]);
            self.ids.get(&s).copied()
        };
        match &self.merges {
            Merges::Ranked(ranks) => {
                let rank = *ranks.get(&(a, b))?;
                Some((rank as f32, merged()?))
            }
            Merges::Scored(scores) => {
                let id = merged()?;
                Some((-scores.get(id as usize).copied().unwrap_or(0.0), id))
            }
        }
    }

    /// Merges `symbols` in priority order until no pair merges.
    fn merge(&self, mut symbols: Vec<u32>) -> Vec<u32> {
        loop {
            let best = symbols
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| self.priority(w[0], w[1]).map(|(p, id)| (p, i, id)))
                .min_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
            match best {
                Some((_, i, id)) => {
                    symbols.splice(i..i + 2, [id]);
                }
                None => return symbols,
            }
        }
    }

    /// The ids of `text` (no beginning-of-sequence token; add it yourself).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self.kind {
            Kind::ByteLevel => {
                let mut ids = Vec::new();
                for word in split_words(text) {
                    let symbols = word
                        .bytes()
                        .filter_map(|b| {
                            self.ids
                                .get(&self.byte_char[b as usize].to_string())
                                .copied()
                        })
                        .collect();
                    ids.extend(self.merge(symbols));
                }
                ids
            }
            Kind::SentencePiece => {
                let normalized: String = std::iter::once(SPACE_MARK)
                    .chain(text.chars().map(|c| if c == ' ' { SPACE_MARK } else { c }))
                    .collect();
                let mut symbols = Vec::new();
                for c in normalized.chars() {
                    match self.ids.get(&c.to_string()) {
                        Some(&id) => symbols.push(id),
                        None => {
                            let mut buf = [0u8; 4];
                            symbols.extend(
                                c.encode_utf8(&mut buf)
                                    .bytes()
                                    .filter_map(|b| self.byte_token[b as usize]),
                            );
                        }
                    }
                }
                self.merge(symbols)
            }
        }
    }

    /// The bytes token `id` stands for (special tokens stand for nothing).
    fn bytes_of(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.pieces.get(id as usize) else {
            return Vec::new();
        };
        if self.special.get(id as usize).copied().unwrap_or(false) {
            return Vec::new();
        }
        match self.kind {
            Kind::ByteLevel => piece
                .chars()
                .filter_map(|c| self.char_byte.get(&c).copied())
                .collect(),
            Kind::SentencePiece => match parse_byte_token(piece) {
                Some(b) => vec![b],
                None => piece.replace(SPACE_MARK, " ").into_bytes(),
            },
        }
    }

    /// The text of `ids` (invalid UTF-8 replaced; a SentencePiece leading space dropped).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut d = self.stream();
        let mut text: String = ids.iter().map(|&id| d.push(id)).collect();
        text.push_str(&d.finish());
        text
    }

    /// A decoder that returns text as ids arrive.
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            pending: Vec::new(),
            at_start: true,
        }
    }
}

/// Turns ids into text incrementally: bytes of a character split across tokens are held back
/// until the character is complete.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
    at_start: bool,
}

impl StreamDecoder<'_> {
    /// Adds one id; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.pending.extend(self.tokenizer.bytes_of(id));
        if self.at_start && self.tokenizer.kind == Kind::SentencePiece && !self.pending.is_empty() {
            if self.pending[0] == b' ' {
                self.pending.remove(0);
            }
            self.at_start = false;
        }
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            // An incomplete character at the end waits; a broken one in the middle is replaced.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let ready: Vec<u8> = self.pending.drain(..valid).collect();
        String::from_utf8_lossy(&ready).into_owned()
    }

    /// Whatever is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_gpt2() {
        assert_eq!(
            split_words("Hello world's  3 apples!\n\nOK"),
            vec!["Hello", " world", "'s", " ", " 3", " apples", "!", "\n", "\n", "OK"]
        );
    }

    /// A byte-level vocabulary: every byte, plus "Ġt", "he", "Ġthe" merges.
    fn byte_level() -> Tokenizer {
        let chars = byte_chars();
        let mut vocab: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        vocab.extend(["Ġt", "he", "Ġthe"].map(String::from));
        let json = serde_json::json!({
            "model": {"type": "BPE", "vocab": vocab.iter().enumerate().map(|(i, p)| (p.clone(), serde_json::json!(i))).collect::<serde_json::Map<_, _>>(),
                      "merges": ["Ġ t", "h e", "Ġt he"]},
            "pre_tokenizer": {"type": "ByteLevel"},
            "added_tokens": [{"id": 259, "content": "<s>", "special": true}]
        });
        Tokenizer::from_json(&json.to_string(), "test").unwrap()
    }

    #[test]
    fn byte_level_merges_and_round_trips() {
        let t = byte_level();
        let ids = t.encode("a the é");
        assert_eq!(ids.len(), 1 + 1 + 1 + 2, "{ids:?}"); // "a", "Ġthe", "Ġ", two bytes of é
        assert_eq!(t.decode(&ids), "a the é");
    }

    #[test]
    fn streaming_holds_back_split_characters() {
        let t = byte_level();
        let ids = t.encode("é");
        assert_eq!(ids.len(), 2);
        let mut d = t.stream();
        assert_eq!(d.push(ids[0]), "");
        assert_eq!(d.push(ids[1]), "é");
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn sentencepiece_scores_and_byte_fallback() {
        let mut pieces: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        pieces.extend((0..256).map(|b| format!("<0x{b:02X}>")));
        pieces.extend(["▁", "h", "i", "▁h", "▁hi"].map(String::from));
        let scores: Vec<f32> = (0..pieces.len()).map(|i| i as f32).collect();
        let mut special = vec![false; pieces.len()];
        special[1] = true;
        let t = Tokenizer::new(Kind::SentencePiece, pieces, Merges::Scored(scores), special);
        let ids = t.encode("hi ü");
        assert_eq!(t.pieces[ids[0] as usize], "▁hi");
        assert_eq!(t.decode(&ids), "hi ü");
        assert_eq!(t.decode(&[1]), "");
    }
}
