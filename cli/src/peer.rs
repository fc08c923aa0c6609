//! Peers timed in the same run as webtensor, through `benches/peers.py`:
//! - `bench --model PATH --peers`: llama.cpp on the same GGUF between webtensor's own samples
//!   (`--llama-cpp-sample`, llama-cpp-python);
//! - `bench --peers` (op rows): numpy on the exact shapes of the rows just timed (`--report`).

use std::path::{Path, PathBuf};
use std::process::Command;

use webtensor::bench::merge::{load_peers, PeerRow};
use webtensor::bench::BenchReport;
use webtensor::Error;
use webtensor_llm::bench::model::PeerSample;

/// The peers script: `$WEBTENSOR_PEERS_PY`, else this checkout's `benches/peers.py`, else
/// `benches/peers.py` under the working directory.
fn script() -> PathBuf {
    if let Some(path) = std::env::var_os("WEBTENSOR_PEERS_PY") {
        return path.into();
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/peers.py");
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

/// numpy timed on every row of `report` that `benches/peers.py` mirrors (matmul a·b and a·bᵀ,
/// rms_norm, causal softmax, silu), right after webtensor's own timings in the same run.
pub fn numpy(report: &BenchReport) -> Result<Vec<PeerRow>, Error> {
    let failed = |message: String| Error::Tool {
        part: "numpy peer",
        message,
    };
    let dir = std::env::temp_dir().join(format!("webtensor-numpy-peer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| failed(format!("{}: {e}", dir.display())))?;
    let (rows, peers) = (dir.join("report.json"), dir.join("peers.json"));
    let text = serde_json::to_string(report).map_err(|e| failed(e.to_string()))?;
    std::fs::write(&rows, text).map_err(|e| failed(format!("{}: {e}", rows.display())))?;
    let out = Command::new("python3")
        .arg(script())
        .arg("--report")
        .arg(&rows)
        .arg("-o")
        .arg(&peers)
        .output()
        .map_err(|e| failed(format!("could not run python3 {}: {e}", script().display())))?;
    let result = if out.status.success() {
        load_peers(&peers.to_string_lossy())
    } else {
        Err(failed(format!(
            "{} failed ({}): {}",
            script().display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    };
    // Best effort: a leftover temporary folder is harmless.
    let _ = std::fs::remove_dir_all(&dir);
    result
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
    if !out.status.success() {
        // A crash inside llama.cpp (e.g. an AMX build where the VM does not enable AMX: see
        // docs/benchmarks.md) leaves no JSON; say how the process ended instead.
        return Err(failed(format!(
            "the llama.cpp sample ({} --llama-cpp-sample) ended with {}: {}",
            script().display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
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
    Ok(PeerSample {
        name: format!("{name}, {threads} threads"),
        prompt_tokens_per_s: number("prompt_tokens_per_s")?,
        decode_tokens_per_s: number("decode_tokens_per_s")?,
        peak_rss_bytes: json.get("peak_rss_bytes").and_then(|v| v.as_u64()),
    })
}
