//! Llama models in the browser: loading from bytes, `File`s, a URL or the built-in model, and
//! generating text as a stream of pieces with a stop control, from a prompt (`generate`) or a
//! conversation rendered with the model's chat template (`chat`).
//!
//! Generation uses the library's engine as it is: `generate::prepare` tokenizes the prompt
//! and sizes the cache, tokens are drawn on the device (`Llama::next_tokens_on_device` for
//! the prompt, then `Llama::decode_on_device` for `generate::MULTI_STEP` tokens per submit,
//! each fed to the next step without leaving the GPU), and only their ids are read back,
//! asynchronously: one readback per eight tokens instead of a map of the logits per token,
//! which costs milliseconds in a browser.

use std::cell::Cell;

use js_sys::Function;
use std::collections::VecDeque;
use wasm_bindgen::prelude::*;
use webtensor::bench::clock::{now_secs, pause};

use webtensor::model::generate;
use webtensor::model::{
    builtin, ChatMessage, ChatOptions, FileBytes, Llama, ModelFiles, Sampler, Sampling,
    SequenceInput, Tokenizer,
};

use crate::device::Device;
use crate::error::{js, js_error, to_js_object};
use crate::load::{read_file, report};
use crate::{cache, estimate};

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &'static str = r#"
/** Called while loading: `phase` is "read", "download", "parse" or "upload". */
export type ProgressCallback = (phase: string, done: number, total: number) => void;

/** Called with each piece of generated text (never half a character). */
export type TokenCallback = (piece: string, generated: number, tokensPerSec: number) => void;
"#;

/// A loaded model with its tokenizer, ready to generate.
#[wasm_bindgen]
pub struct Model {
    llama: Llama,
    tokenizer: Tokenizer,
    name: String,
    stop: Cell<bool>,
    busy: Cell<bool>,
}

/// Sampling and length of one generation; every field is optional.
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
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 64,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl GenerateOptions {
    fn from_js(value: &JsValue) -> Result<Self, JsValue> {
        if value.is_undefined() || value.is_null() {
            return Ok(Self::default());
        }
        let text: String = js_sys::JSON::stringify(value)?.into();
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
        Ok(o)
    }
}

/// What a generation did and how fast: what `generate` and `chat` resolve with.
#[derive(serde::Serialize, tsify::Tsify)]
#[serde(rename_all = "camelCase")]
pub struct GenerationStats {
    /// Tokens of the prompt (after the chat template, for `chat`).
    prompt_tokens: usize,
    /// Tokens generated.
    generated_tokens: usize,
    /// Seconds of the prompt pass, up to the first generated token.
    prompt_secs: f64,
    /// Seconds of decoding after the prompt pass.
    decode_secs: f64,
    /// Generated tokens per second after the first.
    tokens_per_sec: f64,
    /// Whether the model's end-of-sequence or end-of-turn token ended it.
    stopped_at_eos: bool,
    /// Whether `Model.stop()` ended it.
    stopped: bool,
    /// The generated text.
    text: String,
}

/// Clears the model's busy flag when a generation ends, however it ends.
struct BusyGuard<'a>(&'a Cell<bool>);

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
    ) -> Result<Model, JsValue> {
        report(progress.as_ref(), "parse", 0.0, 1.0);
        let files = js(builtin::files())?;
        Model::place(device, files, builtin::NAME, progress.as_ref()).await
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
    ) -> Result<Model, JsValue> {
        Model::from_gguf(device, bytes, &name, progress.as_ref()).await
    }

    /// A model from files the user picked: one `.gguf` file, or a Hugging Face folder's
    /// `config.json`, `tokenizer.json` and `*.safetensors`, with `tokenizer_config.json`
    /// (or `chat_template.jinja`) for chat and `generation_config.json` (e.g. from
    /// `<input type=file webkitdirectory>`). Progress reports the bytes read.
    #[wasm_bindgen(js_name = fromFiles)]
    pub async fn from_files(
        device: &Device,
        #[wasm_bindgen(unchecked_param_type = "FileList | File[]")] files: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ProgressCallback | null")] progress: Option<
            Function,
        >,
    ) -> Result<Model, JsValue> {
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
            let bytes = read_file(gguf, progress).await?;
            return Model::from_gguf(device, bytes, &gguf.name(), progress).await;
        }
        let config = read_text(&files, "config.json").await?.ok_or_else(|| {
            js_error("fromFiles: pick a .gguf file, or a folder with config.json and *.safetensors")
        })?;
        let tokenizer = read_text(&files, "tokenizer.json").await?;
        let mut shards = with_suffix(".safetensors");
        shards.sort_by_key(|f| f.name());
        if shards.is_empty() {
            return Err(js_error("fromFiles: the folder has no *.safetensors file"));
        }
        let mut parts = Vec::new();
        for f in shards {
            parts.push((f.name(), FileBytes::Owned(read_file(f, progress).await?)));
        }
        report(progress, "parse", 0.0, 1.0);
        let mut model_files = js(ModelFiles::from_parts(&config, parts, tokenizer.as_deref()))?;
        let tokenizer_config = read_text(&files, "tokenizer_config.json").await?;
        let jinja = read_text(&files, "chat_template.jinja").await?;
        js(model_files.add_tokenizer_config(tokenizer_config.as_deref(), jinja.as_deref()))?;
        if let Some(generation) = read_text(&files, "generation_config.json").await? {
            js(model_files.add_generation_config(&generation))?;
        }
        Model::place(device, model_files, "model folder", progress).await
    }

    /// A model from the URL of a GGUF file: from the browser's cache when an earlier load put
    /// it there (progress phase "cache"), else fetched (phase "download") and kept in the
    /// cache for the next visit (see `cachedModels`, `deleteCachedModel`). Before a
    /// download the model is sized from its header (`estimateModel`) and refused with a
    /// `ModelTooLargeError` when the device or the page cannot hold it.
    #[wasm_bindgen(js_name = fromUrl)]
    pub async fn from_url(
        device: &Device,
        url: String,
        #[wasm_bindgen(unchecked_optional_param_type = "ProgressCallback | null")] progress: Option<
            Function,
        >,
    ) -> Result<Model, JsValue> {
        if !cache::contains(&url).await? {
            // Refuse a model too large for this device or page before downloading it.
            estimate::check_fits(device, &url).await?;
        }
        let bytes = cache::fetch_cached(&url, progress.as_ref()).await?;
        let model = Model::from_gguf(device, bytes, &url, progress.as_ref()).await;
        if model.is_err() {
            // Keep no bytes that are not a model this device can load.
            cache::forget(&url).await?;
        }
        model
    }

    /// The model's name (file name, URL, or the built-in model's).
    #[wasm_bindgen(getter)]
    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// The model's hyper-parameters (`config.json`'s fields).
    pub fn config(&self) -> Result<JsValue, JsValue> {
        to_js_object(&self.llama.config)
    }

    /// The model's chat template (Jinja), or `undefined` when it has none (then `chat` is
    /// refused; use `generate`).
    #[wasm_bindgen(getter, js_name = chatTemplate)]
    pub fn chat_template(&self) -> Option<String> {
        self.tokenizer.chat_template().map(str::to_string)
    }

    /// Generates up to `options.maxTokens` tokens after `prompt`, calling `onToken` with each
    /// piece of text as it is decoded, and resolves with the statistics and the whole text.
    /// Ends early at the model's end-of-sequence or end-of-turn token, when the context is
    /// full, or when [`Model::stop`] is called. One generation at a time per model.
    #[wasm_bindgen(unchecked_return_type = "GenerationStats")]
    pub async fn generate(
        &self,
        prompt: String,
        #[wasm_bindgen(unchecked_optional_param_type = "GenerateOptions | null")] options: JsValue,
        #[wasm_bindgen(
            js_name = "onToken",
            unchecked_optional_param_type = "TokenCallback | null"
        )]
        on_token: Option<Function>,
    ) -> Result<JsValue, JsValue> {
        let options = GenerateOptions::from_js(&options)?;
        if self.busy.replace(true) {
            return Err(js_error(
                "generate: this model is already generating; stop it or wait for it",
            ));
        }
        let _guard = BusyGuard(&self.busy);
        self.stop.set(false);
        let stats = self
            .run(&prompt, false, &options, on_token.as_ref())
            .await?;
        to_js_object(&stats)
    }

    /// The assistant's next turn in a conversation: `messages` (`{role, content}` objects)
    /// rendered with the model's chat template, then generated as `generate` does, ending at
    /// the end of the turn. Add the reply (`stats.text`) to `messages` as an "assistant"
    /// message for the next turn.
    #[wasm_bindgen(unchecked_return_type = "GenerationStats")]
    pub async fn chat(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ChatMessage[]")] messages: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "GenerateOptions | null")] options: JsValue,
        #[wasm_bindgen(
            js_name = "onToken",
            unchecked_optional_param_type = "TokenCallback | null"
        )]
        on_token: Option<Function>,
    ) -> Result<JsValue, JsValue> {
        let options = GenerateOptions::from_js(&options)?;
        let text: String = js_sys::JSON::stringify(&messages)?.into();
        let messages: Vec<ChatMessage> = serde_json::from_str(&text).map_err(|e| {
            js_error(format!(
                "chat: messages must be an array of {{role, content}} strings: {e}"
            ))
        })?;
        let chat = ChatOptions {
            add_generation_prompt: true,
            now: None,
        };
        let prompt = js(self.tokenizer.render_chat(&messages, &chat))?;
        if self.busy.replace(true) {
            return Err(js_error(
                "chat: this model is already generating; stop it or wait for it",
            ));
        }
        let _guard = BusyGuard(&self.busy);
        self.stop.set(false);
        let stats = self.run(&prompt, true, &options, on_token.as_ref()).await?;
        to_js_object(&stats)
    }

    /// Asks a running generation to end after its current token.
    pub fn stop(&self) {
        self.stop.set(true);
    }
}

/// The text of the file called `name` among `files`, if there is one.
async fn read_text(files: &[web_sys::File], name: &str) -> Result<Option<String>, JsValue> {
    match files.iter().find(|f| f.name() == name) {
        Some(f) => String::from_utf8(read_file(f, None).await?)
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
    ) -> Result<Model, JsValue> {
        report(progress, "parse", 0.0, 1.0);
        let files = js(ModelFiles::from_gguf(name, FileBytes::Owned(bytes)))?;
        Model::place(device, files, name, progress).await
    }

    /// Uploads the weights to the device.
    async fn place(
        device: &Device,
        files: ModelFiles,
        name: &str,
        progress: Option<&Function>,
    ) -> Result<Model, JsValue> {
        let tokenizer = files.tokenizer.clone().ok_or_else(|| {
            js_error(format!(
                "{name}: the model has no tokenizer (tokenizer.json or GGUF vocabulary)"
            ))
        })?;
        report(progress, "upload", 0.0, 1.0);
        // Let the page show the phase before the (synchronous) upload.
        pause().await;
        let llama = js(Llama::load(&device.inner, files))?;
        report(progress, "upload", 1.0, 1.0);
        Ok(Model {
            llama,
            tokenizer,
            name: name.to_string(),
            stop: Cell::new(false),
            busy: Cell::new(false),
        })
    }

    /// Generates after `prompt` (a rendered chat template when `chat`).
    async fn run(
        &self,
        prompt: &str,
        chat: bool,
        options: &GenerateOptions,
        on_token: Option<&Function>,
    ) -> Result<GenerationStats, JsValue> {
        let (ids, mut cache) = js(generate::prepare_prompt(
            &self.llama,
            &self.tokenizer,
            prompt,
            chat,
            options.max_tokens,
        ))?;
        let mut sampler = Sampler::new(Sampling {
            temperature: options.temperature,
            top_k: options.top_k,
            top_p: options.top_p,
            seed: options.seed,
        });
        let mut decoder = self.tokenizer.stream();
        let mut stats = GenerationStats {
            prompt_tokens: ids.len(),
            generated_tokens: 0,
            prompt_secs: 0.0,
            decode_secs: 0.0,
            tokens_per_sec: 0.0,
            stopped_at_eos: false,
            stopped: false,
            text: String::new(),
        };
        let start = now_secs();
        let first = js(self.llama.next_tokens_on_device(
            &mut [SequenceInput {
                tokens: &ids,
                cache: &mut cache,
            }],
            &mut sampler,
        ))?;
        let mut queue: VecDeque<u32> = js(first.to_vec_async::<u32>().await)?.into();
        let decode_start = now_secs();
        stats.prompt_secs = decode_start - start;
        let emit = |piece: &str, stats: &mut GenerationStats| {
            stats.text.push_str(piece);
            if let Some(f) = on_token {
                let _ = f.call3(
                    &JsValue::NULL,
                    &JsValue::from_str(piece),
                    &JsValue::from(stats.generated_tokens as f64),
                    &JsValue::from(stats.tokens_per_sec),
                );
            }
        };
        let mut last = 0;
        loop {
            let Some(next) = queue.pop_front() else {
                // Refill: several steps recorded into one submit, their ids read back once.
                let steps =
                    generate::next_steps(&cache, options.max_tokens - stats.generated_tokens);
                if steps == 0 {
                    break;
                }
                let ids = js(self
                    .llama
                    .decode_on_device(last, &mut cache, steps, &mut sampler))?;
                queue.extend(js(ids.to_vec_async::<u32>().await)?);
                continue;
            };
            if generate::is_stop(&self.llama, &self.tokenizer, next) {
                stats.stopped_at_eos = true;
                break;
            }
            stats.generated_tokens += 1;
            stats.decode_secs = now_secs() - decode_start;
            stats.tokens_per_sec =
                stats.generated_tokens.saturating_sub(1) as f64 / stats.decode_secs.max(1e-9);
            let piece = decoder.push(next);
            emit(&piece, &mut stats);
            // Let the page repaint and take a click on "stop" (the cpu backend never yields
            // on its own).
            pause().await;
            if self.stop.get() {
                stats.stopped = true;
                break;
            }
            if stats.generated_tokens >= options.max_tokens {
                break;
            }
            last = next;
        }
        stats.decode_secs = now_secs() - decode_start;
        let tail = decoder.finish();
        if !tail.is_empty() {
            emit(&tail, &mut stats);
        }
        Ok(stats)
    }
}
