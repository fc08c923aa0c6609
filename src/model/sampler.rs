//! Choosing the next token from logits: greedy, or temperature with top-k and top-p,
//! reproducible from a seed.

/// How to pick tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 for greedy (argmax); otherwise logits are divided by it before the softmax.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Seed of the random choices.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::greedy()
    }
}

impl Sampling {
    /// Always the most likely token.
    pub fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// A sampler with its random state (SplitMix64: tiny, seedable, the same on every target).
pub struct Sampler {
    config: Sampling,
    state: u64,
}

impl Sampler {
    /// A sampler seeded from `config.seed`.
    pub fn new(config: Sampling) -> Sampler {
        Sampler {
            config,
            state: config.seed,
        }
    }

    fn next_unit(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token given one row of logits. NaN logits are never chosen.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let c = self.config;
        let best = || {
            logits
                .iter()
                .enumerate()
                .filter(|(_, v)| !v.is_nan())
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(i, _)| i as u32)
        };
        if c.temperature <= 0.0 || !c.temperature.is_finite() {
            return best();
        }
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if c.top_k > 0 {
            order.truncate(c.top_k);
        }
        let Some(&top) = order.first() else { return 0 };
        let max = logits[top] as f64;
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i] as f64 - max) / c.temperature as f64).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut keep = order.len();
        if c.top_p < 1.0 {
            let mut acc = 0.0;
            for (n, w) in weights.iter().enumerate() {
                acc += w / total;
                if acc >= c.top_p as f64 {
                    keep = n + 1;
                    break;
                }
            }
        }
        let kept: f64 = weights[..keep].iter().sum();
        let mut r = self.next_unit() * kept;
        for (n, w) in weights[..keep].iter().enumerate() {
            r -= w;
            if r <= 0.0 {
                return order[n] as u32;
            }
        }
        order[keep - 1] as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_top_k_and_seeds() {
        let logits = [0.1, 3.0, f32::NAN, 2.9, -1.0];
        assert_eq!(Sampler::new(Sampling::greedy()).sample(&logits), 1);
        let k1 = Sampling {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
            seed: 5,
        };
        assert_eq!(Sampler::new(k1).sample(&logits), 1);
        let warm = Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            seed: 7,
        };
        let run = |s: Sampling| {
            let mut sampler = Sampler::new(s);
            (0..50).map(|_| sampler.sample(&logits)).collect::<Vec<_>>()
        };
        let a = run(warm);
        assert_eq!(a, run(warm), "the same seed gives the same tokens");
        assert!(
            a.iter().all(|&t| t == 1 || t == 3),
            "top-p 0.9 keeps the two likely tokens"
        );
        assert!(a.contains(&1) && a.contains(&3));
    }
}
