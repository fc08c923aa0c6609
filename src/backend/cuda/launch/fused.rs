//! Launching `kernels/fused.cu`: the fused decode ops (products of RMS-normed rows with a rope
//! or a store into KV pool rows, gate·up·SiLU, a product with the residual added, attention
//! over a paged KV pool), and which of them the backend would rather compose
//! ([`runs_fused`]).

use super::super::launcher::{format_code, size, Arg, Call, Launcher, WARPS};
use super::quant::{check_q8_k_rows, Q8_K_BLOCK};
use crate::backend::kernel_consts::gpu_reads_rows;
use crate::backend::{Activations, AttentionSpec, BackendKind, LinearSpec, OpSpec, RopeLayout};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Activation rows one warp carries (`WT_FUSED_ROWS` in kernels/fused.cu).
pub(in crate::backend::cuda) const ROWS: usize = 8;
/// The most f32 activation values a block prepares in shared memory (`WT_FUSED_F32_ACTS`).
pub(in crate::backend::cuda) const F32_ACTS: usize = 8192;
/// The most int8 activation values a block prepares in shared memory (`WT_FUSED_INT_ACTS`).
pub(in crate::backend::cuda) const INT_ACTS: usize = 16384;
/// The widest head `paged_attention` takes (`WT_ATT_MAX_HEAD_DIM`).
pub(in crate::backend::cuda) const ATTENTION_MAX_HEAD_DIM: usize = 512;
/// The most new queries `paged_attention` runs: past them (a prefill) every (query, head)
/// block would read all the keys again, and the composition's tiled products do better.
pub(in crate::backend::cuda) const ATTENTION_MAX_QUERIES: usize = 16;

/// `fused_linear_*`'s epilogue codes (`WT_EPI_*`).
const EPI_STORE: u32 = 0;
const EPI_RESIDUAL: u32 = 1;
const EPI_SWIGLU: u32 = 2;
const EPI_ROPE: u32 = 3;
/// `fused_linear_*`'s flags (`WT_FUSED_*`).
const INTO: u32 = 1;
const NORM: u32 = 2;
const INTERLEAVED: u32 = 4;
const PREPARED: u32 = 8;
/// The weight code of f32 weights (`WT_FMT_F32`): the packed formats' codes start at 1.
const FMT_F32: u32 = 0;

/// Whether the backend runs fused `spec` as its kernel (else ops composes it; see
/// `Backend::prefers_composition`): f32 weights past [`ROWS`] rows go to the tiled matmul of
/// the composition, attention past [`ATTENTION_MAX_QUERIES`] queries or with heads wider
/// than [`ATTENTION_MAX_HEAD_DIM`] to the composition's products, and a store into pool rows
/// whose rope pairs heads of another width than the pool's rows is composed too.
pub(in crate::backend::cuda) fn runs_fused(spec: &OpSpec) -> bool {
    let product = |l: &LinearSpec| {
        // Every packed format, in rows its kernels read (bf16 in whole groups).
        let format = (matches!(l.format, DType::F32 | DType::F16 | DType::BF16)
            || l.format.is_quantized())
            && gpu_reads_rows(l.format, l.k);
        let acts = match l.activations {
            Activations::F32 => true,
            Activations::F16 => false,
            Activations::Q8_0 | Activations::I8 => l.format.is_quantized(),
            Activations::Q8_K => l.format.is_quantized() && l.k.is_multiple_of(Q8_K_BLOCK),
        };
        format && acts && l.k > 0 && !(l.format == DType::F32 && l.m > ROWS)
    };
    match spec {
        OpSpec::NormLinear(l) | OpSpec::SwigluLinear(l) | OpSpec::LinearResidual(l) => product(l),
        // A paired store (keys and values) runs as its two stores.
        OpSpec::NormLinearInto {
            l,
            head_dim,
            paired,
            ..
        } => !paired && product(l) && l.rope.is_none_or(|r| r.head_dim == *head_dim),
        OpSpec::PagedAttention(a) => {
            a.head_dim <= ATTENTION_MAX_HEAD_DIM && a.t <= ATTENTION_MAX_QUERIES
        }
        _ => true,
    }
}

/// The parameters of `fused_linear_f32` and `fused_linear_i8`, in their order. Pointers an
/// op does not use are 0 (the kernel does not read them).
#[derive(Clone, Copy, Debug)]
pub(in crate::backend::cuda) struct LinearArgs {
    pub(in crate::backend::cuda) out: u64,
    pub(in crate::backend::cuda) x: u64,
    pub(in crate::backend::cuda) w0: u64,
    pub(in crate::backend::cuda) w1: u64,
    pub(in crate::backend::cuda) norm_w: u64,
    pub(in crate::backend::cuda) residual: u64,
    pub(in crate::backend::cuda) positions: u64,
    pub(in crate::backend::cuda) inv_freq: u64,
    pub(in crate::backend::cuda) slots: u64,
    pub(in crate::backend::cuda) fmt: u32,
    pub(in crate::backend::cuda) mode: u32,
    pub(in crate::backend::cuda) m: u32,
    pub(in crate::backend::cuda) n: u32,
    pub(in crate::backend::cuda) k: u32,
    pub(in crate::backend::cuda) epilogue: u32,
    pub(in crate::backend::cuda) flags: u32,
    pub(in crate::backend::cuda) eps: f32,
    pub(in crate::backend::cuda) head_dim: u32,
    pub(in crate::backend::cuda) pool_rows: u32,
}

impl LinearArgs {
    /// The kernel's argument list.
    pub(in crate::backend::cuda) fn args(&self) -> Vec<Arg> {
        vec![
            Arg::Ptr(self.out),
            Arg::Ptr(self.x),
            Arg::Ptr(self.w0),
            Arg::Ptr(self.w1),
            Arg::Ptr(self.norm_w),
            Arg::Ptr(self.residual),
            Arg::Ptr(self.positions),
            Arg::Ptr(self.inv_freq),
            Arg::Ptr(self.slots),
            Arg::U32(self.fmt),
            Arg::U32(self.mode),
            Arg::U32(self.m),
            Arg::U32(self.n),
            Arg::U32(self.k),
            Arg::U32(self.epilogue),
            Arg::U32(self.flags),
            Arg::F32(self.eps),
            Arg::U32(self.head_dim),
            Arg::U32(self.pool_rows),
        ]
    }
}

/// The parameters of `fused_prepare`, in its order.
#[derive(Clone, Copy, Debug)]
pub(in crate::backend::cuda) struct PrepareArgs {
    pub(in crate::backend::cuda) out: u64,
    pub(in crate::backend::cuda) x: u64,
    pub(in crate::backend::cuda) norm_w: u64,
    pub(in crate::backend::cuda) m: u32,
    pub(in crate::backend::cuda) k: u32,
    pub(in crate::backend::cuda) mode: u32,
    pub(in crate::backend::cuda) norm: u32,
    pub(in crate::backend::cuda) eps: f32,
}

impl PrepareArgs {
    /// The kernel's argument list.
    pub(in crate::backend::cuda) fn args(&self) -> Vec<Arg> {
        vec![
            Arg::Ptr(self.out),
            Arg::Ptr(self.x),
            Arg::Ptr(self.norm_w),
            Arg::U32(self.m),
            Arg::U32(self.k),
            Arg::U32(self.mode),
            Arg::U32(self.norm),
            Arg::F32(self.eps),
        ]
    }
}

/// The parameters of `paged_attention`, in its order. The key count goes twice: as `n`,
/// and as the address a replayed step reads it from ([`Arg::KeysAt`], null otherwise).
#[derive(Clone, Copy, Debug)]
pub(in crate::backend::cuda) struct AttentionArgs {
    pub(in crate::backend::cuda) out: u64,
    pub(in crate::backend::cuda) q: u64,
    pub(in crate::backend::cuda) keys: u64,
    pub(in crate::backend::cuda) values: u64,
    pub(in crate::backend::cuda) rows: u64,
    pub(in crate::backend::cuda) n: u32,
    pub(in crate::backend::cuda) t: u32,
    pub(in crate::backend::cuda) stride: u32,
    pub(in crate::backend::cuda) heads: u32,
    pub(in crate::backend::cuda) kv_heads: u32,
    pub(in crate::backend::cuda) head_dim: u32,
    pub(in crate::backend::cuda) pool_rows: u32,
    pub(in crate::backend::cuda) scale: f32,
    pub(in crate::backend::cuda) window: u32,
    /// Soft-capping of the scaled scores; 0 for none.
    pub(in crate::backend::cuda) softcap: f32,
}

impl AttentionArgs {
    /// The kernel's argument list.
    pub(in crate::backend::cuda) fn args(&self) -> Vec<Arg> {
        vec![
            Arg::Ptr(self.out),
            Arg::Ptr(self.q),
            Arg::Ptr(self.keys),
            Arg::Ptr(self.values),
            Arg::Ptr(self.rows),
            Arg::U32(self.n),
            Arg::KeysAt,
            Arg::U32(self.t),
            Arg::U32(self.stride),
            Arg::U32(self.heads),
            Arg::U32(self.kv_heads),
            Arg::U32(self.head_dim),
            Arg::U32(self.pool_rows),
            Arg::F32(self.scale),
            Arg::U32(self.window),
            Arg::F32(self.softcap),
        ]
    }
}

/// What a fused product adds to the plain one: its epilogue and where it stores.
struct Extras {
    epilogue: u32,
    /// The second weight (swiglu's up), or 0.
    w1: u64,
    /// The norm's weight, when the activations are normed.
    norm: Option<(u64, f32)>,
    /// The residual (epilogue residual), or 0.
    residual: u64,
    /// The rope's positions, frequencies and pairing.
    rope: Option<(u64, u64, RopeLayout)>,
    /// The pool rows' slots and the pool's rows, for a store into a pool.
    into: Option<(u64, usize)>,
    /// Values per head: the rope's and the pool rows' width.
    head_dim: usize,
}

/// The norm's weight (input `at`) and eps of a product with a norm.
fn norm_of<L: Launcher>(c: &Call<'_, L>, l: &LinearSpec, at: usize) -> Result<Option<(u64, f32)>> {
    l.norm.map(|n| c.input(at).map(|p| (p, n.eps))).transpose()
}

/// The positions (input 3), frequencies (input 4) and pairing of a product with a rope.
fn rope_of<L: Launcher>(c: &Call<'_, L>, l: &LinearSpec) -> Result<Option<(u64, u64, RopeLayout)>> {
    match l.rope {
        Some(r) => Ok(Some((c.input(3)?, c.input(4)?, r.layout))),
        None => Ok(None),
    }
}

/// Queues one op of this family.
pub(in crate::backend::cuda) fn launch<L: Launcher>(c: &Call<'_, L>, spec: &OpSpec) -> Result<()> {
    let rope_epilogue = |l: &LinearSpec| {
        if l.rope.is_some() {
            EPI_ROPE
        } else {
            EPI_STORE
        }
    };
    match spec {
        OpSpec::NormLinear(l) => {
            let extras = Extras {
                epilogue: rope_epilogue(l),
                w1: 0,
                norm: norm_of(c, l, 2)?,
                residual: 0,
                rope: rope_of(c, l)?,
                into: None,
                head_dim: l.rope.map_or(1, |r| r.head_dim),
            };
            product(c, l, extras)
        }
        OpSpec::NormLinearInto {
            l,
            head_dim,
            pool_rows,
            ..
        } => {
            if l.rope.is_some_and(|r| r.head_dim != *head_dim) {
                return Err(Error::backend(
                    BackendKind::Cuda,
                    "rms_norm_linear_into: a rope over heads of another width than the pool's \
                     rows is composed (runs_fused)",
                ));
            }
            // The slots follow the product's inputs.
            let slots = c.input(c.inputs.len().saturating_sub(1))?;
            let extras = Extras {
                epilogue: rope_epilogue(l),
                w1: 0,
                norm: norm_of(c, l, 2)?,
                residual: 0,
                rope: rope_of(c, l)?,
                into: Some((slots, *pool_rows)),
                head_dim: *head_dim,
            };
            product(c, l, extras)
        }
        OpSpec::SwigluLinear(l) => {
            let extras = Extras {
                epilogue: EPI_SWIGLU,
                w1: c.input(2)?,
                norm: norm_of(c, l, 3)?,
                residual: 0,
                rope: None,
                into: None,
                head_dim: 1,
            };
            product(c, l, extras)
        }
        OpSpec::LinearResidual(l) => {
            let extras = Extras {
                epilogue: EPI_RESIDUAL,
                w1: 0,
                norm: None,
                residual: c.input(2)?,
                rope: None,
                into: None,
                head_dim: 1,
            };
            product(c, l, extras)
        }
        OpSpec::PagedAttention(a) => attention(c, a),
        _ => Err(Error::backend(
            BackendKind::Cuda,
            format!("{} is not launched by launch/fused.rs", c.op),
        )),
    }
}

/// Queues a fused product: its activations prepared first by `fused_prepare` where they are
/// too many for a block to prepare itself, then `fused_linear_f32` or `fused_linear_i8`.
fn product<L: Launcher>(c: &Call<'_, L>, l: &LinearSpec, e: Extras) -> Result<()> {
    let (be, op) = (c.be, c.op);
    let mode = match l.activations {
        Activations::F32 => 0,
        Activations::Q8_0 => 2,
        Activations::I8 => 3,
        Activations::Q8_K => 4,
        Activations::F16 => {
            return Err(Error::invalid(op, "f16 activations are not a fused mode"));
        }
    };
    check_q8_k_rows(op, l.activations, l.k)?;
    let int = mode != 0;
    if int && !l.format.is_quantized() {
        return Err(Error::invalid(
            op,
            format!(
                "int8 activations need block-format weights, not {}",
                l.format
            ),
        ));
    }
    let fmt = match l.format {
        DType::F32 => FMT_F32,
        f => format_code(op, f)?,
    };
    let head_dim = e.head_dim.max(1);
    if (e.rope.is_some() && (!head_dim.is_multiple_of(2) || !l.n.is_multiple_of(head_dim)))
        || (e.into.is_some() && !l.n.is_multiple_of(head_dim))
    {
        return Err(Error::invalid(
            op,
            format!(
                "head_dim {head_dim} must divide n = {} (and be even for a rope)",
                l.n
            ),
        ));
    }
    if l.k == 0 {
        return Err(Error::invalid(
            op,
            "a product over k = 0 is composed (runs_fused)",
        ));
    }
    let (m, n, k) = (size(op, l.m)?, size(op, l.n)?, size(op, l.k)?);
    let x = c.input(0)?;
    let (norm_w, eps) = e.norm.unwrap_or((0, 0.0));
    let mut flags = 0;
    if e.norm.is_some() {
        flags |= NORM;
    }
    if e.into.is_some() {
        flags |= INTO;
    }
    if matches!(e.rope, Some((_, _, RopeLayout::Interleaved))) {
        flags |= INTERLEAVED;
    }
    // Where the activations come from: `x` itself (f32, not normed), prepared by each block
    // (few enough for its shared memory), or prepared once into a scratch buffer.
    let values = l.m * l.k;
    let scratch;
    let acts = if !int && e.norm.is_none() {
        flags |= PREPARED;
        x
    } else if values <= if int { INT_ACTS } else { F32_ACTS } {
        x
    } else {
        // f32 [m, k], or int8 [m, k] then one f32 scale per 32 values.
        scratch = if int {
            be.scratch(op, values + values / 32 * 4, DType::I8)?
        } else {
            be.scratch(op, values, DType::F32)?
        };
        let prepare = PrepareArgs {
            out: be.ptr(&scratch),
            x,
            norm_w,
            m,
            k,
            mode,
            norm: e.norm.is_some() as u32,
            eps,
        };
        be.run("fused_prepare", (m.max(1), 1, 1), &prepare.args())?;
        flags |= PREPARED;
        be.ptr(&scratch)
    };
    let (positions, inv_freq) = e.rope.map_or((0, 0), |(p, f, _)| (p, f));
    let (slots, pool_rows) = e.into.unwrap_or((0, 0));
    let args = LinearArgs {
        out: c.out_ptr(),
        x: acts,
        w0: c.input(1)?,
        w1: e.w1,
        norm_w,
        residual: e.residual,
        positions,
        inv_freq,
        slots,
        fmt,
        mode,
        m,
        n,
        k,
        epilogue: e.epilogue,
        flags,
        eps,
        head_dim: size(op, head_dim)?,
        pool_rows: size(op, pool_rows)?,
    };
    // One warp per output unit (a weight row, a rope pair, a gate/up column) and group of
    // ROWS activation rows.
    let units = if e.epilogue == EPI_ROPE { l.n / 2 } else { l.n };
    let warps = units * l.m.div_ceil(ROWS);
    let kernel = if int {
        "fused_linear_i8"
    } else {
        "fused_linear_f32"
    };
    be.run(
        kernel,
        (size(op, warps.div_ceil(WARPS as usize).max(1))?, 1, 1),
        &args.args(),
    )
}

/// Queues `paged_attention`: one block per (head, query).
fn attention<L: Launcher>(c: &Call<'_, L>, a: &AttentionSpec) -> Result<()> {
    let op = c.op;
    if a.head_dim > ATTENTION_MAX_HEAD_DIM || a.kv_heads == 0 || !a.heads.is_multiple_of(a.kv_heads)
    {
        return Err(Error::invalid(
            op,
            format!(
                "heads of {} values (at most {ATTENTION_MAX_HEAD_DIM}), {} heads over {} \
                 key/value heads",
                a.head_dim, a.heads, a.kv_heads
            ),
        ));
    }
    let args = AttentionArgs {
        out: c.out_ptr(),
        q: c.input(0)?,
        keys: c.input(1)?,
        values: c.input(2)?,
        rows: c.input(3)?,
        n: size(op, a.n)?,
        t: size(op, a.t)?,
        stride: size(op, a.stride)?,
        heads: size(op, a.heads)?,
        kv_heads: size(op, a.kv_heads)?,
        head_dim: size(op, a.head_dim)?,
        pool_rows: size(op, a.pool_rows)?,
        scale: a.scale,
        window: size(op, a.window.unwrap_or(0))?,
        softcap: a.softcap.unwrap_or(0.0),
    };
    let t = size(op, a.t)?;
    if t > 65_535 {
        return Err(Error::invalid(op, format!("{t} queries in one launch")));
    }
    c.be.run("paged_attention", (size(op, a.heads)?, t, 1), &args.args())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::sources::SOURCES;

    /// The limits the launch code relies on are the kernels'.
    #[test]
    fn limits_match_the_kernels() {
        let text = SOURCES.iter().map(|s| s.body).collect::<String>();
        for (name, value) in [
            ("WT_FUSED_ROWS", ROWS),
            ("WT_FUSED_F32_ACTS", F32_ACTS),
            ("WT_FUSED_INT_ACTS", INT_ACTS),
            ("WT_ATT_MAX_HEAD_DIM", ATTENTION_MAX_HEAD_DIM),
        ] {
            assert!(
                text.contains(&format!("#define {name} {value}u")),
                "{name} is not {value} in kernels/fused.cu"
            );
        }
        for (name, value) in [
            ("WT_EPI_STORE", EPI_STORE),
            ("WT_EPI_RESIDUAL", EPI_RESIDUAL),
            ("WT_EPI_SWIGLU", EPI_SWIGLU),
            ("WT_EPI_ROPE", EPI_ROPE),
            ("WT_FUSED_INTO", INTO),
            ("WT_FUSED_NORM", NORM),
            ("WT_FUSED_INTERLEAVED", INTERLEAVED),
            ("WT_FUSED_PREPARED", PREPARED),
            ("WT_FMT_F32", FMT_F32),
        ] {
            assert!(
                text.contains(&format!("#define {name} {value}u")),
                "{name} is not {value} in kernels/fused.cu"
            );
        }
    }
}
