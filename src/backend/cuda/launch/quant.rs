//! Launching `kernels/quant.cu`: quantize, dequantize, quantized products, ternary dots.

use super::super::launcher::{format_code, size, Arg, Call, Launcher, WARPS};
use crate::backend::BackendKind;
use crate::backend::{Activations, OpSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Activation rows one warp of `qmatmul` carries (`WT_QM_ROWS` in kernels/quant.cu).
const QM_ROWS: usize = 8;

/// Queues one op of this family.
pub(in crate::backend::cuda) fn launch<L: Launcher>(c: &Call<'_, L>, spec: &OpSpec) -> Result<()> {
    let (be, op, o) = (c.be, c.op, c.out());
    match spec {
        OpSpec::Quantize { format, rows, cols } => {
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
        OpSpec::Dequantize { format, rows, cols } => be.run_1d(
            "dequantize",
            (rows * cols) as u64,
            &[
                o,
                Arg::Ptr(c.input(0)?),
                Arg::U32(format_code(op, *format)?),
                c.size(rows * cols)?,
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
                Activations::Q8_K => {
                    return Err(Error::invalid(
                        op,
                        "q8_k activations have no cuda kernel yet",
                    ))
                }
            };
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
