//! Launching `kernels/norm.cu`: RMS and layer norm, softmax, argmax, rope.

use super::super::launcher::{size, Arg, Call, Launcher};
use crate::backend::BackendKind;
use crate::backend::OpSpec;
use crate::error::{Error, Result};

/// Queues one op of this family.
pub(in crate::backend::cuda) fn launch<L: Launcher>(c: &Call<'_, L>, spec: &OpSpec) -> Result<()> {
    let (be, op, o) = (c.be, c.op, c.out());
    match spec {
        OpSpec::RmsNorm { rows, cols, eps } => be.run(
            "rms_norm_f32",
            (size(op, *rows)?, 1, 1),
            &[
                o,
                Arg::Ptr(c.input(0)?),
                Arg::Ptr(c.input(1)?),
                c.size(*cols)?,
                Arg::F32(*eps),
            ],
        ),
        OpSpec::LayerNorm { rows, cols, eps } => be.run(
            "layer_norm_f32",
            (size(op, *rows)?, 1, 1),
            &[
                o,
                Arg::Ptr(c.input(0)?),
                Arg::Ptr(c.input(1)?),
                Arg::Ptr(c.input(2)?),
                c.size(*cols)?,
                Arg::F32(*eps),
            ],
        ),
        OpSpec::Softmax { rows, cols, causal } => be.run(
            "softmax_f32",
            (size(op, *rows)?, 1, 1),
            &[
                o,
                Arg::Ptr(c.input(0)?),
                c.size(*cols)?,
                c.size(causal.unwrap_or(0))?,
            ],
        ),
        OpSpec::Argmax { rows, cols } => be.run(
            "argmax_f32",
            (size(op, *rows)?, 1, 1),
            &[o, Arg::Ptr(c.input(0)?), c.size(*cols)?],
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
                Arg::Ptr(c.input(0)?),
                Arg::Ptr(c.input(1)?),
                Arg::Ptr(c.input(2)?),
                c.size(*rows)?,
                c.size(*heads)?,
                c.size(*head_dim)?,
                Arg::U32(matches!(layout, crate::backend::RopeLayout::Interleaved) as u32),
            ],
        ),
        _ => Err(Error::backend(
            BackendKind::Cuda,
            format!("{op} is not launched by launch/norm.rs"),
        )),
    }
}
