//! Each [`OpSpec`] as launches of the kernels in `kernels/*.cu`: arguments, grid and block.
//!
//! Sizes go to the kernels as `u32` (the backend refuses buffers past 4 GiB) and device
//! addresses as `u64`.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{launch, CudaBackend, CudaBuffer};
pub(super) use crate::backend::kernel_consts::format_code;
use crate::backend::{BackendKind, HostData, OpSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Threads per block of the 1-D and row kernels.
pub(super) const BLOCK: u32 = 256;
/// Outputs per block of the warp-per-output kernels (`BLOCK / 32`).
pub(super) const WARPS: u32 = BLOCK / 32;

/// One kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Arg {
    /// A device address.
    Ptr(u64),
    U32(u32),
    U64(u64),
    F32(f32),
    /// The device address attention reads its key count from in a replayed step (a `const
    /// u32*` parameter, next to the count itself): null when launched directly, the step's own
    /// memory, written before each replay, in a CUDA graph (`graph.rs`).
    KeysAt,
}

/// A size as the kernels take it, or an error for one past 32 bits.
pub(super) fn size(op: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::TensorTooLarge {
        op,
        backend: BackendKind::Cuda,
        bytes: v as u64,
        limit_name: "32-bit kernel size",
        limit: u32::MAX as u64,
    })
}

/// Blocks of `BLOCK` threads covering `n` threads (at least one: a grid of none is a launch
/// error, and every kernel checks its bounds).
pub(super) fn blocks_for(n: u64) -> u32 {
    n.div_ceil(BLOCK as u64).clamp(1, u32::MAX as u64) as u32
}

/// The data-movement kernels copy 32-bit words: f32 and u32 only.
fn check_words<L: Launcher>(be: &L, op: &'static str, inputs: &[&L::Buffer]) -> Result<()> {
    match inputs.iter().find(|b| be.dtype(b).unit_bytes() != 4) {
        Some(b) => Err(Error::invalid(
            op,
            format!(
                "the cuda backend moves f32 and u32 data, not {}",
                be.dtype(b)
            ),
        )),
        None => Ok(()),
    }
}

/// What the launch code needs from a device: the CUDA backend, or in tests the kernels
/// compiled for the CPU (`native-tests/cuda_host`), so this file's launches are checked
/// without a GPU.
pub(super) trait Launcher {
    /// A buffer of device memory.
    type Buffer;
    /// Its device address.
    fn ptr(&self, b: &Self::Buffer) -> u64;
    /// Its element type.
    fn dtype(&self, b: &Self::Buffer) -> DType;
    /// Its length in storage units ([`DType::unit_bytes`] each).
    fn len(&self, b: &Self::Buffer) -> usize;
    /// A temporary buffer of `len` units of `dtype`, alive until the work queued so far ran.
    fn scratch(&self, op: &'static str, len: usize, dtype: DType) -> Result<Self::Buffer>;
    /// Launches kernel `name` on `grid` blocks of [`BLOCK`] threads.
    fn run(&self, name: &'static str, grid: (u32, u32, u32), args: &[Arg]) -> Result<()>;

    /// Copies `data` to device address `dst`, after the work queued so far.
    fn write_bytes(&self, dst: u64, data: &[u8]) -> Result<()>;
    /// Copies `bytes` bytes from device address `src` to `dst` (not overlapping), after the
    /// work queued so far.
    fn copy_bytes(&self, src: u64, dst: u64, bytes: usize) -> Result<()>;

    /// 1-D launch over `n` threads.
    fn run_1d(&self, name: &'static str, n: u64, args: &[Arg]) -> Result<()> {
        self.run(name, (blocks_for(n), 1, 1), args)
    }
}

impl Launcher for CudaBackend {
    type Buffer = CudaBuffer;

    fn ptr(&self, b: &CudaBuffer) -> u64 {
        self.device_ptr(b)
    }

    fn dtype(&self, b: &CudaBuffer) -> DType {
        b.dtype()
    }

    fn len(&self, b: &CudaBuffer) -> usize {
        b.len()
    }

    fn write_bytes(&self, dst: u64, data: &[u8]) -> Result<()> {
        self.htod(dst, data)
    }

    fn copy_bytes(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        self.dtod(src, dst, bytes)
    }

    fn scratch(&self, op: &'static str, len: usize, dtype: DType) -> Result<CudaBuffer> {
        // Freed with stream ordering (or after a device sync) when dropped, so dropping it
        // right after queuing the kernels that use it is safe.
        self.alloc(op, len, dtype)
    }

    fn run(&self, name: &'static str, grid: (u32, u32, u32), args: &[Arg]) -> Result<()> {
        let f = self.functions.get(name).ok_or_else(|| {
            Error::backend(BackendKind::Cuda, format!("kernel {name} was not loaded"))
        })?;
        self.logged(|log| log.launch(name, grid, args));
        let mut builder = self.stream.launch_builder(f);
        let null = 0u64;
        for a in args {
            match a {
                Arg::Ptr(v) | Arg::U64(v) => builder.arg(v),
                Arg::U32(v) => builder.arg(v),
                Arg::F32(v) => builder.arg(v),
                Arg::KeysAt => builder.arg(&null),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: each kernel's parameter list matches `args` (the `.cu` files; checked by
        // `signatures.rs`), and every
        // pointer is a live buffer at least as large as the sizes passed say.
        unsafe { builder.launch(cfg) }
            .map(|_| ())
            .map_err(|e| Error::backend(BackendKind::Cuda, format!("launching {name}: {e:?}")))
    }
}

/// One launch's context: the device, the op's name, its output and inputs.
pub(super) struct Call<'a, L: Launcher> {
    pub(super) be: &'a L,
    pub(super) op: &'static str,
    out: &'a L::Buffer,
    pub(super) inputs: &'a [&'a L::Buffer],
}

impl<L: Launcher> Call<'_, L> {
    /// The device address of input `i`, or an error naming the op.
    pub(super) fn input(&self, i: usize) -> Result<u64> {
        self.inputs.get(i).map(|b| self.be.ptr(b)).ok_or_else(|| {
            Error::backend(
                BackendKind::Cuda,
                format!("{}: input {i} is missing", self.op),
            )
        })
    }

    /// The output's address as an argument.
    pub(super) fn out(&self) -> Arg {
        Arg::Ptr(self.out_ptr())
    }

    /// The output's address.
    pub(super) fn out_ptr(&self) -> u64 {
        self.be.ptr(self.out)
    }

    /// A size as a kernel argument.
    pub(super) fn size(&self, v: usize) -> Result<Arg> {
        size(self.op, v).map(Arg::U32)
    }
}

/// Overwrites all of `target` with `data` (its dtype and length), in stream order, in the
/// target's own memory: kernels queued before read the old contents, kernels queued after the
/// new ones, and a recorded step that binds the target sees the new ones.
pub(super) fn write<L: Launcher>(be: &L, target: &L::Buffer, data: &HostData) -> Result<()> {
    let (dtype, len) = (be.dtype(target), be.len(target));
    if data.dtype() != dtype || data.len() != len {
        return Err(Error::invalid(
            "write",
            format!(
                "{} units of {} cannot overwrite a tensor of {len} units of {dtype}",
                data.len(),
                data.dtype()
            ),
        ));
    }
    let bytes = data.bytes();
    if bytes.is_empty() {
        return Ok(());
    }
    be.write_bytes(be.ptr(target), bytes)
}

/// Copies `units` storage units of `src` from unit `from` into `target` at unit `at`, in
/// stream order, on the device (both of one dtype, the ranges within both; never the same
/// buffer, since the target is unshared).
pub(super) fn copy_into<L: Launcher>(
    be: &L,
    (src, from): (&L::Buffer, usize),
    (target, at): (&L::Buffer, usize),
    units: usize,
) -> Result<()> {
    const OP: &str = "copy_into";
    let dtype = be.dtype(target);
    if be.dtype(src) != dtype {
        return Err(Error::invalid(
            OP,
            format!("cannot copy {} into {dtype}", be.dtype(src)),
        ));
    }
    let within =
        |start: usize, b: &L::Buffer| start.checked_add(units).is_some_and(|end| end <= be.len(b));
    if !within(from, src) || !within(at, target) {
        return Err(Error::invalid(
            OP,
            format!(
                "{units} units from {from} of {} into {at} of {} run past a buffer",
                be.len(src),
                be.len(target)
            ),
        ));
    }
    if units == 0 {
        return Ok(());
    }
    let unit = dtype.unit_bytes() as u64;
    be.copy_bytes(
        be.ptr(src) + from as u64 * unit,
        be.ptr(target) + at as u64 * unit,
        units * unit as usize,
    )
}

/// Records the in-place `spec` ([`OpSpec::ScatterRows`], [`OpSpec::NormLinearInto`])
/// changing `target`.
pub(super) fn launch_in_place<L: Launcher>(
    be: &L,
    spec: &OpSpec,
    target: &L::Buffer,
    inputs: &[&L::Buffer],
) -> Result<()> {
    let op = spec.kind().name();
    if let OpSpec::NormLinearInto { l, .. } = spec {
        if l.m * l.n == 0 {
            return Ok(());
        }
        let c = Call {
            be,
            op,
            out: target,
            inputs,
        };
        return launch::fused::launch(&c, spec);
    }
    let OpSpec::ScatterRows { rows, cols, count } = *spec else {
        return Err(Error::backend(
            BackendKind::Cuda,
            format!("{op} is not an in-place op"),
        ));
    };
    let [src, slots] = inputs else {
        return Err(Error::backend(
            BackendKind::Cuda,
            "scatter_rows takes src and slots",
        ));
    };
    if count * cols == 0 {
        return Ok(());
    }
    check_words(be, op, &[target, src])?;
    be.run_1d(
        "scatter_rows_u32",
        (count * cols) as u64,
        &[
            Arg::Ptr(be.ptr(target)),
            Arg::Ptr(be.ptr(src)),
            Arg::Ptr(be.ptr(slots)),
            Arg::U32(size(op, rows)?),
            Arg::U32(size(op, cols)?),
            Arg::U32(size(op, count)?),
        ],
    )
}

/// Records the launches of `spec` writing `out` from `inputs`.
pub(super) fn launch<L: Launcher>(
    be: &L,
    spec: &OpSpec,
    out: &L::Buffer,
    inputs: &[&L::Buffer],
) -> Result<()> {
    let op = spec.kind().name();
    let c = Call {
        be,
        op,
        out,
        inputs,
    };
    if matches!(
        spec,
        OpSpec::Permute { .. } | OpSpec::Concat { .. } | OpSpec::Narrow { .. }
    ) {
        check_words(be, op, inputs)?;
    }
    match spec {
        OpSpec::Unary { .. } | OpSpec::Binary { .. } => launch::elementwise::launch(&c, spec),
        OpSpec::RmsNorm { .. } | OpSpec::LayerNorm { .. } | OpSpec::Softmax { .. } => {
            launch::norm::launch(&c, spec)
        }
        OpSpec::Sample { .. } => launch::sample::launch(&c, spec),
        OpSpec::ScatterRows { .. } => Err(Error::backend(
            BackendKind::Cuda,
            "scatter_rows runs in place (write_into)",
        )),
        OpSpec::Argmax { .. } | OpSpec::Rope { .. } => launch::norm::launch(&c, spec),
        OpSpec::Matmul(_) => launch::matmul::launch(&c, spec),
        OpSpec::Embedding { .. }
        | OpSpec::Permute { .. }
        | OpSpec::Concat { .. }
        | OpSpec::Narrow { .. } => launch::elementwise::launch(&c, spec),
        OpSpec::Quantize { .. }
        | OpSpec::Dequantize { .. }
        | OpSpec::QMatmul { .. }
        | OpSpec::TernaryDot { .. } => launch::quant::launch(&c, spec),
        OpSpec::Scan { .. } | OpSpec::ScanGradA { .. } | OpSpec::ScanGradInit { .. } => {
            launch::scan::launch(&c, spec)
        }
        OpSpec::NormLinear(_)
        | OpSpec::SwigluLinear(_)
        | OpSpec::LinearResidual(_)
        | OpSpec::PagedAttention(_) => launch::fused::launch(&c, spec),
        OpSpec::NormLinearInto { .. } => Err(Error::backend(
            BackendKind::Cuda,
            "rms_norm_linear_into runs in place (write_into)",
        )),
    }
}
