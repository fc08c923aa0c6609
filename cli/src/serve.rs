//! `webtensor serve`: a small static HTTP server for the browser demo.
//!
//! It serves `demo/` at `/` and `web/pkg/` (what `web/build.sh` builds) at `/pkg/`, on
//! 127.0.0.1 only, GET and HEAD only. Every answer carries the headers that make the page
//! cross-origin isolated (`Cross-Origin-Opener-Policy: same-origin`,
//! `Cross-Origin-Embedder-Policy: require-corp`), and `.wasm` is served as `application/wasm`
//! so browsers compile it while it streams. A path that leaves its folder (`..`, a symbolic
//! link out) or names anything but a regular file is refused.
//!
//! With `--model` it also answers the OpenAI-compatible API under `/v1/` (`openai.rs`: the
//! routes; `params.rs`: the request fields; `sse.rs`: JSON and event-stream answers;
//! `scheduler.rs`: the engine thread that decodes all requests in one batch).
//!
//! `GET /health` and `GET /metrics` (Prometheus' text format) report the server, and every
//! answered request gets one `key=value` line on stderr with its timings (`metrics.rs`).
//!
//! Whatever clients do, the server keeps a bounded footprint: a fixed pool of [`WORKERS`]
//! threads (plus, with the API, one per model sequence and one per place in the line of
//! requests waiting for a sequence, since a worker waits on its request's generation) takes connections from a queue of [`QUEUE`]; a connection that finds the queue
//! full gets a 503 at once and is closed; reading a request head has a deadline
//! ([`HEAD_TIMEOUT`]) and a size cap (see `http.rs`), and so does a request body
//! ([`BODY_TIMEOUT`], `http::MAX_BODY`); writing has a timeout; and when `accept` fails (out
//! of file handles) the loop backs off instead of spinning.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "openai.rs"]
pub mod api;
#[path = "http.rs"]
mod http;
#[path = "metrics.rs"]
mod metrics;
#[path = "params.rs"]
mod params;
#[path = "scheduler.rs"]
mod scheduler;
#[path = "sse.rs"]
mod sse;

use api::Api;
use http::{ReadError, Request, Status};
use metrics::{Metrics, Record};
use webtensor::Error;

/// Threads answering requests.
const WORKERS: usize = 8;
/// Accepted connections waiting for a worker; beyond this a client gets a 503.
const QUEUE: usize = 64;
/// How long a client has to send its whole request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client has to send a request body after its head.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one write to a client may block.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest pause after failed `accept` calls (out of file handles): the wait doubles from
/// 10 ms up to this, so the loop never spins.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What every worker serves: the checkout's files, the API when there is one, and the counts.
struct Site {
    root: PathBuf,
    api: Option<Api>,
    metrics: Metrics,
}

/// Serves `root`'s demo, and the API when there is one, on `127.0.0.1:port` (0: any free
/// port) until the process ends, printing the address first.
pub fn run(root: &Path, port: u16, api: Option<Api>) -> Result<(), Error> {
    let io_error = |source| Error::Io {
        path: root.display().to_string(),
        source,
    };
    listen(root, port, api).map_err(io_error)
}

fn listen(root: &Path, port: u16, api: Option<Api>) -> io::Result<()> {
    let demo = root.join("demo");
    if api.is_none() && !demo.join("index.html").is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} has no index.html; run serve from the webtensor checkout or pass --dir",
                demo.display()
            ),
        ));
    }
    if api.is_none() && !root.join("web/pkg/webtensor.js").is_file() {
        eprintln!("serve: web/pkg is not built yet; run ./web/build.sh first");
    }
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    let addr = listener.local_addr()?;
    let openai = api.as_ref().map_or(String::new(), |api| {
        format!("; OpenAI API at http://{addr}/v1 for {}", api.name())
    });
    println!(
        "webtensor serve: http://{addr}/ (serving {}{openai}; Ctrl-C stops)",
        root.display()
    );
    io::stdout().flush()?;
    let workers = WORKERS + api.as_ref().map_or(0, Api::max_requests);
    let site = Arc::new(Site {
        root: root.to_path_buf(),
        api,
        metrics: Metrics::new(),
    });
    let queue = start_workers(&site, workers)?;
    let mut backoff = Duration::ZERO;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                dispatch(&queue, stream, &site.metrics);
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_BACKOFF);
                log::warn!("serve: accept failed ({e}); waiting {backoff:?}");
                std::thread::sleep(backoff);
            }
        }
    }
}

/// Starts the worker pool; connections sent to the queue are answered in order.
fn start_workers(site: &Arc<Site>, workers: usize) -> io::Result<SyncSender<TcpStream>> {
    let (send, receive) = mpsc::sync_channel::<TcpStream>(QUEUE);
    let receive = Arc::new(Mutex::new(receive));
    for i in 0..workers {
        let (receive, site) = (receive.clone(), site.clone());
        std::thread::Builder::new()
            .name(format!("serve-{i}"))
            .spawn(move || work(&receive, &site))?;
    }
    Ok(send)
}

/// Answers connections one after another; each request is counted and logged before its
/// connection closes.
fn work(receive: &Mutex<Receiver<TcpStream>>, site: &Site) {
    loop {
        let next = match receive.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        let Ok(mut stream) = next else { return };
        let mut record = Record::start();
        if let Err(e) = handle(&mut stream, site, &mut record) {
            log::debug!("serve: connection ended: {e}");
        }
        site.metrics.finish(record);
    }
}

/// Queues a connection, or answers 503 and closes it when every worker is busy and the
/// queue is full.
fn dispatch(queue: &SyncSender<TcpStream>, stream: TcpStream, metrics: &Metrics) {
    match queue.try_send(stream) {
        Ok(()) => {}
        Err(TrySendError::Full(mut stream)) => {
            // A fresh socket's send buffer is empty: this short write does not block.
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            let mut record = Record::start();
            let _ = refuse(&mut stream, &mut record, Status::Unavailable, false);
            metrics.finish(record);
        }
        Err(TrySendError::Disconnected(_)) => log::error!("serve: no worker is left"),
    }
}

/// A reader that gives up when the deadline for the whole head passes, however slowly the
/// client trickles bytes in.
struct Deadline<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

/// Answers one request (the caller closes the connection), filling in `record`.
fn handle(stream: &mut TcpStream, site: &Site, record: &mut Record) -> io::Result<()> {
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let mut input = Deadline {
        stream,
        until: Instant::now() + HEAD_TIMEOUT,
    };
    let request = match http::read_request(&mut input) {
        Ok(request) => request,
        Err(ReadError::Refuse(status)) => {
            refuse(stream, record, status, false)?;
            return linger(stream);
        }
        Err(ReadError::Closed) => return Ok(()),
        Err(ReadError::Io(e)) => return Err(e),
    };
    record.request(request.method, &request.path);
    let api = site.api.as_ref();
    if let Some(api) = api.filter(|_| request.path.starts_with("/v1/")) {
        return answer_api(api, &request, stream, record);
    }
    if request.method == "POST" {
        refuse(stream, record, Status::MethodNotAllowed, false)?;
        return linger(stream);
    }
    if let Some((status, kind, body)) = site.metrics.endpoint(&request.path, api) {
        return respond(
            stream,
            record,
            status,
            kind,
            body.as_bytes(),
            request.head_only,
        );
    }
    let file = match http::resolve(&site.root, &request.path) {
        Ok(file) => file,
        Err(status) => return refuse(stream, record, status, request.head_only),
    };
    match read_regular_file(&file) {
        Ok(body) => respond(
            stream,
            record,
            Status::Ok,
            http::mime(&file),
            &body,
            request.head_only,
        ),
        Err(status) => refuse(stream, record, status, request.head_only),
    }
}

/// Reads an API request's body (POST) within [`BODY_TIMEOUT`] and answers it; a body that
/// is missing its length, too long or too slow gets an OpenAI-style JSON error.
fn answer_api(
    api: &Api,
    request: &Request,
    stream: &mut TcpStream,
    record: &mut Record,
) -> io::Result<()> {
    let body = if request.method == "POST" {
        let mut input = Deadline {
            stream,
            until: Instant::now() + BODY_TIMEOUT,
        };
        match http::read_body(request, &mut input) {
            Ok(body) => body,
            Err(ReadError::Refuse(status)) => {
                let message = format!("the request body was refused: {}", status.line());
                let e = params::ApiError {
                    status,
                    message,
                    param: None,
                    kind: "invalid_request_error",
                };
                api::refuse(stream, record, &e)?;
                return linger(stream);
            }
            Err(ReadError::Closed) => return Ok(()),
            Err(ReadError::Io(e)) => return Err(e),
        }
    } else {
        Vec::new()
    };
    // A second handle on the socket to look at while the first answers (without one, the
    // client cannot be seen to leave).
    let peer = stream.try_clone().ok();
    let gone = || peer.as_ref().is_some_and(hung_up);
    api.handle(request, &body, stream, record, &gone)
}

/// Whether the client has closed its side of the connection (or reset it), without waiting
/// and without consuming what it sent: a read of end of file, or an error, when peeked. A
/// client that shuts down only its sending side and still waits for the answer reads as gone
/// too (HTTP clients do not do that; nginx's 499 treats it the same).
fn hung_up(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8];
    let gone = match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted,
    };
    gone | stream.set_nonblocking(false).is_err()
}

/// The bytes of `file`, checked on the opened handle to be a regular file (a FIFO swapped in
/// after [`http::resolve`] looked is refused too, though opening it may wait for a writer).
fn read_regular_file(file: &Path) -> Result<Vec<u8>, Status> {
    let mut f = std::fs::File::open(file).map_err(|_| Status::NotFound)?;
    let meta = f.metadata().map_err(|_| Status::NotFound)?;
    if !meta.is_file() {
        return Err(Status::Forbidden);
    }
    let mut body = Vec::new();
    f.read_to_end(&mut body).map_err(|_| Status::NotFound)?;
    Ok(body)
}

/// Answers with `status` and a one-line body naming it.
fn refuse(
    out: &mut TcpStream,
    record: &mut Record,
    status: Status,
    head_only: bool,
) -> io::Result<()> {
    let body = format!("{}\n", status.line());
    respond(
        out,
        record,
        status,
        "text/plain; charset=utf-8",
        body.as_bytes(),
        head_only,
    )
}

/// After refusing a request mid-way, reads (and drops) what the client is still sending for
/// a moment before closing: closing a socket with unread input resets the connection, and
/// the client would lose the answer.
fn linger(out: &mut TcpStream) -> io::Result<()> {
    out.shutdown(std::net::Shutdown::Write)?;
    out.set_read_timeout(Some(Duration::from_millis(500)))?;
    let _ = io::copy(&mut (&*out).take(1 << 20), &mut io::sink());
    Ok(())
}

/// Writes the head and, unless `head_only`, the body it declares.
fn respond(
    out: &mut TcpStream,
    record: &mut Record,
    status: Status,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> io::Result<()> {
    record.answered(status);
    out.write_all(http::response_head(status, content_type, body.len()).as_bytes())?;
    if !head_only {
        out.write_all(body)?;
    }
    out.flush()
}
