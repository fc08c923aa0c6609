//! Sliding-window attention (Mistral, Phi-3, Qwen2 with `use_sliding_window`): query `i`
//! sees key `j` when `j ≤ i` and `i − j < window`, as transformers' sliding-window mask.

use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;

/// A score that no query may attend: after the softmax's max is subtracted its exponential is
/// exactly 0 in f32, and unlike −∞ it never meets another infinity.
const HIDDEN: f32 = -1e30;

/// The keys and values `[kv_heads, n, hd]` that the last `t` queries of a sequence of `n` can
/// see within `window`: the tail they need (a decode step's window is exactly its keys), and,
/// when queries of one pass see different windows, an additive mask `[t, n']` (0 or
/// [`HIDDEN`]) for the scores, which still go through the causal softmax.
pub(crate) fn keys_in_window(
    k: &Tensor,
    v: &Tensor,
    t: usize,
    window: Option<usize>,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let n = k.dims()[1];
    let Some(w) = window.filter(|&w| n > w) else {
        return Ok((k.clone(), v.clone(), None));
    };
    // Query i (0-based among the new t) is at position n − t + i and sees keys from
    // n − t + i − w + 1 on; the first query's window starts earliest.
    let start = (n + 1).saturating_sub(t + w);
    let kept = n - start;
    let (k, v) = (
        ops::narrow(k, 1, start, kept)?,
        ops::narrow(v, 1, start, kept)?,
    );
    if t == 1 {
        return Ok((k, v, None));
    }
    let mut mask = vec![0f32; t * kept];
    for (i, row) in mask.chunks_mut(kept).enumerate() {
        let first_visible = (n - t + i + 1).saturating_sub(w);
        for (j, m) in row.iter_mut().enumerate() {
            if start + j < first_visible {
                *m = HIDDEN;
            }
        }
    }
    let mask = Tensor::from_vec(k.device(), mask, [t, kept])?;
    Ok((k, v, Some(mask)))
}
