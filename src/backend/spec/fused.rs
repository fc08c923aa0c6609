//! Sizes of the fused decode ops ([`OpSpec::NormLinear`], [`OpSpec::SwigluLinear`],
//! [`OpSpec::LinearResidual`], [`OpSpec::PagedAttention`]): each does in one op what the engine
//! did with several, so a backend with a kernel for it reads its inputs once and writes one
//! output.
//!
//! [`OpSpec::NormLinear`]: super::OpSpec::NormLinear
//! [`OpSpec::SwigluLinear`]: super::OpSpec::SwigluLinear
//! [`OpSpec::LinearResidual`]: super::OpSpec::LinearResidual
//! [`OpSpec::PagedAttention`]: super::OpSpec::PagedAttention

use super::{Activations, MatmulSpec, RopeLayout};
use crate::dtype::DType;

/// A linear layer's product `act(a) · wᵀ` inside a fused op: `a` f32 `[m, k]`, each weight
/// of `format` `[n, k]`; with `norm`, `a` is first RMS-normed (the layer's input norm).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearSpec {
    /// Weight format: `F32`, `F16` or a block format.
    pub format: DType,
    /// Treatment of the activations ([`Activations::F32`] for `F32` and `F16` weights; the
    /// integer modes for block formats only; never [`Activations::F16`]).
    pub activations: Activations,
    /// Rows of `a` and of the output.
    pub m: usize,
    /// Rows of each weight: columns of the output.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// The RMS norm applied to each row of `a` before the product, its weight f32 `[k]` the
    /// op's last input: the decode products fold in the norm that feeds them, so the normed
    /// activations never exist as a tensor of their own.
    pub norm: Option<PreNorm>,
    /// Rotary position embedding applied to the output (the q and k projections, rotated
    /// before they are stored): [`super::OpSpec::NormLinear`] only.
    pub rope: Option<RopeEpilogue>,
}

/// The rotary embedding a fused product applies to its output `[m, n]`, seen as
/// `[m, n / head_dim, head_dim]`, as [`super::OpSpec::Rope`] defines it; the op's last two
/// inputs are the positions u32 `[m]` and the frequencies f32 `[head_dim / 2]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeEpilogue {
    /// Elements per head (even, dividing `n`).
    pub head_dim: usize,
    /// How the elements of a head pair up.
    pub layout: RopeLayout,
}

/// An RMS norm inside a fused product: each row `x` of the activations becomes
/// `x / sqrt(mean(x²) + eps) ⊙ weight`, as [`super::OpSpec::RmsNorm`] defines it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreNorm {
    /// Added to the mean square.
    pub eps: f32,
}

impl LinearSpec {
    /// Elements of one weight.
    pub fn weight_len(&self) -> usize {
        self.n * self.k
    }

    /// The product `x · Wᵀ` for an `F32` weight, as the plain matmul it is.
    pub fn f32_product(&self) -> MatmulSpec {
        MatmulSpec {
            batch: 1,
            m: self.m,
            n: self.n,
            k: self.k,
            rhs_transposed: true,
            rhs_batched: false,
        }
    }
}

/// Sizes of causal grouped-query attention over keys and values read in place from a paged
/// cache pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    /// New queries (the last `t` positions of the sequence).
    pub t: usize,
    /// Keys the sequence has, the new ones included (`t ≤ n ≤ stride`).
    pub n: usize,
    /// Columns of the row table (`[kv_heads, stride]`): head `g`'s key `j` is at pool row
    /// `rows[g · stride + j]`. A sequence's table can so outlast its length: decode steps
    /// read one table of the cache's capacity while `n` grows.
    pub stride: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`; query head `h` reads key/value head
    /// `h / (heads / kv_heads)`).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Rows of each pool tensor (`[pool_rows, head_dim]`).
    pub pool_rows: usize,
    /// Multiplies every score `q · k` before the softmax.
    pub scale: f32,
    /// Sliding window: query at position `p` sees keys at `p − window < j ≤ p`; `None` for
    /// full causal attention.
    pub window: Option<usize>,
    /// Soft-capping of the scaled scores before the softmax (Gemma 2's
    /// `attn_logit_softcapping`): each becomes `cap · tanh(score / cap)`; `None` for none.
    pub softcap: Option<f32>,
}

impl AttentionSpec {
    /// A scaled score `q · k · scale` as the softmax takes it: soft-capped where
    /// [`AttentionSpec::softcap`] says so.
    pub fn capped(&self, score: f64) -> f64 {
        match self.softcap {
            Some(cap) => cap as f64 * (score / cap as f64).tanh(),
            None => score,
        }
    }

    /// The first and one-past-last key query `i` (`0 ≤ i < t`) sees: its causal prefix,
    /// cut to its window.
    pub fn visible(&self, i: usize) -> (usize, usize) {
        let end = self.n - self.t + i + 1;
        let start = self.window.map_or(0, |w| end.saturating_sub(w));
        (start, end)
    }
}
