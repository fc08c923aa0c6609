//! Launching `kernels/scan.cu`: the scans and their gradients.

use super::super::launcher::{Arg, Call, Launcher};
use crate::backend::BackendKind;
use crate::backend::{OpSpec, ScanOp};
use crate::error::{Error, Result};

/// Queues one op of this family.
pub(in crate::backend::cuda) fn launch<L: Launcher>(c: &Call<'_, L>, spec: &OpSpec) -> Result<()> {
    let (be, op, o) = (c.be, c.op, c.out());
    match spec {
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
            let x0 = c.input(0)?;
            let x1 = c.inputs.get(1).map_or(x0, |b| be.ptr(b));
            let x2 = c.inputs.get(2).map_or(x0, |b| be.ptr(b));
            be.run_1d(
                "scan_f32",
                (outer * inner) as u64,
                &[
                    o,
                    Arg::Ptr(x0),
                    Arg::Ptr(x1),
                    Arg::Ptr(x2),
                    Arg::U32(code),
                    c.size(outer * inner)?,
                    c.size(*len)?,
                    c.size(*inner)?,
                ],
            )
        }
        OpSpec::ScanGradA { outer, len, inner } => be.run_1d(
            "scan_grad_a",
            spec.output_len() as u64,
            &[
                o,
                Arg::Ptr(c.input(0)?),
                Arg::Ptr(c.input(1)?),
                Arg::Ptr(c.input(2)?),
                c.size(outer * len * inner)?,
                c.size(*len)?,
                c.size(*inner)?,
            ],
        ),
        OpSpec::ScanGradInit { outer, len, inner } => be.run_1d(
            "scan_grad_init",
            (outer * inner) as u64,
            &[
                o,
                Arg::Ptr(c.input(0)?),
                Arg::Ptr(c.input(1)?),
                c.size(outer * inner)?,
                c.size(*len)?,
                c.size(*inner)?,
            ],
        ),
        _ => Err(Error::backend(
            BackendKind::Cuda,
            format!("{op} is not launched by launch/scan.rs"),
        )),
    }
}
