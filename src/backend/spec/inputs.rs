//! What each op reads: the dtype and element count of every input, in the order the spec
//! documents. `ops::dispatch` checks every op's inputs against this once, for every backend,
//! so a backend receives only inputs of the right dtype that are long enough.

use super::{Activations, OpSpec, ScanOp};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One input an op reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputSpec {
    /// The dtype it must have; `None` for ops that move any dtype (permute, concat, narrow,
    /// scatter_rows).
    pub dtype: Option<DType>,
    /// Elements the op reads (the input may hold more).
    pub elements: usize,
}

const fn of(dtype: DType, elements: usize) -> InputSpec {
    InputSpec {
        dtype: Some(dtype),
        elements,
    }
}

const fn any(elements: usize) -> InputSpec {
    InputSpec {
        dtype: None,
        elements,
    }
}

impl OpSpec {
    /// The inputs the op reads, in order; an error for sizes the op cannot mean (a broadcast
    /// operand that does not divide the other, a narrow beyond its row, an argmax over no
    /// columns).
    pub fn inputs(&self) -> Result<Vec<InputSpec>> {
        use DType::{F32, U32};
        let op = self.kind().name();
        Ok(match self {
            OpSpec::Unary { len, .. } => vec![of(F32, *len)],
            OpSpec::Binary { len, rhs_len, .. } => {
                // An empty operand broadcasts only over an empty one.
                let fits = if *rhs_len == 0 {
                    *len == 0
                } else {
                    len.is_multiple_of(*rhs_len)
                };
                if !fits {
                    return Err(Error::invalid(
                        op,
                        format!("rhs_len {rhs_len} must divide len {len}"),
                    ));
                }
                vec![of(F32, *len), of(F32, *rhs_len)]
            }
            OpSpec::RmsNorm { rows, cols, .. } => vec![of(F32, rows * cols), of(F32, *cols)],
            OpSpec::LayerNorm { rows, cols, .. } => {
                vec![of(F32, rows * cols), of(F32, *cols), of(F32, *cols)]
            }
            OpSpec::Softmax { rows, cols, .. } => vec![of(F32, rows * cols)],
            OpSpec::Rope {
                rows,
                heads,
                head_dim,
                ..
            } => vec![
                of(F32, rows * heads * head_dim),
                of(U32, *rows),
                of(F32, head_dim / 2),
            ],
            OpSpec::Matmul(m) => {
                let rhs_mats = if m.rhs_batched { m.batch } else { 1 };
                vec![of(F32, m.batch * m.m * m.k), of(F32, rhs_mats * m.n * m.k)]
            }
            OpSpec::Embedding {
                vocab,
                dim,
                count,
                format,
            } => vec![of(*format, vocab * dim), of(U32, *count)],
            OpSpec::Permute { in_shape, .. } => vec![any(in_shape.iter().product())],
            OpSpec::Quantize { rows, cols, .. } => vec![of(F32, rows * cols)],
            OpSpec::Dequantize { format, rows, cols } => vec![of(*format, rows * cols)],
            OpSpec::QMatmul {
                format,
                activations,
                m,
                n,
                k,
            } => {
                let a = if *activations == Activations::F16 {
                    DType::F16
                } else {
                    F32
                };
                vec![of(a, m * k), of(*format, n * k)]
            }
            OpSpec::TernaryDot { format, m, n, k } => {
                vec![of(*format, n * k), of(DType::I8, m * k)]
            }
            OpSpec::Scan {
                op: scan,
                outer,
                len,
                inner,
            } => {
                let n = outer * len * inner;
                match scan {
                    ScanOp::Linear => vec![of(F32, n), of(F32, n), of(F32, outer * inner)],
                    ScanOp::LinearAdjoint => vec![of(F32, n), of(F32, n)],
                    ScanOp::LogCumprod | ScanOp::LogCumSumExp => vec![of(F32, n)],
                }
            }
            OpSpec::ScanGradA { outer, len, inner } => {
                let n = outer * len * inner;
                vec![of(F32, n), of(F32, n), of(F32, outer * inner)]
            }
            OpSpec::ScanGradInit { outer, len, inner } => {
                let n = outer * len * inner;
                vec![of(F32, n), of(F32, n)]
            }
            OpSpec::Concat {
                rows,
                a_cols,
                b_cols,
            } => vec![any(rows * a_cols), any(rows * b_cols)],
            OpSpec::Narrow {
                rows,
                cols,
                start,
                len,
            } => {
                if start + len > *cols {
                    return Err(Error::invalid(
                        op,
                        format!("columns {start}..{} exceed the width {cols}", start + len),
                    ));
                }
                vec![any(rows * cols)]
            }
            OpSpec::Argmax { rows, cols } => {
                if *cols == 0 && *rows != 0 {
                    return Err(Error::invalid(op, "argmax needs at least one column"));
                }
                vec![of(F32, rows * cols)]
            }
            OpSpec::ScatterRows { cols, count, .. } => vec![any(count * cols), of(U32, *count)],
            OpSpec::Sample { rows, vocab, .. } => vec![of(F32, rows * vocab), of(F32, *rows)],
            OpSpec::NormLinear(l) => {
                if l.norm.is_none() {
                    return Err(Error::invalid(op, "a NormLinear spec needs its norm"));
                }
                let mut inputs = vec![
                    of(F32, l.m * l.k),
                    of(l.format, l.weight_len()),
                    of(F32, l.k),
                ];
                if let Some(r) = l.rope {
                    if r.head_dim == 0 || r.head_dim % 2 != 0 || l.n % r.head_dim != 0 {
                        return Err(Error::invalid(
                            op,
                            format!(
                                "the rotary head_dim {} must be even and divide n = {}",
                                r.head_dim, l.n
                            ),
                        ));
                    }
                    inputs.extend([of(U32, l.m), of(F32, r.head_dim / 2)]);
                }
                inputs
            }
            OpSpec::NormLinearInto {
                l,
                head_dim,
                paired,
                ..
            } => {
                if *head_dim == 0 || l.n % head_dim != 0 {
                    return Err(Error::invalid(
                        op,
                        format!("head_dim {head_dim} must divide the product's n = {}", l.n),
                    ));
                }
                let mut inputs = OpSpec::NormLinear(*l).inputs()?;
                inputs.push(of(U32, l.m * l.n / head_dim));
                if *paired {
                    inputs.push(of(l.format, l.weight_len()));
                }
                inputs
            }
            OpSpec::SwigluLinear(l) if l.rope.is_some() => {
                return Err(Error::invalid(op, "swiglu_linear takes no rope"));
            }
            OpSpec::SwigluLinear(l) => {
                let mut inputs = vec![
                    of(F32, l.m * l.k),
                    of(l.format, l.weight_len()),
                    of(l.format, l.weight_len()),
                ];
                if l.norm.is_some() {
                    inputs.push(of(F32, l.k));
                }
                inputs
            }
            OpSpec::LinearResidual(l) if l.norm.is_some() || l.rope.is_some() => {
                return Err(Error::invalid(op, "linear_residual takes no norm or rope"));
            }
            OpSpec::LinearResidual(l) => vec![
                of(F32, l.m * l.k),
                of(l.format, l.weight_len()),
                of(F32, l.m * l.n),
            ],
            OpSpec::PagedAttention(a) => {
                if a.t > a.n || a.n > a.stride || a.kv_heads == 0 || a.heads % a.kv_heads != 0 {
                    return Err(Error::invalid(
                        op,
                        format!(
                            "needs t ≤ n ≤ the row table's columns and kv_heads dividing heads \
                             (t {}, n {}, columns {}, heads {}, kv_heads {})",
                            a.t, a.n, a.stride, a.heads, a.kv_heads
                        ),
                    ));
                }
                if a.window == Some(0) {
                    return Err(Error::invalid(op, "a window of 0 keys hides everything"));
                }
                let pool = a.pool_rows * a.head_dim;
                vec![
                    of(F32, a.t * a.heads * a.head_dim),
                    of(F32, pool),
                    of(F32, pool),
                    of(U32, a.kv_heads * a.stride),
                ]
            }
        })
    }

    /// Fails unless `inputs` (dtype and element count of each, in order) are what the op
    /// reads: the one check every backend relies on.
    pub fn check_inputs(&self, inputs: &[(DType, usize)]) -> Result<()> {
        let op = self.kind().name();
        let need = self.inputs()?;
        if inputs.len() != need.len() {
            return Err(Error::invalid(
                op,
                format!("takes {} inputs, got {}", need.len(), inputs.len()),
            ));
        }
        for (i, (want, &(dtype, elements))) in need.iter().zip(inputs).enumerate() {
            if want.dtype.is_some_and(|d| d != dtype) {
                return Err(Error::invalid(
                    op,
                    format!(
                        "input {i} is {dtype}, the op reads {}",
                        want.dtype.map_or("-", |d| d.name())
                    ),
                ));
            }
            if elements < want.elements {
                return Err(Error::invalid(
                    op,
                    format!(
                        "input {i} has {elements} elements, the op reads {}",
                        want.elements
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BinaryOp;

    #[test]
    fn inputs_of_the_wrong_dtype_length_or_count_are_refused() {
        let add = OpSpec::Binary {
            op: BinaryOp::Add,
            len: 6,
            rhs_len: 3,
        };
        assert!(add
            .check_inputs(&[(DType::F32, 6), (DType::F32, 3)])
            .is_ok());
        assert!(add
            .check_inputs(&[(DType::F32, 6), (DType::U32, 3)])
            .is_err());
        assert!(add
            .check_inputs(&[(DType::F32, 5), (DType::F32, 3)])
            .is_err());
        assert!(add.check_inputs(&[(DType::F32, 6)]).is_err());
        let bad_broadcast = OpSpec::Binary {
            op: BinaryOp::Add,
            len: 6,
            rhs_len: 4,
        };
        assert!(bad_broadcast.inputs().is_err());
        // Ops that move any dtype check lengths only.
        let narrow = OpSpec::Narrow {
            rows: 2,
            cols: 4,
            start: 1,
            len: 2,
        };
        assert!(narrow.check_inputs(&[(DType::F16, 8)]).is_ok());
        assert!(narrow.check_inputs(&[(DType::F16, 7)]).is_err());
    }
}
