//! The API server's shared prompt blocks and its clients that hang up, over real sockets with
//! the built-in model.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{declared_body, post};
use crate::server::{start_builtin, Server};

/// Tokens per block of the server's paged pool (`scheduler.rs`).
const BLOCK: u64 = 16;

/// The built-in model's context in these tests: room for a prompt of several blocks.
const CTX: usize = 256;

/// A greedy completion's text and prompt tokens.
fn complete(server: &Server, prompt: &str) -> (String, u64) {
    complete_up_to(server, prompt, 6)
}

/// A greedy completion of at most `max_tokens`: its text and prompt tokens.
fn complete_up_to(server: &Server, prompt: &str, max_tokens: usize) -> (String, u64) {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0});
    let answer = post(server, "/v1/completions", &body.to_string());
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let v: Value = serde_json::from_str(declared_body(&answer)).unwrap();
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    (text, v["usage"]["prompt_tokens"].as_u64().unwrap())
}

/// A sample of `/metrics` (one without labels).
fn metric(server: &Server, name: &str) -> f64 {
    let answer = server.ask(b"GET /metrics HTTP/1.1\r\n\r\n");
    declared_body(&answer)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {answer}"))
}

/// A prompt's full blocks, short of its last token, are served to the next request that
/// begins the same way; its answer is the one a server that never saw the first prompt gives.
#[test]
fn requests_that_begin_alike_share_blocks_and_answer_as_alone() {
    let system = "In the beginning God created the heaven and the earth. And the earth was \
                  without form, and void; and darkness was upon the face of the deep. And the \
                  Spirit of God moved upon the face of the waters.";
    let first = format!("{system} And God said");
    let second = format!("{system} And God saw the light");
    let alone = start_builtin("share-alone", CTX, &[]);
    let (expected, second_tokens) = complete(&alone, &second);
    drop(alone);

    let server = start_builtin("share", CTX, &[]);
    let (once, first_tokens) = complete(&server, &first);
    assert_eq!(metric(&server, "webtensor_prompt_tokens_reused_total"), 0.0);
    // The same prompt again: every full block short of its last token.
    let (again, _) = complete(&server, &first);
    assert_eq!(again, once);
    let full = (first_tokens - 1) / BLOCK * BLOCK;
    assert!(full >= 2 * BLOCK, "{first_tokens} tokens");
    let reused = metric(&server, "webtensor_prompt_tokens_reused_total");
    assert_eq!(reused, full as f64);
    // Another question after the same start: the blocks of the start, and the same answer as
    // a fresh server's.
    let (answer, tokens) = complete(&server, &second);
    assert_eq!(tokens, second_tokens);
    assert_eq!(answer, expected);
    let more = metric(&server, "webtensor_prompt_tokens_reused_total") - reused;
    assert!(more >= BLOCK as f64 && more < tokens as f64, "{more}");
    // Kept blocks are not held: at rest, none is in use.
    assert_eq!(metric(&server, "webtensor_kv_blocks_used"), 0.0);
}

/// A conversation's next turn repeats the last prompt and its answer: the answer's blocks are
/// shared too, not only the prompt's, and the turn answers as a fresh server does.
#[test]
fn the_next_turn_reuses_the_blocks_of_the_last_answer() {
    let first = "And God called the light Day, and the darkness he called Night.";
    let server = start_builtin("share-answer", CTX, &[]);
    let (answer, first_tokens) = complete_up_to(&server, first, 40);
    let second = format!("{first}{answer} And God said");
    let (reply, second_tokens) = complete(&server, &second);
    let reused = metric(&server, "webtensor_prompt_tokens_reused_total");
    // The prompt's own blocks are all a server that shares prompts only would give.
    let prompt_only = (first_tokens - 1) / BLOCK * BLOCK;
    assert!(
        second_tokens >= first_tokens + 2 * BLOCK,
        "the answer ({answer:?}) is too short to fill a block past the prompt"
    );
    assert!(
        reused as u64 >= prompt_only + BLOCK,
        "{reused} tokens reused, {prompt_only} from the prompt alone ({second_tokens} in all)"
    );
    drop(server);
    let alone = start_builtin("share-answer-alone", CTX, &[]);
    assert_eq!(complete(&alone, &second).0, reply);
}

/// A `/health` field.
fn health(server: &Server, field: &str) -> u64 {
    let answer = server.ask(b"GET /health HTTP/1.1\r\n\r\n");
    let v: Value = serde_json::from_str(declared_body(&answer)).unwrap();
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
}

/// Waits (up to 20 s) until `/health`'s `field` is `value`.
fn wait_for(server: &Server, field: &str, value: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while health(server, field) != value {
        assert!(Instant::now() < deadline, "{field} never became {value}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// With one sequence: a request whose client hangs up while it waits in line leaves the line
/// unrun, and a whole request whose client hangs up while it generates is dropped; both are
/// logged as 499, and the server goes on.
///
/// The built-in model generates a long answer in well under a second here, so the test acts
/// at the moments `/health` shows: it hangs up on the last of three waiting requests while
/// two are ahead of it, and on the running one just after it was admitted.
#[test]
fn clients_that_hang_up_are_dropped_waiting_or_running() {
    const MAX_TOKENS: u64 = 240;
    let server = start_builtin("hangup", CTX, &["--max-sequences", "1", "--queue", "4"]);
    let body = format!(r#"{{"prompt": "In", "max_tokens": {MAX_TOKENS}, "temperature": 0}}"#);
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let send = || {
        let mut client = server.connect();
        client.write_all(request.as_bytes()).unwrap();
        client
    };
    let first = send();
    wait_for(&server, "active_sequences", 1);
    let mut waiting = Vec::new();
    for depth in 1..=3 {
        waiting.push(send());
        wait_for(&server, "queue_depth", depth);
    }
    // The last in line hangs up: it leaves (two still wait).
    drop(waiting.pop());
    wait_for(&server, "queue_depth", 2);
    // The first ends; the second is admitted: everyone hangs up.
    wait_for(&server, "queue_depth", 1);
    drop(first);
    drop(waiting);
    wait_for(&server, "queue_depth", 0);
    wait_for(&server, "active_sequences", 0);
    // The server goes on.
    let (text, _) = complete(&server, "And God said");
    assert!(!text.is_empty());

    let lines = server.stderr_lines(5, |l| l.starts_with("request method=POST"));
    assert_eq!(lines.len(), 5, "{lines:#?}");
    let field = |line: &str, key: &str| -> u64 {
        line.split(' ')
            .find_map(|f| f.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    let left: Vec<&String> = lines.iter().filter(|l| l.contains("status=499")).collect();
    assert_eq!(left.len(), 3, "{lines:#?}");
    // Two never ran; the one that ran stopped short of its tokens.
    let (waited, ran): (Vec<&String>, Vec<&String>) = left
        .into_iter()
        .partition(|l| field(l, "prompt_tokens") == 0);
    assert_eq!((waited.len(), ran.len()), (2, 1), "{lines:#?}");
    assert!(
        waited.iter().all(|l| field(l, "generated_tokens") == 0),
        "{waited:#?}"
    );
    assert!(field(ran[0], "generated_tokens") < MAX_TOKENS, "{}", ran[0]);
}
