//! The runtime self-check of the kernel variants an adapter feature selects.
//!
//! Drivers have bugs that show only on their hardware, and no test machine has every adapter.
//! So before the backend is handed out, each variant chosen by a capability — the row-team
//! kernels reducing with `subgroupAdd`, the `shader-f16` products, the int8-activation
//! products through `dot4I8Packed`, the tiled prefill products on GPUs — runs on small inputs
//! and is compared with the reference backend. A variant that disagrees is demoted to its
//! portable twin (workgroup-memory reductions, `unpack2x16float`, `idot4` written out, the
//! row-dot kernel), and `webtensor info` says so.
//!
//! The verdict is cached on disk per adapter, driver, webtensor version and shader sources
//! (`$XDG_CACHE_HOME/webtensor/wgpu-selfcheck/`, else `~/.cache/...`), so later starts do not
//! run the checks again. The option `wgpu.self_check` ([`SelfCheck`]) turns it off, or makes
//! every variant disagree for the tests. Natively only: in the browser nothing may block, and wgpu offers no
//! subgroups there.

// In the browser only `Verdict` is used (`info` reads it); the checks run natively.
#![cfg_attr(target_arch = "wasm32", allow(dead_code))]

use std::hash::{Hash, Hasher};
use std::path::PathBuf;

use super::WgpuBackend;
use crate::backend::reference::ReferenceBackend;
use crate::backend::{Activations, Backend, HostData, MatmulSpec, OpSpec, SelfCheck, Storage};
use crate::dtype::DType;
use crate::error::Result;

/// A kernel variant an adapter feature selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Variant {
    /// Row-team reductions with `subgroupAdd` (`shaders/reduce/subgroup.wgsl`).
    Subgroups,
    /// f16 products on `array<f16>` storage (`shaders/quant_f16.wgsl`).
    NativeF16,
    /// Int8-activation decode products through `dot4I8Packed` (`shaders/dot4/builtin.wgsl`).
    IntDot,
    /// Prefill products with packed weights in 64 × 64 tiles (`mm_tiled` in
    /// `shaders/quant/`): 256-thread workgroups and 16 KiB of workgroup memory.
    TiledPrefill,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Subgroups => "subgroups",
            Variant::NativeF16 => "shader-f16",
            Variant::IntDot => "dot4I8Packed",
            Variant::TiledPrefill => "mm_tiled",
        }
    }
}

/// How one variant fared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It agreed with the reference (`cached`: the verdict came from the disk cache).
    Agreed { cached: bool },
    /// It disagreed and was demoted; the words say where.
    Demoted(String),
}

impl Verdict {
    /// The note `info` shows after the variant's description.
    pub(super) fn note(&self) -> String {
        match self {
            Verdict::Agreed { cached: false } => "self-check passed".into(),
            Verdict::Agreed { cached: true } => "self-check passed (cached)".into(),
            Verdict::Demoted(why) => format!("demoted by the self-check: {why}"),
        }
    }
}

/// Products that exercise `variant`: (what, spec, inputs as host data).
fn cases(variant: Variant) -> Vec<(String, OpSpec, Vec<HostData>)> {
    let values = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    };
    let packed = |format: DType, n: usize, k: usize| -> HostData {
        let w = values(n * k, 2);
        let mut bytes = vec![0u8; n * k / format.block_len() * format.block_bytes()];
        crate::quant::quantize(format, &w, &mut bytes);
        HostData::Bytes(format, bytes.into())
    };
    let product = |format: DType, activations: Activations, (m, n, k): (usize, usize, usize)| {
        let spec = OpSpec::QMatmul {
            format,
            activations,
            m,
            n,
            k,
        };
        let inputs = vec![HostData::F32(values(m * k, 1)), packed(format, n, k)];
        let what = format!("qmatmul {format} × {activations:?} {m}x{n}x{k}");
        (what, spec, inputs)
    };
    let qmatmul =
        |format: DType, m: usize, n: usize, k: usize| product(format, Activations::F32, (m, n, k));
    match variant {
        Variant::Subgroups => {
            let (m, n, k) = (2, 19, 192);
            let spec = OpSpec::Matmul(MatmulSpec {
                batch: 1,
                m,
                n,
                k,
                rhs_transposed: true,
                rhs_batched: false,
            });
            let inputs = vec![
                HostData::F32(values(m * k, 3)),
                HostData::F32(values(n * k, 4)),
            ];
            vec![
                (format!("matmul_t {m}x{n}x{k}"), spec, inputs),
                qmatmul(DType::Q4_0, 1, 11, 320),
                qmatmul(DType::Q8_0, 3, 9, 128),
                qmatmul(DType::F16, 1, 10, 256),
            ]
        }
        Variant::NativeF16 => vec![qmatmul(DType::F16, 9, 5, 96)],
        Variant::IntDot => vec![
            product(DType::Q4_0, Activations::Q8_0, (1, 13, 320)),
            product(DType::Q8_0, Activations::Q8_0, (1, 9, 128)),
            product(DType::Q8_0, Activations::I8, (1, 7, 96)),
        ],
        // Past one tile in both directions, with f32 and int8 activations.
        Variant::TiledPrefill => vec![
            qmatmul(DType::Q4_0, 67, 70, 64),
            product(DType::Q8_0, Activations::Q8_0, (9, 13, 128)),
        ],
    }
}

/// Runs `variant`'s cases on `backend` and the reference: `Ok(None)` when all agree, else
/// where they first disagree. `plant` adds 1 to the backend's results (the tests' hook).
fn run(backend: &WgpuBackend, variant: Variant, plant: bool) -> Result<Option<String>> {
    for (what, spec, inputs) in cases(variant) {
        let gpu: Vec<Storage> = inputs
            .iter()
            .map(|d| backend.upload(d.clone()))
            .collect::<Result<_>>()?;
        let host: Vec<Storage> = inputs
            .iter()
            .map(|d| ReferenceBackend.upload(d.clone()))
            .collect::<Result<_>>()?;
        let got = backend.download(&backend.execute(&spec, &gpu.iter().collect::<Vec<_>>())?)?;
        let want = ReferenceBackend
            .download(&ReferenceBackend.execute(&spec, &host.iter().collect::<Vec<_>>())?)?;
        let (Some(got), Some(want)) = (got.as_f32(), want.as_f32()) else {
            return Ok(Some(format!("{what} returned no f32 data")));
        };
        let shift = if plant { 1.0 } else { 0.0 };
        // The conformance tolerance of products: 1e-5·√k relative to the values' scale,
        // widened tenfold (the inputs are quantized, so both sides see the same weights).
        let tol = 1e-4 * 16.0;
        let worst = got
            .iter()
            .zip(want)
            .map(|(g, w)| ((g + shift) - w).abs() / w.abs().max(1.0))
            .fold(0f32, f32::max);
        if got.len() != want.len() || worst.is_nan() || worst > tol {
            return Ok(Some(format!(
                "{what} differs from the reference by {worst:e}"
            )));
        }
    }
    Ok(None)
}

/// The file caching `variant`'s verdict for this adapter and build, where a cache directory
/// is known.
fn cache_file(backend: &WgpuBackend, variant: Variant) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let a = &backend.ctx.adapter_info;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        &a.name,
        a.vendor,
        a.device,
        &a.driver,
        &a.driver_info,
        env!("CARGO_PKG_VERSION"),
        super::pipelines::sources_fingerprint(),
    )
        .hash(&mut h);
    Some(base.join("webtensor").join("wgpu-selfcheck").join(format!(
        "{}-{:016x}",
        variant.name(),
        h.finish()
    )))
}

/// Checks `variant` on `backend` (or reads the cached verdict) and returns it. A failure to
/// run the check at all counts as a disagreement: the portable kernel is the safe choice.
pub(super) fn check(backend: &WgpuBackend, variant: Variant) -> Verdict {
    let plant = backend.ctx.options.self_check == SelfCheck::Fail;
    let file = if plant {
        None
    } else {
        cache_file(backend, variant)
    };
    if let Some(cached) = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
        return match cached.strip_prefix("demoted: ") {
            Some(why) => Verdict::Demoted(why.trim().to_string()),
            None => Verdict::Agreed { cached: true },
        };
    }
    let verdict = match run(backend, variant, plant) {
        Ok(None) => Verdict::Agreed { cached: false },
        Ok(Some(why)) => Verdict::Demoted(why),
        Err(e) => Verdict::Demoted(format!("the check failed to run: {e}")),
    };
    if let Some(f) = file {
        let text = match &verdict {
            Verdict::Agreed { .. } => "agreed\n".to_string(),
            Verdict::Demoted(why) => format!("demoted: {why}\n"),
        };
        // A cache that cannot be written only costs the check at the next start.
        let _ = f
            .parent()
            .map(std::fs::create_dir_all)
            .and_then(|r| r.ok())
            .map(|_| std::fs::write(&f, text));
    }
    verdict
}

/// Whether the self-check is turned off ([`SelfCheck::Off`]).
pub(super) fn disabled(backend: &WgpuBackend) -> bool {
    backend.ctx.options.self_check == SelfCheck::Off
}
