//! Weights of a model on a device, read by name from its files for each [`Architecture`]:
//! Hugging Face or GGUF names, fused Phi-3 projections split at load (by row ranges of the
//! stored bytes, so packed block formats split too), Qwen2's biases, Qwen3's and OLMo 2's q/k
//! norms, OLMo 2's norms after each block. Every tensor of the files must be used: one left
//! over is an error that names it.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

use super::arch::QkNorm;
use super::files::{FileBytes, ModelFiles};
use super::tensor_parallel::Shard;
use super::weights::{
    keeps_bf16, keeps_packed, loaded_bytes, outside_layers_bytes, RawTensor, StoredDType,
    LAYER_PREFIX,
};
use webtensor::device::Device;
use webtensor::error::{Error, Result};
use webtensor::shape::Shape;
use webtensor::tensor::Tensor;

/// One decoder layer's weights.
#[derive(Clone)]
pub(crate) struct Layer {
    /// The RMS norm weight of the attention block's input (none in OLMo 2).
    pub attn_norm: Option<Tensor>,
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    /// q, k, v biases (Qwen2, or `attention_bias`).
    pub biases: Option<[Tensor; 3]>,
    /// RMS norm weights of q and of k: over each head (Qwen3, Gemma 3), `[head_dim]`, or over the
    /// whole projection (OLMo 2), `[q_dim]` and `[kv_dim]` ([`QkNorm`]).
    pub qk_norms: Option<[Tensor; 2]>,
    pub wo: Tensor,
    /// The RMS norm weight of the feed-forward block's input (none in OLMo 2).
    pub ffn_norm: Option<Tensor>,
    /// The RMS norm weights of the attention and the feed-forward blocks' outputs, before the
    /// residual add (OLMo 2, Gemma 2 and 3:
    /// [`Architecture::post_norms`](super::arch::Architecture::post_norms)).
    pub post_norms: Option<[Tensor; 2]>,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

/// Reads checked tensors of `files` onto `device`, remembering which it read.
pub(crate) struct Loader<'a> {
    pub device: &'a Device,
    pub files: &'a ModelFiles,
    /// The part of each split tensor this loader reads (all of it on one device).
    shard: Shard,
    used: RefCell<BTreeSet<String>>,
}

/// Weight names: Hugging Face's or GGUF's.
pub(crate) fn name(gguf: bool, layer: Option<usize>, hf: &str, gg: &str) -> String {
    match (layer, gguf) {
        (Some(i), false) => format!("{}{i}.{hf}", LAYER_PREFIX.hf),
        (Some(i), true) => format!("{}{i}.{gg}", LAYER_PREFIX.gguf),
        (None, false) => hf.to_string(),
        (None, true) => gg.to_string(),
    }
}

impl<'a> Loader<'a> {
    /// A loader of one tensor-parallel rank's part of each layer (of all of it, for a model
    /// on one device).
    pub fn for_shard(device: &'a Device, files: &'a ModelFiles, shard: Shard) -> Loader<'a> {
        Loader {
            device,
            files,
            shard,
            used: RefCell::new(BTreeSet::new()),
        }
    }

    /// A tensor with the shape the config needs and its file, or an error naming it.
    pub fn fetch(&self, n: &str, shape: &[usize]) -> Result<(&'a RawTensor, &'a Arc<FileBytes>)> {
        let (t, bytes) = self.files.get(n)?;
        if t.shape != shape {
            return Err(Error::model_file(
                self.files.names.join(", "),
                format!(
                    "tensor `{n}` has shape {:?}; the config needs {shape:?}",
                    t.shape
                ),
            ));
        }
        self.used.borrow_mut().insert(n.to_string());
        Ok((t, bytes))
    }

    /// Marks a tensor as used elsewhere (the config read it), if the files have it.
    pub fn mark_used(&self, n: &str) {
        if self.files.tensors.contains_key(n) {
            self.used.borrow_mut().insert(n.to_string());
        }
    }

    pub fn matrix(&self, n: String, shape: [usize; 2]) -> Result<Tensor> {
        let (t, bytes) = self.fetch(&n, &shape)?;
        t.to_device(self.device, bytes).map_err(named(&n))
    }

    /// An RMS norm's weight as the engine applies it: `1 + w` where a Hugging Face checkpoint
    /// stores Gemma's `w` ([`Architecture::norm_plus_one`](super::arch::Architecture)), in
    /// f32 as transformers adds it; as stored otherwise.
    pub fn norm(&self, n: String, len: usize) -> Result<Tensor> {
        let c = &self.files.config;
        if !c.architecture.norm_plus_one() || self.files.is_gguf {
            return self.vector(n, len);
        }
        let (t, bytes) = self.fetch(&n, &[len])?;
        let values = t
            .to_f32(bytes.bytes())
            .into_iter()
            .map(|w| 1.0 + w)
            .collect();
        Tensor::from_vec(self.device, values, [len]).map_err(named(&n))
    }

    pub fn vector(&self, n: String, len: usize) -> Result<Tensor> {
        let (t, bytes) = self.fetch(&n, &[len])?;
        Tensor::from_vec(self.device, t.to_f32(bytes.bytes()), [len]).map_err(named(&n))
    }

    /// This rank's part of a vector split like the rows of its matrix.
    fn vector_part(&self, n: String, len: usize) -> Result<Tensor> {
        let (t, bytes) = self.fetch(&n, &[len])?;
        let part = self.shard.range(len);
        let values = t.to_f32(bytes.bytes())[part.clone()].to_vec();
        Tensor::from_vec(self.device, values, [part.len()]).map_err(named(&n))
    }

    /// This rank's rows of a `[rows, cols]` matrix (Megatron's column split: the rank's
    /// output features).
    fn matrix_rows(&self, n: String, shape: [usize; 2]) -> Result<Tensor> {
        Ok(self.split(n, &[shape[0]], shape[1])?.remove(0))
    }

    /// This rank's columns of a `[rows, cols]` matrix (Megatron's row split: the rank's input
    /// features), copied row by row from the file; a packed format must not be cut inside a
    /// block.
    fn matrix_cols(&self, n: String, shape: [usize; 2]) -> Result<Tensor> {
        if self.shard.size == 1 {
            return self.matrix(n, shape);
        }
        let (rows, cols) = (shape[0], shape[1]);
        let (t, bytes) = self.fetch(&n, &shape)?;
        let part = self.shard.range(cols);
        let (unit_cols, unit_bytes) = match t.dtype {
            StoredDType::Packed(d) => (d.block_len(), d.block_bytes()),
            other => (1, other.bytes_per_value()),
        };
        if !part.start.is_multiple_of(unit_cols) || !part.len().is_multiple_of(unit_cols) {
            return Err(Error::TpIndivisible {
                size: self.shard.size,
                what: format!(
                    "columns of `{n}` in {} blocks of {unit_cols} (a rank's part must be whole \
                     blocks)",
                    t.dtype
                ),
                count: cols,
            });
        }
        let row_bytes = t.range.len() / rows.max(1);
        let (from, to) = (
            part.start / unit_cols * unit_bytes,
            part.end / unit_cols * unit_bytes,
        );
        let data = &bytes.bytes()[t.range.clone()];
        let mut out = Vec::with_capacity(rows * (to - from));
        for row in data.chunks_exact(row_bytes.max(1)) {
            out.extend_from_slice(&row[from..to]);
        }
        let raw = RawTensor {
            dtype: t.dtype,
            shape: vec![rows, part.len()],
            range: 0..out.len(),
        };
        raw.to_device(self.device, &Arc::new(FileBytes::Owned(out)))
            .map_err(named(&n))
    }

    /// A fused matrix `[Σ rows, cols]` split into consecutive row blocks of `rows`; of each
    /// block this rank's part of its rows, uploaded in the stored dtype.
    fn split(&self, n: String, rows: &[usize], cols: usize) -> Result<Vec<Tensor>> {
        let total = rows.iter().sum();
        let (t, bytes) = self.fetch(&n, &[total, cols])?;
        let row_bytes = t.range.len() / total.max(1);
        let mut start = t.range.start;
        rows.iter()
            .map(|&r| {
                let mine: Range<usize> = self.shard.range(r);
                let part = RawTensor {
                    dtype: t.dtype,
                    shape: vec![mine.len(), cols],
                    range: start + mine.start * row_bytes..start + mine.end * row_bytes,
                };
                start += r * row_bytes;
                part.to_device(self.device, bytes).map_err(named(&n))
            })
            .collect()
    }

    /// The `matrices` (name, shape) on one device, uploaded together
    /// ([`Tensor::from_bytes_group`]) when the model is not split and they have one dtype:
    /// the backend may then read them as one (a layer's gate and up weights).
    fn matrices_grouped(&self, matrices: &[(String, [usize; 2])]) -> Result<Vec<Tensor>> {
        let raw = matrices
            .iter()
            .map(|(n, shape)| self.fetch(n, shape))
            .collect::<Result<Vec<_>>>()?;
        let one_dtype = raw.windows(2).all(|w| w[0].0.dtype == w[1].0.dtype);
        if self.shard.size > 1 || !one_dtype {
            return matrices
                .iter()
                .map(|(n, shape)| self.matrix_rows(n.clone(), *shape))
                .collect();
        }
        let parts = raw
            .iter()
            .zip(matrices)
            .map(|((t, bytes), (n, shape))| {
                let (dtype, data) = t
                    .device_bytes(bytes, keeps_bf16(self.device, shape))
                    .map_err(named(n))?;
                Ok((dtype, data, Shape::from(shape.to_vec())))
            })
            .collect::<Result<_>>()?;
        let names: Vec<&str> = matrices.iter().map(|(n, _)| n.as_str()).collect();
        Tensor::from_bytes_group(self.device, parts).map_err(named(&names.join(", ")))
    }

    /// Decoder layer `i` of the config's architecture.
    pub fn layer(&self, i: usize) -> Result<Layer> {
        let c = &self.files.config;
        let gguf = self.files.is_gguf;
        let n = |hf: &str, gg: &str| name(gguf, Some(i), hf, gg);
        let (d, f, q, kv) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.kv_dim());
        let arch = c.architecture;
        let (wq, wk, wv) = if arch.fused_projections() {
            let [wq, wk, wv]: [Tensor; 3] = self
                .split(
                    n("self_attn.qkv_proj.weight", "attn_qkv.weight"),
                    &[q, kv, kv],
                    d,
                )?
                .try_into()
                .map_err(|_| Error::invalid("llama", "qkv split into the wrong count"))?;
            (wq, wk, wv)
        } else {
            // k and v together: the backend may store both products in one op
            // (`ops::rms_norm_linears_into`).
            let [wk, wv]: [Tensor; 2] = self
                .matrices_grouped(&[
                    (n("self_attn.k_proj.weight", "attn_k.weight"), [kv, d]),
                    (n("self_attn.v_proj.weight", "attn_v.weight"), [kv, d]),
                ])?
                .try_into()
                .map_err(|_| Error::invalid("llama", "k and v came back as the wrong count"))?;
            let wq = self.matrix_rows(n("self_attn.q_proj.weight", "attn_q.weight"), [q, d])?;
            (wq, wk, wv)
        };
        let (gate, up) = if arch.fused_projections() {
            let [gate, up]: [Tensor; 2] = self
                .split(n("mlp.gate_up_proj.weight", "ffn_up.weight"), &[f, f], d)?
                .try_into()
                .map_err(|_| Error::invalid("llama", "gate/up split into the wrong count"))?;
            (gate, up)
        } else {
            let [gate, up]: [Tensor; 2] = self
                .matrices_grouped(&[
                    (n("mlp.gate_proj.weight", "ffn_gate.weight"), [f, d]),
                    (n("mlp.up_proj.weight", "ffn_up.weight"), [f, d]),
                ])?
                .try_into()
                .map_err(|_| Error::invalid("llama", "gate and up came back as the wrong count"))?;
            (gate, up)
        };
        let biases = if c.attention_bias {
            Some([
                self.vector_part(n("self_attn.q_proj.bias", "attn_q.bias"), q)?,
                self.vector_part(n("self_attn.k_proj.bias", "attn_k.bias"), kv)?,
                self.vector_part(n("self_attn.v_proj.bias", "attn_v.bias"), kv)?,
            ])
        } else {
            None
        };
        let qk_sizes = match arch.qk_norm() {
            QkNorm::None => None,
            QkNorm::PerHead => Some((c.head_dim(), c.head_dim())),
            QkNorm::Whole => Some((q, kv)),
        };
        let qk_norms = match qk_sizes {
            Some((q_len, k_len)) => Some([
                self.norm(n("self_attn.q_norm.weight", "attn_q_norm.weight"), q_len)?,
                self.norm(n("self_attn.k_norm.weight", "attn_k_norm.weight"), k_len)?,
            ]),
            None => None,
        };
        // Before the feed-forward block: Gemma names it `pre_feedforward_layernorm`, as its
        // `post_attention_layernorm` follows the attention block.
        let ffn_pre = match arch.post_norms() {
            true => "pre_feedforward_layernorm.weight",
            false => "post_attention_layernorm.weight",
        };
        let pre_norms = match arch.pre_norms() {
            true => Some([
                self.norm(n("input_layernorm.weight", "attn_norm.weight"), d)?,
                self.norm(n(ffn_pre, "ffn_norm.weight"), d)?,
            ]),
            false => None,
        };
        let [attn_norm, ffn_norm] = pre_norms.map_or([None, None], |[a, f]| [Some(a), Some(f)]);
        let post_norms = match arch.post_norms() {
            true => Some([
                self.norm(
                    n(
                        "post_attention_layernorm.weight",
                        "post_attention_norm.weight",
                    ),
                    d,
                )?,
                self.norm(
                    n("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
                    d,
                )?,
            ]),
            false => None,
        };
        // Old transformers checkpoints saved the rotary table as a buffer; transformers
        // recomputes it from the config, and so does the engine.
        self.mark_used(&n("self_attn.rotary_emb.inv_freq", "-"));
        Ok(Layer {
            attn_norm,
            wq,
            wk,
            wv,
            biases,
            qk_norms,
            wo: self.matrix_cols(n("self_attn.o_proj.weight", "attn_output.weight"), [d, q])?,
            ffn_norm,
            post_norms,
            gate,
            up,
            down: self.matrix_cols(n("mlp.down_proj.weight", "ffn_down.weight"), [d, f])?,
        })
    }

    /// Fails, naming it, if a tensor of the files was not read: a weight the engine would
    /// leave unused (a bias, an extra norm) means it would compute something else.
    pub fn check_all_used(&self) -> Result<()> {
        let used = self.used.borrow();
        match self.files.tensors.keys().find(|k| !used.contains(*k)) {
            Some(extra) => Err(Error::model_file(
                self.files.names.join(", "),
                format!(
                    "the tensor `{extra}` would be left unused by the {} forward pass webtensor \
                     implements (is the config's architecture or `attention_bias` right?)",
                    self.files.config.architecture.class_name()
                ),
            )),
            None => Ok(()),
        }
    }
}

/// Names the tensor in the error its upload hit when the buffer is beyond a device limit.
pub(crate) fn named(tensor: &str) -> impl FnOnce(Error) -> Error + '_ {
    move |e| match e {
        Error::TensorTooLarge {
            backend,
            bytes,
            limit_name,
            limit,
            ..
        } => Error::WeightTooLarge {
            tensor: tensor.to_string(),
            backend,
            bytes,
            limit_name,
            limit,
        },
        other => other,
    }
}

/// Refuses, before anything is uploaded, weights that need more memory than `device` says it
/// has ([`Device::memory_available`]): the error says how many layers would fit resident,
/// for [`Llama::load_streaming`] (`--resident-layers`).
pub(crate) fn check_fits(
    device: &Device,
    files: &ModelFiles,
    resident: usize,
    shard: Shard,
) -> Result<()> {
    let Some(available) = device.memory_available() else {
        return Ok(());
    };
    let c = &files.config;
    let keep = keeps_packed(device);
    let layer = |i: usize| -> u64 {
        let prefix = name(files.is_gguf, Some(i), "", "");
        files
            .tensors
            .range(prefix.clone()..)
            .take_while(|(n, _)| n.starts_with(&prefix))
            .map(|(n, (_, t))| loaded_bytes(n, t, keep))
            .sum::<u64>()
            .div_ceil(shard.size as u64)
    };
    // The embedding, the output projection and the final norm, on the first rank.
    let base = if shard.is_first() {
        outside_layers_bytes(
            files.tensors.iter().map(|(n, (_, t))| (n.as_str(), t)),
            keep,
        )
    } else {
        0
    };
    let sizes: Vec<u64> = (0..c.num_hidden_layers.min(resident)).map(layer).collect();
    let total = sizes.iter().fold(base, |t, &s| t.saturating_add(s));
    if total <= available {
        return Ok(());
    }
    // Resident layers that fit with room for one streamed layer beside them.
    let streamed = (0..c.num_hidden_layers).map(layer).max().unwrap_or(0);
    let mut used = base.saturating_add(streamed);
    let mut fitting = 0;
    while fitting < sizes.len() && used.saturating_add(sizes[fitting]) <= available {
        used += sizes[fitting];
        fitting += 1;
    }
    let hint = if base.saturating_add(streamed) > available {
        "even with every layer streamed, the embedding and output do not fit: use a smaller or \
         more quantized model, or another device"
            .to_string()
    } else {
        format!(
            "keep fewer layers on the device and stream the others from the files on each \
             pass: --resident-layers {fitting} (Llama::load_streaming)"
        )
    };
    Err(Error::OutOfMemory {
        what: format!(
            "the model's weights ({} of {} layers resident on the {} device)",
            sizes.len(),
            c.num_hidden_layers,
            device.backend_name()
        ),
        bytes: total,
        available: Some(available),
        hint,
    })
}
