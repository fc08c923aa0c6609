//! What `webtensor serve` tells about itself while it runs: `GET /health`, `GET /metrics` in
//! Prometheus' text exposition format (version 0.0.4), and one line on stderr per request.
//!
//! [`Metrics`] is the one owner of the counts. The server holds one; a worker fills a
//! [`Record`] while it answers a request and hands it to [`Metrics::finish`] before it closes
//! the connection, which counts the request, its tokens and its timings, and logs it: a
//! client that has read its whole answer finds it counted at its next scrape (a scrape is
//! counted once answered, so it never sees itself). The gauges (active sequences, queue
//! depth, KV blocks) are not kept here but read from the scheduler at each scrape
//! ([`Load`]), so they cannot drift from it.
//!
//! Without `--model` there is no model to report: `/health` answers `{"status":"ok"}` once
//! the server listens, and `/metrics` holds the request counts only. With `--model` the
//! server listens only after the model has loaded, so a `/health` that answers at all means
//! the model is ready.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::io::Write as _;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::json;

use super::api::Api;
use super::http::Status;
use super::scheduler::Load;

/// The content type of the exposition format.
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Paths counted under a `route` label of their own. Any other path is `static` (the demo's
/// files) or, under `/v1/` or in a request that did not parse, `other`, so that no client can
/// grow the number of series.
const ROUTES: [&str; 5] = [
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
];

/// Upper bounds (seconds) of the time-to-first-token buckets: from a small model's
/// milliseconds to a long prompt behind a full queue.
const FIRST_TOKEN_BOUNDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Upper bounds (seconds) of the queue-wait buckets: most requests find a place at once (the
/// first bucket), a burst waits for the ones ahead of it.
const QUEUE_WAIT_BOUNDS: [f64; 15] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Upper bounds (tokens per second of one request) of the decode-speed buckets.
const DECODE_RATE_BOUNDS: [f64; 12] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
];

/// The most bytes of an escaped path a log line carries; a longer one is cut and ends in `...`.
const MAX_LOGGED_PATH: usize = 256;

/// What one request did, filled in while a worker answers it.
pub struct Record {
    /// When a worker took the connection: every time is counted from here.
    started: Instant,
    /// The method and decoded path, once the head has parsed.
    target: Option<(&'static str, String)>,
    /// The status answered; `None` while nothing was (or when the client left first).
    status: Option<Status>,
    /// Tokens of the prompt the engine ran.
    pub prompt_tokens: usize,
    /// Tokens generated: the answer's `usage.completion_tokens`.
    generated_tokens: usize,
    /// How long the request waited in line for a sequence.
    pub queue_wait: Option<Duration>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

impl Record {
    /// A request whose connection a worker has just taken.
    pub fn start() -> Record {
        Record {
            started: Instant::now(),
            target: None,
            status: None,
            prompt_tokens: 0,
            generated_tokens: 0,
            queue_wait: None,
            first_token: None,
            last_token: None,
        }
    }

    /// The request's head has parsed.
    pub fn request(&mut self, method: &'static str, path: &str) {
        self.target = Some((method, path.to_string()));
    }

    /// The answer's status is (about to be) written.
    pub fn answered(&mut self, status: Status) {
        self.status = Some(status);
    }

    /// The client hung up before its answer: the request is counted and logged as 499 (the
    /// code nginx uses for this; it is never sent).
    pub fn client_left(&mut self) {
        self.status = Some(Status::ClientClosed);
    }

    /// One more token arrived from the engine.
    pub fn token(&mut self) {
        self.generated(self.generated_tokens + 1);
    }

    /// The engine's last word: `tokens` in all, the last of them just now.
    pub fn generated(&mut self, tokens: usize) {
        self.generated_tokens = tokens;
        if tokens > 0 {
            let now = Instant::now();
            self.first_token.get_or_insert(now);
            self.last_token = Some(now);
        }
    }

    /// Tokens generated so far.
    pub fn generated_tokens(&self) -> usize {
        self.generated_tokens
    }

    /// Time to first token.
    fn first_token(&self) -> Option<Duration> {
        self.first_token.map(|t| t - self.started)
    }

    /// Tokens per second after the first (which the prompt's pass produced), when there were
    /// at least two.
    fn decode_rate(&self) -> Option<f64> {
        let (first, last) = (self.first_token?, self.last_token?);
        let seconds = (last - first).as_secs_f64();
        (self.generated_tokens >= 2 && seconds > 0.0)
            .then(|| (self.generated_tokens - 1) as f64 / seconds)
    }

    /// The `route` label.
    fn route(&self) -> &'static str {
        match &self.target {
            Some((_, path)) => {
                ROUTES
                    .into_iter()
                    .find(|r| r == path)
                    .unwrap_or(if path.starts_with("/v1/") {
                        "other"
                    } else {
                        "static"
                    })
            }
            None => "other",
        }
    }

    /// The request's line on stderr: `key=value` fields, `-` for what does not apply.
    fn log_line(&self, status: Status, total: Duration) -> String {
        let (method, path) = match &self.target {
            Some((method, path)) => (*method, escape_path(path)),
            None => ("-", "-".to_string()),
        };
        let ms = |d: Option<Duration>| {
            d.map_or("-".to_string(), |d| format!("{:.3}", d.as_secs_f64() * 1e3))
        };
        format!(
            "request method={method} path={path} status={} prompt_tokens={} \
             generated_tokens={} queue_wait_ms={} ttft_ms={} total_ms={}\n",
            status.code(),
            self.prompt_tokens,
            self.generated_tokens,
            ms(self.queue_wait),
            ms(self.first_token()),
            ms(Some(total)),
        )
    }
}

/// `path` as one token of a log line: bytes other than printable ASCII, and `%`, `"` and `\`,
/// are percent-escaped, so a decoded `%0A` cannot start a forged line; cut past
/// [`MAX_LOGGED_PATH`].
fn escape_path(path: &str) -> String {
    let mut out = String::new();
    for b in path.bytes() {
        let piece = match b {
            b'%' | b'"' | b'\\' => format!("%{b:02X}"),
            b'!'..=b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        };
        if out.len() + piece.len() > MAX_LOGGED_PATH {
            out.push_str("...");
            break;
        }
        out.push_str(&piece);
    }
    out
}

/// A Prometheus histogram with fixed buckets.
struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative; beyond the last bound: only in `count`).
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| value <= b) {
            self.counts[i] += 1;
        }
        self.sum += value;
        self.count += 1;
    }

    /// The family: cumulative `_bucket`s up to `+Inf`, `_sum`, `_count`.
    fn render(&self, out: &mut String, name: &str, help: &str) {
        family(out, name, "histogram", help);
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n;
            out.push_str(&format!("{name}_bucket{{le=\"{bound}\"}} {cumulative}\n"));
        }
        out.push_str(&format!(
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}\n",
            count = self.count,
            sum = self.sum,
        ));
    }
}

/// A family's `# HELP` and `# TYPE` lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
}

/// A family of one sample without labels.
fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl Display) {
    family(out, name, kind, help);
    out.push_str(&format!("{name} {value}\n"));
}

/// Everything counted since the server started.
struct Counts {
    /// Answered requests by (`route`, status code).
    requests: BTreeMap<(&'static str, &'static str), u64>,
    prompt_tokens: u64,
    generated_tokens: u64,
    first_token: Histogram,
    /// How long each completion waited in line for a sequence (those whose clients left the
    /// line included).
    queue_wait: Histogram,
    /// Decode speed per request as a histogram, not a gauge: a gauge of the last request
    /// loses every other request between two scrapes, and a mean since start cannot be
    /// narrowed to a window; buckets let Prometheus take quantiles
    /// (`histogram_quantile`) and means (`rate(_sum) / rate(_count)`) over any window and
    /// sum them across servers. Aggregate throughput is `rate(generated_tokens_total)`.
    decode_rate: Histogram,
}

/// The server's counts, shared by its workers (one mutex, held for a few additions).
pub struct Metrics {
    counts: Mutex<Counts>,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            counts: Mutex::new(Counts {
                requests: BTreeMap::new(),
                prompt_tokens: 0,
                generated_tokens: 0,
                first_token: Histogram::new(&FIRST_TOKEN_BOUNDS),
                queue_wait: Histogram::new(&QUEUE_WAIT_BOUNDS),
                decode_rate: Histogram::new(&DECODE_RATE_BOUNDS),
            }),
        }
    }

    /// The counts; each update is a few additions that a panic cannot leave half done, so a
    /// poisoned lock is used as it is.
    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts an answered request and writes its line on stderr; a request that got no
    /// answer (its client left first) is neither.
    pub fn finish(&self, record: Record) {
        let Some(status) = record.status else { return };
        let total = record.started.elapsed();
        {
            let mut counts = self.lock();
            *counts
                .requests
                .entry((record.route(), status.code()))
                .or_default() += 1;
            counts.prompt_tokens += record.prompt_tokens as u64;
            counts.generated_tokens += record.generated_tokens as u64;
            if let Some(t) = record.first_token() {
                counts.first_token.observe(t.as_secs_f64());
            }
            if let Some(t) = record.queue_wait {
                counts.queue_wait.observe(t.as_secs_f64());
            }
            if let Some(rate) = record.decode_rate() {
                counts.decode_rate.observe(rate);
            }
        }
        // One write of the whole line; a closed stderr is no reason to fail a request.
        let line = record.log_line(status, total);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    /// The answer to `GET /health` or `GET /metrics` (status, content type, body); `None`
    /// for any other path. A scheduler that cannot say its load (its pool's lock poisoned)
    /// makes `/health` a 503 and `/metrics` a 500.
    pub fn endpoint(
        &self,
        path: &str,
        api: Option<&Api>,
    ) -> Option<(Status, &'static str, String)> {
        if path != "/health" && path != "/metrics" {
            return None;
        }
        let load = api.map(Api::load).transpose();
        Some(match (path, load) {
            ("/health", Ok(load)) => {
                let mut body = json!({"status": "ok"});
                if let (Some(api), Some(load)) = (api, load) {
                    body["model"] = api.name().into();
                    body["active_sequences"] = load.active_sequences.into();
                    body["max_sequences"] = load.max_sequences.into();
                    body["queue_depth"] = load.queue_depth.into();
                    body["queue_capacity"] = load.queue_capacity.into();
                }
                (Status::Ok, "application/json", body.to_string())
            }
            ("/health", Err(e)) => {
                let body = json!({"status": "error", "message": e.to_string()});
                (Status::Unavailable, "application/json", body.to_string())
            }
            (_, Ok(load)) => (Status::Ok, EXPOSITION, self.render(load.as_ref())),
            (_, Err(e)) => (
                Status::InternalError,
                "text/plain; charset=utf-8",
                format!("{e}\n"),
            ),
        })
    }

    /// The exposition: the request counts, and with a model its load, tokens and latencies.
    fn render(&self, load: Option<&Load>) -> String {
        let counts = self.lock();
        let mut out = String::new();
        family(
            &mut out,
            "webtensor_requests_total",
            "counter",
            "Requests answered, by route and HTTP status code.",
        );
        for ((route, code), n) in &counts.requests {
            out.push_str(&format!(
                "webtensor_requests_total{{route=\"{route}\",code=\"{code}\"}} {n}\n"
            ));
        }
        let Some(load) = load else { return out };
        let gauges = [
            (
                "webtensor_active_sequences",
                "Requests holding a sequence of the model.",
                load.active_sequences,
            ),
            (
                "webtensor_max_sequences",
                "Sequences the model runs at once (--max-sequences).",
                load.max_sequences,
            ),
            (
                "webtensor_queue_depth",
                "Requests waiting in line for a sequence.",
                load.queue_depth,
            ),
            (
                "webtensor_queue_capacity",
                "Requests that may wait in line (--queue).",
                load.queue_capacity,
            ),
            (
                "webtensor_kv_blocks_used",
                "Blocks of the paged KV cache that sequences hold.",
                load.kv_blocks_used,
            ),
            (
                "webtensor_kv_blocks_total",
                "Blocks in the paged KV cache.",
                load.kv_blocks_total,
            ),
        ];
        for (name, help, value) in gauges {
            single(&mut out, name, "gauge", help, value);
        }
        single(
            &mut out,
            "webtensor_prompt_tokens_total",
            "counter",
            "Prompt tokens of the requests run (with those served from shared blocks).",
            counts.prompt_tokens,
        );
        single(
            &mut out,
            "webtensor_prompt_tokens_reused_total",
            "counter",
            "Prompt tokens whose keys and values came from cache blocks computed for an earlier \
             request with the same start (not run again).",
            load.prompt_tokens_reused,
        );
        single(
            &mut out,
            "webtensor_generated_tokens_total",
            "counter",
            "Tokens generated (the answers' usage.completion_tokens).",
            counts.generated_tokens,
        );
        counts.first_token.render(
            &mut out,
            "webtensor_time_to_first_token_seconds",
            "Time from taking a request's connection to its first generated token.",
        );
        counts.queue_wait.render(
            &mut out,
            "webtensor_queue_wait_seconds",
            "Time each completion waited in line for a sequence (--max-sequences).",
        );
        counts.decode_rate.render(
            &mut out,
            "webtensor_decode_tokens_per_second",
            "Tokens per second of each request after its first (requests of two or more).",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoded_newline_cannot_forge_a_log_line() {
        let mut record = Record::start();
        record.request("GET", "/a\nrequest status=200 \"x\"%\\");
        record.answered(Status::NotFound);
        let line = record.log_line(Status::NotFound, Duration::ZERO);
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(line.ends_with('\n'));
        assert!(
            line.contains(" path=/a%0Arequest%20status=200%20%22x%22%25%5C status=404 "),
            "{line}"
        );
        let long = escape_path(&"\u{7f}".repeat(1000));
        assert!(
            long.len() <= MAX_LOGGED_PATH + 3 && long.ends_with("..."),
            "{long}"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_inf() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.5, 1.5, 9.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert_eq!(
            out,
            "# HELP x help\n# TYPE x histogram\nx_bucket{le=\"1\"} 1\nx_bucket{le=\"2\"} 3\n\
             x_bucket{le=\"+Inf\"} 4\nx_sum 12.5\nx_count 4\n"
        );
    }

    #[test]
    fn the_load_is_rendered_as_gauges() {
        let load = Load {
            active_sequences: 3,
            max_sequences: 4,
            queue_depth: 2,
            queue_capacity: 8,
            kv_blocks_used: 5,
            kv_blocks_total: 16,
            prompt_tokens_reused: 7,
        };
        let text = Metrics::new().render(Some(&load));
        for line in [
            "webtensor_active_sequences 3",
            "webtensor_max_sequences 4",
            "webtensor_queue_depth 2",
            "webtensor_queue_capacity 8",
            "webtensor_kv_blocks_used 5",
            "webtensor_kv_blocks_total 16",
            "webtensor_prompt_tokens_reused_total 7",
            "# TYPE webtensor_kv_blocks_used gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        // Without a model: the request counts only.
        assert!(!Metrics::new().render(None).contains("webtensor_kv_blocks"));
    }
}
