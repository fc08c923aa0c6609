//! Tokenizers of Llama-family models, giving the same ids as the reference implementations:
//! Hugging Face `tokenizers` for a `tokenizer.json` ([`Tokenizer::from_json`], `hf.rs`) and
//! llama.cpp for a GGUF vocabulary ([`Tokenizer::from_gguf`], `gguf.rs`).
//!
//! One pipeline serves both, configured by the file:
//!
//! 1. added tokens (`<|im_start|>`, `<s>`, ...) are cut out of the text first: always the
//!    ordinary ones, the special (control) ones only when asked ([`Tokenizer::encode_with_special`]);
//! 2. each stretch of text between them is normalized (`split.rs`: NFC, Llama 2's `▁` prefix
//!    and space replacement, ...);
//! 3. pre-tokenized into pieces (`split.rs`: the model's regex splits, GPT-2's byte-level
//!    mapping, SentencePiece's `Metaspace`);
//! 4. each piece is merged by BPE (`bpe.rs`: O(n log n), by rank or by score), characters
//!    outside the vocabulary falling back to `<0xNN>` byte tokens.
//!
//! [`StreamDecoder`] (`decode.rs`) turns ids back into text piece by piece without ever
//! splitting a multi-byte character. The tokenizer also carries what the model's files say
//! about turns: the tokens that end one ([`Tokenizer::is_stop`]) and the chat template
//! ([`crate::chat`]).

mod bpe;
mod decode;
mod gguf;
mod hf;
mod split;

use std::collections::HashMap;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};

use super::chat::{ChatTemplate, TemplateRenderer};

pub use decode::StreamDecoder;

use bpe::Merges;
use split::{Normalizer, PreStep};
use webtensor::error::{Error, Result};

/// Texts of the tokens that end a turn in common chat formats; a vocabulary holding one of
/// them stops generation there, as llama.cpp does.
const END_OF_TURN: [&str; 8] = [
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<end_of_turn>",
    "<|end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
];

/// What an id stands for when decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PieceKind {
    /// Text in the vocabulary's own encoding (byte-level characters or `▁` spaces).
    Normal,
    /// A control token (`<s>`, `<|eot_id|>`): no text.
    Control,
    /// An added token that is plain text (`<tool_call>`): its text as written.
    Literal,
    /// A `<0xNN>` byte token.
    Byte(u8),
}

/// How normal pieces turn into bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    /// GPT-2's printable stand-ins for bytes.
    ByteLevel,
    /// Text with `▁` for spaces.
    SentencePiece,
}

/// A token cut out of the text before normalization.
#[derive(Clone, Debug)]
struct AddedToken {
    id: u32,
    /// Recognized only by [`Tokenizer::encode_with_special`].
    special: bool,
    /// Whitespace before / after it is swallowed.
    lstrip: bool,
    rstrip: bool,
}

/// Matches added tokens in a text, leftmost-longest as `tokenizers` does.
#[derive(Clone, Debug)]
struct AddedMatcher {
    matcher: AhoCorasick,
    tokens: Vec<AddedToken>,
}

impl AddedMatcher {
    fn new(contents: &[String], tokens: Vec<AddedToken>) -> Result<Option<AddedMatcher>> {
        if tokens.is_empty() {
            return Ok(None);
        }
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(contents)
            .map_err(|e| Error::invalid("tokenizer", format!("added tokens: {e}")))?;
        Ok(Some(AddedMatcher { matcher, tokens }))
    }
}

/// A stretch of the input: text to tokenize, or an added token's id.
enum Segment<'a> {
    Text(&'a str),
    Token(u32),
}

/// A text ↔ token-id mapping.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    pieces: Vec<String>,
    ids: HashMap<String, u32>,
    kinds: Vec<PieceKind>,
    encoding: Encoding,
    normalizers: Vec<Normalizer>,
    pre: Vec<PreStep>,
    merges: Merges,
    /// A piece that is a whole vocabulary entry is taken as it is (Llama 3).
    ignore_merges: bool,
    byte_fallback: bool,
    unk: Option<u32>,
    fuse_unk: bool,
    byte_token: [Option<u32>; 256],
    byte_char: [char; 256],
    char_byte: HashMap<char, u8>,
    /// All added tokens / only the non-special ones.
    added_all: Option<AddedMatcher>,
    added_plain: Option<AddedMatcher>,
    /// Ids put before / after an encoded prompt (`None`: the file does not say).
    prefix: Option<Vec<u32>>,
    suffix: Vec<u32>,
    /// `decode` drops the space SentencePiece put in front of the text.
    strip_leading_space: bool,
    max_piece_bytes: usize,
    stop: Vec<u32>,
    bos_text: Option<String>,
    eos_text: Option<String>,
    chat_template: Option<ChatTemplate>,
    /// Where [`render_chat`](Tokenizer::render_chat) renders (`None`: on the calling thread).
    template_renderer: Option<Arc<dyn TemplateRenderer>>,
}

/// The parts a file reader hands to [`Tokenizer::build`].
struct Parts {
    pieces: Vec<String>,
    kinds: Vec<PieceKind>,
    encoding: Encoding,
    normalizers: Vec<Normalizer>,
    pre: Vec<PreStep>,
    merges: Merges,
    ignore_merges: bool,
    byte_fallback: bool,
    unk: Option<u32>,
    fuse_unk: bool,
    /// Added tokens: id and flags (the text is the piece of the id).
    added: Vec<AddedToken>,
    prefix: Option<Vec<u32>>,
    suffix: Vec<u32>,
    strip_leading_space: bool,
    stop: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
}

/// Parses `<0xNN>`.
fn parse_byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

impl Tokenizer {
    fn build(p: Parts) -> Result<Tokenizer> {
        let ids: HashMap<String, u32> = p
            .pieces
            .iter()
            .enumerate()
            .rev()
            .map(|(i, s)| (s.clone(), i as u32))
            .collect();
        let byte_char = split::byte_chars();
        let char_byte = byte_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let mut byte_token = [None; 256];
        for (i, (piece, kind)) in p.pieces.iter().zip(&p.kinds).enumerate() {
            if let PieceKind::Byte(b) = kind {
                byte_token[*b as usize].get_or_insert(i as u32);
            } else if let (Encoding::SentencePiece, Some(b)) = (p.encoding, parse_byte_token(piece))
            {
                byte_token[b as usize].get_or_insert(i as u32);
            }
        }
        let matcher = |tokens: Vec<AddedToken>| {
            let contents: Vec<String> = tokens
                .iter()
                .map(|t| p.pieces[t.id as usize].clone())
                .collect();
            AddedMatcher::new(&contents, tokens)
        };
        let added: Vec<AddedToken> = p
            .added
            .into_iter()
            .filter(|t| !p.pieces[t.id as usize].is_empty())
            .collect();
        let added_all = matcher(added.clone())?;
        let added_plain = matcher(added.into_iter().filter(|t| !t.special).collect())?;
        let mut t = Tokenizer {
            ids,
            kinds: p.kinds,
            encoding: p.encoding,
            normalizers: p.normalizers,
            pre: p.pre,
            merges: p.merges,
            ignore_merges: p.ignore_merges,
            byte_fallback: p.byte_fallback,
            unk: p.unk,
            fuse_unk: p.fuse_unk,
            byte_token,
            byte_char,
            char_byte,
            added_all,
            added_plain,
            prefix: p.prefix,
            suffix: p.suffix,
            strip_leading_space: p.strip_leading_space,
            max_piece_bytes: 1,
            stop: Vec::new(),
            bos_text: None,
            eos_text: None,
            chat_template: None,
            template_renderer: None,
            pieces: p.pieces,
        };
        // The most normalized text one token can stand for: its text as written (SentencePiece's
        // `▁` is 3 bytes of normalized text) or its bytes (a byte-level character is 1).
        t.max_piece_bytes = (0..t.pieces.len())
            .map(|id| t.pieces[id].len().max(t.bytes_of(id as u32, true).len()))
            .max()
            .unwrap_or(1)
            .max(1);
        t.bos_text = p.bos.and_then(|id| t.pieces.get(id as usize).cloned());
        t.eos_text = p.eos.and_then(|id| t.pieces.get(id as usize).cloned());
        let mut stop = p.stop;
        stop.extend(p.eos);
        stop.extend(END_OF_TURN.iter().filter_map(|s| t.id(s)));
        t.add_stop_ids(&stop);
        Ok(t)
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The id of a piece, if it is in the vocabulary (`"<s>"`, `"<|im_end|>"`, ...).
    pub fn id(&self, piece: &str) -> Option<u32> {
        self.ids.get(piece).copied()
    }

    /// The piece of an id as the vocabulary writes it.
    pub fn piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }

    /// The ids the model's files put before a prompt (its BOS token when it wants one), or
    /// `None` when the tokenizer file does not say (a `tokenizer.json` without a
    /// post-processor): the caller then decides from the model's config.
    pub fn prefix(&self) -> Option<&[u32]> {
        self.prefix.as_deref()
    }

    /// The ids the model's files put after a prompt (an EOS token, rarely).
    pub fn suffix(&self) -> &[u32] {
        &self.suffix
    }

    /// Whether `id` ends a turn: an end-of-sequence id of the model's files, or a token named
    /// like an end of turn (`<|eot_id|>`, `<|im_end|>`, `<end_of_turn>`, ...).
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.contains(&id)
    }

    /// The ids [`is_stop`](Self::is_stop) accepts.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop
    }

    /// Adds end-of-turn ids (from `config.json` or `generation_config.json`); ids outside
    /// the vocabulary are left out.
    pub fn add_stop_ids(&mut self, ids: &[u32]) {
        for &id in ids {
            if (id as usize) < self.pieces.len() && !self.stop.contains(&id) {
                self.stop.push(id);
            }
        }
    }

    /// The chat template of the model's files (`tokenizer_config.json`'s `chat_template`,
    /// `chat_template.jinja`, or GGUF's `tokenizer.chat_template`) or the one set in its place
    /// (`--chat-template`), if any.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Renders chat templates with `renderer` from now on (`None`: on the calling thread), for
    /// a program that must outlive what minijinja's bounds miss ([`TemplateRenderer`]).
    pub fn set_template_renderer(&mut self, renderer: Option<Arc<dyn TemplateRenderer>>) {
        self.template_renderer = renderer;
    }

    /// The renderer set with [`set_template_renderer`](Tokenizer::set_template_renderer).
    pub fn template_renderer(&self) -> Option<&Arc<dyn TemplateRenderer>> {
        self.template_renderer.as_ref()
    }

    /// Sets the chat template and the texts of the BOS/EOS tokens templates refer to
    /// (`None` keeps those of the vocabulary).
    pub fn set_chat_template(
        &mut self,
        template: Option<ChatTemplate>,
        bos: Option<String>,
        eos: Option<String>,
    ) {
        self.chat_template = template;
        if bos.is_some() {
            self.bos_text = bos;
        }
        if let Some(eos) = eos {
            if let Some(id) = self.id(&eos) {
                self.add_stop_ids(&[id]);
            }
            self.eos_text = Some(eos);
        }
    }

    /// The texts of the BOS and EOS tokens, for chat templates.
    pub fn special_texts(&self) -> (Option<&str>, Option<&str>) {
        (self.bos_text.as_deref(), self.eos_text.as_deref())
    }

    /// The ids of `text` read as plain text: special tokens written in it (`<|im_start|>`)
    /// are tokenized as the characters they are made of; ordinary added tokens are
    /// recognized. No BOS token is added (see [`prefix`](Self::prefix)).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_limited(text, false, usize::MAX)
    }

    /// The ids of `text` with special tokens written in it recognized, as a chat template's
    /// output needs (and as `tokenizers`' `encode` does).
    pub fn encode_with_special(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_limited(text, true, usize::MAX)
    }

    /// Like [`encode`](Self::encode) (`special`: [`encode_with_special`](Self::encode_with_special)),
    /// but refuses with [`Error::CacheFull`] a text that cannot fit in `limit` tokens, and
    /// does so before the costly steps: the normalized text is counted against the longest
    /// piece of the vocabulary first.
    pub fn encode_limited(&self, text: &str, special: bool, limit: usize) -> Result<Vec<u32>> {
        let segments = self.segments(text, special);
        let mut normalized = Vec::with_capacity(segments.len());
        let mut least = 0usize;
        for seg in segments {
            match seg {
                Segment::Token(id) => {
                    least += 1;
                    normalized.push(Err(id));
                }
                Segment::Text(s) => {
                    let mut s = s.to_string();
                    for n in &self.normalizers {
                        s = n.apply(s)?;
                    }
                    least += s.len().div_ceil(self.max_piece_bytes);
                    normalized.push(Ok(s));
                }
            }
            if least > limit {
                return Err(Error::CacheFull {
                    capacity: limit,
                    len: 0,
                    requested: least,
                });
            }
        }
        let mut ids = Vec::new();
        for (i, seg) in normalized.into_iter().enumerate() {
            match seg {
                Err(id) => ids.push(id),
                Ok(s) => {
                    for piece in split::pre_tokenize(&self.pre, s, i == 0, &self.byte_char)? {
                        self.merge_piece(&piece, &mut ids);
                    }
                }
            }
        }
        if ids.len() > limit {
            return Err(Error::CacheFull {
                capacity: limit,
                len: 0,
                requested: ids.len(),
            });
        }
        Ok(ids)
    }

    /// Cuts the added tokens out of `text`.
    fn segments<'a>(&self, text: &'a str, special: bool) -> Vec<Segment<'a>> {
        let matcher = if special {
            &self.added_all
        } else {
            &self.added_plain
        };
        let Some(m) = matcher else {
            return vec![Segment::Text(text)];
        };
        let mut out = Vec::new();
        let mut last = 0;
        let mut rstrip = false;
        for found in m.matcher.find_iter(text) {
            let token = &m.tokens[found.pattern().as_usize()];
            let mut before = &text[last..found.start()];
            if rstrip {
                before = before.trim_start();
            }
            if token.lstrip {
                before = before.trim_end();
            }
            if !before.is_empty() {
                out.push(Segment::Text(before));
            }
            out.push(Segment::Token(token.id));
            rstrip = token.rstrip;
            last = found.end();
        }
        let mut rest = &text[last..];
        if rstrip {
            rest = rest.trim_start();
        }
        if !rest.is_empty() {
            out.push(Segment::Text(rest));
        }
        out
    }

    /// The ids of one pre-tokenized piece.
    fn merge_piece(&self, piece: &str, out: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(&id) = self.ids.get(piece) {
                out.push(id);
                return;
            }
        }
        let mut symbols = Vec::with_capacity(piece.len());
        let mut buf = [0u8; 4];
        let mut last_unk = false;
        for c in piece.chars() {
            if let Some(&id) = self.ids.get(c.encode_utf8(&mut buf) as &str) {
                symbols.push(id);
                last_unk = false;
                continue;
            }
            if self.byte_fallback {
                let bytes: Option<Vec<u32>> = c
                    .encode_utf8(&mut buf)
                    .bytes()
                    .map(|b| self.byte_token[b as usize])
                    .collect();
                if let Some(bytes) = bytes {
                    symbols.extend(bytes);
                    last_unk = false;
                    continue;
                }
            }
            if let Some(unk) = self.unk {
                if !(self.fuse_unk && last_unk) {
                    symbols.push(unk);
                }
                last_unk = true;
            }
        }
        out.extend(self.merges.apply(&symbols, &self.pieces, &self.ids));
    }

    /// The bytes token `id` stands for; control tokens stand for nothing unless
    /// `with_control`.
    fn bytes_of(&self, id: u32, with_control: bool) -> Vec<u8> {
        let Some(piece) = self.pieces.get(id as usize) else {
            return Vec::new();
        };
        match self.kinds[id as usize] {
            PieceKind::Control if with_control => piece.as_bytes().to_vec(),
            PieceKind::Control => Vec::new(),
            PieceKind::Literal => piece.as_bytes().to_vec(),
            PieceKind::Byte(b) => vec![b],
            PieceKind::Normal => match self.encoding {
                Encoding::ByteLevel => {
                    let bytes: Option<Vec<u8>> = piece
                        .chars()
                        .map(|c| self.char_byte.get(&c).copied())
                        .collect();
                    bytes.unwrap_or_else(|| piece.as_bytes().to_vec())
                }
                Encoding::SentencePiece => match parse_byte_token(piece) {
                    Some(b) => vec![b],
                    None => piece.replace(split::SPACE_MARK, " ").into_bytes(),
                },
            },
        }
    }

    /// The text of `ids` (invalid UTF-8 replaced; control tokens left out; the space a
    /// SentencePiece tokenizer put in front of the text dropped).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut d = self.stream();
        let mut text: String = ids.iter().map(|&id| d.push(id)).collect();
        text.push_str(&d.finish());
        match text.strip_prefix(' ') {
            Some(rest) if self.strip_leading_space => rest.to_string(),
            _ => text,
        }
    }

    /// A decoder that returns text as ids arrive. It continues a text (a prompt), so a
    /// SentencePiece word's leading space is kept: "said" + `▁w` shows "said w".
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

#[cfg(test)]
mod tests;
