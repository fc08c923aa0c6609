//! Process-wide backend instances, one per backend and set of its options.
//!
//! Starting a backend can be slow (a GPU adapter and device take tens to hundreds of
//! milliseconds, more on a software rasterizer), so each backend is probed once per process
//! and per distinct set of its own [`BackendOptions`] part, and shared by every
//! [`crate::Device`] asking for that set: with the default options there is one instance of
//! each, as before options existed. A backend that cannot start keeps the reason, which
//! `webtensor info` and errors show. In the browser a GPU adapter can only be requested
//! asynchronously, so [`start_async`] starts the wgpu backend before the first [`get`].

use std::sync::{Arc, Mutex, OnceLock};

#[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
use super::webgpu::WgpuBackend;
use super::{cpu::CpuBackend, reference::ReferenceBackend};
use super::{BackendKind, BackendOptions, BackendRef, CpuOptions, CudaOptions, WgpuOptions};

/// The outcome of starting one backend: the backend, or why it is not available here.
pub type Probe = std::result::Result<BackendRef, String>;

/// Which instance: a backend and the part of the options it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Key {
    Reference,
    Cpu(CpuOptions),
    Wgpu(WgpuOptions),
    Cuda(CudaOptions),
}

impl Key {
    fn new(kind: BackendKind, options: &BackendOptions) -> Key {
        match kind {
            BackendKind::Reference => Key::Reference,
            BackendKind::Cpu => Key::Cpu(options.cpu.clone()),
            BackendKind::Wgpu => Key::Wgpu(options.wgpu.clone()),
            BackendKind::Cuda => Key::Cuda(options.cuda.clone()),
        }
    }
}

type Cell = Arc<OnceLock<Probe>>;

/// The instances started or being started; a handful at most, so a list.
static STARTED: Mutex<Vec<(Key, Cell)>> = Mutex::new(Vec::new());

/// The cell of `key`, created empty on first use.
fn cell(key: Key) -> Cell {
    let mut list = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, c)) = list.iter().find(|(k, _)| *k == key) {
        return c.clone();
    }
    let c = Cell::default();
    list.push((key, c.clone()));
    c
}

/// Why the threaded wasm build has no wgpu backend.
#[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
const THREADED_NO_WGPU: &str = "this is webtensor's threaded wasm build, which is cpu-only \
     (wgpu's WebGPU objects cannot be shared between threads); load the one-thread build for WebGPU";

/// The process-wide instance of `kind` with the default options, started on first use.
pub fn get(kind: BackendKind) -> Probe {
    get_with(kind, &BackendOptions::default())
}

/// The process-wide instance of `kind` with `options` (its own part of them), started on
/// first use.
pub fn get_with(kind: BackendKind, options: &BackendOptions) -> Probe {
    #[cfg(not(feature = "cuda"))]
    if kind == BackendKind::Cuda {
        return Err("webtensor was built without the `cuda` cargo feature".to_string());
    }
    cell(Key::new(kind, options))
        .get_or_init(|| start(kind, options))
        .clone()
}

/// [`start_async_with`] with the default options.
pub async fn start_async(kinds: &[BackendKind]) {
    start_async_with(kinds, &BackendOptions::default()).await
}

/// Starts those of `kinds` that need an asynchronous start (wgpu) with `options` and are not
/// started yet, without blocking; afterwards [`get_with`] answers for them at once. Natively
/// nothing needs it.
pub async fn start_async_with(kinds: &[BackendKind], options: &BackendOptions) {
    #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
    let _ = (kinds, options);
    #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
    if kinds.contains(&BackendKind::Wgpu) {
        let cell = cell(Key::new(BackendKind::Wgpu, options));
        if cell.get().is_none() {
            let probe = WgpuBackend::new_async(&options.wgpu)
                .await
                .map(|b| Arc::new(b) as BackendRef);
            // Another task may have finished first; either result is a started backend.
            let _ = cell.set(probe);
        }
    }
}

/// A new instance of `kind` with `options` for one device alone (see
/// `DeviceBuilder::separate`): a GPU backend starts another logical device on its adapter;
/// host backends, which hold no device, are the shared instance.
pub fn start_separate(kind: BackendKind, options: &BackendOptions) -> Probe {
    match kind {
        BackendKind::Cpu | BackendKind::Reference => get_with(kind, options),
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => get_with(kind, options),
        _ => start(kind, options),
    }
}

fn start(kind: BackendKind, options: &BackendOptions) -> Probe {
    match kind {
        BackendKind::Reference => Ok(Arc::new(ReferenceBackend)),
        BackendKind::Cpu => Ok(Arc::new(CpuBackend::with_options(&options.cpu))),
        #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
        BackendKind::Wgpu => WgpuBackend::new(&options.wgpu).map(|b| Arc::new(b) as BackendRef),
        #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
        BackendKind::Wgpu => Err(THREADED_NO_WGPU.to_string()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            super::cuda::CudaBackend::new(&options.cuda).map(|b| Arc::new(b) as BackendRef)
        }
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => unreachable!("handled in get_with"),
    }
}
