//! The Llama forward pass on cpu and wgpu against the same model on the reference backend,
//! for tiny random models written here as Hugging Face folders (safetensors) and as GGUF files
//! (with the q/k row permutation llama.cpp's converter applies), plus bad files.

mod common;
#[path = "engine/decode.rs"]
mod decode;
#[path = "engine/parallel.rs"]
mod parallel;

use std::path::{Path, PathBuf};

use common::{assert_close, reference, rng, uniform};
use webtensor::{DType, Device, Error, Tensor};
use webtensor_llm::gguf::{self, GgufValue};
use webtensor_llm::weights::StoredDType;
use webtensor_llm::{CacheLayout, HookPoint, KvCache, KvPool, Llama, ModelFiles, SequenceInput};

/// docs/DESIGN.md, Tolerances: engine logits within 1e-3 of the reference forward.
const TOL: f64 = 1e-3;

#[derive(Clone, Copy)]
struct Shape {
    vocab: usize,
    hidden: usize,
    ffn: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    tied: bool,
    bias: bool,
}

const GQA: Shape = Shape {
    vocab: 61,
    hidden: 32,
    ffn: 48,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    tied: false,
    bias: false,
};

/// Random weights by Hugging Face name, row-major.
fn weights(s: Shape, seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut r = rng(seed);
    let hd = s.hidden / s.heads;
    let (q, kv) = (s.heads * hd, s.kv_heads * hd);
    let mut w = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![s.vocab, s.hidden],
        uniform(&mut r, s.vocab * s.hidden, 1.0),
    )];
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        let n = shape.iter().product();
        let values = uniform(&mut r, n, scale)
            .iter()
            .map(|v| v + offset)
            .collect();
        w.push((name, shape, values));
    };
    for i in 0..s.layers {
        let p = |n: &str| format!("model.layers.{i}.{n}");
        add(p("input_layernorm.weight"), vec![s.hidden], 0.2, 1.0);
        add(p("self_attn.q_proj.weight"), vec![q, s.hidden], 0.3, 0.0);
        add(p("self_attn.k_proj.weight"), vec![kv, s.hidden], 0.3, 0.0);
        add(p("self_attn.v_proj.weight"), vec![kv, s.hidden], 0.3, 0.0);
        if s.bias {
            add(p("self_attn.q_proj.bias"), vec![q], 0.1, 0.0);
            add(p("self_attn.k_proj.bias"), vec![kv], 0.1, 0.0);
            add(p("self_attn.v_proj.bias"), vec![kv], 0.1, 0.0);
        }
        add(p("self_attn.o_proj.weight"), vec![s.hidden, q], 0.3, 0.0);
        add(
            p("post_attention_layernorm.weight"),
            vec![s.hidden],
            0.2,
            1.0,
        );
        add(p("mlp.gate_proj.weight"), vec![s.ffn, s.hidden], 0.3, 0.0);
        add(p("mlp.up_proj.weight"), vec![s.ffn, s.hidden], 0.3, 0.0);
        add(p("mlp.down_proj.weight"), vec![s.hidden, s.ffn], 0.3, 0.0);
    }
    add("model.norm.weight".into(), vec![s.hidden], 0.2, 1.0);
    if !s.tied {
        add("lm_head.weight".into(), vec![s.vocab, s.hidden], 0.3, 0.0);
    }
    w
}

fn config_json(s: Shape) -> String {
    serde_json::json!({
        "vocab_size": s.vocab, "hidden_size": s.hidden, "intermediate_size": s.ffn,
        "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": s.tied,
        "attention_bias": s.bias, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2
    })
    .to_string()
}

/// The tensors `w` as a safetensors file, each of `dtype`: `"F32"`, or `"BF16"`
/// ([`common::bf16_bytes`]: the values are cut, not rounded).
fn safetensors(w: &[(String, Vec<usize>, Vec<f32>)], dtype: &str) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in w {
        let begin = data.len();
        match dtype {
            "F32" => data.extend(values.iter().flat_map(|v| v.to_le_bytes())),
            "BF16" => data.extend(common::bf16_bytes(values)),
            other => panic!("no writer for {other}"),
        }
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let text = serde_json::Value::Object(header).to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&data);
    out
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("webtensor-engine-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn hf_folder(s: Shape, tag: &str) -> PathBuf {
    hf_folder_of(s, "F32", tag)
}

/// A Hugging Face folder of the model `s`, its tensors of `dtype` ([`safetensors`]).
fn hf_folder_of(s: Shape, dtype: &str, tag: &str) -> PathBuf {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("config.json"), config_json(s)).unwrap();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors(&weights(s, 7), dtype),
    )
    .unwrap();
    dir
}

/// llama.cpp's converter: within each head, rows `j` and `j + head_dim/2` become `2j`, `2j+1`.
fn permute_rows(values: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let hd = rows / heads;
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for j in 0..hd / 2 {
            for s in 0..2 {
                let old = h * hd + s * hd / 2 + j;
                let new = h * hd + 2 * j + s;
                out[new * cols..(new + 1) * cols]
                    .copy_from_slice(&values[old * cols..(old + 1) * cols]);
            }
        }
    }
    out
}

/// The same model as a GGUF file, matrices in `format` (F32 or a block format).
fn gguf_file(s: Shape, format: DType, tag: &str) -> PathBuf {
    gguf_file_mixed(
        s,
        &|name| (!name.contains("token_embd")).then_some(format),
        tag,
    )
}

/// A GGUF Llama whose matrices each take the format `pick` gives their GGUF name (f32 for
/// `None` or `F32`): quantized from the random weights where webtensor quantizes to it, random
/// valid blocks otherwise (the K-quants and `IQ4` formats, which only llama.cpp writes).
fn gguf_file_mixed(s: Shape, pick: &dyn Fn(&str) -> Option<DType>, tag: &str) -> PathBuf {
    let gguf_name = |hf: &str| -> String {
        let map = [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
        ];
        if let Some((_, g)) = map.iter().find(|(h, _)| *h == hf) {
            return g.to_string();
        }
        let rest = hf.strip_prefix("model.layers.").unwrap();
        let (i, field) = rest.split_once('.').unwrap();
        let g = match field {
            "input_layernorm.weight" => "attn_norm.weight",
            "self_attn.q_proj.weight" => "attn_q.weight",
            "self_attn.k_proj.weight" => "attn_k.weight",
            "self_attn.v_proj.weight" => "attn_v.weight",
            "self_attn.q_proj.bias" => "attn_q.bias",
            "self_attn.k_proj.bias" => "attn_k.bias",
            "self_attn.v_proj.bias" => "attn_v.bias",
            "self_attn.o_proj.weight" => "attn_output.weight",
            "post_attention_layernorm.weight" => "ffn_norm.weight",
            "mlp.gate_proj.weight" => "ffn_gate.weight",
            "mlp.up_proj.weight" => "ffn_up.weight",
            "mlp.down_proj.weight" => "ffn_down.weight",
            other => panic!("unmapped {other}"),
        };
        format!("blk.{i}.{g}")
    };
    let reference = reference();
    let mut blocks = rng(8);
    let mut tensors = Vec::new();
    for (name, shape, mut values) in weights(s, 7) {
        if name.contains("q_proj") || name.contains("k_proj") {
            let heads = if name.contains("q_proj") {
                s.heads
            } else {
                s.kv_heads
            };
            let cols = shape.get(1).copied().unwrap_or(1);
            values = permute_rows(&values, shape[0], cols, heads);
        }
        let name = gguf_name(&name);
        let format = pick(&name).filter(|&f| shape.len() == 2 && f != DType::F32);
        let (dtype, bytes) = if let Some(format) = format {
            let bytes = if webtensor::quant::can_quantize(format) {
                let t = Tensor::from_slice(&reference, &values, shape.as_slice()).unwrap();
                let q = webtensor::ops::quantize(&t, format).unwrap();
                q.to_bytes().unwrap()
            } else {
                let n = values.len() / format.block_len();
                common::random_blocks(&mut blocks, format, n, 0.002)
            };
            (StoredDType::Packed(format), bytes)
        } else {
            (
                StoredDType::F32,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        };
        tensors.push((name, dtype, shape, bytes));
    }
    let u = |v: usize| GgufValue::U64(v as u64);
    let meta = vec![
        (
            "general.architecture".to_string(),
            GgufValue::Str("llama".into()),
        ),
        ("llama.vocab_size".into(), u(s.vocab)),
        ("llama.embedding_length".into(), u(s.hidden)),
        ("llama.feed_forward_length".into(), u(s.ffn)),
        ("llama.block_count".into(), u(s.layers)),
        ("llama.attention.head_count".into(), u(s.heads)),
        ("llama.attention.head_count_kv".into(), u(s.kv_heads)),
        ("llama.context_length".into(), u(64)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            GgufValue::F64(1e-5),
        ),
        ("llama.rope.freq_base".into(), GgufValue::F64(10000.0)),
    ];
    let path = temp_dir(tag).join("model.gguf");
    std::fs::write(&path, gguf::write(&meta, &tensors).unwrap()).unwrap();
    path
}

const TOKENS: [u32; 9] = [1, 5, 9, 60, 3, 3, 17, 42, 0];

fn logits(dev: &Device, path: &Path) -> Vec<f32> {
    let files = ModelFiles::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let model = Llama::load(dev, files).unwrap();
    model.logits(&TOKENS).unwrap().to_vec().unwrap()
}

/// The cpu, and wgpu on the adapter's own kernel shape and with the row-team (GPU) shape
/// forced ([`common::wgpus`]).
fn devices() -> Vec<Device> {
    let mut d = vec![common::cpu()];
    d.extend(common::wgpus());
    d
}

#[test]
fn hugging_face_models_match_the_reference() {
    let variants = [
        ("gqa", GQA),
        (
            "mha-tied",
            Shape {
                kv_heads: 4,
                tied: true,
                ..GQA
            },
        ),
        (
            "bias",
            Shape {
                bias: true,
                kv_heads: 1,
                ..GQA
            },
        ),
    ];
    for (tag, s) in variants {
        let dir = hf_folder(s, tag);
        let want = logits(&reference(), &dir);
        assert_eq!(want.len(), TOKENS.len() * s.vocab);
        for dev in devices() {
            assert_close(
                &format!("{tag} on {}", dev.backend_name()),
                &logits(&dev, &dir),
                &want,
                TOL,
            );
        }
    }
}

/// A bf16 checkpoint runs its matrices as bf16 on every backend, the GPUs' group decoders
/// included, and equals the reference's forward (which multiplies the same values widened to
/// f32). The FFN's down projection, rows of 48 values, is not whole groups of 32: the GPUs
/// widen that one to f32, and say so in the activation path.
#[test]
fn bf16_checkpoints_run_as_bf16_on_every_backend() {
    let dir = hf_folder_of(GQA, "BF16", "bf16");
    let want = logits(&reference(), &dir);
    let mut devs = devices();
    devs.extend(common::cuda());
    for dev in devs {
        let name = dev.backend_name();
        let model = Llama::load(&dev, ModelFiles::open(&dir).unwrap())
            .unwrap_or_else(|e| panic!("bf16 on {name}: {e}"));
        let path = model.activation_path();
        assert!(
            path.contains("bf16 weights × f32 activations"),
            "{name}: {path}"
        );
        let widened = path.contains("f32 weights");
        assert_eq!(widened, matches!(name, "wgpu" | "cuda"), "{name}: {path}");
        let got: Vec<f32> = model.logits(&TOKENS).unwrap().to_vec().unwrap();
        assert_close(&format!("bf16 on {name}"), &got, &want, TOL);
    }
}

#[test]
fn gguf_models_match_their_hugging_face_original() {
    // GGUF's permuted q/k rows with interleaved rotary pairs are the same model.
    let hf = logits(&reference(), &hf_folder(GQA, "gguf-hf"));
    let gguf = logits(&reference(), &gguf_file(GQA, DType::F32, "gguf-f32"));
    assert_close("gguf f32 vs safetensors", &gguf, &hf, 1e-5);
    // Block-quantized GGUF matrices run packed on every backend.
    for format in [DType::Q8_0, DType::Q4_0] {
        let s = Shape {
            hidden: 64,
            ffn: 64,
            heads: 4,
            kv_heads: 2,
            ..GQA
        };
        let path = gguf_file(s, format, &format!("gguf-{format}"));
        let want = logits(&reference(), &path);
        for dev in devices() {
            let what = format!("gguf {format} on {}", dev.backend_name());
            assert_close(&what, &logits(&dev, &path), &want, TOL);
        }
    }
}

/// GGUF files that mix llama.cpp's formats as its quantizer does (Q4_K_M: Q4_K with Q6_K
/// for some matrices; and the 32-value formats), each tensor in its own format (gate and up
/// in two: no fused gate·up product), the token embedding packed too: the cpu forward equals
/// the reference's, and the products are named. The wgpu backend runs both mixes with the
/// host's activations (`Q8_K` for the K-quants, `Q8_0` for the legacy formats), equal to the
/// reference's forward.
#[test]
fn gguf_models_mixing_llama_cpp_formats_run_on_every_backend() {
    let s = Shape {
        hidden: 256,
        ffn: 256,
        heads: 4,
        kv_heads: 2,
        ..GQA
    };
    // Each matrix's format by (part of) its GGUF name.
    let k_quants = [
        ("token_embd", DType::Q4_K),
        ("attn_q", DType::Q4_K),
        ("attn_k", DType::Q3_K),
        ("attn_v", DType::Q6_K),
        ("attn_output", DType::Q5_K),
        ("ffn_gate", DType::Q2_K),
        ("ffn_up", DType::IQ4_XS),
        ("ffn_down", DType::Q6_K),
        ("output.weight", DType::Q6_K),
    ];
    let legacy = [
        ("token_embd", DType::Q5_1),
        ("attn_q", DType::Q4_1),
        ("attn_k", DType::Q5_0),
        ("attn_v", DType::Q5_1),
        ("attn_output", DType::IQ4_NL),
        ("ffn_gate", DType::Q5_0),
        ("ffn_up", DType::IQ4_NL),
        ("ffn_down", DType::Q4_1),
        ("output.weight", DType::Q5_0),
    ];
    let cases = [
        ("k-quants", k_quants, "q2_k weights × q8_k activations"),
        ("legacy", legacy, "q5_0 weights × q8_0 activations"),
    ];
    for (tag, mix, named) in cases {
        let pick = |name: &str| mix.iter().find(|(n, _)| name.contains(n)).map(|&(_, f)| f);
        let path = gguf_file_mixed(s, &pick, &format!("gguf-mixed-{tag}"));
        let want = logits(&reference(), &path);
        assert!(
            want.iter().all(|v| v.is_finite()),
            "{tag}: reference logits"
        );
        let cpu = common::cpu();
        assert_close(&format!("{tag} on cpu"), &logits(&cpu, &path), &want, TOL);
        let model = Llama::load(&cpu, ModelFiles::open(&path).unwrap()).unwrap();
        let path_text = model.activation_path();
        assert!(path_text.contains(named), "{tag}: {path_text}");
        if let Some(gpu) = common::wgpu() {
            // wgpu reads every format with the activations the host does.
            let model = Llama::load(&gpu, ModelFiles::open(&path).unwrap())
                .unwrap_or_else(|e| panic!("{tag} on wgpu: {e}"));
            assert_eq!(model.activation_path(), path_text, "{tag} on wgpu");
            let got: Vec<f32> = model.logits(&TOKENS).unwrap().to_vec().unwrap();
            assert_close(&format!("{tag} on wgpu"), &got, &want, TOL);
        }
    }
}

#[test]
fn bad_files_are_typed_errors() {
    let dir = hf_folder(GQA, "bad");
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    // Truncated data.
    std::fs::write(&file, &bytes[..bytes.len() - 10]).unwrap();
    let err = ModelFiles::open(&dir)
        .err()
        .expect("a truncated file is refused");
    assert!(matches!(err, Error::ModelFile { .. }), "{err}");
    // A config that disagrees with the weights names the tensor.
    std::fs::write(&file, &bytes).unwrap();
    let lying = config_json(GQA).replace("\"intermediate_size\":48", "\"intermediate_size\":40");
    std::fs::write(dir.join("config.json"), lying).unwrap();
    let files = ModelFiles::open(&dir).unwrap();
    let err = Llama::load(&reference(), files)
        .err()
        .expect("mismatched shapes are refused");
    assert!(err.to_string().contains("gate_proj"), "{err}");
    // A GGUF cut short.
    let path = gguf_file(GQA, DType::F32, "bad-gguf");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert!(matches!(
        ModelFiles::open(&path),
        Err(Error::ModelFile { .. })
    ));
    // Token ids beyond the vocabulary.
    std::fs::write(dir.join("config.json"), config_json(GQA)).unwrap();
    let model = Llama::load(&reference(), ModelFiles::open(&dir).unwrap()).unwrap();
    assert!(matches!(
        model.logits(&[1, 999]),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn a_prompt_at_once_equals_the_prompt_token_by_token() {
    let dir = hf_folder(GQA, "incremental");
    let want = logits(&reference(), &dir);
    let vocab = GQA.vocab;
    for dev in devices() {
        let model = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        let mut cache = model.new_cache(16).unwrap();
        // Three tokens, then one at a time, then the rest together.
        let mut got: Vec<f32> = Vec::new();
        for chunk in [&TOKENS[..3], &TOKENS[3..4], &TOKENS[4..5], &TOKENS[5..]] {
            got.extend(
                model
                    .forward(chunk, &mut cache)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap(),
            );
        }
        assert_eq!(cache.len(), TOKENS.len());
        assert_eq!(got.len(), TOKENS.len() * vocab);
        assert_close(
            &format!("cached forward on {}", dev.backend_name()),
            &got,
            &want,
            TOL,
        );
        cache.reset();
        let again: Vec<f32> = model
            .forward(&TOKENS, &mut cache)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_close("after reset", &again, &want, TOL);
    }
}

#[test]
fn a_full_cache_is_an_error() {
    let dir = hf_folder(GQA, "full");
    let model = Llama::load(&reference(), ModelFiles::open(&dir).unwrap()).unwrap();
    let mut cache = model.new_cache(4).unwrap();
    model.forward(&[1, 2, 3], &mut cache).unwrap();
    let err = model
        .forward(&[4, 5], &mut cache)
        .expect_err("no room for two more");
    assert!(
        matches!(
            err,
            Error::CacheFull {
                capacity: 4,
                len: 3,
                requested: 2
            }
        ),
        "{err}"
    );
    assert!(model.forward(&[4], &mut cache).is_ok());
    assert!(matches!(
        model.new_cache(0),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        model.new_cache(65),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn the_builtin_tokenizer_matches_the_training_script() {
    // Ids written by scripts/train_tiny_model.py's own (Python) encoder.
    let dir =
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("assets/tiny-kjv");
    let text = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap();
    let tokenizer = webtensor_llm::Tokenizer::from_json(&text, "tokenizer.json").unwrap();
    let check = std::fs::read_to_string(dir.join("tokenizer_check.json")).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&check).unwrap();
    for case in cases.as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tokenizer.encode(text).unwrap(), want, "{text:?}");
        assert_eq!(tokenizer.decode(&want), text);
    }
}

/// (hook name, layer, shape) of one hook call.
type Seen = (String, usize, Vec<usize>);

#[test]
fn debug_hooks_see_the_chosen_intermediates() {
    use std::sync::{Arc, Mutex};
    let dir = hf_folder(GQA, "hooks");
    let mut model = Llama::load(&reference(), ModelFiles::open(&dir).unwrap()).unwrap();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let sink = seen.clone();
    let points = ["q", "residual", "logits"].map(|n| HookPoint::parse(n).unwrap());
    model.set_hook(
        &points,
        Box::new(move |point, layer, t| {
            sink.lock()
                .unwrap()
                .push((point.name().to_string(), layer, t.dims().to_vec()));
        }),
    );
    let logits: Vec<f32> = model.logits(&TOKENS).unwrap().to_vec().unwrap();
    let seen = seen.lock().unwrap().clone();
    let t = TOKENS.len();
    let hd = GQA.hidden / GQA.heads;
    let expected: Vec<Seen> = (0..GQA.layers)
        .flat_map(|i| {
            [
                ("q".to_string(), i, vec![t, GQA.heads, hd]),
                ("residual".to_string(), i, vec![t, GQA.hidden]),
            ]
        })
        .chain([("logits".to_string(), 0, vec![t, GQA.vocab])])
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(logits.len(), t * GQA.vocab);
    assert!(matches!(
        HookPoint::parse("nope"),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn a_batch_of_sequences_equals_each_sequence_alone() {
    let dir = hf_folder(GQA, "batch");
    // Three sequences of different lengths, one of them already holding a prompt.
    let prompts: [&[u32]; 3] = [&TOKENS[..5], &[7, 8], &TOKENS[2..9]];
    for dev in devices() {
        let model = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        let alone: Vec<Vec<f32>> = prompts
            .iter()
            .map(|p| model.logits(p).unwrap().to_vec().unwrap())
            .collect();
        let mut caches: Vec<_> = (0..3).map(|_| model.new_cache(32).unwrap()).collect();
        let [c0, c1, c2] = &mut caches[..] else {
            unreachable!()
        };
        // The second sequence's first token runs before the batch: a cache of length 1.
        model.forward(&prompts[1][..1], c1).unwrap();
        let mut batch = [
            SequenceInput {
                tokens: prompts[0],
                cache: c0,
            },
            SequenceInput {
                tokens: &prompts[1][1..],
                cache: c1,
            },
            SequenceInput {
                tokens: prompts[2],
                cache: c2,
            },
        ];
        let got: Vec<f32> = model.forward_batch(&mut batch).unwrap().to_vec().unwrap();
        let vocab = GQA.vocab;
        let want: Vec<f32> = [
            alone[0].clone(),
            alone[1][vocab..].to_vec(),
            alone[2].clone(),
        ]
        .concat();
        assert_close(
            &format!("batch on {}", dev.backend_name()),
            &got,
            &want,
            TOL,
        );
        // Greedy next tokens of the batch: each sequence's last row, drawn on the device.
        let mut greedy = webtensor_llm::Sampler::new(webtensor_llm::Sampling::greedy());
        let next = model.next_tokens(
            &mut [
                SequenceInput {
                    tokens: &[3],
                    cache: c0,
                },
                SequenceInput {
                    tokens: &[4, 5],
                    cache: c2,
                },
            ],
            &mut greedy,
        );
        let next = next.unwrap();
        let argmax = |row: &[f32]| {
            row.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i as u32)
                .unwrap()
        };
        let seq0: Vec<u32> = [prompts[0], &[3]].concat();
        let seq2: Vec<u32> = [prompts[2], &[4, 5]].concat();
        let last = |s: &[u32]| {
            let l: Vec<f32> = model.logits(s).unwrap().to_vec().unwrap();
            argmax(&l[l.len() - vocab..])
        };
        assert_eq!(
            next,
            vec![last(&seq0), last(&seq2)],
            "on {}",
            dev.backend_name()
        );
    }
}

#[test]
fn multi_step_decode_equals_single_steps() {
    use webtensor_llm::{Sampler, Sampling};
    let dir = hf_folder(GQA, "multistep");
    let warm = Sampling {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.9,
        seed: 7,
    };
    for dev in devices() {
        let model = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        let prompt = &TOKENS[..5];
        for sampling in [Sampling::greedy(), warm] {
            let what = format!("{sampling:?} on {}", dev.backend_name());
            // Single steps: each id read back and fed again from the host.
            let mut sampler = Sampler::new(sampling);
            let mut cache = model.new_cache(32).unwrap();
            let mut next = model.sample_next(prompt, &mut cache, &mut sampler).unwrap();
            let mut ids = Vec::new();
            for _ in 0..6 {
                ids.push(next);
                next = model
                    .sample_next(&[next], &mut cache, &mut sampler)
                    .unwrap();
            }
            // Five more steps with the ids kept on the device, read back once.
            let mut sampler = Sampler::new(sampling);
            let mut cache2 = model.new_cache(32).unwrap();
            let first = model
                .sample_next(prompt, &mut cache2, &mut sampler)
                .unwrap();
            let mut multi = vec![first];
            multi.extend(model.decode(first, &mut cache2, 5, &mut sampler).unwrap());
            assert_eq!(multi, ids, "{what}");
            assert_eq!(cache2.len(), prompt.len() + 5);
            // The host sampler over read-back logits draws the same tokens.
            let mut sampler = Sampler::new(sampling);
            let mut cache3 = model.new_cache(32).unwrap();
            let mut host = Vec::new();
            let mut tokens = prompt.to_vec();
            for _ in 0..6 {
                let logits: Vec<f32> = model
                    .forward(&tokens, &mut cache3)
                    .unwrap()
                    .to_vec()
                    .unwrap();
                let next = sampler.sample(&logits[logits.len() - GQA.vocab..]);
                host.push(next);
                tokens = vec![next];
            }
            assert_eq!(host, ids, "host sampling, {what}");
        }
        let mut small = model.new_cache(2).unwrap();
        let mut sampler = Sampler::new(warm);
        assert!(matches!(
            model.decode(1, &mut small, 3, &mut sampler),
            Err(Error::CacheFull { .. })
        ));
    }
}

/// Runs `prompts` through caches of one pool, a token of each sequence in turn (so paged
/// blocks interleave), and checks each sequence's logits against the reference.
fn check_interleaved(
    model: &Llama,
    pool: &KvPool,
    prompts: &[&[u32]],
    want: &[Vec<f32>],
    what: &str,
) {
    let mut caches: Vec<KvCache> = prompts.iter().map(|_| pool.sequence()).collect();
    let mut got: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    for step in 0..longest {
        for (i, prompt) in prompts.iter().enumerate() {
            if let Some(&token) = prompt.get(step) {
                let logits = model.forward(&[token], &mut caches[i]).unwrap();
                got[i].extend(logits.to_vec::<f32>().unwrap());
            }
        }
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_close(&format!("{what}: sequence {i}"), g, w, TOL);
    }
}

#[test]
fn paged_and_static_caches_match_the_reference() {
    let dir = hf_folder(GQA, "paged");
    let prompts: [&[u32]; 3] = [&TOKENS, &[7, 8, 9, 10], &TOKENS[2..9]];
    let want: Vec<Vec<f32>> = {
        let model = Llama::load(&reference(), ModelFiles::open(&dir).unwrap()).unwrap();
        prompts
            .iter()
            .map(|p| model.logits(p).unwrap().to_vec().unwrap())
            .collect()
    };
    for dev in devices() {
        let model = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        let name = dev.backend_name();
        // Blocks of 3 tokens: every sequence's blocks end up scattered over the pool.
        let block_bytes = 3 * GQA.layers * 2 * (GQA.kv_heads * GQA.hidden / GQA.heads) * 4;
        let paged = model
            .new_pool(CacheLayout::Paged {
                block_size: 3,
                budget_bytes: 9 * block_bytes,
            })
            .unwrap();
        check_interleaved(&model, &paged, &prompts, &want, &format!("paged on {name}"));
        assert_eq!(
            paged.free_blocks().unwrap(),
            9,
            "dropped sequences give their blocks back"
        );
        let fixed = model
            .new_pool(CacheLayout::Static {
                max_batch: 3,
                max_len: 16,
            })
            .unwrap();
        check_interleaved(
            &model,
            &fixed,
            &prompts,
            &want,
            &format!("static on {name}"),
        );
        // A batch over one paged pool equals each sequence alone.
        let mut a = paged.sequence();
        let mut b = paged.sequence();
        let got: Vec<f32> = model
            .forward_batch(&mut [
                SequenceInput {
                    tokens: prompts[0],
                    cache: &mut a,
                },
                SequenceInput {
                    tokens: prompts[1],
                    cache: &mut b,
                },
            ])
            .unwrap()
            .to_vec()
            .unwrap();
        assert_close(
            &format!("paged batch on {name}"),
            &got,
            &[want[0].clone(), want[1].clone()].concat(),
            TOL,
        );
    }
}

#[test]
fn cache_blocks_are_freed_and_running_out_is_an_error() {
    let dir = hf_folder(GQA, "blocks");
    let model = Llama::load(&reference(), ModelFiles::open(&dir).unwrap()).unwrap();
    let block_bytes = 4 * GQA.layers * 2 * (GQA.kv_heads * GQA.hidden / GQA.heads) * 4;
    let pool = model
        .new_pool(CacheLayout::Paged {
            block_size: 4,
            budget_bytes: 3 * block_bytes + 5,
        })
        .unwrap();
    assert_eq!(pool.total_blocks().unwrap(), 3);
    let mut a = pool.sequence();
    model.forward(&TOKENS[..6], &mut a).unwrap(); // two blocks
    let mut b = pool.sequence();
    model.forward(&TOKENS[..4], &mut b).unwrap(); // the third
                                                  // Neither a nor b can grow into a new block; the failed batch takes nothing.
    let err = model
        .forward_batch(&mut [
            SequenceInput {
                tokens: &[1, 2],
                cache: &mut a,
            },
            SequenceInput {
                tokens: &[3],
                cache: &mut b,
            },
        ])
        .expect_err("no free block");
    assert!(
        matches!(
            err,
            Error::CacheBlocksExhausted {
                block_size: 4,
                free: 0,
                needed: 1
            }
        ),
        "{err}"
    );
    assert_eq!((a.len(), b.len()), (6, 4));
    // a still has room in its second block.
    model.forward(&[1, 2], &mut a).unwrap();
    // Ending b frees its block for a.
    drop(b);
    assert_eq!(pool.free_blocks().unwrap(), 1);
    model.forward(&[3], &mut a).unwrap();
    a.reset();
    assert_eq!(pool.free_blocks().unwrap(), 3);
    // A static pool: one region per sequence; a third sequence finds none.
    let fixed = model
        .new_pool(CacheLayout::Static {
            max_batch: 2,
            max_len: 8,
        })
        .unwrap();
    let (mut s1, mut s2, mut s3) = (fixed.sequence(), fixed.sequence(), fixed.sequence());
    model.forward(&[1], &mut s1).unwrap();
    model.forward(&[1], &mut s2).unwrap();
    assert!(matches!(
        model.forward(&[1], &mut s3),
        Err(Error::CacheBlocksExhausted { .. })
    ));
    assert!(matches!(
        model.forward(&TOKENS, &mut s1),
        Err(Error::CacheFull {
            capacity: 8,
            len: 1,
            requested: 9
        })
    ));
    // Bad layouts name what is wrong.
    for layout in [
        CacheLayout::Paged {
            block_size: 4,
            budget_bytes: block_bytes - 1,
        },
        CacheLayout::Paged {
            block_size: 0,
            budget_bytes: 1 << 20,
        },
        CacheLayout::Static {
            max_batch: 0,
            max_len: 8,
        },
        CacheLayout::Static {
            max_batch: 1,
            max_len: 65,
        },
    ] {
        assert!(
            matches!(model.new_pool(layout), Err(Error::InvalidArgument { .. })),
            "{layout:?}"
        );
    }
}

#[test]
fn streamed_layers_give_the_same_logits() {
    let dir = hf_folder(GQA, "streaming");
    for dev in devices() {
        let resident = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        let want: Vec<f32> = resident.logits(&TOKENS).unwrap().to_vec().unwrap();
        for keep in [0, 1] {
            let streamed =
                Llama::load_streaming(&dev, ModelFiles::open(&dir).unwrap(), keep).unwrap();
            let mut cache = streamed.new_cache(16).unwrap();
            let mut got: Vec<f32> = streamed
                .forward(&TOKENS[..4], &mut cache)
                .unwrap()
                .to_vec()
                .unwrap();
            got.extend(
                streamed
                    .forward(&TOKENS[4..], &mut cache)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap(),
            );
            assert_close(
                &format!("{keep} resident layers on {}", dev.backend_name()),
                &got,
                &want,
                1e-6,
            );
        }
    }
}

#[test]
fn loading_reports_each_layer_then_the_unsplit_tensors() {
    let files = webtensor_llm::builtin::files().unwrap();
    let layers = files.config.num_hidden_layers;
    let mut seen = Vec::new();
    let model = Llama::load_with_progress(&reference(), files, &mut |done, total| {
        seen.push((done, total))
    })
    .unwrap();
    let steps = layers + 1;
    let expected: Vec<(usize, usize)> = (1..=steps).map(|done| (done, steps)).collect();
    assert_eq!(seen, expected);
    assert_eq!(model.config.num_hidden_layers, layers);
}

/// The decode loop with the next batch recorded from the device's last id while the previous
/// one is read back (`Pacing::decode_ahead`, what a hardware GPU gets) on the wgpu device
/// (lavapipe in CI, which does not get it by default): the same text as one batch at a time,
/// and as the cpu backend's. 21 decode steps: batches of 8, 8 and 5. Then a second generation
/// after the first's prompt and text, with the first's cache kept (`PromptCache`: cut back
/// past the steps recorded ahead, then only the new tokens run): the same text as from a
/// fresh cache.
#[test]
fn decode_ahead_on_wgpu_gives_the_same_text() {
    use webtensor_llm::generate::{prompt_ids, run_async, Pacing, PromptChunks, TextSink};
    use webtensor_llm::{builtin, sampler::Sampling, PromptCache};
    let Some(dev) = common::wgpu() else { return };
    let load = |dev: &Device| {
        let mut files = builtin::files().unwrap();
        let tokenizer = files.tokenizer.take().unwrap();
        (Llama::load(dev, files).unwrap(), tokenizer)
    };
    let text = |(model, tokenizer): &(Llama, webtensor_llm::Tokenizer),
                prompt: &str,
                cache: &mut PromptCache,
                decode_ahead: bool,
                steps_per_submit: usize| {
        let ids = prompt_ids(model, tokenizer, prompt, false).unwrap();
        let pacing = Pacing {
            steps_per_submit,
            token_latency: None,
            decode_ahead,
            prompt: PromptChunks::Whole,
            prompt_rows: 4,
        };
        let mut out = String::new();
        let mut sink = TextSink(|piece: &str| out.push_str(piece));
        let run = run_async(
            model,
            tokenizer,
            ids,
            cache,
            22,
            Sampling::greedy(),
            pacing,
            &mut sink,
        );
        let stats = pollster::block_on(run).unwrap();
        assert_eq!(stats.generated_tokens, 22);
        (out, stats.prompt_tokens_reused)
    };
    let (wgpu, cpu) = (load(&dev), load(&Device::new("cpu").unwrap()));
    let first = "In the beginning";
    let mut kept = PromptCache::new();
    let (ahead, _) = text(&wgpu, first, &mut kept, true, 8);
    let fresh = || PromptCache::new();
    assert_eq!(ahead, text(&wgpu, first, &mut fresh(), false, 8).0);
    assert_eq!(ahead, text(&cpu, first, &mut fresh(), false, 1).0);
    let second = format!("{first}{ahead} And");
    let (continued, reused) = text(&wgpu, &second, &mut kept, true, 8);
    assert!(reused > 20, "{reused} prompt tokens kept");
    assert_eq!(continued, text(&wgpu, &second, &mut fresh(), true, 8).0);
}

/// A decode step of a Q4_0 model with int8 activations on wgpu: the dispatches one more layer
/// adds (the count `bench --model` reports per step), at most 6 on GPUs (the row-team shapes:
/// q, k and v in one, attention, o, gate and up in one, down, the norms, ropes, KV stores and
/// roundings folded into the products) and 12 on CPU adapters (the lanes shape, where each
/// rounding, the norm folded in, is a dispatch of its own, q, k and v reading one). Both
/// shapes are forced (`WEBTENSOR_WGPU_ROW_TEAMS`) on whatever adapter runs the test. Counted
/// by `bench --model` in a process of its own: a backend's count takes in every device of its
/// process, and other tests run beside this.
#[test]
fn a_wgpu_decode_layer_takes_few_dispatches() {
    if common::wgpu().is_none() {
        return;
    }
    // The row-team (GPU) shape or the lanes (CPU adapter) shape, forced either way.
    let per_step = |layers: usize, teams: &str| {
        let s = Shape {
            hidden: 64,
            ffn: 64,
            heads: 4,
            kv_heads: 2,
            layers,
            ..GQA
        };
        let path = gguf_file(s, DType::Q4_0, &format!("dispatches-{layers}-{teams}"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_webtensor"))
            .args(["bench", "--model"])
            .arg(&path)
            .args([
                "--backend",
                "wgpu",
                "--prompt-tokens",
                "3",
                "--decode-tokens",
                "4",
            ])
            .args(["--runs", "1", "--json"])
            .env_remove("WEBTENSOR_BACKEND")
            .env("WEBTENSOR_WGPU_ROW_TEAMS", teams)
            .output()
            .expect("the webtensor binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "bench failed: {stderr}");
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("bench printed no JSON ({e}): {stderr}"));
        rows[0]["dispatches_per_token"]
            .as_f64()
            .unwrap_or_else(|| panic!("no dispatch count in {rows}"))
    };
    for (teams, most) in [("on", 6.0), ("off", 12.0)] {
        let (two, four) = (per_step(2, teams), per_step(4, teams));
        let per_layer = (four - two) / 2.0;
        assert!(
            per_layer <= most && per_layer > 0.0,
            "{per_layer} dispatches per decode layer (steps of {two} and {four}) with row teams \
             {teams}, at most {most} expected"
        );
    }
}

/// Tensors allocated together (`Tensor::zeros_group`: on the GPU shapes, views of one buffer,
/// as a layer's key and value pools are) in one op: each is read from its own memory, in
/// either order, and an op's output may be one of them.
#[test]
fn ops_on_tensors_allocated_together_read_each_its_own_memory() {
    for dev in common::wgpus() {
        tensors_allocated_together(&dev);
    }
}

fn tensors_allocated_together(dev: &Device) {
    use webtensor::ops;
    let shapes = [
        webtensor::Shape::from([4, 8]),
        webtensor::Shape::from([4, 8]),
    ];
    let mut parts = Tensor::zeros_group(dev, &shapes).unwrap();
    let a: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..32).map(|i| 100.0 - 3.0 * i as f32).collect();
    parts[0].write(&a).unwrap();
    parts[1].write(&b).unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    for (x, y) in [(0, 1), (1, 0)] {
        let got: Vec<f32> = ops::add(&parts[x], &parts[y]).unwrap().to_vec().unwrap();
        assert_eq!(got, want, "{x} + {y}");
    }
    // Into one of them: the values' rows copied over the keys' first two.
    let (keys, values) = parts.split_at_mut(1);
    let slots = Tensor::from_vec(dev, vec![0u32, 1], [2]).unwrap();
    let rows = ops::narrow(&values[0], 0, 0, 2).unwrap();
    ops::scatter_rows(&mut keys[0], &slots, &rows).unwrap();
    let got: Vec<f32> = keys[0].to_vec().unwrap();
    assert_eq!(&got[..16], &b[..16]);
    assert_eq!(&got[16..], &a[16..]);
    assert_eq!(values[0].to_vec::<f32>().unwrap(), b);
}
