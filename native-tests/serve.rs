//! `webtensor serve` under hostile clients, over real sockets on 127.0.0.1: many idle
//! connections, oversized heads, methods it does not serve, a FIFO in the served folder, a
//! client that never finishes its request. The server must answer each with a complete HTTP
//! response (or close), keep a bounded number of threads, and go on serving. `serve/observe.rs`:
//! `/health`, `/metrics` and the request log; `serve/share.rs`: prompt blocks shared between
//! requests, clients that hang up.

mod common;
#[path = "serve/observe.rs"]
mod observe;
#[path = "common/serve.rs"]
mod server;
#[path = "serve/share.rs"]
mod share;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use server::{start, start_with};

/// Threads the server may have: its pool (8), the accept loop, and a few the runtime keeps.
const MAX_THREADS: usize = 16;

/// The body an answer declares with Content-Length, checked to be exactly what follows the
/// head.
fn declared_body(answer: &str) -> &str {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {answer:?}"));
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Content-Length in {head:?}"));
    assert_eq!(
        body.len(),
        len,
        "the body differs from its Content-Length: {answer:?}"
    );
    body
}

#[test]
fn refusals_are_complete_answers() {
    let server = start("refusals");
    // A method it does not serve: 405 with the body it declares, and what is allowed.
    let post = server.ask(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(post.contains("Allow: GET, HEAD"), "{post}");
    assert!(!declared_body(&post).is_empty(), "{post}");
    // A request line and a head beyond their caps.
    let long_target = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(20_000));
    let uri = server.ask(long_target.as_bytes());
    assert!(uri.starts_with("HTTP/1.1 414"), "{uri}");
    declared_body(&uri);
    let long_header = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "b".repeat(100_000));
    let head = server.ask(long_header.as_bytes());
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
    declared_body(&head);
    // Not HTTP at all.
    let junk = server.ask(b"\x00\xff\r\n\r\n");
    assert!(junk.starts_with("HTTP/1.1 400"), "{junk}");
    // A normal request still works, and its body is what it declares.
    let index = server.ask(b"GET / HTTP/1.1\r\n\r\n");
    assert!(index.starts_with("HTTP/1.1 200"), "{index}");
    assert_eq!(declared_body(&index), "<!doctype html>hello");
    let head_only = server.ask(b"HEAD / HTTP/1.1\r\n\r\n");
    assert!(head_only.starts_with("HTTP/1.1 200") && head_only.ends_with("\r\n\r\n"));
}

#[test]
#[cfg(unix)]
fn only_regular_files_are_served() {
    let server = start("fifo");
    let fifo = server.root.join("demo/pipe.html");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipping: mkfifo is not available");
        return;
    }
    let started = Instant::now();
    let answer = server.ask(b"GET /pipe.html HTTP/1.1\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    std::fs::remove_file(&fifo).ok();
}

#[test]
fn a_client_that_never_finishes_gets_408() {
    let server = start("slow");
    let mut s = server.connect();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
    let started = Instant::now();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

/// Idle connections (set `WEBTENSOR_IDLE_CONNECTIONS`, default 1000): the server keeps its
/// thread count, answers or closes each, and serves normally once they go away.
#[test]
fn idle_connections_keep_the_server_bounded() {
    let mut server = start("idle");
    let wanted: usize = std::env::var("WEBTENSOR_IDLE_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut idle = Vec::with_capacity(wanted);
    for _ in 0..wanted {
        match TcpStream::connect(&server.addr) {
            Ok(s) => idle.push(s),
            // Out of file handles on the client's side: enough connections for this machine.
            Err(e) => {
                eprintln!("stopped at {} connections: {e}", idle.len());
                break;
            }
        }
    }
    assert!(
        idle.len() >= wanted.min(500),
        "only {} connections",
        idle.len()
    );
    std::thread::sleep(Duration::from_millis(300));
    let threads = server.threads();
    assert!(server.alive(), "the server died");
    assert!(
        threads <= MAX_THREADS,
        "{threads} threads for {} idle connections",
        idle.len()
    );
    eprintln!("{} idle connections: {threads} server threads", idle.len());
    drop(idle);
    // Once they are gone, requests are served again (the pool drains closed connections).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = server.ask(b"GET / HTTP/1.1\r\n\r\n");
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 503"),
            "{answer:?}"
        );
        assert!(Instant::now() < deadline, "still refused: {answer:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(server.alive());
}

/// Out of file handles, `accept` fails until a connection ends: the server waits between
/// tries instead of spinning on the error.
#[test]
#[cfg(target_os = "linux")]
fn failing_accepts_back_off() {
    let mut server = start_with("accept", Some(24));
    let clients: Vec<TcpStream> = (0..48)
        .filter_map(|_| TcpStream::connect(&server.addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = server.cpu_ticks();
    std::thread::sleep(Duration::from_secs(1));
    let used = server.cpu_ticks() - before;
    assert!(server.alive(), "the server died");
    // A spinning accept loop uses a whole core: about 100 ticks a second.
    assert!(
        used < 30,
        "{used} ticks of CPU in one second with accept failing"
    );
    drop(clients);
}

/// `body` posted as JSON to `path` on `server`: the HTTP answer.
fn post(server: &server::Server, path: &str, body: &str) -> String {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    server.ask(request.as_bytes())
}

/// The built-in model has no chat template: chat completions render ChatML instead of
/// answering 400; a `--chat-template` file that loops without end is refused in time with
/// a 400 naming it and its bound, one that ends the process rendering it with a 400 naming
/// it, and the server goes on.
#[test]
fn chat_completions_without_a_template_and_with_a_hostile_one() {
    let body = r#"{"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "In the beginning"}]}"#;
    let server = server::start_builtin("chatml", 64, &[]);
    let answer = post(&server, "/v1/chat/completions", body);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // ChatML's prompt, counted by hand from the built-in tokenizer.
    let chatml = "<|im_start|>user\nIn the beginning<|im_end|>\n<|im_start|>assistant\n";
    let tokenizer = webtensor_llm::builtin::files().unwrap().tokenizer.unwrap();
    let n = tokenizer.encode_with_special(chatml).unwrap().len();
    assert!(
        declared_body(&answer).contains(&format!("\"prompt_tokens\":{n}")),
        "{answer}"
    );
    drop(server);

    // A template that loops without end stops at its fuel. Two more escape minijinja's fuel
    // and end the process rendering them: a list doubled past memory, a namespace printed with
    // itself inside; the worker process ends, not the server. Each request gets a 400 naming
    // the template and what stopped it, well within a minute (a hang would take far longer),
    // and the server answers the next request.
    let hostile = [
        (
            "spin.jinja",
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
            "fuel",
        ),
        (
            "doubling.jinja",
            "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}\
             {% endfor %}{{ ns.l | length }}",
            "ended the process that rendered it",
        ),
        (
            "cycle.jinja",
            "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | string | length }}",
            "ended the process that rendered it",
        ),
    ];
    let dir = std::env::temp_dir().join(format!("webtensor-templates-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text, stopped_by) in hostile {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        let server = server::start_builtin(name, 64, &["--chat-template", file.to_str().unwrap()]);
        for _ in 0..2 {
            let start = Instant::now();
            let answer = post(&server, "/v1/chat/completions", body);
            assert!(answer.starts_with("HTTP/1.1 400"), "{name}: {answer}");
            let message = declared_body(&answer);
            assert!(
                message.contains(name) && message.contains(stopped_by),
                "{message}"
            );
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{name}: {:?}",
                start.elapsed()
            );
        }
        let plain = r#"{"model": "m", "max_tokens": 2, "prompt": "In the beginning"}"#;
        let answer = post(&server, "/v1/completions", plain);
        assert!(answer.starts_with("HTTP/1.1 200"), "{name}: {answer}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A burst beyond `--max-sequences` waits in line instead of meeting 503s: 24 concurrent
/// completions on 4 sequences are all answered.
#[test]
fn a_burst_beyond_the_sequences_waits_in_line() {
    let server = std::sync::Arc::new(server::start_builtin(
        "burst",
        64,
        &["--max-sequences", "4", "--queue", "20"],
    ));
    let body = r#"{"model": "m", "max_tokens": 8, "temperature": 0, "prompt": "In the beginning"}"#;
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let clients: Vec<_> = (0..24)
        .map(|_| {
            let (server, request) = (server.clone(), request.clone());
            std::thread::spawn(move || server.ask(request.as_bytes()))
        })
        .collect();
    let answers: Vec<String> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let texts: Vec<&str> = answers
        .iter()
        .map(|a| {
            assert!(a.starts_with("HTTP/1.1 200"), "{a}");
            declared_body(a)
        })
        .collect();
    // Greedy and alike: every answer is the same completion.
    let text = |body: &str| {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let first = text(texts[0]);
    assert!(texts.iter().all(|t| text(t) == first), "{texts:?}");
}
