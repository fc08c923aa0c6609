//! Launching `kernels/matmul.cu`: tiled matmul and matvec.

use super::super::launcher::{size, Arg, Call, Launcher, WARPS};
use crate::backend::BackendKind;
use crate::backend::OpSpec;
use crate::error::{Error, Result};

/// Queues one op of this family.
pub(in crate::backend::cuda) fn launch<L: Launcher>(c: &Call<'_, L>, spec: &OpSpec) -> Result<()> {
    let (be, op, o) = (c.be, c.op, c.out());
    match spec {
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
                        Arg::Ptr(c.input(0)?),
                        Arg::Ptr(c.input(1)?),
                        c.size(m.n)?,
                        c.size(m.k)?,
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
                        Arg::Ptr(c.input(0)?),
                        Arg::Ptr(c.input(1)?),
                        c.size(m.m)?,
                        c.size(m.n)?,
                        c.size(m.k)?,
                        Arg::U32(m.rhs_transposed as u32),
                        Arg::U64(rhs_stride),
                    ],
                )
            }
        }
        _ => Err(Error::backend(
            BackendKind::Cuda,
            format!("{op} is not launched by launch/matmul.rs"),
        )),
    }
}
