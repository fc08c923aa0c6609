//! Choosing the next token from logits: greedy, or temperature with top-k and top-p,
//! reproducible from a seed.

use webtensor::backend::SampleParams;

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

impl Sampling {
    /// The parameters of [`webtensor::ops::sample`].
    pub fn params(&self) -> SampleParams {
        SampleParams {
            temperature: self.temperature,
            top_k: u32::try_from(self.top_k).unwrap_or(u32::MAX),
            top_p: self.top_p,
        }
    }
}

/// A sampler with its random state (SplitMix64: tiny, seedable, the same on every target). It
/// draws one number per token, whether the token is drawn on the host ([`Sampler::sample`])
/// or on the device ([`webtensor::ops::sample`] with [`Sampler::next_uniforms`]), so both give
/// the same tokens for the same seed.
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

    /// The parameters tokens are drawn with.
    pub fn params(&self) -> SampleParams {
        self.config.params()
    }

    /// The next number in `[0, 1)`: 24 random bits, so it is exact in f32.
    fn next_unit(&mut self) -> f32 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u32 << 24) as f32
    }

    /// The numbers for the next `n` tokens, for drawing them on the device.
    pub fn next_uniforms(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_unit()).collect()
    }

    /// The next token given one row of logits, drawn on the host as [`SampleParams`]
    /// defines. NaN logits are never chosen.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let u = self.next_unit();
        self.params().sample_row(logits, u)
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
