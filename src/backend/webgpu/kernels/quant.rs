//! Encoding the quantized ops (`shaders/quant/`, `shaders/quant_f16.wgsl`).
//!
//! Products with f32 or int8 activations (k a multiple of 32, within the shape's `max_k`), for
//! decode and prefill alike, run the row-dot kernel `mv` compiled once per format and
//! activation kind, over chunks of four activation rows; on GPUs prefill (more than four
//! rows) runs the tiled `mm_tiled` instead, which decodes each weight group once per 64 rows
//! ([`takes_tiled`]); the others (f16 activations, f16 weights with `shader-f16`, odd k) run
//! one workgroup per (weight row, 8 activation rows).
//!
//! With `Q8_0` or `I8` activations and few rows (decode: m ≤ [`MATVEC_MAX_M`], m · k ≤
//! [`MVQ_MAX_VALUES`]) on GPUs the `mv` kernel rounds the activations itself, in workgroup
//! memory, so the product is one dispatch ([`quantizes_in_kernel`] says why not on CPU
//! adapters). Otherwise the op records two: `quantize_acts_blocks` (Q8_0, one invocation per
//! 32 values) or `quantize_acts_rows` (a scale per row) rounds the activations into a
//! temporary buffer (int8 words, then one f32 scale per 32 values) that the backend passed as
//! a third operand, and `mm_tiled`, `mv` or `qmatmul_int` reads it. A normed product on a CPU
//! adapter rounds with `quantize_acts_normed`, which RMS-norms the rows first
//! ([`folds_norm`]); `swiglu_linear`'s up product reads what its gate product rounded
//! ([`ActTable`]).
//!
//! llama.cpp's other formats (the super-blocks Q2_K … Q6_K and IQ4_XS, the legacy Q4_1, Q5_0,
//! Q5_1 and IQ4_NL) take the `mv` and `mm_tiled` kernels only, which decode their blocks a
//! group of 32 values at a time (`shaders/kquants/decode.wgsl`): with f32 activations, the
//! super-blocks also with `Q8_K` ones, which `quantize_acts_super` rounds first into the
//! int8-activation buffer (each super-block's scale stored once per group of 32, so the kernels
//! read it as they read `Q8_0`'s), and the legacy formats also with `Q8_0` ones, rounded as for
//! Q4_0 (in the `mv` kernel or by `quantize_acts_blocks`, normed where a norm folds), each
//! decoded group multiplied by the int8 values; a product they cannot take (other activations,
//! rows longer than the lanes shape's `max_k`) is an error.
//!
//! On CPU adapters a Q4_0 tensor also has a copy as texels (`texels.rs`), which the int8
//! products fetch instead of loading words: `mv_pairs_texels` for decode's one row,
//! `mv_texels` for prefill's chunks of rows.

use super::{u32_of, Encoder, Operand, Shader, MATVEC_MAX_M};
use crate::backend::kernel_consts::{
    self, INT_ACTIVATIONS, NORM_ACTIVATIONS, QUANTIZE_ACTIVATIONS,
};
use crate::backend::webgpu::context::MvShape;
use crate::backend::webgpu::params::QuantParams;
use crate::backend::webgpu::texels::WeightTexels;
use crate::backend::BackendKind;
use crate::backend::{Activations, LinearSpec, OpSpec, RopeLayout};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Threads per workgroup of the quant kernels.
const WG: u64 = 64;

/// Activation rows per workgroup of the product kernels.
const ROWS: usize = 8;

/// Weight rows per workgroup of the texel products `mv_pairs_texels` and `mv_texels`
/// (`TEXEL_ROWS` in `shaders/quant/`).
const TEXEL_ROWS: usize = 128;

/// The most int8 activation values (m · k) the `mv` kernel rounds in workgroup memory
/// (`MVQ_MAX_VALUES` of `shaders/quant/`): k up to 8192 for decode's one row.
const MVQ_MAX_VALUES: usize = 8192;

/// Whether an int8-activation product of `m × k` activations rounds them inside the `mv`
/// kernel (one dispatch, no temporary buffer): decode, on GPUs (the row-team shapes), with
/// `Q8_0` or per-row `I8` activations. `Q8_K` activations (a scale per 256 values) always round
/// in their own dispatch, `quantize_acts_super`: the kernel's rounding (`mv_prepare`) knows
/// scales per 32 values and per row only.
///
/// Not on CPU adapters (the lanes shape). There each workgroup repeats the rounding, and in
/// Chromium on SwiftShader a kernel with the 9 KiB of workgroup memory it rounds into ran the
/// Q4_0 × Q8_0 decode product [1, 1024] · [2816, 1024]ᵀ in 7.1–7.4 ms, against 4.2 ms for the
/// product reading the int8 values of a separate `quantize_acts_blocks` dispatch. With the
/// norms and ropes unfused as a result (21 dispatches per layer instead of 8), the SmolLM-shape
/// decode there still ran 1.6–1.7 times faster. Natively SwiftShader gained about 10%, and
/// lavapipe, which pays 60–100 µs per dispatch, lost 10–20%. The norms, ropes and KV stores
/// have since come back into the products there through `quantize_acts_normed`
/// ([`folds_norm`]), and q, k and v read one rounding (`shared_rounding.rs`): 12 dispatches
/// per layer.
fn quantizes_in_kernel(activations: Activations, m: usize, k: usize, shape: MvShape) -> bool {
    matches!(activations, Activations::Q8_0 | Activations::I8)
        && shape != MvShape::Lanes
        && m <= MATVEC_MAX_M
        && m * k <= MVQ_MAX_VALUES
}

/// Whether an `m × k` product of `format` weights can fold an RMS norm of the activations
/// into their int8 rounding, and so also take the `mv` kernel's rotary and pool-store
/// epilogues: on GPUs the `mv` kernel norms the rows where it rounds them in workgroup memory;
/// on CPU adapters, which round in a dispatch of their own, `quantize_acts_normed` norms them
/// there. On a CPU adapter that took a SmolLM-135M-shape decode step from 21 dispatches per
/// layer to 14 (see `docs/wgpu-decode-profile.md`).
pub(in crate::backend::webgpu) fn folds_norm(
    format: DType,
    activations: Activations,
    (m, k): (usize, usize),
    shape: MvShape,
) -> bool {
    format.is_quantized()
        && matches!(activations, Activations::Q8_0 | Activations::I8)
        && (quantizes_in_kernel(activations, m, k, shape) || shape == MvShape::Lanes)
        && k <= shape.max_k()
}

/// Whether `pr`, a product a layer's gate and up weights share, runs as one paired `mv`
/// dispatch ([`Epilogue::Paired`]) when the two are bound together: the products the `mv`
/// kernel takes on GPUs (the row-team shapes, decode's few rows, f32 or int8 activations,
/// packed or f16 weights, k in whole groups), with an even count of rows.
pub(super) fn pairs_swiglu(pr: Product, shape: MvShape) -> bool {
    shape != MvShape::Lanes
        && pr.m <= MATVEC_MAX_M
        && pr.format != DType::F32
        && pr.k.is_multiple_of(32)
        && pr.k <= shape.max_k()
        && pr.n.is_multiple_of(2)
        && matches!(
            pr.activations,
            Activations::F32 | Activations::Q8_0 | Activations::I8
        )
}

/// Whether `l`, the product of a layer's key and value stores, runs as one `mv` dispatch
/// over both weights into both pools (a paired [`OpSpec::NormLinearInto`]) when each pair is
/// bound together: on GPUs (the row-team shapes) where the norm folds into the kernel's
/// rounding, with whole teams of four rows per product, so no team holds a key row and a
/// value row.
pub(in crate::backend::webgpu) fn pairs_store(l: &LinearSpec, shape: MvShape) -> bool {
    shape != MvShape::Lanes
        && folds_norm(l.format, l.activations, (l.m, l.k), shape)
        && l.n.is_multiple_of(4)
        && l.rope.is_none_or(|r| r.layout == RopeLayout::Interleaved)
}

/// Output rows and columns of an `mm_tiled` workgroup's tile (`shaders/quant/`).
const MM_TILE: usize = 64;

/// Whether a product runs `mm_tiled`, which decodes each weight group once per 64 activation
/// rows instead of once per four: prefill (more rows than decode's [`MATVEC_MAX_M`]) on GPUs
/// (the row-team shapes; a CPU adapter's lanes read the activations at one address for all,
/// which `mv` is shaped for), f32 or int8 activations, k in whole groups, and nothing folded
/// that only `mv` does (a norm, a KV store, the rotary epilogue).
fn takes_tiled(pr: Product, shape: MvShape, folds: Folds<'_>, epilogue: Epilogue<'_>) -> bool {
    pr.m > MATVEC_MAX_M
        && pr.k.is_multiple_of(32)
        && shape != MvShape::Lanes
        && matches!(
            pr.activations,
            Activations::F32 | Activations::Q8_0 | Activations::I8 | Activations::Q8_K
        )
        && folds.norm.is_none()
        && folds.store.is_none()
        && !matches!(epilogue, Epilogue::Rotary { .. })
}

/// Whether a product runs the entry `mv_pairs_lanes` (`shaders/quant/`), which takes a decode row
/// against Q4_0 or Q8_0 weights two blocks at a time, each nibble or byte multiplied where it
/// lies in its word: on CPU adapters (the lanes shape), one activation row, int8 activations,
/// and an even count of blocks per row (so that every pair of blocks starts on a word). An
/// entry of its own because SwiftShader runs the straight-line code of every branch of a
/// shader, taken or not: inside `mv` the other paths cost each workgroup about 13%.
fn takes_pairs(pr: Product, shape: MvShape) -> bool {
    shape == MvShape::Lanes
        && pr.m == 1
        && matches!(pr.format, DType::Q4_0 | DType::Q8_0)
        && matches!(pr.activations, Activations::Q8_0 | Activations::I8)
        && pr.k.is_multiple_of(64)
}

/// Words of the temporary buffer holding `m × k` activations rounded to int8 for a product
/// with `activations`, or `None` when they are not rounded (f32, f16) or the product rounds
/// them in its own kernel. Every rounding writes one layout (`quantize_acts_*` in
/// `shaders/quant/`): the int8 values, four per word, then one f32 scale per 32 values (a
/// `Q8_K` super-block's scale repeated for each of its eight groups), so the product kernels
/// read `Q8_0`, `I8` and `Q8_K` activations alike.
pub(in crate::backend::webgpu) fn int_activation_words(
    activations: Activations,
    (m, k): (usize, usize),
    shape: MvShape,
) -> Option<usize> {
    let rounded = matches!(
        activations,
        Activations::Q8_0 | Activations::I8 | Activations::Q8_K
    );
    (rounded && !quantizes_in_kernel(activations, m, k, shape)).then_some(m * k / 4 + m * k / 32)
}

/// Whether the `mv` and `mm_tiled` kernels take a group-decoded `format`
/// (`kquants/decode.wgsl`) with `activations`: f32 ones, or the int8 rounding llama.cpp gives
/// the format, `Q8_K` for the super-blocks and `Q8_0` for the legacy 32-value formats (`BF16`,
/// not llama.cpp's to round, takes f32 ones only). Every rounding writes one layout (a scale
/// per 32 values), which the kernels multiply each decoded group by; per-row `I8` stays
/// refused, as no model asks it of these formats.
fn decodes_with(format: DType, activations: Activations) -> bool {
    let rounding = if crate::quant::kquants::is_super_block(format) {
        Some(Activations::Q8_K)
    } else if format.is_quantized() {
        Some(Activations::Q8_0)
    } else {
        None
    };
    activations == Activations::F32 || Some(activations) == rounding
}

/// The shader's code for a packed format (`FMT_*` of the constants prelude).
fn format_code(format: DType) -> Result<u32> {
    kernel_consts::format_code("wgpu quant", format)
}

fn params(
    op: &'static str,
    format: DType,
    m: usize,
    n: usize,
    k: usize,
    mode: u32,
) -> Result<QuantParams> {
    Ok(QuantParams {
        format: format_code(format)?,
        m: u32_of(op, "rows", m)?,
        n: u32_of(op, "n", n)?,
        k: u32_of(op, "k", k)?,
        mode,
        ..Default::default()
    })
}

impl Encoder<'_> {
    /// The grid of the row-dot kernels in `shaders/quant/`: a workgroup per block of `block_rows`
    /// weight rows (`mv`: the prelude's `MV_ROWS`; the texel products: [`TEXEL_ROWS`]) and
    /// chunk of [`MATVEC_MAX_M`] activation rows.
    fn row_block_grid(
        &self,
        op: &'static str,
        m: usize,
        n: usize,
        block_rows: usize,
    ) -> Result<[u32; 3]> {
        let blocks = n.div_ceil(block_rows) as u64;
        self.grid(op, blocks * m.div_ceil(MATVEC_MAX_M) as u64)
    }

    /// Records a quantize, dequantize, quantized product or ternary dot.
    pub(super) fn quant(
        &mut self,
        spec: &OpSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        let op = spec.kind().name();
        match *spec {
            OpSpec::Quantize { format, rows, cols } => {
                let blocks = (rows * cols / format.block_len()) as u64;
                u32_of(op, "values", rows * cols)?;
                let p = params(op, format, rows, 0, cols, 0)?;
                let grid = self.grid(op, blocks.div_ceil(2).div_ceil(WG))?;
                self.run(
                    Shader::Quant,
                    "quantize",
                    &p,
                    out,
                    &[inputs[0].buffer],
                    grid,
                )
            }
            OpSpec::Dequantize { format, rows, cols } => {
                u32_of(op, "values", rows * cols)?;
                kernel_consts::check_whole_groups(op, format, cols)?;
                let p = params(op, format, rows, 0, cols, 0)?;
                let threads = (rows * cols.div_ceil(32)) as u64;
                let grid = self.grid(op, threads.div_ceil(WG))?;
                self.run(
                    Shader::Quant,
                    "dequantize",
                    &p,
                    out,
                    &[inputs[0].buffer],
                    grid,
                )
            }
            OpSpec::QMatmul {
                format,
                activations,
                m,
                n,
                k,
            } => {
                let temp = inputs.get(2).map(ActTable::empty);
                let product = Product {
                    format,
                    activations,
                    m,
                    n,
                    k,
                };
                self.qmatmul(
                    product,
                    out,
                    [inputs[0], inputs[1]],
                    (temp, Folds::default()),
                    Epilogue::None,
                )
            }
            OpSpec::TernaryDot { format, m, n, k } => {
                u32_of(op, "m·k", m * k)?;
                u32_of(op, "m·n", m * n)?;
                let p = params(op, format, m, n, k, 0)?;
                let tiles = self.grid(op, (n * m.div_ceil(ROWS)) as u64)?;
                let (w, x) = (inputs[0].buffer, inputs[1].buffer);
                self.run(Shader::Quant, "ternary_dot", &p, out, &[w, x], tiles)
            }
            _ => Err(Error::backend(
                BackendKind::Wgpu,
                format!("{op} is not a quantized op"),
            )),
        }
    }
}

/// The int8-activation buffer of a product whose kernel does not round its activations (the
/// backend allocates it where [`int_activation_words`] asks): the product rounds into it
/// first, or, `filled`, reads what an earlier product of the same activations rounded there
/// (`swiglu_linear`'s up product after its gate product).
#[derive(Clone, Copy)]
pub(super) struct ActTable<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub filled: bool,
}

impl<'a> ActTable<'a> {
    /// The buffer of `operand`, for the product to round into.
    pub(super) fn empty(operand: &Operand<'a>) -> Self {
        ActTable {
            buffer: operand.buffer,
            filled: false,
        }
    }
}

/// The sizes of a product with packed weights (an [`OpSpec::QMatmul`], or the product inside
/// a fused op).
#[derive(Clone, Copy)]
pub(super) struct Product {
    pub format: DType,
    pub activations: Activations,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// An RMS norm the `mv` kernel applies to each activation row before rounding it (see
/// [`folds_norm`]): its eps and its f32 `[k]` weight.
#[derive(Clone, Copy)]
pub(super) struct Norm<'a> {
    pub eps: f32,
    pub weight: &'a wgpu::Buffer,
}

/// A KV pool the `mv` kernel stores its product into instead of `[m, n]`
/// ([`OpSpec::NormLinearInto`]): head `g` of row `i` to pool row `slots[g · m + i]`.
#[derive(Clone, Copy)]
pub(super) struct PoolStore<'a> {
    pub slots: &'a wgpu::Buffer,
    pub head_dim: usize,
    pub pool_rows: usize,
    /// A paired store's second half ([`PairedStore`]), or `None` for one pool.
    pub values: Option<PairedStore>,
}

/// Where the value half of a paired pool store goes and comes from: the product's n counts
/// the key rows, then as many value rows, read from the weights bound from byte
/// `weights_at` on and stored into the value pool from element `pool_at` of the output.
#[derive(Clone, Copy)]
pub(super) struct PairedStore {
    pub weights_at: u32,
    pub pool_at: u32,
}

/// What the `mv` kernel folds into a product besides its epilogue, only where
/// [`folds_norm`] says it can: the norm of the activations, and the store into a pool.
#[derive(Clone, Copy, Default)]
pub(super) struct Folds<'a> {
    pub norm: Option<Norm<'a>>,
    pub store: Option<PoolStore<'a>>,
}

/// What a product does to its f32 `[m, n]` result before storing it: the `mv` kernel applies
/// it in place, other product kernels are followed by the `epilogue` kernel.
#[derive(Clone, Copy)]
pub(super) enum Epilogue<'a> {
    /// Stores the product as it is.
    None,
    /// Adds this residual (`linear_residual`).
    Residual(&'a wgpu::Buffer),
    /// Multiplies SiLU of this gate product by the product, the up projection
    /// (`swiglu_linear`).
    SiluGate(&'a wgpu::Buffer),
    /// Rotates pairs (2i, 2i + 1) of each head of `head_dim` values by the rows' `positions`
    /// (u32 `[m]`) and the frequencies `inv_freq` (f32 `[head_dim / 2]`): the q and k
    /// projections of a `rms_norm_linear` with rope (the `mv` kernel only).
    Rotary {
        inv_freq: &'a wgpu::Buffer,
        positions: &'a wgpu::Buffer,
        head_dim: usize,
    },
    /// The paired SwiGLU product (the `mv` kernel only): the weights bound are a layer's gate
    /// rows and then, from byte `up_at`, its up rows, the product's n counting both; stores
    /// `silu(gate) · up`, `[m, n / 2]` (`mv_store_paired` in `shaders/quant/`).
    Paired { up_at: u32 },
}

impl<'a> Epilogue<'a> {
    /// `Params::epilogue` of `shaders/quant/`.
    fn code(self) -> u32 {
        match self {
            Epilogue::None => 0,
            Epilogue::Residual(_) => 1,
            Epilogue::SiluGate(_) => 2,
            Epilogue::Rotary { .. } => 3,
            Epilogue::Paired { .. } => 4,
        }
    }

    /// The buffer the epilogue reads (`res` in `shaders/quant/`), or `fallback` (bound but unread)
    /// when it reads none.
    fn operand(self, fallback: &'a wgpu::Buffer) -> &'a wgpu::Buffer {
        match self {
            Epilogue::None | Epilogue::Paired { .. } => fallback,
            Epilogue::Residual(b) | Epilogue::SiluGate(b) => b,
            Epilogue::Rotary { inv_freq, .. } => inv_freq,
        }
    }

    /// The positions of a rotary epilogue, or `fallback` (bound but unread).
    fn positions(self, fallback: &'a wgpu::Buffer) -> &'a wgpu::Buffer {
        match self {
            Epilogue::Rotary { positions, .. } => positions,
            _ => fallback,
        }
    }
}

impl Encoder<'_> {
    /// Records `out = act(a) · wᵀ`, then `epilogue`, for packed weights `w`; `temp` is the
    /// int8-activation buffer where the product has one, and `folds` what to fold in besides
    /// the epilogue (only where [`folds_norm`], which the fused encoders check).
    /// The `mv` kernel applies the epilogue as it stores; the other kernels are followed by the
    /// `epilogue` kernel.
    pub(super) fn qmatmul(
        &mut self,
        pr: Product,
        out: &wgpu::Buffer,
        [a, weights]: [Operand<'_>; 2],
        (temp, folds): (Option<ActTable<'_>>, Folds<'_>),
        epilogue: Epilogue<'_>,
    ) -> Result<()> {
        const OP: &str = "qmatmul";
        let (a, w) = (a.buffer, weights.buffer);
        let Product {
            format,
            activations,
            m,
            n,
            k,
        } = pr;
        u32_of(OP, "m·k", m * k)?;
        u32_of(OP, "m·n", m * n)?;
        kernel_consts::check_whole_groups(OP, format, k)?;
        let tiles = self.grid(OP, (n * m.div_ceil(ROWS)) as u64)?;
        let mode = matches!(activations, Activations::F16 | Activations::I8) as u32;
        let Folds { norm, store } = folds;
        // Only the `mv` kernel reads `epilogue`, `eps`, `rope_dim` and the store's sizes.
        let p = QuantParams {
            epilogue: epilogue.code(),
            eps: norm.map_or(0.0, |n| n.eps),
            rope_dim: match epilogue {
                Epilogue::Rotary { head_dim, .. } => u32_of(OP, "head_dim", head_dim)?,
                _ => 0,
            },
            store_dim: u32_of(OP, "head_dim", store.map_or(0, |s| s.head_dim))?,
            pool_rows: u32_of(OP, "pool rows", store.map_or(0, |s| s.pool_rows))?,
            second_at: match (epilogue, store.and_then(|s| s.values)) {
                (Epilogue::Paired { up_at }, _) => up_at,
                (_, Some(v)) => v.weights_at,
                _ => 0,
            },
            values_at: store.and_then(|s| s.values).map_or(0, |v| v.pool_at),
            ..params(OP, format, m, n, k, mode)?
        };
        let mv_grid = self.row_block_grid(OP, m, n, self.ctx.mv_shape().rows_per_workgroup())?;
        let fits_mv = k <= self.ctx.mv_shape().max_k();
        let tiled = self.ctx.tiled_prefill && takes_tiled(pr, self.ctx.mv_shape(), folds, epilogue);
        // `Q8_K` activations pair with the super-block formats only (`ops::qmatmul_t` refuses
        // the others): none of the 32-value kernels reads them.
        let super_block = crate::quant::kquants::is_super_block(format);
        if activations == Activations::Q8_K && !super_block {
            return Err(Error::ActivationsUnsupported {
                weight: format,
                activations: "q8_k".into(),
                backend: BackendKind::Wgpu,
            });
        }
        let group_activations = decodes_with(format, activations);
        if kernel_consts::decodes_groups(format) && !(group_activations && (tiled || fits_mv)) {
            // These formats decode only inside `mv` and `mm_tiled` (`kquants/decode.wgsl`), with
            // f32 activations or llama.cpp's rounding for them (`decodes_with`).
            if !group_activations {
                return Err(Error::ActivationsUnsupported {
                    weight: format,
                    activations: format!("{activations:?}").to_lowercase(),
                    backend: BackendKind::Wgpu,
                });
            }
            let max_k = self.ctx.mv_shape().max_k();
            return Err(Error::invalid(
                OP,
                format!(
                    "wgpu has no product of {format} weights here: rows of {k} values are longer \
                     than this adapter's {max_k}"
                ),
            ));
        }
        // The `mv` kernel binds six operands: the epilogue's, the norm's weight, the rotary
        // positions and the pool slots, or an operand again, unread. `mv_pairs_texels` binds
        // the same, then the weights' texel scales and their texture.
        let mv = |enc: &mut Self,
                  (entry, code): (&'static str, u32),
                  x: &wgpu::Buffer,
                  (texels, grid): (Option<&WeightTexels>, [u32; 3])| {
            let inputs = [
                w,
                x,
                epilogue.operand(x),
                norm.map_or(x, |n| n.weight),
                epilogue.positions(x),
                store.map_or(x, |s| s.slots),
            ];
            let Some(t) = texels else {
                return enc.run_format(Shader::Quant, (entry, code), &p, out, &inputs, grid);
            };
            let [w, x, operand, norm, positions, slots] = inputs;
            let inputs = [w, x, operand, norm, positions, slots, &t.scales];
            let binds = (&inputs[..], Some(&t.view));
            enc.run_bound(Shader::Quant, (entry, code), &p, out, binds, grid)
        };
        // `mm_tiled` binds what `mv` binds (it reads the weights, activations and epilogue).
        let mm_tiled = |enc: &mut Self, code: u32, x: &wgpu::Buffer| {
            let tiles = (n.div_ceil(MM_TILE) * m.div_ceil(MM_TILE)) as u64;
            let grid = enc.grid(OP, tiles)?;
            let inputs = [w, x, epilogue.operand(x), x, x, x];
            enc.run_format(Shader::Quant, ("mm_tiled", code), &p, out, &inputs, grid)
        };
        match activations {
            Activations::F32 if tiled => return mm_tiled(self, format_code(format)?, a),
            Activations::F32 if k.is_multiple_of(32) && fits_mv => {
                // The row-dot kernel specialised for the format.
                return mv(self, ("mv", format_code(format)?), a, (None, mv_grid));
            }
            Activations::F32 | Activations::F16 => {
                if format == DType::F16 && self.ctx.native_f16 {
                    let entry = if mode == 1 {
                        "qmatmul_f16_f16a"
                    } else {
                        "qmatmul_f16"
                    };
                    self.run(Shader::QuantF16, entry, &p, out, &[w, a], tiles)?;
                } else {
                    self.run(Shader::Quant, "qmatmul_float", &p, out, &[w, a], tiles)?;
                }
            }
            Activations::Q8_0 | Activations::I8
                if quantizes_in_kernel(activations, m, k, self.ctx.mv_shape()) =>
            {
                // The row-dot kernel rounding the f32 activations itself (norming them first).
                let normed = if norm.is_some() { NORM_ACTIVATIONS } else { 0 };
                let code = normed + QUANTIZE_ACTIVATIONS + INT_ACTIVATIONS + format_code(format)?;
                return mv(self, ("mv", code), a, (None, mv_grid));
            }
            Activations::Q8_0 | Activations::I8 | Activations::Q8_K => {
                let ActTable {
                    buffer: temp,
                    filled,
                } = temp.ok_or_else(|| {
                    Error::backend(BackendKind::Wgpu, "qmatmul: missing the activation buffer")
                })?;
                if !filled {
                    self.round_activations(&p, activations, a, temp, norm)?;
                }
                if tiled {
                    return mm_tiled(self, INT_ACTIVATIONS + format_code(format)?, temp);
                }
                if fits_mv {
                    // The row-dot kernel reading the int8 activations.
                    let code = INT_ACTIVATIONS + format_code(format)?;
                    // The texel copy holds the whole tensor: not for one row range of it.
                    let whole = format == DType::Q4_0 && self.windows.is_empty();
                    let texels = weights.texels.filter(|_| whole);
                    // Texels exist on CPU adapters only: decode takes them in pairs of
                    // blocks, prefill chunk by chunk of activation rows.
                    let (entry, texels) = match (takes_pairs(pr, self.ctx.mv_shape()), texels) {
                        (true, Some(t)) => ("mv_pairs_texels", Some(t)),
                        (true, None) => ("mv_pairs_lanes", None),
                        (false, Some(t)) if m > 1 => ("mv_texels", Some(t)),
                        (false, _) => ("mv", None),
                    };
                    // Both texel products take TEXEL_ROWS weight rows per workgroup.
                    let grid = match texels {
                        Some(_) => self.row_block_grid(OP, m, n, TEXEL_ROWS)?,
                        None => mv_grid,
                    };
                    return mv(self, (entry, code), temp, (texels, grid));
                }
                self.run(Shader::Quant, "qmatmul_int", &p, out, &[w, temp], tiles)?;
            }
        }
        self.epilogue(m, n, out, epilogue)
    }

    /// Rounds the f32 activations `a` of the product `p` describes to int8 `activations`
    /// into `temp`, RMS-normed first with `norm`. Q8_0's chunks of 32 are independent, one
    /// invocation each; Q8_K's super-blocks of 256 one workgroup each (its lanes share the
    /// search for the largest magnitude); a scale per row needs the row's largest magnitude
    /// first, and a norm (CPU adapters only, Q8_0 and I8 only: [`folds_norm`]) the row's mean
    /// square: one workgroup per row.
    fn round_activations(
        &mut self,
        p: &QuantParams,
        activations: Activations,
        a: &wgpu::Buffer,
        temp: &wgpu::Buffer,
        norm: Option<Norm<'_>>,
    ) -> Result<()> {
        const OP: &str = "qmatmul";
        let (m, values) = (p.m as usize, p.m as usize * p.k as usize);
        let (entry, groups) = match (norm, activations) {
            (Some(_), Activations::Q8_0 | Activations::I8) => ("quantize_acts_normed", m),
            (None, Activations::Q8_0) => {
                ("quantize_acts_blocks", (values / 32).div_ceil(WG as usize))
            }
            (None, Activations::I8) => ("quantize_acts_rows", m),
            (None, Activations::Q8_K) => ("quantize_acts_super", values / 256),
            _ => {
                return Err(Error::backend(
                    BackendKind::Wgpu,
                    format!("no wgpu rounding of {activations:?} activations here"),
                ))
            }
        };
        let grid = self.grid(OP, groups as u64)?;
        // The norm's weight is binding 5, as the `mv` kernel reads it; the three roundings
        // share `chunk_vec`, which reads it, so all bind it (unread without a norm).
        let weight = norm.map_or(a, |n| n.weight);
        self.run(Shader::Quant, entry, p, temp, &[a, a, a, weight], grid)
    }

    /// Applies `epilogue` to the `m × n` values of `out`, after a product kernel without it.
    pub(super) fn epilogue(
        &mut self,
        m: usize,
        n: usize,
        out: &wgpu::Buffer,
        epilogue: Epilogue<'_>,
    ) -> Result<()> {
        const OP: &str = "epilogue";
        match epilogue {
            Epilogue::None => return Ok(()),
            Epilogue::Paired { .. } => {
                return Err(Error::backend(
                    BackendKind::Wgpu,
                    "the paired SwiGLU product runs on the `mv` kernel only",
                ))
            }
            _ => {}
        }
        let p = QuantParams {
            m: u32_of(OP, "rows", m)?,
            n: u32_of(OP, "n", n)?,
            epilogue: epilogue.code(),
            ..Default::default()
        };
        let grid = self.grid(OP, ((m * n) as u64).div_ceil(WG))?;
        let operand = epilogue.operand(out);
        let inputs = [operand, operand, operand];
        self.run(Shader::Quant, "epilogue", &p, out, &inputs, grid)
    }
}
