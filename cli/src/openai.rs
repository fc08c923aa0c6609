//! The OpenAI-compatible routes of `webtensor serve --model`: `GET /v1/models`,
//! `POST /v1/chat/completions` (the model's chat template, or ChatML for a model without one,
//! or the `--chat-template` file; its render bounded by the context) and `POST /v1/completions`, each
//! answered whole or, with `"stream": true`, as Server-Sent Events (`sse.rs`). Requests are
//! read and checked in `params.rs`, then run by the batching scheduler (`scheduler.rs`),
//! which decodes all of them together. Errors are OpenAI's JSON error objects. Each answer
//! fills in the request's [`Record`] (status, tokens, queue wait, token times).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use webtensor::Error;
use webtensor_llm::generate::{chat_prompt, prompt_ids};
use webtensor_llm::{Llama, Tokenizer};

use super::http::{Request, Status};
use super::metrics::Record;
use super::params::{self, ApiError, Params, StopCut};
use super::scheduler::{Event, Finish, Job, Load, Scheduler, CLIENT_CHECK};
use super::sse::Reply;

/// The model being served and the scheduler that runs its requests.
pub struct Api {
    llama: Arc<Llama>,
    tokenizer: Tokenizer,
    scheduler: Scheduler,
    /// The name `/v1/models` lists and answers carry.
    name: String,
    /// When the server started (the model's `created`), in Unix seconds.
    created: u64,
    /// Numbers the ids of answers.
    next_id: AtomicU64,
}

/// Which completion route.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Api {
    /// Starts the scheduler for up to `max_sequences` concurrent requests, and up to `queue`
    /// more waiting for a place.
    pub fn start(
        llama: Llama,
        tokenizer: Tokenizer,
        name: String,
        max_sequences: usize,
        queue: usize,
    ) -> Result<Api, Error> {
        let llama = Arc::new(llama);
        let scheduler = Scheduler::start(llama.clone(), max_sequences, queue)?;
        Ok(Api {
            llama,
            tokenizer,
            scheduler,
            name,
            created: now(),
            next_id: AtomicU64::new(1),
        })
    }

    /// The name `/v1/models` lists.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The scheduler's load now (see [`Scheduler::load`]).
    pub fn load(&self) -> Result<Load, Error> {
        self.scheduler.load()
    }

    /// Requests in flight or waiting at most: each holds a worker thread.
    pub fn max_requests(&self) -> usize {
        self.scheduler.max_sequences() + self.scheduler.queue()
    }

    /// Answers one API request (its path starts with `/v1/`) with its body already read.
    /// `gone` says whether the client has hung up: a completion whose client leaves while it
    /// waits in line, or while its whole (not streamed) answer is generated, is dropped
    /// unanswered (a streamed one ends when writing to it fails).
    pub fn handle(
        &self,
        request: &Request,
        body: &[u8],
        out: &mut Reply,
        record: &mut Record,
        gone: &dyn Fn() -> bool,
    ) -> io::Result<()> {
        let route = match (request.method, request.path.as_str()) {
            ("GET", "/v1/models") => return send(out, record, Status::Ok, &self.models()),
            ("POST", "/v1/chat/completions") => Kind::Chat,
            ("POST", "/v1/completions") => Kind::Text,
            (_, "/v1/models" | "/v1/chat/completions" | "/v1/completions") => {
                return refuse(
                    out,
                    record,
                    &error(Status::MethodNotAllowed, "this route takes another method"),
                )
            }
            _ => {
                let message = format!(
                    "no route {}; there are /v1/models, /v1/chat/completions, /v1/completions",
                    request.path
                );
                return refuse(out, record, &error(Status::NotFound, &message));
            }
        };
        let job = match self.prepare(route, body) {
            Ok(job) => job,
            Err(e) => return refuse(out, record, &e),
        };
        self.complete(route, job, (out, gone), record)
    }

    /// `/v1/models`: the one model served.
    fn models(&self) -> Value {
        json!({"object": "list", "data": [{
            "id": self.name, "object": "model", "created": self.created, "owned_by": "webtensor",
        }]})
    }

    /// Reads a completion request: its parameters and prompt ids.
    fn prepare(&self, route: Kind, body: &[u8]) -> Result<(Params, Vec<u32>), ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid("body", format!("not JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| ApiError::invalid("body", "must be a JSON object"))?;
        // Without a `seed`, each request draws its own (std's per-process random keys, mixed
        // with a counter), as OpenAI's sampling is not reproducible either.
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(self.next_id.load(Ordering::Relaxed));
            h.finish()
        };
        let own: &[&str] = match route {
            Kind::Chat => &["messages"],
            Kind::Text => &["prompt"],
        };
        let params = params::read(obj, own, seed)?;
        let model_error = |param: &str, e: Error| match e {
            Error::CacheFull { capacity, .. } => ApiError::invalid(
                param,
                format!("the prompt does not fit the context of {capacity} tokens: {e}"),
            ),
            e => ApiError::invalid(param, e.to_string()),
        };
        let ids = match route {
            Kind::Chat => {
                let messages = params::messages(obj.get("messages"))?;
                let context = self.llama.config.context_len();
                let text = chat_prompt(&self.tokenizer, &messages, context)
                    .map_err(|e| model_error("messages", e))?;
                prompt_ids(&self.llama, &self.tokenizer, &text, true)
                    .map_err(|e| model_error("messages", e))?
            }
            Kind::Text => {
                let text = params::prompt(obj.get("prompt"))?;
                prompt_ids(&self.llama, &self.tokenizer, &text, false)
                    .map_err(|e| model_error("prompt", e))?
            }
        };
        Ok((params, ids))
    }

    /// Runs a request through the scheduler and answers it, whole or streamed.
    fn complete(
        &self,
        route: Kind,
        (params, ids): (Params, Vec<u32>),
        (out, gone): (&mut Reply, &dyn Fn() -> bool),
        record: &mut Record,
    ) -> io::Result<()> {
        let asked = Instant::now();
        let ticket = match self.scheduler.admit(gone) {
            Ok(Some(ticket)) => ticket,
            Ok(None) => {
                record.queue_wait = Some(asked.elapsed());
                record.client_left();
                return Ok(());
            }
            Err(busy) => {
                let e = ApiError {
                    status: Status::Unavailable,
                    message: format!(
                        "all {} sequences of the model are generating and {} requests wait \
                         for one; retry shortly",
                        busy.max_sequences, busy.queue
                    ),
                    param: None,
                    kind: "server_busy",
                };
                return refuse(out, record, &e);
            }
        };
        record.queue_wait = Some(asked.elapsed());
        let (events, receive) = mpsc::channel();
        let prompt_tokens = ids.len();
        let job = Job {
            ids,
            max_tokens: params.max_tokens.unwrap_or(usize::MAX),
            sampling: params.sampling,
            events,
            ticket,
        };
        if let Err(e) = self.scheduler.run(job) {
            return refuse(out, record, &error(Status::InternalError, &e.to_string()));
        }
        record.prompt_tokens = prompt_tokens;
        let answer = Answer {
            api: self,
            route,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            created: now(),
            prompt_tokens,
        };
        let mut cut = StopCut::new(params.stops.clone());
        if params.stream {
            answer.stream(&receive, &mut cut, params.include_usage, out, record)
        } else {
            match collect(&receive, &mut cut, record, gone) {
                Ok(Some((text, finish))) => {
                    let whole = answer.whole(&text, finish, record.generated_tokens());
                    send(out, record, Status::Ok, &whole)
                }
                // Dropping the receiver ends the sequence at the engine's next step.
                Ok(None) => {
                    record.client_left();
                    Ok(())
                }
                Err(message) => refuse(out, record, &error(Status::InternalError, &message)),
            }
        }
    }
}

/// An error answer with no field at fault.
fn error(status: Status, message: &str) -> ApiError {
    let kind = match status {
        Status::InternalError => "server_error",
        Status::NotFound => "not_found_error",
        _ => "invalid_request_error",
    };
    ApiError {
        status,
        message: message.into(),
        param: None,
        kind,
    }
}

/// Writes a whole JSON answer and records its status.
fn send(out: &mut Reply, record: &mut Record, status: Status, body: &Value) -> io::Result<()> {
    record.answered(status);
    out.json(status, body)
}

/// Answers with an OpenAI error object.
pub fn refuse(out: &mut Reply, record: &mut Record, e: &ApiError) -> io::Result<()> {
    send(out, record, e.status, &e.body())
}

/// What the engine says next, cut at stop strings: a piece, or the last piece and why.
enum Piece {
    More(String),
    Last(String, Finish),
}

/// Applies the stop strings to the engine's next event; counts tokens and their times in
/// `record`.
fn next_piece(
    event: Result<Event, mpsc::RecvError>,
    cut: &mut StopCut,
    record: &mut Record,
) -> Result<Piece, String> {
    match event {
        Ok(Event::Token(text)) => {
            record.token();
            Ok(match cut.push(&text) {
                (text, false) => Piece::More(text),
                (text, true) => Piece::Last(text, Finish::Stop),
            })
        }
        Ok(Event::Done {
            tail,
            finish,
            tokens: all,
        }) => {
            record.generated(all);
            Ok(match cut.push(&tail) {
                (text, false) => Piece::Last(text + &cut.finish(), finish),
                (text, true) => Piece::Last(text, Finish::Stop),
            })
        }
        Ok(Event::Failed(message)) => Err(message),
        Err(_) => Err("the engine stopped".into()),
    }
}

/// The whole completion: its text and why it ended (its tokens counted in `record`), or
/// `None` as soon as `gone` (asked every [`CLIENT_CHECK`]) says the client hung up.
fn collect(
    receive: &mpsc::Receiver<Event>,
    cut: &mut StopCut,
    record: &mut Record,
    gone: &dyn Fn() -> bool,
) -> Result<Option<(String, Finish)>, String> {
    let mut text = String::new();
    let mut checked = Instant::now();
    loop {
        if checked.elapsed() >= CLIENT_CHECK {
            if gone() {
                return Ok(None);
            }
            checked = Instant::now();
        }
        let event = match receive.recv_timeout(CLIENT_CHECK) {
            Ok(event) => Ok(event),
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(mpsc::RecvError),
        };
        match next_piece(event, cut, record)? {
            Piece::More(piece) => text += &piece,
            Piece::Last(piece, finish) => return Ok(Some((text + &piece, finish))),
        }
    }
}

/// The JSON of one answer (whole or its chunks).
struct Answer<'a> {
    api: &'a Api,
    route: Kind,
    id: u64,
    created: u64,
    prompt_tokens: usize,
}

impl Answer<'_> {
    fn usage(&self, completion_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }

    fn envelope(&self, object: &str, choices: Value) -> Value {
        let prefix = match self.route {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        };
        json!({
            "id": format!("{prefix}-{}", self.id),
            "object": object,
            "created": self.created,
            "model": self.api.name,
            "choices": choices,
        })
    }

    /// A non-streamed answer.
    fn whole(&self, text: &str, finish: Finish, tokens: usize) -> Value {
        let choice = match self.route {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish.reason(),
            }),
            Kind::Text => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish.reason(),
            }),
        };
        let object = match self.route {
            Kind::Chat => "chat.completion",
            Kind::Text => "text_completion",
        };
        let mut v = self.envelope(object, json!([choice]));
        v["usage"] = self.usage(tokens);
        v
    }

    /// One streamed chunk: a piece of text, or the end (`finish`).
    fn chunk(&self, text: Option<&str>, finish: Option<Finish>, first: bool) -> Value {
        let reason = finish.map(Finish::reason);
        match self.route {
            Kind::Chat => {
                let delta = match (text, first) {
                    (_, true) => json!({"role": "assistant", "content": ""}),
                    (Some(t), false) => json!({"content": t}),
                    (None, false) => json!({}),
                };
                let choice = json!({"index": 0, "delta": delta, "finish_reason": reason});
                self.envelope("chat.completion.chunk", json!([choice]))
            }
            Kind::Text => {
                let choice = json!({
                    "index": 0, "text": text.unwrap_or(""), "logprobs": null,
                    "finish_reason": reason,
                });
                self.envelope("text_completion", json!([choice]))
            }
        }
    }

    /// Streams the completion as it is generated. A client that goes away ends the stream
    /// (the write fails), which drops the receiver, which ends the sequence in the engine.
    fn stream(
        &self,
        receive: &mpsc::Receiver<Event>,
        cut: &mut StopCut,
        include_usage: bool,
        out: &mut Reply,
        record: &mut Record,
    ) -> io::Result<()> {
        record.answered(Status::Ok);
        let mut events = out.events()?;
        if self.route == Kind::Chat {
            events.send(&self.chunk(None, None, true))?;
        }
        loop {
            match next_piece(receive.recv(), cut, record) {
                Ok(Piece::More(piece)) => {
                    if !piece.is_empty() {
                        events.send(&self.chunk(Some(&piece), None, false))?;
                    }
                }
                Ok(Piece::Last(piece, finish)) => {
                    if !piece.is_empty() {
                        events.send(&self.chunk(Some(&piece), None, false))?;
                    }
                    events.send(&self.chunk(None, Some(finish), false))?;
                    break;
                }
                Err(message) => {
                    // The head is sent: the error goes in the stream, as OpenAI's servers do.
                    events.send(&error(Status::InternalError, &message).body())?;
                    break;
                }
            }
        }
        if include_usage {
            let object = match self.route {
                Kind::Chat => "chat.completion.chunk",
                Kind::Text => "text_completion",
            };
            let mut usage = self.envelope(object, json!([]));
            usage["usage"] = self.usage(record.generated_tokens());
            events.send(&usage)?;
        }
        events.done()
    }
}
