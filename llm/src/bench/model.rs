//! `webtensor bench --model`: a model's prefill and decode speed per backend, with decode's
//! weight traffic as a fraction of the copy bandwidth and of the shader read bandwidth measured
//! in the same run. A backend's row is reported only if its logits matched the reference
//! backend's in that run.
//!
//! The yardstick is the reference forward with f32 activations (the stored weights' exact
//! products). With integer activations the logits carry the activations' rounding, which a
//! many-layer model amplifies unevenly (a value that rounds the other way on one backend
//! changes everything after it), so they are held to a tolerance measured in the same run: twice
//! the reference's own rounding error (its integer-activation logits against its f32 ones).

use std::time::Instant;

use serde::Serialize;

use crate::generate::{decodes_ahead, DecodeBatches, MULTI_STEP};
use crate::{ActivationMode, Llama, ModelFiles, Sampler, Sampling};
use webtensor::backend::{
    registry, BackendKind, BackendOptions, BackendRef, DeviceClass, KernelProfile, RecordedWork,
};
use webtensor::bench::clock::thread_cpu_secs;
use webtensor::bench::{ceilings, Size};
use webtensor::device::Device;
use webtensor::error::{Error, Result};

/// One backend's figures for one model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelBenchRow {
    /// The backend.
    pub backend: BackendKind,
    /// The options it ran with (its own part of [`BackendOptions`], as `info` lists them).
    pub options: Vec<(String, String)>,
    /// The products the linear layers ran ([`Llama::activation_path`]).
    pub activations: String,
    /// Whether the prompt's logits matched the reference within `tolerance`.
    pub checked: bool,
    /// Largest difference from the reference's f32-activation logits.
    pub max_abs_error: f64,
    /// The tolerance: 1e-3 of the logits' scale, or with integer activations twice the
    /// reference's own rounding error if that is larger.
    pub tolerance: f64,
    /// Prompt tokens processed in one forward pass.
    pub prompt_tokens: usize,
    /// Prompt tokens per second (the median sample).
    pub prompt_tokens_per_s: Option<f64>,
    /// Every timed sample of prompt tokens per second, in run order.
    pub prompt_samples: Vec<f64>,
    /// Tokens decoded (greedy, drawn on the device, `MULTI_STEP` steps per submit and one
    /// readback of their ids).
    pub decode_tokens: usize,
    /// Decode tokens per second (the median sample).
    pub decode_tokens_per_s: Option<f64>,
    /// Every timed sample of decode tokens per second, in run order.
    pub decode_samples: Vec<f64>,
    /// Weight bytes a decode step reads (every matrix once).
    pub weight_bytes: u64,
    /// Decode weight bandwidth in GB/s.
    pub decode_weight_gb_per_s: Option<f64>,
    /// That bandwidth as a fraction of the backend's copy ceiling.
    pub frac_copy: Option<f64>,
    /// That bandwidth as a fraction of the backend's shader read ceiling, where it has one
    /// (see [`super::ceilings::Ceilings::read_gb_per_s`]).
    pub frac_read: Option<f64>,
    /// Kernel dispatches per decode step (sampling included), where the backend counts them.
    pub dispatches_per_token: Option<f64>,
    /// Submits to the device per decode step, where the backend counts them: below one when
    /// steps share a submit.
    pub submits_per_token: Option<f64>,
    /// CPU time of the thread that records and submits the decode, per token (the median
    /// sample), where the platform measures thread CPU time: what the host spends on a step
    /// whatever the device does meanwhile.
    pub host_ms_per_token: Option<f64>,
    /// That CPU time per kernel dispatch.
    pub host_us_per_dispatch: Option<f64>,
    /// Every timed sample's host CPU ms per decode token, in run order.
    pub host_samples: Vec<f64>,
    /// Whether the device runs no kernel (wgpu's noop device): its logits are not checked, and
    /// its rates time the host's side of each step alone.
    pub host_only: bool,
    /// Whether the decode replayed a step recorded at its first one
    /// ([`crate::KvCache::decode_is_replayed`]) rather than ran its ops.
    pub decode_replayed: bool,
    /// The most memory the process held resident from this backend's model load to its last
    /// sample, in bytes (Linux's `VmHWM`, restarted before the load; the file's mapped pages
    /// it touched included); `None` where the system does not say.
    pub peak_rss_bytes: Option<u64>,
    /// A peer timed on the same file between our samples, if one was asked for.
    pub peer: Option<PeerSamples>,
    /// GPU time per kernel of the last sample's decode, where the backend measures it (the
    /// wgpu backend with the option `wgpu.profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_profile: Option<DecodeProfile>,
    /// Why the backend's profiler, though asked for, measured nothing (e.g. an adapter
    /// without timestamp queries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_note: Option<String>,
}

/// The decode's GPU time per token, per kernel: from the backend's timestamp profiler.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeProfile {
    /// One row per kernel, the longest GPU time first.
    pub kernels: Vec<DecodeKernel>,
    /// GPU µs per token summed over every kernel: the time the GPU ran a kernel.
    pub busy_us_per_token: f64,
    /// GPU µs per token from each submit's first kernel's start to its last one's end
    /// (kernels plus the gaps between them).
    pub span_us_per_token: f64,
    /// Wall-clock µs per token of the same decode (slowed by the profiler's readbacks).
    pub wall_us_per_token: f64,
}

/// One kernel's share of a decode step.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeKernel {
    /// Shader file and entry point.
    pub kernel: String,
    /// Dispatches per token.
    pub dispatches_per_token: f64,
    /// GPU µs per token.
    pub gpu_us_per_token: f64,
    /// Fraction of the decode's summed kernel time.
    pub share: f64,
}

impl DecodeProfile {
    /// The per-token view of `profile`, measured over `tokens` decode tokens that took
    /// `wall_s` seconds.
    pub fn new(profile: &KernelProfile, tokens: usize, wall_s: f64) -> DecodeProfile {
        let tokens = tokens.max(1) as f64;
        let total = profile.kernel_ns();
        let mut kernels: Vec<DecodeKernel> = profile
            .kernels
            .iter()
            .map(|k| DecodeKernel {
                kernel: k.label.clone(),
                dispatches_per_token: k.dispatches as f64 / tokens,
                gpu_us_per_token: k.gpu_ns / 1e3 / tokens,
                share: if total > 0.0 { k.gpu_ns / total } else { 0.0 },
            })
            .collect();
        kernels.sort_by(|a, b| b.gpu_us_per_token.total_cmp(&a.gpu_us_per_token));
        DecodeProfile {
            kernels,
            busy_us_per_token: total / 1e3 / tokens,
            span_us_per_token: profile.span_ns / 1e3 / tokens,
            wall_us_per_token: wall_s * 1e6 / tokens,
        }
    }

    /// The profile as an aligned table, indented under its backend's row.
    pub fn table(&self) -> String {
        let mut out = format!(
            "  {:<44} {:>10} {:>10} {:>7}\n",
            "decode kernel", "disp/tok", "GPU µs/tok", "share"
        );
        for k in &self.kernels {
            out += &format!(
                "  {:<44} {:>10.1} {:>10.1} {:>6.1}%\n",
                k.kernel,
                k.dispatches_per_token,
                k.gpu_us_per_token,
                k.share * 100.0
            );
        }
        out += &format!(
            "  GPU busy {:.1} µs/token (sum of kernels), submit spans {:.1} µs/token, of {:.1} \
             µs/token wall\n",
            self.busy_us_per_token, self.span_us_per_token, self.wall_us_per_token
        );
        out
    }
}

/// One peer's timings on the same model file, taken alternately with webtensor's.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PeerSamples {
    /// The peer and its version, e.g. `llama.cpp (llama-cpp-python 0.3.16)`.
    pub name: String,
    /// Prompt tokens per second, one per sample.
    pub prompt_samples: Vec<f64>,
    /// Decode tokens per second, one per sample.
    pub decode_samples: Vec<f64>,
    /// The most memory a sample's process held resident (its whole process: the
    /// interpreter and its libraries included), over the samples; `None` where not measured.
    pub peak_rss_bytes: Option<u64>,
}

/// One timed sample of a peer.
#[derive(Clone, Debug)]
pub struct PeerSample {
    /// The peer and its version.
    pub name: String,
    /// Prompt tokens per second.
    pub prompt_tokens_per_s: f64,
    /// Decode tokens per second.
    pub decode_tokens_per_s: f64,
    /// The sample's process's peak resident memory, where it says.
    pub peak_rss_bytes: Option<u64>,
}

/// Bytes of the matrices a decode step reads: every stored tensor but an untied embedding.
fn weight_bytes(files: &ModelFiles) -> u64 {
    let embed = ["model.embed_tokens.weight", "token_embd.weight"];
    files
        .tensors
        .iter()
        .filter(|(name, _)| files.config.tie_word_embeddings || !embed.contains(&name.as_str()))
        .map(|(_, (_, t))| t.range.len() as u64)
        .sum()
}

/// Times the model `open()` returns on each backend: its logits checked once, then `samples`
/// timed prompt passes and decodes, each followed by one sample of `peer` (run on the same
/// file with the same prompt and decode lengths) when given, so that both see the same
/// machine load. The backends run with `options`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    open: &dyn Fn() -> Result<ModelFiles>,
    backends: &[BackendKind],
    (prompt_tokens, decode_tokens): (usize, usize),
    activations: ActivationMode,
    options: &BackendOptions,
    samples: usize,
    peer: Option<&dyn Fn(usize, usize) -> Result<PeerSample>>,
    mut progress: impl FnMut(&str),
) -> Result<Vec<ModelBenchRow>> {
    let files = open()?;
    let vocab = files.config.vocab_size as u32;
    let context = files.config.context_len();
    let prompt_tokens = prompt_tokens.clamp(1, context.saturating_sub(decode_tokens).max(1));
    let decode_tokens = decode_tokens.min(context - prompt_tokens);
    let bytes = weight_bytes(&files);
    let prompt: Vec<u32> = (0..prompt_tokens as u32)
        .map(|i| (i * 7919 + 1) % vocab)
        .collect();
    // The reference's logits, computed for the first backend that runs kernels.
    let mut files = Some(files);
    let mut yardstick: Option<(Vec<f32>, f64)> = None;
    let mut rows = Vec::new();
    for &kind in backends {
        let backend =
            registry::get_with(kind, options).map_err(|reason| Error::BackendUnavailable {
                backend: kind,
                reason,
            })?;
        let host_only = backend.info().class == DeviceClass::Noop;
        if yardstick.is_none() && !host_only {
            progress("reference logits");
            let files = match files.take() {
                Some(f) => f,
                None => open()?,
            };
            yardstick = Some(reference_logits(files, &prompt, activations)?);
        }
        progress(&format!("{kind}: ceilings"));
        let ceilings = ceilings::measure(&backend, Size::Small)?;
        let device = Device::builder()
            .priority(vec![kind])
            .options(options.clone())
            .build()?;
        // This backend's peak alone: not the reference's pass nor the ceilings' buffers.
        let peak_measured = webtensor::memory::reset_peak_resident();
        let mut model = Llama::load(&device, open()?)?;
        model.set_activations(activations);
        progress(&format!("{kind}: prompt"));
        let mut cache = model.new_cache(prompt_tokens + decode_tokens)?;
        // A warm-up pass compiles pipelines and fills pools, then the timed passes.
        let got: Vec<f32> = model.forward(&prompt, &mut cache)?.to_vec()?;
        let (want, tolerance) = match (&yardstick, host_only) {
            (Some((want, tolerance)), false) => (want.as_slice(), *tolerance),
            _ => (&[][..], 0.0),
        };
        let max_abs_error = max_difference(&got, want);
        let mut row = ModelBenchRow {
            backend: kind,
            options: backend.info().options,
            activations: model.activation_path(),
            checked: !host_only && got.len() == want.len() && max_abs_error <= tolerance,
            max_abs_error,
            tolerance,
            prompt_tokens,
            prompt_tokens_per_s: None,
            prompt_samples: Vec::new(),
            decode_tokens,
            decode_tokens_per_s: None,
            decode_samples: Vec::new(),
            weight_bytes: bytes,
            decode_weight_gb_per_s: None,
            frac_copy: None,
            frac_read: None,
            dispatches_per_token: None,
            submits_per_token: None,
            host_ms_per_token: None,
            host_us_per_dispatch: None,
            host_samples: Vec::new(),
            host_only,
            decode_replayed: false,
            peak_rss_bytes: None,
            peer: None,
            decode_profile: None,
            profile_note: None,
        };
        if row.checked || host_only {
            for i in 0..samples.max(1) {
                progress(&format!("{kind}: sample {}", i + 1));
                cache.reset();
                let timed = time_once(&model, &prompt, decode_tokens, &mut cache, &backend)?;
                row.prompt_samples.push(timed.prompt_rate);
                row.decode_samples.extend(timed.decode_rate);
                let per_token = |n: u64| n as f64 / decode_tokens.max(1) as f64;
                row.dispatches_per_token = timed.work.map(|w| per_token(w.dispatches));
                row.submits_per_token = timed.work.map(|w| per_token(w.submits));
                row.decode_replayed = cache.decode_is_replayed();
                if let Some(secs) = timed.host_cpu_secs {
                    row.host_samples
                        .push(secs * 1e3 / decode_tokens.max(1) as f64);
                }
                if let Some(profile) = &timed.profile {
                    let wall_s = timed
                        .decode_rate
                        .map_or(0.0, |rate| decode_tokens as f64 / rate);
                    row.decode_profile = Some(DecodeProfile::new(profile, decode_tokens, wall_s));
                }
                if let Some(peer) = peer {
                    let sample = peer(prompt_tokens, decode_tokens)?;
                    let samples = row.peer.get_or_insert_with(PeerSamples::default);
                    samples.name = sample.name;
                    samples.prompt_samples.push(sample.prompt_tokens_per_s);
                    samples.decode_samples.push(sample.decode_tokens_per_s);
                    samples.peak_rss_bytes = samples.peak_rss_bytes.max(sample.peak_rss_bytes);
                }
            }
            let profiler = backend.info().profiler;
            if row.decode_profile.is_none() && !profiler.is_empty() {
                row.profile_note = Some(profiler);
            }
            row.prompt_tokens_per_s = median(&row.prompt_samples);
            row.decode_tokens_per_s = median(&row.decode_samples);
            row.host_ms_per_token = median(&row.host_samples);
            row.host_us_per_dispatch = row
                .host_ms_per_token
                .zip(row.dispatches_per_token)
                .filter(|&(_, d)| d > 0.0)
                .map(|(ms, d)| ms * 1e3 / d);
            // A device that reads no weights has no weight bandwidth.
            if let Some(rate) = row.decode_tokens_per_s.filter(|_| !host_only) {
                let gb = bytes as f64 * rate / 1e9;
                row.decode_weight_gb_per_s = Some(gb);
                row.frac_copy = Some(gb / ceilings.copy_gb_per_s);
                row.frac_read = ceilings.read_gb_per_s.map(|read| gb / read);
            }
        }
        row.peak_rss_bytes = webtensor::memory::peak_resident().filter(|_| peak_measured);
        rows.push(row);
    }
    Ok(rows)
}

/// The reference backend's logits of `prompt` with f32 activations, and the tolerance a
/// backend's logits are held to: 1e-3 of their scale, or with integer activations twice the
/// reference's own rounding error when that is larger.
fn reference_logits(
    files: ModelFiles,
    prompt: &[u32],
    activations: ActivationMode,
) -> Result<(Vec<f32>, f64)> {
    let mut reference = Llama::load(&Device::reference(), files)?;
    reference.set_activations(ActivationMode::F32);
    let want: Vec<f32> = reference.logits(prompt)?.to_vec()?;
    let scale = want.iter().fold(1f64, |m, v| m.max(v.abs() as f64));
    let mut tolerance = 1e-3 * scale;
    if activations != ActivationMode::F32 {
        reference.set_activations(activations);
        let rounded: Vec<f32> = reference.logits(prompt)?.to_vec()?;
        tolerance = tolerance.max(2.0 * max_difference(&rounded, &want));
    }
    Ok((want, tolerance))
}

/// What one [`time_once`] measured.
struct Timed {
    prompt_rate: f64,
    /// Decode tokens/s, if any were asked for.
    decode_rate: Option<f64>,
    /// The decode's kernel dispatches and submits, where the backend counts them.
    work: Option<RecordedWork>,
    /// CPU seconds of this thread during the decode, where the platform tells.
    host_cpu_secs: Option<f64>,
    /// The decode's GPU time per kernel, where the backend measures it.
    profile: Option<KernelProfile>,
}

/// One timed prompt pass and decode from an empty `cache` on `backend` (the model's primary
/// backend). Greedy, drawn on the device as `generate` does: the prompt's token read back,
/// then decode steps recorded MULTI_STEP per submit, each batch's ids read back (on a hardware
/// GPU through wgpu while the next batch runs: [`DecodeBatches`]).
fn time_once(
    model: &Llama,
    prompt: &[u32],
    decode_tokens: usize,
    cache: &mut crate::KvCache,
    backend: &BackendRef,
) -> Result<Timed> {
    let mut sampler = Sampler::new(Sampling::greedy());
    let start = Instant::now();
    let mut next = model.sample_next(prompt, cache, &mut sampler)?;
    let prompt_rate = prompt.len() as f64 / start.elapsed().as_secs_f64();
    let before = backend.recorded_work();
    let profile_before = backend.kernel_profile();
    let start = Instant::now();
    let cpu_start = thread_cpu_secs();
    let ahead = decodes_ahead(model.device());
    let mut batches = DecodeBatches::new(MULTI_STEP, ahead, decode_tokens);
    while let Some(ids) = pollster::block_on(batches.next(model, next, cache, &mut sampler))? {
        next = ids.last().copied().unwrap_or(next);
    }
    let decode_rate =
        (decode_tokens > 0).then(|| decode_tokens as f64 / start.elapsed().as_secs_f64());
    let host_cpu_secs = thread_cpu_secs()
        .zip(cpu_start)
        .map(|(end, start)| end - start);
    let work = backend
        .recorded_work()
        .zip(before)
        .map(|(after, before)| after.since(before));
    let profile = backend
        .kernel_profile()
        .zip(profile_before)
        .map(|(after, before)| after.since(&before));
    Ok(Timed {
        prompt_rate,
        decode_rate,
        work,
        host_cpu_secs,
        profile,
    })
}

/// The median of `v` (the upper one of an even count), `None` when empty.
pub(crate) fn median(v: &[f64]) -> Option<f64> {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied()
}

/// `min/median/max` of samples, with `digits` decimals.
pub(crate) fn spread(v: &[f64], digits: usize) -> String {
    match (
        v.iter().copied().reduce(f64::min),
        median(v),
        v.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(mid), Some(hi)) if v.len() > 1 => {
            format!("{lo:.digits$}/{mid:.digits$}/{hi:.digits$}")
        }
        (_, Some(mid), _) => format!("{mid:.digits$}"),
        _ => "-".into(),
    }
}

/// The largest elementwise difference.
pub(crate) fn max_difference(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0f64, f64::max)
}

/// The rows as an aligned table: min/median/max of the samples when there are several, then
/// each row's peer and the ratio of the medians (webtensor / peer, above 1 is faster).
pub fn table(model: &str, rows: &[ModelBenchRow]) -> String {
    let opt = |v: Option<f64>, p: usize| v.map_or("-".into(), |v| format!("{v:.p$}"));
    let megabytes = |b: Option<u64>| b.map_or("-".into(), |b| format!("{:.0} MB", b as f64 / 1e6));
    let paths: Vec<&str> = rows.iter().map(|r| r.activations.as_str()).collect();
    let line = |c: [&str; 15]| {
        format!(
            "{:<10} {:>6} {:>20} {:>6} {:>20} {:>12} {:>7} {:>7} {:>12} {:>10} {:>6} {:>11} \
             {:>12} {:>9}  {}\n",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            c[7],
            c[8],
            c[9],
            c[10],
            c[11],
            c[12],
            c[13],
            c[14]
        )
    };
    let mut out = format!("{model} ({})\n", paths.first().copied().unwrap_or(""));
    out += &line([
        "backend",
        "prompt",
        "prompt tok/s",
        "decode",
        "decode tok/s",
        "weights GB/s",
        "% copy",
        "% read",
        "dispatch/tok",
        "submit/tok",
        "replay",
        "host ms/tok",
        "host µs/disp",
        "peak RSS",
        "check",
    ]);
    for r in rows {
        let check = if r.host_only {
            "none: the device runs no kernel (noop); the rates time the host alone".to_string()
        } else if r.checked {
            format!("ok ({:.1e} ≤ {:.1e})", r.max_abs_error, r.tolerance)
        } else {
            format!(
                "FAILED: logits differ from the reference by {:.3e} (tolerance {:.3e})",
                r.max_abs_error, r.tolerance
            )
        };
        let percent = |f: Option<f64>| f.map_or("-".into(), |f| format!("{:.1}%", f * 100.0));
        out += &line([
            r.backend.name(),
            &r.prompt_tokens.to_string(),
            &spread(&r.prompt_samples, 1),
            &r.decode_tokens.to_string(),
            &spread(&r.decode_samples, 1),
            &opt(r.decode_weight_gb_per_s, 3),
            &percent(r.frac_copy),
            &percent(r.frac_read),
            &opt(r.dispatches_per_token, 1),
            &opt(r.submits_per_token, 2),
            if r.decode_replayed { "yes" } else { "no" },
            &opt(r.host_ms_per_token, 3),
            &opt(r.host_us_per_dispatch, 2),
            &megabytes(r.peak_rss_bytes),
            &check,
        ]);
        if let Some(peer) = &r.peer {
            let ratio = |ours: &[f64], theirs: &[f64]| match (median(ours), median(theirs)) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
                _ => "-".into(),
            };
            out += &line([
                "  peer",
                "",
                &spread(&peer.prompt_samples, 1),
                "",
                &spread(&peer.decode_samples, 1),
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                &megabytes(peer.peak_rss_bytes),
                &peer.name,
            ]);
            out += &line([
                "  ratio",
                "",
                &ratio(&r.prompt_samples, &peer.prompt_samples),
                "",
                &ratio(&r.decode_samples, &peer.decode_samples),
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                &match (r.peak_rss_bytes, peer.peak_rss_bytes) {
                    (Some(a), Some(b)) if b > 0 => format!("{:.2}×", a as f64 / b as f64),
                    _ => "-".into(),
                },
                "webtensor / peer: medians; peak RSS, below 1 is less",
            ]);
        }
        if let Some(profile) = &r.decode_profile {
            out += &profile.table();
        }
        if let Some(note) = &r.profile_note {
            out += &format!("  profiler: {note}\n");
        }
        if !r.options.is_empty() {
            let pairs: Vec<String> = r.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out += &format!("  options: {}\n", pairs.join(" "));
        }
    }
    out
}
