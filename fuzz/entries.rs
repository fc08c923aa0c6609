//! The entry points the fuzz targets drive (`fuzz/fuzz_targets/*.rs`, libFuzzer on nightly)
//! and `native-tests/fuzz_replay.rs` replays on stable from the committed corpora and crash
//! reproducers: each takes arbitrary bytes, runs what webtensor runs on a file, a prompt or a
//! request, and must return without panicking, whatever the bytes.

#![allow(dead_code)]

use std::sync::OnceLock;

use webtensor_llm::{files, gguf, safetensors, FileBytes, LlamaConfig, ModelFiles, Tokenizer};

#[path = "../cli/src/http.rs"]
mod http;

/// An entry point: arbitrary bytes in, nothing out (it must return).
pub type Entry = fn(&[u8]);

/// Every target by name, for the replay.
pub const TARGETS: [(&str, Entry); 6] = [
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("config", config),
    ("tokenizer", tokenizer),
    ("encode", encode),
    ("http", http),
];

/// A GGUF file: the reader, then the config and vocabulary from its metadata.
pub fn gguf(data: &[u8]) {
    if gguf::parse("fuzz.gguf", data).is_ok() {
        let _ = ModelFiles::from_gguf("fuzz.gguf", FileBytes::Owned(data.to_vec()));
    }
}

/// A safetensors file (first byte even) or a `model.safetensors.index.json` (odd).
pub fn safetensors(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    if selector % 2 == 0 {
        let _ = safetensors::parse("fuzz.safetensors", rest);
    } else if let Ok(text) = std::str::from_utf8(rest) {
        let _ = files::shard_names(text, "fuzz.index.json");
    }
}

/// A `config.json`.
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = LlamaConfig::from_json(text, "fuzz.config.json");
    }
}

/// A `tokenizer.json`, then the text after its first NUL byte encoded and decoded with it.
pub fn tokenizer(data: &[u8]) {
    let (json, text) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(json) = std::str::from_utf8(json) else {
        return;
    };
    if let Ok(t) = Tokenizer::from_json(json, "fuzz.tokenizer.json") {
        let text = String::from_utf8_lossy(text);
        for special in [false, true] {
            if let Ok(ids) = t.encode_limited(&text, special, usize::MAX) {
                let _ = t.decode(&ids);
            }
        }
    }
}

/// Arbitrary text through the built-in model's tokenizer: encode, then decode (which runs the
/// streaming decoder over every id).
pub fn encode(data: &[u8]) {
    static BUILTIN: OnceLock<Option<Tokenizer>> = OnceLock::new();
    let tokenizer = BUILTIN.get_or_init(|| {
        webtensor_llm::builtin::files()
            .ok()
            .and_then(|f| f.tokenizer)
    });
    let Some(t) = tokenizer else { return };
    let text = String::from_utf8_lossy(data);
    let Ok(ids) = t.encode(&text) else { return };
    let _ = t.decode(&ids);
}

/// What `webtensor serve` does with the bytes a client sends before it touches the file
/// system: the bytes arrive as a client connection (then the client's end of file) on hyper's
/// HTTP/1.1 connection as the server configures it (`http::connection`), whose requests are
/// read as the server reads them (method, decoded path, a POST's body within its limits) and
/// mapped to a served folder; the answer is read back to the end. A runtime of one thread is
/// made once; a connection still open after a second (which none should be) is dropped.
pub fn http(data: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a tokio runtime")
    });
    runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let serve = http::connection(server, |request| async move {
            let status = match http::read_request(&request) {
                Ok(target) => {
                    let _ = http::split_path(&target.path);
                    match target.method {
                        "POST" => http::read_body(request).await.err(),
                        _ => None,
                    }
                }
                Err(status) => Some(status),
            };
            http::refusal(status.unwrap_or(http::Status::Ok))
        });
        let talk = async {
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            let mut answer = Vec::new();
            let _ = client.read_to_end(&mut answer).await;
        };
        let both = async { tokio::join!(serve, talk) };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), both).await;
    });
}
