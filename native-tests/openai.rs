//! `webtensor serve --model` against the real OpenAI Python client (`openai` from PyPI,
//! installed by scripts/setup.sh): native-tests/openai_client.py runs the requests; this test
//! starts the server and computes what each completion must be, with `webtensor generate`
//! (one sequence, its own cache, tokens drawn on the device) for the same greedy prompts.
//!
//! Without the `openai` module the test prints why and passes, unless
//! `WEBTENSOR_REQUIRE_OPENAI=1` (set by scripts/test.sh) makes that a failure.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The context the server runs with (the built-in model's own is 256).
const CTX: usize = 48;
/// Sequences the server decodes at once.
const MAX_SEQ: usize = 8;

/// What `webtensor generate` writes greedily: the text after the prompt, and the prompt's
/// token count from its report.
fn generate(model: &Path, args: &[&str]) -> (String, usize) {
    let out = Command::new(env!("CARGO_BIN_EXE_webtensor"))
        .args(["generate", "--backend", "cpu", "--model"])
        .arg(model)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let prompt_tokens = err
        .split("prompt: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt count in {err}"));
    let text = String::from_utf8_lossy(&out.stdout);
    (
        text.strip_suffix('\n').unwrap_or(&text).to_string(),
        prompt_tokens,
    )
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

fn has_openai() -> bool {
    Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn the_openai_client_gets_batched_completions_equal_to_generate() {
    if !has_openai() {
        let why = "the `openai` Python package is missing (scripts/setup.sh installs it)";
        assert!(std::env::var("WEBTENSOR_REQUIRE_OPENAI").is_err(), "{why}");
        eprintln!("skipped: {why}");
        return;
    }
    let model = common::chat_model_dir("openai-chat-model");
    let mut completions = Vec::new();
    // Greedy ones, and a sampled one whose seeded numbers must match generate's token by token
    // (its parameters differ from the others', so the batch draws it apart).
    for (prompt, max_tokens, temperature, seed) in [
        ("In the beginning", 8, 0.0, 0),
        ("And God said", 12, 0.0, 0),
        ("Jesus wept", 5, 0.0, 0),
        ("The LORD is", 10, 0.9, 11),
    ] {
        let n = max_tokens.to_string();
        let (t, s) = (format!("{temperature}"), seed.to_string());
        let (text, prompt_tokens) = generate(
            &model,
            &[
                "--prompt",
                prompt,
                "--max-tokens",
                &n,
                "--temperature",
                &t,
                "--seed",
                &s,
            ],
        );
        let text = text
            .strip_prefix(prompt)
            .unwrap_or_else(|| panic!("{text:?} does not start with the prompt"))
            .to_string();
        completions.push(
            serde_json::json!({"prompt": prompt, "max_tokens": max_tokens,
            "temperature": temperature, "seed": seed, "text": text,
            "prompt_tokens": prompt_tokens}),
        );
    }
    let (chat_text, _) = generate(
        &model,
        &[
            "--chat",
            "--prompt",
            "Who made the light?",
            "--max-tokens",
            "6",
        ],
    );

    let mut child = Command::new(env!("CARGO_BIN_EXE_webtensor"))
        .args(["serve", "--port", "0", "--backend", "cpu", "--model"])
        .arg(&model)
        .args([
            "--ctx",
            &CTX.to_string(),
            "--max-sequences",
            &MAX_SEQ.to_string(),
            // No line: a request beyond the sequences is a 503 at once (the full-pool check).
            "--queue",
            "0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let base = line
        .split("OpenAI API at ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or_else(|| panic!("no API address in {line:?}"))
        .to_string();
    let case = serde_json::json!({
        "base_url": base,
        "model": "openai-chat-model",
        "ctx": CTX,
        "max_sequences": MAX_SEQ,
        "completions": completions,
        "chat": {"prompt": "Who made the light?", "max_tokens": 6, "text": chat_text},
    });
    let script =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("native-tests/openai_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(case.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // What no client library sends: each a complete JSON error with its status.
    let addr = base
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    for (request, status) in [
        ("POST /v1/completions HTTP/1.1\r\n\r\n".to_string(), "411"),
        (
            "POST /v1/completions HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n".to_string(),
            "413",
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nContent-Length: 8\r\n\r\nnot json".to_string(),
            "400",
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nContent-Length: 4\r\n\r\n[1]\n".to_string(),
            "400",
        ),
        ("GET /v1/completions HTTP/1.1\r\n\r\n".to_string(), "405"),
        ("GET /v1/nothing HTTP/1.1\r\n\r\n".to_string(), "404"),
    ] {
        let answer = ask(&addr, &request);
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{request:?}: {answer}"
        );
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{request:?}: not JSON ({e}): {answer}"));
        assert!(v["error"]["message"].is_string(), "{request:?}: {v}");
    }
    drop(server);
}

/// Sends `request` over a fresh connection and reads the whole answer.
fn ask(addr: &str, request: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}
