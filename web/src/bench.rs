//! The op benchmarks of `webtensor bench`, run in the page: the same harness and cases, and
//! the same JSON report (`BenchReport`, with its schema version), so browser and native runs
//! compare side by side.

use js_sys::Function;
use wasm_bindgen::prelude::*;
use webtensor::backend::{registry, BackendOptions};
use webtensor::bench::{self, BenchConfig, BenchReport, Size, SCHEMA_VERSION};
use webtensor::{BackendKind, OpKind};

use crate::error::{js, js_error, to_js_object};

/// What `runBenchmarks` times; every field is optional.
#[derive(serde::Deserialize, Default, tsify::Tsify)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct BenchOptions {
    /// Backends to time (default ["wgpu", "cpu"], those available).
    backends: Option<Vec<String>>,
    /// Op families (names as in `webtensor bench --ops`; default all).
    ops: Vec<String>,
    /// Timed samples per row (default 5; the median is reported).
    runs: Option<usize>,
    /// Minimum seconds per sample (default 0.02).
    min_sample_secs: Option<f64>,
    /// The options the backends run with, as `createDevice` takes them (`{ wgpu: { rowTeams:
    /// "on" } }`); the report lists them (`options`).
    options: BackendOptions,
}

/// The names of the op families the benchmark can time.
#[wasm_bindgen(js_name = benchOps)]
pub fn bench_ops() -> Vec<String> {
    OpKind::ALL.iter().map(|o| o.name().to_string()).collect()
}

/// Runs the op benchmarks (small shapes) and resolves with the report, the object
/// `webtensor bench --json` prints. `progress(done, total, label)` is called before each
/// step; the page stays responsive between steps. Without `backends` it times `wgpu` (when
/// the browser has WebGPU) and `cpu`; a named backend that is not available rejects.
#[wasm_bindgen(js_name = runBenchmarks, unchecked_return_type = "BenchReport")]
pub async fn run_benchmarks(
    #[wasm_bindgen(unchecked_optional_param_type = "BenchOptions | null")] options: JsValue,
    #[wasm_bindgen(
        unchecked_optional_param_type = "((done: number, total: number, label: string) => void) | null"
    )]
    progress: Option<Function>,
) -> Result<JsValue, JsValue> {
    let options: BenchOptions = if options.is_undefined() || options.is_null() {
        BenchOptions::default()
    } else {
        let text: String = js_sys::JSON::stringify(&options)?.into();
        serde_json::from_str(&text)
            .map_err(|e| js_error(format!("runBenchmarks: bad options: {e}")))?
    };
    let explicit = options.backends.is_some();
    let wanted = match options.backends {
        Some(names) => names
            .iter()
            .map(|n| BackendKind::parse(n))
            .collect::<webtensor::Result<Vec<_>>>(),
        None => Ok(vec![BackendKind::Wgpu, BackendKind::Cpu]),
    };
    let wanted = js(wanted)?;
    registry::start_async_with(&wanted, &options.options).await;
    // By default, skip what this browser cannot run (no WebGPU); a named backend must run.
    let backends = wanted
        .into_iter()
        .filter(|&k| explicit || registry::get_with(k, &options.options).is_ok())
        .collect();
    let ops = options
        .ops
        .iter()
        .map(|n| {
            OpKind::parse(n).ok_or_else(|| js_error(format!("runBenchmarks: unknown op `{n}`")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let defaults = BenchConfig::default();
    let config = BenchConfig {
        backends,
        ops,
        size: Size::Small,
        runs: options.runs.unwrap_or(defaults.runs),
        min_sample_secs: options.min_sample_secs.unwrap_or(defaults.min_sample_secs),
        options: options.options.clone(),
    };
    let report = bench::run_async(&config, |done, total, label| {
        if let Some(f) = &progress {
            let _ = f.call3(
                &JsValue::NULL,
                &JsValue::from(done as f64),
                &JsValue::from(total as f64),
                &JsValue::from_str(label),
            );
        }
    })
    .await;
    to_js_object(&js(report)?)
}

/// Each peer of `report` (numpy, llama.cpp: `report.peers`, from `webtensor bench --peers`)
/// next to the checked rows of the same op, case and shape, with how many times faster
/// webtensor is: the comparison `webtensor bench --report` draws, for a page to show.
#[wasm_bindgen(js_name = peerRatios, unchecked_return_type = "PeerRatio[]")]
pub fn peer_ratios(
    #[wasm_bindgen(unchecked_param_type = "BenchReport")] report: JsValue,
) -> Result<JsValue, JsValue> {
    let text: String = js_sys::JSON::stringify(&report)?.into();
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| js_error(format!("peerRatios: {e}")))?;
    let version = value.get("schema_version").and_then(|v| v.as_u64());
    if version != Some(u64::from(SCHEMA_VERSION)) {
        return Err(js_error(format!(
            "peerRatios: a report of schema version {version:?}, but this webtensor reads \
             version {SCHEMA_VERSION}; rerun `webtensor bench --json` to regenerate it"
        )));
    }
    let report: BenchReport = serde_json::from_value(value)
        .map_err(|e| js_error(format!("peerRatios: not a bench report: {e}")))?;
    to_js_object(&bench::merge::peer_ratios(&report))
}
