//! The fused decode ops: products of RMS-normed activations with the norm folded in, a
//! feed-forward block's gate·up·SiLU as one product, a product with the residual added, and
//! attention over a paged KV cache read in place. On a backend with their kernels each is one
//! op; elsewhere (see [`crate::backend::OpKind::FUSED`]) each runs as the composition of
//! existing ops written once here, on the same backend.

use super::{dispatch, expect_dtype, expect_finite};
use crate::backend::{
    Activations, AttentionSpec, LinearSpec, OpSpec, PreNorm, RopeEpilogue, RopeLayout,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// A score no query may attend: after the softmax's max is subtracted its exponential is
/// exactly 0 in f32, and unlike −∞ it never meets another infinity.
const HIDDEN: f32 = -1e30;

/// `silu(x · gateᵀ) ⊙ (x · upᵀ)` for activations `x` `[..., k]` and two weights `[n, k]` of
/// the same dtype (f32, f16 or a block format): f32 `[..., n]`, a SwiGLU feed-forward block's
/// input to its down projection. `activations` is how `x` enters both products, rounded once
/// for the two: [`Activations::F32`] for any weight, `Q8_0` or `I8` for block formats.
/// Equals `swiglu(linear(x, gate), linear(x, up))` up to the f32 rounding of the two products
/// ([`OpSpec::SwigluLinear`]).
pub fn swiglu_linear(
    x: &Tensor,
    gate: &Tensor,
    up: &Tensor,
    activations: Activations,
) -> Result<Tensor> {
    swiglu(x, None, gate, up, activations)
}

/// The RMS norm that feeds a group of products (a layer's input norm): its weight f32 `[k]`
/// and `eps`, as [`super::rms_norm`] takes them.
#[derive(Clone, Copy, Debug)]
pub struct RmsNormParams<'a> {
    /// The per-column weight, f32 `[k]`.
    pub weight: &'a Tensor,
    /// Added to the mean square.
    pub eps: f32,
}

/// One product of [`rms_norm_linears`]: a weight `[n, k]` (as [`swiglu_linear`] takes its
/// weights), the activations it takes, and optionally the rotary embedding of its output.
#[derive(Clone, Copy, Debug)]
pub struct NormProduct<'a> {
    /// The weight `[n, k]`.
    pub weight: &'a Tensor,
    /// How the normed activations enter the product.
    pub activations: Activations,
    /// Rotate the output `[rows, n]` as `[rows, n / head_dim, head_dim]` (q and k).
    pub rope: Option<Rotary<'a>>,
}

/// A rotary position embedding as [`super::rope`] takes it, applied to a product's output.
#[derive(Clone, Copy, Debug)]
pub struct Rotary<'a> {
    /// u32 `[rows]`: each row's position.
    pub positions: &'a Tensor,
    /// f32 `[head_dim / 2]`: the rotary frequencies.
    pub inv_freq: &'a Tensor,
    /// Elements per head.
    pub head_dim: usize,
    /// How the elements of a head pair up.
    pub layout: RopeLayout,
}

/// `act(rms_norm(x)) · wᵀ` for each product of `products`, its output rotated where it asks:
/// a layer's input norm and the projections that read it (q, k and v). Where the device's
/// kernels fold the norm and the rotation into each product ([`OpSpec::NormLinear`]; wgpu's
/// decode products) the normed rows never exist as a tensor and neither costs a dispatch of
/// its own; elsewhere the norm runs once, then the products, then `rope`. Equals that
/// composition up to the f32 rounding of the normed rows.
pub fn rms_norm_linears(
    x: &Tensor,
    norm: RmsNormParams<'_>,
    products: &[NormProduct<'_>],
) -> Result<Vec<Tensor>> {
    const OP: &str = "rms_norm_linear";
    let specs = norm_linear_specs(x, norm, products)?;
    if !fuses(x, &specs) {
        let h = super::rms_norm(x, norm.weight, norm.eps)?;
        return linears_of_normed(&h, products);
    }
    specs
        .into_iter()
        .zip(products)
        .map(|((spec, out_shape), p)| {
            let inputs = norm_linear_inputs(x, norm, p);
            dispatch(OP, spec, &inputs, out_shape, DType::F32, None)
        })
        .collect()
}

/// The inputs of [`OpSpec::NormLinear`] in its order: `x`, the weight, the norm's weight,
/// then with a rope its positions and frequencies.
fn norm_linear_inputs<'a>(
    x: &'a Tensor,
    norm: RmsNormParams<'a>,
    p: &NormProduct<'a>,
) -> Vec<&'a Tensor> {
    let mut inputs = vec![x, p.weight, norm.weight];
    if let Some(r) = &p.rope {
        inputs.extend([r.positions, r.inv_freq]);
    }
    inputs
}

/// The [`OpSpec::NormLinear`] of each product, with its output shape.
fn norm_linear_specs(
    x: &Tensor,
    norm: RmsNormParams<'_>,
    products: &[NormProduct<'_>],
) -> Result<Vec<(OpSpec, Shape)>> {
    const OP: &str = "rms_norm_linear";
    super::norm::check(OP, x, &[("norm weight", norm.weight)], norm.eps)?;
    products
        .iter()
        .map(|p| {
            let (mut l, out_shape) = linear_spec(OP, x, p.weight, p.activations)?;
            l.norm = Some(PreNorm { eps: norm.eps });
            l.rope = p.rope.map(|r| RopeEpilogue {
                head_dim: r.head_dim,
                layout: r.layout,
            });
            Ok((OpSpec::NormLinear(l), out_shape))
        })
        .collect()
}

/// Whether `x`'s device runs every one of `specs` as one op.
fn fuses(x: &Tensor, specs: &[(OpSpec, Shape)]) -> bool {
    x.shape().last_dim() > 0
        && specs
            .iter()
            .all(|(spec, _)| x.device().primary_fuses(spec, x.dtype()))
}

/// Whether the device folds the norm (and rope) into each of `products` of `x`
/// ([`rms_norm_linears`]): then [`rms_norm_linear_into`] stores each as one op too (unless its
/// pool exceeds one binding), and the engine has the new keys and values stored that way;
/// elsewhere it runs the norm once for q, k and v. Arguments that do not fit answer false.
pub fn folds_rms_norm_linears(
    x: &Tensor,
    norm: RmsNormParams<'_>,
    products: &[NormProduct<'_>],
) -> bool {
    norm_linear_specs(x, norm, products).is_ok_and(|specs| fuses(x, &specs))
}

/// Writes `act(rms_norm(x)) · wᵀ` of `product` (rotated where it asks), `[rows, n]` seen as
/// `[rows, n / head_dim, head_dim]`, into `pool` f32 `[pool_rows, head_dim]` in place, in
/// heads-first order: head `g` of row `i` over pool row `slots[g · rows + i]` (u32
/// `[rows · n / head_dim]`; a slot `≥ pool_rows` computed on a device writes nothing, one
/// known on the host is an error). A decode step's new keys or values stored by the product
/// that makes them where the device folds it ([`OpSpec::NormLinearInto`]); elsewhere
/// [`rms_norm_linears`], the heads-first transpose and [`super::scatter_rows`].
pub fn rms_norm_linear_into(
    pool: &mut Tensor,
    slots: &Tensor,
    x: &Tensor,
    norm: RmsNormParams<'_>,
    product: NormProduct<'_>,
) -> Result<()> {
    let (l, head_dim, pool_rows) = store_sizes(pool, slots, x, norm, &product)?;
    let spec = OpSpec::NormLinearInto {
        l,
        head_dim,
        pool_rows,
        paired: false,
    };
    if !pool.device().primary_fuses(&spec, DType::F32) || l.k == 0 || l.m == 0 {
        let y = rms_norm_linears(x, norm, &[product])?.remove(0);
        let (rows, heads) = (l.m, l.n / head_dim);
        let heads_first = match rows {
            1 => y.reshape([heads, head_dim])?,
            _ => ops::transpose(&y.reshape([rows, heads, head_dim])?, 0, 1)?
                .reshape([heads * rows, head_dim])?,
        };
        return super::scatter_rows(pool, slots, &heads_first);
    }
    let mut inputs = norm_linear_inputs(x, norm, &product);
    inputs.push(slots);
    super::dispatch_in_place(OP_INTO, spec, &mut [pool], &inputs)
}

/// [`rms_norm_linear_into`] of a layer's key product `k` into `keys` and its value product
/// `v` into `values`, at the same `slots`: one op where the device folds the pair (its
/// kernels read both weights in one product and store into both pools: on wgpu's GPU shapes
/// where the weights and the pools were each allocated together, `Tensor::from_bytes_group`
/// and `Tensor::zeros_group`). The pair folds only where `k` and `v` differ in nothing but
/// their weights and `k`'s rope, and the pools have one shape; otherwise, and on devices
/// that do not fold it, the two stores run one after the other.
pub fn rms_norm_linears_into(
    (keys, values): (&mut Tensor, &mut Tensor),
    slots: &Tensor,
    x: &Tensor,
    norm: RmsNormParams<'_>,
    [k, v]: [NormProduct<'_>; 2],
) -> Result<()> {
    let (l, head_dim, pool_rows) = store_sizes(keys, slots, x, norm, &k)?;
    let (lv, ..) = store_sizes(values, slots, x, norm, &v)?;
    let alike = LinearSpec { rope: l.rope, ..lv } == l
        && v.rope.is_none()
        && keys.shape() == values.shape();
    let paired = OpSpec::NormLinearInto {
        l,
        head_dim,
        pool_rows,
        paired: true,
    };
    if !alike || !keys.device().primary_fuses(&paired, DType::F32) || l.k == 0 || l.m == 0 {
        rms_norm_linear_into(keys, slots, x, norm, k)?;
        return rms_norm_linear_into(values, slots, x, norm, v);
    }
    let mut inputs = norm_linear_inputs(x, norm, &k);
    inputs.extend([slots, v.weight]);
    super::dispatch_in_place(OP_INTO, paired, &mut [keys, values], &inputs)
}

/// The name the pool stores report errors under.
const OP_INTO: &str = "rms_norm_linear_into";

/// Checks one pool store's arguments ([`rms_norm_linear_into`]): the sizes of its
/// [`OpSpec::NormLinearInto`], the product's spec, `head_dim` and `pool_rows`.
fn store_sizes(
    pool: &Tensor,
    slots: &Tensor,
    x: &Tensor,
    norm: RmsNormParams<'_>,
    product: &NormProduct<'_>,
) -> Result<(LinearSpec, usize, usize)> {
    expect_dtype(OP_INTO, "pool", pool, DType::F32)?;
    let [(OpSpec::NormLinear(l), _)] = norm_linear_specs(x, norm, &[*product])?[..] else {
        return Err(Error::invalid(OP_INTO, "one product's spec expected"));
    };
    let &[pool_rows, head_dim] = pool.dims() else {
        return Err(Error::shape(
            OP_INTO,
            "the pool must be [pool_rows, head_dim]",
            &[pool.shape()],
        ));
    };
    let rows = x.shape().rows();
    if head_dim == 0 || l.n % head_dim != 0 || slots.dims() != [rows * (l.n / head_dim)] {
        return Err(Error::shape(
            OP_INTO,
            "the pool's head_dim must divide the product's n, and `slots` hold one pool row per \
             head of each row of `x`",
            &[
                x.shape(),
                product.weight.shape(),
                pool.shape(),
                slots.shape(),
            ],
        ));
    }
    if let Some(bound) = slots.index_bound() {
        if bound as usize > pool_rows {
            return Err(Error::invalid(
                OP_INTO,
                format!(
                    "slot {} is out of range for {pool_rows} pool rows",
                    bound - 1
                ),
            ));
        }
    }
    Ok((l, head_dim, pool_rows))
}

/// What [`rms_norm_linears`] does after its norm: each product of the normed rows `h`,
/// rotated where it asks (for a caller that needs `h` itself too).
pub fn linears_of_normed(h: &Tensor, products: &[NormProduct<'_>]) -> Result<Vec<Tensor>> {
    products
        .iter()
        .map(|p| {
            let y = product(h, p.weight, p.activations)?;
            match p.rope {
                Some(r) => rotate(&y, r),
                None => Ok(y),
            }
        })
        .collect()
}

/// `y` `[rows, n]` rotated as `[rows, n / head_dim, head_dim]` by `r`.
fn rotate(y: &Tensor, r: Rotary<'_>) -> Result<Tensor> {
    let (rows, n) = (y.shape().rows(), y.shape().last_dim());
    if r.head_dim == 0 || n % r.head_dim != 0 {
        return Err(Error::shape(
            "rms_norm_linear",
            format!(
                "the rotary head_dim {} must divide the product's n",
                r.head_dim
            ),
            &[y.shape()],
        ));
    }
    let heads = y.reshape([rows, n / r.head_dim, r.head_dim])?;
    super::rope(&heads, r.positions, r.inv_freq, r.layout)?.reshape(y.shape().clone())
}

/// [`swiglu_linear`] of `rms_norm(x)`: a layer's input norm folded into its feed-forward
/// block's gate and up products where the device's kernels do that (see
/// [`rms_norm_linears`]); elsewhere the norm, then [`swiglu_linear`].
pub fn rms_norm_swiglu_linear(
    x: &Tensor,
    norm: RmsNormParams<'_>,
    gate: &Tensor,
    up: &Tensor,
    activations: Activations,
) -> Result<Tensor> {
    super::norm::check(
        "swiglu_linear",
        x,
        &[("norm weight", norm.weight)],
        norm.eps,
    )?;
    swiglu(x, Some(norm), gate, up, activations)
}

/// [`swiglu_linear`], with `x` RMS-normed first when `norm` is given.
fn swiglu(
    x: &Tensor,
    norm: Option<RmsNormParams<'_>>,
    gate: &Tensor,
    up: &Tensor,
    activations: Activations,
) -> Result<Tensor> {
    const OP: &str = "swiglu_linear";
    if gate.dtype() != up.dtype() || gate.shape() != up.shape() {
        return Err(Error::shape(
            OP,
            format!(
                "`gate` and `up` must have the same dtype and shape ({} and {})",
                gate.dtype(),
                up.dtype()
            ),
            &[gate.shape(), up.shape()],
        ));
    }
    let (mut l, out_shape) = linear_spec(OP, x, gate, activations)?;
    l.norm = norm.map(|n| PreNorm { eps: n.eps });
    let spec = OpSpec::SwigluLinear(l);
    if !x.device().primary_fuses(&spec, x.dtype()) || l.k == 0 {
        // The norm once, then the fused op without it (or its own composition).
        if let Some(n) = norm {
            let h = super::rms_norm(x, n.weight, n.eps)?;
            return swiglu(&h, None, gate, up, activations);
        }
        return ops::swiglu(
            &product(x, gate, activations)?,
            &product(x, up, activations)?,
        );
    }
    match norm {
        Some(n) => dispatch(
            OP,
            spec,
            &[x, gate, up, n.weight],
            out_shape,
            DType::F32,
            None,
        ),
        None => dispatch(OP, spec, &[x, gate, up], out_shape, DType::F32, None),
    }
}

/// `residual + x · wᵀ` for activations `x` `[..., k]`, a weight `w` `[n, k]` (f32, f16 or a
/// block format) and `residual` f32 of the output's shape `[..., n]`: a projection followed
/// by its residual connection, as a new tensor. `activations` as in [`swiglu_linear`].
/// Equals `add(residual, linear(x, w))` up to the f32 rounding of the product
/// ([`OpSpec::LinearResidual`]).
pub fn linear_residual(
    x: &Tensor,
    w: &Tensor,
    residual: &Tensor,
    activations: Activations,
) -> Result<Tensor> {
    const OP: &str = "linear_residual";
    let (l, out_shape) = linear_spec(OP, x, w, activations)?;
    expect_dtype(OP, "residual", residual, DType::F32)?;
    if residual.shape() != &out_shape {
        return Err(Error::shape(
            OP,
            "`residual` must have the product's shape [..., n]",
            &[x.shape(), w.shape(), residual.shape()],
        ));
    }
    let spec = OpSpec::LinearResidual(l);
    if !x.device().primary_fuses(&spec, x.dtype()) || l.k == 0 {
        return ops::add(residual, &product(x, w, activations)?);
    }
    dispatch(OP, spec, &[x, w, residual], out_shape, DType::F32, None)
}

/// The unfused product `x · wᵀ`: what the fused ops equal, and their composition.
fn product(x: &Tensor, w: &Tensor, activations: Activations) -> Result<Tensor> {
    match activations {
        Activations::F32 => ops::matmul_t(x, w),
        act => ops::qmatmul_t(x, w, act),
    }
}

/// Checks `x` `[..., k]` against a weight `w` `[n, k]` and `activations`; the spec and the
/// output shape `[..., n]`.
fn linear_spec(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    activations: Activations,
) -> Result<(LinearSpec, Shape)> {
    expect_dtype(op, "x", x, DType::F32)?;
    let format = w.dtype();
    if !(format == DType::F32 || crate::quant::is_weight_format(format)) {
        return Err(Error::invalid(
            op,
            format!("the weight must be f32, f16, bf16 or a block format, not {format}"),
        ));
    }
    let fits = match activations {
        Activations::F32 => true,
        Activations::F16 => false,
        Activations::Q8_0 | Activations::I8 => super::quant::int_weights(format),
        Activations::Q8_K => crate::quant::kquants::is_super_block(format),
    };
    if !fits {
        return Err(Error::invalid(
            op,
            format!(
                "{activations:?} activations do not go with {format} weights: use f32 \
                 activations, q8_0 / i8 ones with q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl or \
                 ternary weights, or q8_k ones with the K-quants and iq4_xs"
            ),
        ));
    }
    if x.shape().rank() < 1 || w.shape().rank() != 2 || x.shape().last_dim() != w.dims()[1] {
        return Err(Error::shape(
            op,
            "`x` must be [..., k] and the weight one [n, k] matrix",
            &[x.shape(), w.shape()],
        ));
    }
    let (n, k) = (w.dims()[0], w.dims()[1]);
    if format.is_quantized() && !k.is_multiple_of(format.block_len()) {
        return Err(Error::shape(
            op,
            format!(
                "k must be a multiple of {format}'s block of {}",
                format.block_len()
            ),
            &[x.shape(), w.shape()],
        ));
    }
    let mut out_dims = x.dims()[..x.shape().rank() - 1].to_vec();
    out_dims.push(n);
    let spec = LinearSpec {
        format,
        activations,
        m: x.shape().rows(),
        n,
        k,
        norm: None,
        rope: None,
    };
    Ok((spec, Shape::from(out_dims)))
}

/// Causal grouped-query attention of `t` new queries over a sequence's `n` keys and values,
/// read in place from a KV pool: `q` f32 `[t, heads · head_dim]` (already rotated), `keys`
/// and `values` f32 `[pool_rows, head_dim]` (a pool's tensors), `rows` u32
/// `[kv_heads, columns]` with `n ≤ columns` (the pool row of each key of each key/value head,
/// in sequence order; only the first `n` columns are read, so one table of a cache's capacity
/// serves every length). Query `i` is the
/// sequence's position `n − t + i` and sees the keys up to it (`softmax_causal`'s
/// convention), only the last `window` of them with a sliding window. Scores are
/// `scale · q·k`, soft-capped as `cap · tanh(score / cap)` when `softcap` is given. Output f32
/// `[t, heads · head_dim]`; see [`OpSpec::PagedAttention`].
pub fn paged_attention(
    q: &Tensor,
    (keys, values): (&Tensor, &Tensor),
    (rows, n): (&Tensor, usize),
    heads: usize,
    scale: f32,
    (window, softcap): (Option<usize>, Option<f32>),
) -> Result<Tensor> {
    const OP: &str = "paged_attention";
    expect_dtype(OP, "q", q, DType::F32)?;
    expect_dtype(OP, "keys", keys, DType::F32)?;
    expect_dtype(OP, "values", values, DType::F32)?;
    expect_dtype(OP, "rows", rows, DType::U32)?;
    expect_finite(OP, "scale", scale)?;
    if let Some(cap) = softcap {
        expect_finite(OP, "softcap", cap)?;
        if cap == 0.0 {
            return Err(Error::invalid(OP, "a soft-cap of 0 divides by zero"));
        }
    }
    let shapes = [q.shape(), keys.shape(), values.shape(), rows.shape()];
    if keys.shape().rank() != 2 || keys.shape() != values.shape() || rows.shape().rank() != 2 {
        return Err(Error::shape(
            OP,
            "`keys` and `values` must be one [pool_rows, head_dim] shape, `rows` [kv_heads, ≥ n]",
            &shapes,
        ));
    }
    let (pool_rows, head_dim) = (keys.dims()[0], keys.dims()[1]);
    let (kv_heads, stride) = (rows.dims()[0], rows.dims()[1]);
    if q.shape().rank() != 2 || heads == 0 || q.dims()[1] != heads * head_dim {
        return Err(Error::shape(
            OP,
            format!("`q` must be [t, heads · head_dim] = [t, {heads} · {head_dim}]"),
            &shapes,
        ));
    }
    let spec = AttentionSpec {
        t: q.dims()[0],
        n,
        stride,
        heads,
        kv_heads,
        head_dim,
        pool_rows,
        scale,
        window,
        softcap,
    };
    let op = OpSpec::PagedAttention(spec);
    // The sizes the op cannot mean (t > n, kv_heads not dividing heads, an empty window).
    op.inputs()?;
    let out_shape = Shape::from([spec.t, heads * head_dim]);
    if spec.t == 0 || head_dim == 0 {
        return Tensor::zeros(q.device(), out_shape);
    }
    if !q.device().primary_fuses(&op, DType::F32) {
        return attention_composed(q, (keys, values), rows, &spec);
    }
    dispatch(
        OP,
        op,
        &[q, keys, values, rows],
        out_shape,
        DType::F32,
        None,
    )
}

/// [`paged_attention`] from existing ops: the keys and values gathered
/// (`embedding`), only the window's tail of them kept, `matmul_t`, `scale`, `softcap` where
/// the scores are capped, an additive mask
/// when queries of one pass see different windows, `softmax_causal`, `matmul`.
fn attention_composed(
    q: &Tensor,
    (keys, values): (&Tensor, &Tensor),
    rows: &Tensor,
    s: &AttentionSpec,
) -> Result<Tensor> {
    let (t, hd, kv) = (s.t, s.head_dim, s.kv_heads);
    let group = s.heads / kv;
    // The first n columns of the table, one head after another.
    let rows = if s.stride == s.n {
        rows.clone()
    } else {
        ops::narrow(rows, 1, 0, s.n)?
    };
    let flat = rows.reshape([kv * s.n])?;
    let gather = |pool: &Tensor| ops::embedding(pool, &flat)?.reshape([kv, s.n, hd]);
    let (k, v) = (gather(keys)?, gather(values)?);
    // Query i sees keys from visible(i).0 on; the first query's window starts earliest.
    let start = s.visible(0).0;
    let kept = s.n - start;
    let (k, v) = if start > 0 {
        (
            ops::narrow(&k, 1, start, kept)?,
            ops::narrow(&v, 1, start, kept)?,
        )
    } else {
        (k, v)
    };
    // `[a, b, hd]` as `[b, a, hd]`: a reshape when either is 1 (one query), else a copy.
    let swap = |x: &Tensor, a: usize, b: usize| -> Result<Tensor> {
        if a == 1 || b == 1 {
            x.reshape([b, a, hd])
        } else {
            ops::transpose(&x.reshape([a, b, hd])?, 0, 1)
        }
    };
    // Heads of one key/value group are consecutive: [kv, group · t, hd] against [kv, n, hd].
    let q = swap(q, t, s.heads)?.reshape([kv, group * t, hd])?;
    let scores = ops::scale(&ops::matmul_t(&q, &k)?, s.scale)?;
    let scores = match s.softcap {
        Some(cap) => ops::softcap(&scores, cap)?,
        None => scores,
    };
    let scores = scores.reshape([s.heads, t, kept])?;
    let scores = match window_mask(s, start, kept) {
        Some(mask) => ops::add(&scores, &Tensor::from_vec(q.device(), mask, [t, kept])?)?,
        None => scores,
    };
    let probs = ops::softmax_causal(&scores)?;
    let out = ops::matmul(&probs.reshape([kv, group * t, kept])?, &v)?;
    swap(&out, s.heads, t)?.reshape([t, s.heads * hd])
}

/// The additive mask `[t, kept]` (0 or [`HIDDEN`]) over keys `start..n` that hides from each
/// query the keys before its window; `None` when no kept key is hidden from any query (the
/// causal part is the softmax's).
fn window_mask(s: &AttentionSpec, start: usize, kept: usize) -> Option<Vec<f32>> {
    if (0..s.t).all(|i| s.visible(i).0 <= start) {
        return None;
    }
    let mut mask = vec![0f32; s.t * kept];
    for (i, row) in mask.chunks_mut(kept).enumerate() {
        let first = s.visible(i).0;
        for (j, m) in row.iter_mut().enumerate() {
            if start + j < first {
                *m = HIDDEN;
            }
        }
    }
    Some(mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    fn zeros(d: &Device, shape: &[usize]) -> Tensor {
        Tensor::zeros(d, Shape::from(shape.to_vec())).unwrap()
    }

    #[test]
    fn linear_arguments_that_do_not_fit_are_typed_errors() {
        let d = Device::reference();
        let x = zeros(&d, &[2, 32]);
        let w = zeros(&d, &[3, 32]);
        let q8 = ops::quantize(&w, DType::Q8_0).unwrap();
        // Weights of different dtypes or shapes.
        assert!(swiglu_linear(&x, &w, &q8, Activations::F32).is_err());
        assert!(swiglu_linear(&x, &w, &zeros(&d, &[4, 32]), Activations::F32).is_err());
        // Integer activations need block weights; f16 activations are not a fused mode.
        assert!(swiglu_linear(&x, &w, &w, Activations::Q8_0).is_err());
        assert!(swiglu_linear(&x, &q8, &q8, Activations::F16).is_err());
        // k mismatch, and a residual of the wrong shape.
        assert!(linear_residual(
            &zeros(&d, &[2, 31]),
            &w,
            &zeros(&d, &[2, 3]),
            Activations::F32
        )
        .is_err());
        assert!(linear_residual(&x, &w, &zeros(&d, &[2, 4]), Activations::F32).is_err());
        assert!(linear_residual(&x, &q8, &zeros(&d, &[2, 3]), Activations::Q8_0).is_ok());
        assert!(swiglu_linear(&x, &q8, &q8, Activations::Q8_0).is_ok());
    }

    #[test]
    fn pool_stores_that_do_not_fit_are_typed_errors() {
        let d = Device::reference();
        let x = zeros(&d, &[1, 32]);
        let w = ops::quantize(&zeros(&d, &[8, 32]), DType::Q8_0).unwrap();
        let nw = zeros(&d, &[32]);
        let norm = RmsNormParams {
            weight: &nw,
            eps: 1e-5,
        };
        let product = NormProduct {
            weight: &w,
            activations: Activations::Q8_0,
            rope: None,
        };
        let slots = Tensor::from_vec(&d, vec![0u32, 1], [2]).unwrap();
        let far = Tensor::from_vec(&d, vec![0u32, 9], [2]).unwrap();
        let (mut keys, mut values) = (zeros(&d, &[6, 4]), zeros(&d, &[6, 4]));
        let stores = |keys: &mut Tensor, values: &mut Tensor, slots: &Tensor| {
            rms_norm_linears_into((keys, values), slots, &x, norm, [product; 2])
        };
        assert!(stores(&mut keys, &mut values, &slots).is_ok());
        // A value pool of another width; a slot past the pools.
        assert!(stores(&mut keys, &mut zeros(&d, &[6, 3]), &slots).is_err());
        assert!(stores(&mut keys, &mut values, &far).is_err());
        // Pools of other rows than the slots name are fine.
        assert!(stores(&mut keys, &mut zeros(&d, &[9, 4]), &slots).is_ok());
    }

    #[test]
    fn attention_arguments_that_do_not_fit_are_typed_errors() {
        let d = Device::reference();
        let pool = zeros(&d, &[8, 4]);
        let rows = |kv: usize, n: usize| Tensor::from_vec(&d, vec![0u32; kv * n], [kv, n]).unwrap();
        let q = |t: usize, heads: usize| zeros(&d, &[t, heads * 4]);
        let run = |q: &Tensor, rows: &Tensor, heads: usize, window: Option<usize>| {
            paged_attention(
                q,
                (&pool, &pool),
                (rows, rows.dims()[1]),
                heads,
                0.5,
                (window, None),
            )
        };
        assert!(run(&q(2, 4), &rows(2, 3), 4, None).is_ok());
        // More new queries than keys; kv heads not dividing heads; an empty window.
        assert!(run(&q(4, 4), &rows(2, 3), 4, None).is_err());
        assert!(run(&q(1, 3), &rows(2, 3), 3, None).is_err());
        assert!(run(&q(1, 4), &rows(2, 3), 4, Some(0)).is_err());
        // q not [t, heads · head_dim]; rows not u32; a scale that is not finite.
        assert!(run(&q(1, 4), &rows(2, 3), 3, None).is_err());
        let float_rows = zeros(&d, &[2, 3]);
        assert!(run(&q(1, 4), &float_rows, 4, None).is_err());
        let nan = paged_attention(
            &q(1, 4),
            (&pool, &pool),
            (&rows(2, 3), 3),
            4,
            f32::NAN,
            (None, None),
        );
        assert!(nan.is_err());
        // More keys than the table has columns; fewer are fine.
        assert!(paged_attention(
            &q(1, 4),
            (&pool, &pool),
            (&rows(2, 3), 4),
            4,
            0.5,
            (None, None)
        )
        .is_err());
        assert!(paged_attention(
            &q(1, 4),
            (&pool, &pool),
            (&rows(2, 3), 2),
            4,
            0.5,
            (None, None)
        )
        .is_ok());
        // Pools of different shapes.
        let other = zeros(&d, &[8, 5]);
        let other = paged_attention(
            &q(1, 4),
            (&pool, &other),
            (&rows(2, 3), 3),
            4,
            0.5,
            (None, None),
        );
        assert!(other.is_err());
    }
}
