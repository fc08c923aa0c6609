//! Launching `kernels/quant.cu`: quantize, dequantize, quantized products, ternary dots.

use super::super::launcher::{format_code, size, Arg, Call, Launcher, WARPS};
use crate::backend::kernel_consts::{check_whole_groups, decodes_groups};
use crate::backend::BackendKind;
use crate::backend::{Activations, OpSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Activation rows one warp of `qmatmul` carries (`WT_QM_ROWS` in kernels/quant.cu).
const QM_ROWS: usize = 8;

/// The values llama.cpp's `Q8_K` rounds with one scale (`qmatmul_act` mode 4, the fused
/// products' `WT_ACT_Q8_K`).
pub(in crate::backend::cuda) const Q8_K_BLOCK: usize = 256;

/// The formats the `quantize` kernel writes: every format webtensor quantizes to
/// (`crate::quant::can_quantize`).
pub(in crate::backend::cuda) const QUANTIZES: [DType; 9] = [
    DType::F16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::TQ1_0,
    DType::TQ2_0,
    DType::TernaryPlanes,
];

/// Fails unless a product's `k` is whole `Q8_K` blocks where its activations are `Q8_K`.
pub(in crate::backend::cuda) fn check_q8_k_rows(
    op: &'static str,
    activations: Activations,
    k: usize,
) -> Result<()> {
    if activations == Activations::Q8_K && !k.is_multiple_of(Q8_K_BLOCK) {
        return Err(Error::invalid(
            op,
            format!("q8_k activations round rows of whole {Q8_K_BLOCK}-value blocks, not {k}"),
        ));
    }
    Ok(())
}

/// Queues one op of this family.
pub(in crate::backend::cuda) fn launch<L: Launcher>(c: &Call<'_, L>, spec: &OpSpec) -> Result<()> {
    let (be, op, o) = (c.be, c.op, c.out());
    match spec {
        OpSpec::Quantize { format, rows, cols } => {
            if !QUANTIZES.contains(format) {
                return Err(Error::invalid(
                    op,
                    format!(
                        "the cuda quantize kernel writes f16, q8_0, q4_0, q4_1, q5_0, q5_1 and \
                         the ternary formats, not {format}"
                    ),
                ));
            }
            let blocks = rows * cols / format.block_len();
            be.run_1d(
                "quantize",
                blocks as u64,
                &[
                    o,
                    Arg::Ptr(c.input(0)?),
                    Arg::U32(format_code(op, *format)?),
                    c.size(blocks)?,
                ],
            )
        }
        OpSpec::Dequantize { format, rows, cols } => {
            check_whole_groups(op, *format, *cols)?;
            be.run_1d(
                "dequantize",
                // A thread per group of 32 values where the group decoder reads the format.
                (rows * cols / if decodes_groups(*format) { 32 } else { 1 }) as u64,
                &[
                    o,
                    Arg::Ptr(c.input(0)?),
                    Arg::U32(format_code(op, *format)?),
                    c.size(rows * cols)?,
                ],
            )
        }
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
                Activations::Q8_K => (4, Q8_K_BLOCK),
            };
            check_q8_k_rows(op, *activations, *k)?;
            check_whole_groups(op, *format, *k)?;
            let scratch;
            let act = if mode == 0 {
                c.input(0)?
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
                        Arg::Ptr(c.input(0)?),
                        Arg::U32(mode),
                        c.size(m * k)?,
                        c.size(block)?,
                    ],
                )?;
                be.ptr(&scratch)
            };
            // One warp per weight row and group of QM_ROWS activation rows.
            let warps = n * m.div_ceil(QM_ROWS);
            be.run(
                "qmatmul",
                (size(op, warps.div_ceil(WARPS as usize))?, 1, 1),
                &[
                    o,
                    Arg::Ptr(act),
                    Arg::Ptr(c.input(1)?),
                    Arg::U32(format_code(op, *format)?),
                    c.size(*m)?,
                    c.size(*n)?,
                    c.size(*k)?,
                ],
            )
        }
        OpSpec::TernaryDot { format, m, n, k } => be.run(
            "ternary_dot",
            (size(op, (m * n).div_ceil(WARPS as usize))?, 1, 1),
            &[
                o,
                Arg::Ptr(c.input(0)?),
                Arg::Ptr(c.input(1)?),
                Arg::U32(format_code(op, *format)?),
                c.size(*m)?,
                c.size(*n)?,
                c.size(*k)?,
            ],
        ),
        _ => Err(Error::backend(
            BackendKind::Cuda,
            format!("{op} is not launched by launch/quant.rs"),
        )),
    }
}
