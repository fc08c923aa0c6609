//! A Llama-family decoder on the op set: weights placed on a device, and a forward pass that
//! returns the logits of every position.
//!
//! This forward recomputes the whole sequence on each call (no KV cache yet), so every op it
//! uses runs on the chosen backend; on the `reference` backend it is the oracle the other
//! backends' logits are tested against.

use super::files::ModelFiles;
use super::weights::RawTensor;
use super::{LlamaConfig, Tokenizer};
use crate::backend::RopeLayout;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops;
use crate::tensor::Tensor;

/// One decoder layer's weights.
struct Layer {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    biases: Option<[Tensor; 3]>,
    wo: Tensor,
    ffn_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// A loaded model on a device.
pub struct Llama {
    /// Hyper-parameters.
    pub config: LlamaConfig,
    /// The tokenizer of the model files, if they had one.
    pub tokenizer: Option<Tokenizer>,
    layout: RopeLayout,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
}

/// Weight names: Hugging Face's or GGUF's.
fn name(gguf: bool, layer: Option<usize>, hf: &str, gg: &str) -> String {
    match (layer, gguf) {
        (Some(i), false) => format!("model.layers.{i}.{hf}"),
        (Some(i), true) => format!("blk.{i}.{gg}"),
        (None, false) => hf.to_string(),
        (None, true) => gg.to_string(),
    }
}

impl Llama {
    /// Places the weights of `files` on `device`: matrices in their stored dtype (f32, f16 or
    /// a GGUF block format, used packed), vectors and the embedding table as f32. Every shape
    /// is checked against the config.
    pub fn load(device: &Device, files: ModelFiles) -> Result<Llama> {
        let c = &files.config;
        let gguf = files.is_gguf;
        let (d, f) = (c.hidden_size, c.intermediate_size);
        let fetch = |n: &str, shape: &[usize]| -> Result<(&RawTensor, &[u8])> {
            let (t, bytes) = files.get(n)?;
            if t.shape != shape {
                return Err(Error::model_file(
                    files.names.join(", "),
                    format!(
                        "tensor `{n}` has shape {:?}; the config needs {shape:?}",
                        t.shape
                    ),
                ));
            }
            Ok((t, bytes))
        };
        let matrix = |n: String, shape: [usize; 2]| -> Result<Tensor> {
            let (t, bytes) = fetch(&n, &shape)?;
            t.to_device(device, bytes)
        };
        let vector = |n: String, len: usize| -> Result<Tensor> {
            let (t, bytes) = fetch(&n, &[len])?;
            Tensor::from_vec(device, t.to_f32(bytes), [len])
        };
        let embed_name = name(gguf, None, "model.embed_tokens.weight", "token_embd.weight");
        let (embed_raw, embed_bytes) = fetch(&embed_name, &[c.vocab_size, d])?;
        let embed = Tensor::from_vec(device, embed_raw.to_f32(embed_bytes), [c.vocab_size, d])?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let l = Some(i);
            let (q, kv) = (c.q_dim(), c.kv_dim());
            let biases = if c.attention_bias {
                Some([
                    vector(name(gguf, l, "self_attn.q_proj.bias", "attn_q.bias"), q)?,
                    vector(name(gguf, l, "self_attn.k_proj.bias", "attn_k.bias"), kv)?,
                    vector(name(gguf, l, "self_attn.v_proj.bias", "attn_v.bias"), kv)?,
                ])
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: vector(
                    name(gguf, l, "input_layernorm.weight", "attn_norm.weight"),
                    d,
                )?,
                wq: matrix(
                    name(gguf, l, "self_attn.q_proj.weight", "attn_q.weight"),
                    [q, d],
                )?,
                wk: matrix(
                    name(gguf, l, "self_attn.k_proj.weight", "attn_k.weight"),
                    [kv, d],
                )?,
                wv: matrix(
                    name(gguf, l, "self_attn.v_proj.weight", "attn_v.weight"),
                    [kv, d],
                )?,
                biases,
                wo: matrix(
                    name(gguf, l, "self_attn.o_proj.weight", "attn_output.weight"),
                    [d, q],
                )?,
                ffn_norm: vector(
                    name(
                        gguf,
                        l,
                        "post_attention_layernorm.weight",
                        "ffn_norm.weight",
                    ),
                    d,
                )?,
                gate: matrix(
                    name(gguf, l, "mlp.gate_proj.weight", "ffn_gate.weight"),
                    [f, d],
                )?,
                up: matrix(name(gguf, l, "mlp.up_proj.weight", "ffn_up.weight"), [f, d])?,
                down: matrix(
                    name(gguf, l, "mlp.down_proj.weight", "ffn_down.weight"),
                    [d, f],
                )?,
            });
        }
        let norm = vector(
            name(gguf, None, "model.norm.weight", "output_norm.weight"),
            d,
        )?;
        let head_name = name(gguf, None, "lm_head.weight", "output.weight");
        let lm_head = if c.tie_word_embeddings || !files.tensors.contains_key(&head_name) {
            embed_raw.to_device(device, embed_bytes)?
        } else {
            matrix(head_name, [c.vocab_size, d])?
        };
        Ok(Llama {
            config: files.config.clone(),
            tokenizer: files.tokenizer.clone(),
            layout: files.rope_layout(),
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    /// The logits of every position of `tokens`: f32 `[tokens.len(), vocab_size]`.
    pub fn logits(&self, tokens: &[u32]) -> Result<Tensor> {
        let c = &self.config;
        let t = tokens.len();
        if t == 0 {
            return Err(Error::invalid("llama", "no tokens to run"));
        }
        if t > c.max_position_embeddings {
            return Err(Error::invalid(
                "llama",
                format!(
                    "{t} tokens exceed the model's context of {}",
                    c.max_position_embeddings
                ),
            ));
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(Error::invalid(
                "llama",
                format!("token id {bad} is not below vocab_size {}", c.vocab_size),
            ));
        }
        let device = self.embed.device();
        let ids = Tensor::from_slice(device, tokens, [t])?;
        let positions: Vec<u32> = (0..t as u32).collect();
        let positions = Tensor::from_vec(device, positions, [t])?;
        let eps = c.rms_norm_eps;
        let mut x = ops::embedding(&self.embed, &ids)?;
        for layer in &self.layers {
            let h = ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let attn = self.attention(layer, &h, &positions)?;
            x = ops::add(&x, &ops::matmul_t(&attn, &layer.wo)?)?;
            let h = ops::rms_norm(&x, &layer.ffn_norm, eps)?;
            let act = ops::swiglu(
                &ops::matmul_t(&h, &layer.gate)?,
                &ops::matmul_t(&h, &layer.up)?,
            )?;
            x = ops::add(&x, &ops::matmul_t(&act, &layer.down)?)?;
        }
        let x = ops::rms_norm(&x, &self.norm, eps)?;
        ops::matmul_t(&x, &self.lm_head)
    }

    /// Causal grouped-query attention of one layer over `h` `[t, hidden]`: `[t, q_dim]`.
    fn attention(&self, layer: &Layer, h: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let t = h.dims()[0];
        let (heads, kv, hd) = (c.num_attention_heads, c.kv_heads(), c.head_dim());
        let group = heads / kv;
        let project = |w: &Tensor, bias: Option<&Tensor>| -> Result<Tensor> {
            let y = ops::matmul_t(h, w)?;
            match bias {
                Some(b) => ops::add(&y, b),
                None => Ok(y),
            }
        };
        let bias = |i: usize| layer.biases.as_ref().map(|b| &b[i]);
        let q = project(&layer.wq, bias(0))?.reshape([t, heads, hd])?;
        let k = project(&layer.wk, bias(1))?.reshape([t, kv, hd])?;
        let v = project(&layer.wv, bias(2))?.reshape([t, kv, hd])?;
        let q = ops::rope(&q, positions, c.rope_theta, self.layout)?;
        let k = ops::rope(&k, positions, c.rope_theta, self.layout)?;
        // Heads of one key/value group are consecutive: [kv, group · t, hd] against [kv, t, hd].
        let q = ops::transpose(&q, 0, 1)?.reshape([kv, group * t, hd])?;
        let k = ops::transpose(&k, 0, 1)?;
        let v = ops::transpose(&v, 0, 1)?;
        let scores = ops::scale(&ops::matmul_t(&q, &k)?, 1.0 / (hd as f32).sqrt())?;
        let probs = ops::softmax_causal(&scores.reshape([heads, t, t])?)?;
        let out = ops::matmul(&probs.reshape([kv, group * t, t])?, &v)?;
        ops::transpose(&out.reshape([heads, t, hd])?, 0, 1)?.reshape([t, heads * hd])
    }
}
