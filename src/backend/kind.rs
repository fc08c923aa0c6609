//! [`BackendKind`]: which backend, as a value.
//!
//! A leaf module (std and serde only), so [`crate::error`] can name the backend of an error
//! without importing the backends that construct errors. Parsing a name, which can fail with an
//! [`crate::Error`], lives beside the trait in `backend/mod.rs`.

use std::fmt;

/// Which backend.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub enum BackendKind {
    /// NVIDIA GPUs through CUDA (cargo feature `cuda`).
    Cuda,
    /// GPUs through wgpu: Vulkan, Metal, DX12, WebGPU.
    Wgpu,
    /// Multi-threaded SIMD CPU code.
    Cpu,
    /// Scalar f64-accumulating oracle.
    Reference,
}

impl BackendKind {
    /// Every backend, in the default priority order.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Cuda,
        BackendKind::Wgpu,
        BackendKind::Cpu,
        BackendKind::Reference,
    ];

    /// The name used in `WEBTENSOR_BACKEND`, `webtensor.toml` and `Device::new`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cpu => "cpu",
            BackendKind::Reference => "reference",
        }
    }

    /// Whether the backend keeps tensors in host memory (`Storage::Host`).
    pub fn is_host(self) -> bool {
        matches!(self, BackendKind::Cpu | BackendKind::Reference)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
