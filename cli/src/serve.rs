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
//! HTTP/1.1 is hyper's (`http.rs`), on a tokio runtime of one thread that accepts and drives
//! the connections; the answers that block (files, `/metrics`, the API's requests, which wait
//! on the engine's thread) run on tokio's blocking pool of [`WORKERS`] threads (plus, with the
//! API, one per model sequence and one per place in the line of requests waiting for a
//! sequence). Whatever clients do, the server keeps a bounded footprint: at most
//! [`WORKERS`] + [`QUEUE`] connections (and those of the API) are served at once, and one
//! beyond them gets a 503 at once and is closed; a request head has a deadline
//! (`http::HEAD_TIMEOUT`) and a size cap, and so does a request body (`http::BODY_TIMEOUT`,
//! `http::MAX_BODY`); writing an answer has a timeout ([`WRITE_TIMEOUT`]); and when `accept`
//! fails (out of file handles) the loop backs off instead of spinning.
//!
//! A client that hangs up while its whole (not streamed) completion is generated is noticed
//! by hyper, which drops the request's future: that sets the flag the request's thread asks
//! (`gone`), and the scheduler drops the sequence at its next step. A streamed one ends when
//! its next event finds the body dropped.

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Semaphore;

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
use http::{Answer, Request, Status};
use metrics::{Metrics, Record};
use sse::Reply;
use webtensor::Error;

/// Threads answering requests that block.
const WORKERS: usize = 8;
/// Connections served beyond the workers' (waiting for one); beyond this a client gets a 503.
const QUEUE: usize = 64;
/// How long writing an answer to a client may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest pause after failed `accept` calls (out of file handles): the wait doubles from
/// 10 ms up to this, so the loop never spins.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What every request is answered from: the checkout's files, the API when there is one, and
/// the counts.
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
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(workers)
        .thread_name("serve")
        .build()?;
    runtime.block_on(accept(listener, site, workers + QUEUE))
}

/// Accepts connections and serves each on its own task, up to `places` at once; one beyond
/// them is answered 503 and closed.
async fn accept(listener: TcpListener, site: Arc<Site>, places: usize) -> io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let places = Arc::new(Semaphore::new(places));
    let mut backoff = Duration::ZERO;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                let site = site.clone();
                match places.clone().try_acquire_owned() {
                    Ok(place) => {
                        tokio::spawn(async move {
                            let io = WriteTimeout::new(stream);
                            let counts = site.clone();
                            let refused =
                                http::connection(io, move |request| answer(site.clone(), request))
                                    .await;
                            drop(place);
                            // What hyper refused before a request was read: counted as before.
                            if let Some(status) = refused {
                                let mut record = Record::start();
                                record.answered(status);
                                counts.metrics.finish(record);
                            }
                        });
                    }
                    Err(_) => {
                        tokio::spawn(refuse_busy(stream, site));
                    }
                }
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_BACKOFF);
                log::warn!("serve: accept failed ({e}); waiting {backoff:?}");
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

/// Answers 503 to a connection beyond the server's places, without reading it, and closes it.
async fn refuse_busy(mut stream: tokio::net::TcpStream, site: Arc<Site>) {
    let mut record = Record::start();
    record.answered(Status::Unavailable);
    // A fresh socket's send buffer is empty: this short write does not wait.
    let write = async {
        http::write_whole(&mut stream, http::refusal(Status::Unavailable)).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_millis(100), write).await;
    site.metrics.finish(record);
}

/// Answers one request, counting and logging it once answered.
async fn answer(site: Arc<Site>, request: hyper::Request<Incoming>) -> Answer {
    let mut record = Record::start();
    let target = match http::read_request(&request) {
        Ok(target) => target,
        Err(status) => {
            record.answered(status);
            site.metrics.finish(record);
            return http::refusal(status);
        }
    };
    record.request(target.method, &target.path);
    if site.api.is_some() && target.path.starts_with("/v1/") {
        return answer_api(site, target, request, record).await;
    }
    let job = tokio::task::spawn_blocking(move || {
        let answer = answer_file(&site, &target, &mut record);
        site.metrics.finish(record);
        answer
    });
    job.await
        .unwrap_or_else(|_| http::refusal(Status::InternalError))
}

/// A file of the demo, `/health` or `/metrics` (on a worker thread: they read files and the
/// scheduler's load).
fn answer_file(site: &Site, target: &Request, record: &mut Record) -> Answer {
    let found = if target.method == "POST" {
        Err(Status::MethodNotAllowed)
    } else if let Some((status, kind, body)) =
        site.metrics.endpoint(&target.path, site.api.as_ref())
    {
        Ok((status, kind, body.into_bytes()))
    } else {
        http::resolve(&site.root, &target.path).and_then(|file| {
            read_regular_file(&file).map(|body| (Status::Ok, http::mime(&file), body))
        })
    };
    match found {
        Ok((status, kind, body)) => {
            record.answered(status);
            http::respond(status, kind, body)
        }
        Err(status) => {
            record.answered(status);
            http::refusal(status)
        }
    }
}

/// Reads an API request's body (POST) and answers it on a worker thread, which waits on the
/// engine; a body that is missing its length, too long or too slow gets an OpenAI-style JSON
/// error.
async fn answer_api(
    site: Arc<Site>,
    target: Request,
    request: hyper::Request<Incoming>,
    mut record: Record,
) -> Answer {
    let body = if target.method == "POST" {
        match http::read_body(request).await {
            Ok(body) => body,
            Err(status) => {
                let e = params::ApiError {
                    status,
                    message: format!("the request body was refused: {}", status.line()),
                    param: None,
                    kind: "invalid_request_error",
                };
                record.answered(status);
                site.metrics.finish(record);
                return sse::json(status, &e.body());
            }
        }
    } else {
        Default::default()
    };
    let (mut reply, head) = Reply::new();
    // Set when hyper drops this future: the client hung up before the answer's head.
    let hang_up = HangUp(Some(Arc::new(AtomicBool::new(false))));
    let gone = hang_up.flag();
    tokio::task::spawn_blocking(move || {
        let left = || gone.load(Ordering::Relaxed);
        if let Some(api) = site.api.as_ref() {
            if let Err(e) = api.handle(&target, &body, &mut reply, &mut record, &left) {
                log::debug!("serve: answer ended: {e}");
            }
        }
        site.metrics.finish(record);
    });
    let answer = head.await;
    hang_up.answered();
    // No answer: the client left (its request was dropped unanswered).
    answer.unwrap_or_else(|_| http::refusal(Status::ClientClosed))
}

/// Sets its flag when dropped before [`HangUp::answered`].
struct HangUp(Option<Arc<AtomicBool>>);

impl HangUp {
    fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone().unwrap_or_default()
    }

    fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for HangUp {
    fn drop(&mut self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Relaxed);
        }
    }
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

/// A connection whose writes fail once one has waited [`WRITE_TIMEOUT`] for a client that
/// does not read.
struct WriteTimeout {
    stream: tokio::net::TcpStream,
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl WriteTimeout {
    fn new(stream: tokio::net::TcpStream) -> WriteTimeout {
        WriteTimeout {
            stream,
            waiting: None,
        }
    }

    /// `result` of a write, or a timeout once writes have waited too long.
    fn timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            self.waiting = None;
            return result;
        }
        let waiting = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_TIMEOUT)));
        match waiting.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteTimeout {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteTimeout {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.timed(cx, result)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.stream).poll_flush(cx);
        self.timed(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.timed(cx, result)
    }
}
