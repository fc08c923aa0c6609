//! Checkpoints written by transformers itself (scripts/make_hf_fixtures.py) against
//! transformers' own logits: one tiny random model per architecture (OLMo 2 and SmolLM3
//! included) and rope type, saved as transformers 5.x writes them plus configs in the 4.x
//! style, each run on a 48-token prompt long enough for rope scaling, sliding windows and
//! SmolLM3's layer without rope to matter. The same checkpoints converted
//! by llama.cpp's `convert_hf_to_gguf.py` (scripts/make_gguf_fixtures.py) must load and match
//! too: f32 within the same bound, Q8_0/Q4_0 within a bound set from llama.cpp's own error on
//! those files.

mod common;

use std::path::{Path, PathBuf};

use webtensor::Device;
use webtensor_llm::gguf::{self, GgufValue};
use webtensor_llm::{FileBytes, Llama, ModelFiles, PromptCache, Sampler, Sampling};

/// transformers' f32 logits against ours.
const F32_TOL: f32 = 1e-3;

fn fixtures() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("native-tests/fixtures/hf")
}

struct Case {
    name: String,
    weights: String,
}

fn manifest() -> (Vec<u32>, Vec<Case>) {
    let text = std::fs::read_to_string(fixtures().join("cases.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let prompt = v["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let cases = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            weights: c["weights"].as_str().unwrap().to_string(),
        })
        .collect();
    (prompt, cases)
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The case's config over its weights (a 4.x config shares a 5.x case's weights).
fn hf_files(case: &Case) -> ModelFiles {
    let dir = fixtures().join(&case.name);
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let weights = fixtures().join(&case.weights).join("model.safetensors");
    let bytes = FileBytes::Owned(std::fs::read(&weights).unwrap());
    ModelFiles::from_parts(&config, vec![(weights.display().to_string(), bytes)], None)
        .unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

/// The largest |a − b|; infinite where either is NaN (which `f32::max` would skip).
fn max_delta(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (x - y).abs();
            if d.is_nan() {
                f32::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f32::max)
}

fn logits(dev: &Device, files: ModelFiles, prompt: &[u32]) -> Vec<f32> {
    let model = Llama::load(dev, files).unwrap();
    model.logits(prompt).unwrap().to_vec().unwrap()
}

fn devices() -> Vec<(&'static str, Device)> {
    let mut d = vec![("cpu", common::cpu())];
    d.extend(common::wgpu().map(|w| ("wgpu", w)));
    d
}

#[test]
fn transformers_checkpoints_match_transformers_logits() {
    let (prompt, cases) = manifest();
    assert!(prompt.len() >= 40);
    let mut failures = Vec::new();
    for (dev_name, dev) in devices() {
        for case in &cases {
            let want = read_f32(&fixtures().join(&case.name).join("logits.f32"));
            let got = logits(&dev, hf_files(case), &prompt);
            let delta = max_delta(&got, &want);
            println!(
                "{dev_name} {:<16} safetensors f32  max|Δ| = {delta:.2e}",
                case.name
            );
            if delta > F32_TOL {
                failures.push(format!("{dev_name} {}: {delta}", case.name));
            }
        }
    }
    assert!(failures.is_empty(), "beyond {F32_TOL}: {failures:?}");
}

/// Token by token through the cache gives the prompt's logits too: the dynamic rope table, the
/// sliding windows and the cache agree between prefill and decode.
#[test]
fn decoding_token_by_token_matches_transformers() {
    let (prompt, cases) = manifest();
    let dev = common::cpu();
    for case in cases.iter().filter(|c| {
        [
            "mistral",
            "qwen2_swa",
            "phi3",
            "llama_yarn",
            "qwen3",
            "olmo2",
            "smollm3",
            "gemma2",
            "gemma3",
        ]
        .contains(&c.name.as_str())
    }) {
        let want = read_f32(&fixtures().join(&case.name).join("logits.f32"));
        let model = Llama::load(&dev, hf_files(case)).unwrap();
        let mut cache = model.new_cache(prompt.len()).unwrap();
        let mut got = Vec::new();
        for chunk in prompt.chunks(5) {
            got.extend(
                model
                    .forward(chunk, &mut cache)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap(),
            );
        }
        let delta = max_delta(&got, &want);
        assert!(delta <= F32_TOL, "{}: {delta}", case.name);
    }
}

/// Phi-3.5's `longrope` token by token through the cache on every backend, as safetensors and as
/// its GGUF conversion (the factors as `rope_factors_long/short.weight`), against transformers
/// fed the same way (`logits_incremental.f32`): each pass picks the short or the long factors
/// by its own longest position, so the first 16 tokens rotate by the short ones (their keys
/// cached so), the rest by the long ones, which one pass over the whole prompt (the
/// `logits.f32` the other tests check) never does.
#[test]
fn longrope_switches_factors_by_the_pass_length_as_transformers_does() {
    let (prompt, cases) = manifest();
    let case = cases.iter().find(|c| c.name == "phi3_longrope").unwrap();
    let want = read_f32(&fixtures().join(&case.name).join("logits_incremental.f32"));
    let gguf = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("native-tests/fixtures/gguf/phi3_longrope.f32.gguf");
    for (dev_name, dev) in devices() {
        for (format, files) in [
            ("safetensors", hf_files(case)),
            ("gguf", ModelFiles::open(&gguf).unwrap()),
        ] {
            let model = Llama::load(&dev, files).unwrap();
            let mut cache = model.new_cache(prompt.len()).unwrap();
            let mut got = Vec::new();
            for &token in &prompt {
                let logits = model.forward(&[token], &mut cache).unwrap();
                got.extend(logits.to_vec::<f32>().unwrap());
            }
            let delta = max_delta(&got, &want);
            println!("{dev_name} phi3_longrope {format} token by token max|Δ| = {delta:.2e}");
            assert!(delta <= F32_TOL, "{dev_name} {format}: {delta}");
        }
    }
}

/// OLMo 2, SmolLM3, Gemma 2 and Gemma 3 one token at a time on every backend, as safetensors and
/// as their GGUF conversion: the single-row path of decode (the fused products, the key and value stored
/// straight into the cache where nothing comes between, attention per token) against
/// transformers' logits of the whole prompt, which ran through the composition.
#[test]
fn olmo2_smollm3_and_gemma_decode_token_by_token_on_every_backend() {
    let (prompt, cases) = manifest();
    let gguf_dir =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("native-tests/fixtures/gguf");
    let mut failures = Vec::new();
    for (dev_name, dev) in devices() {
        for case in cases.iter().filter(|c| FAMILIES.contains(&c.name.as_str())) {
            let own = read_f32(&fixtures().join(&case.name).join("logits.f32"));
            let gguf = gguf_dir.join(format!("{}.f32.gguf", case.name));
            for (format, files, want) in [
                ("safetensors", hf_files(case), own),
                (
                    "gguf",
                    ModelFiles::open(&gguf).unwrap(),
                    gguf_expected(&case.name),
                ),
            ] {
                let model = Llama::load(&dev, files).unwrap();
                let mut cache = model.new_cache(prompt.len()).unwrap();
                let mut got = Vec::new();
                for &token in &prompt {
                    let logits = model.forward(&[token], &mut cache).unwrap();
                    got.extend(logits.to_vec::<f32>().unwrap());
                }
                let delta = max_delta(&got, &want);
                println!(
                    "{dev_name} {:<8} {format:<11} token by token max|Δ| = {delta:.2e}",
                    case.name
                );
                if delta > F32_TOL {
                    failures.push(format!("{dev_name} {} {format}: {delta}", case.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "beyond {F32_TOL}: {failures:?}");
}

/// OLMo 2, SmolLM3, Gemma 2 and Gemma 3 decode steps (`Llama::decode`: each id drawn on the device
/// and fed to the next step; on wgpu the first step recorded and the others replayed, unless another test
/// uses the device meanwhile, which native-tests/engine/decode.rs rules out to check that) after
/// the prompt draw transformers' greedy continuation (`greedy.json`), as safetensors and GGUF
/// (Gemma as safetensors only: its GGUF describes another model, see [`gguf_expected`]).
#[test]
fn olmo2_smollm3_and_gemma_decode_steps_draw_transformers_greedy_ids() {
    let (prompt, cases) = manifest();
    let gguf_dir =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("native-tests/fixtures/gguf");
    let (last, before) = prompt.split_last().unwrap();
    for (dev_name, dev) in devices() {
        for case in cases.iter().filter(|c| FAMILIES.contains(&c.name.as_str())) {
            let want = greedy_ids(&case.name);
            let gguf = gguf_dir.join(format!("{}.f32.gguf", case.name));
            let mut formats = vec![("safetensors", hf_files(case))];
            // Gemma's GGUF describes another model (`gguf_expected`), whose greedy ids
            // transformers did not write.
            if !case.name.starts_with("gemma") {
                formats.push(("gguf", ModelFiles::open(&gguf).unwrap()));
            }
            for (format, files) in formats {
                let model = Llama::load(&dev, files).unwrap();
                let mut cache = model.new_cache(prompt.len() + want.len()).unwrap();
                model.forward(before, &mut cache).unwrap();
                let mut sampler = Sampler::new(Sampling::greedy());
                let got = model
                    .decode(*last, &mut cache, want.len(), &mut sampler)
                    .unwrap();
                assert_eq!(got, want, "{dev_name} {} {format}", case.name);
            }
        }
    }
}

/// transformers' greedy continuation of the prompt for a case (`greedy.json`).
fn greedy_ids(case: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(fixtures().join(case).join("greedy.json")).unwrap();
    let greedy: serde_json::Value = serde_json::from_str(&text).unwrap();
    greedy["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Generation stops at SmolLM3's end of turn, `<|im_end|>`. The SmolLM3 GGUF's vocabulary
/// with the second id of transformers' greedy continuation renamed `<|im_end|>` (a control
/// token, as in SmolLM3's own vocabulary, where the converter also makes it the end of
/// sequence) draws that id second and stops there; with its own vocabulary it runs on.
#[test]
fn smollm3_generation_stops_at_its_end_of_turn() {
    let greedy = greedy_ids("smollm3");
    stops_at_end_of_turn("smollm3", "<|im_end|>", greedy[1], (greedy.len(), 2));
}

/// Generation stops at Gemma's end of turn, `<end_of_turn>`: the Gemma 2 and Gemma 3 GGUFs'
/// vocabularies with llama.cpp's greedy next id after the prompt (the last row of its logits on
/// the file) renamed `<end_of_turn>` stop at the first token; with their own they run on.
#[test]
fn gemma_generation_stops_at_its_end_of_turn() {
    let (prompt, _) = manifest();
    let dir =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("native-tests/fixtures/gguf");
    for case in ["gemma2", "gemma3"] {
        let theirs = llama_cpp_logits(&dir.join(format!("{case}.f32.gguf")));
        let vocab = theirs.len() / prompt.len();
        let last = &theirs[theirs.len() - vocab..];
        let next = (0..vocab)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap();
        stops_at_end_of_turn(case, "<end_of_turn>", next as u32, (6, 1));
    }
}

/// Runs the prompt through `case`'s f32 GGUF on every device, once with its own vocabulary
/// (`steps.0` tokens generated, no stop) and once with `end_of_turn`'s piece renamed `piece`
/// as a control token (`steps.1` tokens generated, stopped there).
fn stops_at_end_of_turn(case: &str, piece: &str, end_of_turn: u32, steps: (usize, usize)) {
    use webtensor_llm::generate::{run_async, Pacing, PromptChunks, TextSink};
    let (prompt, _) = manifest();
    let end_of_turn = end_of_turn as usize;
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join(format!("native-tests/fixtures/gguf/{case}.f32.gguf"));
    let bytes = std::fs::read(&path).unwrap();
    let g = gguf::parse("f32.gguf", &bytes).unwrap();
    let tensors: Vec<_> = g
        .tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.dtype,
                t.shape.clone(),
                bytes[t.range.clone()].to_vec(),
            )
        })
        .collect();
    let mut metadata: Vec<(String, GgufValue)> = g.metadata.clone().into_iter().collect();
    let own = metadata.clone();
    for (key, value) in metadata.iter_mut() {
        let array = || value.as_array().unwrap().iter();
        if key == "tokenizer.ggml.tokens" {
            let mut tokens: Vec<&str> = array().map(|t| t.as_str().unwrap()).collect();
            tokens[end_of_turn] = piece;
            *value = GgufValue::Array(gguf::GgufArray::strings(tokens));
        } else if key == "tokenizer.ggml.token_type" {
            let mut types: Vec<i64> = array().map(|t| t.as_u64().unwrap() as i64).collect();
            types[end_of_turn] = 3; // llama.cpp's CONTROL
            *value = GgufValue::Array(gguf::GgufArray::i64s(types));
        }
    }
    for (dev_name, dev) in devices() {
        for (vocabulary, metadata) in [("own", &own), ("edited", &metadata)] {
            let file = FileBytes::Owned(gguf::write(metadata, &tensors).unwrap());
            let files = ModelFiles::from_gguf("edited.gguf", file).unwrap();
            let tokenizer = files.tokenizer.clone().unwrap();
            let model = Llama::load(&dev, files).unwrap();
            let mut cache = PromptCache::for_one_prompt();
            let pacing = Pacing::for_device(&dev, PromptChunks::Whole);
            let mut sink = TextSink(|_: &str| {});
            let run = run_async(
                &model,
                &tokenizer,
                prompt.clone(),
                &mut cache,
                steps.0,
                Sampling::greedy(),
                pacing,
                &mut sink,
            );
            let stats = pollster::block_on(run).unwrap();
            let want = if vocabulary == "edited" {
                steps.1
            } else {
                steps.0
            };
            assert_eq!(
                stats.generated_tokens, want,
                "{case} {dev_name}, {vocabulary} vocabulary"
            );
            assert_eq!(
                stats.stopped_at_eos,
                vocabulary == "edited",
                "{case} {dev_name}"
            );
        }
    }
}

/// The families whose decode paths are checked on every backend in both formats.
const FAMILIES: [&str; 4] = ["olmo2", "smollm3", "gemma2", "gemma3"];

/// The cases converted to GGUF by llama.cpp's converter (scripts/make_gguf_fixtures.py).
const GGUF_CASES: [&str; 11] = [
    "llama31",
    "llama_linear",
    "llama_yarn",
    "qwen2",
    "qwen3",
    "phi3",
    "olmo2",
    "smollm3",
    "gemma2",
    "gemma3",
    "phi3_longrope",
];

/// transformers' logits of the model a case's GGUF conversion describes: `logits_gguf.f32`
/// where that is another model (Gemma: llama.cpp's converter drops `query_pre_attn_scalar`,
/// and llama.cpp scales attention by 1/√head_dim), else the checkpoint's own.
fn gguf_expected(case: &str) -> Vec<f32> {
    let own = fixtures().join(case).join("logits_gguf.f32");
    match own.exists() {
        true => read_f32(&own),
        false => read_f32(&fixtures().join(case).join("logits.f32")),
    }
}

/// How far our logits on a quantized file may be from transformers' f32 logits, relative to
/// how far llama.cpp's own logits on the same file are. The engine rounds activations to Q8_0
/// blocks for these weights, as llama.cpp does, but not at the same points (llama.cpp also
/// keeps its KV cache in f16), so the two errors are draws of the same size: measured over the
/// converted cases, ours is 0.85–1.34× llama.cpp's for Q8_0 and 0.97–1.02× for Q4_0.
/// A wrong format, scale or rope table gives errors many times larger.
const QUANT_SLACK: f32 = 1.5;

/// llama.cpp's logits on a GGUF fixture (written by scripts/make_gguf_fixtures.py).
fn llama_cpp_logits(gguf: &Path) -> Vec<f32> {
    read_f32(&gguf.with_extension("gguf.llama_cpp.f32"))
}

/// The largest |a − b| over the given rows of `[rows, vocab]` logits.
fn max_delta_rows(a: &[f32], b: &[f32], vocab: usize, rows: &[usize]) -> f32 {
    rows.iter()
        .map(|&r| {
            max_delta(
                &a[r * vocab..(r + 1) * vocab],
                &b[r * vocab..(r + 1) * vocab],
            )
        })
        .fold(0.0, f32::max)
}

/// The f32 conversion must give transformers' logits (within [`F32_TOL`], every position).
/// The Q8_0/Q4_0 ones within [`QUANT_SLACK`] times llama.cpp's own error on the same file, and
/// near llama.cpp's logits on that file,
/// measured over the positions where llama.cpp runs the same model as transformers (its
/// logits on the f32 file within 1e-2): llama.cpp's Phi-3 ignores the sliding window, so past
/// the window it computes another model.
#[test]
fn converted_gguf_files_match_transformers_logits() {
    let (prompt, _) = manifest();
    let dir =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("native-tests/fixtures/gguf");
    let mut failures = Vec::new();
    for (dev_name, dev) in devices() {
        for case in GGUF_CASES {
            let want = gguf_expected(case);
            let vocab = want.len() / prompt.len();
            let f32_file = dir.join(format!("{case}.f32.gguf"));
            let theirs_f32 = llama_cpp_logits(&f32_file);
            let same_model: Vec<usize> = (0..prompt.len())
                .filter(|&r| max_delta_rows(&theirs_f32, &want, vocab, &[r]) <= 1e-2)
                .collect();
            assert!(
                same_model.len() >= 16,
                "{case}: llama.cpp agrees on too few positions"
            );
            let q8_0_theirs = llama_cpp_logits(&dir.join(format!("{case}.q8_0.gguf")));
            let q8_0_error = max_delta_rows(&q8_0_theirs, &want, vocab, &same_model);
            for format in ["f32", "q8_0", "q4_0"] {
                let path = dir.join(format!("{case}.{format}.gguf"));
                let files = ModelFiles::open(&path).unwrap_or_else(|e| panic!("{case}: {e}"));
                let got = logits(&dev, files, &prompt);
                let all = max_delta(&got, &want);
                let theirs = llama_cpp_logits(&path);
                let theirs_all = max_delta(&theirs, &want);
                let (delta, tol) = if format == "f32" {
                    (all, F32_TOL)
                } else {
                    let ours = max_delta_rows(&got, &want, vocab, &same_model);
                    let bound = max_delta_rows(&theirs, &want, vocab, &same_model);
                    (ours, QUANT_SLACK * bound)
                };
                let vs_llama_cpp = max_delta_rows(&got, &theirs, vocab, &same_model);
                println!(
                    "{dev_name} {case:<14} gguf {format:<5} max|Δ| = {all:.2e} (llama.cpp \
                     {theirs_all:.2e}); on the {} positions llama.cpp agrees on: {delta:.2e}, \
                     bound {tol:.2e}; against llama.cpp {vs_llama_cpp:.2e}",
                    same_model.len()
                );
                if delta > tol {
                    failures.push(format!("{dev_name} {case} {format}: {delta} > {tol}"));
                }
                // On the same packed weights we and llama.cpp differ only by how the
                // activations are rounded (llama.cpp rounds them to Q8_0 blocks): within
                // llama.cpp's own Q8_0 error. A much tighter check for Q4_0, whose error
                // against transformers is large.
                if format != "f32" && vs_llama_cpp > QUANT_SLACK * q8_0_error {
                    failures.push(format!(
                        "{dev_name} {case} {format}: {vs_llama_cpp} from llama.cpp's logits"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// What the engine does not implement is refused with the name of what is wrong, never run with
/// other numbers: Qwen2's biases under a Llama config would be left unused; an unknown rope type
/// or architecture; a GGUF key that changes the numbers.
#[test]
fn what_would_change_the_numbers_is_refused_by_name() {
    let weights = std::fs::read(fixtures().join("qwen2/model.safetensors")).unwrap();
    let text = std::fs::read_to_string(fixtures().join("qwen2/config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    let load = |edit: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
        let mut c = config.clone();
        edit(c.as_object_mut().unwrap());
        let bytes = FileBytes::Owned(weights.clone());
        ModelFiles::from_parts(
            &c.to_string(),
            vec![("model.safetensors".into(), bytes)],
            None,
        )
        .and_then(|files| Llama::load(&common::cpu(), files))
        .err()
        .unwrap_or_else(|| panic!("{c} loaded"))
        .to_string()
    };
    let err = load(&|c| {
        c.insert(
            "architectures".into(),
            serde_json::json!(["LlamaForCausalLM"]),
        );
        c.insert("model_type".into(), "llama".into());
        for key in [
            "use_sliding_window",
            "sliding_window",
            "max_window_layers",
            "layer_types",
        ] {
            c.remove(key);
        }
    });
    assert!(
        err.contains("model.layers.0.self_attn.k_proj.bias"),
        "{err}"
    );
    let err = load(&|c| {
        c["rope_parameters"]["rope_type"] = "mrope".into();
    });
    assert!(err.contains("rope_parameters.rope_type"), "{err}");
    let err = load(&|c| {
        c.insert(
            "architectures".into(),
            serde_json::json!(["Qwen2MoeForCausalLM"]),
        );
    });
    assert!(err.contains("Qwen2MoeForCausalLM"), "{err}");

    // A GGUF key that would change the numbers, in the converter's file otherwise unchanged.
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("native-tests/fixtures/gguf/qwen2.f32.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let g = gguf::parse("qwen2.f32.gguf", &bytes).unwrap();
    let mut metadata: Vec<(String, GgufValue)> = g.metadata.clone().into_iter().collect();
    let tensors: Vec<_> = g
        .tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.dtype,
                t.shape.clone(),
                bytes[t.range.clone()].to_vec(),
            )
        })
        .collect();
    let rewrite = |metadata: &[(String, GgufValue)]| {
        let file = FileBytes::Owned(gguf::write(metadata, &tensors).unwrap());
        ModelFiles::from_gguf("edited.gguf", file)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(rewrite(&metadata), None, "the unedited file loads");
    metadata.push(("qwen2.attn_logit_softcapping".into(), GgufValue::F64(30.0)));
    let err = rewrite(&metadata).unwrap();
    assert!(err.contains("qwen2.attn_logit_softcapping"), "{err}");
    metadata.pop();
    metadata.push((
        "qwen2.rope.scaling.type".into(),
        GgufValue::Str("longrope".into()),
    ));
    let err = rewrite(&metadata).unwrap();
    assert!(err.contains("qwen2.rope.scaling.type"), "{err}");
}

/// What OLMo 2 and SmolLM3 settings the engine does not implement is refused by name:
/// SmolLM3's sliding windows (on its layers without rope, as transformers places them), a
/// `no_rope_layers` flag that is neither 0 nor 1, a `no_rope_layers` list of the wrong length,
/// and OLMo 2 split over devices, whose ranks would each norm only their own heads of q and k.
/// Gemma 2's bidirectional attention, another activation, a layer type other than sliding or
/// full, a cap that is not positive; its settings on another architecture. Gemma 2's defaults
/// as transformers' (every even layer sliding, tied embeddings) where its config leaves them
/// out. Gemma 3's bidirectional attention, rope types other than linear or default on its full
/// layers and other than default on its sliding ones, a layer type `rope_parameters` does not
/// know, a sliding layer without a window; its 4.x config (`rope_theta`, `rope_scaling`,
/// `rope_local_base_freq`, `sliding_window_pattern`) read as the 5.x one transformers wrote.
#[test]
fn olmo2_smollm3_and_gemma_settings_not_implemented_are_refused_by_name() {
    let load = |case: &str, edit: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
        let dir = fixtures().join(case);
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
        edit(config.as_object_mut().unwrap());
        let bytes = FileBytes::Owned(std::fs::read(dir.join("model.safetensors")).unwrap());
        ModelFiles::from_parts(
            &config.to_string(),
            vec![("model.safetensors".into(), bytes)],
            None,
        )
    };
    let refused = |case: &str, edit: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
        load(case, edit)
            .err()
            .unwrap_or_else(|| panic!("{case}: the edited config loaded"))
            .to_string()
    };
    let err = refused("smollm3", &|c| {
        c.remove("layer_types");
        c.insert("use_sliding_window".into(), true.into());
        c.insert("sliding_window".into(), 16.into());
    });
    assert!(err.contains("use_sliding_window"), "{err}");
    let err = refused("smollm3", &|c| {
        c["layer_types"][3] = "sliding_attention".into();
    });
    assert!(err.contains("layer_types"), "{err}");
    let err = refused("smollm3", &|c| {
        c["no_rope_layers"][0] = 2.into();
    });
    assert!(err.contains("no_rope_layers"), "{err}");
    let err = refused("smollm3", &|c| {
        c["no_rope_layers"] = serde_json::json!([1, 1, 0]);
    });
    assert!(err.contains("no_rope_layers"), "{err}");
    // Without `no_rope_layers`, transformers' default every fourth layer: the same model.
    let files = load("smollm3", &|c| {
        c.remove("no_rope_layers");
    })
    .unwrap();
    assert_eq!(files.config.layer_rope, [true, true, true, false]);

    let err = refused("gemma2", &|c| {
        c.insert("use_bidirectional_attention".into(), true.into());
    });
    assert!(err.contains("use_bidirectional_attention"), "{err}");
    let err = refused("gemma2", &|c| {
        c.insert("hidden_activation".into(), "gelu".into());
    });
    assert!(err.contains("gelu") && err.contains("Gemma2"), "{err}");
    let err = refused("gemma2", &|c| {
        c["layer_types"][1] = "chunked_attention".into();
    });
    assert!(err.contains("layer_types"), "{err}");
    for cap in ["attn_logit_softcapping", "final_logit_softcapping"] {
        let err = refused("gemma2", &|c| {
            c.insert(cap.into(), 0.0.into());
        });
        assert!(err.contains(cap), "{err}");
        let err = refused("olmo2", &|c| {
            c.insert(cap.into(), 30.0.into());
        });
        assert!(err.contains(cap), "{err}");
    }
    let files = load("gemma2", &|c| {
        c.remove("layer_types");
        c.remove("tie_word_embeddings");
    })
    .unwrap();
    assert_eq!(files.config.layer_windows, [Some(12), None, Some(12), None]);
    assert!(files.config.tie_word_embeddings);

    let err = refused("gemma3", &|c| {
        c.insert("use_bidirectional_attention".into(), true.into());
    });
    assert!(err.contains("use_bidirectional_attention"), "{err}");
    let err = refused("gemma3", &|c| {
        c["rope_parameters"]["full_attention"] =
            serde_json::json!({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6});
    });
    assert!(
        err.contains("rope_parameters.full_attention.rope_type"),
        "{err}"
    );
    let err = refused("gemma3", &|c| {
        c["rope_parameters"]["sliding_attention"] =
            serde_json::json!({"rope_type": "linear", "factor": 2.0});
    });
    assert!(
        err.contains("rope_parameters.sliding_attention.rope_type"),
        "{err}"
    );
    let err = refused("gemma3", &|c| {
        c["rope_parameters"]["chunked_attention"] = serde_json::json!({});
    });
    assert!(err.contains("rope_parameters.chunked_attention"), "{err}");
    let err = refused("gemma3", &|c| {
        c.insert("sliding_window".into(), serde_json::Value::Null);
    });
    assert!(err.contains("sliding_window"), "{err}");
    let v5 = load("gemma3", &|_| {}).unwrap().config;
    let v4 = load("gemma3", &|c| {
        for key in ["rope_parameters", "layer_types", "_sliding_window_pattern"] {
            c.remove(key);
        }
        c.insert("rope_theta".into(), 1e6.into());
        c.insert(
            "rope_scaling".into(),
            serde_json::json!({"rope_type": "linear", "factor": 8.0}),
        );
        c.insert("rope_local_base_freq".into(), 1e4.into());
        c.insert("sliding_window_pattern".into(), 6.into());
    })
    .unwrap()
    .config;
    assert_eq!(
        (&v4.rope, &v4.local_rope, &v4.layer_windows),
        (&v5.rope, &v5.local_rope, &v5.layer_windows)
    );
    assert_eq!(
        v5.layer_windows,
        [Some(12); 5].into_iter().chain([None]).collect::<Vec<_>>()
    );
    assert_eq!(v5.local_rope.as_ref().map(|r| r.theta), Some(1e4));

    let olmo2 = load("olmo2", &|_| {}).unwrap();
    let devices = [common::cpu(), common::cpu()];
    let err = Llama::load_parallel(&devices, olmo2, webtensor_llm::TpConfig { size: 2 })
        .err()
        .expect("OLMo 2 split over two devices")
        .to_string();
    assert!(err.contains("OLMo 2"), "{err}");
}

/// transformers' own rope tables and attention factors at real models' sizes (Llama 3.1 8B,
/// Llama 3.2 1B, Qwen2.5 with yarn, a DeepSeek-style yarn with mscale, linear, dynamic at a
/// pass of 6000 tokens), each read from the `config.json` transformers writes for it.
#[test]
fn rope_tables_match_transformers_at_real_sizes() {
    let text = std::fs::read_to_string(fixtures().join("rope_tables.json")).unwrap();
    let tables: serde_json::Value = serde_json::from_str(&text).unwrap();
    for t in tables.as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let c = webtensor_llm::LlamaConfig::from_json(&t["config"].to_string(), name)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let seq_len = t["seq_len"].as_u64().unwrap() as usize;
        let ours = c
            .rope
            .inv_freq(c.head_dim(), seq_len, c.max_position_embeddings);
        let theirs: Vec<f64> = t["inv_freq"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(ours.len(), theirs.len(), "{name}");
        // transformers computes the table in f32: a few ulps apart.
        for (i, (&a, &b)) in ours.iter().zip(&theirs).enumerate() {
            let rel = (a as f64 - b).abs() / b;
            assert!(rel < 4e-6, "{name} pair {i}: {a} against {b}");
        }
        let factor = t["attention_factor"].as_f64().unwrap();
        assert!(
            (c.rope.attention_factor() - factor).abs() < 1e-12,
            "{name}: attention factor {} against {factor}",
            c.rope.attention_factor()
        );
    }
}
