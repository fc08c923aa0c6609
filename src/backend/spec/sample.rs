//! [`OpSpec::Sample`](crate::backend::OpSpec::Sample) on the host, beside the definition of
//! [`SampleParams`]: partial selection where the reference sorts the whole row. The cpu
//! backend and the model engine's host sampler use it.

use super::SampleParams;

/// Candidates of a row: (value, index) of every non-NaN entry.
type Candidate = (f32, u32);

/// Decreasing value, then increasing index: the order the top-k and top-p rules walk.
fn descending(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

impl SampleParams {
    /// One token per row of `x` (rows of `vocab`), drawn with the row's number of `uniform`.
    pub fn sample(&self, x: &[f32], uniform: &[f32], vocab: usize) -> Vec<u32> {
        x.chunks(vocab.max(1))
            .zip(uniform)
            .map(|(row, &u)| sample_row(row, self, u))
            .collect()
    }

    /// One row of `Sample`: the token drawn from `x` with the number `u`.
    pub fn sample_row(&self, x: &[f32], u: f32) -> u32 {
        sample_row(x, self, u)
    }
}

fn sample_row(x: &[f32], params: &SampleParams, u: f32) -> u32 {
    let mut best: Option<Candidate> = None;
    for (i, &v) in x.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(b, _)| v > b) {
            best = Some((v, i as u32));
        }
    }
    let Some((max, first)) = best else {
        return 0;
    };
    if params.is_greedy() || max == f32::INFINITY {
        return first;
    }
    let t = params.temperature as f64;
    let weights: Vec<f64> = x
        .iter()
        .map(|&v| ((v as f64 - max as f64) / t).exp())
        .collect();
    let mut kept: Vec<Candidate> = x
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (v, i as u32))
        .collect();
    let mut threshold = f32::NEG_INFINITY;
    let k = params.top_k as usize;
    if k > 0 && k < kept.len() {
        kept.select_nth_unstable_by(k - 1, descending);
        threshold = kept[k - 1].0;
        kept.retain(|c| c.0 >= threshold);
    }
    if params.top_p < 1.0 {
        threshold = top_p_threshold(&mut kept, &weights, params.top_p);
    }
    draw(x, &weights, threshold, u).unwrap_or(first)
}

/// The smallest value of the shortest decreasing-order prefix of `kept` whose weights reach
/// `top_p` of their sum. Sorts only as long a prefix as needed, growing it fourfold.
fn top_p_threshold(kept: &mut [Candidate], weights: &[f64], top_p: f32) -> f32 {
    let total: f64 = kept.iter().map(|c| weights[c.1 as usize]).sum();
    let goal = top_p.max(0.0) as f64 * total;
    let mut len = 64;
    loop {
        let whole = len >= kept.len();
        let prefix = if whole {
            kept.sort_unstable_by(descending);
            &kept[..]
        } else {
            kept.select_nth_unstable_by(len - 1, descending);
            kept[..len].sort_unstable_by(descending);
            &kept[..len]
        };
        let mut sum = 0.0;
        for c in prefix {
            sum += weights[c.1 as usize];
            if sum >= goal {
                return c.0;
            }
        }
        if whole {
            return prefix.last().map_or(f32::NEG_INFINITY, |c| c.0);
        }
        len *= 4;
    }
}

/// The first index, in index order, of the entries `≥ threshold` whose running weight sum
/// exceeds `u ·` their total; the last such entry if rounding leaves none; `None` if none.
fn draw(x: &[f32], weights: &[f64], threshold: f32, u: f32) -> Option<u32> {
    let kept = || (0..x.len()).filter(|&i| x[i] >= threshold);
    let total: f64 = kept().map(|i| weights[i]).sum();
    let target = u as f64 * total;
    let mut sum = 0.0;
    let mut last = None;
    for i in kept() {
        sum += weights[i];
        if sum > target {
            return Some(i as u32);
        }
        last = Some(i as u32);
    }
    last
}
