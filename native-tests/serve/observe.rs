//! `/health`, `/metrics` and the request log of `webtensor serve`, over real sockets: the
//! counts must move by what the answers themselves say (their `usage`), the exposition must
//! parse as Prometheus' text format, and every request gets exactly one log line.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

use super::{declared_body, post};
use crate::server::{start, start_builtin, Server};

/// The samples of a Prometheus text exposition (format 0.0.4) by series (`name{labels}`),
/// checked on the way: every line is a comment or `name{labels} value` with a number, every
/// sample's family has `# HELP` and `# TYPE` before it, counters end in `_total`, and no
/// series appears twice.
fn exposition(text: &str) -> BTreeMap<String, f64> {
    let mut help = HashSet::new();
    let mut types = HashMap::new();
    let mut samples = BTreeMap::new();
    let is_name = |n: &str| {
        !n.is_empty()
            && !n.starts_with(|c: char| c.is_ascii_digit())
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, doc) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(is_name(name) && !doc.is_empty(), "{line:?}");
            help.insert(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line:?}"
            );
            assert!(kind != "counter" || name.ends_with("_total"), "{line:?}");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        assert!(!line.is_empty() && !line.starts_with('#'), "{line:?}");
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, Some(labels)),
            None => (series, None),
        };
        assert!(is_name(name), "{line:?}");
        if let Some(labels) = labels {
            let labels = labels
                .strip_suffix('}')
                .unwrap_or_else(|| panic!("{line:?}"));
            for label in labels.split(',') {
                let (key, value) = label.split_once('=').unwrap_or_else(|| panic!("{line:?}"));
                assert!(is_name(key), "{line:?}");
                assert!(
                    value.len() >= 2 && value.starts_with('"') && value.ends_with('"'),
                    "{line:?}"
                );
            }
        }
        // A histogram's samples belong to the family without their suffix.
        let family = if types.contains_key(name) {
            name.to_string()
        } else {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|f| types.get(*f).is_some_and(|k| k == "histogram"))
                .unwrap_or_else(|| panic!("no TYPE for {line:?}"))
                .to_string()
        };
        assert!(help.contains(&family), "no HELP for {line:?}");
        assert!(
            samples.insert(series.to_string(), value).is_none(),
            "twice: {line:?}"
        );
    }
    samples
}

/// A JSON answer's body.
fn json_body(answer: &str) -> Value {
    serde_json::from_str(declared_body(answer)).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

/// The `usage` of a streamed answer: the last event that carries one.
fn streamed_usage(answer: &str) -> Value {
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
        .unwrap_or_else(|| panic!("no usage in {answer}"))
}

/// A log line's `key=value` fields.
fn fields(line: &str) -> BTreeMap<&str, &str> {
    line.strip_prefix("request ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .split(' ')
        .map(|f| {
            f.split_once('=')
                .unwrap_or_else(|| panic!("{f:?} in {line:?}"))
        })
        .collect()
}

/// The log lines of the requests, waiting for `count` of them (a request is logged as its
/// connection closes).
fn request_lines(server: &Server, count: usize) -> Vec<String> {
    server.stderr_lines(count, |l| l.starts_with("request "))
}

/// A fresh server with the built-in model: `/health` reports it, completions of each kind move
/// the counters by their own usage, refusals are counted under their status, and each
/// request has one log line with its status, tokens and timings.
#[test]
fn metrics_count_what_the_answers_say() {
    const CTX: usize = 64;
    const SEQUENCES: usize = 4;
    let server = start_builtin("metrics", CTX, &["--max-sequences", &SEQUENCES.to_string()]);
    let health = server.ask(b"GET /health HTTP/1.1\r\n\r\n");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let health = json_body(&health);
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(health["model"], "builtin", "{health}");
    assert_eq!(health["active_sequences"], 0, "{health}");
    assert_eq!(health["queue_depth"], 0, "{health}");

    let text = post(
        &server,
        "/v1/completions",
        r#"{"prompt": "In the beginning", "max_tokens": 5, "temperature": 0}"#,
    );
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let chat = post(
        &server,
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Who made the light?"}], "max_tokens": 4}"#,
    );
    assert!(chat.starts_with("HTTP/1.1 200"), "{chat}");
    let streamed = post(
        &server,
        "/v1/completions",
        r#"{"prompt": "And God said", "max_tokens": 7, "stream": true,
            "stream_options": {"include_usage": true}}"#,
    );
    let usages = [
        json_body(&text)["usage"].clone(),
        json_body(&chat)["usage"].clone(),
        streamed_usage(&streamed),
    ];
    let usage = |u: &Value, key: &str| u[key].as_u64().unwrap_or_else(|| panic!("no {key} in {u}"));
    let prompt: Vec<u64> = usages.iter().map(|u| usage(u, "prompt_tokens")).collect();
    let generated: Vec<u64> = usages
        .iter()
        .map(|u| usage(u, "completion_tokens"))
        .collect();

    // Refusals, one a path that decodes to a newline and a forged log line.
    for (request, status) in [
        (&b"GET /v1/nothing HTTP/1.1\r\n\r\n"[..], "404"),
        (b"GET /x%0Arequest%20status=200 HTTP/1.1\r\n\r\n", "404"),
        (b"POST /health HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "405"),
    ] {
        let answer = server.ask(request);
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{answer}"
        );
    }

    let metrics = server.ask(b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("Content-Type: text/plain; version=0.0.4"),
        "{metrics}"
    );
    let m = exposition(declared_body(&metrics));
    let sample = |series: &str| {
        *m.get(series)
            .unwrap_or_else(|| panic!("no {series} in {m:#?}"))
    };
    let requests = |route: &str, code: &str| {
        sample(&format!(
            "webtensor_requests_total{{route=\"{route}\",code=\"{code}\"}}"
        ))
    };
    assert_eq!(requests("/health", "200"), 1.0);
    assert_eq!(requests("/v1/completions", "200"), 2.0);
    assert_eq!(requests("/v1/chat/completions", "200"), 1.0);
    assert_eq!(requests("other", "404"), 1.0);
    assert_eq!(requests("static", "404"), 1.0);
    assert_eq!(requests("/health", "405"), 1.0);
    let counted: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("webtensor_requests_total{"))
        .map(|(_, v)| v)
        .sum();
    // Everything asked before this scrape, which is counted once answered.
    assert_eq!(counted, 7.0, "{m:#?}");
    assert_eq!(
        sample("webtensor_prompt_tokens_total"),
        prompt.iter().sum::<u64>() as f64
    );
    assert_eq!(
        sample("webtensor_generated_tokens_total"),
        generated.iter().sum::<u64>() as f64
    );
    let ttft = "webtensor_time_to_first_token_seconds";
    assert_eq!(sample(&format!("{ttft}_count")), 3.0);
    assert_eq!(sample(&format!("{ttft}_bucket{{le=\"+Inf\"}}")), 3.0);
    assert!(sample(&format!("{ttft}_sum")) > 0.0);
    // Each completion found a place at once (its wait is a lock taken; 0.25 s leaves room for
    // a loaded machine).
    let wait = "webtensor_queue_wait_seconds";
    assert_eq!(sample(&format!("{wait}_count")), 3.0);
    assert_eq!(sample(&format!("{wait}_bucket{{le=\"0.25\"}}")), 3.0);
    assert_eq!(sample(&format!("{wait}_bucket{{le=\"+Inf\"}}")), 3.0);
    let rate = "webtensor_decode_tokens_per_second";
    let decoded = generated.iter().filter(|&&n| n >= 2).count() as f64;
    assert_eq!(sample(&format!("{rate}_count")), decoded);
    assert_eq!(sample(&format!("{rate}_bucket{{le=\"+Inf\"}}")), decoded);
    // At rest: nothing in flight, every block back in the pool, which holds each sequence's
    // whole context.
    assert_eq!(sample("webtensor_active_sequences"), 0.0);
    assert_eq!(sample("webtensor_queue_depth"), 0.0);
    assert_eq!(sample("webtensor_kv_blocks_used"), 0.0);
    assert_eq!(
        sample("webtensor_kv_blocks_total"),
        (SEQUENCES * CTX.div_ceil(16)) as f64
    );

    // One line per request, in the order asked (each was answered before the next).
    let expected = [
        ("GET", "/health", "200", 0, 0),
        ("POST", "/v1/completions", "200", prompt[0], generated[0]),
        (
            "POST",
            "/v1/chat/completions",
            "200",
            prompt[1],
            generated[1],
        ),
        ("POST", "/v1/completions", "200", prompt[2], generated[2]),
        ("GET", "/v1/nothing", "404", 0, 0),
        ("GET", "/x%0Arequest%20status=200", "404", 0, 0),
        ("POST", "/health", "405", 0, 0),
        ("GET", "/metrics", "200", 0, 0),
    ];
    let lines = request_lines(&server, expected.len());
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (line, (method, path, status, prompt, generated)) in lines.iter().zip(expected) {
        let f = fields(line);
        let keys: Vec<&str> = f.keys().copied().collect();
        assert_eq!(
            keys,
            [
                "generated_tokens",
                "method",
                "path",
                "prompt_tokens",
                "queue_wait_ms",
                "status",
                "total_ms",
                "ttft_ms"
            ],
            "{line}"
        );
        assert_eq!(
            (f["method"], f["path"], f["status"]),
            (method, path, status),
            "{line}"
        );
        assert_eq!(f["prompt_tokens"], prompt.to_string(), "{line}");
        assert_eq!(f["generated_tokens"], generated.to_string(), "{line}");
        let total: f64 = f["total_ms"].parse().unwrap();
        if generated > 0 {
            let ttft: f64 = f["ttft_ms"].parse().unwrap();
            let wait: f64 = f["queue_wait_ms"].parse().unwrap();
            assert!(wait <= ttft && ttft <= total, "{line}");
        } else {
            assert_eq!((f["ttft_ms"], f["queue_wait_ms"]), ("-", "-"), "{line}");
        }
    }
}

/// Without a model: `/health` is a bare ok, and `/metrics` counts requests only.
#[test]
fn health_and_metrics_without_a_model() {
    let server = start("observe");
    let health = server.ask(b"GET /health HTTP/1.1\r\n\r\n");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert_eq!(json_body(&health), serde_json::json!({"status": "ok"}));
    let missing = server.ask(b"GET /missing.html HTTP/1.1\r\n\r\n");
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    let head = server.ask(b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(
        head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
        "{head}"
    );
    let metrics = server.ask(b"GET /metrics HTTP/1.1\r\n\r\n");
    let m = exposition(declared_body(&metrics));
    let expected: BTreeMap<String, f64> = [
        (
            r#"webtensor_requests_total{route="/health",code="200"}"#,
            1.0,
        ),
        (
            r#"webtensor_requests_total{route="/metrics",code="200"}"#,
            1.0,
        ),
        (
            r#"webtensor_requests_total{route="static",code="404"}"#,
            1.0,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(m, expected);
    let lines = request_lines(&server, 4);
    let statuses: Vec<&str> = lines.iter().map(|l| fields(l)["status"]).collect();
    assert_eq!(statuses, ["200", "404", "200", "200"], "{lines:#?}");
}
