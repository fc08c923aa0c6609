//! A generation as JavaScript sees it: the page's side of the shared generation loop
//! (`webtensor_llm::generate::run_async`). Pieces of text go to a `Generation` object
//! (web/js/generation.js) that is both a promise of the statistics and an async iterator of
//! the pieces; between steps the loop yields to the event loop, so the page repaints and a
//! stop request (`Model.stop()`, `generation.stop()`, leaving a `for await` loop, or an
//! `AbortSignal`) is seen.

use std::cell::Cell;
use std::rc::Rc;

use js_sys::{Function, Promise, Reflect};
use wasm_bindgen::prelude::*;
use webtensor::bench::clock::pause;
use webtensor_llm::generate::{Checkpoint, GenerationStats, Observer};

#[wasm_bindgen(typescript_custom_section)]
const TS_GENERATION: &'static str = r#"
/**
 * A running generation: `await` it for the statistics, or iterate it for the pieces of text
 * (`for await (const piece of model.generate(prompt))`). Leaving the loop early stops it.
 */
export interface Generation extends PromiseLike<GenerationStats>, AsyncIterable<string> {
  catch<T = never>(onRejected?: ((reason: any) => T | PromiseLike<T>) | null): Promise<GenerationStats | T>;
  finally(onFinally?: (() => void) | null): Promise<GenerationStats>;
  /** Ends the generation after its current step; it resolves with `stopped: true`. */
  stop(): void;
}
"#;

#[wasm_bindgen(module = "/js/generation.js")]
extern "C" {
    /// web/js/generation.js's `Generation`.
    pub type Generation;

    #[wasm_bindgen(constructor)]
    pub fn new(on_token: Option<Function>) -> Generation;

    #[wasm_bindgen(method)]
    fn push(this: &Generation, piece: &str, generated: f64, tokens_per_sec: f64);

    #[wasm_bindgen(method)]
    pub fn settle(this: &Generation, result: Promise, stop: &JsValue);

    /// The reason an `AbortSignal` was aborted with, or `undefined`; throws a `TypeError`
    /// for something that is not a signal.
    #[wasm_bindgen(js_name = abortReason, catch)]
    fn abort_reason(signal: &JsValue) -> Result<JsValue, JsValue>;
}

/// Fails with the signal's reason (an `AbortError` by default) when `signal` was aborted.
pub(crate) fn check_signal(signal: &JsValue) -> Result<(), JsValue> {
    match abort_reason(signal)? {
        reason if reason.is_undefined() => Ok(()),
        reason => Err(reason),
    }
}

/// The `signal` field of an options object (`undefined` when absent).
pub(crate) fn signal_of(options: &JsValue) -> Result<JsValue, JsValue> {
    if options.is_object() {
        let signal = Reflect::get(options, &JsValue::from_str("signal"))?;
        abort_reason(&signal)?;
        Ok(signal)
    } else {
        Ok(JsValue::UNDEFINED)
    }
}

/// The page's side of one run of the generation loop.
pub(crate) struct PageObserver {
    /// Where the pieces go.
    pub generation: Generation,
    /// Set by `Model.stop()` or `generation.stop()`.
    pub stop: Rc<Cell<bool>>,
    /// The options' `AbortSignal`, or `undefined`.
    pub signal: JsValue,
    /// The text so far.
    pub text: String,
}

impl Observer for PageObserver {
    fn text(&mut self, piece: &str, stats: &GenerationStats) {
        self.text.push_str(piece);
        let rate = stats.generated_tokens.saturating_sub(1) as f64 / stats.decode_secs.max(1e-9);
        self.generation
            .push(piece, stats.generated_tokens as f64, rate);
    }

    async fn checkpoint(&mut self, _: Checkpoint) -> bool {
        // Let the page repaint and take a click on "stop" (the cpu backend never yields on
        // its own).
        pause().await;
        self.stop.get() || check_signal(&self.signal).is_err()
    }
}
