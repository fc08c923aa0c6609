//! A tiny Llama written as GGUF in the test itself (vocab 16, hidden 8, ffn 16, two heads of
//! 4), with every metadata key and tensor shape open to change, so a test can make a model
//! that lies in exactly one way.
#![allow(dead_code)]

use webtensor_llm::gguf::{self, GgufValue};
use webtensor_llm::weights::StoredDType;
use webtensor_llm::{FileBytes, ModelFiles};

/// A tiny model: vocab 16, hidden 8, ffn 16, heads 2 (kv 2), head_dim 4.
pub const VOCAB: usize = 16;
pub const HIDDEN: usize = 8;
pub const FFN: usize = 16;

pub type RawTensors = Vec<(String, StoredDType, Vec<usize>, Vec<u8>)>;

pub fn f32_bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (((i as u32 * 7 + seed) % 13) as f32 / 13.0 - 0.5).to_le_bytes())
        .collect()
}

/// GGUF tensors of a tiny model with `layers` layers and these q/k/v row counts.
pub fn tiny_tensors(layers: usize, q_rows: usize, kv_rows: usize) -> RawTensors {
    let mut t: RawTensors = Vec::new();
    let mut add = |name: String, shape: Vec<usize>| {
        let n = shape.iter().product();
        let seed = t.len() as u32;
        t.push((name, StoredDType::F32, shape, f32_bytes(n, seed)));
    };
    add("token_embd.weight".into(), vec![VOCAB, HIDDEN]);
    for i in 0..layers {
        let p = |n: &str| format!("blk.{i}.{n}");
        add(p("attn_norm.weight"), vec![HIDDEN]);
        add(p("attn_q.weight"), vec![q_rows, HIDDEN]);
        add(p("attn_k.weight"), vec![kv_rows, HIDDEN]);
        add(p("attn_v.weight"), vec![kv_rows, HIDDEN]);
        add(p("attn_output.weight"), vec![HIDDEN, q_rows]);
        add(p("ffn_norm.weight"), vec![HIDDEN]);
        add(p("ffn_gate.weight"), vec![FFN, HIDDEN]);
        add(p("ffn_up.weight"), vec![FFN, HIDDEN]);
        add(p("ffn_down.weight"), vec![HIDDEN, FFN]);
    }
    add("output_norm.weight".into(), vec![HIDDEN]);
    t
}

pub fn u(v: u64) -> GgufValue {
    GgufValue::U64(v)
}

/// The tiny model's metadata, with `overrides` replacing or adding keys.
pub fn tiny_meta(overrides: &[(&str, GgufValue)]) -> Vec<(String, GgufValue)> {
    let mut meta: Vec<(String, GgufValue)> = vec![
        (
            "general.architecture".into(),
            GgufValue::Str("llama".into()),
        ),
        ("llama.vocab_size".into(), u(VOCAB as u64)),
        ("llama.embedding_length".into(), u(HIDDEN as u64)),
        ("llama.feed_forward_length".into(), u(FFN as u64)),
        ("llama.block_count".into(), u(1)),
        ("llama.attention.head_count".into(), u(2)),
        ("llama.attention.head_count_kv".into(), u(2)),
        ("llama.context_length".into(), u(64)),
    ];
    for (key, value) in overrides {
        match meta.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.clone(),
            None => meta.push((key.to_string(), value.clone())),
        }
    }
    meta
}

/// The tiny model's files, as GGUF bytes in memory, with `overrides` in its metadata.
pub fn tiny_model(overrides: &[(&str, GgufValue)]) -> ModelFiles {
    let bytes = gguf::write(&tiny_meta(overrides), &tiny_tensors(1, 8, 8)).unwrap();
    ModelFiles::from_gguf("tiny.gguf", FileBytes::Owned(bytes)).unwrap()
}
