//! `createWorkerModel`: a model loaded and run in a Web Worker (web/js/worker.js), so that
//! loading and generation never freeze the page. Its API is `Model`'s.

use js_sys::Promise;
use wasm_bindgen::prelude::*;

#[wasm_bindgen(typescript_custom_section)]
const TS_WORKER: &'static str = r#"
/** What `createWorkerModel` loads, and how. */
export interface WorkerModelOptions {
  /** "wgpu", "cpu" or "reference"; the best available when absent. */
  backend?: string;
  /** The cpu backend's threads (default: the cores, at most 8). With backend "cpu" on a
   * cross-origin isolated page the worker loads the threaded build (pkg/threads/); elsewhere
   * the one-thread build. */
  threads?: number;
  /** The model: the built-in one (the default), a GGUF URL, picked files, or GGUF bytes. */
  source?: { builtin: true } | { url: string } | { files: File[] | FileList } | { bytes: ArrayBuffer | Uint8Array; name?: string };
  progress?: ProgressCallback;
  /** Aborting it cancels the load; the promise rejects with its reason. */
  signal?: AbortSignal;
}

/** A model loaded in a Web Worker, with `Model`'s API. */
export interface WorkerModel {
  readonly name: string;
  readonly chatTemplate: string | undefined;
  /** The weight formats and the product each runs, as `Model.activationPath`. */
  readonly activationPath: string;
  /** The worker's device backend ("wgpu", "cpu", "reference"). */
  readonly backend: string;
  /** The worker's `device.info()`. */
  readonly deviceInfo: any;
  config(): any;
  generate(prompt: string, options?: GenerateOptions, onToken?: TokenCallback | null): Generation;
  chat(messages: ChatMessage[], options?: GenerateOptions, onToken?: TokenCallback | null): Generation;
  stop(): void;
  /** Forgets the keys and values kept from the last generation, as `Model.clearCache`. */
  clearCache(): void;
  /** Ends the worker and frees the model. */
  terminate(): void;
}
"#;

#[wasm_bindgen(module = "/js/worker.js")]
extern "C" {
    #[wasm_bindgen(js_name = makeWorkerModel)]
    fn make_worker_model(options: JsValue) -> Promise;
}

/// Starts a module Web Worker, loads webtensor, a device and a model there, and resolves with
/// a `WorkerModel` that generates off the page's thread.
#[wasm_bindgen(js_name = createWorkerModel, unchecked_return_type = "Promise<WorkerModel>")]
pub fn create_worker_model(
    #[wasm_bindgen(unchecked_param_type = "WorkerModelOptions | undefined")] options: JsValue,
) -> Promise {
    make_worker_model(options)
}
