//! Launching `kernels/sample.cu`: token sampling.

use super::super::launcher::{size, Arg, Call, Launcher};
use crate::backend::BackendKind;
use crate::backend::OpSpec;
use crate::error::{Error, Result};

/// Queues one op of this family.
pub(in crate::backend::cuda) fn launch<L: Launcher>(c: &Call<'_, L>, spec: &OpSpec) -> Result<()> {
    let (be, op, o) = (c.be, c.op, c.out());
    match spec {
        OpSpec::Sample {
            rows,
            vocab,
            params,
        } => be.run(
            "sample_f32",
            (size(op, *rows)?, 1, 1),
            &[
                o,
                Arg::Ptr(c.input(0)?),
                Arg::Ptr(c.input(1)?),
                c.size(*vocab)?,
                Arg::F32(params.temperature),
                Arg::U32(params.top_k),
                Arg::F32(params.top_p),
            ],
        ),
        _ => Err(Error::backend(
            BackendKind::Cuda,
            format!("{op} is not launched by launch/sample.rs"),
        )),
    }
}
