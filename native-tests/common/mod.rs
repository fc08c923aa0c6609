//! Shared helpers for the integration tests: backend selection, seeded data, tolerances.
#![allow(dead_code)]

use rand::{rngs::StdRng, Rng, SeedableRng};
use webtensor::backend::{BackendOptions, Switch};
use webtensor::{Device, Element, Tensor};

/// Whether a missing wgpu adapter is a failure (in CI, or when asked) rather than a skip.
pub fn wgpu_required() -> bool {
    let set =
        |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    set("CI") || set("WEBTENSOR_REQUIRE_WGPU")
}

/// The options of the tests' plain devices ([`wgpu`], [`cpu`]): the defaults, with the
/// environment's overrides (`BackendOptions::from_env`), so that a run by hand may still put
/// the whole suite on one variant (`WEBTENSOR_WGPU_F16=off cargo test --test conformance
/// wgpu::`, as scripts/device_check.sh does on GPU machines). The test suite itself sets no
/// variable: each variant has tests of its own, on devices started with its options.
pub fn env_options() -> BackendOptions {
    BackendOptions::from_env().unwrap_or_else(|e| panic!("{e}"))
}

/// The wgpu device, or `None` (with a printed reason) where no adapter exists outside CI.
pub fn wgpu() -> Option<Device> {
    wgpu_with(env_options())
}

/// The options that force the wgpu backend's row-team (GPU) shape, whatever the adapter.
pub fn row_teams() -> BackendOptions {
    let mut o = BackendOptions::default();
    o.wgpu.row_teams = Switch::On;
    o
}

/// The wgpu devices the engine tests run on: the adapter's own shape, and the row-team (GPU)
/// shape forced (on a GPU both are the row-team shape).
pub fn wgpus() -> Vec<Device> {
    wgpu().into_iter().chain(wgpu_with(row_teams())).collect()
}

/// A wgpu device whose backend starts with `options`, or `None` as [`wgpu`].
pub fn wgpu_with(options: BackendOptions) -> Option<Device> {
    match Device::with_options("wgpu", options) {
        Ok(d) => Some(d),
        Err(e) if wgpu_required() => panic!("the wgpu backend must run in CI, but: {e}"),
        Err(e) => {
            eprintln!("skipping wgpu test: {e}");
            None
        }
    }
}

/// The cuda device, or `None` with a printed reason where CUDA is absent (not built with the
/// `cuda` feature, no driver, no GPU). `WEBTENSOR_REQUIRE_CUDA=1` makes absence a failure, for
/// runs on a GPU machine that must not pass by skipping.
pub fn cuda() -> Option<Device> {
    match Device::with_options("cuda", env_options()) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("WEBTENSOR_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("WEBTENSOR_REQUIRE_CUDA=1 but the cuda backend is absent: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED (cuda did not run): {e}");
            None
        }
    }
}

/// The cpu device.
pub fn cpu() -> Device {
    Device::with_options("cpu", env_options()).expect("the cpu backend always starts")
}

/// The oracle.
pub fn reference() -> Device {
    Device::reference()
}

/// A seeded generator; each test passes its own seed so failures reproduce.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `values` as bfloat16 bytes, each value's high half: the values are cut, not rounded, so
/// a value already a bfloat16 stays exactly itself.
pub fn bf16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect()
}

/// `n` uniform values in `[-scale, scale)`.
pub fn uniform(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// A tensor on `dev` from host data.
pub fn tensor<T: Element>(dev: &Device, data: &[T], shape: &[usize]) -> Tensor {
    Tensor::from_slice(dev, data, shape).expect("creating a test tensor")
}

/// Asserts `actual` matches `expected` within `tol · max(1, max|expected|)`; NaN must be
/// NaN at the same place and infinities must match exactly. With `WEBTENSOR_SHOW_ERRORS` set
/// it prints the error it measured (run with `--nocapture`).
pub fn assert_close(what: &str, actual: &[f32], expected: &[f32], tol: f64) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    let scale = expected
        .iter()
        .filter(|v| v.is_finite())
        .fold(1f64, |m, v| m.max(v.abs() as f64));
    let limit = tol * scale;
    let mut worst = (0f64, 0usize);
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        if e.is_nan() || a.is_nan() {
            assert!(
                e.is_nan() && a.is_nan(),
                "{what}: element {i}: got {a}, expected {e}"
            );
            continue;
        }
        if e.is_infinite() || a.is_infinite() {
            assert_eq!(a, e, "{what}: element {i}");
            continue;
        }
        let err = (a as f64 - e as f64).abs();
        if err > worst.0 {
            worst = (err, i);
        }
    }
    if std::env::var_os("WEBTENSOR_SHOW_ERRORS").is_some() {
        eprintln!(
            "{what}: max abs error {:.3e} = {:.3} of the limit {:.3e} (scale {:.3e})",
            worst.0,
            worst.0 / limit,
            limit,
            scale
        );
    }
    assert!(
        worst.0 <= limit,
        "{what}: max abs error {:.3e} at element {} (got {}, expected {}) exceeds {:.3e}",
        worst.0,
        worst.1,
        actual[worst.1],
        expected[worst.1],
        limit
    );
}

/// A size line of this process's `/proc/self/status` (`VmRSS`, `VmSize`, ...) in bytes, or
/// `None` off Linux or when the line is missing.
pub fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// A copy of the built-in model's files plus a chat template whose turns end with `</s>`, in a
/// folder of the test target's scratch space named `tag` (the chat and OpenAI-server tests).
pub fn chat_model_dir(tag: &str) -> std::path::PathBuf {
    let src = repo().join("assets/tiny-kjv");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(tag);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let config = serde_json::json!({
        "bos_token": "<s>",
        "eos_token": {"content": "</s>"},
        "chat_template": "{% for m in messages %}{{ bos_token }}{{ m.role }}: {{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}"
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

/// The byte offsets of the f16 scales (and minimums) in one block of each llama.cpp format,
/// from gguf-py's and ggml's layouts (not from webtensor): a block of random bytes with these
/// set to finite values is a valid block.
pub fn block_scales(format: webtensor::DType) -> &'static [usize] {
    use webtensor::DType;
    match format {
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q5_0 | DType::IQ4_NL | DType::IQ4_XS => &[0],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        other => panic!("no random blocks of {other}"),
    }
}

/// `blocks` random valid blocks of a llama.cpp `format` (see [`block_scales`]), their scales
/// f16 values in `[-scale, scale)`.
pub fn random_blocks(
    rng: &mut StdRng,
    format: webtensor::DType,
    blocks: usize,
    scale: f32,
) -> Vec<u8> {
    let size = format.block_bytes();
    let mut bytes: Vec<u8> = (0..blocks * size).map(|_| rng.random()).collect();
    for block in bytes.chunks_exact_mut(size) {
        for &at in block_scales(format) {
            let d = half::f16::from_f32(rng.random_range(-scale..scale));
            block[at..at + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    bytes
}

/// The repository's root: the package's own folder for the library's tests, its parent for
/// those of `llm/` and `cli/`.
pub fn repo() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if manifest.join("native-tests").is_dir() {
        manifest.to_path_buf()
    } else {
        manifest.join("..")
    }
}
