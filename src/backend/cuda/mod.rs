//! The `cuda` backend (cargo feature `cuda`): NVIDIA GPUs through the CUDA driver API.
//!
//! * cudarc opens `libcuda` and `libnvrtc` at run time (dlopen), so building needs neither
//!   the CUDA toolkit nor a GPU; on a machine without them the backend reports why it is
//!   absent and [`crate::Device::auto`] moves on to the next backend.
//! * [`sources`] holds the CUDA C kernels (`kernels/*.cu`), compiled by NVRTC for the
//!   device's architecture when the backend starts, once per process.
//! * [`kernels`] turns each [`OpSpec`] into launches. Kernels are plain: one thread per output
//!   element or per block, one block per row for row reductions, one warp per output of a
//!   packed-weight product, one thread per channel for scans (walked in f64), one block per
//!   row for sampling (thresholds found by bisection over the values' bit patterns).
//! * Tensors live in [`CudaBuffer`]s. Work is queued on one stream; [`Backend::download`] and
//!   [`Backend::synchronize`] wait for it.
//! * A decode step is recorded once and replayed for every later token as a CUDA graph
//!   ([`graph`]; the option `cuda.graphs = false` turns that off).
//! * Freed memory stays in the device's stream-ordered pool (its release threshold is
//!   raised at start), so the temporaries of one token are the next one's without the driver
//!   mapping memory again.

#[cfg(test)]
mod emulated;
mod graph;
mod launch;
mod launcher;
#[cfg(test)]
mod signatures;
pub mod sources;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr};
use cudarc::nvrtc::Ptx;

use crate::backend::{
    Backend, BackendInfo, BackendKind, CapturedStep, CudaOptions, DeviceClass, HostData, OpKind,
    OpSpec, Storage,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Device memory holding `len` storage units of `dtype` (see [`DType::unit_bytes`]),
/// padded to whole 4-byte words. Cloning shares the allocation; it is freed with the last
/// handle (a recorded step's pins included, which do not count as sharing it).
#[derive(Clone)]
pub struct CudaBuffer {
    mem: Arc<graph::Mem>,
    len: usize,
    dtype: DType,
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("len", &self.len)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

impl CudaBuffer {
    /// Storage units held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    fn byte_len(&self) -> usize {
        self.len * self.dtype.unit_bytes()
    }

    /// Whether another handle shares this memory (a recorded step's pin is not one).
    pub(crate) fn is_shared(&self) -> bool {
        self.mem.sharers() > 1
    }
}

/// The largest tensor the kernels index with 32-bit sizes.
const MAX_BYTES: u64 = u32::MAX as u64;

/// The CUDA backend: one device (ordinal 0), one stream, the compiled kernels.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
    info: BackendInfo,
    /// Whether decode steps are replayed as CUDA graphs ([`CudaOptions::graphs`]).
    graphs: bool,
    /// The capture in progress, if any ([`graph::CaptureLog`]).
    capture: Mutex<Option<graph::CaptureLog>>,
    /// Whether `capture` holds one: checked before taking its lock, so work queued with no
    /// capture open costs one atomic load.
    capturing: AtomicBool,
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.info.device_name)
            .finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// Starts the backend on CUDA device 0 and compiles the kernels. `Err` says in words why
    /// CUDA is not usable here (no driver, no device, no NVRTC, a kernel that failed to build).
    pub fn new(options: &CudaOptions) -> std::result::Result<Self, String> {
        // SAFETY: only tries to dlopen the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("no CUDA driver library (libcuda.so) on this machine".into());
        }
        if !sources::nvrtc_present() {
            return Err(
                "the CUDA driver is present but NVRTC (libnvrtc.so.12) is not on the \
                        library path; install the CUDA toolkit or `pip install \
                        nvidia-cuda-nvrtc-cu12` and add its lib folder to LD_LIBRARY_PATH"
                    .into(),
            );
        }
        // cudarc panics when a symbol it expects is missing from an old driver: report that
        // as the reason instead of unwinding into the caller.
        std::panic::catch_unwind(|| Self::start(options)).unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("the CUDA libraries could not be used: {what}"))
        })
    }

    fn start(options: &CudaOptions) -> std::result::Result<Self, String> {
        let count = CudaContext::device_count().map_err(|e| format!("CUDA: {e:?}"))?;
        if count < 1 {
            return Err("the CUDA driver reports no device".into());
        }
        let ctx = CudaContext::new(0).map_err(|e| format!("CUDA device 0: {e:?}"))?;
        // One stream orders all work, so cudarc's per-buffer event tracking is not needed.
        // SAFETY: no other stream of this context runs work (graph.rs captures on streams of
        // its own, which only record launches; the graphs run on this one).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let pool = keep_freed_memory(&ctx);
        if let Err(why) = &pool {
            log::debug!("webtensor: the cuda memory pool keeps its default release: {why}");
        }
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("CUDA compute capability: {e:?}"))?;
        let arch = sources::arch_for((major * 10 + minor) as u32, &sources::supported_arches()?)?;
        let mut functions = HashMap::new();
        for source in &sources::SOURCES {
            let ptx = sources::compile(source, &arch)?;
            let module = ctx
                .load_module(Ptx::from_src(ptx))
                .map_err(|e| format!("loading {}: {e:?}", source.name))?;
            for &name in source.entry_points {
                let f = module
                    .load_function(name)
                    .map_err(|e| format!("{} has no kernel {name}: {e:?}", source.name))?;
                functions.insert(name, f);
            }
        }
        let name = ctx.name().unwrap_or_else(|_| "CUDA device 0".into());
        let mut driver_version = 0i32;
        // SAFETY: writes one int.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
        let total_mem = ctx.total_mem().unwrap_or(0) as u64;
        let info = BackendInfo {
            kind: BackendKind::Cuda,
            class: DeviceClass::Gpu,
            device_name: name,
            vendor: "NVIDIA".into(),
            driver: format!(
                "CUDA driver {}.{}",
                driver_version / 1000,
                (driver_version % 1000) / 10
            ),
            api: "CUDA".into(),
            features: [format!("sm_{major}{minor}"), format!("nvrtc {arch}")]
                .into_iter()
                .chain(decode_features(options.graphs, &pool))
                .collect(),
            limits: vec![
                ("total_memory".into(), total_mem),
                ("max_tensor_bytes".into(), MAX_BYTES),
            ],
            threads: None,
            simd: None,
            missing_ops: Vec::new(),
            f16_path: "f16 storage widened to f32 in the kernels".into(),
            reductions: String::new(),
            prefill: String::new(),
            profiler: String::new(),
            options: options.pairs(),
            variants: if options.graphs {
                vec!["graphs".into()]
            } else {
                vec![]
            },
        };
        Ok(CudaBackend {
            ctx,
            stream,
            functions,
            info,
            graphs: options.graphs,
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
        })
    }

    /// Fails with [`Error::TensorTooLarge`] past the 32-bit sizes the kernels use.
    fn check_size(&self, op: &'static str, bytes: u64) -> Result<()> {
        if bytes > MAX_BYTES {
            return Err(Error::TensorTooLarge {
                op,
                backend: BackendKind::Cuda,
                bytes,
                limit_name: "32-bit kernel indexing limit",
                limit: MAX_BYTES,
            });
        }
        Ok(())
    }

    fn driver_error(op: &str, e: impl fmt::Debug) -> Error {
        Error::backend(BackendKind::Cuda, format!("{op}: {e:?}"))
    }

    /// New device memory for `len` units of `dtype`, contents undefined.
    fn alloc(&self, op: &'static str, len: usize, dtype: DType) -> Result<CudaBuffer> {
        let bytes = (len as u64).saturating_mul(dtype.unit_bytes() as u64);
        self.check_size(op, bytes)?;
        let padded = (bytes as usize).next_multiple_of(4).max(4);
        // SAFETY: every kernel writes its whole output before anything reads it.
        let slice =
            unsafe { self.stream.alloc::<u8>(padded) }.map_err(|e| Self::driver_error(op, e))?;
        let buffer = CudaBuffer {
            mem: Arc::new(graph::Mem::new(slice)),
            len,
            dtype,
        };
        // An open capture keeps what the step allocates (its temporaries among them).
        self.logged(|log| log.pin(&buffer.mem));
        Ok(buffer)
    }

    /// Runs `f` on the open capture, if one is open and this thread opened it (work queued
    /// from another thread spoils it instead).
    fn logged(&self, f: impl FnOnce(&mut graph::CaptureLog)) {
        if !self.capturing.load(Ordering::Acquire) {
            return;
        }
        let mut capture = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(log) = capture.as_mut() {
            if log.mine() {
                f(log);
            }
        }
    }

    /// Marks an open capture as one a replay cannot stand for (`why`): host data reached or
    /// left the device while it was open.
    fn spoil_capture(&self, why: &'static str) {
        if !self.capturing.load(Ordering::Acquire) {
            return;
        }
        let mut capture = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(log) = capture.as_mut() {
            log.spoil(why);
        }
    }

    /// Pins `buffers` to an open capture, whose logged work addresses them.
    fn pin_to_capture(&self, buffers: &[&CudaBuffer]) {
        self.logged(|log| buffers.iter().for_each(|b| log.pin(&b.mem)));
    }

    fn upload_bytes(
        &self,
        op: &'static str,
        bytes: &[u8],
        len: usize,
        dtype: DType,
    ) -> Result<CudaBuffer> {
        self.check_size(op, bytes.len() as u64)?;
        self.spoil_capture("host data was uploaded");
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().next_multiple_of(4).max(4), 0);
        let slice = self
            .stream
            .clone_htod(&padded)
            .map_err(|e| Self::driver_error(op, e))?;
        Ok(CudaBuffer {
            mem: Arc::new(graph::Mem::new(slice)),
            len,
            dtype,
        })
    }

    /// The device address of a buffer, for kernel arguments.
    fn device_ptr(&self, b: &CudaBuffer) -> u64 {
        let (ptr, _sync) = b.mem.slice.device_ptr(&self.stream);
        ptr
    }

    /// Queues a copy of `data` (host memory) to device address `dst` on the stream. The
    /// driver stages pageable host memory before it returns, so `data` may go at once.
    fn htod(&self, dst: u64, data: &[u8]) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Self::driver_error("write", e))?;
        // SAFETY: `dst` is a live buffer of this context with room for `data` (the callers
        // check the lengths), and the copy is ordered on the backend's one stream.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, data, self.stream.cu_stream()) }
            .map_err(|e| Self::driver_error("write", e))
    }

    /// Queues a device-to-device copy of `bytes` bytes from `src` to `dst` on the stream (and
    /// logs it to an open capture).
    fn dtod(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        self.logged(|log| log.copy(src, dst, bytes));
        self.ctx
            .bind_to_thread()
            .map_err(|e| Self::driver_error("copy_into", e))?;
        // SAFETY: both ranges lie in live buffers of this context (the callers check them)
        // and do not overlap (the target is a buffer no other handle shares).
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())
        }
        .map_err(|e| Self::driver_error("copy_into", e))
    }
}

/// What `webtensor info` lists of the decode path besides the architecture: whether decode
/// steps are replayed as CUDA graphs (`graphs`: [`CudaOptions::graphs`]), that the fused decode
/// ops run as kernels (at the sizes `launch::fused::runs_fused` takes), and whether the memory
/// pool keeps freed memory (`pool`, from [`keep_freed_memory`]).
fn decode_features(graphs: bool, pool: &std::result::Result<(), String>) -> Vec<String> {
    vec![
        if graphs {
            "cuda graphs: decode steps replayed".into()
        } else {
            "cuda graphs off (option cuda.graphs = false): decode steps run as ops".into()
        },
        format!(
            "fused decode kernels ({})",
            OpKind::FUSED.map(|k| k.name()).join(" / ")
        ),
        match pool {
            Ok(()) => "memory pool keeps freed memory".into(),
            Err(why) => format!("memory pool releases freed memory ({why})"),
        },
    ]
}

/// Raises the release threshold of the device's default stream-ordered memory pool (where
/// `cuMemAllocAsync` takes memory and `cuMemFreeAsync` returns it) to `u64::MAX`. The default,
/// 0, hands every freed byte back to the driver at each stream synchronisation, so a decode
/// that reads its ids back every few steps would have the driver unmap and map the same
/// temporaries again each time; with no threshold the pool keeps what it has and reuses it.
/// The memory it holds stays this process's, as the peak of what tensors needed at once.
/// `Err` says why not (no stream-ordered allocator on this device or driver, or the driver
/// refused).
fn keep_freed_memory(ctx: &Arc<CudaContext>) -> std::result::Result<(), String> {
    use cudarc::driver::{result, sys};
    if !ctx.has_async_alloc() {
        return Err("no stream-ordered allocator".into());
    }
    ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
    let mut threshold = u64::MAX;
    // SAFETY: the device is this context's; the attribute takes a u64, which `threshold` is.
    unsafe {
        let pool = result::device::get_default_mem_pool(ctx.cu_device())
            .map_err(|e| format!("the default pool: {e:?}"))?;
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .map_err(|e| format!("setting its release threshold: {e:?}"))
    }
}

/// The CUDA buffer of a storage, or an error naming `op`.
fn cuda_storage<'a>(op: &str, storage: &'a Storage) -> Result<&'a CudaBuffer> {
    match storage {
        Storage::Cuda(b) => Ok(b),
        _ => Err(Error::backend(
            BackendKind::Cuda,
            format!("{op}: an input is not in CUDA memory"),
        )),
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    /// Every op has its kernels here, the fused decode ops included (`kernels/fused.cu`), but
    /// a gather from a packed table, which the host backends run.
    fn supports(&self, op: OpKind, dtype: DType) -> bool {
        op != OpKind::Embedding || dtype == DType::F32
    }

    /// The fused ops at the sizes `launch::fused::runs_fused` leaves to their composition
    /// (f32 weights past a few rows, attention of a prefill or over very wide heads).
    fn prefers_composition(&self, spec: &OpSpec) -> bool {
        !launch::fused::runs_fused(spec)
    }

    fn info(&self) -> BackendInfo {
        self.info.clone()
    }

    fn upload(&self, data: HostData) -> Result<Storage> {
        let dtype = data.dtype();
        let buffer = self.upload_bytes("upload", data.bytes(), data.len(), dtype)?;
        data.release_borrowed();
        Ok(Storage::Cuda(buffer))
    }

    fn download(&self, storage: &Storage) -> Result<HostData> {
        let b = cuda_storage("download", storage)?;
        self.spoil_capture("a tensor was read back");
        if b.is_empty() {
            return Ok(HostData::empty(b.dtype));
        }
        let mut bytes = self
            .stream
            .clone_dtoh(&b.mem.slice)
            .map_err(|e| Self::driver_error("download", e))?;
        bytes.truncate(b.byte_len());
        Ok(match b.dtype {
            DType::F32 => HostData::F32(bytemuck::pod_collect_to_vec(&bytes)),
            DType::U32 => HostData::U32(bytemuck::pod_collect_to_vec(&bytes)),
            d => HostData::Bytes(d, bytes.into()),
        })
    }

    fn execute(&self, spec: &OpSpec, inputs: &[&Storage]) -> Result<Storage> {
        let op = spec.kind().name();
        let buffers = inputs
            .iter()
            .map(|s| cuda_storage(op, s))
            .collect::<Result<Vec<_>>>()?;
        let out_dtype = spec.output_dtype(buffers.first().map_or(DType::F32, |b| b.dtype));
        let out = self.alloc(op, spec.output_len(), out_dtype)?;
        if !out.is_empty() {
            self.pin_to_capture(&buffers);
            launcher::launch(self, spec, &out, &buffers)?;
        }
        Ok(Storage::Cuda(out))
    }

    /// One target: a paired pool store is composed here (`launch::fused::runs_fused`).
    fn write_into(
        &self,
        spec: &OpSpec,
        targets: &mut [&mut Storage],
        inputs: &[&Storage],
    ) -> Result<()> {
        let op = spec.kind().name();
        let [target] = targets else {
            return Err(Error::backend(
                BackendKind::Cuda,
                format!("{op}: the cuda kernels write one target"),
            ));
        };
        let target = cuda_storage(op, target)?;
        let buffers = inputs
            .iter()
            .map(|s| cuda_storage(op, s))
            .collect::<Result<Vec<_>>>()?;
        self.pin_to_capture(&buffers);
        self.pin_to_capture(&[target]);
        launcher::launch_in_place(self, spec, target, &buffers)
    }

    /// Copied into the target's own memory on the stream (`cuMemcpyHtoDAsync`), never into a
    /// new buffer, so work recorded to read it sees the new contents.
    fn write(&self, target: &mut Storage, data: HostData) -> Result<()> {
        let target = cuda_storage("write", target)?;
        self.spoil_capture("host data was written");
        launcher::write(self, target, &data)
    }

    /// A device-to-device copy on the stream into the target's own memory.
    fn copy_into(
        &self,
        (src, from): (&Storage, usize),
        (target, at): (&mut Storage, usize),
        units: usize,
    ) -> Result<()> {
        let src = cuda_storage("copy_into", src)?;
        let target = cuda_storage("copy_into", target)?;
        self.pin_to_capture(&[src, target]);
        launcher::copy_into(self, (src, from), (target, at), units)
    }

    fn copy(&self, x: &Storage, len: usize) -> Result<Storage> {
        let src = cuda_storage("copy", x)?;
        if len > src.len() {
            return Err(Error::invalid(
                "copy",
                format!("cannot copy {len} elements from a buffer of {}", src.len()),
            ));
        }
        let out = self.alloc("copy", len, src.dtype)?;
        let bytes = len * src.dtype.unit_bytes();
        if bytes > 0 {
            self.pin_to_capture(&[src]);
            self.dtod(self.device_ptr(src), self.device_ptr(&out), bytes)?;
        }
        Ok(Storage::Cuda(out))
    }

    /// Starts logging the step's launches and copies (`graph.rs`); `false` with graphs off
    /// (the option `cuda.graphs = false`) or a capture already open.
    fn begin_capture(&self) -> bool {
        if !self.graphs {
            return false;
        }
        let mut capture = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        if capture.is_some() {
            return false;
        }
        *capture = Some(graph::CaptureLog::new());
        self.capturing.store(true, Ordering::Release);
        true
    }

    /// Builds the CUDA graph of what was logged since `begin_capture`; `None` (logged at
    /// debug level with the reason) when the step cannot be replayed: it read back or
    /// uploaded data, another thread queued work meanwhile, or the driver could not capture
    /// or instantiate the graph. The step itself has run either way.
    fn end_capture(&self) -> Option<CapturedStep> {
        let log = {
            let mut capture = self.capture.lock().unwrap_or_else(|e| e.into_inner());
            self.capturing.store(false, Ordering::Release);
            capture.take()?
        };
        match graph::build(&self.ctx, &self.stream, &self.functions, log) {
            Ok(step) => Some(CapturedStep {
                kind: BackendKind::Cuda,
                dispatches: step.launches,
                work: Box::new(step),
            }),
            Err(why) => {
                log::debug!("webtensor: the cuda decode step is not replayed: {why}");
                None
            }
        }
    }

    /// Sets the step's key count in its own memory and launches its graph, both in stream
    /// order after the work queued so far.
    fn replay(&self, step: &CapturedStep, keys: usize) -> Result<()> {
        let (step, keys) = step.replay_args::<graph::CudaStep>(BackendKind::Cuda, keys)?;
        // A replay is no launch a capture open now would log.
        self.spoil_capture("a recorded step was replayed");
        step.replay(&self.stream, keys)
            .map_err(|e| Error::backend(BackendKind::Cuda, format!("replay: {e}")))
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| Self::driver_error("synchronize", e))?;
        self.ctx
            .check_err()
            .map_err(|e| Self::driver_error("synchronize", e))
    }
}

#[cfg(test)]
mod tests {
    use super::decode_features;

    /// `info` says whether graphs are on and why not, that the fused kernels run, and what
    /// the memory pool does.
    #[test]
    fn info_says_how_decode_runs() {
        let on = decode_features(true, &Ok(())).join(", ");
        assert!(on.contains("cuda graphs: decode steps replayed"), "{on}");
        assert!(on.contains("fused decode kernels"), "{on}");
        assert!(on.contains("memory pool keeps freed memory"), "{on}");
        let off = decode_features(false, &Err("no stream-ordered allocator".into())).join(", ");
        assert!(off.contains("cuda.graphs = false"), "{off}");
        assert!(off.contains("no stream-ordered allocator"), "{off}");
    }
}
