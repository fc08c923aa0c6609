//! The op benchmarks of `webtensor bench`, run in the page: the same harness and cases, and
//! the same JSON report (`BenchReport`, with its schema version), so browser and native runs
//! compare side by side.

use js_sys::Function;
use wasm_bindgen::prelude::*;
use webtensor::backend::registry;
use webtensor::bench::{self, BenchConfig, Size};
use webtensor::{BackendKind, OpKind};

use crate::error::{js, js_error, to_js_object};

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &'static str = r#"
/** What `runBenchmarks` times; every field is optional. */
export interface BenchOptions {
  /** Backends to time (default ["wgpu", "cpu"], those available). */
  backends?: string[];
  /** Op families (names as in `webtensor bench --ops`; default all). */
  ops?: string[];
  /** Timed samples per row (default 5; the median is reported). */
  runs?: number;
  /** Minimum seconds per sample (default 0.02). */
  minSampleSecs?: number;
}

/** The report of `webtensor bench --json` (src/bench/mod.rs `BenchReport`). */
export interface BenchReport {
  schema_version: number;
  webtensor_version: string;
  size: string;
  backends: { info: Record<string, unknown>; ceilings: { copy_gb_per_s: number; copy_bytes: number; fma_gflop_per_s: number | null } }[];
  rows: {
    op: string; case: string; shape: string; backend: string; checked: boolean;
    median_us: number | null; min_us: number | null; bytes: number; flops: number; elements: number;
    gb_per_s: number | null; gflop_per_s: number | null; melem_per_s: number | null;
    frac_copy: number | null; frac_peak: number | null; error: string | null;
  }[];
}
"#;

#[derive(serde::Deserialize, Default)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
struct Options {
    backends: Option<Vec<String>>,
    ops: Vec<String>,
    runs: Option<usize>,
    min_sample_secs: Option<f64>,
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
    #[wasm_bindgen(unchecked_param_type = "BenchOptions | undefined")] options: JsValue,
    #[wasm_bindgen(unchecked_param_type = "(done: number, total: number, label: string) => void")]
    progress: Option<Function>,
) -> Result<JsValue, JsValue> {
    let options: Options = if options.is_undefined() || options.is_null() {
        Options::default()
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
    registry::start_async(&wanted).await;
    // By default, skip what this browser cannot run (no WebGPU); a named backend must run.
    let backends = wanted
        .into_iter()
        .filter(|&k| explicit || registry::get(k).is_ok())
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
