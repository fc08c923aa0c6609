//! Decode steps with their inputs kept on the device: on wgpu, and on cuda (as a CUDA graph,
//! unless the option `cuda.graphs` is off) where a CUDA device is present, the first step is
//! recorded and every later one replays it (`KvCache::decode_is_replayed`), and the ids drawn
//! are those of single steps read back one at a time, across cache blocks, a change of
//! sampling, and on the cpu backend, which runs the ops. Where a replay cannot stand for a step
//! (a debug hook, layers streamed from the files) the ops run and the ids are the same.

use super::*;
use webtensor_llm::{Sampler, Sampling};

/// The devices of the decode tests: [`devices`], and cuda where a CUDA device is present.
fn decode_devices() -> Vec<Device> {
    let mut d = devices();
    d.extend(common::cuda());
    // Decode steps as ops on cuda too, where it is present.
    let mut options = webtensor::BackendOptions::default();
    options.cuda.graphs = false;
    if common::cuda().is_some() {
        d.extend(Device::with_options("cuda", options).ok());
    }
    d
}

/// Whether a decode on `dev` replays its recorded step: on wgpu, and on cuda unless its
/// option `cuda.graphs` is off and it runs its steps as ops.
fn replays(dev: &Device) -> bool {
    match dev.backend_name() {
        "wgpu" => true,
        "cuda" => dev.options().cuda.graphs,
        _ => false,
    }
}

/// Held by each test here: the wgpu backend is one per process, and a capture during which
/// another test uploads or reads back is spoiled (its steps run as ops), so two of these at
/// once made a check that a decode was replayed fail now and then.
static ONE_CAPTURE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`ONE_CAPTURE`], also after a test that held it failed.
fn one_capture() -> std::sync::MutexGuard<'static, ()> {
    ONE_CAPTURE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sampling that draws (not greedy), so the sampler's numbers matter.
const WARM: Sampling = Sampling {
    temperature: 0.9,
    top_k: 20,
    top_p: 0.9,
    seed: 7,
};

/// The ids of `steps` single steps after `prompt` (each read back and fed again from the
/// host): the first from the prompt's pass, then one per step.
fn single_steps(
    model: &Llama,
    mut cache: KvCache,
    prompt: &[u32],
    steps: usize,
    s: Sampling,
) -> Vec<u32> {
    let mut sampler = Sampler::new(s);
    let mut next = model.sample_next(prompt, &mut cache, &mut sampler).unwrap();
    let mut ids = vec![next];
    for _ in 0..steps {
        next = model
            .sample_next(&[next], &mut cache, &mut sampler)
            .unwrap();
        ids.push(next);
    }
    ids
}

/// The ids of the prompt's draw and then `batches` decodes, the first fed from the host and
/// the others from the device's last id, as the generation loop does.
fn decoded(
    model: &Llama,
    cache: &mut KvCache,
    prompt: &[u32],
    batches: &[usize],
    s: Sampling,
) -> Vec<u32> {
    let mut sampler = Sampler::new(s);
    let first = model.sample_next(prompt, cache, &mut sampler).unwrap();
    let mut ids = vec![first];
    let mut last: Option<Tensor> = None;
    for &steps in batches {
        let batch = match &last {
            None => model.decode_on_device(first, cache, steps, &mut sampler),
            Some(previous) => model.decode_on_device_after(previous, cache, steps, &mut sampler),
        }
        .unwrap();
        ids.extend(batch.to_vec::<u32>().unwrap());
        last = Some(batch);
    }
    ids
}

#[test]
fn decode_steps_replay_on_wgpu_and_draw_the_ids_of_single_steps() {
    let _one = one_capture();
    let dir = hf_folder(GQA, "decode-replay");
    let prompt = &TOKENS[..5];
    for dev in decode_devices() {
        let gpu = replays(&dev);
        let model = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        for sampling in [Sampling::greedy(), WARM] {
            let what = format!("{sampling:?} on {}", dev.backend_name());
            let want = single_steps(&model, model.new_cache(32).unwrap(), prompt, 11, sampling);
            let mut cache = model.new_cache(32).unwrap();
            let got = decoded(&model, &mut cache, prompt, &[4, 4, 3], sampling);
            assert_eq!(got, want, "{what}");
            assert_eq!(cache.len(), prompt.len() + 11, "{what}");
            assert_eq!(cache.decode_is_replayed(), gpu, "{what}");
        }
        // One cache, its sampling changed between decodes: each is recorded anew.
        let mut cache = model.new_cache(32).unwrap();
        let mut sampler = Sampler::new(Sampling::greedy());
        let first = model.sample_next(prompt, &mut cache, &mut sampler).unwrap();
        let mut got = vec![first];
        got.extend(model.decode(first, &mut cache, 3, &mut sampler).unwrap());
        let mut warm = Sampler::new(WARM);
        let last = *got.last().unwrap();
        got.extend(model.decode(last, &mut cache, 3, &mut warm).unwrap());
        let mut want_cache = model.new_cache(32).unwrap();
        let mut sampler = Sampler::new(Sampling::greedy());
        let mut want = vec![model
            .sample_next(prompt, &mut want_cache, &mut sampler)
            .unwrap()];
        for i in 0..6 {
            if i == 3 {
                sampler = Sampler::new(WARM);
            }
            let next = *want.last().unwrap();
            want.push(
                model
                    .sample_next(&[next], &mut want_cache, &mut sampler)
                    .unwrap(),
            );
        }
        assert_eq!(got, want, "greedy then warm on {}", dev.backend_name());
        // A reset cache decodes again from position 0 through the same recorded step.
        cache.reset();
        let again = decoded(&model, &mut cache, prompt, &[5], Sampling::greedy());
        let want = single_steps(
            &model,
            model.new_cache(32).unwrap(),
            prompt,
            5,
            Sampling::greedy(),
        );
        assert_eq!(again, want, "after a reset on {}", dev.backend_name());
    }
}

/// A paged cache of blocks of 2 tokens: each new block changes the row table the recorded
/// step reads, which the decode state writes again.
#[test]
fn replayed_steps_follow_a_paged_sequence_across_its_blocks() {
    let _one = one_capture();
    let dir = hf_folder(GQA, "decode-paged");
    let prompt = &TOKENS[..3];
    let block_bytes = 2 * GQA.layers * 2 * (GQA.kv_heads * GQA.hidden / GQA.heads) * 4;
    for dev in decode_devices() {
        let model = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        let pool = model
            .new_pool(CacheLayout::Paged {
                block_size: 2,
                budget_bytes: 24 * block_bytes,
            })
            .unwrap();
        // Another sequence of the pool takes blocks between this one's.
        let mut other = pool.sequence();
        model.forward(&TOKENS[..5], &mut other).unwrap();
        let want = single_steps(&model, pool.sequence(), prompt, 9, WARM);
        let mut cache = pool.sequence();
        let got = decoded(&model, &mut cache, prompt, &[3, 6], WARM);
        assert_eq!(got, want, "on {}", dev.backend_name());
        assert_eq!(cache.decode_is_replayed(), replays(&dev));
    }
}

/// Steps a recorded step cannot stand for run as ops, with the same ids.
#[test]
fn hooks_and_streamed_layers_decode_without_replays() {
    let _one = one_capture();
    let dir = hf_folder(GQA, "decode-ops");
    let prompt = &TOKENS[..4];
    for dev in decode_devices() {
        let name = dev.backend_name();
        let resident = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        let want = single_steps(&resident, resident.new_cache(16).unwrap(), prompt, 4, WARM);
        let mut hooked = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        let points = [HookPoint::parse("logits").unwrap()];
        hooked.set_hook(&points, Box::new(|_, _, _| {}));
        let mut cache = hooked.new_cache(16).unwrap();
        assert_eq!(
            decoded(&hooked, &mut cache, prompt, &[4], WARM),
            want,
            "hook on {name}"
        );
        assert!(!cache.decode_is_replayed(), "hook on {name}");
        // Layers uploaded per pass: the recording sees an upload and is not kept.
        let streamed = Llama::load_streaming(&dev, ModelFiles::open(&dir).unwrap(), 1).unwrap();
        let mut cache = streamed.new_cache(16).unwrap();
        assert_eq!(
            decoded(&streamed, &mut cache, prompt, &[2, 2], WARM),
            want,
            "streamed on {name}"
        );
        assert!(!cache.decode_is_replayed(), "streamed on {name}");
    }
}

/// A cache far wider than the keys it holds: wgpu splits attention over its keys by the row
/// table's columns (the cache's capacity: on CPU adapters 21 chunks here, on GPUs 2), and each
/// replayed step sizes the chunks from its own key count, so the recorded step's early chunks
/// fill as the sequence grows and its late ones stay empty. The ids are those of single steps,
/// whose tables are only as wide as their keys (no split).
#[test]
fn replayed_steps_split_attention_over_a_wide_cache() {
    let _one = one_capture();
    let dir = hf_folder(GQA, "decode-wide");
    let mut config: serde_json::Value = serde_json::from_str(&config_json(GQA)).unwrap();
    config["max_position_embeddings"] = 1024.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let prompt: Vec<u32> = TOKENS.iter().cycle().take(21).copied().collect();
    for dev in decode_devices() {
        let model = Llama::load(&dev, ModelFiles::open(&dir).unwrap()).unwrap();
        for sampling in [Sampling::greedy(), WARM] {
            let what = format!("{sampling:?} on {}", dev.backend_name());
            let want = single_steps(&model, model.new_cache(64).unwrap(), &prompt, 30, sampling);
            let mut cache = model.new_cache(700).unwrap();
            let got = decoded(&model, &mut cache, &prompt, &[8, 8, 8, 6], sampling);
            assert_eq!(got, want, "{what}");
            assert_eq!(cache.decode_is_replayed(), replays(&dev));
        }
    }
}

/// Work another thread records on the same backend while a step is captured is not the
/// step's: it spoils the capture, so the step is not replayed (a replay would run that
/// thread's dispatches again, into its buffers, as a Phi-3 test's token-by-token logits running
/// beside a decode test once showed); the same step alone is captured.
#[test]
fn work_from_another_thread_spoils_a_capture() {
    let _one = one_capture();
    for dev in decode_devices().into_iter().filter(replays) {
        let what = dev.backend_name();
        let x = Tensor::from_slice(&dev, &[1.0f32, -2.0, 3.0, 0.5], [4]).unwrap();
        let (_, alone) = dev.capture(|| webtensor::ops::silu(&x)).unwrap();
        assert!(alone.is_some(), "{what}: a step alone is captured");
        let (_, shared) = dev
            .capture(|| {
                std::thread::scope(|s| s.spawn(|| webtensor::ops::silu(&x).map(drop)).join())
                    .expect("the other thread")?;
                webtensor::ops::silu(&x)
            })
            .unwrap();
        assert!(
            shared.is_none(),
            "{what}: another thread's work joined the capture"
        );
    }
}
