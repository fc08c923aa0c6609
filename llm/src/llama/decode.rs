//! Decoding: steps of one token each, drawn on the device, the drawn id fed to the next step
//! without a readback.
//!
//! Every step reads its inputs (the token, its position, its cache rows, the sampler's number)
//! from memory the sequence keeps on the device ([`DecodeState`]), written in place before the
//! step. So every step binds the same memory, and where the backend records work (wgpu) the
//! first step is captured as it runs and each later step replays it
//! ([`webtensor::backend::CapturedStep`]): the host sets a pipeline, a bind group and a grid per
//! kernel and builds nothing else. Other backends, and steps a replay cannot stand for (a
//! debug hook, several ranks, a rope table that changes with the length), run the ops.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Llama, Pass};
use crate::cache::{self, DecodeState, KvCache, Recorded};
use crate::sampler::Sampler;
use webtensor::backend::SampleParams;
use webtensor::dtype::DType;
use webtensor::error::{Error, Result};
use webtensor::ops;
use webtensor::tensor::Tensor;

/// A number no other model loaded in this process has: recorded steps are keyed by it.
pub(super) fn next_model_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Llama {
    /// [`Llama::decode`] without the readback: the ids, u32 `[steps]`, still on the device
    /// (recorded, not yet run, on a GPU). In the browser, read them with
    /// `Tensor::to_vec_async`.
    pub fn decode_on_device(
        &self,
        first: u32,
        cache: &mut KvCache,
        steps: usize,
        sampler: &mut Sampler,
    ) -> Result<Tensor> {
        self.check_ids(&[first])?;
        self.check_cache(cache)?;
        let mut state = self.decode_state(cache)?;
        let written = state.token.write(&[first]);
        cache.put_decode_state(state);
        written?;
        self.decode_steps(cache, steps, sampler)
    }

    /// [`Llama::decode_on_device`] after the last id of `previous`, the u32 ids of a decode
    /// still on the device (not empty): the next batch of steps can be recorded before the
    /// previous one has run or been read back, so a GPU runs one while the host records the
    /// other.
    pub fn decode_on_device_after(
        &self,
        previous: &Tensor,
        cache: &mut KvCache,
        steps: usize,
        sampler: &mut Sampler,
    ) -> Result<Tensor> {
        let n = match previous.dims() {
            [n] if *n > 0 && previous.dtype() == DType::U32 => *n,
            _ => {
                return Err(Error::invalid(
                    "llama",
                    "decode_on_device_after needs the u32 [n > 0] ids of a decode",
                ))
            }
        };
        self.check_cache(cache)?;
        let mut state = self.decode_state(cache)?;
        let copied = state.token.copy_from(0, previous, n - 1, 1);
        cache.put_decode_state(state);
        copied?;
        self.decode_steps(cache, steps, sampler)
    }

    /// The sequence's decode state, taken out of `cache` (put it back), made on first use.
    fn decode_state(&self, cache: &mut KvCache) -> Result<Box<DecodeState>> {
        match cache.take_decode_state() {
            Some(state) => Ok(state),
            None => Ok(Box::new(DecodeState::new(&self.devices(), cache)?)),
        }
    }

    /// `steps` decode steps after the token the decode state holds: their ids, u32
    /// `[steps]`, on the device.
    fn decode_steps(
        &self,
        cache: &mut KvCache,
        steps: usize,
        sampler: &mut Sampler,
    ) -> Result<Tensor> {
        cache.check_room(steps)?;
        let device = self.embed.device();
        let mut ids = Tensor::from_vec(device, vec![0u32; steps], [steps])?;
        if steps == 0 {
            return Ok(ids);
        }
        let params = sampler.params();
        for (step, u) in sampler.next_uniforms(steps).into_iter().enumerate() {
            let mut state = self.decode_state(cache)?;
            let drawn = self.decode_step(cache, &mut state, u, params);
            let fed = drawn.and_then(|next| {
                state.token.copy_from(0, &next, 0, 1)?;
                ids.copy_from(step, &next, 0, 1)
            });
            cache.put_decode_state(state);
            fed?;
        }
        Ok(ids)
    }

    /// One decode step: the id drawn after the state's token, on the device (in memory the
    /// next step overwrites), its key and value appended to `cache`.
    fn decode_step(
        &self,
        cache: &mut KvCache,
        state: &mut DecodeState,
        u: f32,
        params: SampleParams,
    ) -> Result<Tensor> {
        cache::reserve(&mut [(1, &mut *cache)])?;
        state.prepare(cache, u)?;
        let keys = cache.len() + 1;
        let key = self.step_key(params);
        let replayable = self.replays_steps(keys);
        let recorded = state.recorded.as_ref().filter(|r| r.key == key);
        let next = match (replayable, recorded) {
            (
                true,
                Some(Recorded {
                    step: Some((step, next)),
                    ..
                }),
            ) => {
                self.device().replay(step, keys)?;
                next.clone()
            }
            // Recorded once per key: a step the backend could not record runs as ops.
            (true, None) => {
                let (next, step) = self
                    .device()
                    .capture(|| self.step_ops(cache, state, params))?;
                let step = step.map(|s| (s, next.clone()));
                state.recorded = Some(Recorded { key, step });
                next
            }
            _ => self.step_ops(cache, state, params)?,
        };
        cache.advance(1);
        Ok(next)
    }

    /// The decode step as ops: the forward pass of the state's token at the cache's next
    /// position, then its draw with the state's number.
    fn step_ops(
        &self,
        cache: &KvCache,
        state: &DecodeState,
        params: SampleParams,
    ) -> Result<Tensor> {
        let p = cache.len() as u32;
        let tables = self.each_rank(|r| self.rope_table(r, &[p]))?;
        let pass = Pass {
            positions: state.positions(),
            tables,
            plans: vec![state.plan(cache)],
        };
        let x = self.layers(&state.token, &pass, &[(1, cache)])?;
        let logits = self.head(&x)?;
        ops::sample(&logits, &state.uniform, params)
    }

    /// Whether a recorded step can stand for a step that ends with `keys` keys: one rank, no
    /// hook (which wants to see each step's tensors), a rotary table that does not change with
    /// the length.
    fn replays_steps(&self, keys: usize) -> bool {
        let c = &self.config;
        let fixed_rope = keys <= c.rope.fixed_up_to(c.max_position_embeddings);
        self.ranks.len() == 1 && self.hook.is_none() && fixed_rope
    }

    /// What a recorded step depends on besides the decode state: the model, the sampling
    /// parameters and the activations.
    fn step_key(&self, params: SampleParams) -> u64 {
        let mut h = DefaultHasher::new();
        self.id.hash(&mut h);
        params.temperature.to_bits().hash(&mut h);
        params.top_k.hash(&mut h);
        params.top_p.to_bits().hash(&mut h);
        format!("{:?}", self.activations).hash(&mut h);
        h.finish()
    }
}
