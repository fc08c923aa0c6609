//! A Llama-family decoder on the op set: weights placed on a device, a [`KvCache`] of the
//! keys and values seen so far, and a forward pass that returns the logits of the new tokens.
//!
//! Every op of the forward runs on the chosen backend; on the `reference` backend it is the
//! oracle the other backends' logits are tested against. A model may be split over several
//! devices ([`Llama::load_parallel`], see [`super::parallel`]); one device is the split of
//! size 1, through the same code.

mod attention;
mod decode;
mod hook;

pub use hook::{Hook, HookPoint};

use std::borrow::Cow;

use super::cache::{self, CacheLayout, CachePlan, KvCache, KvPool};
use super::files::ModelFiles;
use super::linear::{linear, ActivationMode};
use super::loader::{check_fits, name, named, Layer, Loader};
use super::sampler::Sampler;
use super::tensor_parallel::{
    shard_failed, Collective, CollectiveStats, HostCollective, Shard, TpConfig,
};
use super::weights::{keeps_packed, EMBEDDING, OUTPUT};
use super::{LlamaConfig, Tokenizer};
use webtensor::backend::{RopeLayout, SharedBytes};
use webtensor::device::Device;
use webtensor::error::{Error, Result};
use webtensor::ops;
use webtensor::tensor::Tensor;

/// Gemma 2's embedding multiplier √hidden as transformers makes it: in the dtype of the
/// hidden states, which is the checkpoint's (a bf16 or f16 checkpoint rounds it to that
/// dtype; llama.cpp, and GGUF files here, keep it in f32).
fn embedding_scale(hidden: usize, stored: super::weights::StoredDType) -> f32 {
    use super::weights::StoredDType;
    let s = (hidden as f32).sqrt();
    match stored {
        StoredDType::BF16 => half::bf16::from_f32(s).to_f32(),
        StoredDType::F16 => half::f16::from_f32(s).to_f32(),
        StoredDType::F32 | StoredDType::Packed(_) => s,
    }
}

/// A loaded model on a device.
pub struct Llama {
    /// Hyper-parameters.
    pub config: LlamaConfig,
    /// The tokenizer of the model files, if they had one.
    pub tokenizer: Option<Tokenizer>,
    layout: RopeLayout,
    /// The tensor-parallel ranks, each with its device and its part of every layer: one for a
    /// model on one device.
    ranks: Vec<Rank>,
    /// Moves the partial sums between the ranks (nothing with one rank).
    collective: Box<dyn Collective>,
    /// On rank 0's device: the embedding, the final norm and the output head.
    embed: Tensor,
    /// The multiplier of the embedding rows (Gemma 2's √hidden), if the architecture has one.
    embed_scale: Option<f32>,
    norm: Tensor,
    lm_head: Tensor,
    /// The debug hook and the points it wants; `None` costs one check per tensor.
    hook: Option<(Vec<HookPoint>, Hook)>,
    /// The files, kept (memory-mapped) when some layers are streamed from them.
    files: Option<ModelFiles>,
    /// How the linear layers treat their activations.
    activations: ActivationMode,
    /// This model among those loaded in the process (recorded decode steps are keyed by it).
    id: u64,
}

/// One tensor-parallel rank of a loaded model.
struct Rank {
    device: Device,
    shard: Shard,
    /// The rotary frequencies `[head_dim / 2]` on this device (for `dynamic` rope, those of
    /// passes within `max_position_embeddings`).
    inv_freq: Tensor,
    /// The rotary frequencies of the layers [`LlamaConfig::uses_local_rope`] picks (Gemma 3's
    /// sliding-window layers), where the model has them.
    local_inv_freq: Option<Tensor>,
    /// This rank's part of each decoder layer; `None` for layers streamed from the files on
    /// each pass.
    layers: Vec<Option<Layer>>,
}

impl Rank {
    /// (query heads, key/value heads, head width) of this rank.
    fn heads(&self, c: &LlamaConfig) -> (usize, usize, usize) {
        let size = self.shard.size;
        (
            c.num_attention_heads / size,
            c.kv_heads() / size,
            c.head_dim(),
        )
    }
}

/// What one forward pass reads besides the weights and the tokens: per rank the rows'
/// positions and the rotary frequencies, and per sequence where its keys and values go.
struct Pass<'a> {
    positions: &'a [Tensor],
    tables: Vec<Cow<'a, Tensor>>,
    plans: Vec<CachePlan>,
}

/// One sequence of a batch: its new tokens and its cache.
pub struct SequenceInput<'a> {
    /// Tokens to run after those the cache holds.
    pub tokens: &'a [u32],
    /// The sequence's cache; the new tokens' keys and values are appended.
    pub cache: &'a mut KvCache,
}

impl Llama {
    /// Places the weights of `files` on `device`: matrices in their stored dtype (f32, f16 or
    /// a GGUF block format, used packed), vectors and the embedding table as f32. Every shape
    /// is checked against the config.
    pub fn load(device: &Device, files: ModelFiles) -> Result<Llama> {
        Llama::load_streaming(device, files, usize::MAX)
    }

    /// [`Llama::load`] that calls `progress(steps done, steps in all)` as the weights reach
    /// the device: once per decoder layer, and once more when the embedding, final norm and
    /// output head are placed too. The upload is synchronous, so this is how a progress bar
    /// (or a Web Worker's progress messages) follows it.
    pub fn load_with_progress(
        device: &Device,
        files: ModelFiles,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Llama> {
        Llama::load_ranks(std::slice::from_ref(device), files, usize::MAX, progress)
    }

    /// Like [`Llama::load`], but keeps only the first `resident_layers` decoder layers on the
    /// device; the others are uploaded from the (memory-mapped) files for each forward pass
    /// and released after it, so a model larger than the device's memory still runs, slowly.
    pub fn load_streaming(
        device: &Device,
        files: ModelFiles,
        resident_layers: usize,
    ) -> Result<Llama> {
        Llama::load_ranks(
            std::slice::from_ref(device),
            files,
            resident_layers,
            &mut |_, _| {},
        )
    }

    /// Splits the model over `devices` (`tp.size` of them, rank `r` on `devices[r]`),
    /// Megatron-style: each device holds its share of the attention heads and FFN columns and
    /// the keys and values of its heads; partial sums meet in a [`HostCollective`] after the
    /// attention output and the FFN down projections (see [`super::parallel`]). The devices
    /// may be any mix: cpu, wgpu, separate logical devices of one adapter
    /// ([`webtensor::DeviceBuilder::separate`]). Errors: [`Error::TpIndivisible`] when the size
    /// does not divide the heads, key/value heads or FFN width (or cuts a block of a packed
    /// matrix), [`Error::TpDevices`] when the devices do not fit the split.
    pub fn load_parallel(devices: &[Device], files: ModelFiles, tp: TpConfig) -> Result<Llama> {
        if devices.len() != tp.size {
            return Err(Error::TpDevices {
                size: tp.size,
                reason: format!(
                    "{} devices were given; give one device per rank",
                    devices.len()
                ),
            });
        }
        tp.check(&files.config)?;
        #[cfg(target_arch = "wasm32")]
        if tp.size > 1 && devices.iter().any(|d| !d.primary().kind().is_host()) {
            return Err(Error::TpDevices {
                size: tp.size,
                reason: "the host collective reads GPU results back synchronously, which the \
                         browser does not allow; split over cpu devices only, or use one GPU"
                    .into(),
            });
        }
        Llama::load_ranks(devices, files, usize::MAX, &mut |_, _| {})
    }

    /// Loads rank `r`'s part of the weights onto `devices[r]`, the first `resident_layers`
    /// layers resident, the others streamed per pass; `progress` as in
    /// [`Llama::load_with_progress`].
    fn load_ranks(
        devices: &[Device],
        files: ModelFiles,
        resident_layers: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Llama> {
        let size = devices.len();
        let shards: Vec<Shard> = (0..size).map(|rank| Shard { rank, size }).collect();
        for (device, &shard) in devices.iter().zip(&shards) {
            check_fits(device, &files, resident_layers, shard)?;
        }
        let device = &devices[0];
        // Rank 0's loader also reads the unsplit tensors; its reads are checked for leftovers.
        let loader = Loader::for_shard(device, &files, shards[0]);
        let c = &files.config;
        // One step per layer of every rank, and one for the unsplit tensors.
        let steps = size.saturating_mul(c.num_hidden_layers).saturating_add(1);
        let mut done = 0;
        let embed_name = name(files.is_gguf, None, EMBEDDING.hf, EMBEDDING.gguf);
        let (embed_raw, embed_bytes) = loader.fetch(&embed_name, &[c.vocab_size, c.hidden_size])?;
        let embed = if keeps_packed(device) {
            // Gathered from the mapped file as stored (a packed table is a quarter of f32 or
            // less: 262 MB of TinyLlama's 1.1 GB as f32).
            let (dtype, data) = embed_raw
                .device_bytes(embed_bytes, true)
                .map_err(named(&embed_name))?;
            Tensor::from_bytes(device, dtype, data, [c.vocab_size, c.hidden_size])
        } else {
            let table = Tensor::from_vec(
                device,
                embed_raw.to_f32(embed_bytes.bytes()),
                [c.vocab_size, c.hidden_size],
            );
            // Its stored bytes are read again only as a tied output head: out of memory till
            // then.
            embed_bytes.release(embed_raw.range.clone());
            table
        }
        .map_err(named(&embed_name))?;
        let embed_scale = c
            .architecture
            .scales_embedding()
            .then(|| embedding_scale(c.hidden_size, embed_raw.dtype));
        let mut ranks = Vec::with_capacity(size);
        for (d, &shard) in devices.iter().zip(&shards) {
            let rank_loader = Loader::for_shard(d, &files, shard);
            let loader = if shard.is_first() {
                &loader
            } else {
                &rank_loader
            };
            // Grown as layers load: the count comes from a file.
            let mut layers = Vec::new();
            for i in 0..c.num_hidden_layers {
                layers.push(if i < resident_layers {
                    Some(loader.layer(i)?)
                } else {
                    // Checked now, uploaded per pass.
                    drop(loader.layer(i)?);
                    None
                });
                done += 1;
                progress(done, steps);
            }
            let hd = c.head_dim();
            let table = |rope: &super::Rope| {
                let freqs = rope.inv_freq(hd, 1, c.max_position_embeddings);
                Tensor::from_vec(d, freqs, [hd / 2])
            };
            ranks.push(Rank {
                device: d.clone(),
                shard,
                inv_freq: table(&c.rope)?,
                local_inv_freq: c.local_rope.as_ref().map(table).transpose()?,
                layers,
            });
        }
        let norm = loader.norm(
            name(
                files.is_gguf,
                None,
                "model.norm.weight",
                "output_norm.weight",
            ),
            c.hidden_size,
        )?;
        let head_name = name(files.is_gguf, None, OUTPUT.hf, OUTPUT.gguf);
        let lm_head = if c.tie_word_embeddings || !files.tensors.contains_key(&head_name) {
            // With tied embeddings transformers ignores a stored `lm_head.weight` too.
            loader.mark_used(&head_name);
            embed_raw
                .to_device(device, embed_bytes)
                .map_err(named(&embed_name))?
        } else {
            loader.matrix(head_name, [c.vocab_size, c.hidden_size])?
        };
        // llama.cpp's rope scaling tensors, read into the config's rope settings.
        for factors in [
            "rope_freqs.weight",
            "rope_factors_long.weight",
            "rope_factors_short.weight",
        ] {
            loader.mark_used(factors);
        }
        loader.check_all_used()?;
        progress(steps, steps);
        let streamed = ranks[0].layers.iter().any(Option::is_none);
        Ok(Llama {
            config: files.config.clone(),
            tokenizer: files.tokenizer.clone(),
            layout: files.rope_layout(),
            ranks,
            collective: Box::new(HostCollective::new(devices)),
            embed,
            embed_scale,
            norm,
            lm_head,
            hook: None,
            files: streamed.then_some(files),
            activations: ActivationMode::default(),
            id: decode::next_model_id(),
        })
    }

    /// Replaces the collective the ranks exchange partial sums through (made for this model's
    /// [`Llama::devices`], in rank order): a device-side one (NCCL) where there is one.
    pub fn set_collective(&mut self, collective: Box<dyn Collective>) {
        self.collective = collective;
    }

    /// The devices of the tensor-parallel ranks, rank order (one for an unsplit model).
    pub fn devices(&self) -> Vec<Device> {
        self.ranks.iter().map(|r| r.device.clone()).collect()
    }

    /// The collective's name and the time spent in it so far (zero for one device).
    pub fn collective_stats(&self) -> (&'static str, CollectiveStats) {
        (self.collective.name(), self.collective.stats())
    }

    /// Chooses how the linear layers treat their activations (default
    /// [`ActivationMode::Integer`], llama.cpp's: `Q8_0` activations for `Q8_0`/`Q4_0`
    /// weights, per-row int8 for ternary ones).
    pub fn set_activations(&mut self, mode: ActivationMode) {
        self.activations = mode;
    }

    /// The activation mode in use.
    pub fn activations(&self) -> ActivationMode {
        self.activations
    }

    /// Which product each weight dtype of this model runs, e.g. `q4_0 weights × q8_0
    /// activations, f32 weights × f32 activations` (streamed layers are described by the
    /// resident ones and the head).
    pub fn activation_path(&self) -> String {
        let layers = self.ranks[0].layers.iter().flatten();
        let dtypes = layers
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down])
            .chain([&self.lm_head])
            .map(Tensor::dtype);
        self.activations.describe(dtypes)
    }

    /// The activations of a product with `weight`: the mode's for its dtype
    /// ([`ActivationMode::for_weight`]).
    fn activations_for(&self, weight: &Tensor) -> webtensor::backend::Activations {
        self.activations.for_weight(weight.dtype())
    }

    /// Rank `rank`'s part of decoder layer `i`: resident, or uploaded now from the files.
    fn layer(&self, rank: &Rank, i: usize) -> Result<Cow<'_, Layer>> {
        if let Some(layer) = &self.ranks[rank.shard.rank].layers[i] {
            return Ok(Cow::Borrowed(layer));
        }
        let files = self
            .files
            .as_ref()
            .ok_or_else(|| Error::invalid("llama", "a streamed layer without its files"))?;
        let loader = Loader::for_shard(&rank.device, files, rank.shard);
        Ok(Cow::Owned(loader.layer(i)?))
    }

    /// Calls `hook` with each intermediate tensor of `points` on every forward pass,
    /// replacing any earlier hook. Reading a tensor in the hook (to_vec) waits for the device;
    /// hooks are for debugging. [`HookPoint::parse`] reads points by name.
    pub fn set_hook(&mut self, points: &[HookPoint], hook: Hook) {
        self.hook = Some((points.to_vec(), hook));
    }

    /// Removes the debug hook.
    pub fn clear_hook(&mut self) {
        self.hook = None;
    }

    /// Whether the hook wants `point`.
    fn wants(&self, point: HookPoint) -> bool {
        self.hook
            .as_ref()
            .is_some_and(|(points, _)| points.contains(&point))
    }

    /// `x`'s rows RMS-normed by `norm` (or as they are, without one: OLMo 2's blocks have no
    /// input norm) and multiplied by each weight of `products` (with the activations of its
    /// dtype), rotated where it carries a rotary embedding: the norm and the rotation fold
    /// into the products where the device does that (`ops::rms_norm_linears`), unless a hook
    /// wants the normed rows at `hook`, which are then made and shown to it (on the first
    /// rank).
    fn normed_products(
        &self,
        x: &Tensor,
        norm: Option<&Tensor>,
        products: &[(&Tensor, Option<ops::Rotary<'_>>)],
        (hook, index, first): (HookPoint, usize, bool),
    ) -> Result<Vec<Tensor>> {
        let eps = self.config.rms_norm_eps;
        let products: Vec<_> = products
            .iter()
            .map(|&(weight, rope)| self.norm_product(weight, rope))
            .collect();
        let Some(norm) = norm else {
            return ops::linears_of_normed(x, &products);
        };
        let norm = ops::RmsNormParams { weight: norm, eps };
        if self.wants(hook) {
            // The norm as its own op, its output shown, then the products without it (a norm
            // of weight 1 and eps 0 would not be the identity).
            let h = ops::rms_norm(x, norm.weight, eps)?;
            if first {
                self.emit(hook, index, &h);
            }
            return ops::linears_of_normed(&h, &products);
        }
        ops::rms_norm_linears(x, norm, &products)
    }

    /// A product of normed rows by `weight`, with the activations of its dtype.
    fn norm_product<'a>(
        &self,
        weight: &'a Tensor,
        rope: Option<ops::Rotary<'a>>,
    ) -> ops::NormProduct<'a> {
        ops::NormProduct {
            weight,
            activations: self.activations_for(weight),
            rope,
        }
    }

    /// The feed-forward block's `silu(gate) ⊙ up` (Gemma 2: `gelu_tanh(gate) ⊙ up`) of `x`'s
    /// rows RMS-normed by the layer's `ffn_norm` (as they are without one, OLMo 2), the norm
    /// folded in as [`Llama::normed_products`] does (one fused op where gate and up share a
    /// dtype and the gate is SiLU).
    fn normed_swiglu(
        &self,
        x: &Tensor,
        layer: &Layer,
        (index, first): (usize, bool),
    ) -> Result<Tensor> {
        let pre_norm = layer.ffn_norm.as_ref();
        let gelu = self.config.gelu_gate();
        if layer.gate.dtype() != layer.up.dtype() || gelu {
            // llama.cpp's quantizer may store the two in different formats, which the fused
            // op does not take, and it fuses only SiLU: the two normed products (the norm
            // made once), then the gate.
            let products = [(&layer.gate, None), (&layer.up, None)];
            let hook = (HookPoint::FfnNorm, index, first);
            let gate_up = self.normed_products(x, pre_norm, &products, hook)?;
            return match gelu {
                true => ops::mul(&ops::gelu(&gate_up[0])?, &gate_up[1]),
                false => ops::swiglu(&gate_up[0], &gate_up[1]),
            };
        }
        let eps = self.config.rms_norm_eps;
        let act = self.activations_for(&layer.gate);
        let Some(norm) = pre_norm else {
            return ops::swiglu_linear(x, &layer.gate, &layer.up, act);
        };
        if self.wants(HookPoint::FfnNorm) {
            let h = ops::rms_norm(x, norm, eps)?;
            if first {
                self.emit(HookPoint::FfnNorm, index, &h);
            }
            return ops::swiglu_linear(&h, &layer.gate, &layer.up, act);
        }
        let norm = ops::RmsNormParams { weight: norm, eps };
        ops::rms_norm_swiglu_linear(x, norm, &layer.gate, &layer.up, act)
    }

    /// `x · wᵀ`, plus `residual` folded into the same op when given.
    fn project(&self, x: &Tensor, w: &Tensor, residual: Option<&Tensor>) -> Result<Tensor> {
        match residual {
            Some(r) => ops::linear_residual(x, w, r, self.activations_for(w)),
            None => linear(x, w, self.activations),
        }
    }

    /// The residual stream after a block whose per-rank outputs are `partial`: those
    /// themselves when [`Llama::project`] folded the residual in, otherwise their all-reduced
    /// sum (shown to the hook at `point`), RMS-normed by each rank's `post_norm` where the
    /// norm follows the block (OLMo 2), added to `xs`.
    fn residual(
        &self,
        xs: Vec<Tensor>,
        partial: Vec<Tensor>,
        (folded, post_norm): (bool, Option<&[&Tensor]>),
        (point, layer): (HookPoint, usize),
    ) -> Result<Vec<Tensor>> {
        if folded {
            return Ok(partial);
        }
        let out = self.collective.all_reduce_sum(&partial)?;
        self.emit(point, layer, &out[0]);
        self.each_rank(|r| {
            let rank = r.shard.rank;
            match post_norm {
                Some(norms) => {
                    let normed = ops::rms_norm(&out[rank], norms[rank], self.config.rms_norm_eps)?;
                    ops::add(&xs[rank], &normed)
                }
                None => ops::add(&xs[rank], &out[rank]),
            }
        })
    }

    fn emit(&self, point: HookPoint, layer: usize, t: &Tensor) {
        if let Some((points, hook)) = &self.hook {
            if points.contains(&point) {
                hook(point, layer, t);
            }
        }
    }

    /// Fails unless every id is in the vocabulary.
    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab = self.config.vocab_size;
        match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(bad) => Err(Error::invalid(
                "llama",
                format!("token id {bad} is not below vocab_size {vocab}"),
            )),
            None => Ok(()),
        }
    }

    /// An empty cache for one sequence of up to `capacity` tokens (at most the model's
    /// context), in memory of its own: a static pool of one sequence.
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache> {
        let layout = CacheLayout::Static {
            max_batch: 1,
            max_len: capacity,
        };
        Ok(self.new_pool(layout)?.sequence())
    }

    /// Cache memory for several sequences on the model's device (split by key/value heads
    /// over the devices of a split model); each [`KvPool::sequence`] is one sequence's
    /// [`KvCache`]. See [`CacheLayout`] for static and paged pools.
    pub fn new_pool(&self, layout: CacheLayout) -> Result<KvPool> {
        KvPool::new(&self.devices(), &self.config, layout)
    }

    /// The logits of every position of `tokens`, from an empty cache: f32
    /// `[tokens.len(), vocab_size]`. The cache holds just these tokens (not the model's whole
    /// context, which for a long-context model is gigabytes); more tokens than the context is
    /// [`Error::CacheFull`].
    pub fn logits(&self, tokens: &[u32]) -> Result<Tensor> {
        let context = self.config.context_len();
        if tokens.len() > context {
            return Err(Error::CacheFull {
                capacity: context,
                len: 0,
                requested: tokens.len(),
            });
        }
        let mut cache = self.new_cache(tokens.len().max(1))?;
        self.forward(tokens, &mut cache)
    }

    /// Runs `tokens` after the ones `cache` holds and appends their keys and values: the
    /// logits of the new tokens, f32 `[tokens.len(), vocab_size]`. A prompt can be given at
    /// once or token by token with the same result. On an error the cache is left unusable
    /// for this sequence; reset it.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.forward_batch(&mut [SequenceInput { tokens, cache }])
    }

    /// One forward pass over a batch of sequences, each with its own new tokens and cache (so
    /// its own length and positions): the logits of every new token, f32
    /// `[Σ tokens, vocab_size]` in batch order. Projections and feed-forward blocks run once
    /// over all rows; attention runs per sequence over that sequence's cache.
    pub fn forward_batch(&self, batch: &mut [SequenceInput<'_>]) -> Result<Tensor> {
        let x = self.batch_hidden_states(batch)?;
        self.head(&x)
    }

    /// The last layer's residual stream of every new token of a batch, `[Σ tokens, hidden]`,
    /// the sequences' caches advanced: [`Llama::forward_batch`] without the final norm and
    /// the LM head.
    fn batch_hidden_states(&self, batch: &mut [SequenceInput<'_>]) -> Result<Tensor> {
        if batch.is_empty() {
            return Err(Error::invalid("llama", "an empty batch"));
        }
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        for seq in batch.iter() {
            let (t, cache) = (seq.tokens.len(), &seq.cache);
            if t == 0 {
                return Err(Error::invalid("llama", "a sequence has no tokens to run"));
            }
            self.check_cache(cache)?;
            cache.check_room(t)?;
            self.check_ids(seq.tokens)?;
            ids.extend_from_slice(seq.tokens);
            positions.extend(cache.len() as u32..(cache.len() + t) as u32);
        }
        let rows = ids.len();
        let ids = Tensor::from_vec(self.embed.device(), ids, [rows])?;
        let mut seqs: Vec<(usize, &mut KvCache)> = batch
            .iter_mut()
            .map(|s| (s.tokens.len(), &mut *s.cache))
            .collect();
        self.hidden_states(&ids, positions, &mut seqs)
    }

    /// The logits of each sequence's last new token, f32 `[batch, vocab_size]` in batch order
    /// (what a draw reads): [`Llama::forward_batch`] with only those rows through the final
    /// norm and the LM head. A prompt's other rows would cost a product each and
    /// `[rows, vocab]` of memory (2 GiB for 2,000 tokens and Gemma 3's 262k vocabulary).
    pub fn last_logits(&self, batch: &mut [SequenceInput<'_>]) -> Result<Tensor> {
        let x = self.batch_hidden_states(batch)?;
        let mut end = 0;
        let last_rows: Vec<u32> = batch
            .iter()
            .map(|seq| {
                end += seq.tokens.len();
                end as u32 - 1
            })
            .collect();
        let n = last_rows.len();
        let rows = Tensor::from_vec(self.embed.device(), last_rows, [n])?;
        self.head(&ops::embedding(&x, &rows)?)
    }

    /// Runs `tokens` into `cache` without computing logits: a part of a prompt that is
    /// followed by more of it (the generation loop runs long prompts in chunks, so that a
    /// stop request is answered between them). Recorded, not waited for, on a GPU.
    pub fn prefill(&self, tokens: &[u32], cache: &mut KvCache) -> Result<()> {
        self.check_cache(cache)?;
        cache.check_room(tokens.len())?;
        self.check_ids(tokens)?;
        if tokens.is_empty() {
            return Err(Error::invalid("llama", "a sequence has no tokens to run"));
        }
        let device = self.embed.device();
        let positions: Vec<u32> =
            (cache.len() as u32..(cache.len() + tokens.len()) as u32).collect();
        let ids = Tensor::from_slice(device, tokens, [tokens.len()])?;
        self.hidden_states(&ids, positions, &mut [(tokens.len(), cache)])?;
        Ok(())
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        self.embed.device()
    }

    /// Decodes `steps` tokens after `first` (the last token so far, not yet in `cache`),
    /// drawing each on the device with `sampler`'s parameters and numbers
    /// ([`ops::sample`]): each step's token stays on the device and feeds the next step's
    /// embedding, so on a GPU the `steps` forward passes are recorded into one submit and the
    /// ids are read back once. The same tokens as `steps` calls of [`Llama::sample_next`]
    /// with the same sampler.
    pub fn decode(
        &self,
        first: u32,
        cache: &mut KvCache,
        steps: usize,
        sampler: &mut Sampler,
    ) -> Result<Vec<u32>> {
        self.decode_on_device(first, cache, steps, sampler)?
            .to_vec()
    }

    /// Runs `tokens` after those `cache` holds and draws the next token on the device with
    /// `sampler`: [`Llama::next_tokens`] for one sequence.
    pub fn sample_next(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        sampler: &mut Sampler,
    ) -> Result<u32> {
        let ids = self.next_tokens(&mut [SequenceInput { tokens, cache }], sampler)?;
        ids.first()
            .copied()
            .ok_or_else(|| Error::invalid("llama", "sampling returned no token"))
    }

    /// Fails unless `cache` was made for this model's layers and devices.
    fn check_cache(&self, cache: &KvCache) -> Result<()> {
        let devices = cache.rank_devices();
        let same_devices = devices.len() == self.ranks.len()
            && devices
                .iter()
                .zip(&self.ranks)
                .all(|(d, r)| d.same(&r.device));
        if cache.layers() != self.config.num_hidden_layers || !same_devices {
            return Err(Error::invalid(
                "llama",
                "a cache belongs to another model (or to other devices); make it with this \
                 model's new_cache or new_pool",
            ));
        }
        Ok(())
    }

    /// Runs `f` for every rank in order; with several ranks an error says which one failed.
    fn each_rank<'s, T>(&'s self, mut f: impl FnMut(&'s Rank) -> Result<T>) -> Result<Vec<T>> {
        let split = self.ranks.len() > 1;
        self.ranks
            .iter()
            .map(|r| {
                f(r).map_err(|e| match e {
                    e @ Error::ShardFailed { .. } => e,
                    e if split => shard_failed(r.shard.rank, &r.device, e),
                    e => e,
                })
            })
            .collect()
    }

    /// The forward pass over `ids` (on rank 0's device) at `positions`, for sequences of the
    /// given lengths with their caches, in order, up to the last layer's residual stream,
    /// without the final norm and the LM head (a prompt chunk that samples nothing needs no
    /// more; it fills the caches).
    fn hidden_states(
        &self,
        ids: &Tensor,
        positions: Vec<u32>,
        seqs: &mut [(usize, &mut KvCache)],
    ) -> Result<Tensor> {
        let rows = positions.len();
        let devices = self.devices();
        let tables = self.each_rank(|r| self.rope_table(r, &positions))?;
        let positions = self.each_rank(|r| Tensor::from_slice(&r.device, &positions, [rows]))?;
        cache::reserve(seqs)?;
        let plans = seqs
            .iter()
            .map(|(t, cache)| CachePlan::new(&devices, cache, *t))
            .collect::<Result<Vec<_>>>()?;
        let pass = Pass {
            positions: &positions,
            tables,
            plans,
        };
        let caches: Vec<(usize, &KvCache)> = seqs.iter().map(|(t, c)| (*t, &**c)).collect();
        let x = self.layers(ids, &pass, &caches)?;
        for ((_, cache), plan) in seqs.iter_mut().zip(&pass.plans) {
            cache.advance_to(plan);
        }
        Ok(x)
    }

    /// The decoder layers over `ids` (on rank 0's device) for one pass: the last layer's
    /// residual stream. The sequences' caches get their new keys and values where `pass`
    /// says; their lengths are the caller's to advance.
    fn layers(&self, ids: &Tensor, pass: &Pass<'_>, seqs: &[(usize, &KvCache)]) -> Result<Tensor> {
        let c = &self.config;
        let x = ops::embedding(&self.embed, ids)?;
        let x = match self.embed_scale {
            Some(s) => ops::scale(&x, s)?,
            None => x,
        };
        self.emit(HookPoint::Embedding, 0, &x);
        // The residual stream, one copy per rank.
        let mut xs = self.collective.broadcast(&x)?;
        // The residual adds fold into the projections before them on a single rank (with
        // several, the add must follow the all-reduce of the partial sums), unless a hook
        // wants the projection's output alone, or a norm after the block (OLMo 2) comes
        // between the projection and the add.
        let foldable = self.ranks.len() == 1 && !c.architecture.post_norms();
        let fold_attn = foldable && !self.wants(HookPoint::AttnOut);
        let fold_ffn = foldable && !self.wants(HookPoint::FfnOut);
        for i in 0..c.num_hidden_layers {
            let layers = self.each_rank(|r| self.layer(r, i))?;
            let post = |block: usize| -> Option<Vec<&Tensor>> {
                layers
                    .iter()
                    .map(|l| l.post_norms.as_ref().map(|n| &n[block]))
                    .collect()
            };
            let (post_attn, post_ffn) = (post(0), post(1));
            let partial = self.each_rank(|r| {
                let (layer, first) = (&layers[r.shard.rank], r.shard.is_first());
                let table = match (&r.local_inv_freq, c.uses_local_rope(i)) {
                    (Some(local), true) => local,
                    _ => pass.tables[r.shard.rank].as_ref(),
                };
                let rope = (&pass.positions[r.shard.rank], table);
                let x = &xs[r.shard.rank];
                let attn = self.attention((i, r), layer, x, rope, seqs, &pass.plans)?;
                if first {
                    self.emit(HookPoint::Attention, i, &attn);
                }
                self.project(&attn, &layer.wo, fold_attn.then_some(&xs[0]))
            })?;
            let attn_end = (fold_attn, post_attn.as_deref());
            xs = self.residual(xs, partial, attn_end, (HookPoint::AttnOut, i))?;
            let partial = self.each_rank(|r| {
                let layer = &layers[r.shard.rank];
                let first = (i, r.shard.is_first());
                let act = self.normed_swiglu(&xs[r.shard.rank], layer, first)?;
                self.project(&act, &layer.down, fold_ffn.then_some(&xs[0]))
            })?;
            let ffn_end = (fold_ffn, post_ffn.as_deref());
            xs = self.residual(xs, partial, ffn_end, (HookPoint::FfnOut, i))?;
            self.emit(HookPoint::Residual, i, &xs[0]);
        }
        Ok(xs.swap_remove(0))
    }

    /// The logits of the rows of the last layer's residual stream `x`: the final norm, then
    /// the LM head.
    fn head(&self, x: &Tensor) -> Result<Tensor> {
        let x = ops::rms_norm(x, &self.norm, self.config.rms_norm_eps)?;
        self.emit(HookPoint::FinalNorm, 0, &x);
        let logits = linear(&x, &self.lm_head, self.activations)?;
        let logits = match self.config.final_logit_softcapping {
            Some(cap) => ops::softcap(&logits, cap)?,
            None => logits,
        };
        self.emit(HookPoint::Logits, 0, &logits);
        Ok(logits)
    }

    /// The rotary frequencies of a pass at `positions` on `rank`'s device: the model's
    /// table, or for `dynamic` rope a pass beyond `max_position_embeddings` (for `longrope`
    /// one beyond the original length) its own (transformers recomputes the table from the
    /// longest sequence of each call).
    fn rope_table<'a>(&self, rank: &'a Rank, positions: &[u32]) -> Result<Cow<'a, Tensor>> {
        let c = &self.config;
        let len = positions.iter().max().map_or(0, |&p| p as usize + 1);
        if len <= c.rope.fixed_up_to(c.max_position_embeddings) {
            return Ok(Cow::Borrowed(&rank.inv_freq));
        }
        let hd = c.head_dim();
        let table = c.rope.inv_freq(hd, len, c.max_position_embeddings);
        Ok(Cow::Owned(Tensor::from_vec(&rank.device, table, [hd / 2])?))
    }

    /// The next token of each sequence of a batch: one forward pass, then each sequence's
    /// last row drawn on the device with `sampler` (one number per sequence, in batch order),
    /// and only the ids read back.
    pub fn next_tokens(
        &self,
        batch: &mut [SequenceInput<'_>],
        sampler: &mut Sampler,
    ) -> Result<Vec<u32>> {
        self.next_tokens_on_device(batch, sampler)?.to_vec()
    }

    /// [`Llama::next_tokens`] without the readback: the ids, u32 `[batch]`, on the device.
    pub fn next_tokens_on_device(
        &self,
        batch: &mut [SequenceInput<'_>],
        sampler: &mut Sampler,
    ) -> Result<Tensor> {
        let logits = self.last_logits(batch)?;
        let n = logits.dims()[0];
        let numbers = Tensor::from_vec(self.embed.device(), sampler.next_uniforms(n), [n])?;
        ops::sample(&logits, &numbers, sampler.params())
    }
}
