//! Llama models in the browser: loading from bytes, `File`s, a URL or the built-in model
//! (each cancellable with an `AbortSignal`), and generating text from a prompt (`generate`) or
//! a conversation rendered with the model's chat template (`chat`).
//!
//! Generation is the library's own loop, `generate::run_async`, awaited on the page's event
//! loop: the prompt in chunks sized to about a quarter second each, then on the cpu backend
//! one token per step, each shown as soon as it is drawn, and on WebGPU
//! `generate::MULTI_STEP` steps per submit with only their ids read back. Between steps the
//! loop yields to the page ([`PageObserver`]), so Stop is answered within a chunk or a token.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use js_sys::Function;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;
use webtensor::bench::clock::pause;

use webtensor_llm::files::{folder_shards, FolderTexts, INDEX};
use webtensor_llm::generate::{self, Pacing, PromptChunks};
use webtensor_llm::{
    builtin, ChatMessage, FileBytes, Llama, ModelFiles, PromptCache, Sampling, Tokenizer,
};

use crate::device::Device;
use crate::error::{js, js_error, to_js_object};
use crate::generation::{check_signal, signal_of, Generation, PageObserver};
use crate::load::{read_file, report};
use crate::{cache, estimate};

/// Seconds a prompt chunk takes at most (about): how soon Stop is answered during a prompt.
const PROMPT_CHUNK_SECS: f64 = 0.25;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &'static str = r#"
/** The options that are not plain data (merged with the generated `GenerateOptions`). */
export interface GenerateOptions {
  /** Aborting it ends the generation after its current step, as `Model.stop()` does. */
  signal?: AbortSignal;
}

/** Called while loading: `phase` is "read", "download", "parse" or "upload". */
export type ProgressCallback = (phase: string, done: number, total: number) => void;

/** Called with each piece of generated text (never half a character). */
export type TokenCallback = (piece: string, generated: number, tokensPerSec: number) => void;
"#;

/// A loaded model with its tokenizer, ready to generate.
#[wasm_bindgen]
pub struct Model {
    inner: Rc<Inner>,
}

/// What a [`Model`] holds; shared with its running generation.
struct Inner {
    llama: Llama,
    /// `None` for a file without a vocabulary: it runs token ids (`Model.eval`), not text.
    tokenizer: Option<Tokenizer>,
    name: String,
    /// The stop flag of the current generation.
    stop: RefCell<Rc<Cell<bool>>>,
    busy: Cell<bool>,
    /// The last generation's keys and values, so the next one runs only what its prompt adds
    /// (a chat's next turn); taken out while a generation runs.
    prompt_cache: RefCell<PromptCache>,
}

/// Sampling and length of one generation; every field is optional. (`signal`, an
/// `AbortSignal`, is read apart: see [`GenerateOptions::from_js`].)
#[derive(serde::Deserialize, tsify::Tsify)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct GenerateOptions {
    /// Tokens to generate at most (default 64).
    max_tokens: usize,
    /// 0 for greedy (the default); otherwise logits are divided by it before the softmax.
    temperature: f32,
    /// Keep only the k most likely tokens (0: all, the default).
    top_k: usize,
    /// Keep the smallest set of likely tokens whose probability reaches p (1: all, the
    /// default).
    top_p: f32,
    /// Seed of the random choices (default 0).
    seed: u64,
    /// Prompt tokens per forward pass; between two, the generation can be stopped. Default:
    /// sized from the speed measured so far to take about a quarter second each.
    prompt_chunk: Option<usize>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 64,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            prompt_chunk: None,
        }
    }
}

impl GenerateOptions {
    fn from_js(value: &JsValue) -> Result<Self, JsValue> {
        if value.is_undefined() || value.is_null() {
            return Ok(Self::default());
        }
        // The signal is read apart (signal_of); the rest is plain data.
        let data = js_sys::Object::assign(&js_sys::Object::new(), value.unchecked_ref());
        js_sys::Reflect::delete_property(&data, &JsValue::from_str("signal"))?;
        let text: String = js_sys::JSON::stringify(&data)?.into();
        let o: Self = serde_json::from_str(&text)
            .map_err(|e| js_error(format!("generate: bad options: {e}")))?;
        if !(o.temperature >= 0.0 && o.temperature.is_finite()) {
            return Err(js_error(
                "generate: temperature must be a finite number ≥ 0",
            ));
        }
        if !(o.top_p > 0.0 && o.top_p <= 1.0) {
            return Err(js_error("generate: topP must be in (0, 1]"));
        }
        if o.max_tokens == 0 {
            return Err(js_error("generate: maxTokens must be at least 1"));
        }
        if o.prompt_chunk == Some(0) {
            return Err(js_error("generate: promptChunk must be at least 1"));
        }
        Ok(o)
    }
}

/// What a generation did and how fast: what `generate` and `chat` resolve with.
#[derive(serde::Serialize, tsify::Tsify)]
#[serde(rename_all = "camelCase")]
pub struct GenerationStats {
    /// Tokens of the prompt (after the chat template, for `chat`).
    prompt_tokens: usize,
    /// Prompt tokens run: all of them unless the generation was stopped during the prompt.
    prompt_tokens_run: usize,
    /// Prompt tokens whose keys and values were kept from the model's last generation (the
    /// earlier turns of a chat), not run again.
    prompt_tokens_reused: usize,
    /// Tokens drawn, with the end-of-sequence token that ended the generation.
    generated_tokens: usize,
    /// Seconds of the prompt pass, up to the first generated token.
    prompt_secs: f64,
    /// Seconds of decoding after the prompt pass.
    decode_secs: f64,
    /// Generated tokens per second after the first.
    tokens_per_sec: f64,
    /// Whether the model's end-of-sequence or end-of-turn token ended it.
    stopped_at_eos: bool,
    /// Whether `Model.stop()`, `generation.stop()` or the options' `signal` ended it.
    stopped: bool,
    /// The generated text.
    text: String,
}

/// Clears the model's busy flag when a generation ends, however it ends.
struct BusyGuard<'a>(&'a Cell<bool>);

impl<'a> BusyGuard<'a> {
    /// Marks the model busy for `what` (a generation or an evaluation), or says it already is:
    /// one run at a time per model.
    fn claim(busy: &'a Cell<bool>, what: &str) -> Result<BusyGuard<'a>, JsValue> {
        if busy.replace(true) {
            return Err(js_error(format!(
                "{what}: this model is already generating; stop it or wait for it"
            )));
        }
        Ok(BusyGuard(busy))
    }
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

#[wasm_bindgen]
impl Model {
    /// The built-in tiny model (0.8M parameters, trained on the King James Bible), compiled
    /// into the module: no download.
    pub async fn builtin(
        device: &Device,
        #[wasm_bindgen(unchecked_optional_param_type = "ProgressCallback | null")] progress: Option<
            Function,
        >,
        #[wasm_bindgen(unchecked_optional_param_type = "AbortSignal | null")] signal: JsValue,
    ) -> Result<Model, JsValue> {
        check_signal(&signal)?;
        report(progress.as_ref(), "parse", 0.0, 1.0);
        let files = js(builtin::files())?;
        Model::place(device, files, builtin::NAME, progress.as_ref(), &signal).await
    }

    /// A model from the bytes of a GGUF file.
    #[wasm_bindgen(js_name = fromBytes)]
    pub async fn from_bytes(
        device: &Device,
        bytes: Vec<u8>,
        name: String,
        #[wasm_bindgen(unchecked_optional_param_type = "ProgressCallback | null")] progress: Option<
            Function,
        >,
        #[wasm_bindgen(unchecked_optional_param_type = "AbortSignal | null")] signal: JsValue,
    ) -> Result<Model, JsValue> {
        check_signal(&signal)?;
        Model::from_gguf(device, bytes, &name, progress.as_ref(), &signal).await
    }

    /// A model from files the user picked: one `.gguf` file, or a Hugging Face folder's
    /// `config.json`, `tokenizer.json` and `model.safetensors` (or the shards its
    /// `model.safetensors.index.json` lists), with `tokenizer_config.json` (or
    /// `chat_template.jinja`) for chat and `generation_config.json` (e.g. from
    /// `<input type=file webkitdirectory>`), read as a folder is natively. Progress reports
    /// the bytes read; aborting `signal` rejects with its reason.
    #[wasm_bindgen(js_name = fromFiles)]
    pub async fn from_files(
        device: &Device,
        #[wasm_bindgen(unchecked_param_type = "FileList | File[]")] files: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ProgressCallback | null")] progress: Option<
            Function,
        >,
        #[wasm_bindgen(unchecked_optional_param_type = "AbortSignal | null")] signal: JsValue,
    ) -> Result<Model, JsValue> {
        check_signal(&signal)?;
        let progress = progress.as_ref();
        let files: Vec<web_sys::File> = js_sys::Array::from(&files)
            .iter()
            .map(|f| f.dyn_into::<web_sys::File>())
            .collect::<Result<_, _>>()
            .map_err(|_| js_error("fromFiles: expected a FileList or an array of File"))?;
        let with_suffix = |suffix: &str| -> Vec<&web_sys::File> {
            files
                .iter()
                .filter(|f| f.name().ends_with(suffix))
                .collect()
        };
        if let Some(gguf) = with_suffix(".gguf").first() {
            let bytes = read_file(gguf, progress, &signal).await?;
            return Model::from_gguf(device, bytes, &gguf.name(), progress, &signal).await;
        }
        // The folder's rules are the library's (`FolderTexts`, `folder_shards`): the same
        // files as a folder opened natively.
        let mut texts = Vec::new();
        for name in FolderTexts::NAMES {
            texts.push(read_text(&files, name).await?);
        }
        let texts = js(FolderTexts::from_texts(texts, "the picked folder"))?;
        let index = read_text(&files, INDEX).await?;
        let has = |name: &str| files.iter().any(|f| f.name() == name);
        let names = js(folder_shards(has, index.as_deref(), "the picked folder"))?;
        let mut shards = Vec::new();
        for name in names {
            let file = files.iter().find(|f| f.name() == name).ok_or_else(|| {
                js_error(format!(
                    "fromFiles: {INDEX} lists {name}, which is not among the picked files"
                ))
            })?;
            let bytes = read_file(file, progress, &signal).await?;
            shards.push((name, FileBytes::Owned(bytes)));
        }
        report(progress, "parse", 0.0, 1.0);
        let model_files = js(ModelFiles::from_folder(texts, shards))?;
        Model::place(device, model_files, "model folder", progress, &signal).await
    }

    /// A model from the URL of a GGUF file: from the browser's cache when an earlier load put
    /// it there (progress phase "cache"), else fetched (phase "download") and kept in the
    /// cache for the next visit (see `cachedModels`, `deleteCachedModel`). Before a
    /// download the model is sized from its header (`estimateModel`) and refused with a
    /// `ModelTooLargeError` when the device or the page cannot hold it. Aborting `signal`
    /// cancels the download and rejects with its reason.
    #[wasm_bindgen(js_name = fromUrl)]
    pub async fn from_url(
        device: &Device,
        url: String,
        #[wasm_bindgen(unchecked_optional_param_type = "ProgressCallback | null")] progress: Option<
            Function,
        >,
        #[wasm_bindgen(unchecked_optional_param_type = "AbortSignal | null")] signal: JsValue,
    ) -> Result<Model, JsValue> {
        check_signal(&signal)?;
        if !cache::contains(&url).await? {
            // Refuse a model too large for this device or page before downloading it.
            estimate::check_fits(device, &url).await?;
        }
        let bytes = cache::fetch_cached(&url, progress.as_ref(), &signal).await?;
        let model = Model::from_gguf(device, bytes, &url, progress.as_ref(), &signal).await;
        if model.is_err() {
            // Keep no bytes that are not a model this device can load.
            cache::forget(&url).await?;
        }
        model
    }

    /// The model's name (file name, URL, or the built-in model's).
    #[wasm_bindgen(getter)]
    pub fn name(&self) -> String {
        self.inner.name.clone()
    }

    /// The model's hyper-parameters (`config.json`'s fields).
    pub fn config(&self) -> Result<JsValue, JsValue> {
        to_js_object(&self.inner.llama.config)
    }

    /// The model's weight formats and the product each runs on its device, as
    /// `webtensor generate` prints them: e.g. `q4_k weights × q8_k activations, q6_k weights ×
    /// q8_k activations` for a Q4_K_M file on wgpu (the formats in the order the layers use
    /// them, each named once).
    #[wasm_bindgen(getter, js_name = activationPath)]
    pub fn activation_path(&self) -> String {
        self.inner.llama.activation_path()
    }

    /// The model's chat template (Jinja), or `undefined` when it has none (then `chat`
    /// renders ChatML).
    #[wasm_bindgen(getter, js_name = chatTemplate)]
    pub fn chat_template(&self) -> Option<String> {
        let tokenizer = self.inner.tokenizer.as_ref()?;
        tokenizer.chat_template().map(|t| t.text.clone())
    }

    /// Generates up to `options.maxTokens` tokens after `prompt`. The answer is a
    /// `Generation`: `await` it for the statistics and the whole text, or iterate it
    /// (`for await (const piece of model.generate(prompt))`) for the pieces as they are
    /// decoded; `onToken`, when given, is called with every token's piece too. Ends early at
    /// the model's end-of-sequence or end-of-turn token, when the context is full, or when
    /// stopped (`Model.stop()`, `generation.stop()`, leaving the loop, `options.signal`).
    /// One generation at a time per model.
    #[wasm_bindgen(unchecked_return_type = "Generation")]
    pub fn generate(
        &self,
        prompt: String,
        #[wasm_bindgen(unchecked_optional_param_type = "GenerateOptions | null")] options: JsValue,
        #[wasm_bindgen(
            js_name = "onToken",
            unchecked_optional_param_type = "TokenCallback | null"
        )]
        on_token: Option<Function>,
    ) -> Generation {
        self.start("generate", options, on_token, move |_| Ok((prompt, false)))
    }

    /// The assistant's next turn in a conversation: `messages` (`{role, content}` objects)
    /// rendered with the model's chat template, then generated as `generate` does, ending at
    /// the end of the turn. Add the reply (`stats.text`) to `messages` as an "assistant"
    /// message for the next turn. The model keeps its last generation's keys and values, so
    /// the next turn runs only what its prompt adds (`stats.promptTokensReused` were kept).
    #[wasm_bindgen(unchecked_return_type = "Generation")]
    pub fn chat(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ChatMessage[]")] messages: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "GenerateOptions | null")] options: JsValue,
        #[wasm_bindgen(
            js_name = "onToken",
            unchecked_optional_param_type = "TokenCallback | null"
        )]
        on_token: Option<Function>,
    ) -> Generation {
        let text = js_sys::JSON::stringify(&messages).map(String::from);
        self.start("chat", options, on_token, move |inner| {
            let messages: Vec<ChatMessage> = serde_json::from_str(&text?).map_err(|e| {
                js_error(format!(
                    "chat: messages must be an array of {{role, content}} strings: {e}"
                ))
            })?;
            Ok((
                js(generate::chat_prompt(
                    inner.tokenizer()?,
                    &messages,
                    inner.llama.config.context_len(),
                ))?,
                true,
            ))
        })
    }

    /// Every position's logits for the token ids `ids`, as `webtensor eval` prints them: a
    /// `Float32Array` of `ids.length × vocab_size` values, row by row. It runs on a fresh
    /// cache (the keys and values kept for the next generation stay as they are), so the
    /// answer depends on `ids` alone: for checking a model against another implementation's
    /// logits. Works for a model without a tokenizer too.
    #[wasm_bindgen(unchecked_return_type = "Promise<Float32Array>")]
    pub fn eval(&self, ids: Vec<u32>) -> js_sys::Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            if ids.is_empty() {
                return Err(js_error("eval: no token ids"));
            }
            let _guard = BusyGuard::claim(&inner.busy, "eval")?;
            let mut cache = js(inner.llama.new_cache(ids.len()))?;
            let logits = js(inner.llama.forward(&ids, &mut cache))?;
            let values = js(logits.to_vec_async::<f32>().await)?;
            Ok(js_sys::Float32Array::from(values.as_slice()).into())
        })
    }

    /// Asks a running generation to end after its current step.
    pub fn stop(&self) {
        self.inner.stop.borrow().set(true);
    }

    /// Forgets the keys and values kept from the last generation (and frees their memory):
    /// the next one runs its whole prompt. Call it between generations (a benchmark timing
    /// prompts does, before each).
    #[wasm_bindgen(js_name = clearCache)]
    pub fn clear_cache(&self) {
        self.inner.prompt_cache.borrow_mut().clear();
    }
}

/// The text of the file called `name` among `files`, if there is one.
async fn read_text(files: &[web_sys::File], name: &str) -> Result<Option<String>, JsValue> {
    match files.iter().find(|f| f.name() == name) {
        Some(f) => String::from_utf8(read_file(f, None, &JsValue::UNDEFINED).await?)
            .map(Some)
            .map_err(|_| js_error(format!("{name} is not UTF-8 text"))),
        None => Ok(None),
    }
}

impl Model {
    async fn from_gguf(
        device: &Device,
        bytes: Vec<u8>,
        name: &str,
        progress: Option<&Function>,
        signal: &JsValue,
    ) -> Result<Model, JsValue> {
        report(progress, "parse", 0.0, 1.0);
        let files = js(ModelFiles::from_gguf(name, FileBytes::Owned(bytes)))?;
        Model::place(device, files, name, progress, signal).await
    }

    /// Uploads the weights to the device (the last chance for `signal` to cancel the load).
    async fn place(
        device: &Device,
        files: ModelFiles,
        name: &str,
        progress: Option<&Function>,
        signal: &JsValue,
    ) -> Result<Model, JsValue> {
        let tokenizer = files.tokenizer.clone();
        report(progress, "upload", 0.0, 1.0);
        // Let the page show the phase before the (synchronous) upload.
        pause().await;
        check_signal(signal)?;
        // Per layer: in a Web Worker each report reaches the page while the upload runs.
        let llama = js(Llama::load_with_progress(
            &device.inner,
            files,
            &mut |done, total| report(progress, "upload", done as f64, total as f64),
        ))?;
        Ok(Model {
            inner: Rc::new(Inner {
                llama,
                tokenizer,
                name: name.to_string(),
                stop: RefCell::new(Rc::new(Cell::new(false))),
                busy: Cell::new(false),
                prompt_cache: RefCell::new(PromptCache::new()),
            }),
        })
    }

    /// Starts a generation after the prompt that `prompt` makes (a rendered chat template
    /// when it says so) and answers its `Generation` at once; bad options and other failures
    /// reject it.
    fn start(
        &self,
        what: &'static str,
        options: JsValue,
        on_token: Option<Function>,
        prompt: impl FnOnce(&Inner) -> Result<(String, bool), JsValue>,
    ) -> Generation {
        let inner = self.inner.clone();
        let generation = Generation::new(on_token);
        let stop = Rc::new(Cell::new(false));
        let prepared = GenerateOptions::from_js(&options).and_then(|o| {
            let signal = signal_of(&options)?;
            Ok((o, signal, prompt(&inner)?))
        });
        let observer_generation: Generation = JsValue::clone(&generation).unchecked_into();
        let run_stop = stop.clone();
        let run = async move {
            let (options, signal, (prompt, chat)) = prepared?;
            // An already aborted signal rejects, as `fetch` does; a later abort stops.
            check_signal(&signal)?;
            let _guard = BusyGuard::claim(&inner.busy, what)?;
            *inner.stop.borrow_mut() = run_stop.clone();
            let mut observer = PageObserver {
                generation: observer_generation,
                stop: run_stop,
                signal,
                text: String::new(),
            };
            let stats = inner.run(&prompt, chat, &options, &mut observer).await?;
            to_js_object(&stats)
        };
        let stop_now = Closure::<dyn FnMut()>::new(move || stop.set(true)).into_js_value();
        generation.settle(future_to_promise(run), &stop_now);
        generation
    }
}

impl Inner {
    /// The model's tokenizer, or the error that says it has none.
    fn tokenizer(&self) -> Result<&Tokenizer, JsValue> {
        self.tokenizer.as_ref().ok_or_else(|| {
            js_error(format!(
                "{}: the model has no tokenizer (tokenizer.json or GGUF vocabulary), so it \
                 cannot take text; Model.eval runs token ids",
                self.name
            ))
        })
    }

    /// Generates after `prompt` (a rendered chat template when `chat`).
    async fn run(
        &self,
        prompt: &str,
        chat: bool,
        options: &GenerateOptions,
        observer: &mut PageObserver,
    ) -> Result<GenerationStats, JsValue> {
        let tokenizer = self.tokenizer()?;
        let ids = js(generate::prompt_ids(&self.llama, tokenizer, prompt, chat))?;
        let sampling = Sampling {
            temperature: options.temperature,
            top_k: options.top_k,
            top_p: options.top_p,
            seed: options.seed,
        };
        let chunks = match options.prompt_chunk {
            Some(n) => PromptChunks::Tokens(n),
            None => PromptChunks::Seconds(PROMPT_CHUNK_SECS),
        };
        let pacing = Pacing::for_device(self.llama.device(), chunks);
        let mut cache = self.prompt_cache.take();
        let s = js(generate::run_async(
            &self.llama,
            tokenizer,
            ids,
            &mut cache,
            options.max_tokens,
            sampling,
            pacing,
            observer,
        )
        .await)?;
        self.prompt_cache.replace(cache);
        Ok(GenerationStats {
            prompt_tokens: s.prompt_tokens,
            prompt_tokens_run: s.prompt_tokens_run,
            prompt_tokens_reused: s.prompt_tokens_reused,
            generated_tokens: s.generated_tokens,
            prompt_secs: s.prompt_secs,
            decode_secs: s.decode_secs,
            tokens_per_sec: s.decode_tokens_per_sec(),
            stopped_at_eos: s.stopped_at_eos,
            stopped: s.stopped,
            text: std::mem::take(&mut observer.text),
        })
    }
}
