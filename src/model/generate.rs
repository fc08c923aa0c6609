//! Text generation: tokenize a prompt, run the model, sample, and stream the decoded text.

use std::collections::VecDeque;
use std::time::Instant;

use super::{ChatMessage, ChatOptions, KvCache, Llama, Sampler, Sampling, Tokenizer};
use crate::error::{Error, Result};

/// Decode steps recorded per submit (one readback of their ids) by `generate` and the model
/// benchmark.
pub const MULTI_STEP: usize = 8;

/// What a generation did and how fast.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct GenerationStats {
    /// Tokens of the prompt (with the beginning-of-sequence token).
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Seconds to process the prompt and pick the first token.
    pub prompt_secs: f64,
    /// Seconds for the remaining tokens.
    pub decode_secs: f64,
    /// Whether generation stopped at an end-of-sequence or end-of-turn token.
    pub stopped_at_eos: bool,
}

impl GenerationStats {
    /// Prompt tokens per second.
    pub fn prompt_tokens_per_sec(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_secs.max(1e-9)
    }

    /// Generated tokens per second after the first.
    pub fn decode_tokens_per_sec(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

/// How many decode steps to record in the next submit when `wanted` tokens are still to
/// come: [`MULTI_STEP`], or fewer when fewer are wanted or `cache` has less room (0: stop).
pub fn next_steps(cache: &KvCache, wanted: usize) -> usize {
    MULTI_STEP.min(wanted).min(cache.capacity() - cache.len())
}

/// The ids a generation starts from and a cache with room for them and `max_tokens` more:
/// within the model's context, but not all of it, since a large model's full-context cache
/// can take gigabytes. A plain prompt starts with what the tokenizer file puts in front of a
/// text (the BOS token of models that want one; the config's BOS token when the file does
/// not say) and reads special tokens written in it as text; a `chat` prompt (a rendered chat
/// template) has its special tokens recognized and nothing added, since the template writes
/// them. An empty prompt without a BOS token is an error, and so is a prompt that fills the
/// context ([`Error::CacheFull`]): that check runs before the costly tokenizer steps, so a
/// huge prompt is refused at once.
pub fn prepare_prompt(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompt: &str,
    chat: bool,
    max_tokens: usize,
) -> Result<(Vec<u32>, KvCache)> {
    let ids = prompt_ids(model, tokenizer, prompt, chat)?;
    let context = model.config.context_len();
    // Saturating: `max_tokens` may be anything a user typed, up to 2^64 − 1.
    let cache = model.new_cache(context.min(ids.len().saturating_add(max_tokens.max(1))))?;
    Ok((ids, cache))
}

/// The ids of [`prepare_prompt`] without the cache, for callers that keep their own (a
/// server's paged pool): checked to leave room in the context for at least one new token.
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

/// [`prepare_prompt`] for a plain prompt.
pub fn prepare(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompt: &str,
    max_tokens: usize,
) -> Result<(Vec<u32>, KvCache)> {
    prepare_prompt(model, tokenizer, prompt, false, max_tokens)
}

/// Generates up to `max_tokens` tokens after `prompt`, calling `on_text` with each piece of
/// text as soon as it is complete (never half a character). The prompt runs in one forward
/// pass and each new token in one more, over a [`KvCache`](super::KvCache). Tokens are
/// drawn on the device, and decoding runs several steps per submit with the ids kept on the
/// device ([`Llama::decode`]), so only ids are read back. Stops early at an end-of-sequence
/// or end-of-turn token ([`Tokenizer::is_stop`]) or when the context is full.
pub fn generate(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompt: &str,
    max_tokens: usize,
    sampling: Sampling,
    on_text: impl FnMut(&str),
) -> Result<GenerationStats> {
    let (ids, cache) = prepare(model, tokenizer, prompt, max_tokens)?;
    run(model, tokenizer, ids, cache, max_tokens, sampling, on_text)
}

/// The assistant's next turn in a conversation: `messages` rendered with the model's chat
/// template (with the generation prompt), then generated as [`generate`] does, stopping at
/// the end of the turn.
pub fn generate_chat(
    model: &Llama,
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    max_tokens: usize,
    sampling: Sampling,
    on_text: impl FnMut(&str),
) -> Result<GenerationStats> {
    let rendered = chat_prompt(tokenizer, messages)?;
    let (ids, cache) = prepare_prompt(model, tokenizer, &rendered, true, max_tokens)?;
    run(model, tokenizer, ids, cache, max_tokens, sampling, on_text)
}

/// `messages` rendered with the model's chat template, ending with the prompt of the
/// assistant's turn: the text [`prepare_prompt`] takes with `chat`.
pub fn chat_prompt(tokenizer: &Tokenizer, messages: &[ChatMessage]) -> Result<String> {
    let options = ChatOptions {
        add_generation_prompt: true,
        now: None,
    };
    tokenizer.render_chat(messages, &options)
}

/// Whether generation stops at `id`.
pub fn is_stop(model: &Llama, tokenizer: &Tokenizer, id: u32) -> bool {
    tokenizer.is_stop(id) || Some(id) == model.config.eos_token_id
}

fn run(
    model: &Llama,
    tokenizer: &Tokenizer,
    ids: Vec<u32>,
    mut cache: KvCache,
    max_tokens: usize,
    sampling: Sampling,
    mut on_text: impl FnMut(&str),
) -> Result<GenerationStats> {
    let mut stats = GenerationStats {
        prompt_tokens: ids.len(),
        ..Default::default()
    };
    let mut sampler = Sampler::new(sampling);
    let mut decoder = tokenizer.stream();
    // The prompt in one forward pass.
    let start = Instant::now();
    let mut queue = VecDeque::from([model.sample_next(&ids, &mut cache, &mut sampler)?]);
    stats.prompt_secs = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut last = 0;
    while stats.generated_tokens < max_tokens {
        let Some(next) = queue.pop_front() else {
            // Refill: several steps per submit on the device.
            let steps = next_steps(&cache, max_tokens - stats.generated_tokens);
            if steps == 0 {
                break;
            }
            queue.extend(model.decode(last, &mut cache, steps, &mut sampler)?);
            continue;
        };
        stats.generated_tokens += 1;
        if is_stop(model, tokenizer, next) {
            stats.stopped_at_eos = true;
            break;
        }
        on_text(&decoder.push(next));
        last = next;
    }
    stats.decode_secs = decode_start.elapsed().as_secs_f64();
    on_text(&decoder.finish());
    Ok(stats)
}
