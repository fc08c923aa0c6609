//! The generation loop on the built-in model (cpu backend): what it counts, how it streams,
//! and how soon it stops.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;
use crate::builtin;
use crate::HookPoint;

fn model() -> (Llama, Tokenizer) {
    let llama = Llama::load(&Device::cpu(), builtin::files().unwrap()).unwrap();
    let tokenizer = llama.tokenizer.clone().unwrap();
    (llama, tokenizer)
}

const GREEDY: Sampling = Sampling {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    seed: 0,
};

/// Runs the loop to its end with `observer`.
fn run(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompt: &str,
    max_tokens: usize,
    pacing: Pacing,
    observer: &mut impl Observer,
) -> GenerationStats {
    let ids = prompt_ids(model, tokenizer, prompt, false).unwrap();
    let mut cache = PromptCache::new();
    let run = run_async(
        model, tokenizer, ids, &mut cache, max_tokens, GREEDY, pacing, observer,
    );
    pollster::block_on(run).unwrap()
}

/// The greedy ids after `prompt`, drawn by the engine directly (not by the loop).
fn greedy_ids(model: &Llama, tokenizer: &Tokenizer, prompt: &str, n: usize) -> Vec<u32> {
    let ids = prompt_ids(model, tokenizer, prompt, false).unwrap();
    let mut cache = model.new_cache(ids.len() + n).unwrap();
    let mut sampler = Sampler::new(GREEDY);
    let mut out = vec![model.sample_next(&ids, &mut cache, &mut sampler).unwrap()];
    let last = out[0];
    out.extend(model.decode(last, &mut cache, n - 1, &mut sampler).unwrap());
    out
}

/// The text and statistics of a run that is never stopped.
fn text_of(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompt: &str,
    n: usize,
    pacing: Pacing,
) -> (String, GenerationStats) {
    let mut text = String::new();
    let stats = run(
        model,
        tokenizer,
        prompt,
        n,
        pacing,
        &mut TextSink(|p: &str| text.push_str(p)),
    );
    (text, stats)
}

#[test]
fn the_end_of_sequence_token_is_counted_and_not_shown() {
    let (mut model, tokenizer) = model();
    let prompt = "And God said";
    let ids = greedy_ids(&model, &tokenizer, prompt, 8);
    // The first token that did not come before: make it the end of the sequence.
    let k = (2..ids.len())
        .find(|&k| !ids[..k].contains(&ids[k]))
        .unwrap();
    model.config.eos_token_id = Some(ids[k]);
    let pacing = Pacing::for_device(model.device(), PromptChunks::Whole);
    let (text, stats) = text_of(&model, &tokenizer, prompt, 8, pacing);
    assert!(stats.stopped_at_eos && !stats.stopped);
    assert_eq!(
        stats.generated_tokens,
        k + 1,
        "the end-of-sequence token counts"
    );
    assert_eq!(text, tokenizer.decode(&ids[..k]), "and is not shown");
    // The native entry point runs the same loop.
    let native = generate(&model, &tokenizer, prompt, 8, GREEDY, |_| {}).unwrap();
    assert_eq!(native.generated_tokens, k + 1);
}

#[test]
fn the_prompt_in_chunks_draws_the_same_tokens() {
    let (model, tokenizer) = model();
    let prompt =
        "In the beginning God created the heaven and the earth. And the earth was without form";
    let host = Pacing::for_device(model.device(), PromptChunks::Whole);
    let (whole, stats) = text_of(&model, &tokenizer, prompt, 12, host);
    assert_eq!(stats.generated_tokens, 12);
    assert_eq!(
        whole,
        tokenizer.decode(&greedy_ids(&model, &tokenizer, prompt, 12))
    );
    for prompt_chunks in [
        PromptChunks::Tokens(5),
        PromptChunks::Tokens(1),
        PromptChunks::Seconds(1e-3),
    ] {
        let pacing = Pacing {
            prompt: prompt_chunks,
            ..host
        };
        let (text, stats) = text_of(&model, &tokenizer, prompt, 12, pacing);
        assert_eq!(text, whole, "{prompt_chunks:?}");
        assert_eq!(stats.prompt_tokens_run, stats.prompt_tokens);
    }
    // A GPU records several steps per submit, and the next batch from the last one's id on
    // the device while the last is read (11 decode steps: a batch of 8, then 3): the same
    // tokens.
    for decode_ahead in [false, true] {
        let pacing = Pacing {
            steps_per_submit: MULTI_STEP,
            decode_ahead,
            ..host
        };
        let (text, stats) = text_of(&model, &tokenizer, prompt, 12, pacing);
        assert_eq!(text, whole, "decode_ahead {decode_ahead}");
        assert_eq!(stats.generated_tokens, 12);
    }
}

/// Counts forward passes (through the `embedding` hook) and records how many had run when
/// each piece of text arrived; stops at the `stop_at`-th prompt checkpoint.
struct Recorder {
    passes: Arc<AtomicUsize>,
    passes_at_text: Vec<usize>,
    prompt_checkpoints: usize,
    stop_at: usize,
    after_stop: usize,
}

impl Recorder {
    fn new(model: &mut Llama, stop_at: usize) -> Recorder {
        let passes = Arc::new(AtomicUsize::new(0));
        let counter = passes.clone();
        model.set_hook(
            &[HookPoint::Embedding],
            Box::new(move |_, _, _| {
                counter.fetch_add(1, Ordering::SeqCst);
            }),
        );
        Recorder {
            passes,
            passes_at_text: Vec::new(),
            prompt_checkpoints: 0,
            stop_at,
            after_stop: 0,
        }
    }

    fn stopped(&self) -> bool {
        self.stop_at > 0 && self.prompt_checkpoints >= self.stop_at
    }
}

impl Observer for Recorder {
    fn text(&mut self, _: &str, _: &GenerationStats) {
        self.after_stop += usize::from(self.stopped());
        self.passes_at_text.push(self.passes.load(Ordering::SeqCst));
    }

    fn checkpoint(&mut self, at: Checkpoint) -> impl Future<Output = bool> {
        self.after_stop += usize::from(self.stopped());
        if let Checkpoint::Prompt { .. } = at {
            self.prompt_checkpoints += 1;
        }
        std::future::ready(self.stopped())
    }
}

/// Timed prompt chunks: the first of four tokens, then sized from the speed so far, whole
/// groups of the rows a pass takes at once (four on wgpu, whose products take rows four at a
/// time: at least one group, as fewer rows cost a pass too), never past the tokens left or the
/// largest chunk.
#[test]
fn timed_prompt_chunks_are_whole_groups_of_four_rows() {
    let wgpu = Pacing {
        steps_per_submit: 1,
        token_latency: None,
        decode_ahead: false,
        prompt: PromptChunks::Seconds(0.25),
        prompt_rows: 4,
    };
    assert_eq!(wgpu.chunk(100, 0, 0.0), 4);
    // 19 tokens/s: 4.75 tokens a quarter second.
    assert_eq!(wgpu.chunk(100, 19, 1.0), 4);
    // 47 tokens/s: 11.75.
    assert_eq!(wgpu.chunk(100, 47, 1.0), 8);
    // 10 tokens/s: 2.5, below one group: a group all the same.
    assert_eq!(wgpu.chunk(100, 10, 1.0), 4);
    assert_eq!(wgpu.chunk(100, 1, 1.0), 4);
    assert_eq!(wgpu.chunk(3, 1, 1.0), 3);
    assert_eq!(wgpu.chunk(5, 47, 1.0), 5);
    assert_eq!(wgpu.chunk(10_000, 100_000, 1.0), 512);
    // A host backend's products cost per row: any size from one token.
    let host = Pacing {
        prompt_rows: 1,
        ..wgpu
    };
    assert_eq!(host.chunk(100, 0, 0.0), 4);
    assert_eq!(host.chunk(100, 47, 1.0), 11);
    assert_eq!(host.chunk(100, 10, 1.0), 2);
    assert_eq!(host.chunk(100, 1, 1.0), 1);
}

#[test]
fn on_the_cpu_each_token_is_shown_before_the_next_step_runs() {
    let (mut model, tokenizer) = model();
    let mut recorder = Recorder::new(&mut model, 0);
    let pacing = Pacing::for_device(model.device(), PromptChunks::Whole);
    assert_eq!(pacing.steps_per_submit, 1);
    let stats = run(
        &model,
        &tokenizer,
        "And God said",
        10,
        pacing,
        &mut recorder,
    );
    assert_eq!(stats.generated_tokens, 10);
    // The k-th piece arrives after the prompt pass and k − 1 decode steps, not after a
    // submit of several.
    assert_eq!(recorder.passes_at_text, (1..=10).collect::<Vec<_>>());
}

#[test]
fn a_stop_during_the_prompt_is_answered_at_the_next_chunk() {
    let (mut model, tokenizer) = model();
    let prompt = "And God said, Let there be light: and there was light. ".repeat(6);
    let mut recorder = Recorder::new(&mut model, 2);
    let pacing = Pacing {
        steps_per_submit: 1,
        token_latency: None,
        decode_ahead: false,
        prompt: PromptChunks::Tokens(8),
        prompt_rows: 1,
    };
    let stats = run(&model, &tokenizer, &prompt, 20, pacing, &mut recorder);
    assert!(stats.prompt_tokens > 64, "{}", stats.prompt_tokens);
    assert!(stats.stopped);
    // Two chunks ran before the stop, none after it, and nothing was drawn.
    assert_eq!(recorder.prompt_checkpoints, 2);
    assert_eq!(recorder.passes.load(Ordering::SeqCst), 2);
    assert_eq!(stats.prompt_tokens_run, 16);
    assert_eq!(stats.generated_tokens, 0);
    assert_eq!(recorder.after_stop, 0);
    assert!(recorder.passes_at_text.is_empty());
}

/// With a token latency the first batch is one step, then each takes what the last read's
/// time per step fits in the latency, between one step and `steps_per_submit`.
#[test]
fn decode_batches_are_sized_to_the_token_latency() {
    let pacing = Pacing {
        steps_per_submit: 8,
        token_latency: Some(0.25),
        decode_ahead: false,
        prompt: PromptChunks::Whole,
        prompt_rows: 4,
    };
    let mut batches = DecodeBatches::paced(&pacing, 100);
    assert_eq!(batches.batch_steps(), 1);
    // The first read starts the clock; then 0.1 s a step fits two in a quarter second.
    batches.read_at(0.0, 1);
    batches.read_at(0.1, 1);
    assert_eq!(batches.batch_steps(), 2);
    // 0.05 s a step: five.
    batches.read_at(0.2, 2);
    assert_eq!(batches.batch_steps(), 5);
    // 2 ms a step: more than a batch holds.
    batches.read_at(0.21, 5);
    assert_eq!(batches.batch_steps(), 8);
    // Slower than the latency itself: one at a time.
    batches.read_at(2.61, 8);
    assert_eq!(batches.batch_steps(), 1);
    // Without a latency every batch is whole.
    assert_eq!(DecodeBatches::new(8, false, 100).batch_steps(), 8);
}

/// A conversation's turns with one [`PromptCache`]: each later turn runs only what its prompt
/// adds to the kept ids (the reply, the new message), and draws what a fresh cache (the whole
/// conversation run again) draws. The built-in model has no template: ChatML.
#[test]
fn a_conversation_keeps_its_earlier_turns_and_draws_the_same_replies() {
    let (model, tokenizer) = model();
    let pacing = Pacing::for_device(model.device(), PromptChunks::Whole);
    let turn = |messages: &[ChatMessage], cache: &mut PromptCache| {
        let rendered = chat_prompt(&tokenizer, messages, model.config.context_len()).unwrap();
        let ids = prompt_ids(&model, &tokenizer, &rendered, true).unwrap();
        let mut text = String::new();
        let mut sink = TextSink(|p: &str| text.push_str(p));
        let run = run_async(
            &model, &tokenizer, ids, cache, 10, GREEDY, pacing, &mut sink,
        );
        let stats = pollster::block_on(run).unwrap();
        (text, stats)
    };
    let mut kept = PromptCache::new();
    let system = "Answer from the book. ".repeat(3);
    let mut messages = vec![ChatMessage::new("system", &system)];
    for (i, question) in ["And God said", "Who divided the waters?", "And the evening"]
        .into_iter()
        .enumerate()
    {
        messages.push(ChatMessage::new("user", question));
        let (text, stats) = turn(&messages, &mut kept);
        let (fresh_text, fresh) = turn(&messages, &mut PromptCache::new());
        assert_eq!(text, fresh_text, "turn {i}");
        assert_eq!(fresh.prompt_tokens_reused, 0);
        assert_eq!(stats.prompt_tokens_run, stats.prompt_tokens);
        if i == 0 {
            assert_eq!(stats.prompt_tokens_reused, 0);
        } else {
            // Everything before this turn's reply is kept: well over half the prompt.
            assert!(
                stats.prompt_tokens_reused * 2 > stats.prompt_tokens,
                "turn {i}: {stats:?}"
            );
        }
        assert_eq!(
            kept.held().len(),
            stats.prompt_tokens + stats.generated_tokens - 1
        );
        messages.push(ChatMessage::new("assistant", &text));
    }
}
