//! One layer's attention over the KV cache, for the heads of one tensor-parallel rank (all of
//! them on a single device).

use super::{HookPoint, Layer, Llama, Rank};
use crate::arch::QkNorm;
use crate::cache::{CachePlan, KvCache};
use webtensor::error::{Error, Result};
use webtensor::ops;
use webtensor::tensor::Tensor;

impl Llama {
    /// Causal grouped-query attention of one layer for the new rows `x` `[rows, hidden]` of
    /// every sequence of the batch (the residual stream: the layer's `attn_norm` is applied
    /// here, folded into the q, k and v products where the device does that), each over its
    /// cached keys and values plus its own (which are appended to its cache), for the heads of
    /// `rank`: `[rows, q_dim / tp]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        (index, rank): (usize, &Rank),
        layer: &Layer,
        x: &Tensor,
        (positions, inv_freq): (&Tensor, &Tensor),
        seqs: &[(usize, &KvCache)],
        plans: &[CachePlan],
    ) -> Result<Tensor> {
        let c = &self.config;
        let rows = x.dims()[0];
        let (heads, kv, hd) = rank.heads(c);
        let hook = (HookPoint::AttnNorm, index, rank.shard.is_first());
        // The products of q and k are final unless a bias or a q/k norm comes after them.
        let direct = layer.biases.is_none() && layer.qk_norms.is_none();
        // Layers SmolLM3 marks in `no_rope_layers` attend without the rotation.
        let uses_rope = c.uses_rope(index);
        // q and k rotated by their products (folded into them where the device does that)
        // where they are final.
        let rotary = (direct && uses_rope).then_some(ops::Rotary {
            positions,
            inv_freq,
            head_dim: hd,
            layout: self.layout,
        });
        let factor = c.attention_scale();
        let mask = (c.window(index), c.attn_logit_softcapping);
        let kv_products = [
            self.norm_product(&layer.wk, rotary),
            self.norm_product(&layer.wv, None),
        ];
        // One sequence whose new k and v nothing else reads: where the device folds the norm
        // and rope into their products, the products store their rows straight into the
        // pools (both in one op where the device pairs them).
        let watched = [HookPoint::AttnNorm, HookPoint::K, HookPoint::V];
        if let ([(_, cache)], [plan], true, Some(weight)) = (seqs, plans, direct, &layer.attn_norm)
        {
            let norm = ops::RmsNormParams {
                weight,
                eps: c.rms_norm_eps,
            };
            if !watched.iter().any(|&p| self.wants(p))
                && ops::folds_rms_norm_linears(x, norm, &kv_products)
            {
                let q_product = self.norm_product(&layer.wq, rotary);
                let q = ops::rms_norm_linears(x, norm, &[q_product])?.remove(0);
                if rank.shard.is_first() {
                    self.emit(HookPoint::Q, index, &q.reshape([rows, heads, hd])?);
                }
                let store = |keys: &mut Tensor, values: &mut Tensor, slots: &Tensor| {
                    ops::rms_norm_linears_into((keys, values), slots, x, norm, kv_products)
                };
                return plan.store_and_attend(
                    cache,
                    (rank.shard.rank, index),
                    store,
                    |pool, rows| ops::paged_attention(&q, pool, rows, heads, factor, mask),
                );
            }
        }
        let products = [(&layer.wq, rotary), (&layer.wk, rotary), (&layer.wv, None)];
        let pre_norm = layer.attn_norm.as_ref();
        let mut qkv = self.normed_products(x, pre_norm, &products, hook)?;
        if let Some(biases) = &layer.biases {
            for (y, b) in qkv.iter_mut().zip(biases.iter()) {
                *y = ops::add(y, b)?;
            }
        }
        let [q, k, v]: [Tensor; 3] = qkv
            .try_into()
            .map_err(|_| Error::invalid("llama", "three projections expected"))?;
        // The RMS norm of q and k before the rotation: over each head (Qwen3) or over the
        // whole projection (OLMo 2, whose one rank holds every head).
        let (q, k) = match &layer.qk_norms {
            Some([qn, kn]) => {
                let norm = |x: &Tensor, w: &Tensor, n: usize| -> Result<Tensor> {
                    let width = match c.architecture.qk_norm() {
                        QkNorm::PerHead => hd,
                        QkNorm::Whole | QkNorm::None => n * hd,
                    };
                    let groups = x.reshape([rows * n * hd / width, width])?;
                    ops::rms_norm(&groups, w, c.rms_norm_eps)?.reshape([rows, n * hd])
                };
                (norm(&q, qn, heads)?, norm(&k, kn, kv)?)
            }
            None => (q, k),
        };
        let q = q.reshape([rows, heads, hd])?;
        let k = k.reshape([rows, kv, hd])?;
        let v = v.reshape([rows, kv, hd])?;
        let (q, k) = if uses_rope && rotary.is_none() {
            (
                ops::rope(&q, positions, inv_freq, self.layout)?,
                ops::rope(&k, positions, inv_freq, self.layout)?,
            )
        } else {
            (q, k)
        };
        if rank.shard.is_first() {
            self.emit(HookPoint::Q, index, &q);
            self.emit(HookPoint::K, index, &k);
            self.emit(HookPoint::V, index, &v);
        }
        let single = seqs.len() == 1;
        let mut out: Option<Tensor> = None;
        let mut first = 0;
        for ((t, cache), plan) in seqs.iter().zip(plans) {
            let t = *t;
            let rows_of = |x: &Tensor| {
                if single {
                    Ok(x.clone())
                } else {
                    ops::narrow(x, 0, first, t)
                }
            };
            let (q, k, v) = (rows_of(&q)?, rows_of(&k)?, rows_of(&v)?);
            // k, v `[t, kv, hd]` in the pool's head-major order `[kv, t, hd]` (one token's
            // are already in it).
            let heads_first = |x: &Tensor| match t {
                1 => x.reshape([kv, 1, hd]),
                _ => ops::transpose(x, 0, 1),
            };
            let (k, v) = (heads_first(&k)?, heads_first(&v)?);
            let q = q.reshape([t, heads * hd])?;
            let o =
                plan.write_and_attend(cache, (rank.shard.rank, index), (&k, &v), |pool, rows| {
                    ops::paged_attention(&q, pool, rows, heads, factor, mask)
                })?;
            out = Some(match out {
                None => o,
                Some(prev) => ops::concat(&prev, &o, 0)?,
            });
            first += t;
        }
        out.ok_or_else(|| Error::invalid("llama", "an empty batch"))
    }
}
