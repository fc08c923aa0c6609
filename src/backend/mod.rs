//! Backends: the places where ops actually run.
//!
//! Every backend implements one trait, [`Backend`]: upload and download host data, and
//! [`Backend::execute`] one [`OpSpec`] over input storages. The op layer (`crate::ops`) has
//! already checked shapes and dtypes and flattened them into the sizes in the spec, so a backend
//! only computes. `reference` is the scalar oracle every other backend is tested against.
//!
//! Backends are process-wide singletons (see [`registry`]): probing a GPU adapter is slow, so it
//! happens once and every [`crate::Device`] shares the result.

mod capture;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host;
mod host_bytes;
/// The GPU kernels' shared constants: not in the threaded wasm build, which has no GPU backend.
#[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
pub(crate) mod kernel_consts;
pub(crate) mod kind;
pub mod options;
pub mod reference;
pub mod registry;
pub mod spec;
/// Not in the threaded wasm build: wgpu's types are `Send`/`Sync` on wasm only without atomics.
#[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
pub mod webgpu;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use capture::CapturedStep;
pub use host_bytes::{HostBytes, SharedBytes};
pub use kind::BackendKind;
pub use options::{BackendOptions, CpuOptions, CudaOptions, SelfCheck, Switch, WgpuOptions};
pub use spec::{
    Activations, AttentionSpec, BinaryOp, LinearSpec, MatmulSpec, OpKind, OpSpec, PreNorm,
    RopeEpilogue, RopeLayout, SampleParams, ScanOp, UnaryOp,
};

use crate::dtype::DType;
use crate::error::Result;

/// A shared handle to a backend.
pub type BackendRef = Arc<dyn Backend>;

/// The future of an async backend call ([`Backend::download_started`],
/// [`Backend::synchronize_async`]); not `Send`, as the browser's WebGPU objects are not.
pub type BackendFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + 'a>>;

impl BackendKind {
    /// Parses a backend name (case-insensitive); the error lists the valid names.
    pub fn parse(name: &str) -> Result<BackendKind> {
        let wanted = name.trim().to_ascii_lowercase();
        BackendKind::ALL
            .into_iter()
            .find(|k| k.name() == wanted)
            .ok_or_else(|| crate::Error::UnknownBackend {
                name: name.to_string(),
                valid: BackendKind::ALL.map(|k| k.name()).join(", "),
            })
    }
}

/// Tensor data in host memory, tagged with its dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// f32 elements.
    F32(Vec<f32>),
    /// u32 elements.
    U32(Vec<u32>),
    /// Raw little-endian bytes of any other dtype: i32, f16, i8 and the block formats; owned,
    /// or borrowed from a mapped model file.
    Bytes(DType, HostBytes),
}

impl HostData {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::U32(_) => DType::U32,
            HostData::Bytes(d, _) => *d,
        }
    }

    /// Number of storage units: elements of 4-byte types, bytes of packed types (see
    /// [`DType::unit_bytes`]).
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::U32(v) => v.len(),
            HostData::Bytes(d, b) => b.len() / d.unit_bytes(),
        }
    }

    /// No data of `dtype`.
    pub fn empty(dtype: DType) -> HostData {
        match dtype {
            DType::F32 => HostData::F32(Vec::new()),
            DType::U32 => HostData::U32(Vec::new()),
            d => HostData::Bytes(d, Vec::new().into()),
        }
    }

    /// The data as raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            HostData::F32(v) => bytemuck::cast_slice(v),
            HostData::U32(v) => bytemuck::cast_slice(v),
            HostData::Bytes(_, b) => b,
        }
    }

    /// The data as raw little-endian bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            HostData::F32(v) => bytemuck::cast_slice_mut(v),
            HostData::U32(v) => bytemuck::cast_slice_mut(v),
            HostData::Bytes(_, b) => b.to_mut(),
        }
    }

    /// The first `units` storage units, copied.
    pub fn prefix(&self, units: usize) -> HostData {
        match self {
            HostData::F32(v) => HostData::F32(v[..units].to_vec()),
            HostData::U32(v) => HostData::U32(v[..units].to_vec()),
            HostData::Bytes(d, b) => {
                HostData::Bytes(*d, b[..units * d.unit_bytes()].to_vec().into())
            }
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lets the pages of bytes borrowed from a mapped file leave memory
    /// ([`HostBytes::release`]): for a device backend once it holds its own copy, so that the
    /// copy replaces the file's pages instead of sitting beside them.
    pub fn release_borrowed(&self) {
        if let HostData::Bytes(_, b) = self {
            b.release();
        }
    }

    /// The f32 elements, or `None` for another dtype.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            HostData::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The u32 elements, or `None` for another dtype.
    pub fn as_u32(&self) -> Option<&[u32]> {
        match self {
            HostData::U32(v) => Some(v),
            _ => None,
        }
    }
}

/// Where a tensor's elements live. Cloning shares the underlying buffer.
#[derive(Clone, Debug)]
pub enum Storage {
    /// Host memory, used by `cpu` and `reference` (so moving between them is free).
    Host(Arc<HostData>),
    /// A wgpu buffer; returned to its backend's pool when the last handle drops.
    #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
    Wgpu(webgpu::GpuBuffer),
    /// CUDA device memory (cargo feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaBuffer),
}

impl Storage {
    /// The host data, or `None` when the storage lives on a GPU.
    pub fn as_host(&self) -> Option<&HostData> {
        match self {
            Storage::Host(h) => Some(h),
            _ => None,
        }
    }

    /// Whether another handle shares this memory (so writing in place would be seen there).
    pub(crate) fn is_shared(&self) -> bool {
        match self {
            Storage::Host(h) => Arc::strong_count(h) > 1,
            #[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
            Storage::Wgpu(b) => b.is_shared(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(b) => b.is_shared(),
        }
    }
}

/// Whether an adapter is real hardware or a software rasterizer (lavapipe, SwiftShader, WARP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub enum DeviceClass {
    /// A hardware GPU.
    Gpu,
    /// The host CPU (cpu and reference backends).
    Cpu,
    /// A GPU API implemented in software on the CPU: correct but slow.
    Software,
    /// A device that accepts every call and runs no kernel (wgpu's `noop` backend, cargo
    /// feature `wgpu-noop`): its results are meaningless; it times the host side alone.
    Noop,
}

/// What a backend is and can do: shown by `webtensor info` and used by `Device::auto`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct BackendInfo {
    /// Which backend.
    pub kind: BackendKind,
    /// Hardware or software.
    pub class: DeviceClass,
    /// Adapter or CPU model name.
    pub device_name: String,
    /// Vendor name or PCI vendor id.
    pub vendor: String,
    /// Driver name and version, where known.
    pub driver: String,
    /// The API under the backend (Vulkan, Metal, DX12, WebGPU, native).
    pub api: String,
    /// Optional features present: `shader-f16`, `subgroups`, `timestamp-query`, SIMD levels.
    pub features: Vec<String>,
    /// Key limits as (name, value) pairs.
    pub limits: Vec<(String, u64)>,
    /// Threads the backend uses (CPU backends).
    pub threads: Option<usize>,
    /// The SIMD instruction set in use (CPU backend).
    pub simd: Option<String>,
    /// Ops this backend does not implement; those fall back to the next backend.
    pub missing_ops: Vec<OpKind>,
    /// How f16 data is computed on: natively, or widened from 16-bit storage.
    pub f16_path: String,
    /// How the GPU kernels reduce across threads (subgroup operations or workgroup memory),
    /// and why; empty for backends without such a choice.
    #[serde(default)]
    pub reductions: String,
    /// How prefill products with packed weights run (in tiles, or through the row-dot
    /// kernel), and why; empty for backends without such a choice.
    #[serde(default)]
    pub prefill: String,
    /// The per-kernel GPU timestamp profiler ([`Backend::kernel_profile`]) when it was asked
    /// for: on, or why it is unavailable; empty when not asked for or not offered.
    #[serde(default)]
    pub profiler: String,
    /// The options this backend was started with (its own part of [`BackendOptions`]), as
    /// (`wgpu.row_teams`, `auto`) pairs; empty for the reference, which has none.
    #[serde(default)]
    pub options: Vec<(String, String)>,
    /// The kernel variants in effect, after the options, the adapter's features and the
    /// self-check (wgpu: `row_teams`, `subgroups`, `shader_f16`, `int_dot`, `tiled_prefill`,
    /// `weight_texels`, `profile`, each listed when on; cuda: `graphs`); empty for backends
    /// without such variants. Tests assert an option took effect through it.
    #[serde(default)]
    pub variants: Vec<String>,
}

/// Cumulative GPU time per kernel, measured with timestamp queries around each dispatch
/// (the wgpu backend with the option `wgpu.profile`): see [`Backend::kernel_profile`].
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct KernelProfile {
    /// One entry per kernel dispatched since the backend started, sorted by label.
    pub kernels: Vec<KernelTime>,
    /// Submits whose timestamps were read back.
    pub submits: u64,
    /// The sum over those submits of each one's GPU span, from its first dispatch's start to
    /// its last dispatch's end, in nanoseconds: kernel time plus the gaps between kernels.
    pub span_ns: f64,
}

/// One kernel's totals in a [`KernelProfile`].
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct KernelTime {
    /// Shader module and entry point, e.g. `quant::mv[q4_0 int8]` (the bracket names the
    /// weight format a specialised kernel was compiled for).
    pub label: String,
    /// Dispatches timed.
    pub dispatches: u64,
    /// GPU time of those dispatches (each from its pass's start to its end), in nanoseconds.
    pub gpu_ns: f64,
}

impl KernelProfile {
    /// The sum of every kernel's GPU time, in nanoseconds.
    pub fn kernel_ns(&self) -> f64 {
        self.kernels.iter().map(|k| k.gpu_ns).sum()
    }

    /// What was measured after `earlier` (a profile of the same backend taken before this
    /// one): the difference of the totals, kernels without new dispatches left out.
    pub fn since(&self, earlier: &KernelProfile) -> KernelProfile {
        let kernels = self
            .kernels
            .iter()
            .filter_map(|k| {
                let before = earlier.kernels.iter().find(|e| e.label == k.label);
                let dispatches = k.dispatches - before.map_or(0, |e| e.dispatches);
                (dispatches > 0).then(|| KernelTime {
                    label: k.label.clone(),
                    dispatches,
                    gpu_ns: k.gpu_ns - before.map_or(0.0, |e| e.gpu_ns),
                })
            })
            .collect();
        KernelProfile {
            kernels,
            submits: self.submits - earlier.submits,
            span_ns: self.span_ns - earlier.span_ns,
        }
    }
}

/// What a recording backend has sent the device since it started ([`Backend::recorded_work`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordedWork {
    /// Kernel dispatches recorded.
    pub dispatches: u64,
    /// Submits that carried recorded work to the device.
    pub submits: u64,
}

impl RecordedWork {
    /// What was sent after `earlier` (a reading of the same backend).
    pub fn since(self, earlier: RecordedWork) -> RecordedWork {
        RecordedWork {
            dispatches: self.dispatches - earlier.dispatches,
            submits: self.submits - earlier.submits,
        }
    }
}

/// One place where ops run. Implementations must be thread-safe: a device may be used from
/// several threads.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Identity, features and limits.
    fn info(&self) -> BackendInfo;

    /// Whether this backend implements `op` for inputs of `dtype`. Ops it lacks run on the next
    /// backend of the device's priority list.
    fn supports(&self, op: OpKind, dtype: DType) -> bool {
        let _ = (op, dtype);
        true
    }

    /// Whether this backend, which implements the fused op `spec`, would rather run it as
    /// its composition of other ops at these sizes, where its kernel is the slower of the
    /// two (see [`OpKind::FUSED`]).
    fn prefers_composition(&self, spec: &OpSpec) -> bool {
        let _ = spec;
        false
    }

    /// Copies host data into a new storage of this backend.
    fn upload(&self, data: HostData) -> Result<Storage>;

    /// Copies several host datas into storages of this backend: where it can, into one
    /// allocation, one after another, each at an offset it can bind on its own, so that a
    /// kernel can also read them as one (the wgpu backend's product of a layer's gate and up
    /// weights in one dispatch). The default uploads each on its own.
    fn upload_group(&self, parts: Vec<HostData>) -> Result<Vec<Storage>> {
        parts.into_iter().map(|p| self.upload(p)).collect()
    }

    /// Runs everything recorded that `storage` depends on and copies it to the host.
    fn download(&self, storage: &Storage) -> Result<HostData>;

    /// Runs `spec` on `inputs` (in the order the spec documents) and returns the output
    /// storage. GPU backends may only record the work; it runs at the next download or
    /// [`Backend::synchronize`].
    fn execute(&self, spec: &OpSpec, inputs: &[&Storage]) -> Result<Storage>;

    /// Runs an in-place `spec` ([`OpSpec::ScatterRows`], [`OpSpec::NormLinearInto`]):
    /// changes `targets` (as many as [`OpSpec::targets`]), which no other handle shares,
    /// reading `inputs`. GPU backends may only record the work.
    ///
    /// The default computes on the host with the reference backend and uploads the results:
    /// correct everywhere a blocking download works, for backends without an in-place kernel.
    fn write_into(
        &self,
        spec: &OpSpec,
        targets: &mut [&mut Storage],
        inputs: &[&Storage],
    ) -> Result<()> {
        let to_host =
            |s: &Storage| -> Result<Storage> { Ok(Storage::Host(Arc::new(self.download(s)?))) };
        let mut host_targets = targets
            .iter()
            .map(|s| to_host(s))
            .collect::<Result<Vec<_>>>()?;
        let host_inputs = inputs
            .iter()
            .map(|s| to_host(s))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Storage> = host_inputs.iter().collect();
        let mut written: Vec<&mut Storage> = host_targets.iter_mut().collect();
        reference::ReferenceBackend.write_into(spec, &mut written, &refs)?;
        for (target, host) in targets.iter_mut().zip(&host_targets) {
            let data = host_data(BackendKind::Reference, host)?.clone();
            **target = self.upload(data)?;
        }
        Ok(())
    }

    /// Overwrites all of `target` (which no other handle shares) with `data`, of its dtype and
    /// length, in queue order: work recorded before the call reads the old contents, work
    /// recorded after it the new ones. GPU backends write into the same memory, so kernels
    /// recorded to read it ([`Backend::replay`]) see the new contents. The default replaces
    /// the storage with an upload.
    fn write(&self, target: &mut Storage, data: HostData) -> Result<()> {
        *target = self.upload(data)?;
        Ok(())
    }

    /// Copies `units` storage units of `src` from unit `from` into `target` (which no other
    /// handle shares) at unit `at`, in queue order, on the device. Both hold the same dtype;
    /// the ranges are within both. The default goes through the host.
    fn copy_into(
        &self,
        (src, from): (&Storage, usize),
        (target, at): (&mut Storage, usize),
        units: usize,
    ) -> Result<()> {
        let source = self.download(src)?;
        let old = self.download(target)?;
        let unit = old.dtype().unit_bytes();
        let mut bytes = old.bytes().to_vec();
        bytes[at * unit..(at + units) * unit]
            .copy_from_slice(&source.bytes()[from * unit..(from + units) * unit]);
        let data = match old.dtype() {
            DType::F32 => HostData::F32(bytemuck::pod_collect_to_vec(&bytes)),
            DType::U32 => HostData::U32(bytemuck::pod_collect_to_vec(&bytes)),
            d => HostData::Bytes(d, bytes.into()),
        };
        *target = self.upload(data)?;
        Ok(())
    }

    /// Starts keeping what is recorded from now on, for [`Backend::replay`] (see
    /// [`CapturedStep`]). `false` when this backend does not record work to replay: then
    /// nothing is kept, and the caller runs its ops each time.
    fn begin_capture(&self) -> bool {
        false
    }

    /// Ends the capture [`Backend::begin_capture`] began: the recorded work, or `None` when it
    /// cannot be replayed (the backend does not capture, or something a replay would not
    /// repeat ran meanwhile: an upload, a readback, an op on another backend).
    fn end_capture(&self) -> Option<CapturedStep> {
        None
    }

    /// Records `step` again, after everything recorded so far: the same kernels on the same
    /// memory, with the key count of its attention kernels set to `keys`.
    fn replay(&self, step: &CapturedStep, keys: usize) -> Result<()> {
        let _ = (step, keys);
        Err(crate::Error::backend(
            self.kind(),
            "this backend does not replay recorded work",
        ))
    }

    /// A plain copy of the first `len` elements of `x` into new storage: the simplest
    /// memory-bound work a backend can do, used by benchmarks as the copy-bandwidth ceiling.
    fn copy(&self, x: &Storage, len: usize) -> Result<Storage>;

    /// Streams `x` through a kernel shaped like this backend's decode products and writes a
    /// small digest of it: the read-bandwidth probe behind `bench`'s "read" ceiling. Returns
    /// the digest (so the work is not dropped) and the bytes read, or `None` on a backend
    /// without a probe kernel.
    fn read_probe(&self, _x: &Storage) -> Result<Option<(Storage, u64)>> {
        Ok(None)
    }

    /// Submits all recorded work and waits until it has finished (used by benchmarks).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Kernel dispatches and submits since the backend started, for backends that record
    /// work (`bench --model` shows both per decode step); `None` elsewhere.
    fn recorded_work(&self) -> Option<RecordedWork> {
        None
    }

    /// Cumulative GPU time per kernel since the backend started, for backends that measure it
    /// (the wgpu backend with the option `wgpu.profile` on an adapter with timestamp
    /// queries; `bench --model` shows the decode's share per kernel); `None` elsewhere.
    /// Measures only work that has been submitted and read back: call after a download or
    /// [`Backend::synchronize`].
    fn kernel_profile(&self) -> Option<KernelProfile> {
        None
    }

    /// Loses the device behind this backend now, as a driver reset or a removed GPU would:
    /// every later op on it fails with [`crate::Error::DeviceLost`]. Backends without a device
    /// to lose do nothing. Only for testing that loss is a typed error, never a panic
    /// (`native-tests/device_loss.rs`): the backend is shared by the whole process.
    fn lose_device(&self) {}

    /// [`Backend::download`] without blocking, the form the browser needs (a GPU readback
    /// completes from the event loop there): starts copying `storage` to the host now and
    /// returns the future of its data, which holds its own handle on the backend. A GPU
    /// submits the copy with everything it depends on at once, so work recorded after this call
    /// runs while the copy is in flight, and the future waits for that copy alone: the decode
    /// loop reads a batch's ids this way while the next batch is recorded. Host backends copy
    /// at once.
    fn download_started(self: Arc<Self>, storage: &Storage) -> BackendFuture<'static, HostData> {
        Box::pin(std::future::ready(self.download(storage)))
    }

    /// [`Backend::synchronize`] without blocking (the browser's form).
    fn synchronize_async(&self) -> BackendFuture<'_, ()> {
        Box::pin(std::future::ready(self.synchronize()))
    }
}

/// The host data of `storage`, or a backend error: used by the host backends (cpu, reference).
pub(crate) fn host_data(backend: BackendKind, storage: &Storage) -> Result<&HostData> {
    storage
        .as_host()
        .ok_or_else(|| crate::Error::backend(backend, "storage is not in host memory"))
}

/// The inputs of one op as host slices, with errors that name the backend and the op.
pub(crate) struct HostInputs<'a> {
    backend: BackendKind,
    spec: &'a OpSpec,
    inputs: &'a [&'a Storage],
}

impl<'a> HostInputs<'a> {
    pub(crate) fn new(backend: BackendKind, spec: &'a OpSpec, inputs: &'a [&'a Storage]) -> Self {
        HostInputs {
            backend,
            spec,
            inputs,
        }
    }

    /// Input `i` whatever its dtype.
    pub(crate) fn data(&self, i: usize) -> Result<&'a HostData> {
        self.inputs
            .get(i)
            .and_then(|s| s.as_host())
            .ok_or_else(|| self.error(i, "missing or not in host memory"))
    }

    /// Input `i` as f32 elements.
    pub(crate) fn f32(&self, i: usize) -> Result<&'a [f32]> {
        self.data(i)?
            .as_f32()
            .ok_or_else(|| self.error(i, "not f32"))
    }

    /// Input `i` as raw bytes of `dtype` (packed dtypes and i32).
    pub(crate) fn bytes(&self, i: usize, dtype: DType) -> Result<&'a [u8]> {
        match self.data(i)? {
            HostData::Bytes(d, b) if *d == dtype => Ok(b),
            other => Err(self.error(i, &format!("{} rather than {dtype}", other.dtype()))),
        }
    }

    /// Input `i` as u32 elements.
    pub(crate) fn u32(&self, i: usize) -> Result<&'a [u32]> {
        self.data(i)?
            .as_u32()
            .ok_or_else(|| self.error(i, "not u32"))
    }

    fn error(&self, i: usize, what: &str) -> crate::Error {
        crate::Error::backend(
            self.backend,
            format!("{}: input {i} is {what}", self.spec.kind().name()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::reference::ReferenceBackend;
    use super::*;

    /// `since` subtracts totals kernel by kernel and leaves out kernels with no new
    /// dispatches.
    #[test]
    fn kernel_profile_since_is_the_difference() {
        let time = |label: &str, dispatches, gpu_ns| KernelTime {
            label: label.into(),
            dispatches,
            gpu_ns,
        };
        let before = KernelProfile {
            kernels: vec![time("a", 2, 10.0), time("b", 1, 5.0)],
            submits: 1,
            span_ns: 20.0,
        };
        let after = KernelProfile {
            kernels: vec![time("a", 5, 40.0), time("b", 1, 5.0), time("c", 1, 7.0)],
            submits: 3,
            span_ns: 100.0,
        };
        let d = after.since(&before);
        assert_eq!(d.kernels, vec![time("a", 3, 30.0), time("c", 1, 7.0)]);
        assert_eq!((d.submits, d.span_ns), (2, 80.0));
        assert_eq!(d.kernel_ns(), 37.0);
    }

    /// A backend with no in-place kernel: everything but `write_into` delegates to the
    /// reference, so `write_into` is the trait's host fallback.
    #[derive(Debug)]
    struct NoInPlace;

    impl Backend for NoInPlace {
        fn kind(&self) -> BackendKind {
            BackendKind::Cpu
        }
        fn info(&self) -> BackendInfo {
            ReferenceBackend.info()
        }
        fn upload(&self, data: HostData) -> Result<Storage> {
            ReferenceBackend.upload(data)
        }
        fn download(&self, storage: &Storage) -> Result<HostData> {
            ReferenceBackend.download(storage)
        }
        fn execute(&self, spec: &OpSpec, inputs: &[&Storage]) -> Result<Storage> {
            ReferenceBackend.execute(spec, inputs)
        }
        fn copy(&self, x: &Storage, len: usize) -> Result<Storage> {
            ReferenceBackend.copy(x, len)
        }
    }

    #[test]
    fn the_default_write_into_computes_on_the_host_and_uploads() {
        let b = NoInPlace;
        let mut target = b.upload(HostData::F32(vec![0.0; 6])).unwrap();
        let src = b.upload(HostData::F32(vec![1.0, 2.0, 3.0, 4.0])).unwrap();
        let slots = b.upload(HostData::U32(vec![2, 0])).unwrap();
        let spec = OpSpec::ScatterRows {
            rows: 3,
            cols: 2,
            count: 2,
        };
        b.write_into(&spec, &mut [&mut target], &[&src, &slots])
            .unwrap();
        assert_eq!(
            b.download(&target).unwrap(),
            HostData::F32(vec![3.0, 4.0, 0.0, 0.0, 1.0, 2.0])
        );
        // An op that is not in place is refused, not run.
        let not_in_place = OpSpec::Argmax { rows: 1, cols: 1 };
        assert!(b
            .write_into(&not_in_place, &mut [&mut target], &[])
            .is_err());
    }
}
