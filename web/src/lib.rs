//! webtensor in the browser: a JavaScript API over the library, built by `web/build.sh` into
//! `web/pkg` (an ES module, `webtensor.js`, with TypeScript definitions).
//!
//! The same crate runs here as natively: the `wgpu` backend on the browser's WebGPU (the same
//! WGSL shaders), the `cpu` backend with wasm simd128, and the `reference` backend. It is built
//! twice: `web/pkg` on one thread with WebGPU, and `web/pkg/threads` (nightly `build-std` with
//! wasm atomics) cpu-only on a pool of Web Workers for cross-origin isolated pages;
//! `web/pkg/load.js` picks one. Everything that waits for the GPU returns a `Promise`; every
//! failure rejects with a JavaScript `Error` carrying the library's message.
//!
//! ```js
//! import init, { createDevice, opSilu } from "./pkg/webtensor.js";
//! await init();
//! const dev = await createDevice();            // or createDevice("wgpu"), "cpu", "reference"
//! const x = dev.tensor(new Float32Array([1, -2, 3]), [1, 3]);
//! const y = await opSilu(x).toArray();          // Float32Array
//! ```
//!
//! * [`device`]: `createDevice`, `Device` (capabilities, tensors from typed arrays).
//! * [`tensor`]: `Tensor` and its async readback.
//! * [`ops`]: the op set as functions over tensors.
//! * [`model`]: loading a Llama model (bytes, `File`s, a URL, the built-in one) and streaming
//!   generation (a callback, or `for await`) with a stop control and `AbortSignal`s.
//! * [`worker`]: `createWorkerModel`, the same model API running in a Web Worker.
//! * [`cache`]: models fetched by URL kept in Cache Storage: `cachedModels`,
//!   `deleteCachedModel`.
//! * [`estimate`]: the memory a GGUF model needs, from its header, before the download
//!   (`estimateModel`; `Model.fromUrl` refuses what does not fit with `ModelTooLargeError`).
//! * [`bench`]: the op benchmarks of `webtensor bench`, with the same JSON report.

pub mod bench;
pub mod cache;
pub mod device;
mod error;
pub mod estimate;
mod generation;
mod load;
pub mod model;
pub mod ops;
pub mod tensor;
pub mod worker;

pub use device::{create_device, Device};
pub use model::Model;
pub use tensor::Tensor;

use wasm_bindgen::prelude::*;

/// Runs when the module is instantiated: routes Rust panics (bugs, never user input) to the
/// browser console with their message instead of a bare "unreachable".
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        web_sys::console::error_1(&JsValue::from_str(&format!("webtensor panicked: {info}")));
    }));
}

/// Starts the cpu backend's thread pool of `n` Web Workers (`initThreadPool(n)`, a Promise);
/// only in the threaded build (`web/pkg/threads/`), which needs a cross-origin isolated page.
/// Call it once, after `init()` and before the first `createDevice`.
#[cfg(target_feature = "atomics")]
pub use wasm_bindgen_rayon::init_thread_pool;

/// Whether this is the threaded build (`web/pkg/threads/`: cpu only, a pool of Web Workers)
/// rather than the one-thread build (WebGPU and a one-thread cpu backend).
#[wasm_bindgen]
pub fn threaded() -> bool {
    cfg!(target_feature = "atomics")
}

/// The library's version.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
