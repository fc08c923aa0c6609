// Generation off the page's thread. `createWorkerModel` (exported by webtensor.js) starts this
// module as a module Web Worker, which loads webtensor there, creates the device and loads the
// model; the page gets a model with the API of `Model` (generate/chat as a `Generation`: a
// promise of the statistics and an async iterator of the pieces), while the page's thread only
// passes messages. The same file is both sides: it runs the worker only when started as one
// (a worker named WORKER_NAME).
import { Generation } from "./generation.js";

const WORKER_NAME = "webtensor-model";

/// Page side: starts the worker and loads a model in it. `options`: `backend` ("wgpu", "cpu",
/// "reference"; auto when absent), `threads` (the cpu backend's threads: on a cross-origin
/// isolated page with backend "cpu" the worker loads the threaded build, pkg/load.js),
/// `source` (`{ builtin: true }`, `{ url }`, `{ files }`, or `{ bytes, name }`),
/// `progress(phase, done, total)`, and `signal` (an AbortSignal that cancels the load).
/// Resolves with a WorkerModel.
export async function makeWorkerModel(options = {}) {
  const { backend, threads, source = { builtin: true }, progress, signal } = options;
  if (signal?.aborted) throw signal.reason;
  const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module", name: WORKER_NAME });
  const model = new WorkerModel(worker);
  try {
    const loaded = await model._call({ op: "load", backend, threads, source }, { progress, signal });
    Object.assign(model, loaded);
    return model;
  } catch (e) {
    worker.terminate();
    throw e;
  }
}

/// Rebuilds an error the worker posted as a JavaScript Error (or DOMException).
function revive({ name, message }) {
  if (name === "AbortError") return new DOMException(message, "AbortError");
  const e = new Error(message);
  if (name && name !== "Error") e.name = name;
  return e;
}

/// A model loaded in a Web Worker. `name`, `chatTemplate`, `activationPath`, `backend` and
/// `deviceInfo` are plain properties; `config()` answers at once.
class WorkerModel {
  constructor(worker) {
    this._worker = worker;
    this._next = 1;
    this._pending = new Map();
    worker.onmessage = (e) => this._receive(e.data);
    worker.onerror = (e) => this._failAll(new Error(`webtensor worker: ${e.message ?? "failed to start"}`));
  }

  _receive(m) {
    if (m.type === "error" && !m.id) return this._failAll(revive(m.error));
    const p = this._pending.get(m.id);
    if (!p) return;
    if (m.type === "progress") p.progress?.(m.phase, m.done, m.total);
    else if (m.type === "piece") p.generation?.push(m.piece, m.generated, m.tokensPerSec);
    else {
      this._pending.delete(m.id);
      p.cleanup?.();
      if (m.type === "error") p.reject(revive(m.error));
      else p.resolve(m.value);
    }
  }

  _failAll(error) {
    for (const p of this._pending.values()) p.reject(error);
    this._pending.clear();
  }

  /// Posts `message` with a fresh id; resolves with the worker's answer.
  _call(message, { progress, signal, generation } = {}) {
    const id = this._next++;
    return new Promise((resolve, reject) => {
      const entry = { resolve, reject, progress, generation };
      if (signal) {
        const onAbort = () => this._worker.postMessage({ op: "abort", id });
        signal.addEventListener("abort", onAbort, { once: true });
        entry.cleanup = () => signal.removeEventListener("abort", onAbort);
        // A load rejects with the page's own reason.
        if (message.op === "load") {
          entry.reject = (e) => reject(e?.name === "AbortError" && signal.aborted ? signal.reason : e);
        }
      }
      this._pending.set(id, entry);
      this._worker.postMessage({ ...message, id, wantProgress: !!progress });
    });
  }

  config() {
    return this._config;
  }

  /// As Model.generate: a Generation (await it, or iterate it).
  generate(prompt, options, onToken) {
    return this._generate("generate", prompt, options, onToken);
  }

  /// As Model.chat.
  chat(messages, options, onToken) {
    return this._generate("chat", messages, options, onToken);
  }

  _generate(op, input, options = {}, onToken) {
    const generation = new Generation(onToken);
    const { signal, ...rest } = options ?? {};
    let id;
    let result;
    try {
      if (signal?.aborted) throw signal.reason;
      id = this._next;
      result = this._call({ op, input, options: rest }, { signal, generation });
    } catch (e) {
      result = Promise.reject(e);
    }
    generation.settle(result, () => this._worker.postMessage({ op: "abort", id }));
    return generation;
  }

  /// Asks the running generation to end after its current step.
  stop() {
    for (const [id, p] of this._pending) if (p.generation) this._worker.postMessage({ op: "abort", id });
  }

  /// Forgets the keys and values the model kept from its last generation (Model.clearCache);
  /// a generation asked for after it runs its whole prompt (messages arrive in order).
  clearCache() {
    this._worker.postMessage({ op: "clearCache" });
  }

  /// Ends the worker (and frees the model's memory); the model cannot be used afterwards.
  terminate() {
    this._worker.terminate();
    this._failAll(new Error("the worker model was terminated"));
  }
}

/// Worker side: one device and one model per worker.
async function serve() {
  // This file sits in <build>/snippets/<crate>/js/; load.js is at the build's root and picks
  // the threaded build or the one-thread one for each load.
  const { loadWebtensor } = await import("../../../load.js");
  let model = null;
  const aborts = new Map();
  const post = (m) => self.postMessage(m);
  const fail = (id, e) =>
    post({ id, type: "error", error: { name: e?.name ?? "Error", message: String(e?.message ?? e) } });

  async function load(m) {
    const controller = new AbortController();
    aborts.set(m.id, controller);
    const progress = m.wantProgress ? (phase, done, total) => post({ id: m.id, type: "progress", phase, done, total }) : null;
    try {
      const wt = await loadWebtensor({ backend: m.backend ?? undefined, threads: m.threads ?? undefined });
      const device = await wt.createDevice(m.backend ?? undefined);
      const s = m.source;
      const signal = controller.signal;
      if (s.url) model = await wt.Model.fromUrl(device, s.url, progress, signal);
      else if (s.files) model = await wt.Model.fromFiles(device, s.files, progress, signal);
      else if (s.bytes) model = await wt.Model.fromBytes(device, new Uint8Array(s.bytes), s.name ?? "model.gguf", progress, signal);
      else model = await wt.Model.builtin(device, progress, signal);
      const value = {
        name: model.name,
        chatTemplate: model.chatTemplate,
        activationPath: model.activationPath,
        _config: model.config(),
        backend: device.backend,
        deviceInfo: device.info(),
      };
      post({ id: m.id, type: "done", value });
    } catch (e) {
      fail(m.id, e);
    } finally {
      aborts.delete(m.id);
    }
  }

  async function generate(m) {
    const controller = new AbortController();
    aborts.set(m.id, controller);
    try {
      if (!model) throw new Error(`${m.op}: no model is loaded`);
      const onToken = (piece, generated, tokensPerSec) => post({ id: m.id, type: "piece", piece, generated, tokensPerSec });
      const options = { ...m.options, signal: controller.signal };
      const stats = await model[m.op](m.input, options, onToken);
      post({ id: m.id, type: "done", value: stats });
    } catch (e) {
      fail(m.id, e);
    } finally {
      aborts.delete(m.id);
    }
  }

  self.onmessage = (e) => {
    const m = e.data;
    if (m.op === "abort") aborts.get(m.id)?.abort();
    else if (m.op === "load") load(m);
    else if (m.op === "generate" || m.op === "chat") generate(m);
    else if (m.op === "clearCache") model?.clearCache();
  };
  post({ type: "ready" });
}

// Once per worker: when the worker started from one build's copy of this file loads the other
// build, that build's copy is evaluated too and must not take over the worker's messages.
const SERVING = Symbol.for("webtensor.workerServing");
if (typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope && self.name === WORKER_NAME && !self[SERVING]) {
  self[SERVING] = true;
  // Messages that arrive while webtensor loads wait in a queue the real handler drains.
  const early = [];
  self.onmessage = (e) => early.push(e);
  serve().then(
    () => early.forEach((e) => self.onmessage(e)),
    (e) => self.postMessage({ id: 0, type: "error", error: { name: "Error", message: `webtensor worker failed to start: ${e?.message ?? e}` } }),
  );
}
