//! A decode step recorded on CUDA and replayed as a CUDA graph (see
//! `crate::backend::CapturedStep`).
//!
//! * While a capture is open ([`CaptureLog`]) the step runs as usual, launch by launch, and
//!   the backend logs each kernel launch (name, grid, arguments) and device copy, and pins
//!   every buffer the step allocates or binds ([`Pin`]). Nothing is captured by the driver
//!   then, so a step whose work the driver could not capture still runs, and its
//!   allocations are plain stream-ordered ones.
//! * At the end, the log is launched again into a stream that captures it (a stream of its
//!   own, not the one the backend computes on, which is the legacy default stream and cannot
//!   be captured). That capture allocates nothing and runs nothing: it only builds the graph,
//!   which is instantiated. Anything that fails there ends the capture, and the step is not
//!   replayed (`end_capture` gives `None`); the steps then run as ops.
//! * The step keeps its pins, so the memory the graph's nodes address (its temporaries, and
//!   the weights, pool and inputs it binds) is never freed or handed to another tensor while
//!   the graph exists; a pin does not count as a sharer, so in-place writes (the KV pool, the
//!   step's inputs) still land in the very memory the graph reads.
//! * A replay sets attention's key count and launches the graph on the backend's stream:
//!   the count lives in 4 bytes of device memory the step owns, which every attention kernel
//!   of the graph reads ([`super::kernels::Arg::KeysAt`]), set by a stream-ordered
//!   `cuMemsetD32Async` before the launch. So one driver call per token changes it (not one
//!   per layer, as updating each attention node's parameters on the executable graph would),
//!   nothing is copied from host memory, and a replay in flight is unaffected by the next
//!   one's count (stream order).
//!
//! The option `cuda.graphs = false` ([`crate::backend::CudaOptions`]) turns graphs off:
//! `begin_capture` declines, and every step runs as ops, exactly as without this file.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, LaunchConfig,
    PushKernelArg,
};

use super::launcher::{Arg, BLOCK};

/// Device memory of a tensor, and how many [`Pin`]s hold it besides its tensors' handles.
pub(super) struct Mem {
    pub(super) slice: CudaSlice<u8>,
    pins: AtomicUsize,
}

impl Mem {
    pub(super) fn new(slice: CudaSlice<u8>) -> Mem {
        Mem {
            slice,
            pins: AtomicUsize::new(0),
        }
    }

    /// Handles on this memory that are not pins.
    pub(super) fn sharers(self: &Arc<Self>) -> usize {
        Arc::strong_count(self).saturating_sub(self.pins.load(Ordering::Acquire))
    }

    /// A handle that keeps this memory allocated for a recorded step, not counted as a
    /// sharer.
    pub(super) fn pin(self: &Arc<Self>) -> Pin {
        self.pins.fetch_add(1, Ordering::AcqRel);
        Pin(self.clone())
    }
}

/// A recorded step's hold on memory its graph addresses (see the top of this file).
pub(super) struct Pin(Arc<Mem>);

impl Pin {
    fn same(&self, other: &Arc<Mem>) -> bool {
        Arc::ptr_eq(&self.0, other)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.pins.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One logged piece of work.
enum Item {
    Launch {
        name: &'static str,
        grid: (u32, u32, u32),
        args: Vec<Arg>,
    },
    /// A device copy: source, destination, bytes.
    Copy(u64, u64, usize),
}

/// What an open capture has seen so far.
pub(super) struct CaptureLog {
    /// The thread that captures: work queued from another meanwhile spoils the capture.
    owner: ThreadId,
    items: Vec<Item>,
    pins: Vec<Pin>,
    /// Why the step cannot be replayed, once something ran that a replay would not repeat.
    spoiled: Option<&'static str>,
}

impl CaptureLog {
    pub(super) fn new() -> CaptureLog {
        CaptureLog {
            owner: std::thread::current().id(),
            items: Vec::new(),
            pins: Vec::new(),
            spoiled: None,
        }
    }

    /// Whether work queued from this thread belongs to the capture; work from another
    /// thread spoils it.
    pub(super) fn mine(&mut self) -> bool {
        let mine = self.owner == std::thread::current().id();
        if !mine {
            self.spoil("another thread queued work meanwhile");
        }
        mine
    }

    pub(super) fn launch(&mut self, name: &'static str, grid: (u32, u32, u32), args: &[Arg]) {
        self.items.push(Item::Launch {
            name,
            grid,
            args: args.to_vec(),
        });
    }

    pub(super) fn copy(&mut self, src: u64, dst: u64, bytes: usize) {
        self.items.push(Item::Copy(src, dst, bytes));
    }

    /// Pins memory the logged work addresses (each once).
    pub(super) fn pin(&mut self, mem: &Arc<Mem>) {
        if !self.pins.iter().any(|p| p.same(mem)) {
            self.pins.push(mem.pin());
        }
    }

    /// Marks the capture as one a replay cannot stand for, and why.
    pub(super) fn spoil(&mut self, why: &'static str) {
        self.spoiled.get_or_insert(why);
    }
}

/// A CUDA graph of a captured step, launched under its lock: graph objects must not be used
/// from two threads at once.
struct Graph(CudaGraph);

// SAFETY: a CUDA graph and its executable may be used from any thread of the process as
// long as calls on them are serialised, which the `Mutex` around `Graph` does; the context
// is bound to the calling thread before each use.
unsafe impl Send for Graph {}

/// A step captured on CUDA: what [`crate::backend::CapturedStep`] holds for this backend.
pub(super) struct CudaStep {
    graph: Mutex<Graph>,
    /// Where the step's attention kernels read their key count.
    keys: CudaSlice<u32>,
    /// The memory the graph addresses. Declared after `graph`, so the executable graph is
    /// destroyed first (the driver defers that past launches in flight); the memory is then
    /// freed in stream order after them.
    _pins: Vec<Pin>,
    pub(super) launches: usize,
}

impl Drop for CudaStep {
    /// The graph and the memory are released through the driver, which wants the context
    /// current on this thread (a step may be dropped on any thread).
    fn drop(&mut self) {
        let ctx = self.keys.context();
        ctx.record_err(ctx.bind_to_thread());
    }
}

impl CudaStep {
    /// Queues a replay on `stream` with `keys` keys for attention: the count set in the
    /// step's memory, then the graph launched, both in stream order.
    pub(super) fn replay(&self, stream: &CudaStream, keys: u32) -> Result<(), String> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| format!("{e:?}"))?;
        let graph = self
            .graph
            .lock()
            .map_err(|_| "the graph lock was poisoned".to_string())?;
        let keys_at = self.keys_address(stream);
        // SAFETY: `keys_at` is the step's own 4 bytes; the graph's memory is pinned by the
        // step; both calls are ordered on the backend's stream.
        unsafe {
            cudarc::driver::sys::cuMemsetD32Async(keys_at, keys, 1, stream.cu_stream())
                .result()
                .map_err(|e| format!("setting the key count: {e:?}"))?;
            result::graph::launch(graph.0.cu_graph_exec(), stream.cu_stream())
                .map_err(|e| format!("launching the graph: {e:?}"))
        }
    }

    fn keys_address(&self, stream: &CudaStream) -> u64 {
        use cudarc::driver::DevicePtr;
        let (ptr, _sync) = self.keys.device_ptr(stream);
        ptr
    }
}

/// Builds the graph of `log`, recorded on `stream`, whose kernels are `functions`: `Err`
/// says why there is none.
pub(super) fn build(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    functions: &std::collections::HashMap<&'static str, CudaFunction>,
    log: CaptureLog,
) -> Result<CudaStep, String> {
    if let Some(why) = log.spoiled {
        return Err(why.to_string());
    }
    if log.owner != std::thread::current().id() {
        return Err("the capture ended on another thread".into());
    }
    if log.items.is_empty() {
        return Err("nothing was recorded".into());
    }
    // The key count's memory, set before each replay (zero until then).
    let keys = stream
        .alloc_zeros::<u32>(1)
        .map_err(|e| format!("allocating the key count: {e:?}"))?;
    let keys_at = {
        use cudarc::driver::DevicePtr;
        let (ptr, _sync) = keys.device_ptr(stream);
        ptr
    };
    let capture = ctx
        .new_stream()
        .map_err(|e| format!("a stream to capture on: {e:?}"))?;
    capture
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| format!("beginning the capture: {e:?}"))?;
    let queued = queue(&capture, functions, &log.items, keys_at);
    // The capture is always ended, so the stream leaves capture mode whatever happened.
    let ended = capture.end_capture(CUgraphInstantiate_flags(0));
    queued?;
    let graph = match ended {
        Ok(Some(graph)) => graph,
        Ok(None) => return Err("the capture gave no graph".into()),
        Err(e) => return Err(format!("ending the capture: {e:?}")),
    };
    // SAFETY: the executable graph is valid; uploading it to the backend's stream only
    // prepares its first launch there.
    unsafe { result::graph::upload(graph.cu_graph_exec(), stream.cu_stream()) }
        .map_err(|e| format!("uploading the graph: {e:?}"))?;
    let launches = log
        .items
        .iter()
        .filter(|i| matches!(i, Item::Launch { .. }))
        .count();
    Ok(CudaStep {
        graph: Mutex::new(Graph(graph)),
        keys,
        _pins: log.pins,
        launches,
    })
}

/// Launches and copies `items` into the capturing stream `capture`, with attention's key
/// count read at `keys_at`.
fn queue(
    capture: &Arc<CudaStream>,
    functions: &std::collections::HashMap<&'static str, CudaFunction>,
    items: &[Item],
    keys_at: u64,
) -> Result<(), String> {
    for item in items {
        match item {
            Item::Launch { name, grid, args } => {
                let f = functions
                    .get(name)
                    .ok_or_else(|| format!("kernel {name} was not loaded"))?;
                let mut builder = capture.launch_builder(f);
                for a in args {
                    match a {
                        Arg::Ptr(v) | Arg::U64(v) => builder.arg(v),
                        Arg::U32(v) => builder.arg(v),
                        Arg::F32(v) => builder.arg(v),
                        Arg::KeysAt => builder.arg(&keys_at),
                    };
                }
                let cfg = LaunchConfig {
                    grid_dim: *grid,
                    block_dim: (BLOCK, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: the arguments are those the kernel was launched with when the step
                // ran (checked against its parameter list there), on memory the step pins.
                unsafe { builder.launch(cfg) }.map_err(|e| format!("capturing {name}: {e:?}"))?;
            }
            &Item::Copy(src, dst, bytes) => {
                // SAFETY: both ranges were copied between when the step ran; the step pins
                // their memory.
                unsafe { result::memcpy_dtod_async(dst, src, bytes, capture.cu_stream()) }
                    .map_err(|e| format!("capturing a copy: {e:?}"))?;
            }
        }
    }
    Ok(())
}
