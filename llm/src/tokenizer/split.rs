//! Text before the merges: normalizers (`tokenizer.json`'s `normalizer`) and pre-tokenizer
//! steps that cut a text into the pieces BPE merges within (`pre_tokenizer`, or the regex
//! list llama.cpp keeps per `tokenizer.ggml.pre`).

use std::sync::Mutex;

use fancy_regex::Regex;
use unicode_normalization::UnicodeNormalization;

use webtensor::error::{Error, Result};

/// SentencePiece's word-boundary mark.
pub const SPACE_MARK: char = '▁';

/// GPT-2's pattern, used by the `ByteLevel` pre-tokenizer when `use_regex` is set.
pub const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Patterns compiled so far, kept for the next tokenizer that names them: compiling GPT-2's
/// pattern (Unicode classes, several delegate automata) costs far more than reading a small
/// vocabulary. At most [`CACHED_PATTERNS`] are kept, so files naming ever new patterns cannot
/// grow it.
static COMPILED: Mutex<Vec<(String, Regex)>> = Mutex::new(Vec::new());
const CACHED_PATTERNS: usize = 32;

/// Backtracking steps one match of a pattern may take. Patterns with look-around run on
/// fancy-regex's backtracking machine (the others on `regex`'s automata, which never
/// backtrack); a tokenizer file's pattern is input, and one that backtracks without end
/// (`((a|a)*)(?!a)b` on a run of `a`s) must end in an [`Error::PatternLimit`], not hang the
/// encode. Real patterns (GPT-2's, Llama 3's, Qwen's) backtrack a few steps per match; a
/// million takes tens of milliseconds. The bound counts steps, not the work of the automata a
/// step runs: a look-ahead that scans the rest of the text at every step (`(?:a(?=a*))*b`)
/// still costs a million scans (seconds on a run of 10,000 letters) before it ends.
pub const BACKTRACK_LIMIT: usize = 1_000_000;

/// Compiles one of the patterns a tokenizer file names (or reuses it, compiled before);
/// `what` says where it came from.
pub fn regex(pattern: &str, what: &str) -> Result<Regex> {
    let cached = |list: &Vec<(String, Regex)>| {
        list.iter()
            .find(|(p, _)| p == pattern)
            .map(|(_, re)| re.clone())
    };
    if let Some(re) = COMPILED.lock().ok().and_then(|list| cached(&list)) {
        return Ok(re);
    }
    let re = fancy_regex::RegexBuilder::new(pattern)
        .backtrack_limit(BACKTRACK_LIMIT)
        .build()
        .map_err(|e| {
            Error::invalid(
                "tokenizer",
                format!("{what}: the pattern {pattern:?} does not compile: {e}"),
            )
        })?;
    if let Ok(mut list) = COMPILED.lock() {
        if list.len() < CACHED_PATTERNS && cached(&list).is_none() {
            list.push((pattern.to_string(), re.clone()));
        }
    }
    Ok(re)
}

/// One normalization step, applied to each stretch of text between added tokens.
#[derive(Clone, Debug)]
pub enum Normalizer {
    /// Puts a string in front of a non-empty text (Llama 2's `▁`).
    Prepend(String),
    /// Replaces every occurrence of a string.
    Replace(String, String),
    /// Replaces every match of a pattern.
    ReplaceRegex(Regex, String),
    /// Unicode normalization forms.
    Nfc,
    /// Canonical decomposition.
    Nfd,
    /// Compatibility composition.
    Nfkc,
    /// Compatibility decomposition.
    Nfkd,
    /// Lower case.
    Lowercase,
    /// Removes leading and/or trailing whitespace.
    Strip {
        /// From the start.
        left: bool,
        /// From the end.
        right: bool,
    },
}

impl Normalizer {
    /// The normalized text.
    pub fn apply(&self, text: String) -> Result<String> {
        Ok(match self {
            Normalizer::Prepend(p) if !text.is_empty() => format!("{p}{text}"),
            Normalizer::Prepend(_) => text,
            Normalizer::Replace(from, to) => text.replace(from.as_str(), to),
            Normalizer::ReplaceRegex(re, to) => {
                let mut out = String::with_capacity(text.len());
                let mut last = 0;
                for m in re.find_iter(&text) {
                    let m = m.map_err(|e| regex_failed(re, e))?;
                    out.push_str(&text[last..m.start()]);
                    out.push_str(to);
                    last = m.end();
                }
                out.push_str(&text[last..]);
                out
            }
            Normalizer::Nfc => text.nfc().collect(),
            Normalizer::Nfd => text.nfd().collect(),
            Normalizer::Nfkc => text.nfkc().collect(),
            Normalizer::Nfkd => text.nfkd().collect(),
            Normalizer::Lowercase => text.to_lowercase(),
            Normalizer::Strip { left, right } => {
                let mut s = text.as_str();
                if *left {
                    s = s.trim_start();
                }
                if *right {
                    s = s.trim_end();
                }
                s.to_string()
            }
        })
    }
}

/// What a split does with the matches of its pattern (`tokenizer.json`'s `behavior`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Each match is a piece of its own.
    Isolated,
    /// Matches are dropped.
    Removed,
    /// Each match joins the piece before it.
    MergedWithPrevious,
    /// Each match joins the piece after it.
    MergedWithNext,
    /// Adjacent matches form one piece.
    Contiguous,
}

impl Behavior {
    /// The behaviour named in a `tokenizer.json`.
    pub fn parse(name: &str) -> Option<Behavior> {
        Some(match name {
            "Isolated" => Behavior::Isolated,
            "Removed" => Behavior::Removed,
            "MergedWithPrevious" => Behavior::MergedWithPrevious,
            "MergedWithNext" => Behavior::MergedWithNext,
            "Contiguous" => Behavior::Contiguous,
            _ => return None,
        })
    }
}

/// When `Metaspace` puts a `▁` in front of a piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prepend {
    /// In front of every piece.
    Always,
    /// Only in front of the text's first piece (not after an added token).
    First,
    /// Never.
    Never,
}

/// One pre-tokenizer step: it maps each piece to smaller pieces.
#[derive(Clone, Debug)]
pub enum PreStep {
    /// Cuts at the matches of a pattern (`Split`, `Digits`, `Punctuation`, and llama.cpp's
    /// per-vocabulary pattern lists).
    Split {
        /// The pattern.
        regex: Regex,
        /// What becomes of the matches.
        behavior: Behavior,
        /// Whether the pattern describes the text between the pieces instead.
        invert: bool,
    },
    /// GPT-2's byte-level step: optionally a space in front, optionally GPT-2's pattern, then
    /// every byte becomes its printable stand-in character.
    ByteLevel {
        /// A space in front of a piece that does not start with one.
        add_prefix_space: bool,
        /// GPT-2's pattern, or no split.
        regex: Option<Regex>,
    },
    /// SentencePiece's spaces: ` ` becomes `▁`, a `▁` in front, and optionally a cut before
    /// each `▁`.
    Metaspace {
        /// The character standing for a space.
        replacement: char,
        /// When a leading replacement is added.
        prepend: Prepend,
        /// Whether to cut before each replacement.
        split: bool,
    },
}

/// The error of a pattern that failed on a text: past its backtracking bound, an
/// [`Error::PatternLimit`].
fn regex_failed(re: &Regex, e: fancy_regex::Error) -> Error {
    match e {
        fancy_regex::Error::RuntimeError(fancy_regex::RuntimeError::BacktrackLimitExceeded) => {
            Error::PatternLimit {
                pattern: re.as_str().to_string(),
                limit: BACKTRACK_LIMIT,
            }
        }
        e => Error::invalid(
            "tokenize",
            format!(
                "the tokenizer pattern {:?} gave up on this text ({e}); shorten runs of \
                 repeated characters",
                re.as_str()
            ),
        ),
    }
}

/// The spans `(start, end, matched)` of `text` in order, matches of `re` and the text between
/// them, empty spans left out.
fn spans(re: &Regex, text: &str) -> Result<Vec<(usize, usize, bool)>> {
    let mut out = Vec::new();
    let mut last = 0;
    for m in re.find_iter(text) {
        let m = m.map_err(|e| regex_failed(re, e))?;
        if m.start() == m.end() {
            continue;
        }
        if m.start() > last {
            out.push((last, m.start(), false));
        }
        out.push((m.start(), m.end(), true));
        last = m.end();
    }
    if last < text.len() {
        out.push((last, text.len(), false));
    }
    Ok(out)
}

/// Cuts `text` at the matches of `re` as `behavior` says.
fn split(re: &Regex, behavior: Behavior, invert: bool, text: &str) -> Result<Vec<String>> {
    let spans: Vec<(usize, usize, bool)> = spans(re, text)?
        .into_iter()
        .map(|(a, b, m)| (a, b, m != invert))
        .collect();
    let mut pieces: Vec<String> = Vec::new();
    match behavior {
        Behavior::Isolated => pieces.extend(spans.iter().map(|&(a, b, _)| text[a..b].to_string())),
        Behavior::Removed => pieces.extend(
            spans
                .iter()
                .filter(|s| !s.2)
                .map(|&(a, b, _)| text[a..b].to_string()),
        ),
        Behavior::Contiguous => {
            let mut prev_matched = None;
            for &(a, b, m) in &spans {
                match pieces.last_mut() {
                    Some(last) if m && prev_matched == Some(true) => last.push_str(&text[a..b]),
                    _ => pieces.push(text[a..b].to_string()),
                }
                prev_matched = Some(m);
            }
        }
        // As Hugging Face does it: a match joins its neighbour unless that neighbour is a
        // match itself.
        Behavior::MergedWithPrevious => {
            let mut prev_matched = false;
            for &(a, b, m) in &spans {
                match pieces.last_mut() {
                    Some(last) if m && !prev_matched => last.push_str(&text[a..b]),
                    _ => pieces.push(text[a..b].to_string()),
                }
                prev_matched = m;
            }
        }
        Behavior::MergedWithNext => {
            let mut next_matched = false;
            for &(a, b, m) in spans.iter().rev() {
                match pieces.last_mut() {
                    Some(last) if m && !next_matched => last.insert_str(0, &text[a..b]),
                    _ => pieces.push(text[a..b].to_string()),
                }
                next_matched = m;
            }
            pieces.reverse();
        }
    }
    Ok(pieces)
}

/// GPT-2's printable stand-ins for bytes: printable Latin-1 bytes stand for themselves, the
/// others map to code points from 256 up, in byte order.
pub fn byte_chars() -> [char; 256] {
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

impl PreStep {
    /// The pieces of one piece. `first` is true for the piece that starts the text (for
    /// `Metaspace`'s `First`); `bytes` is [`byte_chars`].
    pub fn apply(&self, piece: &str, first: bool, bytes: &[char; 256]) -> Result<Vec<String>> {
        match self {
            PreStep::Split {
                regex,
                behavior,
                invert,
            } => split(regex, *behavior, *invert, piece),
            PreStep::ByteLevel {
                add_prefix_space,
                regex,
            } => {
                let text = if *add_prefix_space && !piece.starts_with(' ') {
                    format!(" {piece}")
                } else {
                    piece.to_string()
                };
                let parts = match regex {
                    Some(re) => split(re, Behavior::Isolated, false, &text)?,
                    None => vec![text],
                };
                Ok(parts
                    .iter()
                    .map(|p| p.bytes().map(|b| bytes[b as usize]).collect())
                    .collect())
            }
            PreStep::Metaspace {
                replacement,
                prepend,
                split: cut,
            } => {
                let mut text: String = piece
                    .chars()
                    .map(|c| if c == ' ' { *replacement } else { c })
                    .collect();
                let add = match prepend {
                    Prepend::Always => true,
                    Prepend::First => first,
                    Prepend::Never => false,
                };
                if add && !text.starts_with(*replacement) {
                    text.insert(0, *replacement);
                }
                if !cut {
                    return Ok(vec![text]);
                }
                let mut pieces: Vec<String> = Vec::new();
                for c in text.chars() {
                    match pieces.last_mut() {
                        Some(last) if c != *replacement => last.push(c),
                        _ => pieces.push(c.to_string()),
                    }
                }
                Ok(pieces)
            }
        }
    }
}

/// Runs `steps` over a normalized text; `first` as in [`PreStep::apply`].
pub fn pre_tokenize(
    steps: &[PreStep],
    text: String,
    first: bool,
    bytes: &[char; 256],
) -> Result<Vec<String>> {
    let mut pieces = vec![text];
    for step in steps {
        let mut next = Vec::with_capacity(pieces.len());
        // Empty pieces are gone, as in `tokenizers` (an empty text gets no `▁`).
        for (i, p) in pieces.iter().enumerate().filter(|(_, p)| !p.is_empty()) {
            next.extend(step.apply(p, first && i == 0, bytes)?);
        }
        pieces = next;
    }
    pieces.retain(|p| !p.is_empty());
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2(text: &str) -> Vec<String> {
        split(
            &regex(GPT2_PATTERN, "test").unwrap(),
            Behavior::Isolated,
            false,
            text,
        )
        .unwrap()
    }

    /// Compiled patterns are reused, and files naming ever new patterns cannot grow the
    /// cache past its bound (other tests compile patterns too, in parallel).
    #[test]
    fn compiled_patterns_are_kept_within_a_bound() {
        regex(GPT2_PATTERN, "test").unwrap();
        let kept = |p: &str| COMPILED.lock().unwrap().iter().any(|(q, _)| q == p);
        assert!(kept(GPT2_PATTERN) || COMPILED.lock().unwrap().len() == CACHED_PATTERNS);
        for i in 0..2 * CACHED_PATTERNS {
            let p = format!("x{{{i}}}");
            let re = regex(&p, "test").unwrap();
            assert!(re.is_match(&"x".repeat(i)).unwrap());
        }
        assert!(COMPILED.lock().unwrap().len() <= CACHED_PATTERNS);
        assert!(regex("(", "test").is_err());
    }

    #[test]
    fn splits_like_gpt2() {
        assert_eq!(
            gpt2("Hello world's  3 apples!\n\nOK"),
            vec!["Hello", " world", "'s", " ", " 3", " apples", "!", "\n", "\n", "OK"]
        );
    }

    #[test]
    fn behaviors() {
        let re = regex("-", "test").unwrap();
        let run = |b| split(&re, b, false, "a-b--c").unwrap();
        assert_eq!(run(Behavior::Isolated), ["a", "-", "b", "-", "-", "c"]);
        assert_eq!(run(Behavior::Removed), ["a", "b", "c"]);
        assert_eq!(run(Behavior::Contiguous), ["a", "-", "b", "--", "c"]);
        assert_eq!(run(Behavior::MergedWithPrevious), ["a-", "b-", "-", "c"]);
        assert_eq!(run(Behavior::MergedWithNext), ["a", "-b", "-", "-c"]);
        assert_eq!(
            split(&re, Behavior::Isolated, true, "a-b").unwrap(),
            ["a", "-", "b"]
        );
    }

    #[test]
    fn metaspace_first_only_at_the_start() {
        let step = PreStep::Metaspace {
            replacement: SPACE_MARK,
            prepend: Prepend::First,
            split: true,
        };
        let b = byte_chars();
        assert_eq!(step.apply("a b", true, &b).unwrap(), ["▁a", "▁b"]);
        assert_eq!(step.apply("a b", false, &b).unwrap(), ["a", "▁b"]);
    }
}
