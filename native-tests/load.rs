//! Load: long generation through a paged cache that recycles its blocks (memory stays flat),
//! many sequences sharing one pool, and one `Device` used from several threads at once. Each
//! is a correctness test on a tiny model; how fast they run belongs in `webtensor bench`.

mod common;
#[path = "common/tiny.rs"]
mod tiny;

use std::sync::Mutex;

use tiny::{tiny_model, u, VOCAB};
use webtensor::{Device, Tensor};
use webtensor_llm::{CacheLayout, KvCache, Llama, Sampler, Sampling, SequenceInput};

/// The tests of this file run one at a time, so the resident memory one measures is its own.
static SERIAL: Mutex<()> = Mutex::new(());

/// Resident memory of this process, in bytes (Linux), or `None`.
fn rss() -> Option<u64> {
    common::proc_status_bytes("VmRSS")
}

fn model(dev: &Device) -> Llama {
    // A context of 64 tokens: a sequence fills its blocks quickly and is recycled often.
    Llama::load(dev, tiny_model(&[("llama.context_length", u(64))])).unwrap()
}

/// Generates `total` tokens as back-to-back sequences through one paged pool: each sequence
/// runs until its context is full, then is dropped, returning its blocks. Calls `at` with
/// the number of tokens generated so far after each sequence.
fn generate_recycling(model: &Llama, total: usize, mut at: impl FnMut(usize)) {
    let pool = model
        .new_pool(CacheLayout::Paged {
            block_size: 8,
            budget_bytes: 1 << 20,
        })
        .unwrap();
    let blocks = pool.total_blocks().unwrap();
    let mut sampler = Sampler::new(Sampling {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        seed: 7,
    });
    let mut done = 0;
    while done < total {
        let mut seq = pool.sequence();
        let mut last = model
            .sample_next(&[(done % VOCAB) as u32], &mut seq, &mut sampler)
            .unwrap();
        done += 1;
        while done < total && seq.len() < seq.capacity() {
            let steps = 8.min(seq.capacity() - seq.len()).min(total - done);
            let ids = model.decode(last, &mut seq, steps, &mut sampler).unwrap();
            assert_eq!(ids.len(), steps);
            assert!(ids.iter().all(|&id| (id as usize) < VOCAB));
            last = *ids.last().unwrap();
            done += steps;
        }
        drop(seq);
        assert_eq!(
            pool.free_blocks().unwrap(),
            blocks,
            "blocks were not returned"
        );
        at(done);
    }
}

#[test]
fn ten_thousand_tokens_through_a_recycling_paged_cache_keep_memory_flat() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = model(&Device::cpu());
    let (mut at_1k, mut at_10k) = (None, None);
    generate_recycling(&model, 10_000, |done| {
        if done >= 1_000 && at_1k.is_none() {
            at_1k = rss();
        }
        if done >= 10_000 {
            at_10k = rss();
        }
    });
    let (Some(a), Some(b)) = (at_1k, at_10k) else {
        eprintln!("no /proc/self/status: resident memory not checked");
        return;
    };
    eprintln!(
        "resident memory: {:.1} MiB after 1k tokens, {:.1} MiB after 10k",
        a as f64 / 1048576.0,
        b as f64 / 1048576.0
    );
    // Nine thousand more tokens may not cost more than a few MiB of allocator noise.
    assert!(
        b <= a + (8 << 20),
        "resident memory grew from {a} to {b} bytes"
    );
}

#[test]
fn many_sequences_share_one_pool() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Device::cpu();
    let model = model(&dev);
    let pool = model
        .new_pool(CacheLayout::Paged {
            block_size: 4,
            budget_bytes: 1 << 20,
        })
        .unwrap();
    let blocks = pool.total_blocks().unwrap();
    let prompts: Vec<Vec<u32>> = (0..16)
        .map(|s| {
            (0..(1 + s % 7))
                .map(|i| ((s * 5 + i) % VOCAB) as u32)
                .collect()
        })
        .collect();
    let mut caches: Vec<KvCache> = prompts.iter().map(|_| pool.sequence()).collect();
    // Three rounds: every sequence's prompt, then two more tokens each, all in one batch.
    let mut rounds: Vec<Vec<Vec<u32>>> = vec![prompts.clone()];
    for r in 0..2u32 {
        rounds.push(
            (0..prompts.len())
                .map(|s| vec![(s as u32 + r) % VOCAB as u32])
                .collect(),
        );
    }
    let mut batched = vec![Vec::new(); prompts.len()];
    for round in &rounds {
        let mut batch: Vec<SequenceInput> = round
            .iter()
            .zip(caches.iter_mut())
            .map(|(tokens, cache)| SequenceInput { tokens, cache })
            .collect();
        let logits = model.forward_batch(&mut batch).unwrap().to_vec().unwrap();
        let mut rows = logits.chunks(VOCAB);
        for (s, tokens) in round.iter().enumerate() {
            for _ in tokens {
                batched[s].extend_from_slice(rows.next().unwrap());
            }
        }
    }
    assert!(pool.free_blocks().unwrap() < blocks);
    drop(caches);
    assert_eq!(pool.free_blocks().unwrap(), blocks);
    // Each sequence alone, with a cache of its own, gives the same logits.
    for (s, got) in batched.iter().enumerate() {
        let tokens: Vec<u32> = rounds.iter().flat_map(|r| r[s].clone()).collect();
        let alone = model.logits(&tokens).unwrap().to_vec().unwrap();
        common::assert_close(&format!("sequence {s}"), got, &alone, 1e-5);
    }
}

#[test]
fn one_device_from_many_threads_gives_the_single_threaded_results() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut devices = vec![Device::cpu()];
    devices.extend(common::wgpu());
    for dev in devices {
        let model = model(&dev);
        let inputs: Vec<Vec<u32>> = (0..8)
            .map(|t| (0..(3 + t)).map(|i| ((t * 3 + i) % VOCAB) as u32).collect())
            .collect();
        let alone: Vec<Vec<f32>> = inputs
            .iter()
            .map(|ids| model.logits(ids).unwrap().to_vec().unwrap())
            .collect();
        let a = Tensor::from_vec(
            &dev,
            (0..64 * 48).map(|i| (i % 17) as f32).collect(),
            [64, 48],
        )
        .unwrap();
        let b = Tensor::from_vec(
            &dev,
            (0..48 * 32).map(|i| (i % 5) as f32).collect(),
            [48, 32],
        )
        .unwrap();
        let product: Vec<f32> = webtensor::ops::matmul(&a, &b).unwrap().to_vec().unwrap();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..3 {
                        for (ids, want) in inputs.iter().zip(&alone) {
                            let got: Vec<f32> = model.logits(ids).unwrap().to_vec().unwrap();
                            assert_eq!(&got, want, "{} logits differ", dev.backend_name());
                        }
                        let p: Vec<f32> = webtensor::ops::matmul(&a, &b).unwrap().to_vec().unwrap();
                        assert_eq!(p, product, "{} matmul differs", dev.backend_name());
                    }
                });
            }
        });
    }
}
