//! `webtensor bench --model PATH --tp 1,2,4`: decode speed of a model split over 1, 2, 4, ...
//! separate devices of each backend, with the time the collective took broken out (waiting
//! for the ranks' queued work, and moving and adding the partial sums). A row is timed only if
//! the split model's prompt logits match the unsplit model's on the same backend within 1e-3
//! of their scale.

use serde::Serialize;

use super::model::{max_difference, median, spread};
use crate::generate::MULTI_STEP;
use crate::tensor_parallel::devices_of;
use crate::{
    ActivationMode, CollectiveStats, KvCache, Llama, ModelFiles, Sampler, Sampling, TpConfig,
};
use webtensor::backend::{BackendKind, BackendOptions};
use webtensor::error::Result;

/// One backend at one tp size.
#[derive(Clone, Debug, Serialize)]
pub struct TpBenchRow {
    /// The backend of every rank.
    pub backend: BackendKind,
    /// Ranks (devices).
    pub tp: usize,
    /// The collective's name.
    pub collective: String,
    /// Whether the prompt logits matched the unsplit model's.
    pub checked: bool,
    /// Largest difference from the unsplit model's prompt logits.
    pub max_abs_error: f64,
    /// Tokens decoded per sample.
    pub decode_tokens: usize,
    /// Decode tokens per second, one per sample, in run order.
    pub decode_samples: Vec<f64>,
    /// The median sample.
    pub decode_tokens_per_s: Option<f64>,
    /// Collective calls per decoded token.
    pub collective_calls_per_token: Option<f64>,
    /// Milliseconds per decoded token spent waiting for the ranks before an exchange.
    pub wait_ms_per_token: Option<f64>,
    /// Milliseconds per decoded token spent moving and adding the partial sums.
    pub all_reduce_ms_per_token: Option<f64>,
}

/// Times decode on each backend of `backends` split over each size of `sizes`.
pub fn run(
    open: &dyn Fn() -> Result<ModelFiles>,
    backends: &[BackendKind],
    sizes: &[usize],
    (prompt_tokens, decode_tokens): (usize, usize),
    (activations, options): (ActivationMode, &BackendOptions),
    samples: usize,
    mut progress: impl FnMut(&str),
) -> Result<Vec<TpBenchRow>> {
    let files = open()?;
    let vocab = files.config.vocab_size as u32;
    let context = files.config.context_len();
    let prompt_tokens = prompt_tokens.clamp(1, context.saturating_sub(decode_tokens).max(1));
    let decode_tokens = decode_tokens.min(context - prompt_tokens);
    let prompt: Vec<u32> = (0..prompt_tokens as u32)
        .map(|i| (i * 7919 + 1) % vocab)
        .collect();
    let mut rows = Vec::new();
    for &kind in backends {
        let mut want: Option<Vec<f32>> = None;
        for &size in sizes {
            progress(&format!("{kind} tp {size}: load"));
            let devices = devices_of(kind, size, options)?;
            let mut model = Llama::load_parallel(&devices, open()?, TpConfig { size })?;
            model.set_activations(activations);
            let mut cache = model.new_cache(prompt_tokens + decode_tokens)?;
            let got: Vec<f32> = model.forward(&prompt, &mut cache)?.to_vec()?;
            let want = want.get_or_insert_with(|| got.clone());
            let scale = want.iter().fold(1f64, |m, v| m.max(v.abs() as f64));
            let max_abs_error = max_difference(&got, want);
            let (collective, _) = model.collective_stats();
            let mut row = TpBenchRow {
                backend: kind,
                tp: size,
                collective: collective.to_string(),
                checked: got.len() == want.len() && max_abs_error <= 1e-3 * scale,
                max_abs_error,
                decode_tokens,
                decode_samples: Vec::new(),
                decode_tokens_per_s: None,
                collective_calls_per_token: None,
                wait_ms_per_token: None,
                all_reduce_ms_per_token: None,
            };
            if row.checked && decode_tokens > 0 {
                let mut spent = CollectiveStats::default();
                for i in 0..samples.max(1) {
                    progress(&format!("{kind} tp {size}: sample {}", i + 1));
                    cache.reset();
                    let (rate, stats) = time_decode(&model, &prompt, decode_tokens, &mut cache)?;
                    row.decode_samples.push(rate);
                    spent.calls += stats.calls;
                    spent.wait += stats.wait;
                    spent.transfer += stats.transfer;
                }
                let tokens = (decode_tokens * samples.max(1)) as f64;
                let per_token = |d: std::time::Duration| d.as_secs_f64() * 1e3 / tokens;
                row.collective_calls_per_token = Some(spent.calls as f64 / tokens);
                row.wait_ms_per_token = Some(per_token(spent.wait));
                row.all_reduce_ms_per_token = Some(per_token(spent.transfer));
                row.decode_tokens_per_s = median(&row.decode_samples);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// One greedy decode of `decode_tokens` after the prompt (drawn on the device,
/// [`MULTI_STEP`] steps per readback, as `generate` does): decode tokens/s and the
/// collective's time during the decode alone.
fn time_decode(
    model: &Llama,
    prompt: &[u32],
    decode_tokens: usize,
    cache: &mut KvCache,
) -> Result<(f64, CollectiveStats)> {
    let mut sampler = Sampler::new(Sampling::greedy());
    let mut next = model.sample_next(prompt, cache, &mut sampler)?;
    let before = model.collective_stats().1;
    let start = std::time::Instant::now();
    let mut left = decode_tokens;
    while left > 0 {
        let steps = left.min(MULTI_STEP);
        let ids = model.decode(next, cache, steps, &mut sampler)?;
        next = ids.last().copied().unwrap_or(next);
        left -= steps;
    }
    let rate = decode_tokens as f64 / start.elapsed().as_secs_f64();
    let after = model.collective_stats().1;
    let spent = CollectiveStats {
        calls: after.calls - before.calls,
        wait: after.wait - before.wait,
        transfer: after.transfer - before.transfer,
    };
    Ok((rate, spent))
}

/// The rows as an aligned table.
pub fn table(model: &str, rows: &[TpBenchRow]) -> String {
    let opt = |v: Option<f64>, p: usize| v.map_or("-".into(), |v| format!("{v:.p$}"));
    let line = |c: [&str; 8]| {
        format!(
            "{:<10} {:>3} {:>20} {:>10} {:>12} {:>14} {:>10}  {}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
        )
    };
    let mut out = format!("{model}: tensor parallel decode\n");
    out += &line([
        "backend",
        "tp",
        "decode tok/s",
        "calls/tok",
        "wait ms/tok",
        "reduce ms/tok",
        "collective",
        "check",
    ]);
    for r in rows {
        let check = if r.checked {
            format!("ok ({:.1e})", r.max_abs_error)
        } else {
            format!("FAILED: {:.3e} from the unsplit logits", r.max_abs_error)
        };
        out += &line([
            r.backend.name(),
            &r.tp.to_string(),
            &spread(&r.decode_samples, 1),
            &opt(r.collective_calls_per_token, 1),
            &opt(r.wait_ms_per_token, 3),
            &opt(r.all_reduce_ms_per_token, 3),
            &r.collective,
            &check,
        ]);
    }
    out
}
