//! Encoding the fused decode ops.
//! - [`OpSpec::NormLinear`]: the activation rows are normed where they are rounded to int8
//!   (the only case the backend fuses, [`super::quant::folds_norm`]): on GPUs by the `mv`
//!   kernel, on CPU adapters by the `quantize_acts_normed` dispatch before it. With a rope
//!   (interleaved pairs only) the `mv` kernel rotates the rows it stores: one dispatch (two on
//!   CPU adapters) where `rms_norm`, the rounding, the product and `rope` took three (four).
//!   With a norm, [`OpSpec::SwigluLinear`]'s two products norm the same way (on CPU adapters
//!   the up product reads what the gate product rounded), and [`OpSpec::NormLinearInto`]
//!   stores into the KV pool where `scatter_rows` took another dispatch; paired, on GPUs,
//!   one `mv` dispatch over a layer's k and v weights stores into both its pools.
//! - [`OpSpec::LinearResidual`]: the product with packed weights adds the residual as the
//!   `mv` kernel's epilogue, so a decode projection and its residual connection are one
//!   dispatch.
//! - [`OpSpec::SwigluLinear`]: on GPUs, where a layer's gate and up weights share one buffer
//!   (`Backend::upload_group`), one `mv` dispatch whose teams take two gate rows and the same
//!   two up rows and store SiLU(gate) · up ([`pairs_swiglu`]); otherwise the gate product into
//!   a temporary buffer, then the up product whose `mv` epilogue multiplies it by SiLU of the
//!   gate: one or two dispatches where the unfused ops took three.
//! - [`OpSpec::PagedAttention`]: `attention.wgsl`, reading the pool rows in place: on GPUs a
//!   workgroup per (query, head), on CPU adapters a lane per (query, up to four heads of a
//!   key/value group); past a few hundred keys (GPUs) or 64 (CPU adapters) each query's keys
//!   are split into chunks that run side by side, merged by a second dispatch
//!   ([`AttentionPlan`]).
//!
//! Off the `mv` kernel (f32 weights, long rows) the products of the first two are followed by
//! the `epilogue` kernel.

use super::quant::{
    folds_norm, pairs_swiglu, ActTable, Epilogue, Folds, Norm, PairedStore, PoolStore, Product,
};
use super::{u32_of, Encoder, Operand, Shader, LOOP_BUDGET};
use crate::backend::webgpu::context::MvShape;
use crate::backend::webgpu::params::AttentionParams;
use crate::backend::BackendKind;
use crate::backend::{AttentionSpec, LinearSpec, OpSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Output dimensions of one head per lane of `paged_attention_lanes` (`LANE_DIMS`).
const ATTENTION_LANE_DIMS: usize = 64;

/// Lanes per workgroup of `paged_attention_lanes` (`LANES_WG`).
const ATTENTION_LANES_WG: u64 = 8;

/// The most heads of one key/value group a `paged_attention_lanes` lane takes.
const ATTENTION_LANE_HEADS: usize = 4;

/// Invocations per workgroup of `attention_combine` (`WG`).
const ATTENTION_COMBINE_WG: u64 = 64;

/// The keys per chunk a split aims at on CPU adapters, and the most chunks: a SmolLM-135M
/// decode step (3 key/value heads of 3 query heads each) after a 432-token prompt runs as 42
/// lanes of 32 keys.
const LANES_CHUNK_KEYS: usize = 32;
const LANES_MAX_CHUNKS: usize = 32;

/// The same for the GPU shape, whose workgroups take 64 keys at a time: a split starts past
/// 256 keys, where a (query, head) per workgroup leaves most of a GPU idle.
const GPU_CHUNK_KEYS: usize = 256;
const GPU_MAX_CHUNKS: usize = 32;

/// How a paged attention runs on wgpu: which kernel, and into how many runs of keys each
/// query's are split (flash decoding; 1: no split, the kernel writes the output). Chosen from
/// the row table's columns (`stride`) and the window, never from `n`: a replay of a captured
/// decode step sets a larger `n` in the same dispatches (`recorder.rs`), and the kernels size
/// each chunk from `n` as they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttentionPlan {
    /// With `paged_attention_lanes` (CPU adapters), the heads of a group each lane takes
    /// (its `LANE_HEADS`); `None`: `paged_attention`, a workgroup per (query, head, chunk).
    lane_heads: Option<usize>,
    /// Runs of keys per query; past 1 `attention_combine` merges them.
    chunks: usize,
}

impl AttentionPlan {
    /// The plan for `s` on a device of `shape`.
    pub(crate) fn of(s: &AttentionSpec, shape: MvShape) -> AttentionPlan {
        // The most keys one query sees: the table's columns, or its window.
        let keys = s.window.map_or(s.stride, |w| w.min(s.stride)).max(1);
        let chunks = (keys / LANES_CHUNK_KEYS).clamp(1, LANES_MAX_CHUNKS);
        if shape == MvShape::Lanes && attention_lanes_fit(s, keys.div_ceil(chunks)) {
            // A group's heads in as few lanes as take at most four each, then as few heads a
            // lane as that needs (7 as 4 + 3, 6 as 3 + 3).
            let group = (s.heads / s.kv_heads.max(1)).max(1);
            let lanes = group.div_ceil(ATTENTION_LANE_HEADS);
            return AttentionPlan {
                lane_heads: Some(group.div_ceil(lanes)),
                chunks,
            };
        }
        AttentionPlan {
            lane_heads: None,
            chunks: (keys / GPU_CHUNK_KEYS).clamp(1, GPU_MAX_CHUNKS),
        }
    }

    /// The f32 length of the partials buffer a split writes and the combine reads
    /// (`[t · heads, chunks, head_dim + 2]`), or `None` without a split.
    pub(crate) fn partials_len(&self, s: &AttentionSpec) -> Option<usize> {
        (self.chunks > 1).then(|| s.t * s.heads * self.chunks * (s.head_dim + 2))
    }
}

/// Whether a `paged_attention_lanes` lane's loops fit the loop budget with `keys` keys per
/// chunk: for each key one step, and with a head wider than a lane's slice the score's
/// dimensions outside the slice one at a time; the stores at the end.
fn attention_lanes_fit(s: &AttentionSpec, keys: usize) -> bool {
    let outside = if s.head_dim > ATTENTION_LANE_DIMS {
        s.head_dim
    } else {
        0
    };
    keys.saturating_mul(1 + outside).saturating_add(512) < LOOP_BUDGET
}

/// How many inputs a normed op's spec has before its slots and extra buffers: `a`, `w`, the
/// norm's weight, and with a rope the positions and the frequencies.
fn normed_inputs(l: &LinearSpec) -> usize {
    3 + 2 * usize::from(l.rope.is_some())
}

/// The gate and up weights of `l` as one operand, bound from the gate's first byte to the up
/// weights' last, and the byte where the up rows start in it: where both are views of one
/// buffer, uploaded together (`Backend::upload_group`), and the product pairs
/// ([`pairs_swiglu`]).
fn paired<'a>(
    l: &LinearSpec,
    gate: Operand<'a>,
    up: Operand<'a>,
    shape: MvShape,
) -> Option<(Operand<'a>, u32)> {
    let product = Product {
        format: l.format,
        activations: l.activations,
        m: l.m,
        n: 2 * l.n,
        k: l.k,
    };
    gate.spanning(&up).filter(|_| pairs_swiglu(product, shape))
}

impl Encoder<'_> {
    /// Records `out = residual + act(a) · wᵀ`; `inputs` are `a`, `w`, `residual` and, when
    /// the backend allocated it, the int8-activation buffer.
    pub(super) fn linear_residual(
        &mut self,
        l: &LinearSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        let residual = Epilogue::Residual(inputs[2].buffer);
        let temp = inputs.get(3).map(ActTable::empty);
        self.linear(l, out, inputs, (temp, None), residual, None)
    }

    /// Records `out = act(rms_norm(a)) · wᵀ`, rotated with a rope; `inputs` are `a`, `w`, the
    /// norm's weight, with a rope the positions and the frequencies, and, when the backend
    /// allocated it, the int8-activation buffer.
    pub(super) fn norm_linear(
        &mut self,
        l: &LinearSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        self.normed(l, out, inputs, inputs.get(normed_inputs(l)), None)
    }

    /// Records [`OpSpec::NormLinearInto`] into the pool `target`: `inputs` are
    /// [`Encoder::norm_linear`]'s before its int8-activation buffer, then the slots, then a
    /// paired store's value weights, then that buffer when the backend allocated it. A
    /// paired store ([`Encoder::values_at`]: `target` is both pools, bound as one range) is
    /// one product over the key and value weights bound together, its n counting both, the
    /// rope applied to the key rows only (`out_at` and `mv_store` in `shaders/quant/`).
    pub(super) fn norm_linear_into(
        &mut self,
        (l, head_dim, pool_rows): (&LinearSpec, usize, usize),
        target: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        let slots = normed_inputs(l);
        let store = PoolStore {
            slots: inputs[slots].buffer,
            head_dim,
            pool_rows,
            values: None,
        };
        let Some(pool_at) = self.values_at else {
            return self.normed(l, target, inputs, inputs.get(slots + 1), Some(store));
        };
        let (k, v) = (inputs[1], inputs[slots + 1]);
        let Some((both, weights_at)) = k.spanning(&v) else {
            return Err(Error::backend(
                BackendKind::Wgpu,
                "a paired pool store needs its two weights bound as one range",
            ));
        };
        let store = PoolStore {
            values: Some(PairedStore {
                weights_at,
                pool_at,
            }),
            ..store
        };
        let mut operands = inputs.to_vec();
        operands[1] = both;
        let l = LinearSpec { n: 2 * l.n, ..*l };
        self.bound_as(both.window(), |e| {
            e.normed(&l, target, &operands, inputs.get(slots + 2), Some(store))
        })
    }

    /// The product of a normed op: `inputs` `a`, `w`, the norm's weight, then with a rope its
    /// positions and frequencies, which the rotary epilogue reads; `temp` the int8-activation
    /// buffer.
    fn normed(
        &mut self,
        l: &LinearSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
        temp: Option<&Operand<'_>>,
        store: Option<PoolStore<'_>>,
    ) -> Result<()> {
        let temp = temp.map(|t| ActTable {
            buffer: t.buffer,
            filled: self.table_filled,
        });
        let epilogue = match l.rope {
            Some(r) => Epilogue::Rotary {
                positions: inputs[3].buffer,
                inv_freq: inputs[4].buffer,
                head_dim: r.head_dim,
            },
            None => Epilogue::None,
        };
        self.linear(l, out, inputs, (temp, Some(inputs[2])), epilogue, store)
    }

    /// Records `out = silu(act(a) · gateᵀ) ⊙ (act(a) · upᵀ)`; `inputs` are `a`, `gate`, `up`,
    /// with a norm its weight, then the backend's f32 `[m, n]` buffer for the gate product and,
    /// when the backend allocated it, the int8-activation buffer.
    pub(super) fn swiglu_linear(
        &mut self,
        l: &LinearSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        let (a, gate, up) = (inputs[0], inputs[1], inputs[2]);
        let (norm, extras) = match l.norm {
            Some(_) => (Some(inputs[3]), &inputs[4..]),
            None => (None, &inputs[3..]),
        };
        let (gate_out, temp) = (extras[0], extras.get(1));
        if let Some((both, up_at)) = paired(l, gate, up, self.ctx.mv_shape()) {
            // One dispatch over the gate and up rows bound together.
            let l = LinearSpec { n: 2 * l.n, ..*l };
            let window = both.window();
            let tables = (temp.map(ActTable::empty), norm);
            let paired = Epilogue::Paired { up_at };
            return self.bound_as(window, |e| {
                e.linear(&l, out, &[a, both], tables, paired, None)
            });
        }
        self.bound_as(gate.window(), |e| {
            let tables = (temp.map(ActTable::empty), norm);
            e.linear(l, gate_out.buffer, &[a, gate], tables, Epilogue::None, None)
        })?;
        // The up product reads the activations the gate product rounded.
        let rounded = temp.map(|t| ActTable {
            buffer: t.buffer,
            filled: true,
        });
        let silu_gate = Epilogue::SiluGate(gate_out.buffer);
        self.bound_as(up.window(), |e| {
            e.linear(l, out, &[a, up], (rounded, norm), silu_gate, None)
        })
    }

    /// `out = act(a) · wᵀ` then `epilogue`, for `inputs` `a` and `w` of `l`'s format; `temp`
    /// the int8-activation buffer, `norm` the norm's weight when `l` has a norm, `store` the
    /// pool `out` is when the product goes there.
    fn linear(
        &mut self,
        l: &LinearSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
        (temp, norm): (Option<ActTable<'_>>, Option<Operand<'_>>),
        epilogue: Epilogue<'_>,
        store: Option<PoolStore<'_>>,
    ) -> Result<()> {
        let folded = l.norm.is_some() || l.rope.is_some() || store.is_some();
        if folded && !folds_norm(l.format, l.activations, (l.m, l.k), self.ctx.mv_shape()) {
            return Err(Error::backend(
                BackendKind::Wgpu,
                "an RMS norm, a rotary epilogue or a pool store folds only into the decode \
                 kernel's int8 rounding",
            ));
        }
        if l.format == DType::F32 {
            let spec = OpSpec::Matmul(l.f32_product());
            self.encode(&spec, out, &inputs[..2])?;
            return self.epilogue(l.m, l.n, out, epilogue);
        }
        let product = Product {
            format: l.format,
            activations: l.activations,
            m: l.m,
            n: l.n,
            k: l.k,
        };
        let operands = [inputs[0], inputs[1]];
        let norm = match (l.norm, norm) {
            (Some(n), Some(weight)) => Some(Norm {
                eps: n.eps,
                weight: weight.buffer,
            }),
            _ => None,
        };
        let folds = Folds { norm, store };
        self.qmatmul(product, out, operands, (temp, folds), epilogue)
    }

    /// Records attention over the pool for `inputs` `q`, `keys`, `values`, `rows` and, when
    /// its plan splits the keys, the backend's partials buffer
    /// ([`AttentionPlan::partials_len`]): the split kernel writes that, then
    /// `attention_combine` reads it and writes `out`.
    pub(super) fn paged_attention(
        &mut self,
        s: &AttentionSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        const OP: &str = "paged_attention";
        u32_of(OP, "q values", s.t * s.heads * s.head_dim)?;
        u32_of(OP, "pool values", s.pool_rows * s.head_dim)?;
        u32_of(OP, "rows", s.kv_heads * s.stride)?;
        let plan = AttentionPlan::of(s, self.ctx.mv_shape());
        if let Some(len) = plan.partials_len(s) {
            u32_of(OP, "partials", len)?;
        }
        let p = AttentionParams {
            t: u32_of(OP, "t", s.t)?,
            n: u32_of(OP, "n", s.n)?,
            heads: u32_of(OP, "heads", s.heads)?,
            kv_heads: u32_of(OP, "kv_heads", s.kv_heads)?,
            head_dim: u32_of(OP, "head_dim", s.head_dim)?,
            pool_rows: u32_of(OP, "pool_rows", s.pool_rows)?,
            scale: s.scale,
            // A window of as many keys as the table holds hides nothing (not `n`: a replay
            // sets more keys, `recorder.rs`).
            window: s.window.map_or(0, |w| w.min(s.stride) as u32),
            stride: u32_of(OP, "stride", s.stride)?,
            chunks: plan.chunks as u32,
            keys_from: 0,
            values_from: 0,
            softcap: s.softcap.unwrap_or(0.0),
            ..Default::default()
        };
        // Keys and values in one buffer (a layer's pools, allocated together) are bound as
        // one range to both bindings, each read from its place in it.
        let (keys, values) = (inputs[1], inputs[2]);
        let unit = DType::F32.unit_bytes() as u32;
        let (window, p) = match (keys.spanning(&values), values.spanning(&keys)) {
            (Some((both, at)), _) => (
                both.window(),
                AttentionParams {
                    values_from: at / unit,
                    ..p
                },
            ),
            (_, Some((both, at))) => (
                both.window(),
                AttentionParams {
                    keys_from: at / unit,
                    ..p
                },
            ),
            _ => (None, p),
        };
        self.bound_as(window, |e| e.attend(s, (&p, plan), out, inputs))
    }

    /// Records [`Encoder::paged_attention`]'s dispatches with the parameters `p`.
    fn attend(
        &mut self,
        s: &AttentionSpec,
        (p, plan): (&AttentionParams, AttentionPlan),
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        const OP: &str = "paged_attention";
        let raw: Vec<&wgpu::Buffer> = inputs[..4].iter().map(|o| o.buffer).collect();
        let (entry, grid) = match plan.lane_heads {
            Some(heads) => {
                let blocks = (s.heads / s.kv_heads).div_ceil(heads);
                let slices = s.head_dim.div_ceil(ATTENTION_LANE_DIMS);
                let lanes = (s.t * s.kv_heads * blocks * plan.chunks * slices) as u64;
                let grid = self.grid(OP, lanes.div_ceil(ATTENTION_LANES_WG))?;
                (("paged_attention_lanes", heads as u32), grid)
            }
            None => {
                let parts = (s.t * s.heads * plan.chunks) as u64;
                (("paged_attention", 0), self.grid(OP, parts)?)
            }
        };
        // A replay of a captured decode step sets the key count in both dispatches'
        // parameters (`capture.rs`; the two share one block).
        let keys_at = Some(std::mem::offset_of!(AttentionParams, n) as u32);
        let Some(partials) = plan.partials_len(s).map(|_| inputs[4].buffer) else {
            return self.run_keyed(
                Shader::Attention,
                entry,
                (p, keys_at),
                out,
                (&raw, None),
                grid,
            );
        };
        self.run_keyed(
            Shader::Attention,
            entry,
            (p, keys_at),
            partials,
            (&raw, None),
            grid,
        )?;
        let quads = (s.t * s.heads * s.head_dim.div_ceil(4)) as u64;
        let grid = self.grid(OP, quads.div_ceil(ATTENTION_COMBINE_WG))?;
        self.run_keyed(
            Shader::Attention,
            ("attention_combine", 0),
            (p, keys_at),
            out,
            (&[partials], None),
            grid,
        )
    }
}
