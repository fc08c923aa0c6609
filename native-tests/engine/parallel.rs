//! Tensor parallelism: a model split over 2 and 4 devices (cpu, separate logical wgpu devices
//! on one adapter, cpu + wgpu) gives the logits of the unsplit model on the reference
//! backend, for prefill, decode, grouped-query attention, biases, a paged cache, batches,
//! multi-step decode and a block-quantized GGUF; sizes and devices that do not fit are typed
//! errors.

use super::*;
use webtensor::{BackendKind, DeviceBuilder};
use webtensor_llm::{Sampler, Sampling, TpConfig};

/// 8 query heads over 4 key/value heads: tp 2 and 4 both keep groups of 2 per rank; biases
/// are split with their rows.
const SPLIT: Shape = Shape {
    vocab: 61,
    hidden: 64,
    ffn: 64,
    layers: 2,
    heads: 8,
    kv_heads: 4,
    tied: false,
    bias: true,
};

/// A separate logical wgpu device (its own queue and memory on the shared adapter).
fn separate_wgpu() -> Option<Device> {
    let built = DeviceBuilder::default()
        .priority(vec![BackendKind::Wgpu, BackendKind::Cpu])
        .strict(true)
        .separate(true)
        .build();
    match built {
        Ok(d) => Some(d),
        Err(e) if common::wgpu_required() => panic!("the wgpu backend must run in CI: {e}"),
        Err(e) => {
            eprintln!("skipping wgpu tensor-parallel devices: {e}");
            None
        }
    }
}

/// The device sets to split over, with a name.
fn device_sets() -> Vec<(String, Vec<Device>)> {
    let mut sets = vec![
        ("cpu×2".to_string(), vec![common::cpu(), common::cpu()]),
        ("cpu×4".to_string(), vec![common::cpu(); 4]),
    ];
    let gpus: Vec<Device> = (0..4).map_while(|_| separate_wgpu()).collect();
    if gpus.len() == 4 {
        sets.push(("wgpu×2".into(), gpus[..2].to_vec()));
        sets.push(("wgpu×4".into(), gpus));
        sets.push((
            "cpu+wgpu".into(),
            vec![common::cpu(), separate_wgpu().unwrap()],
        ));
    }
    sets
}

fn load_split(devices: &[Device], path: &Path) -> Llama {
    let tp = TpConfig {
        size: devices.len(),
    };
    Llama::load_parallel(devices, ModelFiles::open(path).unwrap(), tp).unwrap()
}

/// Prompt logits, then three tokens decoded one at a time after the prompt.
fn prefill_and_decode(model: &Llama) -> Vec<f32> {
    let mut cache = model.new_cache(16).unwrap();
    let mut out: Vec<f32> = model
        .forward(&TOKENS[..6], &mut cache)
        .unwrap()
        .to_vec()
        .unwrap();
    for &t in &TOKENS[6..] {
        out.extend(
            model
                .forward(&[t], &mut cache)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
        );
    }
    out
}

#[test]
fn split_models_give_the_unsplit_logits() {
    let dir = hf_folder(SPLIT, "tp");
    let single = Llama::load(&reference(), ModelFiles::open(&dir).unwrap()).unwrap();
    let want = prefill_and_decode(&single);
    for (name, devices) in device_sets() {
        let model = load_split(&devices, &dir);
        assert_eq!(model.devices().len(), devices.len());
        assert_close(
            &format!("prefill + decode on {name}"),
            &prefill_and_decode(&model),
            &want,
            TOL,
        );
        let (collective, stats) = model.collective_stats();
        assert_eq!(collective, "host");
        // Per pass: one broadcast, two all-reduces per layer; four passes.
        assert_eq!(stats.calls, 4 * (1 + 2 * SPLIT.layers as u64), "{name}");
    }
    let (_, stats) = single.collective_stats();
    assert_eq!(stats.calls, 0, "one device moves nothing");
}

#[test]
fn split_models_run_paged_caches_batches_and_multi_step_decode() {
    let dir = hf_folder(SPLIT, "tp-paged");
    let single = Llama::load(&reference(), ModelFiles::open(&dir).unwrap()).unwrap();
    let prompts: [&[u32]; 3] = [&TOKENS, &[7, 8, 9, 10], &TOKENS[2..9]];
    let want: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| single.logits(p).unwrap().to_vec().unwrap())
        .collect();
    let greedy = |model: &Llama| {
        let mut sampler = Sampler::new(Sampling::greedy());
        let mut cache = model.new_cache(32).unwrap();
        let first = model
            .sample_next(&TOKENS[..5], &mut cache, &mut sampler)
            .unwrap();
        model.decode(first, &mut cache, 6, &mut sampler).unwrap()
    };
    let want_ids = greedy(&single);
    for (name, devices) in device_sets() {
        let model = load_split(&devices, &dir);
        let head_dim = SPLIT.hidden / SPLIT.heads;
        let block_bytes = 3 * SPLIT.layers * 2 * SPLIT.kv_heads * head_dim * 4;
        let paged = model
            .new_pool(CacheLayout::Paged {
                block_size: 3,
                budget_bytes: 9 * block_bytes,
            })
            .unwrap();
        check_interleaved(&model, &paged, &prompts, &want, &format!("paged on {name}"));
        let (mut a, mut b) = (paged.sequence(), paged.sequence());
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
        let both = [want[0].clone(), want[1].clone()].concat();
        assert_close(&format!("batch on {name}"), &got, &both, TOL);
        assert_eq!(
            greedy(&model),
            want_ids,
            "multi-step greedy decode on {name}"
        );
    }
}

#[test]
fn split_block_quantized_models_match_the_unsplit_model() {
    // Q8_0 blocks of 32: a rank's 32 of 64 columns of the output and down projections are
    // whole blocks.
    let path = gguf_file(SPLIT, DType::Q8_0, "tp-q8");
    let whole = Llama::load(&common::cpu(), ModelFiles::open(&path).unwrap()).unwrap();
    let want: Vec<f32> = whole.logits(&TOKENS).unwrap().to_vec().unwrap();
    let split = load_split(&[common::cpu(), common::cpu()], &path);
    let got: Vec<f32> = split.logits(&TOKENS).unwrap().to_vec().unwrap();
    assert_close("q8_0 split over 2", &got, &want, TOL);
    // Over 4 ranks a part is 16 columns: half a block.
    let err = Llama::load_parallel(
        &[common::cpu(), common::cpu(), common::cpu(), common::cpu()],
        ModelFiles::open(&path).unwrap(),
        TpConfig { size: 4 },
    )
    .err()
    .expect("half blocks are refused");
    assert!(
        matches!(&err, Error::TpIndivisible { size: 4, what, .. } if what.contains("blocks of 32")),
        "{err}"
    );
}

#[test]
fn sizes_and_devices_that_do_not_fit_are_typed_errors() {
    let dir = hf_folder(SPLIT, "tp-errors");
    let open = || ModelFiles::open(&dir).unwrap();
    let cpus = |n: usize| vec![common::cpu(); n];
    // 3 divides neither the 8 heads nor the 4 key/value heads.
    let err = Llama::load_parallel(&cpus(3), open(), TpConfig { size: 3 })
        .err()
        .unwrap();
    assert!(
        matches!(
            &err,
            Error::TpIndivisible {
                size: 3,
                count: 8,
                ..
            }
        ),
        "{err}"
    );
    // 8 divides the heads but not the 4 key/value heads.
    let err = Llama::load_parallel(&cpus(8), open(), TpConfig { size: 8 })
        .err()
        .unwrap();
    assert!(
        matches!(
            &err,
            Error::TpIndivisible {
                size: 8,
                count: 4,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("key/value heads"), "{err}");
    let err = Llama::load_parallel(&cpus(2), open(), TpConfig { size: 4 })
        .err()
        .unwrap();
    assert!(matches!(&err, Error::TpDevices { size: 4, .. }), "{err}");
    let err = Llama::load_parallel(&[], open(), TpConfig { size: 0 })
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::TpIndivisible { size: 0, .. }),
        "{err}"
    );
    // A device whose memory cannot hold its part is refused before anything is uploaded.
    let small = DeviceBuilder::default()
        .priority(vec![BackendKind::Cpu])
        .memory_limit(1024)
        .build()
        .unwrap();
    let err = Llama::load_parallel(&[common::cpu(), small], open(), TpConfig { size: 2 })
        .err()
        .unwrap();
    assert!(matches!(&err, Error::OutOfMemory { .. }), "{err}");
    // A cache of the unsplit model does not fit the split one.
    let split = Llama::load_parallel(&cpus(2), open(), TpConfig { size: 2 }).unwrap();
    let whole = Llama::load(&common::cpu(), open()).unwrap();
    let mut cache = whole.new_cache(8).unwrap();
    assert!(matches!(
        split.forward(&[1], &mut cache),
        Err(Error::InvalidArgument { .. })
    ));
}

/// A split's devices start with the options given (`--tp` with the overrides of the command
/// line, `bench --tp`), not with the defaults.
#[test]
fn split_devices_start_with_the_options_given() {
    let mut options = webtensor::BackendOptions::default();
    options.wgpu.row_teams = webtensor::backend::Switch::On;
    options.cuda.graphs = false;
    let devices =
        webtensor_llm::tensor_parallel::devices_of(BackendKind::Cpu, 2, &options).unwrap();
    assert_eq!(devices.len(), 2);
    for d in &devices {
        assert_eq!(d.options(), &options);
    }
}

#[test]
fn the_bench_reports_decode_speed_and_all_reduce_time_per_tp_size() {
    use webtensor_llm::ActivationMode;
    let dir = hf_folder(SPLIT, "tp-bench");
    let open = || ModelFiles::open(&dir);
    let rows = webtensor_llm::bench::tensor_parallel::run(
        &open,
        &[BackendKind::Cpu],
        &[1, 2, 4],
        (4, 3),
        (ActivationMode::F32, &webtensor::BackendOptions::default()),
        1,
        |_| {},
    )
    .unwrap();
    assert_eq!(rows.iter().map(|r| r.tp).collect::<Vec<_>>(), [1, 2, 4]);
    for r in &rows {
        assert!(r.checked, "tp {} logits: {}", r.tp, r.max_abs_error);
        assert!(r.decode_tokens_per_s.is_some_and(|v| v > 0.0));
        // Per decoded token: one broadcast and two all-reduces per layer, none on one device.
        let calls = if r.tp == 1 {
            0.0
        } else {
            1.0 + 2.0 * SPLIT.layers as f64
        };
        assert_eq!(r.collective_calls_per_token, Some(calls), "tp {}", r.tp);
        assert!(r.all_reduce_ms_per_token.is_some());
    }
    let table = webtensor_llm::bench::tensor_parallel::table("split", &rows);
    assert!(table.contains("reduce ms/tok"), "{table}");
    assert_eq!(table.lines().count(), 2 + rows.len(), "{table}");
}
