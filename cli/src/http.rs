//! The HTTP/1.1 side of `webtensor serve` on hyper: one connection served by hyper's HTTP/1.1
//! state machine ([`connection`]: request heads, bodies plain or chunked, automatic 400, 414
//! and 431 answers to heads it cannot parse or that pass [`MAX_HEAD`], a 408 to a client that
//! does not send a whole head within [`HEAD_TIMEOUT`]), what the server reads from a request
//! ([`read_request`]: method, decoded path, the request line's cap; [`read_body`]: a POST's
//! body within [`MAX_BODY`] and [`BODY_TIMEOUT`]), the answers it builds, and path mapping for
//! the static files. The fuzz target `fuzz/fuzz_targets/http.rs` and the stable replay test
//! feed arbitrary bytes through [`connection`] as a client would.
//!
//! Every refusal is a [`Status`] the server sends back with a body.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body as _, Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Most bytes of a request line (method, target, version).
pub const MAX_REQUEST_LINE: usize = 8 * 1024;
/// Most bytes of a whole request head (request line and headers): hyper's read buffer, beyond
/// which it answers 431.
pub const MAX_HEAD: usize = 32 * 1024;
/// Most bytes of a request body (an API request's JSON).
pub const MAX_BODY: usize = 1024 * 1024;
/// How long a client has to send its whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client has to send a request body after its head.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The folders served: URL prefix → directory under the checkout.
pub const MOUNTS: [(&str, &str); 2] = [("/pkg/", "web/pkg"), ("/", "demo")];

/// An HTTP status the server answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// 200.
    Ok,
    /// 400: not HTTP, or a target that is not a path.
    BadRequest,
    /// 403: a path that leaves its folder, or not a regular file.
    Forbidden,
    /// 404.
    NotFound,
    /// 405: a method other than GET or HEAD.
    MethodNotAllowed,
    /// 408: the head did not arrive in time.
    RequestTimeout,
    /// 414: the request line is longer than [`MAX_REQUEST_LINE`].
    UriTooLong,
    /// 431: the head is longer than [`MAX_HEAD`] (hyper's answer).
    HeadersTooLarge,
    /// 411: a POST without a Content-Length.
    LengthRequired,
    /// 413: a body longer than [`MAX_BODY`].
    PayloadTooLarge,
    /// 500: the model failed on a request it had taken.
    InternalError,
    /// 503: every worker (or every sequence of the model) is busy.
    Unavailable,
    /// 499 (nginx's): the client hung up before its answer. Never sent; it marks such a
    /// request in the log and `/metrics`.
    ClientClosed,
}

impl Status {
    /// The status line's code and reason.
    pub fn line(self) -> &'static str {
        match self {
            Status::Ok => "200 OK",
            Status::BadRequest => "400 Bad Request",
            Status::Forbidden => "403 Forbidden",
            Status::NotFound => "404 Not Found",
            Status::MethodNotAllowed => "405 Method Not Allowed",
            Status::RequestTimeout => "408 Request Timeout",
            Status::UriTooLong => "414 URI Too Long",
            Status::HeadersTooLarge => "431 Request Header Fields Too Large",
            Status::LengthRequired => "411 Length Required",
            Status::PayloadTooLarge => "413 Payload Too Large",
            Status::InternalError => "500 Internal Server Error",
            Status::Unavailable => "503 Service Unavailable",
            Status::ClientClosed => "499 Client Closed Request",
        }
    }

    /// The three-digit code alone (the start of [`Status::line`]).
    pub fn code(self) -> &'static str {
        &self.line()[..3]
    }

    /// The status line's code for hyper.
    pub fn to_code(self) -> StatusCode {
        self.code()
            .parse()
            .ok()
            .and_then(|n| StatusCode::from_u16(n).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// The body of every answer: whole bytes, or a stream fed through a [`Channel`].
pub type Body = BoxBody<Bytes, Infallible>;
/// An answer.
pub type Answer = hyper::Response<Body>;

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// GET, HEAD or POST.
    pub method: &'static str,
    /// The decoded path (starts with `/`, no query or fragment).
    pub path: String,
}

/// Serves one client connection with hyper's HTTP/1.1, `answer` answering its request; one
/// request per connection (each answer closes it). A client that has not sent a whole request
/// head within [`HEAD_TIMEOUT`] gets a 408. Returns when the connection is done, whatever the
/// client sent; when the client hangs up while its request is answered, hyper drops the future
/// of `answer` (which is how the server learns of it). Before closing, what the client is
/// still sending is read and dropped for a moment ([`linger`]), so that a refusal sent before
/// the whole request was read reaches the client. Returns the status of the refusal hyper
/// sent on its own (a head it could not parse or that passed [`MAX_HEAD`]) or the 408, when
/// `answer` never ran, for the server to count.
pub async fn connection<I, F, A>(io: I, answer: F) -> Option<Status>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(hyper::Request<Incoming>) -> A + Send + Unpin + 'static,
    A: Future<Output = Answer> + Send + 'static,
{
    let started = Arc::new(AtomicBool::new(false));
    let seen = started.clone();
    let service = service_fn(move |request| {
        seen.store(true, Ordering::Relaxed);
        let answer = answer(request);
        // Boxed: hyper polls the connection by `&mut`, which needs every part of it `Unpin`.
        Box::pin(async move { Ok::<_, Infallible>(answer.await) })
    });
    let mut conn = http1::Builder::new()
        .keep_alive(false)
        .title_case_headers(true)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(io), service);
    let done = tokio::select! {
        result = poll_fn(|cx| conn.poll_without_shutdown(cx)) => Some(result),
        () = tokio::time::sleep(HEAD_TIMEOUT) => None,
    };
    let answered = started.load(Ordering::Relaxed);
    let refused = match &done {
        None if answered => {
            let _ = poll_fn(|cx| conn.poll_without_shutdown(cx)).await;
            None
        }
        None => Some(Status::RequestTimeout),
        Some(Err(e)) if !answered && e.is_parse_too_large() => Some(Status::HeadersTooLarge),
        Some(Err(e)) if !answered && e.is_parse() => Some(Status::BadRequest),
        Some(_) => None,
    };
    let mut io = conn.into_parts().io.into_inner();
    if done.is_none() && !answered {
        let _ = write_whole(&mut io, refusal(Status::RequestTimeout)).await;
    }
    linger(&mut io).await;
    refused
}

/// Closes the sending side, then reads (and drops) what the client still sends, for up to half
/// a second and a MiB: closing a socket with unread input resets the connection, and the
/// client would lose the answer.
async fn linger(io: &mut (impl AsyncRead + AsyncWrite + Unpin)) {
    if io.shutdown().await.is_err() {
        return;
    }
    let (mut input, mut sink) = ((&mut *io).take(1 << 20), tokio::io::sink());
    let drain = tokio::io::copy(&mut input, &mut sink);
    let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
}

/// Writes a whole answer (its body in one piece) on a connection hyper does not hold: the 408
/// to a head not sent in time, or the 503 to a connection beyond the server's places.
pub async fn write_whole(
    io: &mut (impl AsyncWrite + Unpin),
    answer: Answer,
) -> std::io::Result<()> {
    let (parts, body) = answer.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut head = format!(
        "HTTP/1.1 {} {}\r\n",
        parts.status.as_str(),
        parts.status.canonical_reason().unwrap_or("")
    );
    for (name, value) in &parts.headers {
        head += &format!(
            "{}: {}\r\n",
            title_case(name.as_str()),
            value.to_str().unwrap_or("")
        );
    }
    head += &format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    io.write_all(head.as_bytes()).await?;
    io.write_all(&body).await?;
    io.flush().await
}

/// `content-type` → `Content-Type`, as hyper writes names.
fn title_case(name: &str) -> String {
    let mut upper = true;
    name.chars()
        .map(|c| {
            let c = if upper { c.to_ascii_uppercase() } else { c };
            upper = c == '-';
            c
        })
        .collect()
}

/// What the server reads from a request head hyper parsed: the method (GET, HEAD, and POST
/// for the API; others are [`Status::MethodNotAllowed`]) and the percent-decoded path, refusing
/// a request line longer than [`MAX_REQUEST_LINE`] and a target that is not a path.
pub fn read_request<B>(request: &hyper::Request<B>) -> Result<Request, Status> {
    let target = request.uri().to_string();
    if request.method().as_str().len() + target.len() + " HTTP/1.1".len() + 1 > MAX_REQUEST_LINE {
        return Err(Status::UriTooLong);
    }
    let method = match *request.method() {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        _ => return Err(Status::MethodNotAllowed),
    };
    let path = percent_decode(request.uri().path()).ok_or(Status::BadRequest)?;
    if !path.starts_with('/') || path.contains('\0') || path.contains('\\') {
        return Err(Status::BadRequest);
    }
    Ok(Request { method, path })
}

/// Reads a POST's body, plain or chunked: [`Status::LengthRequired`] without a length or
/// chunks, [`Status::PayloadTooLarge`] beyond [`MAX_BODY`], [`Status::RequestTimeout`] when it
/// does not arrive within [`BODY_TIMEOUT`], [`Status::BadRequest`] when it breaks off.
pub async fn read_body(request: hyper::Request<Incoming>) -> Result<Bytes, Status> {
    let headers = request.headers();
    if !headers.contains_key(CONTENT_LENGTH) && !headers.contains_key(TRANSFER_ENCODING) {
        return Err(Status::LengthRequired);
    }
    let body = request.into_body();
    if body.size_hint().lower() > MAX_BODY as u64 {
        return Err(Status::PayloadTooLarge);
    }
    match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY).collect()).await {
        Err(_) => Err(Status::RequestTimeout),
        Ok(Ok(body)) => Ok(body.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(Status::PayloadTooLarge),
        Ok(Err(_)) => Err(Status::BadRequest),
    }
}

/// A whole answer: `status`, `content_type` and `body`, with the cross-origin isolation
/// headers every file and page answer carries; a 405 says what is allowed. For HEAD, hyper
/// sends the head alone.
pub fn respond(status: Status, content_type: &str, body: impl Into<Bytes>) -> Answer {
    let mut answer = hyper::Response::new(Full::new(body.into()).boxed());
    *answer.status_mut() = status.to_code();
    let headers = answer.headers_mut();
    let mut set = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(name, value);
        }
    };
    set("content-type", content_type);
    if status == Status::MethodNotAllowed {
        set("allow", "GET, HEAD");
    }
    set("cross-origin-opener-policy", "same-origin");
    set("cross-origin-embedder-policy", "require-corp");
    set("cross-origin-resource-policy", "same-origin");
    set("x-content-type-options", "nosniff");
    set("cache-control", "no-cache");
    answer
}

/// Answers with `status` and a one-line body naming it.
pub fn refusal(status: Status) -> Answer {
    respond(
        status,
        "text/plain; charset=utf-8",
        format!("{}\n", status.line()),
    )
}

/// A streamed body: the bytes sent on the other end of `mpsc`, in order, ending when the
/// sender is dropped. When hyper drops it (the client left), sending fails.
pub struct Channel(pub mpsc::Receiver<Bytes>);

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// The folder (under the checkout) and the relative file a decoded path names, refusing any
/// path with parts other than plain names (`..`, `.`, a root or drive prefix).
pub fn split_path(path: &str) -> Result<(&'static str, PathBuf), Status> {
    let (prefix, dir) = MOUNTS
        .iter()
        .find(|(prefix, _)| path.starts_with(prefix))
        .ok_or(Status::NotFound)?;
    let rest = Path::new(&path[prefix.len()..]);
    if !rest.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(Status::Forbidden);
    }
    Ok((dir, rest.to_path_buf()))
}

/// The regular file under `root` a decoded path names. A folder means its `index.html`; a
/// symbolic link that leads out of the folder, and anything that is not a regular file (a
/// FIFO, a device, a socket), is [`Status::Forbidden`], so no request can block the server
/// on a pipe or read a device.
pub fn resolve(root: &Path, path: &str) -> Result<PathBuf, Status> {
    let (dir, rest) = split_path(path)?;
    let base = root.join(dir);
    let mut file = base.join(rest);
    if file.is_dir() {
        file = file.join("index.html");
    }
    let real_base = base.canonicalize().map_err(|_| Status::NotFound)?;
    let real = file.canonicalize().map_err(|_| Status::NotFound)?;
    if !real.starts_with(&real_base) {
        return Err(Status::Forbidden);
    }
    let meta = std::fs::metadata(&real).map_err(|_| Status::NotFound)?;
    if !meta.is_file() {
        return Err(Status::Forbidden);
    }
    Ok(real)
}

/// Decodes `%XX` escapes; `None` for a malformed escape or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The Content-Type of a file by its extension.
pub fn mime(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "wasm" => "application/wasm",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "ts" | "txt" | "md" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}
