// Picks and starts one of webtensor's two wasm builds (web/build.sh):
//  - the one-thread build (webtensor.js): WebGPU, and the cpu backend on one thread;
//  - the threaded build (threads/webtensor.js): the cpu backend only, on a pool of Web Workers
//    sharing the module's memory. Shared memory needs a cross-origin isolated page
//    (Cross-Origin-Opener-Policy: same-origin, Cross-Origin-Embedder-Policy: require-corp).
// web/build.sh copies this file to web/pkg/load.js and web/pkg/threads/load.js; either copy
// finds both builds. createWorkerModel's worker loads through it as well, and is the better
// home for the threaded build: on the page's own thread, which may not block, the caller
// spin-waits for the pool's work instead of sleeping.

const here = new URL("./", import.meta.url);
const inThreads = here.pathname.endsWith("/threads/");
const ONE_THREAD = new URL(inThreads ? "../webtensor.js" : "webtensor.js", here).href;
const THREADED = new URL(inThreads ? "webtensor.js" : "threads/webtensor.js", here).href;

/// The most workers `defaultThreads` picks: decode reads the weights once per token, so past a
/// few cores memory bandwidth, not arithmetic, sets the speed.
const MAX_DEFAULT_THREADS = 8;

/// Whether this page (or worker) may share memory between threads.
export function threadsAvailable() {
  return globalThis.crossOriginIsolated === true && typeof SharedArrayBuffer === "function";
}

/// The thread count used when none is given: the machine's cores, at most 8.
export function defaultThreads() {
  const cores = globalThis.navigator?.hardwareConcurrency || 1;
  return Math.max(1, Math.min(cores, MAX_DEFAULT_THREADS));
}

/// Which build `loadWebtensor` picks for these options: "threads" when the backend is "cpu",
/// more than one thread is wanted and the page is cross-origin isolated; otherwise "one-thread".
export function pickBuild({ backend, threads } = {}) {
  const n = threads ?? defaultThreads();
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`threads must be a whole number ≥ 1, got ${threads}`);
  return backend === "cpu" && n > 1 && threadsAvailable() ? "threads" : "one-thread";
}

/// The pool's start, kept on the global object: pkg/load.js and pkg/threads/load.js are two
/// module instances, and the threaded module's pool can be started only once.
const POOL = Symbol.for("webtensor.threadPool");

/// Imports and initialises the build `pickBuild` chooses, starts the threaded build's pool of
/// `threads` workers (once per page: a later call keeps the first pool's size) and resolves
/// with the module, whose exports are webtensor.js's (`createDevice`, `Model`, ...).
/// `options`: `backend` ("wgpu", "cpu", "reference", or absent) and `threads` (default
/// `defaultThreads()`).
export async function loadWebtensor(options = {}) {
  const build = pickBuild(options);
  const wt = await import(build === "threads" ? THREADED : ONE_THREAD);
  await wt.default();
  if (build === "threads") {
    globalThis[POOL] ??= wt.initThreadPool(options.threads ?? defaultThreads());
    await globalThis[POOL];
  }
  return wt;
}
