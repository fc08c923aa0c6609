//! Placeholder: the wgpu backend is being written.
use crate::backend::*;
use crate::error::Result;

/// A wgpu buffer.
#[derive(Clone, Debug)]
pub struct GpuBuffer;

/// The wgpu backend.
#[derive(Debug)]
pub struct WgpuBackend;

impl WgpuBackend {
    /// Starts the backend.
    pub fn new() -> std::result::Result<Self, String> {
        Err("not yet written".into())
    }
}

impl Backend for WgpuBackend {
    fn kind(&self) -> BackendKind { BackendKind::Wgpu }
    fn info(&self) -> BackendInfo { unimplemented!() }
    fn upload(&self, _data: HostData) -> Result<Storage> { unimplemented!() }
    fn download(&self, _storage: &Storage) -> Result<HostData> { unimplemented!() }
    fn copy(&self, x: &Storage, len: usize) -> Result<Storage> { reference::ReferenceBackend.copy(x, len) }
    fn execute(&self, _spec: &OpSpec, _inputs: &[&Storage]) -> Result<Storage> { unimplemented!() }
}
