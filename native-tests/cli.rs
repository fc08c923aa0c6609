//! The `webtensor` command line, run as a user would.

mod common;
#[path = "common/serve.rs"]
mod server;

use std::process::{Command, Output};

fn webtensor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_webtensor"))
        .args(args)
        .env_remove("WEBTENSOR_BACKEND")
        .output()
        .expect("the webtensor binary runs")
}

/// Whether a wgpu run failed where no adapter is required (outside CI): it prints why, and the
/// test returns.
fn skipped_without_wgpu(out: &Output) -> bool {
    if out.status.success() || common::wgpu_required() {
        return false;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("skipping: {}", err.lines().last().unwrap_or(""));
    true
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn info_json_lists_every_backend_and_the_auto_choice() {
    let v = json(&webtensor(&["info", "--json"]));
    let backends = v["backends"].as_array().expect("a backends array");
    let names: Vec<_> = backends
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cuda", "wgpu", "cpu", "reference"]);
    for b in backends {
        let present = b["present"].as_bool().unwrap();
        if present {
            assert!(
                !b["info"]["device_name"].as_str().unwrap().is_empty(),
                "{b}"
            );
        } else {
            assert!(
                !b["reason"].as_str().unwrap().is_empty(),
                "an absent backend says why: {b}"
            );
        }
    }
    let by_name = |n: &str| backends.iter().find(|b| b["name"] == n).unwrap();
    assert_eq!(by_name("cpu")["present"], true);
    assert_eq!(by_name("reference")["present"], true);
    let cpu = &by_name("cpu")["info"];
    assert!(
        cpu["threads"].as_u64().unwrap() >= 1 && cpu["simd"].is_string(),
        "{cpu}"
    );
    let picked = v["auto"]["backend"].as_str().expect("auto picks a backend");
    assert!(names.contains(&picked));
    assert!(v["auto"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| !d["reason"].as_str().unwrap().is_empty()));
}

#[test]
fn info_text_names_every_backend() {
    let out = webtensor(&["info"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for name in ["cuda", "wgpu", "cpu", "reference", "auto picks:"] {
        assert!(text.contains(name), "missing {name} in:\n{text}");
    }
}

#[test]
fn bench_json_has_ceilings_and_checked_rows() {
    let v = json(&webtensor(&[
        "bench",
        "--backend",
        "cpu",
        "--op",
        "rms_norm",
        "--op",
        "matmul",
        "--runs",
        "1",
        "--json",
    ]));
    assert_eq!(v["schema_version"], 3);
    let ceilings = &v["backends"][0]["ceilings"];
    assert!(
        ceilings["copy_gb_per_s"].as_f64().unwrap() > 0.0,
        "{ceilings}"
    );
    assert!(
        ceilings["fma_gflop_per_s"].as_f64().unwrap() > 0.0,
        "{ceilings}"
    );
    // The shader read probe is the wgpu backend's alone.
    assert!(ceilings["read_gb_per_s"].is_null(), "{ceilings}");
    let rows = v["rows"].as_array().unwrap();
    // rms_norm decode+prefill, matmul a·b and a·bᵀ at decode and prefill.
    assert_eq!(rows.len(), 6, "{rows:?}");
    for r in rows {
        assert_eq!(r["checked"], true, "{r}");
        assert!(r["median_us"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["gb_per_s"].as_f64().unwrap() > 0.0, "{r}");
        // No read probe on the cpu, so no fraction of one.
        assert!(r["frac_read"].is_null(), "{r}");
    }
    assert!(rows
        .iter()
        .filter(|r| r["op"] == "matmul")
        .all(|r| r["gflop_per_s"].as_f64().unwrap() > 0.0));
}

#[test]
fn unknown_names_fail_with_the_valid_ones() {
    let out = webtensor(&["bench", "--backend", "tpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tpu") && err.contains("wgpu, cpu"), "{err}");

    let out = webtensor(&["bench", "--backend", "cpu", "--op", "conv2d"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("conv2d") && err.contains("rms_norm"), "{err}");
}

#[test]
fn eval_prints_the_logits_of_every_position() {
    let cpu = json(&webtensor(&[
        "eval",
        "--tokens",
        "0,5,9",
        "--backend",
        "cpu",
    ]));
    let rows = cpu.as_array().expect("an array of rows");
    assert_eq!(rows.len(), 3);
    let vocab = rows[0].as_array().unwrap().len();
    assert!(vocab > 0 && rows.iter().all(|r| r.as_array().unwrap().len() == vocab));
    // The same logits from the reference backend: the CLI wires the engine, not a stub.
    let reference = json(&webtensor(&[
        "eval",
        "--tokens",
        "0,5,9",
        "--backend",
        "reference",
    ]));
    for (a, b) in rows.iter().zip(reference.as_array().unwrap()) {
        for (x, y) in a.as_array().unwrap().iter().zip(b.as_array().unwrap()) {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() < 1e-3 * y.abs().max(1.0), "{x} vs {y}");
        }
    }
    // Streaming every layer from the files gives the same logits.
    let streamed = json(&webtensor(&[
        "eval",
        "--tokens",
        "0,5,9",
        "--backend",
        "cpu",
        "--resident-layers",
        "0",
    ]));
    assert_eq!(streamed, cpu);
    let bad = webtensor(&["eval", "--tokens", "0,999999", "--backend", "cpu"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("vocab"));
}

#[test]
fn generate_streams_text_and_reports_speed() {
    let out = webtensor(&[
        "generate",
        "--backend",
        "cpu",
        "--max-tokens",
        "8",
        "--prompt",
        "And God said",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("And God said") && text.trim().len() > "And God said".len(),
        "{text}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tokens/s"), "{err}");
}

#[test]
fn bench_model_reports_checked_tokens_per_second() {
    let v = json(&webtensor(&[
        "bench",
        "--model",
        "builtin",
        "--backend",
        "cpu",
        "--prompt-tokens",
        "8",
        "--decode-tokens",
        "4",
        "--runs",
        "2",
        "--json",
    ]));
    let rows = v.as_array().expect("rows");
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r["backend"], "cpu");
    assert_eq!(r["checked"], true, "{r}");
    assert!(r["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["frac_copy"].as_f64().unwrap() > 0.0);
    assert_eq!(r["decode_samples"].as_array().unwrap().len(), 2, "{r}");
    // The built-in model's f16 matrices take f32 activations in every mode.
    assert!(
        r["activations"]
            .as_str()
            .unwrap()
            .contains("f16 weights × f32 activations"),
        "{r}"
    );
}

#[test]
fn bench_model_peers_need_a_gguf_and_activations_a_known_mode() {
    let out = webtensor(&["bench", "--model", "builtin", "--peers"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs a .gguf file"), "{err}");

    let out = webtensor(&["eval", "--tokens", "1", "--activations", "f8"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`f8`") && err.contains("`int` or `f32`"),
        "{err}"
    );
}

/// A fresh scratch folder under the target directory.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}

fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

fn run_ok(args: &[&str]) {
    let out = webtensor(args);
    assert!(
        out.status.success(),
        "{args:?}: exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bench_peers_without_a_file_times_numpy_on_the_rows_just_timed() {
    let args = [
        "bench",
        "--backend",
        "cpu",
        "--op",
        "silu",
        "--runs",
        "1",
        "--peers",
    ];
    let v = json(&webtensor(&[&args[..], &["--json"]].concat()));
    let rows = v["rows"].as_array().unwrap();
    let peers = v["peers"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        let twin = peers
            .iter()
            .find(|p| p["case"] == r["case"] && p["shape"] == r["shape"]);
        let p = twin.unwrap_or_else(|| panic!("no numpy peer for {r} in {peers:?}"));
        assert!(p["peer"].as_str().unwrap().starts_with("numpy"), "{p}");
        assert_eq!(p["op"], "silu", "{p}");
        assert!(p["median_us"].as_f64().unwrap() > 0.0, "{p}");
    }
    // The text table puts each peer next to its row with the speedup.
    let out = webtensor(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let (_, peer_part) = text
        .split_once("peers on the same machine")
        .unwrap_or_else(|| panic!("no peer table: {text}"));
    let lines: Vec<_> = peer_part
        .lines()
        .filter(|l| l.starts_with("silu"))
        .collect();
    assert_eq!(lines.len(), rows.len(), "{text}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("numpy") && l.ends_with('×')),
        "{text}"
    );
}

#[test]
fn bench_report_writes_json_and_html_and_merges_with_peers() {
    let dir = scratch("bench_report");
    let (a, b, merged) = (dir.join("a"), dir.join("b"), dir.join("merged"));
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    for (out, op) in [(&a, "silu"), (&b, "add")] {
        run_ok(&[
            "bench",
            "--backend",
            "cpu",
            "--op",
            op,
            "--runs",
            "1",
            "--report",
            &path(out),
        ]);
        let v = read_json(&out.join("report.json"));
        assert_eq!(v["schema_version"], 3);
        let rows = v["rows"].as_array().unwrap();
        assert!(!rows.is_empty());
        for r in rows {
            assert_eq!(r["op"], op, "{r}");
            assert_eq!(r["checked"], true, "{r}");
            assert!(!r["device"].as_str().unwrap().is_empty(), "{r}");
        }
        let html = std::fs::read_to_string(out.join("report.html")).unwrap();
        assert!(
            html.contains("<svg") && html.contains(op),
            "no chart for {op}"
        );
    }

    // A peer timing of the silu decode row, as benches/peers.py writes it.
    let a_json = read_json(&a.join("report.json"));
    let row = &a_json["rows"][0];
    let peers = dir.join("peers.json");
    let peer = serde_json::json!({
        "machine": "test",
        "peers": [{
            "peer": "numpy test", "op": "silu", "case": row["case"], "shape": row["shape"],
            "median_us": 1.0e6,
        }],
    });
    std::fs::write(&peers, peer.to_string()).unwrap();

    run_ok(&[
        "bench",
        "--merge",
        &path(&a.join("report.json")),
        &path(&b.join("report.json")),
        "--peers",
        &path(&peers),
        "--report",
        &path(&merged),
    ]);
    let m = read_json(&merged.join("report.json"));
    let ops: std::collections::BTreeSet<_> = m["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["op"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ops, ["add", "silu"].map(String::from).into(), "{m}");
    assert_eq!(m["peers"].as_array().unwrap().len(), 1);
    let html = std::fs::read_to_string(merged.join("report.html")).unwrap();
    assert!(html.contains("Peers on the same machine") && html.contains("numpy test"));

    // A report of another schema version is refused with a message, not merged.
    let old = dir.join("old.json");
    std::fs::write(&old, r#"{"schema_version": 2, "rows": []}"#).unwrap();
    let out = webtensor(&["bench", "--merge", &path(&old), "--report", &path(&merged)]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("schema version"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `webtensor serve` on a throwaway checkout: the address it prints answers with the
/// cross-origin isolation headers and the right MIME types, and refuses paths that leave
/// the served folders.
#[test]
fn serve_answers_with_isolation_headers_and_refuses_traversal() {
    let server = server::start("cli");
    std::fs::write(server.root.join("web/pkg/webtensor_bg.wasm"), b"\0asm").unwrap();
    std::fs::write(server.root.join("secret.txt"), "do not serve").unwrap();
    let get = |path: &str| server.ask(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
    let index = get("/");
    let wasm = get("/pkg/webtensor_bg.wasm");
    let js = get("/pkg/webtensor.js?v=1");
    let up = get("/../secret.txt");
    let encoded = get("/pkg/%2e%2e/%2e%2e/secret.txt");
    let missing = get("/nothing.html");
    drop(server);

    assert!(index.starts_with("HTTP/1.1 200"), "{index}");
    assert!(index.contains("Content-Type: text/html"), "{index}");
    assert!(index.ends_with("hello"), "{index}");
    for answer in [&index, &wasm, &js, &up] {
        assert!(
            answer.contains("Cross-Origin-Opener-Policy: same-origin"),
            "{answer}"
        );
        assert!(
            answer.contains("Cross-Origin-Embedder-Policy: require-corp"),
            "{answer}"
        );
    }
    assert!(wasm.contains("Content-Type: application/wasm"), "{wasm}");
    assert!(js.contains("Content-Type: text/javascript"), "{js}");
    for refused in [&up, &encoded] {
        assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
        assert!(!refused.contains("do not serve"), "{refused}");
    }
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
}

/// `--max-tokens` at its largest value generates until the context is full (or the end of
/// the sequence): no overflow, no "cache full".
#[test]
fn generate_with_the_largest_max_tokens_stops_at_the_context() {
    let out = webtensor(&[
        "generate",
        "--backend",
        "cpu",
        "--prompt",
        "In the beginning",
        "--max-tokens",
        &u64::MAX.to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("cache is full"), "{stderr}");
    assert!(stderr.contains("decode:"), "{stderr}");
}

/// `webtensor info --json` with extra environment, as JSON; `None` (with a printed reason)
/// where no wgpu adapter is present outside CI.
fn wgpu_info(env: &[(&str, &std::path::Path)]) -> Option<serde_json::Value> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_webtensor"));
    cmd.args(["info", "--json"]).env_remove("WEBTENSOR_BACKEND");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let v = json(&cmd.output().expect("the webtensor binary runs"));
    let wgpu = v["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == "wgpu"))
        .cloned()
        .expect("a wgpu entry");
    if wgpu["present"] != true {
        assert!(
            !common::wgpu_required(),
            "the wgpu backend must run in CI: {wgpu}"
        );
        eprintln!("skipping: no wgpu adapter ({})", wgpu["reason"]);
        return None;
    }
    Some(wgpu["info"].clone())
}

#[test]
fn the_wgpu_self_check_runs_once_per_adapter_and_demotes_a_disagreeing_variant() {
    let cache = scratch("selfcheck-cache");
    // Row teams use the subgroup reduction (software adapters default to one lane per rows).
    let teams = std::path::Path::new("on");
    let env = [
        ("XDG_CACHE_HOME", cache.as_path()),
        ("WEBTENSOR_WGPU_ROW_TEAMS", teams),
    ];
    let Some(first) = wgpu_info(&env) else {
        return;
    };
    // The verdict was written per adapter: the next start reads it instead of checking.
    let second = wgpu_info(&env).unwrap();
    // A variant that disagrees with the reference (planted) falls back to its portable twin.
    let planted = wgpu_info(&[
        env[0],
        env[1],
        ("WEBTENSOR_WGPU_SELFCHECK", std::path::Path::new("fail")),
    ])
    .unwrap();
    // Every native platform has `dot4I8Packed` (naga writes it out where the device lacks the
    // instruction), so its products are always checked here.
    let dot4 = |v: &serde_json::Value| {
        let features = v["features"].as_array().unwrap();
        let found = features.iter().filter_map(|f| f.as_str());
        found
            .into_iter()
            .find(|f| f.starts_with("dot4I8Packed"))
            .map(str::to_string)
    };
    assert_eq!(
        dot4(&first).as_deref(),
        Some("dot4I8Packed; self-check passed"),
        "{first}"
    );
    assert_eq!(
        dot4(&second).as_deref(),
        Some("dot4I8Packed; self-check passed (cached)"),
        "{second}"
    );
    let d = dot4(&planted).unwrap_or_default();
    assert!(
        d.starts_with("dot4I8Packed; demoted by the self-check: qmatmul q4_0 × Q8_0"),
        "{d}"
    );
    // With row teams (the GPU shape) prefill products run in tiles, checked the same way.
    let line =
        |key: &str| [&first, &second, &planted].map(|v| v[key].as_str().unwrap().to_string());
    assert_checked(
        line("prefill"),
        "64 × 64 tiles",
        "the row-dot kernel",
        "qmatmul q4_0",
    );
    if !first["features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "subgroups")
    {
        eprintln!("skipping: this adapter has no subgroups to check");
        return;
    }
    assert_checked(
        line("reductions"),
        "subgroupAdd",
        "workgroup memory",
        "matmul_t",
    );
}

/// An `info` line of a variant the self-check covers, at three starts: `passed` and checked,
/// the same from the cache, then (planted) `demoted` to the portable one by the case `case`.
fn assert_checked([first, second, planted]: [String; 3], passed: &str, demoted: &str, case: &str) {
    assert!(
        first.starts_with(passed) && first.ends_with("; self-check passed"),
        "{first}"
    );
    assert!(
        second.starts_with(passed) && second.ends_with("; self-check passed (cached)"),
        "{second}"
    );
    assert!(
        planted.starts_with(demoted)
            && planted.contains(&format!("; demoted by the self-check: {case}")),
        "{planted}"
    );
}

#[test]
fn bench_model_counts_wgpu_dispatches_per_decode_step() {
    let out = webtensor(&[
        "bench",
        "--model",
        "builtin",
        "--backend",
        "wgpu",
        "--prompt-tokens",
        "4",
        "--decode-tokens",
        "2",
        "--json",
    ]);
    if skipped_without_wgpu(&out) {
        return;
    }
    let v = json(&out);
    let r = &v.as_array().expect("rows")[0];
    assert_eq!(r["checked"], true, "{r}");
    // At least one dispatch per layer op; the builtin model has layers, so well above 10.
    let per_token = r["dispatches_per_token"]
        .as_f64()
        .expect("a dispatch count");
    assert!(per_token > 10.0, "{r}");
    // The decode's weight traffic is also set against the shader read probe of the same run.
    let read = r["frac_read"]
        .as_f64()
        .expect("a fraction of the read ceiling");
    assert!(read > 0.0, "{r}");
    check_host_cost(r);
}

/// The host's cost of a decode step in a `bench --model --json` row: its thread's CPU time
/// per token and per dispatch (one divided by the other), and a replayed step on wgpu whose
/// steps share submits (each step its own submit would be one per token).
fn check_host_cost(r: &serde_json::Value) {
    let ms = r["host_ms_per_token"].as_f64().expect("host ms per token");
    let us = r["host_us_per_dispatch"]
        .as_f64()
        .expect("host µs per dispatch");
    let dispatches = r["dispatches_per_token"].as_f64().expect("dispatches");
    assert!(ms > 0.0 && us > 0.0, "{r}");
    assert!(
        (us - ms * 1e3 / dispatches).abs() <= 1e-9 * us.max(1.0),
        "{r}"
    );
    let samples = r["host_samples"].as_array().expect("host samples");
    assert_eq!(
        samples.len(),
        r["decode_samples"].as_array().unwrap().len(),
        "{r}"
    );
    assert_eq!(r["decode_replayed"], true, "{r}");
    let submits = r["submits_per_token"].as_f64().expect("submits per token");
    assert!(submits > 0.0 && submits <= 0.5, "{r}");
}

/// With the `wgpu-noop` feature and `WGPU_BACKEND=noop`, `bench --model` times the host's side
/// of the GPU decode alone: wgpu's noop device takes the desktop-GPU paths (row teams,
/// subgroups) and runs nothing, so its logits are not checked, and its rows say so.
#[cfg(feature = "wgpu-noop")]
#[test]
fn bench_model_on_the_noop_device_times_the_host_alone() {
    let out = Command::new(env!("CARGO_BIN_EXE_webtensor"))
        .args(["bench", "--model", "builtin", "--backend", "wgpu"])
        .args([
            "--prompt-tokens",
            "4",
            "--decode-tokens",
            "8",
            "--runs",
            "2",
        ])
        .arg("--json")
        .env_remove("WEBTENSOR_BACKEND")
        .env("WGPU_BACKEND", "noop")
        .output()
        .expect("the webtensor binary runs");
    let v = json(&out);
    let r = &v.as_array().expect("rows")[0];
    assert_eq!(
        (&r["host_only"], &r["checked"]),
        (&true.into(), &false.into()),
        "{r}"
    );
    assert!(
        r["decode_weight_gb_per_s"].is_null() && r["frac_copy"].is_null(),
        "{r}"
    );
    check_host_cost(r);
    let info = Command::new(env!("CARGO_BIN_EXE_webtensor"))
        .arg("info")
        .env("WGPU_BACKEND", "noop")
        .output()
        .expect("the webtensor binary runs");
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("class      noop"), "{text}");
    assert!(
        text.contains("subgroupAdd"),
        "the noop device takes the GPU paths: {text}"
    );
}

/// `bench --json` of one op family on wgpu, one sample a row, with the device's binding limit
/// lowered to `limit` bytes.
fn wgpu_bench_binding_at_most(op: &str, limit: u64) -> Output {
    Command::new(env!("CARGO_BIN_EXE_webtensor"))
        .args([
            "bench",
            "--backend",
            "wgpu",
            "--op",
            op,
            "--runs",
            "1",
            "--json",
        ])
        .env_remove("WEBTENSOR_BACKEND")
        .env("WEBTENSOR_WGPU_MAX_BINDING", limit.to_string())
        .output()
        .expect("the webtensor binary runs")
}

#[test]
fn bench_reports_a_case_the_device_refuses_and_times_the_rest() {
    // With an 8 MiB binding limit the [1024, 2816] f32 operand of `a·b` (11.5 MB) is refused,
    // while `a·bᵀ` reads its operand in row ranges. The refusal was once the whole bench's
    // error, so `--size medium` on lavapipe reported nothing.
    let out = wgpu_bench_binding_at_most("matmul", 8 << 20);
    if skipped_without_wgpu(&out) {
        return;
    }
    let v = json(&out);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in rows {
        let refused = r["case"].as_str().unwrap().ends_with("a·b");
        assert_eq!(r["checked"], !refused, "{r}");
        if refused {
            let error = r["error"].as_str().unwrap();
            assert!(
                r["refused"] == true && error.contains("max_storage_buffer_binding_size"),
                "{r}"
            );
            assert!(r["median_us"].is_null(), "{r}");
        } else {
            assert!(r["median_us"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
}

#[test]
fn bench_probes_fit_a_device_with_a_small_binding_limit() {
    // lavapipe and many browsers bind at most 128 MiB; the probes asked for more at
    // `--size medium` and the whole bench failed. Here a 16 MiB limit against `small`'s 64 MiB.
    let limit: u64 = 16 << 20;
    let out = wgpu_bench_binding_at_most("add", limit);
    if skipped_without_wgpu(&out) {
        return;
    }
    let v = json(&out);
    let ceilings = &v["backends"][0]["ceilings"];
    // The copy reads and writes one binding's worth.
    assert_eq!(
        ceilings["copy_bytes"].as_u64(),
        Some(2 * limit),
        "{ceilings}"
    );
    assert!(
        ceilings["copy_gb_per_s"].as_f64().unwrap() > 0.0,
        "{ceilings}"
    );
    let read = ceilings["read_gb_per_s"].as_f64().unwrap();
    assert!(read > 0.0, "{ceilings}");
    // Each op row is also set against the read probe of the same run.
    for r in v["rows"].as_array().unwrap() {
        let want = r["gb_per_s"].as_f64().unwrap() / read;
        let got = r["frac_read"]
            .as_f64()
            .expect("a fraction of the read ceiling");
        assert!((got - want).abs() <= 1e-9 * want, "{r}");
    }
}
