//! Reading reports back, merging reports from several machines, and attaching peer timings.
//!
//! `webtensor bench --report DIR` writes `report.json` (a [`BenchReport`]). Reports written
//! on other machines (another GPU vendor, another CPU) merge into one cross-vendor report:
//! rows keep their backend and device name, and each machine's ceilings come along. Peer
//! timings (`benches/peers.py`: numpy per op, llama.cpp decode) are read from their own JSON
//! file and compared to the webtensor rows of the same op, case and shape.

use serde::{Deserialize, Serialize};

use super::{BenchReport, SCHEMA_VERSION};
use crate::error::{Error, Result};

/// One peer measurement, taken on the same machine as the webtensor rows it is compared to.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct PeerRow {
    /// The peer and its version, e.g. `numpy 2.4.6` or `llama.cpp (llama-cpp-python 0.3.16)`.
    pub peer: String,
    /// The op name as webtensor prints it (`matmul`, `rms_norm`, ...) or `decode`.
    pub op: String,
    /// The case label of the webtensor row it mirrors (or the model for `decode`).
    pub case: String,
    /// The input shapes of the webtensor row it mirrors (empty for `decode`).
    #[serde(default)]
    pub shape: String,
    /// The machine (CPU model) the peer ran on.
    #[serde(default)]
    pub machine: String,
    /// Median time per op in microseconds (op peers).
    #[serde(default)]
    pub median_us: Option<f64>,
    /// Decode tokens per second of the peer (`decode`).
    #[serde(default)]
    pub tokens_per_s: Option<f64>,
    /// webtensor's decode tokens per second on the same model, timed in the same run.
    #[serde(default)]
    pub webtensor_tokens_per_s: Option<f64>,
    /// The backend webtensor's decode ran on.
    #[serde(default)]
    pub webtensor_backend: Option<String>,
    /// For `decode`: the largest difference between the peer's and webtensor's logits on the
    /// same prompt (the check that both ran the same model).
    #[serde(default)]
    pub max_logit_error: Option<f64>,
}

/// The file `benches/peers.py` writes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeersFile {
    /// The machine (CPU model) the peers ran on.
    #[serde(default)]
    pub machine: String,
    /// The measurements.
    pub peers: Vec<PeerRow>,
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })
}

fn bad_file(path: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        source_name: path.to_string(),
        reason: reason.into(),
    }
}

/// Reads a `report.json`; reports of another schema version are refused.
pub fn load_report(path: &str) -> Result<BenchReport> {
    let text = read(path)?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad_file(path, format!("not JSON: {e}")))?;
    let version = value.get("schema_version").and_then(|v| v.as_u64());
    if version != Some(SCHEMA_VERSION as u64) {
        return Err(bad_file(
            path,
            format!(
                "schema version {version:?}, but this webtensor reads version {SCHEMA_VERSION}; \
                 rerun `webtensor bench --report` to regenerate it"
            ),
        ));
    }
    serde_json::from_value(value).map_err(|e| bad_file(path, format!("not a bench report: {e}")))
}

/// Reads a peers file; every row without a machine gets the file's.
pub fn load_peers(path: &str) -> Result<Vec<PeerRow>> {
    let file: PeersFile = serde_json::from_str(&read(path)?)
        .map_err(|e| bad_file(path, format!("not a peers file from benches/peers.py: {e}")))?;
    Ok(file
        .peers
        .into_iter()
        .map(|mut p| {
            if p.machine.is_empty() {
                p.machine = file.machine.clone();
            }
            p
        })
        .collect())
}

/// One report holding every backend, row and peer of `reports` (in order). A backend seen
/// twice (same kind and device) keeps its first ceilings.
pub fn merge(reports: Vec<BenchReport>) -> Result<BenchReport> {
    let mut iter = reports.into_iter();
    let mut out = iter
        .next()
        .ok_or_else(|| Error::invalid("bench --merge", "no reports to merge"))?;
    for r in iter {
        for b in r.backends {
            let seen = out
                .backends
                .iter()
                .any(|o| o.info.kind == b.info.kind && o.info.device_name == b.info.device_name);
            if !seen {
                out.backends.push(b);
            }
        }
        out.rows.extend(r.rows);
        for p in r.peers {
            if !out.peers.contains(&p) {
                out.peers.push(p);
            }
        }
    }
    Ok(out)
}

/// A peer next to the webtensor row it mirrors: `speedup` is peer time / webtensor time
/// (above 1: webtensor is faster), or webtensor tokens/s / peer tokens/s for `decode`.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct PeerRatio {
    /// The peer measurement.
    pub peer: PeerRow,
    /// `backend · device` of the webtensor side.
    pub webtensor: String,
    /// webtensor's figure (µs per op, or tokens/s).
    pub webtensor_value: f64,
    /// The peer's figure in the same unit.
    pub peer_value: f64,
    /// How many times faster webtensor is.
    pub speedup: f64,
}

/// Every peer paired with each checked webtensor row of the same op, case and shape.
pub fn peer_ratios(report: &BenchReport) -> Vec<PeerRatio> {
    let mut out = Vec::new();
    for p in &report.peers {
        if let (Some(tps), Some(wt)) = (p.tokens_per_s, p.webtensor_tokens_per_s) {
            if tps > 0.0 {
                out.push(PeerRatio {
                    peer: p.clone(),
                    webtensor: format!(
                        "{} · {}",
                        p.webtensor_backend.as_deref().unwrap_or("?"),
                        p.machine
                    ),
                    webtensor_value: wt,
                    peer_value: tps,
                    speedup: wt / tps,
                });
            }
            continue;
        }
        let Some(peer_us) = p.median_us else { continue };
        for r in &report.rows {
            let same = r.op.name() == p.op && r.case == p.case && r.shape == p.shape;
            if let (true, true, Some(us)) = (same, r.checked, r.median_us) {
                out.push(PeerRatio {
                    peer: p.clone(),
                    webtensor: format!("{} · {}", r.backend, r.device),
                    webtensor_value: us,
                    peer_value: peer_us,
                    speedup: peer_us / us,
                });
            }
        }
    }
    out
}
