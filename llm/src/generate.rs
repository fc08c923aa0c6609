//! Text generation: tokenize a prompt, run the model, sample, and stream the decoded text.

use std::collections::VecDeque;
use std::future::Future;

use super::{
    ChatMessage, ChatOptions, KvCache, Llama, PromptCache, Sampler, Sampling, SequenceInput,
    Tokenizer,
};
use webtensor::backend::{BackendKind, DeviceClass};
use webtensor::bench::clock::now_secs;
use webtensor::device::Device;
use webtensor::error::{Error, Result};
use webtensor::tensor::Tensor;

/// Decode steps recorded per submit (one readback of their ids) on a GPU, by the generation
/// loop (at most) and the model benchmark.
pub const MULTI_STEP: usize = 8;

/// The longest a generated token should wait between its draw on the device and its handing
/// out: the generation loop sizes its decode batches to it ([`Pacing::token_latency`]). A
/// quarter second reads as a steady stream; on a software adapter in a browser (tens of
/// milliseconds a step) batches of eight made tokens arrive in bursts over a second apart.
pub const TOKEN_LATENCY_SECS: f64 = 0.25;

/// What a generation did and how fast.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct GenerationStats {
    /// Tokens of the prompt (with the beginning-of-sequence token).
    pub prompt_tokens: usize,
    /// Tokens of the prompt in the cache when the first token was drawn: all of them, unless
    /// the generation was stopped during the prompt (those kept from the last generation
    /// included).
    pub prompt_tokens_run: usize,
    /// Tokens of the prompt whose keys and values were kept from the last generation
    /// ([`PromptCache`]) and not run again.
    pub prompt_tokens_reused: usize,
    /// Tokens drawn, the end-of-sequence token that ended the generation included: it was
    /// drawn like any other and cost a decode step (llama.cpp and transformers count it too),
    /// and `max_tokens` bounds the tokens drawn, so a generation never draws more than it.
    pub generated_tokens: usize,
    /// Seconds to process the prompt and pick the first token.
    pub prompt_secs: f64,
    /// Seconds for the remaining tokens.
    pub decode_secs: f64,
    /// Whether generation stopped at an end-of-sequence or end-of-turn token.
    pub stopped_at_eos: bool,
    /// Whether the caller stopped it ([`Observer::checkpoint`] answered true).
    pub stopped: bool,
}

impl GenerationStats {
    /// Prompt tokens run per second (those kept from the last generation not counted).
    pub fn prompt_tokens_per_sec(&self) -> f64 {
        let run = self
            .prompt_tokens_run
            .saturating_sub(self.prompt_tokens_reused);
        run as f64 / self.prompt_secs.max(1e-9)
    }

    /// Generated tokens per second after the first.
    pub fn decode_tokens_per_sec(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

/// How a generation splits its work, and so how often it shows a token and can be stopped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pacing {
    /// The most decode steps whose ids are read back at once: [`MULTI_STEP`] on a GPU, where
    /// a readback costs a round trip; 1 on the host backends, where it costs nothing and
    /// several steps would only hold back tokens the user could already read.
    pub steps_per_submit: usize,
    /// With `Some(seconds)`, each batch takes as many steps (up to `steps_per_submit`) as the
    /// speed measured so far fits in that time, the first batch one step, so no token waits
    /// much longer than that to be handed out: a fast GPU keeps whole batches, a slow adapter
    /// hands tokens out one or two at a time. `None`: every batch takes `steps_per_submit`.
    pub token_latency: Option<f64>,
    /// Whether the next batch of decode steps is recorded and submitted while the previous
    /// one runs and is read back ([`DecodeBatches`]): on a hardware GPU through wgpu, which
    /// runs the batch beside the host. Not on the host backends, nor on software adapters
    /// (lavapipe, SwiftShader), whose "GPU" is the cores the host records on: there it made
    /// the built-in model's decode slower (lavapipe, 2 cores: 214–217 → 180–202 tok/s).
    pub decode_ahead: bool,
    /// How the prompt is split into forward passes.
    pub prompt: PromptChunks,
    /// The prompt rows a forward pass takes for about the price of one: a timed prompt chunk
    /// ([`PromptChunks::Seconds`]) is a whole multiple of them, at least one multiple, since a
    /// chunk of fewer rows takes nearly as long and runs the prompt that many times slower.
    /// 4 on wgpu, whose products take the activation rows four at a time (`MATVEC_MAX_M`); 1 on
    /// the host backends, whose products cost per row.
    pub prompt_rows: usize,
}

/// How the prompt is split into forward passes; between two, the loop reaches a
/// [`Checkpoint::Prompt`] where it can be stopped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PromptChunks {
    /// One pass (the fastest; nothing can stop it midway).
    Whole,
    /// Passes of this many tokens (at least 1).
    Tokens(usize),
    /// Passes sized from the speed measured so far to take about this many seconds each, so
    /// a stop request is answered within about that: the browser's choice, where a long prompt
    /// on the wasm cpu path takes tens of seconds.
    Seconds(f64),
}

/// The first chunk of [`PromptChunks::Seconds`], before any speed is known.
const FIRST_TIMED_CHUNK: usize = 4;
/// The largest chunk of [`PromptChunks::Seconds`].
const MAX_TIMED_CHUNK: usize = 512;
/// The activation rows a wgpu product takes together (`MATVEC_MAX_M`), [`Pacing::prompt_rows`]
/// on wgpu: a chunk of 4j + 1 rows passes over the weights once more for its last row, and a
/// chunk of one to three once for fewer rows. In Chromium on SwiftShader (SmolLM-135M's shape,
/// Q4_0) the prompt ran at 13-14 tokens/s in chunks of five tokens against 24-25 in fours; and
/// where a quarter second held fewer than four tokens (a long prompt's later chunks, whose
/// attention reads more keys) the chunks shrank to one or two tokens and the prompt ran at
/// the decode's speed: 432 tokens at 4.6-6.9 tokens/s natively, against 19-20 in fours.
const TIMED_CHUNK_ROWS: usize = 4;

impl Pacing {
    /// The pacing for a model on `device`: decode steps per submit from the backend (see
    /// [`Pacing::steps_per_submit`]), the prompt split as `prompt` says.
    pub fn for_device(device: &Device, prompt: PromptChunks) -> Pacing {
        let host = matches!(device.backend_name(), "cpu" | "reference");
        Pacing {
            steps_per_submit: if host { 1 } else { MULTI_STEP },
            token_latency: Some(TOKEN_LATENCY_SECS),
            decode_ahead: decodes_ahead(device),
            prompt,
            prompt_rows: if host { 1 } else { TIMED_CHUNK_ROWS },
        }
    }

    /// The size of the next prompt chunk with `left` tokens left, after `done` tokens took
    /// `secs` seconds.
    fn chunk(&self, left: usize, done: usize, secs: f64) -> usize {
        let size = match self.prompt {
            PromptChunks::Whole => left,
            PromptChunks::Tokens(n) => n.max(1),
            PromptChunks::Seconds(_) if done == 0 || secs <= 0.0 => FIRST_TIMED_CHUNK,
            PromptChunks::Seconds(target) => {
                let per_token = secs / done as f64;
                let size = ((target / per_token) as usize).clamp(1, MAX_TIMED_CHUNK);
                let rows = self.prompt_rows.max(1);
                (size - size % rows).max(rows)
            }
        };
        size.min(left)
    }
}

/// Where the generation loop offers its caller to stop it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// After a prompt chunk.
    Prompt {
        /// Prompt tokens run so far.
        done: usize,
        /// Tokens of the whole prompt.
        total: usize,
    },
    /// After a token was drawn and its text (if complete) handed over.
    Token,
}

/// What the generation loop reports to, and asks of, its caller.
pub trait Observer {
    /// Each piece of text as soon as it is complete (never half a character; may be empty
    /// when a token holds only part of one), with the statistics so far.
    fn text(&mut self, piece: &str, stats: &GenerationStats);

    /// Called at every [`Checkpoint`]: a chance to yield to an event loop (the browser
    /// repaints and takes clicks there). Answers whether to stop now.
    fn checkpoint(&mut self, at: Checkpoint) -> impl Future<Output = bool>;
}

/// An [`Observer`] that hands each piece of text to a closure and never stops.
pub struct TextSink<F: FnMut(&str)>(pub F);

impl<F: FnMut(&str)> Observer for TextSink<F> {
    fn text(&mut self, piece: &str, _: &GenerationStats) {
        (self.0)(piece)
    }

    fn checkpoint(&mut self, _: Checkpoint) -> impl Future<Output = bool> {
        std::future::ready(false)
    }
}

/// The ids a generation starts from, checked to leave room in the context for at least one
/// new token. A plain prompt starts with what the tokenizer file puts in front of a text (the
/// BOS token of models that want one; the config's BOS token when the file does not say) and
/// reads special tokens written in it as text; a `chat` prompt (a rendered chat template) has
/// its special tokens recognized and nothing added, since the template writes them. An empty
/// prompt without a BOS token is an error, and so is a prompt that fills the context
/// ([`Error::CacheFull`]): that check runs before the costly tokenizer steps, so a huge prompt
/// is refused at once.
pub fn prompt_ids(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompt: &str,
    chat: bool,
) -> Result<Vec<u32>> {
    let config = &model.config;
    let mut ids: Vec<u32> = match (chat, tokenizer.prefix()) {
        (true, _) => Vec::new(),
        (false, Some(prefix)) => prefix.to_vec(),
        (false, None) => config.bos_token_id.into_iter().collect(),
    };
    let suffix = if chat { &[][..] } else { tokenizer.suffix() };
    let context = config.context_len();
    let fixed = ids.len() + suffix.len();
    let limit = context.saturating_sub(fixed + 1);
    match tokenizer.encode_limited(prompt, chat, limit) {
        Ok(text) => ids.extend(text),
        Err(Error::CacheFull { requested, .. }) => {
            return Err(Error::CacheFull {
                capacity: context,
                len: 0,
                requested: requested + fixed,
            })
        }
        Err(e) => return Err(e),
    }
    ids.extend_from_slice(suffix);
    if ids.is_empty() {
        return Err(Error::invalid(
            "generate",
            "the prompt is empty and the model has no BOS token",
        ));
    }
    if ids.len() >= context {
        return Err(Error::CacheFull {
            capacity: context,
            len: 0,
            requested: ids.len(),
        });
    }
    Ok(ids)
}

/// Generates up to `max_tokens` tokens after `prompt`, calling `on_text` with each piece of
/// text as soon as it is complete (never half a character): [`run_async`] with the prompt in
/// one pass, run to its end on this thread.
#[cfg(not(target_arch = "wasm32"))]
pub fn generate(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompt: &str,
    max_tokens: usize,
    sampling: Sampling,
    on_text: impl FnMut(&str),
) -> Result<GenerationStats> {
    let ids = prompt_ids(model, tokenizer, prompt, false)?;
    let pacing = Pacing::for_device(model.device(), PromptChunks::Whole);
    let mut sink = TextSink(on_text);
    let mut cache = PromptCache::for_one_prompt();
    let run = run_async(
        model, tokenizer, ids, &mut cache, max_tokens, sampling, pacing, &mut sink,
    );
    pollster::block_on(run)
}

/// The assistant's next turn in a conversation: `messages` rendered with the model's chat
/// template (ChatML for a model without one; with the generation prompt), then generated as
/// [`generate`] does, stopping at the end of the turn. `cache` keeps the conversation's keys
/// and values from turn to turn: pass the same one each turn, and each turn runs only what
/// its prompt adds to the last.
#[cfg(not(target_arch = "wasm32"))]
pub fn generate_chat(
    model: &Llama,
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    cache: &mut PromptCache,
    max_tokens: usize,
    sampling: Sampling,
    on_text: impl FnMut(&str),
) -> Result<GenerationStats> {
    let rendered = chat_prompt(tokenizer, messages, model.config.context_len())?;
    let ids = prompt_ids(model, tokenizer, &rendered, true)?;
    let pacing = Pacing::for_device(model.device(), PromptChunks::Whole);
    let mut sink = TextSink(on_text);
    let run = run_async(
        model, tokenizer, ids, cache, max_tokens, sampling, pacing, &mut sink,
    );
    pollster::block_on(run)
}

/// `messages` rendered with the model's chat template (ChatML for a model without one),
/// ending with the prompt of the assistant's turn: the text [`prompt_ids`] takes with
/// `chat`. The render is bounded by the `context` (tokens) the prompt must fit
/// ([`crate::RenderLimits`]).
pub fn chat_prompt(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    context: usize,
) -> Result<String> {
    let options = ChatOptions {
        add_generation_prompt: true,
        now: None,
        context,
        enable_thinking: None,
    };
    tokenizer.render_chat(messages, &options)
}

/// Whether generation stops at `id`.
pub fn is_stop(model: &Llama, tokenizer: &Tokenizer, id: u32) -> bool {
    tokenizer.is_stop(id) || Some(id) == model.config.eos_token_id
}

/// Whether decode batches on `device` are best recorded one ahead ([`Pacing::decode_ahead`]):
/// on a hardware GPU through wgpu, whose readback starts without blocking (and on wgpu's noop
/// device, which stands in for one when the host's side is timed). (The cuda
/// backend's readback blocks at its start, so there the batch ahead would only be recorded
/// after the one before it had run, and its tokens shown a batch later.)
pub(crate) fn decodes_ahead(device: &Device) -> bool {
    let info = device.info();
    matches!(info.class, DeviceClass::Gpu | DeviceClass::Noop) && info.kind == BackendKind::Wgpu
}

/// A readback started ahead ([`Tensor::download_started`]).
type DownloadFuture = std::pin::Pin<Box<dyn Future<Output = Result<Vec<u32>>>>>;

/// The decode batches of one generation: up to `steps_per_submit` steps each (sized to the
/// token latency when one is set, [`Pacing::token_latency`]), at most `wanted` tokens in all,
/// each batch's ids read back. With `ahead` (a hardware GPU) the batch after the one being read
/// is recorded from the device's last id ([`Llama::decode_on_device_after`]) and submitted
/// first, so the GPU runs it while the host waits for, reads and hands out the previous one; a
/// batch recorded past the end of the generation is dropped unread (the cache it wrote to ends
/// with the generation).
pub(crate) struct DecodeBatches {
    steps_per_submit: usize,
    /// The latency batches are sized to, if any.
    latency: Option<f64>,
    /// Seconds per decode step, from the last batch read.
    step_secs: Option<f64>,
    /// When the last batch was read, or the first one recorded.
    last_read: Option<f64>,
    /// Whether to record a batch ahead.
    ahead_on: bool,
    /// Tokens still to record.
    wanted: usize,
    /// The batch recorded ahead, its steps and its readback.
    ahead: Option<(Tensor, usize, DownloadFuture)>,
}

impl DecodeBatches {
    pub(crate) fn new(steps_per_submit: usize, ahead: bool, wanted: usize) -> DecodeBatches {
        DecodeBatches {
            steps_per_submit: steps_per_submit.max(1),
            latency: None,
            step_secs: None,
            last_read: None,
            ahead_on: ahead,
            wanted,
            ahead: None,
        }
    }

    /// The batches `pacing` asks for: its steps per submit, its latency and its decode ahead.
    pub(crate) fn paced(pacing: &Pacing, wanted: usize) -> DecodeBatches {
        DecodeBatches {
            latency: pacing.token_latency,
            ..DecodeBatches::new(pacing.steps_per_submit, pacing.decode_ahead, wanted)
        }
    }

    /// The steps of the next batch to record (0: none), counted as recorded.
    fn take_steps(&mut self, cache: &KvCache) -> usize {
        let steps = self
            .batch_steps()
            .min(self.wanted)
            .min(cache.capacity() - cache.len());
        self.wanted -= steps;
        steps
    }

    /// Steps per batch: `steps_per_submit`, or with a latency what the measured speed fits in
    /// it (one step until a speed is measured).
    fn batch_steps(&self) -> usize {
        match (self.latency, self.step_secs) {
            (None, _) => self.steps_per_submit,
            (Some(_), None) => 1,
            (Some(latency), Some(secs)) => {
                let fits = (latency / secs.max(1e-9)).floor();
                (fits.min(self.steps_per_submit as f64) as usize).max(1)
            }
        }
    }

    /// Takes note that a batch of `steps` was read at `now`: the time per step since the last
    /// read (with a batch ahead, one batch's run).
    fn read_at(&mut self, now: f64, steps: usize) {
        if let Some(before) = self.last_read {
            self.step_secs = Some((now - before) / steps.max(1) as f64);
        }
        self.last_read = Some(now);
    }

    /// The ids of the next batch, after `last` (the last token handed out, not yet in
    /// `cache`); `None` when no more are wanted or the cache is full.
    pub(crate) async fn next(
        &mut self,
        model: &Llama,
        last: u32,
        cache: &mut KvCache,
        sampler: &mut Sampler,
    ) -> Result<Option<Vec<u32>>> {
        if self.last_read.is_none() {
            self.last_read = Some(now_secs());
        }
        let (ids, steps, read) = match self.ahead.take() {
            Some(batch) => batch,
            None => {
                let steps = self.take_steps(cache);
                if steps == 0 {
                    return Ok(None);
                }
                let ids = model.decode_on_device(last, cache, steps, sampler)?;
                let read: DownloadFuture = Box::pin(ids.download_started::<u32>());
                (ids, steps, read)
            }
        };
        if self.ahead_on {
            let steps = self.take_steps(cache);
            if steps > 0 {
                let next = model.decode_on_device_after(&ids, cache, steps, sampler)?;
                let read: DownloadFuture = Box::pin(next.download_started::<u32>());
                self.ahead = Some((next, steps, read));
            }
        }
        let ids = read.await?;
        self.read_at(now_secs(), steps);
        Ok(Some(ids))
    }
}

/// The generation loop, the same natively ([`generate`] runs it with `pollster::block_on`)
/// and in the browser (awaited on the page's event loop): the prompt `ids` (from
/// [`prompt_ids`]) past what `cache` keeps of them ([`PromptCache`]) in chunks as `pacing`
/// says, the first token drawn from its last row, then up to `max_tokens − 1` more,
/// `pacing.steps_per_submit` decode steps per submit with the ids kept on the device
/// ([`Llama::decode_on_device`]) and only they read back, one batch recorded ahead on a GPU
/// ([`DecodeBatches`]). Each piece of text goes to `observer` as soon as it is complete, and
/// the loop stops at an end-of-sequence or end-of-turn token ([`is_stop`]), when the context
/// is full, or when `observer` asks at a [`Checkpoint`]. `cache` then keeps the prompt and the
/// generated ids for the next generation; after an error it is empty.
#[allow(clippy::too_many_arguments)]
pub async fn run_async(
    model: &Llama,
    tokenizer: &Tokenizer,
    ids: Vec<u32>,
    cache: &mut PromptCache,
    max_tokens: usize,
    sampling: Sampling,
    pacing: Pacing,
    observer: &mut impl Observer,
) -> Result<GenerationStats> {
    let (mut kv, reused) = cache.take(model, &ids, max_tokens)?;
    let mut drawn = Vec::new();
    let stats = run_with(
        model, tokenizer, &ids, &mut kv, reused, max_tokens, sampling, pacing, observer, &mut drawn,
    )
    .await?;
    cache.keep(kv, ids, &drawn)?;
    Ok(stats)
}

/// [`run_async`] on the cache taken for it, which holds the first `reused` of `ids`; every id
/// the loop takes from the device goes to `drawn`.
#[allow(clippy::too_many_arguments)]
async fn run_with(
    model: &Llama,
    tokenizer: &Tokenizer,
    ids: &[u32],
    cache: &mut KvCache,
    reused: usize,
    max_tokens: usize,
    sampling: Sampling,
    pacing: Pacing,
    observer: &mut impl Observer,
    drawn: &mut Vec<u32>,
) -> Result<GenerationStats> {
    let total = ids.len();
    let mut stats = GenerationStats {
        prompt_tokens: total,
        prompt_tokens_reused: reused,
        prompt_tokens_run: reused,
        ..Default::default()
    };
    let mut sampler = Sampler::new(sampling);
    let mut decoder = tokenizer.stream();
    let start = now_secs();
    // Every chunk but the last only fills the cache; a stop request is answered between them.
    let mut done = reused;
    loop {
        let chunk = pacing.chunk(total - done, done - reused, now_secs() - start);
        if done + chunk == total {
            break;
        }
        model.prefill(&ids[done..done + chunk], cache)?;
        // On a GPU the chunk was only recorded: wait for it, so that the next chunk's size
        // is measured and a stop is answered while the prompt runs.
        model.device().synchronize_async().await?;
        done += chunk;
        stats.prompt_tokens_run = done;
        if observer
            .checkpoint(Checkpoint::Prompt { done, total })
            .await
        {
            stats.stopped = true;
            stats.prompt_secs = now_secs() - start;
            return Ok(stats);
        }
    }
    let mut batch = [SequenceInput {
        tokens: &ids[done..],
        cache: &mut *cache,
    }];
    let first = model.next_tokens_on_device(&mut batch, &mut sampler)?;
    let mut queue: VecDeque<u32> = first.to_vec_async::<u32>().await?.into();
    stats.prompt_tokens_run = total;
    let decode_start = now_secs();
    stats.prompt_secs = decode_start - start;
    let mut last = 0;
    // The first token came with the prompt.
    let wanted = max_tokens.saturating_sub(1);
    let mut batches = DecodeBatches::paced(&pacing, wanted);
    while stats.generated_tokens < max_tokens {
        let Some(next) = queue.pop_front() else {
            match batches.next(model, last, cache, &mut sampler).await? {
                Some(ids) => queue.extend(ids),
                None => break,
            }
            continue;
        };
        drawn.push(next);
        stats.generated_tokens += 1;
        stats.decode_secs = now_secs() - decode_start;
        if is_stop(model, tokenizer, next) {
            stats.stopped_at_eos = true;
            break;
        }
        observer.text(&decoder.push(next), &stats);
        if observer.checkpoint(Checkpoint::Token).await {
            stats.stopped = true;
            break;
        }
        last = next;
    }
    stats.decode_secs = now_secs() - decode_start;
    let tail = decoder.finish();
    if !tail.is_empty() {
        observer.text(&tail, &stats);
    }
    Ok(stats)
}

#[cfg(test)]
mod tests;
