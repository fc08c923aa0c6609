//! The engine's integer activations against llama.cpp's own rounding on the same GGUF files
//! (native-tests/fixtures/llama_cpp, written by scripts/llama_cpp_agreement.py).

mod common;

use std::path::{Path, PathBuf};

use common::reference;
use webtensor::Device;
use webtensor_llm::{ActivationMode, Llama, ModelFiles};

/// The root-mean-square difference (steadier than the largest one: a single value rounding
/// the other way moves the largest difference a lot and the RMS little).
fn rms_difference(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    (sum / a.len().max(1) as f64).sqrt()
}

/// Integer activations (q8_0 for q8_0/q4_0 weights) round the way llama.cpp does, and no
/// worse: on random GGUF files written with gguf-py, every backend's integer-activation logits
/// lie within 1.2× llama.cpp's own RMS distance from the reference forward with f32
/// activations (llama.cpp's logits committed by scripts/llama_cpp_agreement.py). Measured when
/// this was written: 0.92–1.07× llama.cpp's distance on every backend; one int8 scale per row
/// instead of per block of 32 (a planted bug) gives 1.25–1.36×. Above 1e-5 too: the rounding
/// really happens (f32 activations are 1e-7 away).
#[test]
fn integer_activations_agree_with_f32_as_well_as_llama_cpp_does() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("native-tests/fixtures/llama_cpp");
    for format in ["q8_0", "q4_0"] {
        let path = dir.join(format!("random-{format}.gguf"));
        let fixture: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("random-{format}.llama_cpp.json"))).unwrap(),
        )
        .unwrap();
        let tokens: Vec<u32> = serde_json::from_value(fixture["tokens"].clone()).unwrap();
        let llama_cpp: Vec<Vec<f32>> = serde_json::from_value(fixture["logits"].clone()).unwrap();
        let run = |dev: &Device, mode: ActivationMode| -> Vec<f32> {
            let mut model = Llama::load(dev, ModelFiles::open(&path).unwrap()).unwrap();
            model.set_activations(mode);
            model.logits(&tokens).unwrap().to_vec().unwrap()
        };
        let exact = run(&reference(), ActivationMode::F32);
        let bound = 1.2 * rms_difference(&llama_cpp.concat(), &exact);
        let mut devices = vec![reference(), common::cpu()];
        devices.extend(common::wgpu());
        for dev in devices {
            let err = rms_difference(&run(&dev, ActivationMode::Integer), &exact);
            let what = format!("{format} integer activations on {}", dev.backend_name());
            eprintln!(
                "{what}: {err:.3e} from f32 (llama.cpp: {:.3e})",
                bound / 1.2
            );
            assert!(
                err <= bound,
                "{what}: {err:.3e} from f32, llama.cpp bound {bound:.3e}"
            );
            assert!(
                err > 1e-5,
                "{what}: {err:.3e} from f32; no rounding happened"
            );
        }
    }
}

/// `Σ bits(v_i) · (i + 1)` modulo 2^64: the checksum scripts/llama_cpp_kquants.py writes of
/// gguf-py's dequantized values.
fn checksum(values: &[f32]) -> u64 {
    values.iter().enumerate().fold(0u64, |sum, (i, v)| {
        sum.wrapping_add((v.to_bits() as u64).wrapping_mul(i as u64 + 1))
    })
}

/// Files written by llama.cpp's own quantizer in its K-quant, IQ4 and legacy mixes
/// (native-tests/fixtures/llama_cpp_kquants, scripts/llama_cpp_kquants.py): each tensor is
/// read in the format llama.cpp chose for it and dequantizes bit for bit as gguf-py does
/// (every value, through a checksum). On the cpu and reference backends, the logits with f32
/// activations equal those of a float64 numpy forward pass over gguf-py's dequantized weights
/// within the engine's 1e-3, and those with the default integer activations (`Q8_K` for the
/// super-blocks, `Q8_0` for the 32-value formats) lie within a thousandth of the rounding's
/// own effect (an RMS distance) from the same numpy pass with its activations rounded so
/// (`Q8_K` as llama.cpp's `quantize_row_q8_K_ref`). Measured when this was written:
/// 0.4–1.6e-7 against a rounding effect of 1.06–1.25e-2. Both also lie within 1.5× of
/// llama.cpp's own distance from the float64 pass from llama.cpp's logits on the file
/// (measured: 0.8–1.0×). The wgpu backend runs every format with the same activations (see
/// [`wgpu_runs_every_llama_cpp_mix`]).
#[test]
fn llama_cpp_quantizer_mixes_read_as_gguf_py_reads_them() {
    for mix in llama_cpp_mixes() {
        let (path, name) = (&mix.path, &mix.name);
        let model_files = ModelFiles::open(path).unwrap();
        let tensors = mix.manifest["tensors"].as_object().unwrap();
        assert_eq!(
            tensors.len(),
            model_files.tensors.len(),
            "{name}: tensor count"
        );
        let cpu = common::cpu();
        for (tensor, want) in tensors {
            let (raw, bytes) = model_files.get(tensor).unwrap();
            assert_eq!(
                raw.dtype.to_string(),
                want["type"],
                "{name}: {tensor}'s type"
            );
            let on_host = raw.to_f32(bytes.bytes());
            let on_cpu: Vec<f32> = raw
                .to_device(&cpu, bytes)
                .and_then(|t| match t.dtype() {
                    webtensor::DType::F32 => Ok(t),
                    _ => webtensor::ops::dequantize(&t),
                })
                .unwrap()
                .to_vec()
                .unwrap();
            let want: u64 = want["checksum"].as_str().unwrap().parse().unwrap();
            assert_eq!(checksum(&on_host), want, "{name}: {tensor} dequantized");
            assert_eq!(
                checksum(&on_cpu),
                want,
                "{name}: {tensor} dequantized on cpu"
            );
        }
        let prompt = mix.prompt();
        let (numpy, numpy_int) = (mix.read("logits.f32"), mix.read("int.logits.f32"));
        let rounding = rms_difference(&numpy_int, &numpy);
        assert!(rounding > 1e-4, "{name}: the int8 rounding changes nothing");
        for dev in [reference(), common::cpu()] {
            let mut model = Llama::load(&dev, ModelFiles::open(path).unwrap()).unwrap();
            let what = format!("{name} on {}", dev.backend_name());
            let integer: Vec<f32> = model.logits(&prompt).unwrap().to_vec().unwrap();
            let err = rms_difference(&integer, &numpy_int);
            eprintln!("{what}: int8 activations {err:.3e} from numpy's (rounding {rounding:.3e})");
            assert!(
                err <= 1e-3 * rounding,
                "{what}: {err:.3e}, rounding {rounding:.3e}"
            );
            mix.assert_near_llama_cpp(&what, &integer);
            model.set_activations(ActivationMode::F32);
            let exact: Vec<f32> = model.logits(&prompt).unwrap().to_vec().unwrap();
            common::assert_close(&format!("{what}, f32 activations"), &exact, &numpy, 1e-3);
        }
    }
}

/// The logits of `prompt` (one pass), then of `steps` greedy tokens decoded one at a time
/// through the KV cache, concatenated, and the greedy ids.
fn greedy_decode(model: &Llama, prompt: &[u32], steps: usize) -> (Vec<f32>, Vec<u32>) {
    let mut cache = model.new_cache(prompt.len() + steps).unwrap();
    let mut logits: Vec<f32> = model.forward(prompt, &mut cache).unwrap().to_vec().unwrap();
    let vocab = logits.len() / prompt.len();
    let mut ids = Vec::new();
    for _ in 0..steps {
        let last = &logits[logits.len() - vocab..];
        let id = (0..vocab)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap() as u32;
        ids.push(id);
        let next: Vec<f32> = model.forward(&[id], &mut cache).unwrap().to_vec().unwrap();
        logits.extend(next);
    }
    (logits, ids)
}

/// Every mix of llama.cpp's quantizer (Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, IQ4_XS: the super-block
/// formats with some `Q6_K` and the odd `Q4_K`/`Q5_K` tensor; Q4_1, Q5_0, Q5_1, IQ4_NL: the
/// legacy formats with a `Q6_K` output) on wgpu, in the default integer mode: the super-blocks
/// take `Q8_K` activations and the legacy formats `Q8_0` ones, as on the host and in llama.cpp
/// (`activation_path` names each format's). Each mix's logits (a prefill pass, then greedy
/// decode steps, which run the decode kernels) are checked three ways:
/// - With f32 activations, against cpu's to 1e-5 of the largest logit: no value can round to
///   the other neighbour, so every decoded weight and product must match up to the order of
///   f32 sums (measured: 2–4e-7 RMS on lavapipe, NVIDIA's Vulkan driver and CUDA).
/// - With int8 activations, against cpu's logits and numpy's float64 forward with the
///   activations rounded so (prompt positions): the same greedy ids, and every position within
///   [`FLOAT_NOISE`] of them except at most [`MOST_FLIPS`] positions, each within twice the
///   rounding's own effect (an RMS distance). A GPU sums in another order than the host, and
///   where a value lies within an f32 rounding of the midpoint between two int8 steps it rounds
///   to the other neighbour: one position then moves (the last layers' roundings reach no later
///   token), by up to the rounding's effect. Seen on an H200: `tiny.q5_1.gguf` on NVIDIA's
///   Vulkan driver 8.3e-3 at one prompt position (rounding 9.2e-3), `tiny.q5_k_m.gguf` on CUDA
///   9.0e-3 at one (1.26e-2), `tiny.q4_1.gguf` on CUDA 1.6e-3 at the last decode step, the row
///   teams' `tiny.q5_0.gguf` 1.4e-3 at one prompt position (on lavapipe too); every other
///   position 1e-7–6e-7, and with f32 activations every mix 2–4e-7. Turning a wgpu feature
///   off (row teams, say) moves such a flip to another mix or position, as a change of
///   summation order does; a wrong product or rounding would move every position instead.
/// - Against llama.cpp's own logits on the file, within 1.5× llama.cpp's own distance from
///   the float64 forward, as on the host backends.
#[test]
fn wgpu_runs_every_llama_cpp_mix() {
    if let Some(gpu) = common::wgpu() {
        every_llama_cpp_mix(&gpu, "wgpu");
    }
}

/// [`wgpu_runs_every_llama_cpp_mix`] on the row-team (GPU) shapes, forced on any adapter:
/// prefill tiles, decode teams.
#[test]
fn wgpu_row_teams_run_every_llama_cpp_mix() {
    if let Some(gpu) = common::wgpu_with(common::row_teams()) {
        every_llama_cpp_mix(&gpu, "wgpu");
    }
}

/// [`wgpu_runs_every_llama_cpp_mix`] on cuda: its Q8_K and Q8_0 activations and group decoder
/// against cpu, numpy and llama.cpp, where a CUDA device is present.
#[test]
fn cuda_runs_every_llama_cpp_mix() {
    if let Some(gpu) = common::cuda() {
        every_llama_cpp_mix(&gpu, "cuda");
    }
}

/// Each mix loaded on `gpu` (the backend named `backend` in messages): its activation path,
/// greedy ids and logits against cpu's, numpy's and llama.cpp's.
fn every_llama_cpp_mix(gpu: &webtensor::Device, backend: &str) {
    for mix in llama_cpp_mixes() {
        let (path, name) = (&mix.path, &mix.name);
        let prompt = mix.prompt();
        let steps = 6;
        let mut model = Llama::load(gpu, ModelFiles::open(path).unwrap()).unwrap();
        assert_eq!(model.activations(), ActivationMode::Integer);
        let path_text = model.activation_path();
        for tensor in mix.manifest["tensors"].as_object().unwrap().values() {
            let format = tensor["type"].as_str().unwrap().to_lowercase();
            let activations = match format.as_str() {
                "f32" => continue,
                "q2_k" | "q3_k" | "q4_k" | "q5_k" | "q6_k" | "iq4_xs" => "q8_k",
                _ => "q8_0",
            };
            let names = format!("{format} weights × {activations} activations");
            assert!(path_text.contains(&names), "{name}: {names} in {path_text}");
        }
        let (got, got_ids) = greedy_decode(&model, &prompt, steps);
        let prompt_logits = &got[..mix.read("logits.f32").len()];
        let (numpy, numpy_int) = (mix.read("logits.f32"), mix.read("int.logits.f32"));
        let rounding = rms_difference(&numpy_int, &numpy);
        let mut cpu_model = Llama::load(&common::cpu(), ModelFiles::open(path).unwrap()).unwrap();
        let (want, want_ids) = greedy_decode(&cpu_model, &prompt, steps);
        let vocab = prompt_logits.len() / prompt.len();
        let (from_cpu, from_numpy) = (
            rms_by_position(&got, &want, vocab),
            rms_by_position(prompt_logits, &numpy_int, vocab),
        );
        eprintln!(
            "{name} on {backend}, int8 activations, RMS by position: from cpu's {} ; from \
             numpy's {} (rounding {rounding:.3e})",
            positions_text(&from_cpu),
            positions_text(&from_numpy)
        );
        model.set_activations(ActivationMode::F32);
        cpu_model.set_activations(ActivationMode::F32);
        let (exact, _) = greedy_decode(&model, &prompt, steps);
        let (exact_cpu, _) = greedy_decode(&cpu_model, &prompt, steps);
        eprintln!(
            "{name} on {backend}: f32 activations {:.3e} from cpu's",
            rms_difference(&exact, &exact_cpu)
        );
        common::assert_close(
            &format!("{name} on {backend} with f32 activations against cpu"),
            &exact,
            &exact_cpu,
            1e-5,
        );
        assert_eq!(got_ids, want_ids, "{name}: greedy ids on {backend} and cpu");
        for (against, distances) in [("cpu's", &from_cpu), ("numpy's", &from_numpy)] {
            let flips: Vec<usize> = (0..distances.len())
                .filter(|&p| distances[p] > FLOAT_NOISE)
                .collect();
            assert!(
                flips.len() <= MOST_FLIPS
                    && flips.iter().all(|&p| distances[p] <= 2.0 * rounding),
                "{name} on {backend}, int8 activations: positions {flips:?} beyond {FLOAT_NOISE:e} \
                 from {against} logits (RMS {}; at most {MOST_FLIPS}, each within twice the \
                 rounding's effect {rounding:.3e})",
                positions_text(distances)
            );
        }
        // And against llama.cpp's own logits on the file, as on the host backends.
        mix.assert_near_llama_cpp(&format!("{name} on {backend}"), prompt_logits);
    }
}

/// The RMS distance, at or below which two runs' logits at a position differ only by the
/// order of f32 sums (measured: at most 6e-7 on every backend; a value rounded to the other
/// int8 neighbour moved a position by 1.4e-3 or more).
const FLOAT_NOISE: f64 = 1e-5;

/// The most positions (of a mix's prompt and decode steps) at which a GPU's int8 activations
/// may differ from the host's by more than [`FLOAT_NOISE`]: see
/// [`wgpu_runs_every_llama_cpp_mix`] (one was the most seen in a run).
const MOST_FLIPS: usize = 2;

/// Each position's RMS difference between two runs' logits (`vocab` values a position).
fn rms_by_position(a: &[f32], b: &[f32], vocab: usize) -> Vec<f64> {
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(x, y)| rms_difference(x, y))
        .collect()
}

/// Distances by position as text, for messages.
fn positions_text(distances: &[f64]) -> String {
    distances
        .iter()
        .map(|d| format!("{d:.1e}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A file of llama.cpp's quantizer in fixtures/llama_cpp_kquants and its manifest
/// (scripts/llama_cpp_kquants.py).
struct Mix {
    path: PathBuf,
    name: String,
    manifest: serde_json::Value,
}

/// Every mix, in name order: Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, IQ4_XS, Q4_1, Q5_0, Q5_1 and
/// IQ4_NL at least.
fn llama_cpp_mixes() -> Vec<Mix> {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("native-tests/fixtures/llama_cpp_kquants");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 9,
        "{} mixes in {}",
        paths.len(),
        dir.display()
    );
    paths
        .into_iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
            let manifest = serde_json::from_str(&text).unwrap();
            Mix {
                path,
                name,
                manifest,
            }
        })
        .collect()
}

impl Mix {
    /// The prompt whose logits the fixtures hold.
    fn prompt(&self) -> Vec<u32> {
        serde_json::from_value(self.manifest["prompt"].clone()).unwrap()
    }

    /// The little-endian f32 values of the fixture `<file>.<suffix>`.
    fn read(&self, suffix: &str) -> Vec<f32> {
        let path = self.path.with_file_name(format!("{}.{suffix}", self.name));
        std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// `got` (the prompt's logits, `what` says whose) lies within 1.5× of the RMS distance
    /// llama.cpp's own logits on the file keep from the float64 forward, from llama.cpp's.
    fn assert_near_llama_cpp(&self, what: &str, got: &[f32]) {
        let llama_cpp = self.read("llama_cpp.f32");
        let spread = rms_difference(&llama_cpp, &self.read("logits.f32"));
        assert!(
            spread > 0.0,
            "{}: llama.cpp's logits are numpy's",
            self.name
        );
        let err = rms_difference(got, &llama_cpp);
        eprintln!("{what}: {err:.3e} from llama.cpp's (llama.cpp {spread:.3e} from float64)");
        assert!(
            err <= 1.5 * spread,
            "{what}: {err:.3e} from llama.cpp's logits, which are {spread:.3e} from the float64 \
             forward"
        );
    }
}

/// What a page reads to size a model before its download (web/src/estimate.rs sums the
/// tensors' byte ranges of `gguf::parse_header`): every llama.cpp mix's header parses from
/// the bytes before its first tensor alone, each tensor's range holds its values in ggml's
/// block size of its type (the table below, from ggml's `type_traits`), and the ranges, in
/// the order llama.cpp wrote them, tile the data section (each padded to the 32-byte
/// alignment) to the file's end.
#[test]
fn llama_cpp_mixes_are_sized_from_their_headers() {
    // ggml's (block values, block bytes) by type name.
    let ggml_sizes = |name: &str| match name {
        "F32" => (1, 4),
        "Q4_1" => (32, 20),
        "Q5_0" => (32, 22),
        "Q5_1" => (32, 24),
        "IQ4_NL" => (32, 18),
        "Q2_K" => (256, 84),
        "Q3_K" => (256, 110),
        "Q4_K" => (256, 144),
        "Q5_K" => (256, 176),
        "Q6_K" => (256, 210),
        "IQ4_XS" => (256, 136),
        other => panic!("no ggml size for {other}"),
    };
    for mix in llama_cpp_mixes() {
        let name = &mix.name;
        let bytes = std::fs::read(&mix.path).unwrap();
        let whole = webtensor_llm::gguf::parse(name, &bytes).unwrap();
        let first = whole.tensors.values().map(|t| t.range.start).min().unwrap();
        let header = webtensor_llm::gguf::parse_header(name, &bytes[..first], bytes.len()).unwrap();
        let mut tensors: Vec<_> = header.tensors.iter().collect();
        tensors.sort_by_key(|(_, t)| t.range.start);
        let manifest = mix.manifest["tensors"].as_object().unwrap();
        let mut end = first;
        for (tensor, t) in tensors {
            assert_eq!(
                t.range.start,
                end.next_multiple_of(32),
                "{name}: {tensor}'s offset"
            );
            let ggml_type = manifest[tensor]["type"].as_str().unwrap();
            let (values, block) = ggml_sizes(ggml_type);
            let n: usize = t.shape.iter().product();
            assert_eq!(
                t.range.len(),
                n / values * block,
                "{name}: {tensor} ({ggml_type}, {n} values)"
            );
            end = t.range.end;
        }
        assert_eq!(
            end.next_multiple_of(32),
            bytes.len(),
            "{name}: the data's end"
        );
    }
}

/// The built-in model widened to whole K-quant super-blocks and quantized to Q4_K_M by
/// llama.cpp, vocabulary included (native-tests/fixtures/kjv_q4_k_m, scripts/kjv_q4_k_m.py;
/// the file the demo page's GGUF test loads). The engine's tokenizer gives llama.cpp's prompt
/// ids; on cpu, whose `Q8_K` activations round as llama.cpp's do, the prompt's logits lie
/// within 1e-5 of the largest logit from llama.cpp's (f32 KV cache; measured 1.9e-6 of 12.8)
/// and the greedy continuation is llama.cpp's, token for token and as text. wgpu takes
/// `Q8_K` activations for the K-quants too (`quantize_acts_super`, bit-exact), so it is held to
/// llama.cpp's prompt logits as cpu is (with f32 activations it was 0.33 from them), to the
/// cpu backend's logits within the engine tolerance (1e-3 of the largest logit) through the
/// prompt and the greedy steps, and to llama.cpp's greedy ids.
#[test]
fn kjv_q4_k_m_agrees_with_llama_cpp() {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("native-tests/fixtures/kjv_q4_k_m/tiny-kjv-256.q4_k_m.gguf");
    let oracle = path.with_extension("gguf.llama_cpp.json");
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(oracle).unwrap()).unwrap();
    let ids = |key: &str| -> Vec<u32> { serde_json::from_value(oracle[key].clone()).unwrap() };
    let (prompt, want_ids) = (ids("prompt_ids"), ids("greedy_ids"));
    let llama_cpp: Vec<f32> = std::fs::read(path.with_extension("gguf.llama_cpp.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let files = ModelFiles::open(&path).unwrap();
    let tokenizer = files.tokenizer.clone().unwrap();
    assert_eq!(
        tokenizer
            .encode(oracle["prompt"].as_str().unwrap())
            .unwrap(),
        prompt,
        "prompt ids against llama.cpp's"
    );
    let cpu = Llama::load(&common::cpu(), files).unwrap();
    let (logits, got_ids) = greedy_decode(&cpu, &prompt, want_ids.len());
    let what = "tiny-kjv Q4_K_M on cpu";
    common::assert_close(what, &logits[..llama_cpp.len()], &llama_cpp, 1e-5);
    assert_eq!(got_ids, want_ids, "{what}: greedy ids against llama.cpp's");
    assert_eq!(
        tokenizer.decode(&got_ids),
        oracle["greedy_text"].as_str().unwrap(),
        "{what}: greedy text against llama.cpp's"
    );
    if let Some(gpu) = common::wgpu() {
        let model = Llama::load(&gpu, ModelFiles::open(&path).unwrap()).unwrap();
        let (got, got_ids) = greedy_decode(&model, &prompt, want_ids.len());
        let what = "tiny-kjv Q4_K_M on wgpu";
        common::assert_close(what, &got[..llama_cpp.len()], &llama_cpp, 1e-5);
        common::assert_close(&format!("{what} against cpu"), &got, &logits, 1e-3);
        assert_eq!(got_ids, want_ids, "{what}: greedy ids against llama.cpp's");
    }
}
