//! Unit tests on small hand-made vocabularies; the real vocabularies are checked against the
//! reference implementations' ids in `native-tests/tokenizers.rs`.

use super::split::byte_chars;
use super::*;
use serde_json::json;

/// A byte-level vocabulary: every byte, "Ġt", "he", "Ġthe", and added tokens.
fn byte_level(extra: serde_json::Value) -> Tokenizer {
    let chars = byte_chars();
    let mut vocab: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    vocab.extend(["Ġt", "he", "Ġthe"].map(String::from));
    let mut j = json!({
        "model": {"type": "BPE", "vocab": vocab.iter().enumerate().map(|(i, p)| (p.clone(), json!(i))).collect::<serde_json::Map<_, _>>(),
                  "merges": ["Ġ t", "h e", "Ġt he"]},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [{"id": 259, "content": "<s>", "special": true},
                         {"id": 260, "content": "<tool>", "special": false}]
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        j[k] = v.clone();
    }
    Tokenizer::from_json(&j.to_string(), "test").unwrap()
}

#[test]
fn byte_level_merges_and_round_trips() {
    let t = byte_level(json!({}));
    let ids = t.encode("a the é").unwrap();
    assert_eq!(ids.len(), 1 + 1 + 1 + 2, "{ids:?}"); // "a", "Ġthe", "Ġ", two bytes of é
    assert_eq!(t.decode(&ids), "a the é");
}

#[test]
fn special_tokens_only_when_asked() {
    let t = byte_level(json!({}));
    assert_eq!(t.encode_with_special("<s>the").unwrap()[0], 259);
    let plain = t.encode("<s>the").unwrap();
    assert!(!plain.contains(&259), "{plain:?}");
    assert_eq!(t.decode(&plain), "<s>the");
    // Ordinary added tokens are always recognized and decode to their text.
    let ids = t.encode("a<tool>b").unwrap();
    assert_eq!(ids[1], 260);
    assert_eq!(t.decode(&ids), "a<tool>b");
    // Control tokens decode to nothing.
    assert_eq!(t.decode(&[259]), "");
}

#[test]
fn post_processor_gives_the_prefix() {
    assert_eq!(byte_level(json!({})).prefix(), None);
    let t = byte_level(json!({"post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [259], "tokens": ["<s>"]}}}}));
    assert_eq!(t.prefix(), Some(&[259u32][..]));
}

#[test]
fn streaming_holds_back_split_characters() {
    let t = byte_level(json!({}));
    let ids = t.encode("é").unwrap();
    assert_eq!(ids.len(), 2);
    let mut d = t.stream();
    assert_eq!(d.push(ids[0]), "");
    assert_eq!(d.push(ids[1]), "é");
    assert_eq!(d.finish(), "");
}

#[test]
fn huge_ids_are_errors_not_allocations() {
    for id in [
        json!(1u64 << 40),
        json!(u64::MAX),
        json!(1u64 << 25),
        json!(-1),
        json!(1.5),
    ] {
        let j = json!({"model": {"type": "BPE", "vocab": {"a": 0, "b": id}, "merges": []},
                       "decoder": {"type": "ByteLevel"}});
        let err = Tokenizer::from_json(&j.to_string(), "t.json").unwrap_err();
        assert!(err.to_string().contains("ids must be below"), "{err}");
    }
}

#[test]
fn unknown_components_are_named() {
    for (key, value, name) in [
        (
            "normalizer",
            json!({"type": "BertNormalizer"}),
            "BertNormalizer",
        ),
        ("pre_tokenizer", json!({"type": "Whitespace"}), "Whitespace"),
        ("decoder", json!({"type": "WordPiece"}), "WordPiece"),
        (
            "post_processor",
            json!({"type": "RobertaProcessing"}),
            "RobertaProcessing",
        ),
    ] {
        let mut j = json!({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                           "decoder": {"type": "ByteLevel"}});
        j[key] = value;
        let err = Tokenizer::from_json(&j.to_string(), "t.json").unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
    }
}

/// A SentencePiece-style `tokenizer.json` (Llama 2's layout).
fn sentencepiece() -> Tokenizer {
    let mut vocab = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    vocab.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    vocab.extend(["▁", "h", "i", "▁h", "▁hi", "w"].map(String::from));
    let j = json!({
        "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true,
                  "vocab": vocab.iter().enumerate().map(|(i, p)| (p.clone(), json!(i))).collect::<serde_json::Map<_, _>>(),
                  "merges": ["▁ h", "▁h i"]},
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "added_tokens": [{"id": 1, "content": "<s>", "special": true}]
    });
    Tokenizer::from_json(&j.to_string(), "test").unwrap()
}

#[test]
fn sentencepiece_byte_fallback_and_empty_text() {
    let t = sentencepiece();
    let ids = t.encode("hi ü").unwrap();
    assert_eq!(t.piece(ids[0]), Some("▁hi"));
    assert_eq!(t.decode(&ids), "hi ü");
    assert_eq!(t.decode(&[1]), "");
    assert_eq!(t.encode("").unwrap(), Vec::<u32>::new());
}

#[test]
fn streaming_keeps_the_space_before_a_continuation() {
    let t = sentencepiece();
    let ids = t.encode(" w").unwrap();
    assert_eq!(
        ids.iter().filter_map(|&i| t.piece(i)).collect::<Vec<_>>(),
        ["▁", "▁", "w"]
    );
    let w = t.encode("w").unwrap();
    let mut d = t.stream();
    // The generated "▁w" after a prompt keeps its space; only a whole decode drops it.
    let shown: String = w.iter().map(|&i| d.push(i)).collect();
    assert_eq!(shown, " w");
    assert_eq!(t.decode(&w), "w");
}

#[test]
fn context_check_comes_before_the_work() {
    let t = sentencepiece();
    let long = "h".repeat(100_000);
    match t.encode_limited(&long, false, 100) {
        Err(Error::CacheFull { capacity, .. }) => assert_eq!(capacity, 100),
        other => panic!("{other:?}"),
    }
    assert_eq!(t.encode_limited("hi", false, 100).unwrap().len(), 1);
}

#[test]
fn the_context_check_counts_spaces_as_sentencepiece_writes_them() {
    // "▁▁▁▁" is one token for 4 spaces: 12 bytes of normalized text. 400 spaces are 100
    // tokens, so a limit of 100 must not refuse them.
    let mut vocab = vec!["<unk>".to_string()];
    vocab.extend(["▁", "▁▁", "▁▁▁▁"].map(String::from));
    let j = json!({
        "model": {"type": "BPE", "unk_token": "<unk>",
                  "vocab": vocab.iter().enumerate().map(|(i, p)| (p.clone(), json!(i))).collect::<serde_json::Map<_, _>>(),
                  "merges": ["▁ ▁", "▁▁ ▁▁"]},
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"},
    });
    let t = Tokenizer::from_json(&j.to_string(), "test").unwrap();
    let ids = t.encode_limited(&" ".repeat(400), false, 100).unwrap();
    assert_eq!(ids, vec![3; 100]);
    assert!(t.encode_limited(&" ".repeat(404), false, 100).is_err());
}

fn gguf_vocab(extra: &[(&str, crate::gguf::GgufValue)]) -> crate::gguf::Gguf {
    use crate::gguf::{Gguf, GgufArray, GgufValue as V};
    let mut g = Gguf::default();
    let tokens = ["<unk>", "<s>", "</s>", "▁", "a", "▁a"];
    g.metadata.insert(
        "tokenizer.ggml.tokens".into(),
        V::Array(GgufArray::strings(tokens)),
    );
    g.metadata.insert(
        "tokenizer.ggml.token_type".into(),
        V::Array(GgufArray::i64s([2, 3, 3, 1, 1, 1])),
    );
    g.metadata
        .insert("tokenizer.ggml.bos_token_id".into(), V::U64(1));
    for (k, v) in extra {
        g.metadata.insert(k.to_string(), v.clone());
    }
    g
}

#[test]
fn gguf_flags_and_bad_metadata() {
    use crate::gguf::{GgufArray, GgufValue as V};
    let t = Tokenizer::from_gguf(&gguf_vocab(&[]), "t.gguf").unwrap();
    // SentencePiece: BOS by default, a space in front, nothing for empty text.
    assert_eq!(t.prefix(), Some(&[1u32][..]));
    assert_eq!(t.encode("a").unwrap(), vec![5]);
    assert_eq!(t.encode("").unwrap(), Vec::<u32>::new());
    let t = Tokenizer::from_gguf(
        &gguf_vocab(&[
            ("tokenizer.ggml.add_bos_token", V::Bool(false)),
            ("tokenizer.ggml.add_space_prefix", V::Bool(false)),
        ]),
        "t.gguf",
    )
    .unwrap();
    assert_eq!(t.prefix(), Some(&[][..]));
    assert_eq!(t.encode("a").unwrap(), vec![4]);
    for (key, value, says) in [
        (
            "tokenizer.ggml.token_type",
            V::Array(GgufArray::i64s([1])),
            "one per token",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            V::U64(1 << 40),
            "not a token id",
        ),
        ("tokenizer.ggml.model", V::Str("rwkv".into()), "\"rwkv\""),
    ] {
        let err = Tokenizer::from_gguf(&gguf_vocab(&[(key, value)]), "t.gguf").unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
    let err = Tokenizer::from_gguf(
        &gguf_vocab(&[
            ("tokenizer.ggml.model", V::Str("gpt2".into())),
            ("tokenizer.ggml.pre", V::Str("jais-9".into())),
        ]),
        "t.gguf",
    )
    .unwrap_err();
    assert!(err.to_string().contains("\"jais-9\""), "{err}");
}

/// Both readers build their merge ranks with `Merges::ranked`: a merge naming a piece outside
/// the vocabulary is an error naming the piece (as `tokenizers` refuses it), and so is a pair
/// listed twice (`tokenizers` keeps the last rank, llama.cpp the first).
#[test]
fn merges_naming_missing_pieces_or_repeated_are_errors() {
    use crate::gguf::{GgufArray, GgufValue as V};
    let vocab = json!({"a": 0, "b": 1, "ab": 2, "c": 3, "bc": 4});
    for (merges, says) in [
        (json!(["a b", "x b"]), "the piece \"x\""),
        (json!(["a b", "a c"]), "the piece \"ac\""),
        (
            json!([["b", "c"], ["a", "b"], ["b", "c"]]),
            "repeats merge 0",
        ),
    ] {
        let j = json!({"model": {"type": "BPE", "vocab": vocab, "merges": merges}});
        let err = Tokenizer::from_json(&j.to_string(), "t.json").unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
    let gpt2 = |merges: &[&str]| {
        gguf_vocab(&[
            ("tokenizer.ggml.model", V::Str("gpt2".into())),
            ("tokenizer.ggml.pre", V::Str("gpt-2".into())),
            (
                "tokenizer.ggml.merges",
                V::Array(GgufArray::strings(merges.iter().copied())),
            ),
        ])
    };
    assert!(Tokenizer::from_gguf(&gpt2(&["▁ a"]), "t.gguf").is_ok());
    for (merges, says) in [
        (&["▁ a", "a b"][..], "the piece \"b\""),
        (&["▁ a", "a ▁"][..], "the piece \"a▁\""),
        (&["▁ a", "▁ a"][..], "repeats merge 0"),
    ] {
        let err = Tokenizer::from_gguf(&gpt2(merges), "t.gguf").unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
}
