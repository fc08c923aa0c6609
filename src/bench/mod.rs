//! The benchmark harness behind `webtensor bench`.
//!
//! Every op family is timed on each chosen backend at a decode-like and a prefill-like shape.
//! Work on a GPU is recorded lazily, so a sample records `iters` ops and then waits for the
//! device ([`crate::Device::synchronize`]) before the clock stops. Each row's output is checked
//! once against the reference backend; a row that fails the check reports no speed. Figures
//! are stated against ceilings measured in the same run ([`ceilings`]): the backend's copy
//! bandwidth and, on the cpu, its FMA peak. The result serialises to JSON with a schema
//! version, so runs from different machines (and, later, the browser) can be compared.

pub mod cases;
pub mod ceilings;
pub mod clock;
pub mod merge;
pub mod report;
mod timing;

use serde::{Deserialize, Serialize};

use crate::backend::{registry, BackendInfo, BackendKind, BackendOptions, OpKind};
use crate::device::Device;
use crate::error::{Error, Result};
pub use ceilings::Ceilings;

/// Version of the JSON schema of [`BenchReport`].
/// 3: rows name their device, peers (numpy, llama.cpp) ride along, reports deserialise.
pub const SCHEMA_VERSION: u32 = 3;

/// Problem sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub enum Size {
    /// Small shapes that finish in seconds, even on a software GPU.
    Small,
    /// Shapes of a 7B-class model layer (4096 hidden, 11008 feed-forward).
    Medium,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Backends to time.
    pub backends: Vec<BackendKind>,
    /// Op families to time; empty means all.
    pub ops: Vec<OpKind>,
    /// Problem sizes.
    pub size: Size,
    /// Timed samples per row (the median is reported).
    pub runs: usize,
    /// Minimum duration of one sample in seconds; iterations are chosen to reach it.
    pub min_sample_secs: f64,
    /// The options the backends run with.
    pub options: BackendOptions,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            backends: vec![],
            ops: vec![],
            size: Size::Small,
            runs: 5,
            min_sample_secs: 0.02,
            options: BackendOptions::default(),
        }
    }
}

/// One timed op on one backend.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct BenchRow {
    /// The op family.
    pub op: OpKind,
    /// A short description of the case (`decode`, `prefill`, layout).
    pub case: String,
    /// The input shapes.
    pub shape: String,
    /// The backend.
    pub backend: BackendKind,
    /// The backend's device (adapter or CPU model), so rows of merged reports from
    /// different machines stay apart.
    pub device: String,
    /// Whether the output matched the reference in this run.
    pub checked: bool,
    /// Whether the device refused to run the case (a limit of the device, not a wrong
    /// answer); `error` gives its reason.
    #[serde(default)]
    pub refused: bool,
    /// Median time per op in microseconds (absent when the check failed).
    pub median_us: Option<f64>,
    /// Fastest sample in microseconds.
    pub min_us: Option<f64>,
    /// Bytes read and written per op.
    pub bytes: u64,
    /// Floating-point operations per op (0 where not meaningful).
    pub flops: u64,
    /// Elements processed per op, for ops measured in elements/s (scans; 0 otherwise).
    pub elements: u64,
    /// Achieved bandwidth in GB/s.
    pub gb_per_s: Option<f64>,
    /// Achieved GFLOP/s (matmul only).
    pub gflop_per_s: Option<f64>,
    /// Millions of elements per second (scans only).
    pub melem_per_s: Option<f64>,
    /// Bandwidth as a fraction of the backend's copy ceiling.
    pub frac_copy: Option<f64>,
    /// Bandwidth as a fraction of the backend's shader read ceiling, where it has one (wgpu):
    /// on software adapters the copy is the driver's memcpy, several times what any shader
    /// streams, so this is the fraction a kernel can approach there.
    #[serde(default)]
    pub frac_read: Option<f64>,
    /// GFLOP/s as a fraction of the backend's FMA peak, where one was measured.
    pub frac_peak: Option<f64>,
    /// Why the row has no figures, if it has none: the check's mismatch or the device's refusal.
    pub error: Option<String>,
}

impl BenchRow {
    /// The row of a case the device refused to run, with the device's reason.
    fn refused_by(mut self, reason: Error) -> BenchRow {
        self.refused = true;
        self.error = Some(reason.to_string());
        self
    }

    /// Whether the row is a wrong answer: the bench then ends with an error.
    pub fn failed(&self) -> bool {
        !self.checked && !self.refused
    }

    /// The check column: `ok`, or why the row has no figures (a refusal or a mismatch).
    pub fn verdict(&self) -> String {
        let why = self.error.as_deref().unwrap_or("");
        if self.checked {
            "ok".into()
        } else if self.refused {
            format!("not run: {why}")
        } else {
            format!("FAILED: {why}")
        }
    }
}

/// One backend's identity and ceilings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct BackendCeilings {
    /// Identity of the backend (adapter or CPU, driver, features).
    pub info: BackendInfo,
    /// Ceilings measured in this run.
    pub ceilings: Ceilings,
}

/// A whole benchmark run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct BenchReport {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// webtensor's version.
    pub webtensor_version: String,
    /// Problem sizes used.
    pub size: Size,
    /// Per backend: identity and ceilings.
    pub backends: Vec<BackendCeilings>,
    /// The timed rows.
    pub rows: Vec<BenchRow>,
    /// Peers timed side by side on the same machines (`benches/peers.py`), if merged in.
    #[serde(default)]
    pub peers: Vec<merge::PeerRow>,
    /// The options the backends ran with (each backend's `info` lists its own part too).
    #[serde(default)]
    pub options: BackendOptions,
}

/// Runs the benchmark (blocking; see [`run_async`]).
#[cfg(not(target_arch = "wasm32"))]
pub fn run(config: &BenchConfig, progress: impl FnMut(usize, usize, &str)) -> Result<BenchReport> {
    pollster::block_on(run_async(config, progress))
}

/// Runs the benchmark. `progress(done, total, label)` is called before each step. Waiting for
/// a device never blocks, and in the browser the page's event loop runs between steps, so
/// this is the form a web page uses; [`run`] blocks on it natively.
pub async fn run_async(
    config: &BenchConfig,
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<BenchReport> {
    let cases: Vec<_> = cases::all(config.size)
        .into_iter()
        .filter(|c| config.ops.is_empty() || config.ops.contains(&c.op))
        .collect();
    let total = config.backends.len() * (cases.len() + 1);
    let mut step = 0;
    let mut backends = Vec::new();
    let mut rows = Vec::new();
    let reference = Device::reference();
    let mut expected = Vec::with_capacity(cases.len());
    for c in &cases {
        expected.push(c.expected(&reference).await?);
    }
    for &kind in &config.backends {
        let backend = registry::get_with(kind, &config.options).map_err(|reason| {
            crate::Error::BackendUnavailable {
                backend: kind,
                reason,
            }
        })?;
        progress(step, total, &format!("{kind}: ceilings"));
        clock::pause().await;
        step += 1;
        let ceilings = ceilings::measure_async(&backend, config.size).await?;
        let device = Device::builder()
            .priority(vec![kind])
            .strict(true)
            .options(config.options.clone())
            .build()?;
        for (case, want) in cases.iter().zip(&expected) {
            progress(step, total, &format!("{kind}: {} {}", case.op, case.label));
            clock::pause().await;
            step += 1;
            rows.push(timing::time_case(&device, case, want, &ceilings, config).await?);
        }
        backends.push(BackendCeilings {
            info: backend.info(),
            ceilings,
        });
    }
    progress(total, total, "done");
    Ok(BenchReport {
        schema_version: SCHEMA_VERSION,
        webtensor_version: env!("CARGO_PKG_VERSION").into(),
        size: config.size,
        backends,
        rows,
        peers: Vec::new(),
        options: config.options.clone(),
    })
}
