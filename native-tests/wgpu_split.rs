//! Tensors larger than one storage binding on wgpu (issue 12): with the backend's binding
//! limit forced down to 32 KiB (the option `wgpu.max_binding`), weights and embedding tables
//! far larger than that are read one row range per binding, and every product and gather
//! against them matches the reference backend, as do models (a Llama, a Gemma 3) whose
//! embedding and tied LM head are larger than one binding, prompt and decode steps (the
//! K-quants' products too); the fused decode ops with
//! such a weight or KV pool run their composition. Ops that cannot be split still refuse such
//! a tensor with a typed error. The same runs on the adapter's own kernel shape and with the
//! row-team (GPU) shape forced, whose products with weights beyond one binding run through
//! the tiles.

mod common;

use common::{assert_close, reference, rng, tensor, uniform};
use webtensor::ops::{self, Activations};
use webtensor::{DType, Device, Error, Tensor};
use webtensor_llm::gguf::{self, GgufValue};
use webtensor_llm::weights::StoredDType;
use webtensor_llm::{FileBytes, Llama, ModelFiles, Sampler, Sampling};

const CAP: u64 = 32 * 1024;

/// Rows of the big weights: 1500 rows of 64 f32 values are 384 KB, twelve bindings.
const N: usize = 1500;

fn vec_of(t: &Tensor) -> Vec<f32> {
    t.to_vec().unwrap()
}

/// `a · wᵀ` for f32 weights, and for each packed format and activation kind, on `gpu` and on
/// the reference, for one, three (a temporary per range) and five activation rows (the
/// tiled kernels).
fn products(gpu: &Device) {
    let rf = reference();
    let mut r = rng(12);
    for m in [1usize, 3, 5] {
        let k = 64;
        let a = uniform(&mut r, m * k, 1.0);
        let w = uniform(&mut r, N * k, 1.0);
        let out = |dev: &Device| {
            let wt = tensor(dev, &w, &[N, k]);
            vec_of(&ops::matmul_t(&tensor(dev, &a, &[m, k]), &wt).unwrap())
        };
        assert_close(&format!("f32 matmul_t m={m}"), &out(gpu), &out(&rf), 1e-4);
    }
    for format in [DType::Q4_0, DType::Q8_0, DType::F16] {
        let k = 256;
        let w = uniform(&mut r, N * k, 1.0);
        // Packed on the reference, then moved: a packed tensor that size cannot be produced
        // on the capped device (quantize's output is one binding).
        let packed = ops::quantize(&tensor(&rf, &w, &[N, k]), format).unwrap();
        let on_gpu = packed.to_device(gpu).unwrap();
        assert!(
            (format.storage_len(N * k, k).unwrap() * format.unit_bytes()) as u64 > CAP,
            "the {format} weight must be larger than one binding"
        );
        let modes: &[Activations] = if format == DType::F16 {
            &[Activations::F32]
        } else {
            &[Activations::F32, Activations::Q8_0]
        };
        for &act in modes {
            for m in [1usize, 3, 5] {
                let a = uniform(&mut r, m * k, 1.0);
                let got = ops::qmatmul_t(&tensor(gpu, &a, &[m, k]), &on_gpu, act).unwrap();
                let want = ops::qmatmul_t(&tensor(&rf, &a, &[m, k]), &packed, act).unwrap();
                assert_close(
                    &format!("{format} qmatmul_t {act:?} m={m}"),
                    &vec_of(&got),
                    &vec_of(&want),
                    2e-3,
                );
            }
        }
    }
}

/// `a · wᵀ` for the K-quants wgpu reads (`Q4_K`, `Q6_K`, random super-blocks) with f32 and
/// `Q8_K` activations (a large vocabulary's `Q6_K` output head), the weight larger than one
/// binding: row ranges of 144- and 210-byte blocks, each range's product rounding the
/// activations into the one int8 buffer.
fn kquant_products(gpu: &Device) {
    let rf = reference();
    let mut r = rng(13);
    let k = 512;
    for format in [DType::Q4_K, DType::Q6_K] {
        let bytes = common::random_blocks(&mut r, format, N * k / format.block_len(), 0.01);
        assert!(
            bytes.len() as u64 > CAP,
            "the {format} weight must exceed a binding"
        );
        let packed = Tensor::from_bytes(&rf, format, bytes, [N, k]).unwrap();
        let on_gpu = packed.to_device(gpu).unwrap();
        for m in [1usize, 3, 5] {
            let a = uniform(&mut r, m * k, 1.0);
            for act in [Activations::F32, Activations::Q8_K] {
                let got = ops::qmatmul_t(&tensor(gpu, &a, &[m, k]), &on_gpu, act);
                let want = ops::qmatmul_t(&tensor(&rf, &a, &[m, k]), &packed, act);
                assert_close(
                    &format!("{format} qmatmul_t {act:?} m={m}"),
                    &vec_of(&got.unwrap()),
                    &vec_of(&want.unwrap()),
                    2e-3,
                );
            }
        }
    }
}

/// The fused decode ops with a weight or KV pool larger than one binding: the backend runs
/// their composition, whose products and gathers read it in row ranges.
fn fused(gpu: &Device) {
    let rf = reference();
    let mut r = rng(21);
    let k = 64;
    let x = uniform(&mut r, 2 * k, 1.0);
    let (g, u) = (uniform(&mut r, N * k, 1.0), uniform(&mut r, N * k, 1.0));
    let res = uniform(&mut r, 2 * N, 1.0);
    let swiglu = |dev: &Device| {
        let w = |v: &[f32]| tensor(dev, v, &[N, k]);
        let x = tensor(dev, &x, &[2, k]);
        vec_of(&ops::swiglu_linear(&x, &w(&g), &w(&u), Activations::F32).unwrap())
    };
    assert_close("swiglu_linear", &swiglu(gpu), &swiglu(&rf), 1e-4);
    let residual = |dev: &Device| {
        let (x, w) = (tensor(dev, &x, &[2, k]), tensor(dev, &g, &[N, k]));
        let res = tensor(dev, &res, &[2, N]);
        vec_of(&ops::linear_residual(&x, &w, &res, Activations::F32).unwrap())
    };
    assert_close("linear_residual", &residual(gpu), &residual(&rf), 1e-4);
    // A pool of N rows of 64 values (384 KB), the sequence's rows spread over it.
    let (keys, values) = (uniform(&mut r, N * k, 1.0), uniform(&mut r, N * k, 1.0));
    let rows: Vec<u32> = (0..40u32).map(|j| (j * 37 + 11) % N as u32).collect();
    let q = uniform(&mut r, 2 * k, 1.0);
    let attend = |dev: &Device| {
        let pool = |v: &[f32]| tensor(dev, v, &[N, k]);
        let rows = tensor(dev, &rows, &[1, 40]);
        let out = ops::paged_attention(
            &tensor(dev, &q, &[1, 2 * k]),
            (&pool(&keys), &pool(&values)),
            (&rows, 40),
            2,
            0.125,
            (None, None),
        );
        vec_of(&out.unwrap())
    };
    assert_close("paged_attention", &attend(gpu), &attend(&rf), 1e-4);
}

/// An embedding gather from a table of twelve bindings, with ids in every range, at both ends
/// of ranges and repeated.
fn gather(gpu: &Device) {
    let dim = 64;
    let table = uniform(&mut rng(7), N * dim, 1.0);
    let ids: Vec<u32> = vec![0, 1499, 128, 700, 127, 64, 63, 1024, 1499, 5];
    let out = |dev: &Device| {
        let t = tensor(dev, &table, &[N, dim]);
        let ids = tensor(dev, &ids, &[ids.len()]);
        vec_of(&ops::embedding(&t, &ids).unwrap())
    };
    assert_close("embedding gather", &out(gpu), &out(&reference()), 0.0);
}

/// A Llama and a Gemma 3 (hidden 8, vocab 1500) whose embedding table and tied LM head, 48 KB
/// each, exceed the 32 KiB binding: logits of a three-token prompt and of the next token match
/// the reference, and so do the ids of greedy decode steps (on wgpu the first step recorded,
/// the others replayed).
fn model(gpu: &Device, arch: &str) {
    let (vocab, hidden, ffn, head_dim) = (1500usize, 8usize, 16usize, 4usize);
    let gemma3 = arch == "gemma3";
    let mut r = rng(3);
    let mut tensors: Vec<(String, StoredDType, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, shape: Vec<usize>| {
        let n = shape.iter().product();
        let bytes = uniform(&mut r, n, 0.5)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        tensors.push((name.to_string(), StoredDType::F32, shape, bytes));
    };
    add("token_embd.weight", vec![vocab, hidden]);
    add("blk.0.attn_norm.weight", vec![hidden]);
    add("blk.0.attn_q.weight", vec![hidden, hidden]);
    add("blk.0.attn_k.weight", vec![hidden, hidden]);
    add("blk.0.attn_v.weight", vec![hidden, hidden]);
    add("blk.0.attn_output.weight", vec![hidden, hidden]);
    add("blk.0.ffn_norm.weight", vec![hidden]);
    add("blk.0.ffn_gate.weight", vec![ffn, hidden]);
    add("blk.0.ffn_up.weight", vec![ffn, hidden]);
    add("blk.0.ffn_down.weight", vec![hidden, ffn]);
    add("output_norm.weight", vec![hidden]);
    if gemma3 {
        add("blk.0.attn_q_norm.weight", vec![head_dim]);
        add("blk.0.attn_k_norm.weight", vec![head_dim]);
        add("blk.0.post_attention_norm.weight", vec![hidden]);
        add("blk.0.post_ffw_norm.weight", vec![hidden]);
    }
    let u = |v: usize| GgufValue::U64(v as u64);
    let key = |k: &str| format!("{arch}.{k}");
    let mut meta = vec![
        (
            "general.architecture".to_string(),
            GgufValue::Str(arch.into()),
        ),
        (key("vocab_size"), u(vocab)),
        (key("embedding_length"), u(hidden)),
        (key("feed_forward_length"), u(ffn)),
        (key("block_count"), u(1)),
        (key("attention.head_count"), u(2)),
        (key("attention.head_count_kv"), u(2)),
        (key("context_length"), u(64)),
        (
            key("attention.layer_norm_rms_epsilon"),
            GgufValue::F64(1e-5),
        ),
        (key("rope.freq_base"), GgufValue::F64(10000.0)),
    ];
    if gemma3 {
        meta.push((key("attention.sliding_window"), u(2)));
    }
    let bytes = gguf::write(&meta, &tensors).unwrap();
    let run = |dev: &Device| {
        let files = ModelFiles::from_gguf("split.gguf", FileBytes::Owned(bytes.clone())).unwrap();
        let model = Llama::load(dev, files).unwrap();
        let mut cache = model.new_cache(16).unwrap();
        let mut all = vec_of(&model.forward(&[3, 1100, 977], &mut cache).unwrap());
        all.extend(vec_of(&model.forward(&[1499], &mut cache).unwrap()));
        let mut sampler = Sampler::new(Sampling::greedy());
        let ids = model.decode(700, &mut cache, 6, &mut sampler).unwrap();
        (all, ids)
    };
    let ((logits, ids), (want_logits, want_ids)) = (run(gpu), run(&reference()));
    assert_close(&format!("{arch} logits"), &logits, &want_logits, 1e-3);
    assert_eq!(ids, want_ids, "{arch} decode steps");
}

#[test]
fn tensors_beyond_one_binding_are_read_in_row_ranges() {
    beyond_one_binding(webtensor::BackendOptions::default());
}

#[test]
fn tensors_beyond_one_binding_are_read_in_row_ranges_by_row_teams() {
    beyond_one_binding(common::row_teams());
}

fn beyond_one_binding(mut options: webtensor::BackendOptions) {
    options.wgpu.max_binding = Some(CAP);
    let Some(gpu) = common::wgpu_with(options) else {
        return;
    };
    let limit = gpu
        .info()
        .limits
        .iter()
        .find(|(name, _)| name == "max_storage_buffer_binding_size")
        .map(|(_, v)| *v);
    assert_eq!(limit, Some(CAP), "the binding limit was not forced down");

    products(&gpu);
    kquant_products(&gpu);
    fused(&gpu);
    gather(&gpu);
    model(&gpu, "llama");
    model(&gpu, "gemma3");

    // An op that reads its input whole still refuses it, naming the limit.
    let big = tensor(&gpu, &vec![1.0f32; N * 64], &[N, 64]);
    match ops::add(&big, &big) {
        Err(Error::TensorTooLarge { limit_name, .. }) => {
            assert_eq!(limit_name, "max_storage_buffer_binding_size")
        }
        other => panic!("expected TensorTooLarge, got {other:?}"),
    }
}
