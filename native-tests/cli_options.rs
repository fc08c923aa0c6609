//! The command line's options a user meets first: a clean standard error, `--threads`,
//! `--ctx`, and the model cache folder (`webtensor models`, `--model NAME`).

use std::process::{Command, Output};

/// Runs the CLI as CI does: no desktop session (no `XDG_RUNTIME_DIR`), no backend override.
fn webtensor(args: &[&str], env: &[(&str, &std::path::Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_webtensor"));
    command
        .args(args)
        .env_remove("WEBTENSOR_BACKEND")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("NODEVICE_SELECT")
        .env_remove("MESA_VK_DEVICE_SELECT");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("the webtensor binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn ok(args: &[&str], env: &[(&str, &std::path::Path)]) -> Output {
    let out = webtensor(args, env);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    out
}

/// Mesa's Vulkan device-select layer makes libwayland print "error: XDG_RUNTIME_DIR is
/// invalid or not set in the environment." when wgpu lists adapters without a desktop session;
/// the commands that list adapters print no such line (nor any other error) on success.
#[test]
fn info_generate_and_bench_keep_stderr_clean_without_a_desktop_session() {
    for args in [
        &["info"][..],
        &["generate", "--max-tokens", "2"],
        &["bench", "--op", "add", "--runs", "1"],
    ] {
        let err = stderr(&ok(args, &[]));
        assert!(
            !err.contains("XDG_RUNTIME_DIR") && !err.to_lowercase().contains("error"),
            "{args:?} printed: {err}"
        );
    }
}

#[test]
fn threads_size_the_cpu_pool_and_nonsense_counts_are_refused() {
    let out = ok(
        &[
            "generate",
            "--backend",
            "cpu",
            "--threads",
            "3",
            "--max-tokens",
            "2",
        ],
        &[],
    );
    assert!(
        stderr(&out).contains("on cpu (3 threads)"),
        "{}",
        stderr(&out)
    );
    for bad in ["0", "-2", "lots", "100000"] {
        for command in [&["generate"][..], &["bench"], &["eval", "--tokens", "1"]] {
            let flag = format!("--threads={bad}");
            let out = webtensor(&[command, &[flag.as_str()]].concat(), &[]);
            assert!(
                !out.status.success(),
                "{command:?} --threads {bad} was taken"
            );
            assert!(
                stderr(&out).contains("a thread count from 1 to 1024"),
                "{command:?} --threads {bad}: {}",
                stderr(&out)
            );
        }
    }
}

/// The built-in model's context is 256 tokens; `--ctx` shortens it, so generation stops at it.
#[test]
fn ctx_bounds_the_context_and_refuses_what_the_model_cannot_run() {
    let out = ok(&["generate", "--ctx", "12", "--max-tokens", "100"], &[]);
    let err = stderr(&out);
    assert!(err.contains("context 12 on"), "{err}");
    // "In the beginning" is 9 tokens with BOS; 12 tokens of context leave room for 3 more in
    // the cache, and the last one drawn needs none: 4 at most.
    let decoded: usize = err
        .split("decode: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no decode count in {err}"));
    assert!(
        (1..=4).contains(&decoded),
        "{decoded} tokens in a 12-token context"
    );
    let out = webtensor(&["generate", "--ctx", "257"], &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("this model runs 1 to 256"),
        "{}",
        stderr(&out)
    );
    let out = webtensor(&["eval", "--ctx", "0", "--tokens", "1"], &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("a positive number of tokens"),
        "{}",
        stderr(&out)
    );
    // A prompt longer than the context is refused before it runs.
    let out = webtensor(&["eval", "--ctx", "2", "--tokens", "1,2,3"], &[]);
    assert!(!out.status.success(), "3 tokens ran in a 2-token context");
}

#[test]
fn models_lists_the_cache_folder_and_model_names_resolve_from_it() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let hf = dir.join("kjv");
    std::fs::create_dir_all(&hf).unwrap();
    let assets =
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("assets/tiny-kjv");
    let mut hf_bytes = 0;
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        hf_bytes += std::fs::copy(assets.join(f), hf.join(f)).unwrap();
    }
    let gguf = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("native-tests/fixtures/gguf/qwen2.q8_0.gguf");
    let gguf_bytes = std::fs::copy(gguf, dir.join("small-qwen.gguf")).unwrap();
    std::fs::write(dir.join("notes.txt"), "not a model").unwrap();
    let env = [("WEBTENSOR_MODELS", dir.as_path())];

    let out = ok(&["models", "--json"], &env);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<(String, String, u64)> = v["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["format"].as_str().unwrap().to_string(),
                m["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("kjv".to_string(), "hf".to_string(), hf_bytes),
            ("small-qwen".to_string(), "gguf".to_string(), gguf_bytes),
        ]
    );
    let text = String::from_utf8_lossy(&ok(&["models"], &env).stdout).into_owned();
    assert!(text.contains("kjv") && text.contains("1.55 MiB"), "{text}");

    let out = ok(&["generate", "--model", "kjv", "--max-tokens", "2"], &env);
    assert!(
        stderr(&out).contains("model-cache/kjv:"),
        "{}",
        stderr(&out)
    );
    ok(&["eval", "--model", "small-qwen", "--tokens", "1,2"], &env);
    let out = webtensor(&["generate", "--model", "nothing-here"], &env);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("webtensor models") && stderr(&out).contains("model-cache"),
        "{}",
        stderr(&out)
    );
}
