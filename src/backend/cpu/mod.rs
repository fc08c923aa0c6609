//! Placeholder: the cpu backend is being written; it runs the reference for now.
use crate::backend::*;
use crate::error::Result;

/// The cpu backend.
#[derive(Debug)]
pub struct CpuBackend;

impl CpuBackend {
    /// Starts the backend.
    pub fn new() -> Self { CpuBackend }
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind { BackendKind::Cpu }
    fn info(&self) -> BackendInfo { let mut i = reference::ReferenceBackend.info(); i.kind = BackendKind::Cpu; i }
    fn upload(&self, data: HostData) -> Result<Storage> { reference::ReferenceBackend.upload(data) }
    fn download(&self, storage: &Storage) -> Result<HostData> { reference::ReferenceBackend.download(storage) }
    fn copy(&self, x: &Storage, len: usize) -> Result<Storage> { reference::ReferenceBackend.copy(x, len) }
    fn execute(&self, spec: &OpSpec, inputs: &[&Storage]) -> Result<Storage> { reference::ReferenceBackend.execute(spec, inputs) }
}
