//! The browser page's generation loop, natively: a model generates greedily after a prompt of
//! a given length with the page's pacing (`Pacing::for_device`, prompt chunks sized to a
//! quarter second, decode batches to the token latency), and each run prints its prompt and
//! decode tokens/s, the gaps between the tokens handed out (median and max), and the CPU time
//! the process spent. On SwiftShader natively it stands in for the page's wgpu path in
//! headless Chromium (`web/bench/chromium.mjs`), whose prompt runs in chunks of four tokens
//! where `webtensor bench --model` runs it in one pass. Runs alternate between the devices
//! given, so a change in the machine's load hits each alike.
//!
//! ```text
//! VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json WGPU_BACKEND=vulkan \
//!   cargo run --release -p webtensor-llm --example page_generate -- MODEL.gguf [PROMPT_TOKENS [TOKENS [RUNS [BACKENDS]]]]
//! ```
//!
//! PROMPT_TOKENS defaults to 432, TOKENS (generated) to 16, RUNS to 3, BACKENDS (comma-separated)
//! to `wgpu`. `PAGE_CHUNK=N` runs the prompt in chunks of N tokens instead of timed ones;
//! `PAGE_BATCHES=whole` decodes in batches of `steps_per_submit` (8 on wgpu) instead of batches
//! sized to the token latency.
use std::future::Future;
use std::time::Instant;

use webtensor::Device;
use webtensor_llm::generate::{self, Checkpoint, Observer, Pacing, PromptChunks};
use webtensor_llm::{GenerationStats, Llama, ModelFiles, PromptCache, Sampling};

/// Times each piece's arrival.
struct Clock {
    start: Instant,
    arrivals: Vec<f64>,
    /// Prompt tokens run after each prompt chunk.
    chunks: Vec<usize>,
}

impl Observer for Clock {
    fn text(&mut self, _: &str, _: &GenerationStats) {
        self.arrivals.push(self.start.elapsed().as_secs_f64());
    }

    fn checkpoint(&mut self, at: Checkpoint) -> impl Future<Output = bool> {
        if let Checkpoint::Prompt { done, .. } = at {
            self.chunks.push(done);
        }
        std::future::ready(false)
    }
}

/// User plus system CPU seconds of this process (all its threads: the adapter's workers too).
fn cpu_secs() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage for the call to fill.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> webtensor::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args
        .first()
        .expect("usage: page_generate MODEL.gguf [PROMPT_TOKENS [TOKENS [RUNS [BACKENDS]]]]");
    let arg = |i: usize, default: usize| {
        args.get(i)
            .map_or(default, |s| s.parse().expect("a number"))
    };
    let (prompt_tokens, tokens, runs) = (arg(1, 432), arg(2, 16), arg(3, 3));
    let backends = args.get(4).map_or("wgpu", String::as_str);
    let chunks = match std::env::var("PAGE_CHUNK") {
        Ok(n) => PromptChunks::Tokens(n.parse().expect("PAGE_CHUNK: a number")),
        Err(_) => PromptChunks::Seconds(0.25),
    };
    let models: Vec<(String, Llama)> = backends
        .split(',')
        .map(|b| {
            let device = Device::new(b)?;
            let llama = Llama::load(&device, ModelFiles::open(std::path::Path::new(model))?)?;
            Ok((b.to_string(), llama))
        })
        .collect::<webtensor::Result<_>>()?;
    for round in 0..=runs {
        for (name, llama) in &models {
            let tokenizer = llama.tokenizer.clone().expect("a tokenizer");
            // Token ids of the vocabulary's middle, one per position: a prompt of exactly
            // `prompt_tokens` (the first run is a warm-up of a short prompt).
            let len = if round == 0 { 8 } else { prompt_tokens };
            let ids: Vec<u32> = (0..len as u32).map(|i| 1000 + i % 512).collect();
            let mut cache = PromptCache::for_one_prompt();
            let mut pacing = Pacing::for_device(llama.device(), chunks);
            if std::env::var("PAGE_BATCHES").is_ok_and(|v| v == "whole") {
                pacing.token_latency = None;
            }
            let mut clock = Clock {
                start: Instant::now(),
                arrivals: Vec::new(),
                chunks: Vec::new(),
            };
            let cpu = cpu_secs();
            let run = generate::run_async(
                llama,
                &tokenizer,
                ids,
                &mut cache,
                tokens,
                Sampling::default(),
                pacing,
                &mut clock,
            );
            let s = pollster::block_on(run)?;
            let cpu = cpu_secs() - cpu;
            if round == 0 {
                continue;
            }
            let mut gaps: Vec<f64> = clock.arrivals.windows(2).map(|w| w[1] - w[0]).collect();
            let max_gap = gaps.iter().copied().fold(0.0, f64::max);
            // The prompt chunks' sizes, in order, run-length encoded ("4×3 2×10": three of 4,
            // then ten of 2); the last, which draws the first token, is not among them.
            let mut sizes: Vec<(usize, usize)> = Vec::new();
            let mut before = 0;
            for &done in &clock.chunks {
                match sizes.last_mut() {
                    Some((size, count)) if *size == done - before => *count += 1,
                    _ => sizes.push((done - before, 1)),
                }
                before = done;
            }
            let sizes: Vec<String> = sizes.iter().map(|(s, c)| format!("{s}×{c}")).collect();
            println!(
                "{name} run {round}: prompt {} tokens {:.2} tok/s, decode {} tokens {:.2} tok/s; \
                 gaps median {:.0} ms, max {:.0} ms; cpu {:.1} s of {:.1} s; prompt chunks {}",
                s.prompt_tokens,
                s.prompt_tokens_per_sec(),
                s.generated_tokens,
                s.decode_tokens_per_sec(),
                1e3 * median(&mut gaps),
                1e3 * max_gap,
                cpu,
                s.prompt_secs + s.decode_secs,
                sizes.join(" "),
            );
        }
    }
    Ok(())
}
