//! [`OpSpec`]: the contract between the op layer and the backends.
//!
//! The op layer (`crate::ops`) validates shapes and dtypes and then describes the work as one
//! `OpSpec` value with plain sizes. Backends match on it. Each variant documents its inputs (in
//! order), its output, and its exact meaning; the `reference` backend is the executable form
//! of these docs.

mod fused;
mod inputs;
mod kind;
mod sample;
pub use fused::{AttentionSpec, LinearSpec, PreNorm, RopeEpilogue};
pub use inputs::InputSpec;
pub use kind::OpKind;

use crate::dtype::DType;

/// An elementwise op on one f32 input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// `x · sigmoid(x) = x / (1 + e^(−x))`.
    Silu,
    /// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
    /// GELU, exact: `0.5·x·(1 + erf(x/√2))`.
    GeluErf,
    /// The logistic function `1 / (1 + e^(−x))`, for sigmoid gates.
    Sigmoid,
    /// `x · factor`.
    Scale(f32),
    /// Soft-capping at `cap` (Gemma 2's attention and final logits): `cap · tanh(x / cap)`,
    /// which keeps every value within ±cap and leaves small ones nearly as they are.
    Softcap(f32),
}

/// An elementwise op on two f32 inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a · b`.
    Mul,
    /// `silu(a) · b`: the gate of a SwiGLU feed-forward block.
    SwiGlu,
}

/// How rotary position embedding pairs the elements of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
pub enum RopeLayout {
    /// Hugging Face Llama / GPT-NeoX: element `i` pairs with `i + head_dim/2`.
    #[default]
    HalfSplit,
    /// Original Meta Llama / GGUF: element `2i` pairs with `2i + 1`.
    Interleaved,
}

/// How [`OpSpec::QMatmul`] treats its activations (the left operand).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activations {
    /// f32 activations used as they are.
    #[default]
    F32,
    /// f16 activations (an `F16` tensor), widened to f32.
    F16,
    /// f32 activations rounded to `Q8_0` per block of 32 first ([`crate::quant::quantize_i8`]
    /// on each block, scale kept in f32): the integer dot products llama.cpp uses on CPUs.
    Q8_0,
    /// f32 activations rounded to int8 with one scale per row (`d = max|x| / 127`, the
    /// BitNet b1.58 absmax rule) first.
    I8,
    /// f32 activations rounded to llama.cpp's `Q8_K` per block of 256 first
    /// ([`crate::quant::quantize_q8_k`], scale kept in f32): the activations llama.cpp pairs
    /// with the K-quants and `IQ4_XS`.
    Q8_K,
}

impl Activations {
    /// The rounded activations the product actually uses, per row of `k` values (f64 so the
    /// reference can use them exactly): `d · q` for the quantizing modes, `x` otherwise.
    pub fn effective(self, row: &[f32]) -> Vec<f64> {
        let (block, round): (usize, crate::quant::RoundFn) = match self {
            Activations::F32 | Activations::F16 => return row.iter().map(|&v| v as f64).collect(),
            Activations::Q8_0 => (32, crate::quant::quantize_i8),
            Activations::I8 => (row.len().max(1), crate::quant::quantize_i8),
            Activations::Q8_K => (256, crate::quant::quantize_q8_k),
        };
        let mut out = Vec::with_capacity(row.len());
        let mut q = vec![0i8; block];
        for chunk in row.chunks(block) {
            let d = round(chunk, &mut q[..chunk.len()]);
            out.extend(q[..chunk.len()].iter().map(|&v| v as f64 * d as f64));
        }
        out
    }
}

/// How [`OpSpec::Sample`] draws a token from a row of logits `x` with a number `u ∈ [0, 1)`:
///
/// 1. NaN entries are never drawn (a row of only NaN gives 0).
/// 2. With `temperature ≤ 0` (or not finite): the first index of the largest value (greedy).
///    When the largest value is `+∞`: its first index.
/// 3. Weights `w_i = exp((x_i − max) / temperature)`.
/// 4. Top-k (`0 < top_k <` the number of non-NaN entries): keep the entries `x_i ≥ v_k`,
///    where `v_k` is the `top_k`-th largest value (all ties with it are kept).
/// 5. Top-p (`top_p < 1`): among the kept entries in decreasing value order, take the shortest
///    prefix whose weights sum to at least `top_p ·` the kept weights' sum; keep the entries
///    `x_i ≥` the smallest value of that prefix (again with all its ties). `top_p ≤ 0` keeps
///    only the largest value.
/// 6. Draw in index order: with `W` the kept weights' sum, the token is the first kept `j`
///    whose running sum `Σ_{kept i ≤ j} w_i` exceeds `u · W` (the last kept index if rounding
///    leaves none).
///
/// Every step but the last depends only on the order of the values, so backends agree
/// exactly on which tokens are kept except where weights sum to within rounding of the top-p
/// cut, and on the token drawn except where `u · W` is within rounding of a running sum.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SampleParams {
    /// Divides the logits before the softmax; `≤ 0` means greedy.
    pub temperature: f32,
    /// Keep the `top_k` largest logits (0: all).
    pub top_k: u32,
    /// Keep the most likely tokens up to this probability mass (≥ 1: all).
    pub top_p: f32,
}

impl SampleParams {
    /// Whether these parameters pick the largest logit without drawing.
    pub fn is_greedy(&self) -> bool {
        !(self.temperature > 0.0 && self.temperature.is_finite())
    }
}

/// The scans of [`OpSpec::Scan`], each along the middle axis of an `[outer, len, inner]` view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanOp {
    /// Inputs `a`, `b` `[outer, len, inner]`, `h0` `[outer, inner]`:
    /// `h_t = a_t · h_{t−1} + b_t` with `h_{−1} = h0`. Output: every `h_t`.
    ///
    /// Parallel backends evaluate it as a scan of the affine maps `(a_t, b_t)`, so they form
    /// products of `a` over spans of steps: a NaN poisons the rest of its channel as in the
    /// sequential definition, but an infinite input may meet such a product that underflowed
    /// to 0 and give NaN where the sequential recurrence gives ±∞. Infinite inputs are outside
    /// the op's tolerance.
    Linear,
    /// Inputs `a`, `grad` `[outer, len, inner]`: the reverse recurrence of the backward pass,
    /// `g_t = grad_t + a_{t+1} · g_{t+1}` with `g_{len−1} = grad_{len−1}`. Output: every `g_t`.
    LinearAdjoint,
    /// Input `a`: `y_t = exp(Σ_{s≤t} ln a_s)`, the cumulative product in log space (`ln` of a
    /// negative value is NaN, of 0 is −∞, so the product from there on is NaN or 0).
    LogCumprod,
    /// Input `x`: `y_t = ln Σ_{s≤t} exp(x_s)`, computed stably; −∞ while every term is −∞,
    /// +∞ from a +∞ term on, NaN from a NaN on.
    LogCumSumExp,
}

/// Sizes of a (batched) matrix product `out[b] = a[b] · op(rhs[b])`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulSpec {
    /// Number of independent products.
    pub batch: usize,
    /// Rows of `a` and of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// `true`: rhs is stored `[n, k]` and used transposed (a linear layer's weight, `a·bᵀ`).
    /// `false`: rhs is stored `[k, n]` (`a·b`).
    pub rhs_transposed: bool,
    /// `true`: rhs has `batch` matrices. `false`: one rhs matrix shared by every batch.
    pub rhs_batched: bool,
}

impl MatmulSpec {
    /// Floating-point operations of the product (2·batch·m·n·k).
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// One op, fully described by plain sizes. All tensors are contiguous row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum OpSpec {
    /// Inputs: `x` f32 `[len]`. Output: f32 `[len]`, `op(x[i])`.
    Unary {
        /// The function.
        op: UnaryOp,
        /// Elements.
        len: usize,
    },
    /// Inputs: `a` f32 `[len]`, `b` f32 `[rhs_len]` with `len % rhs_len == 0`.
    /// Output: f32 `[len]`, `op(a[i], b[i % rhs_len])` (b repeats along the leading axes).
    Binary {
        /// The function.
        op: BinaryOp,
        /// Elements of `a` and of the output.
        len: usize,
        /// Elements of `b` (≥ 1 unless `len` is 0).
        rhs_len: usize,
    },
    /// Inputs: `x` f32 `[rows, cols]`, `weight` f32 `[cols]`.
    /// Output: `x / sqrt(mean(x²) + eps) · weight` per row.
    RmsNorm {
        /// Rows.
        rows: usize,
        /// Normalised length.
        cols: usize,
        /// Added to the mean square.
        eps: f32,
    },
    /// Inputs: `x` f32 `[rows, cols]`, `weight` f32 `[cols]`, `bias` f32 `[cols]`.
    /// Output: `(x − mean) / sqrt(var + eps) · weight + bias` per row (population variance).
    LayerNorm {
        /// Rows.
        rows: usize,
        /// Normalised length.
        cols: usize,
        /// Added to the variance.
        eps: f32,
    },
    /// Inputs: `x` f32 `[rows, cols]`. Output: `exp(x − max) / Σ exp(x − max)` per row.
    /// With `causal: Some(q)`, rows come in groups of `q` queries over `cols` keys; query `i`
    /// (row index mod `q`) sees keys `j ≤ i + cols − q` and masked entries are exactly 0.
    Softmax {
        /// Rows.
        rows: usize,
        /// Length of the softmax axis.
        cols: usize,
        /// Queries per attention matrix for a causal mask (`q ≤ cols`), or `None`.
        causal: Option<usize>,
    },
    /// Inputs: `x` f32 `[rows, heads, head_dim]`, `positions` u32 `[rows]`, `inv_freq` f32
    /// `[head_dim/2]` (the model's rotary frequencies, scaling already applied).
    /// Output: each pair `(x0, x1)` (chosen by `layout`) of pair index `i < head_dim/2`
    /// rotated by the angle `θ = f32(pos) ·f32 inv_freq[i]` (one f32 multiplication):
    /// `x0' = x0·cos θ − x1·sin θ`, `x1' = x0·sin θ + x1·cos θ`.
    Rope {
        /// Rows (tokens).
        rows: usize,
        /// Heads per row.
        heads: usize,
        /// Elements per head (even).
        head_dim: usize,
        /// Pairing of elements.
        layout: RopeLayout,
    },
    /// Inputs: `a` f32 `[batch, m, k]`, `rhs` f32 (see [`MatmulSpec`]). Output f32 `[batch, m, n]`.
    Matmul(MatmulSpec),
    /// Inputs: `table` `[vocab, dim]` of `format`, `ids` u32 `[count]`. Output f32
    /// `[count, dim]`: row `ids[i]` of the table (dequantized, for a packed table); an id
    /// `≥ vocab` gives a row of NaN.
    Embedding {
        /// Rows of the table.
        vocab: usize,
        /// Columns of the table.
        dim: usize,
        /// Ids to gather.
        count: usize,
        /// The table's dtype: f32, or a packed weight format (f16, bf16, a block format),
        /// which the host backends gather and the GPU ones leave to them.
        format: DType,
    },
    /// Inputs: `x` (f32 or u32) with shape `in_shape`. Output: the same dtype, contiguous, with
    /// `out.dims[d] = in_shape[perm[d]]` and `out[i0..] = x[...]` permuted accordingly
    /// (rank ≤ [`OpSpec::MAX_PERMUTE_RANK`]).
    Permute {
        /// Input dimensions.
        in_shape: Vec<usize>,
        /// For each output axis, the input axis it comes from.
        perm: Vec<usize>,
    },
    /// Inputs: `x` f32 `[rows, cols]`. Output: `format` data `[rows, cols]` (`cols` a multiple
    /// of the block length): each block rounded as [`crate::quant`] documents, bit for bit as
    /// GGUF's reference quantizers. `format` is `F16` or a block format.
    Quantize {
        /// Target format.
        format: DType,
        /// Rows.
        rows: usize,
        /// Values per row.
        cols: usize,
    },
    /// Inputs: `x` of `format` `[rows, cols]`. Output: f32 `[rows, cols]`, each value
    /// `d · q` exactly as [`crate::quant`] documents (computed in f32, as GGUF does).
    Dequantize {
        /// Source format (`F16` or a block format).
        format: DType,
        /// Rows.
        rows: usize,
        /// Values per row.
        cols: usize,
    },
    /// Inputs: `a` `[m, k]` (f32, or f16 for [`Activations::F16`]), `w` of `format` `[n, k]`
    /// (a linear layer's weight as GGUF stores it). Output: f32 `[m, n]`,
    /// `out[i, j] = Σ_k act(a)[i, k] · dequantize(w)[j, k]` where `act` is
    /// [`Activations::effective`]. Kernels read `w` packed; it is never expanded in memory.
    QMatmul {
        /// Weight format: `F16` or a block format.
        format: DType,
        /// Treatment of the activations.
        activations: Activations,
        /// Rows of `a` and of the output.
        m: usize,
        /// Rows of `w`: columns of the output.
        n: usize,
        /// The contracted dimension (a multiple of the block length).
        k: usize,
    },
    /// Inputs: `w` ternary `format` `[n, k]`, `x` i8 `[m, k]`. Output: i32 `[m, n]`,
    /// `Σ_k trit(w)[j, k] · x[i, k]` exactly: the integer core of a ternary layer, block
    /// scales not applied.
    TernaryDot {
        /// `TQ1_0`, `TQ2_0` or `TernaryPlanes`.
        format: DType,
        /// Rows of `x`.
        m: usize,
        /// Rows of `w`.
        n: usize,
        /// The contracted dimension (a multiple of 256).
        k: usize,
    },
    /// Inputs: `a` `[rows, a_cols]`, `b` `[rows, b_cols]`, both f32 or both u32. Output: the
    /// same dtype, `[rows, a_cols + b_cols]`, each row `a`'s row followed by `b`'s (concatenation along
    /// an axis, seen as rows of everything after it).
    Concat {
        /// Rows (product of the dimensions before the axis).
        rows: usize,
        /// Row width of `a`.
        a_cols: usize,
        /// Row width of `b`.
        b_cols: usize,
    },
    /// Inputs: `x` f32 or u32 `[rows, cols]`. Output: the same dtype, `[rows, len]`, columns
    /// `start..start + len`
    /// of each row (a slice along an axis, seen as rows of everything after it).
    Narrow {
        /// Rows (product of the dimensions before the axis).
        rows: usize,
        /// Row width of `x`.
        cols: usize,
        /// First column taken.
        start: usize,
        /// Columns taken.
        len: usize,
    },
    /// A scan along the middle axis of an `[outer, len, inner]` view (f32): inputs and output
    /// as [`ScanOp`] says.
    Scan {
        /// Which scan.
        op: ScanOp,
        /// Product of the dimensions before the scanned axis.
        outer: usize,
        /// Length of the scanned axis.
        len: usize,
        /// Product of the dimensions after it.
        inner: usize,
    },
    /// Inputs: `g` (from [`ScanOp::LinearAdjoint`]) and `h` `[outer, len, inner]`, `h0`
    /// `[outer, inner]`. Output: the gradient of the linear scan's `a`, `g_t · h_{t−1}` with
    /// `h_{−1} = h0`.
    ScanGradA {
        /// As in [`OpSpec::Scan`].
        outer: usize,
        /// As in [`OpSpec::Scan`].
        len: usize,
        /// As in [`OpSpec::Scan`].
        inner: usize,
    },
    /// Inputs: `a` and `g` `[outer, len, inner]` (`len ≥ 1`). Output: the gradient of the
    /// linear scan's `h0`, `a_0 · g_0`, `[outer, inner]`.
    ScanGradInit {
        /// As in [`OpSpec::Scan`].
        outer: usize,
        /// As in [`OpSpec::Scan`].
        len: usize,
        /// As in [`OpSpec::Scan`].
        inner: usize,
    },
    /// In place (see [`crate::backend::Backend::write_into`]): the target `[rows, cols]` (f32
    /// or u32) is changed; inputs `src` of the target's dtype `[count, cols]` and `slots` u32
    /// `[count]`. Row `slots[i]` of the target becomes row `i` of `src`; a slot `≥ rows` writes
    /// nothing. Slots must be distinct: with repeated slots, which source row lands is
    /// unspecified. Used to write new keys and values into a preallocated KV cache.
    ScatterRows {
        /// Rows of the target.
        rows: usize,
        /// Row width.
        cols: usize,
        /// Rows written.
        count: usize,
    },
    /// Inputs: `logits` f32 `[rows, vocab]`, `uniform` f32 `[rows]` (one number in `[0, 1)` per
    /// row). Output u32 `[rows]`: one token per row drawn as [`SampleParams`] defines, so that
    /// the same logits and numbers give the same token on every backend (up to rounding at the
    /// boundaries between tokens).
    Sample {
        /// Rows (sequences).
        rows: usize,
        /// Length of each row.
        vocab: usize,
        /// Temperature, top-k, top-p.
        params: SampleParams,
    },
    /// Inputs: `a` f32 `[m, k]`, `w` of `format` `[n, k]` (f32, f16 or a block format), the
    /// norm's weight f32 `[k]` (`norm` must be set), then with `rope` the positions u32 `[m]`
    /// and the rotary frequencies f32 `[head_dim / 2]`. Output f32 `[m, n]`: `act(n(a)) · wᵀ`
    /// with `n` the [`PreNorm`] of each row, rotated by [`RopeEpilogue`]; `rms_norm` then the
    /// product (as [`OpSpec::QMatmul`], or [`OpSpec::Matmul`] for f32 weights) then `rope`,
    /// up to the f32 rounding of the normed row and of the product (tolerance 1e-5·√k).
    NormLinear(LinearSpec),
    /// In place (see [`OpSpec::ScatterRows`]): the target is f32 `[pool_rows, head_dim]` (a KV
    /// pool tensor); the inputs are [`OpSpec::NormLinear`]'s, then the slots u32
    /// `[m · n / head_dim]`. The product `y` `[m, n]`, seen as `[m, n / head_dim, head_dim]`,
    /// is written in heads-first order: head `g` of row `i` becomes pool row
    /// `slots[g · m + i]` (a slot `≥ pool_rows` writes nothing). This is `NormLinear`, then
    /// the heads-first transpose, then `ScatterRows`: the new keys or values of a decode step
    /// stored by the product that makes them.
    ///
    /// With `paired`, two targets of that shape (a layer's key pool, then its value pool) and
    /// after the slots a second weight `[n, k]` of `l`'s format (the values'): the first
    /// weight's product, rotated by `l.rope`, goes into the first target, the second's, never
    /// rotated, into the second, at the same slots. This is the op without `paired` twice.
    NormLinearInto {
        /// The product, as in [`OpSpec::NormLinear`].
        l: LinearSpec,
        /// Values per head: the pool's row width.
        head_dim: usize,
        /// Rows of the pool.
        pool_rows: usize,
        /// Whether a second product goes into a second pool (keys and values in one op).
        paired: bool,
    },
    /// Inputs: `a` f32 `[m, k]`, `gate` and `up` of `format` `[n, k]` (f32, f16 or a block
    /// format), then with `norm` its weight f32 `[k]` (`a` is normed first, as in
    /// [`OpSpec::NormLinear`]). Output f32 `[m, n]`: `silu(g) · u` with `g = act(a) · gateᵀ` and
    /// `u = act(a) · upᵀ`, each sum as [`OpSpec::QMatmul`] (or [`OpSpec::Matmul`] for f32
    /// weights) defines it, `act` applied once for both. This is what `matmul_t`/`qmatmul_t`
    /// twice then `swiglu` give, up to the f32 rounding of `g` and `u`: the product tolerance
    /// of docs/DESIGN.md (1e-5·√k).
    SwigluLinear(LinearSpec),
    /// Inputs: `a` f32 `[m, k]`, `w` of `format` `[n, k]`, `residual` f32 `[m, n]`. Output f32
    /// `[m, n]`: `residual + act(a) · wᵀ` (the product as in [`OpSpec::SwigluLinear`]); the
    /// product then `add`, up to the f32 rounding of the product (tolerance 1e-5·√k). No
    /// `norm`.
    LinearResidual(LinearSpec),
    /// Inputs: `q` f32 `[t, heads · head_dim]` (already rotated), `keys` and `values` f32
    /// `[pool_rows, head_dim]` (a KV pool's tensors, read in place), `rows` u32
    /// `[kv_heads, stride]`: the pool row of key `j` of key/value head `g` (a row `≥ pool_rows`
    /// reads as NaN), of which the first `n` columns are read. Output f32
    /// `[t, heads · head_dim]`: for query `i` and head `h` (key/value head
    /// `g = h / (heads / kv_heads)`),
    /// `Σ_j p_j · values[rows[g, j]]` with
    /// `p = softmax_j(capped(scale · q[i, h] · keys[rows[g, j]]))` over the keys
    /// [`AttentionSpec::visible`] gives (the new queries are the last `t` of the `n` keys,
    /// `softmax_causal`'s convention; `capped` is [`AttentionSpec::capped`], the identity
    /// without a soft-cap); hidden keys weigh exactly 0. The same as gathering the keys,
    /// `matmul_t`, `scale`, `softcap` where capped, the window mask, `softmax_causal` and
    /// `matmul`, within the product tolerance (1e-5·√n·scale).
    PagedAttention(AttentionSpec),
    /// Inputs: `x` f32 `[rows, cols]` with `cols ≥ 1`. Output u32 `[rows]`: the index of the
    /// largest value; the first one on ties; the first NaN if the row has a NaN.
    Argmax {
        /// Rows.
        rows: usize,
        /// Length of the reduced axis.
        cols: usize,
    },
}

impl OpSpec {
    /// The largest rank [`OpSpec::Permute`] handles.
    pub const MAX_PERMUTE_RANK: usize = 6;

    /// Which op family this is.
    pub fn kind(&self) -> OpKind {
        match self {
            OpSpec::Unary {
                op: UnaryOp::Silu, ..
            } => OpKind::Silu,
            OpSpec::Unary {
                op: UnaryOp::GeluTanh,
                ..
            } => OpKind::GeluTanh,
            OpSpec::Unary {
                op: UnaryOp::GeluErf,
                ..
            } => OpKind::GeluErf,
            OpSpec::Unary {
                op: UnaryOp::Sigmoid,
                ..
            } => OpKind::Sigmoid,
            OpSpec::Unary {
                op: UnaryOp::Scale(_),
                ..
            } => OpKind::Scale,
            OpSpec::Unary {
                op: UnaryOp::Softcap(_),
                ..
            } => OpKind::Softcap,
            OpSpec::Binary {
                op: BinaryOp::Add, ..
            } => OpKind::Add,
            OpSpec::Binary {
                op: BinaryOp::Mul, ..
            } => OpKind::Mul,
            OpSpec::Binary {
                op: BinaryOp::SwiGlu,
                ..
            } => OpKind::SwiGlu,
            OpSpec::RmsNorm { .. } => OpKind::RmsNorm,
            OpSpec::LayerNorm { .. } => OpKind::LayerNorm,
            OpSpec::Softmax { .. } => OpKind::Softmax,
            OpSpec::Rope { .. } => OpKind::Rope,
            OpSpec::Matmul(_) => OpKind::Matmul,
            OpSpec::Embedding { .. } => OpKind::Embedding,
            OpSpec::Permute { .. } => OpKind::Permute,
            OpSpec::Argmax { .. } => OpKind::Argmax,
            OpSpec::Quantize { .. } => OpKind::Quantize,
            OpSpec::Dequantize { .. } => OpKind::Dequantize,
            OpSpec::QMatmul { .. } => OpKind::QMatmul,
            OpSpec::TernaryDot { .. } => OpKind::TernaryDot,
            OpSpec::Concat { .. } => OpKind::Concat,
            OpSpec::Narrow { .. } => OpKind::Narrow,
            OpSpec::ScatterRows { .. } => OpKind::ScatterRows,
            OpSpec::Sample { .. } => OpKind::Sample,
            OpSpec::NormLinear(_) => OpKind::NormLinear,
            OpSpec::NormLinearInto { .. } => OpKind::NormLinearInto,
            OpSpec::SwigluLinear(_) => OpKind::SwigluLinear,
            OpSpec::LinearResidual(_) => OpKind::LinearResidual,
            OpSpec::PagedAttention(_) => OpKind::PagedAttention,
            OpSpec::Scan {
                op: ScanOp::Linear, ..
            } => OpKind::LinearScan,
            OpSpec::Scan {
                op: ScanOp::LogCumprod,
                ..
            } => OpKind::LogCumprod,
            OpSpec::Scan {
                op: ScanOp::LogCumSumExp,
                ..
            } => OpKind::LogCumSumExp,
            OpSpec::Scan {
                op: ScanOp::LinearAdjoint,
                ..
            }
            | OpSpec::ScanGradA { .. }
            | OpSpec::ScanGradInit { .. } => OpKind::ScanBackward,
        }
    }

    /// How many tensors an in-place op writes ([`OpSpec::ScatterRows`],
    /// [`OpSpec::NormLinearInto`]): two for a paired store, one otherwise.
    pub fn targets(&self) -> usize {
        match self {
            OpSpec::NormLinearInto { paired: true, .. } => 2,
            _ => 1,
        }
    }

    /// A paired [`OpSpec::NormLinearInto`] as the two stores it is (its definition): for the
    /// first target and then the second, the unpaired spec and the positions in the paired
    /// op's inputs of that store's inputs, in its order. `None` for any other op.
    pub fn paired_stores(&self) -> Option<[(OpSpec, Vec<usize>); 2]> {
        let OpSpec::NormLinearInto {
            l,
            head_dim,
            pool_rows,
            paired: true,
        } = *self
        else {
            return None;
        };
        let store = |l| OpSpec::NormLinearInto {
            l,
            head_dim,
            pool_rows,
            paired: false,
        };
        // `NormLinear`'s inputs (x, w, the norm's weight, a rope's two), the slots, then the
        // second weight, which the second store reads in place of the first, with no rope.
        let slots = 3 + 2 * usize::from(l.rope.is_some());
        let first = (0..=slots).collect();
        let second = vec![0, slots + 1, 2, slots];
        Some([
            (store(l), first),
            (store(LinearSpec { rope: None, ..l }), second),
        ])
    }

    /// The dtype of the output; `input` is the dtype of the first input.
    pub fn output_dtype(&self, input: DType) -> DType {
        match self {
            OpSpec::Argmax { .. } | OpSpec::Sample { .. } => DType::U32,
            OpSpec::Permute { .. }
            | OpSpec::Concat { .. }
            | OpSpec::Narrow { .. }
            | OpSpec::ScatterRows { .. } => input,
            OpSpec::Quantize { format, .. } => *format,
            OpSpec::TernaryDot { .. } => DType::I32,
            _ => DType::F32,
        }
    }

    /// Number of elements of the output.
    pub fn output_len(&self) -> usize {
        match self {
            OpSpec::Unary { len, .. } | OpSpec::Binary { len, .. } => *len,
            OpSpec::RmsNorm { rows, cols, .. }
            | OpSpec::LayerNorm { rows, cols, .. }
            | OpSpec::Softmax { rows, cols, .. } => rows * cols,
            OpSpec::Rope {
                rows,
                heads,
                head_dim,
                ..
            } => rows * heads * head_dim,
            OpSpec::Matmul(m) => m.batch * m.m * m.n,
            OpSpec::Embedding { dim, count, .. } => dim * count,
            OpSpec::Permute { in_shape, .. } => in_shape.iter().product(),
            OpSpec::Argmax { rows, .. } | OpSpec::Sample { rows, .. } => *rows,
            OpSpec::ScatterRows { rows, cols, .. } => rows * cols,
            OpSpec::NormLinearInto {
                head_dim,
                pool_rows,
                ..
            } => pool_rows * head_dim,
            OpSpec::Quantize { format, rows, cols } => {
                format.storage_len(rows * cols, *cols).unwrap_or(0)
            }
            OpSpec::Dequantize { rows, cols, .. } => rows * cols,
            OpSpec::QMatmul { m, n, .. } | OpSpec::TernaryDot { m, n, .. } => m * n,
            OpSpec::Scan {
                outer, len, inner, ..
            }
            | OpSpec::ScanGradA { outer, len, inner } => outer * len * inner,
            OpSpec::ScanGradInit { outer, inner, .. } => outer * inner,
            OpSpec::Concat {
                rows,
                a_cols,
                b_cols,
            } => rows * (a_cols + b_cols),
            OpSpec::Narrow { rows, len, .. } => rows * len,
            OpSpec::NormLinear(l) | OpSpec::SwigluLinear(l) | OpSpec::LinearResidual(l) => {
                l.m * l.n
            }
            OpSpec::PagedAttention(a) => a.t * a.heads * a.head_dim,
        }
    }
}

/// For [`OpSpec::Rope`]: the indices of the two elements of pair `i` within a head.
pub fn rope_pair(layout: RopeLayout, head_dim: usize, i: usize) -> (usize, usize) {
    match layout {
        RopeLayout::HalfSplit => (i, i + head_dim / 2),
        RopeLayout::Interleaved => (2 * i, 2 * i + 1),
    }
}

/// For [`OpSpec::Permute`]: the output shape and, per output axis, the input stride to step by.
pub fn permute_strides(in_shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut in_strides = vec![1usize; in_shape.len()];
    for d in (0..in_shape.len().saturating_sub(1)).rev() {
        in_strides[d] = in_strides[d + 1] * in_shape[d + 1];
    }
    let out_shape = perm.iter().map(|&p| in_shape[p]).collect();
    let strides = perm.iter().map(|&p| in_strides[p]).collect();
    (out_shape, strides)
}
