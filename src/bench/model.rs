//! `webtensor bench --model`: a model's prefill and decode speed per backend, with decode's
//! weight traffic as a fraction of the copy bandwidth measured in the same run. A backend's
//! row is reported only if its logits matched the reference backend's in that run.

use std::time::Instant;

use serde::Serialize;

use super::{ceilings, Size};
use crate::backend::{registry, BackendKind};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::model::generate::MULTI_STEP;
use crate::model::{Llama, ModelFiles, Sampler, Sampling};

/// One backend's figures for one model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelBenchRow {
    /// The backend.
    pub backend: BackendKind,
    /// Whether the prompt's logits matched the reference within 1e-3 (relative to their scale).
    pub checked: bool,
    /// Largest difference from the reference logits.
    pub max_abs_error: f64,
    /// Prompt tokens processed in one forward pass.
    pub prompt_tokens: usize,
    /// Prompt tokens per second.
    pub prompt_tokens_per_s: Option<f64>,
    /// Tokens decoded one at a time (greedy, argmax on the device, one id read back each).
    pub decode_tokens: usize,
    /// Decode tokens per second.
    pub decode_tokens_per_s: Option<f64>,
    /// Weight bytes a decode step reads (every matrix once).
    pub weight_bytes: u64,
    /// Decode weight bandwidth in GB/s.
    pub decode_weight_gb_per_s: Option<f64>,
    /// That bandwidth as a fraction of the backend's copy ceiling.
    pub frac_copy: Option<f64>,
    /// Kernel dispatches per decode step (sampling included), where the backend counts them.
    pub dispatches_per_token: Option<f64>,
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

/// Times the model `open()` returns on each backend.
pub fn run(
    open: &dyn Fn() -> Result<ModelFiles>,
    backends: &[BackendKind],
    prompt_tokens: usize,
    decode_tokens: usize,
    mut progress: impl FnMut(&str),
) -> Result<Vec<ModelBenchRow>> {
    let files = open()?;
    let vocab = files.config.vocab_size as u32;
    let context = files.config.max_position_embeddings;
    let prompt_tokens = prompt_tokens.clamp(1, context.saturating_sub(decode_tokens).max(1));
    let decode_tokens = decode_tokens.min(context - prompt_tokens);
    let bytes = weight_bytes(&files);
    let prompt: Vec<u32> = (0..prompt_tokens as u32)
        .map(|i| (i * 7919 + 1) % vocab)
        .collect();
    progress("reference logits");
    let reference = Llama::load(&Device::reference(), files)?;
    let want: Vec<f32> = reference.logits(&prompt)?.to_vec()?;
    let scale = want.iter().fold(1f64, |m, v| m.max(v.abs() as f64));
    let mut rows = Vec::new();
    for &kind in backends {
        let backend = registry::get(kind).map_err(|reason| Error::BackendUnavailable {
            backend: kind.name().into(),
            reason,
        })?;
        progress(&format!("{kind}: ceilings"));
        let copy = ceilings::measure(&backend, Size::Small)?.copy_gb_per_s;
        let device = Device::builder().priority(vec![kind]).build()?;
        let model = Llama::load(&device, open()?)?;
        progress(&format!("{kind}: prompt"));
        let mut cache = model.new_cache(prompt_tokens + decode_tokens)?;
        // A warm-up pass compiles pipelines and fills pools, then the timed passes.
        let got: Vec<f32> = model.forward(&prompt, &mut cache)?.to_vec()?;
        let max_abs_error = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - *b as f64).abs())
            .fold(0f64, f64::max);
        let mut row = ModelBenchRow {
            backend: kind,
            checked: got.len() == want.len() && max_abs_error <= 1e-3 * scale,
            max_abs_error,
            prompt_tokens,
            prompt_tokens_per_s: None,
            decode_tokens,
            decode_tokens_per_s: None,
            weight_bytes: bytes,
            decode_weight_gb_per_s: None,
            frac_copy: None,
            dispatches_per_token: None,
        };
        if row.checked {
            cache.reset();
            // Greedy, drawn on the device as `generate` does: the prompt's token read back,
            // then decode steps recorded MULTI_STEP per submit.
            let mut sampler = Sampler::new(Sampling::greedy());
            let start = Instant::now();
            let mut next = model.sample_next(&prompt, &mut cache, &mut sampler)?;
            row.prompt_tokens_per_s = Some(prompt_tokens as f64 / start.elapsed().as_secs_f64());
            progress(&format!("{kind}: decode"));
            let dispatches = backend.dispatches();
            let start = Instant::now();
            let mut left = decode_tokens;
            while left > 0 {
                let steps = left.min(MULTI_STEP);
                let ids = model.decode(next, &mut cache, steps, &mut sampler)?;
                next = ids.last().copied().unwrap_or(next);
                left -= steps;
            }
            let per_token = start.elapsed().as_secs_f64() / decode_tokens.max(1) as f64;
            if decode_tokens > 0 {
                let gb = bytes as f64 / per_token / 1e9;
                row.decode_tokens_per_s = Some(1.0 / per_token);
                row.decode_weight_gb_per_s = Some(gb);
                row.frac_copy = Some(gb / copy);
                row.dispatches_per_token = backend
                    .dispatches()
                    .zip(dispatches)
                    .map(|(after, before)| (after - before) as f64 / decode_tokens as f64);
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The rows as an aligned table.
pub fn table(model: &str, rows: &[ModelBenchRow]) -> String {
    let opt = |v: Option<f64>, p: usize| v.map_or("-".into(), |v| format!("{v:.p$}"));
    let mut out = format!(
        "{model}\n{:<10} {:>8} {:>12} {:>8} {:>12} {:>14} {:>8} {:>11}  check\n",
        "backend",
        "prompt",
        "prompt tok/s",
        "decode",
        "decode tok/s",
        "weights GB/s",
        "% copy",
        "dispatch/tok"
    );
    for r in rows {
        out += &format!(
            "{:<10} {:>8} {:>12} {:>8} {:>12} {:>14} {:>8} {:>11}  {}\n",
            r.backend.name(),
            r.prompt_tokens,
            opt(r.prompt_tokens_per_s, 1),
            r.decode_tokens,
            opt(r.decode_tokens_per_s, 1),
            opt(r.decode_weight_gb_per_s, 3),
            r.frac_copy
                .map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
            opt(r.dispatches_per_token, 1),
            if r.checked {
                "ok".to_string()
            } else {
                format!(
                    "FAILED: logits differ from the reference by {:.3e}",
                    r.max_abs_error
                )
            }
        );
    }
    out
}
