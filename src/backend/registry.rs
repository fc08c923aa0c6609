//! Process-wide backend instances.
//!
//! Starting a backend can be slow (a GPU adapter and device take tens to hundreds of
//! milliseconds, more on a software rasterizer), so each backend is probed once per process
//! and shared by every [`crate::Device`]. A backend that cannot start keeps the reason, which
//! `webtensor info` and errors show. In the browser a GPU adapter can only be requested
//! asynchronously, so [`start_async`] starts the wgpu backend before the first [`get`].

use std::sync::{Arc, OnceLock};

#[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
use super::webgpu::WgpuBackend;
use super::{cpu::CpuBackend, reference::ReferenceBackend};
use super::{BackendKind, BackendRef};

/// The outcome of starting one backend: the backend, or why it is not available here.
pub type Probe = std::result::Result<BackendRef, String>;

static REFERENCE: OnceLock<Probe> = OnceLock::new();
static CPU: OnceLock<Probe> = OnceLock::new();
static WGPU: OnceLock<Probe> = OnceLock::new();
#[cfg(feature = "cuda")]
static CUDA: OnceLock<Probe> = OnceLock::new();

/// Why the threaded wasm build has no wgpu backend.
#[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
const THREADED_NO_WGPU: &str = "this is webtensor's threaded wasm build, which is cpu-only \
     (wgpu's WebGPU objects cannot be shared between threads); load the one-thread build for WebGPU";

/// The process-wide instance of `kind`, started on first use.
pub fn get(kind: BackendKind) -> Probe {
    let cell = match kind {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => &CUDA,
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => {
            return Err("webtensor was built without the `cuda` cargo feature".to_string())
        }
        BackendKind::Wgpu => &WGPU,
        BackendKind::Cpu => &CPU,
        BackendKind::Reference => &REFERENCE,
    };
    cell.get_or_init(|| start(kind)).clone()
}

/// Starts those of `kinds` that need an asynchronous start (wgpu) and are not started yet,
/// without blocking; afterwards [`get`] answers for them at once. Natively nothing needs it.
pub async fn start_async(kinds: &[BackendKind]) {
    #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
    let _ = kinds;
    #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
    if kinds.contains(&BackendKind::Wgpu) && WGPU.get().is_none() {
        let probe = WgpuBackend::new_async()
            .await
            .map(|b| Arc::new(b) as BackendRef);
        // Another task may have finished first; either result is a started backend.
        let _ = WGPU.set(probe);
    }
}

/// A new instance of `kind` for one device alone (see `DeviceBuilder::separate`): a GPU
/// backend starts another logical device on its adapter; host backends, which hold no device,
/// are the shared instance.
pub fn start_separate(kind: BackendKind) -> Probe {
    match kind {
        BackendKind::Cpu | BackendKind::Reference => get(kind),
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => get(kind),
        _ => start(kind),
    }
}

fn start(kind: BackendKind) -> Probe {
    match kind {
        BackendKind::Reference => Ok(Arc::new(ReferenceBackend)),
        BackendKind::Cpu => Ok(Arc::new(CpuBackend::new())),
        #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
        BackendKind::Wgpu => WgpuBackend::new().map(|b| Arc::new(b) as BackendRef),
        #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
        BackendKind::Wgpu => Err(THREADED_NO_WGPU.to_string()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => super::cuda::CudaBackend::new().map(|b| Arc::new(b) as BackendRef),
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => unreachable!("handled in get"),
    }
}
