//! Each [`OpSpec`] as launches of the kernels in `kernels/*.cu`: arguments, grid and block.
//!
//! Sizes go to the kernels as `u32` (the backend refuses buffers past 4 GiB) and device
//! addresses as `u64`.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{CudaBackend, CudaBuffer};
use crate::backend::kernel_consts::format_code;
use crate::backend::spec::permute_strides;
use crate::backend::{Activations, BinaryOp, OpSpec, ScanOp, UnaryOp};
use crate::error::{Error, Result};
use crate::tensor::DType;

/// Threads per block of the 1-D and row kernels.
pub(super) const BLOCK: u32 = 256;
/// Outputs per block of the warp-per-output kernels (`BLOCK / 32`).
const WARPS: u32 = BLOCK / 32;

/// One kernel argument.
pub(super) enum Arg {
    /// A device address.
    Ptr(u64),
    U32(u32),
    U64(u64),
    F32(f32),
}

/// A size as the kernels take it, or an error for one past 32 bits.
fn size(op: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::TensorTooLarge {
        op,
        backend: "cuda".into(),
        bytes: v as u64,
        limit_name: "32-bit kernel size",
        limit: u32::MAX as u64,
    })
}

/// Blocks of `BLOCK` threads covering `n` threads (at least one: a grid of none is a launch
/// error, and every kernel checks its bounds).
fn blocks_for(n: u64) -> u32 {
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
    /// A temporary buffer of `len` units of `dtype`, alive until the work queued so far ran.
    fn scratch(&self, op: &'static str, len: usize, dtype: DType) -> Result<Self::Buffer>;
    /// Launches kernel `name` on `grid` blocks of [`BLOCK`] threads.
    fn run(&self, name: &'static str, grid: (u32, u32, u32), args: &[Arg]) -> Result<()>;

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

    fn scratch(&self, op: &'static str, len: usize, dtype: DType) -> Result<CudaBuffer> {
        // Freed with stream ordering (or after a device sync) when dropped, so dropping it
        // right after queuing the kernels that use it is safe.
        self.alloc(op, len, dtype)
    }

    fn run(&self, name: &'static str, grid: (u32, u32, u32), args: &[Arg]) -> Result<()> {
        let f = self
            .functions
            .get(name)
            .ok_or_else(|| Error::backend("cuda", format!("kernel {name} was not loaded")))?;
        let mut builder = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(v) | Arg::U64(v) => builder.arg(v),
                Arg::U32(v) => builder.arg(v),
                Arg::F32(v) => builder.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: each kernel's parameter list matches `args` (see the `.cu` files), and every
        // pointer is a live buffer at least as large as the sizes passed say.
        unsafe { builder.launch(cfg) }
            .map(|_| ())
            .map_err(|e| Error::backend("cuda", format!("launching {name}: {e:?}")))
    }
}

/// Records the in-place `spec` ([`OpSpec::ScatterRows`]) changing `target`.
pub(super) fn launch_in_place<L: Launcher>(
    be: &L,
    spec: &OpSpec,
    target: &L::Buffer,
    inputs: &[&L::Buffer],
) -> Result<()> {
    let op = spec.kind().name();
    let OpSpec::ScatterRows { rows, cols, count } = *spec else {
        return Err(Error::backend(
            "cuda",
            format!("{op} is not an in-place op"),
        ));
    };
    let [src, slots] = inputs else {
        return Err(Error::backend("cuda", "scatter_rows takes src and slots"));
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
    let input = |i: usize| -> Result<u64> {
        inputs
            .get(i)
            .map(|b| be.ptr(b))
            .ok_or_else(|| Error::backend("cuda", format!("{op}: input {i} is missing")))
    };
    let o = Arg::Ptr(be.ptr(out));
    let s = |v: usize| size(op, v).map(Arg::U32);
    if matches!(
        spec,
        OpSpec::Permute { .. } | OpSpec::Concat { .. } | OpSpec::Narrow { .. }
    ) {
        check_words(be, op, inputs)?;
    }
    match spec {
        OpSpec::Unary { op: u, len } => {
            let (code, factor) = match u {
                UnaryOp::Silu => (0, 0.0),
                UnaryOp::GeluTanh => (1, 0.0),
                UnaryOp::GeluErf => (2, 0.0),
                UnaryOp::Scale(f) => (3, *f),
            };
            be.run_1d(
                "unary_f32",
                *len as u64,
                &[
                    o,
                    Arg::Ptr(input(0)?),
                    s(*len)?,
                    Arg::U32(code),
                    Arg::F32(factor),
                ],
            )
        }
        OpSpec::Binary {
            op: b,
            len,
            rhs_len,
        } => {
            let code = match b {
                BinaryOp::Add => 0,
                BinaryOp::Mul => 1,
                BinaryOp::SwiGlu => 2,
            };
            be.run_1d(
                "binary_f32",
                *len as u64,
                &[
                    o,
                    Arg::Ptr(input(0)?),
                    Arg::Ptr(input(1)?),
                    s(*len)?,
                    s((*rhs_len).max(1))?,
                    Arg::U32(code),
                ],
            )
        }
        OpSpec::RmsNorm { rows, cols, eps } => be.run(
            "rms_norm_f32",
            (size(op, *rows)?, 1, 1),
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::Ptr(input(1)?),
                s(*cols)?,
                Arg::F32(*eps),
            ],
        ),
        OpSpec::LayerNorm { rows, cols, eps } => be.run(
            "layer_norm_f32",
            (size(op, *rows)?, 1, 1),
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::Ptr(input(1)?),
                Arg::Ptr(input(2)?),
                s(*cols)?,
                Arg::F32(*eps),
            ],
        ),
        OpSpec::Softmax { rows, cols, causal } => be.run(
            "softmax_f32",
            (size(op, *rows)?, 1, 1),
            &[o, Arg::Ptr(input(0)?), s(*cols)?, s(causal.unwrap_or(0))?],
        ),
        OpSpec::Sample {
            rows,
            vocab,
            params,
        } => be.run(
            "sample_f32",
            (size(op, *rows)?, 1, 1),
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::Ptr(input(1)?),
                s(*vocab)?,
                Arg::F32(params.temperature),
                Arg::U32(params.top_k),
                Arg::F32(params.top_p),
            ],
        ),
        OpSpec::ScatterRows { .. } => Err(Error::backend(
            "cuda",
            "scatter_rows runs in place (write_into)",
        )),
        OpSpec::Argmax { rows, cols } => be.run(
            "argmax_f32",
            (size(op, *rows)?, 1, 1),
            &[o, Arg::Ptr(input(0)?), s(*cols)?],
        ),
        OpSpec::Rope {
            rows,
            heads,
            head_dim,
            layout,
        } => be.run_1d(
            "rope_f32",
            (rows * heads * (head_dim / 2)) as u64,
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::Ptr(input(1)?),
                Arg::Ptr(input(2)?),
                s(*rows)?,
                s(*heads)?,
                s(*head_dim)?,
                Arg::U32(matches!(layout, crate::backend::RopeLayout::Interleaved) as u32),
            ],
        ),
        OpSpec::Matmul(m) => {
            let rhs_stride = if m.rhs_batched { (m.n * m.k) as u64 } else { 0 };
            let batch = size(op, m.batch)?;
            if batch > 65_535 {
                return Err(Error::invalid(
                    op,
                    format!("the cuda backend runs at most 65535 batched products, not {batch}"),
                ));
            }
            if m.m == 1 {
                be.run(
                    "matvec_f32",
                    (size(op, m.n.div_ceil(WARPS as usize))?, batch, 1),
                    &[
                        o,
                        Arg::Ptr(input(0)?),
                        Arg::Ptr(input(1)?),
                        s(m.n)?,
                        s(m.k)?,
                        Arg::U32(m.rhs_transposed as u32),
                        Arg::U64(rhs_stride),
                    ],
                )
            } else {
                be.run(
                    "matmul_f32",
                    (
                        size(op, m.n.div_ceil(64))?,
                        size(op, m.m.div_ceil(64))?,
                        batch,
                    ),
                    &[
                        o,
                        Arg::Ptr(input(0)?),
                        Arg::Ptr(input(1)?),
                        s(m.m)?,
                        s(m.n)?,
                        s(m.k)?,
                        Arg::U32(m.rhs_transposed as u32),
                        Arg::U64(rhs_stride),
                    ],
                )
            }
        }
        OpSpec::Embedding { vocab, dim, count } => be.run_1d(
            "embedding_f32",
            (dim * count) as u64,
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::Ptr(input(1)?),
                s(*vocab)?,
                s(*dim)?,
                s(*count)?,
            ],
        ),
        OpSpec::Permute { in_shape, perm } => {
            let (out_shape, strides) = permute_strides(in_shape, perm);
            if out_shape.len() > OpSpec::MAX_PERMUTE_RANK {
                return Err(Error::invalid(op, "rank above the permute limit"));
            }
            // Right-align into rank 6: leading axes of size 1.
            let pad = OpSpec::MAX_PERMUTE_RANK - out_shape.len();
            let mut args = vec![o, Arg::Ptr(input(0)?), s(spec.output_len())?];
            for d in 0..OpSpec::MAX_PERMUTE_RANK {
                args.push(s(if d < pad { 1 } else { out_shape[d - pad] })?);
            }
            for d in 0..OpSpec::MAX_PERMUTE_RANK {
                args.push(s(if d < pad { 0 } else { strides[d - pad] })?);
            }
            be.run_1d("permute_u32", spec.output_len() as u64, &args)
        }
        OpSpec::Concat {
            rows,
            a_cols,
            b_cols,
        } => be.run_1d(
            "concat_u32",
            spec.output_len() as u64,
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::Ptr(input(1)?),
                s(*rows)?,
                s(*a_cols)?,
                s(*b_cols)?,
            ],
        ),
        OpSpec::Narrow {
            rows,
            cols,
            start,
            len,
        } => be.run_1d(
            "narrow_u32",
            spec.output_len() as u64,
            &[
                o,
                Arg::Ptr(input(0)?),
                s(*rows)?,
                s(*cols)?,
                s(*start)?,
                s(*len)?,
            ],
        ),
        OpSpec::Quantize { format, rows, cols } => {
            let blocks = rows * cols / format.block_len();
            be.run_1d(
                "quantize",
                blocks as u64,
                &[
                    o,
                    Arg::Ptr(input(0)?),
                    Arg::U32(format_code(op, *format)?),
                    s(blocks)?,
                ],
            )
        }
        OpSpec::Dequantize { format, rows, cols } => be.run_1d(
            "dequantize",
            (rows * cols) as u64,
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::U32(format_code(op, *format)?),
                s(rows * cols)?,
            ],
        ),
        OpSpec::QMatmul {
            format,
            activations,
            m,
            n,
            k,
        } => {
            // The activations as f32: the input itself, or widened / rounded first.
            let (mode, block) = match activations {
                Activations::F32 => (0, 0),
                Activations::F16 => (1, 1),
                Activations::Q8_0 => (2, 32),
                Activations::I8 => (3, *k),
            };
            let scratch;
            let act = if mode == 0 {
                input(0)?
            } else {
                scratch = be.scratch(op, m * k, DType::F32)?;
                let threads = if mode == 1 {
                    m * k
                } else {
                    (m * k) / block.max(1)
                };
                be.run_1d(
                    "qmatmul_act",
                    threads as u64,
                    &[
                        Arg::Ptr(be.ptr(&scratch)),
                        Arg::Ptr(input(0)?),
                        Arg::U32(mode),
                        s(m * k)?,
                        s(block)?,
                    ],
                )?;
                be.ptr(&scratch)
            };
            be.run(
                "qmatmul",
                (size(op, (m * n).div_ceil(WARPS as usize))?, 1, 1),
                &[
                    o,
                    Arg::Ptr(act),
                    Arg::Ptr(input(1)?),
                    Arg::U32(format_code(op, *format)?),
                    s(*m)?,
                    s(*n)?,
                    s(*k)?,
                ],
            )
        }
        OpSpec::TernaryDot { format, m, n, k } => be.run(
            "ternary_dot",
            (size(op, (m * n).div_ceil(WARPS as usize))?, 1, 1),
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::Ptr(input(1)?),
                Arg::U32(format_code(op, *format)?),
                s(*m)?,
                s(*n)?,
                s(*k)?,
            ],
        ),
        OpSpec::Scan {
            op: scan,
            outer,
            len,
            inner,
        } => {
            let code = match scan {
                ScanOp::Linear => 0,
                ScanOp::LinearAdjoint => 1,
                ScanOp::LogCumprod => 2,
                ScanOp::LogCumSumExp => 3,
            };
            // Unused inputs are passed as the first one; the kernel does not read them.
            let x0 = input(0)?;
            let x1 = inputs.get(1).map_or(x0, |b| be.ptr(b));
            let x2 = inputs.get(2).map_or(x0, |b| be.ptr(b));
            be.run_1d(
                "scan_f32",
                (outer * inner) as u64,
                &[
                    o,
                    Arg::Ptr(x0),
                    Arg::Ptr(x1),
                    Arg::Ptr(x2),
                    Arg::U32(code),
                    s(outer * inner)?,
                    s(*len)?,
                    s(*inner)?,
                ],
            )
        }
        OpSpec::ScanGradA { outer, len, inner } => be.run_1d(
            "scan_grad_a",
            spec.output_len() as u64,
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::Ptr(input(1)?),
                Arg::Ptr(input(2)?),
                s(outer * len * inner)?,
                s(*len)?,
                s(*inner)?,
            ],
        ),
        OpSpec::ScanGradInit { outer, len, inner } => be.run_1d(
            "scan_grad_init",
            (outer * inner) as u64,
            &[
                o,
                Arg::Ptr(input(0)?),
                Arg::Ptr(input(1)?),
                s(outer * inner)?,
                s(*len)?,
                s(*inner)?,
            ],
        ),
    }
}
