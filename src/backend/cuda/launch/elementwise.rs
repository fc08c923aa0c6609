//! Launching `kernels/elementwise.cu`: unary and binary ops, embedding, permute, concat, narrow.

use super::super::launcher::{Arg, Call, Launcher};
use crate::backend::spec::permute_strides;
use crate::backend::BackendKind;
use crate::backend::{BinaryOp, OpSpec, UnaryOp};
use crate::error::{Error, Result};

/// Queues one op of this family.
pub(in crate::backend::cuda) fn launch<L: Launcher>(c: &Call<'_, L>, spec: &OpSpec) -> Result<()> {
    let (be, op, o) = (c.be, c.op, c.out());
    match spec {
        OpSpec::Unary { op: u, len } => {
            let (code, factor) = match u {
                UnaryOp::Silu => (0, 0.0),
                UnaryOp::GeluTanh => (1, 0.0),
                UnaryOp::GeluErf => (2, 0.0),
                UnaryOp::Sigmoid => (4, 0.0),
                UnaryOp::Scale(f) => (3, *f),
                UnaryOp::Softcap(cap) => (5, *cap),
            };
            be.run_1d(
                "unary_f32",
                *len as u64,
                &[
                    o,
                    Arg::Ptr(c.input(0)?),
                    c.size(*len)?,
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
                    Arg::Ptr(c.input(0)?),
                    Arg::Ptr(c.input(1)?),
                    c.size(*len)?,
                    c.size((*rhs_len).max(1))?,
                    Arg::U32(code),
                ],
            )
        }
        OpSpec::Embedding {
            vocab, dim, count, ..
        } => be.run_1d(
            "embedding_f32",
            (dim * count) as u64,
            &[
                o,
                Arg::Ptr(c.input(0)?),
                Arg::Ptr(c.input(1)?),
                c.size(*vocab)?,
                c.size(*dim)?,
                c.size(*count)?,
            ],
        ),
        OpSpec::Permute { in_shape, perm } => {
            let (out_shape, strides) = permute_strides(in_shape, perm);
            if out_shape.len() > OpSpec::MAX_PERMUTE_RANK {
                return Err(Error::invalid(op, "rank above the permute limit"));
            }
            // Right-align into rank 6: leading axes of size 1.
            let pad = OpSpec::MAX_PERMUTE_RANK - out_shape.len();
            let mut args = vec![o, Arg::Ptr(c.input(0)?), c.size(spec.output_len())?];
            for d in 0..OpSpec::MAX_PERMUTE_RANK {
                args.push(c.size(if d < pad { 1 } else { out_shape[d - pad] })?);
            }
            for d in 0..OpSpec::MAX_PERMUTE_RANK {
                args.push(c.size(if d < pad { 0 } else { strides[d - pad] })?);
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
                Arg::Ptr(c.input(0)?),
                Arg::Ptr(c.input(1)?),
                c.size(*rows)?,
                c.size(*a_cols)?,
                c.size(*b_cols)?,
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
                Arg::Ptr(c.input(0)?),
                c.size(*rows)?,
                c.size(*cols)?,
                c.size(*start)?,
                c.size(*len)?,
            ],
        ),
        _ => Err(Error::backend(
            BackendKind::Cuda,
            format!("{op} is not launched by launch/elementwise.rs"),
        )),
    }
}
