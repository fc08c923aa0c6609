//! `bench --model PATH --peers`: llama.cpp timed on the same GGUF between webtensor's own
//! samples, through `benches/peers.py --llama-cpp-sample` (llama-cpp-python).

use std::path::{Path, PathBuf};
use std::process::Command;

use webtensor::bench::model::PeerSample;
use webtensor::Error;

/// The peers script: `$WEBTENSOR_PEERS_PY`, else this checkout's `benches/peers.py`, else
/// `benches/peers.py` under the working directory.
fn script() -> PathBuf {
    if let Some(path) = std::env::var_os("WEBTENSOR_PEERS_PY") {
        return path.into();
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers.py");
    if built.exists() {
        built
    } else {
        PathBuf::from("benches/peers.py")
    }
}

fn failed(message: String) -> Error {
    Error::Tool {
        part: "llama.cpp peer",
        message,
    }
}

/// One llama.cpp sample on `model` (a .gguf file) with `threads` threads.
pub fn llama_cpp(
    model: &Path,
    threads: usize,
    prompt_tokens: usize,
    decode_tokens: usize,
) -> Result<PeerSample, Error> {
    let out = Command::new("python3")
        .arg(script())
        .arg("--llama-cpp-sample")
        .arg("--gguf")
        .arg(model)
        .args(["--threads", &threads.to_string()])
        .args(["--prompt-tokens", &prompt_tokens.to_string()])
        .args(["--decode-tokens", &decode_tokens.to_string()])
        .output()
        .map_err(|e| failed(format!("could not run python3 {}: {e}", script().display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(text.trim()).map_err(|e| {
        failed(format!(
            "{} printed no JSON ({e}): {}{}",
            script().display(),
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })?;
    if let Some(error) = json.get("error").and_then(|e| e.as_str()) {
        return Err(failed(error.to_string()));
    }
    let number = |key: &str| {
        json.get(key)
            .and_then(|v| v.as_f64())
            .ok_or_else(|| failed(format!("the peer's JSON has no `{key}`: {json}")))
    };
    let name = json
        .get("peer")
        .and_then(|v| v.as_str())
        .unwrap_or("llama.cpp");
    Ok((
        format!("{name}, {threads} threads"),
        number("prompt_tokens_per_s")?,
        number("decode_tokens_per_s")?,
    ))
}
