//! `encode`: each `OpSpec` routed to its op family's module, which fills the kernel's
//! parameter block, chooses the kernel and the grid, and records the dispatch. The modules
//! mirror the shader files: `elementwise.rs`, `rows.rs` (norm, softmax, rope, argmax),
//! `movement.rs` (permute, concat), `sample.rs`, `quant.rs`, `scan.rs`, and the bench's read
//! probe (`probe.rs`); the matrix products and the embedding gather stay here, beside the
//! split of oversized bindings (`split.rs`).
//!
//! Grids: WebGPU caps each grid dimension at `max_compute_workgroups_per_dimension` (65535 by
//! default). One-dimensional work (elementwise, one workgroup per row) uses a two-dimensional
//! grid whose linear index the shader recomputes as `wid.y * num_workgroups.x + wid.x`, with
//! bounds checks for the overshoot. Matrix products split an oversized grid into several
//! dispatches that pass their tile offsets in the parameters.
//!
//! Loop budget: Mesa's llvmpipe/lavapipe (the software Vulkan device CI runs on) silently
//! ends every loop once one shader invocation has executed 65535 loop iterations in total.
//! The kernels keep per-invocation loops short (hand-unrolled inner steps, strided loops over
//! 64–256 threads), so on lavapipe rows of up to about 5M elements and matrix products with k
//! up to about 1M are exact; hardware drivers have no such limit. The CPU adapters' kernels
//! where one lane walks a whole row (`rms_norm_rows`, `paged_attention_lanes`) run only where
//! their loops fit [`LOOP_BUDGET`], and the workgroup kernels otherwise.

mod elementwise;
mod fused;
mod movement;
mod probe;
pub(crate) use probe::{probe_bytes, probe_invocations};
mod quant;
mod rows;
mod sample;
mod scan;
mod split;

pub(super) use fused::AttentionPlan;
pub(super) use quant::{folds_norm, int_activation_words, pairs_store};
pub(super) use sample::sample_temp_words;
pub(super) use scan::scan_temp_len;
pub(super) use split::split_operand;

use super::context::{GpuContext, MvShape};
use super::params::{EmbeddingParams, KernelParams, MatmulParams, MatvecParams};
use super::pipelines::{Pipelines, Shader};
use super::recorder::{Dispatch, Recorder, Window};
use super::texels::WeightTexels;
use crate::backend::BackendKind;
use crate::backend::{MatmulSpec, OpSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The loop iterations one invocation may run in total before lavapipe ends its loops (see
/// "Loop budget" above).
const LOOP_BUDGET: usize = 65_535;

/// Threads per workgroup of the one-dimensional kernels.
const WG: u64 = 256;

/// Largest m handled by the matvec kernels (their accumulators hold this many rows).
pub(super) const MATVEC_MAX_M: usize = 4;

/// Rows up to this length use the one-thread-per-row softmax.
const SOFTMAX_SHORT_COLS: usize = 256;

/// Rows up to this length use the one-thread-per-row argmax.
const ARGMAX_SHORT_COLS: usize = 32;

/// A buffer handed to a kernel: the wgpu buffer and what it holds.
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a> {
    pub(crate) buffer: &'a wgpu::Buffer,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
    /// The texel copy of Q4_0 weights on a CPU adapter (`texels.rs`).
    pub(crate) texels: Option<&'a WeightTexels>,
    /// For a view of part of a buffer (a tensor uploaded in a group): the range of `buffer` a
    /// kernel binds, (offset, size).
    pub(crate) view: Option<(u64, u64)>,
}

impl<'a> Operand<'a> {
    /// A tensor's buffer as an operand.
    pub(crate) fn of(b: &'a super::GpuBuffer) -> Self {
        Operand {
            buffer: b.raw(),
            len: b.len(),
            dtype: b.dtype(),
            texels: b.texels(),
            view: b.is_view().then(|| (b.offset(), b.bound_bytes())),
        }
    }

    /// This view and `other`, a view of the same buffer that starts after this one's start
    /// (two tensors uploaded together), as one operand bound from this one's first byte to
    /// `other`'s last, and the byte where `other` starts in it; `None` for any other pair.
    pub(crate) fn spanning(&self, other: &Operand<'a>) -> Option<(Operand<'a>, u32)> {
        let ((at, _), (other_at, other_size)) = (self.view?, other.view?);
        if self.buffer != other.buffer || other_at <= at {
            return None;
        }
        let from = u32::try_from(other_at - at).ok()?;
        let both = Operand {
            len: self.len + other.len,
            texels: None,
            view: Some((at, other_at + other_size - at)),
            ..*self
        };
        Some((both, from))
    }

    /// The binding range of a view, `None` for a whole buffer.
    pub(crate) fn window(&self) -> Option<Window> {
        self.view.map(|(offset, size)| Window {
            buffer: self.buffer.clone(),
            offset,
            size,
        })
    }
}

/// Everything an encode function needs; the recorder is already locked.
pub(crate) struct Encoder<'a> {
    pub(crate) ctx: &'a GpuContext,
    pub(crate) pipelines: &'a Pipelines,
    pub(crate) recorder: &'a mut Recorder,
    /// Buffer ranges bound in place of whole buffers while a split op records its parts
    /// (`split`); empty otherwise.
    pub(crate) windows: Vec<Window>,
    /// Whether the op's int8-activation buffer already holds its normed rows' rounding
    /// (`shared_rounding.rs`): a normed product then skips its rounding dispatch.
    pub(crate) table_filled: bool,
    /// For a paired pool store ([`OpSpec::NormLinearInto`] with two targets), the element of
    /// the output range where the value pool starts (the key pool starts at 0); `None`
    /// otherwise.
    pub(crate) values_at: Option<u32>,
}

/// `v` as u32, or an error naming the op: every size a kernel sees must fit 32 bits.
fn u32_of(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::backend(
            BackendKind::Wgpu,
            format!("{op}: {what} = {v} does not fit the kernels' 32-bit indices"),
        )
    })
}

impl Encoder<'_> {
    fn max_groups(&self) -> u32 {
        self.ctx.limits.max_compute_workgroups_per_dimension.max(1)
    }

    /// A grid of at least `groups` workgroups: one row of them, or a 2-D grid when more than
    /// the per-dimension limit.
    fn grid(&self, op: &'static str, groups: u64) -> Result<[u32; 3]> {
        let max = u64::from(self.max_groups());
        let groups = groups.max(1);
        if groups <= max {
            return Ok([groups as u32, 1, 1]);
        }
        let y = groups.div_ceil(max);
        if y > max {
            return Err(Error::backend(
                BackendKind::Wgpu,
                format!("{op}: {groups} workgroups exceed a 2-D grid"),
            ));
        }
        Ok([groups.div_ceil(y) as u32, y as u32, 1])
    }

    fn run(
        &mut self,
        shader: Shader,
        entry: &'static str,
        params: &impl KernelParams,
        out: &wgpu::Buffer,
        inputs: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> Result<()> {
        self.run_format(shader, (entry, 0), params, out, inputs, groups)
    }

    /// [`Self::run`] for a kernel specialised by the pipeline constant `MV_FORMAT` (the
    /// entry's second part; 0 leaves the constant at its default).
    fn run_format<P: KernelParams>(
        &mut self,
        shader: Shader,
        entry: (&'static str, u32),
        params: &P,
        out: &wgpu::Buffer,
        inputs: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> Result<()> {
        self.run_bound(shader, entry, params, out, (inputs, None), groups)
    }

    /// [`Self::run_format`] for a kernel that may also bind a texture after its inputs.
    fn run_bound<P: KernelParams>(
        &mut self,
        shader: Shader,
        entry: (&'static str, u32),
        params: &P,
        out: &wgpu::Buffer,
        bound: (&[&wgpu::Buffer], Option<&wgpu::TextureView>),
        groups: [u32; 3],
    ) -> Result<()> {
        self.run_keyed(shader, entry, (params, None), out, bound, groups)
    }

    /// [`Self::run_bound`] for a kernel whose parameter block holds, at byte `keys_at`, the
    /// key count a replay of a captured step sets (attention's).
    fn run_keyed<P: KernelParams>(
        &mut self,
        shader: Shader,
        (entry, format): (&'static str, u32),
        (params, keys_at): (&P, Option<u32>),
        out: &wgpu::Buffer,
        (inputs, texture): (&[&wgpu::Buffer], Option<&wgpu::TextureView>),
        groups: [u32; 3],
    ) -> Result<()> {
        debug_assert!(
            P::SHADERS.contains(&shader),
            "{shader:?} given another shader's Params"
        );
        let binds = (inputs.len(), texture.is_some());
        let kernel = self
            .pipelines
            .kernel(self.ctx, shader, entry, binds, format)?;
        let bytes = bytemuck::bytes_of(params);
        self.recorder.dispatch(
            self.ctx,
            Dispatch {
                kernel: &kernel,
                params: bytes,
                output: out,
                inputs,
                groups,
                windows: &self.windows,
                texture,
                keys_at,
            },
        );
        Ok(())
    }

    /// Runs `record` with `window` bound in place of any other range of its buffer (the view
    /// one dispatch of an op reads, where the op reads two views of one buffer).
    pub(super) fn bound_as<T>(
        &mut self,
        window: Option<Window>,
        record: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let Some(window) = window else {
            return record(self);
        };
        // Windows are looked up first to last.
        self.windows.insert(0, window);
        let done = record(self);
        self.windows.remove(0);
        done
    }

    /// Records `spec` reading `inputs` and writing `out`.
    pub(crate) fn encode(
        &mut self,
        spec: &OpSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        let op = spec.kind().name();
        if let Some(split) = split::split_operand(spec) {
            if self.bound_size(inputs[split.0].buffer) > self.ctx.max_binding().0 {
                return self.split_rows(spec, out, inputs, split);
            }
        }
        let raw: Vec<&wgpu::Buffer> = inputs.iter().map(|o| o.buffer).collect();
        match spec {
            OpSpec::Unary { .. } | OpSpec::Binary { .. } => self.elementwise(spec, out, &raw),
            OpSpec::RmsNorm { .. }
            | OpSpec::LayerNorm { .. }
            | OpSpec::Softmax { .. }
            | OpSpec::Rope { .. }
            | OpSpec::Argmax { .. } => self.rows(spec, out, &raw),
            OpSpec::Matmul(m) => self.matmul(m, out, inputs),
            OpSpec::Embedding {
                vocab, dim, count, ..
            } => self.embedding(op, (*vocab, *dim, *count), (0, *vocab), out, inputs),
            OpSpec::Permute { .. }
            | OpSpec::Concat { .. }
            | OpSpec::Narrow { .. }
            | OpSpec::ScatterRows { .. } => self.movement(spec, out, &raw),
            OpSpec::Quantize { .. }
            | OpSpec::Dequantize { .. }
            | OpSpec::QMatmul { .. }
            | OpSpec::TernaryDot { .. } => self.quant(spec, out, inputs),
            OpSpec::Scan { .. } | OpSpec::ScanGradA { .. } | OpSpec::ScanGradInit { .. } => {
                self.scan(spec, out, inputs)
            }
            OpSpec::Sample { .. } => self.sample(spec, out, &raw),
            OpSpec::NormLinear(l) => self.norm_linear(l, out, inputs),
            OpSpec::NormLinearInto {
                l,
                head_dim,
                pool_rows,
                ..
            } => self.norm_linear_into((l, *head_dim, *pool_rows), out, inputs),
            OpSpec::LinearResidual(l) => self.linear_residual(l, out, inputs),
            OpSpec::SwigluLinear(l) => self.swiglu_linear(l, out, inputs),
            OpSpec::PagedAttention(s) => self.paged_attention(s, out, inputs),
        }
    }

    /// The embedding gather of `count` ids from a `[vocab, dim]` table whose rows
    /// `first..first + rows` are bound (all of them unless the table is split).
    fn embedding(
        &mut self,
        op: &'static str,
        (vocab, dim, count): (usize, usize, usize),
        (first, rows): (usize, usize),
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        let p = EmbeddingParams {
            vocab: u32_of(op, "vocab", vocab)?,
            dim: u32_of(op, "dim", dim)?,
            count: u32_of(op, "count", count)?,
            first: u32_of(op, "first", first)?,
            rows: u32_of(op, "rows", rows)?,
            ..Default::default()
        };
        let total = (dim as u64) * (count as u64);
        u32_of(op, "count·dim", total as usize)?;
        let grid = self.grid(op, total.div_ceil(WG))?;
        let raw = [inputs[0].buffer, inputs[1].buffer];
        self.run(Shader::Embedding, "embedding", &p, out, &raw, grid)
    }

    /// Matrix products: the matvec kernels for m ≤ 4 (and `mv` for any m on CPU adapters), the
    /// tiled kernel otherwise.
    fn matmul(&mut self, m: &MatmulSpec, out: &wgpu::Buffer, inputs: &[Operand<'_>]) -> Result<()> {
        let op = "matmul";
        let (a, rhs) = (inputs[0], inputs[1]);
        let rhs_stride = if m.rhs_batched { m.n * m.k } else { 0 };
        let (mm, n, k) = (
            u32_of(op, "m", m.m)?,
            u32_of(op, "n", m.n)?,
            u32_of(op, "k", m.k)?,
        );
        u32_of(op, "batch", m.batch)?;
        u32_of(op, "rhs size", rhs_stride.max(m.n * m.k))?;
        let max = self.max_groups();
        // The matvec kernels read the operands as vec4 arrays: the buffers must be whole vec4s.
        let vec4_bindable = self.bound_size(a.buffer).is_multiple_of(16)
            && self.bound_size(rhs.buffer).is_multiple_of(16);
        let shape = self.ctx.mv_shape();
        let mv_fits = m.rhs_transposed && m.k.is_multiple_of(4) && m.k <= shape.max_k();
        // On CPU adapters the tiled kernel's workgroup-memory staging and barriers cost more
        // than reading `rhs` once per four rows of `a`: `mv` takes products of any m there.
        let chunked = shape == MvShape::Lanes && mv_fits && vec4_bindable;
        if (m.m <= MATVEC_MAX_M && vec4_bindable) || chunked {
            let (entry, cols_per_group) = match (mv_fits, m.rhs_transposed, m.n.is_multiple_of(4)) {
                (true, _, _) => ("mv", shape.rows_per_workgroup()),
                (false, true, _) => ("matvec_t_scalar", 4),
                (false, false, true) => ("matvec_kn_vec4", 256),
                (false, false, false) => ("matvec_kn", 64),
            };
            // Grid y: every batch's chunks of four rows of `a` (one chunk below five rows).
            let chunks = if mv_fits {
                m.m.div_ceil(MATVEC_MAX_M).max(1)
            } else {
                1
            };
            let slots = m.batch * chunks;
            u32_of(op, "batch · row chunks", slots)?;
            let col_groups = m.n.div_ceil(cols_per_group);
            for b0 in (0..slots).step_by(max as usize) {
                for g0 in (0..col_groups).step_by(max as usize) {
                    let p = MatvecParams {
                        m: mm,
                        n,
                        k,
                        rhs_stride: rhs_stride as u32,
                        col_group0: g0 as u32,
                        batch0: b0 as u32,
                        chunks: chunks as u32,
                        ..Default::default()
                    };
                    let groups = [
                        (col_groups - g0).min(max as usize) as u32,
                        (slots - b0).min(max as usize) as u32,
                        1,
                    ];
                    self.run(
                        Shader::Matvec,
                        entry,
                        &p,
                        out,
                        &[a.buffer, rhs.buffer],
                        groups,
                    )?;
                }
            }
            return Ok(());
        }
        let tiles_x = m.n.div_ceil(64);
        let tiles_y = m.m.div_ceil(64);
        let step = max as usize;
        for b0 in (0..m.batch).step_by(step) {
            for y0 in (0..tiles_y).step_by(step) {
                for x0 in (0..tiles_x).step_by(step) {
                    let p = MatmulParams {
                        m: mm,
                        n,
                        k,
                        rhs_transposed: m.rhs_transposed as u32,
                        rhs_stride: rhs_stride as u32,
                        tile_x0: x0 as u32,
                        tile_y0: y0 as u32,
                        batch0: b0 as u32,
                    };
                    let groups = [
                        (tiles_x - x0).min(step) as u32,
                        (tiles_y - y0).min(step) as u32,
                        (m.batch - b0).min(step) as u32,
                    ];
                    self.run(
                        Shader::Matmul,
                        "matmul",
                        &p,
                        out,
                        &[a.buffer, rhs.buffer],
                        groups,
                    )?;
                }
            }
        }
        Ok(())
    }
}
