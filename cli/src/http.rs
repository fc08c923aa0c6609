//! The HTTP/1.1 request handling of `webtensor serve`, as plain functions over bytes and
//! paths (no sockets), so the fuzz target `fuzz/fuzz_targets/http.rs` and the stable replay
//! test run exactly what the server runs: [`read_request`] on the bytes, then [`split_path`]
//! (the part of [`resolve`] before the file system).
//!
//! A request head is read up to the blank line with a cap on its size, the request line is
//! parsed (GET, HEAD, and POST for the API), the target is percent-decoded and mapped to a
//! file under one of the served folders. A POST's body is read by [`read_body`], capped at
//! [`MAX_BODY`]. Every refusal is a [`Status`] the server sends back with a body.

use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

/// Most bytes of a request line (method, target, version).
pub const MAX_REQUEST_LINE: usize = 8 * 1024;
/// Most bytes of a whole request head (request line and headers).
pub const MAX_HEAD: usize = 32 * 1024;
/// Most bytes of a request body (an API request's JSON).
pub const MAX_BODY: usize = 1024 * 1024;

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
    /// 431: the head is longer than [`MAX_HEAD`].
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
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// GET, HEAD or POST.
    pub method: &'static str,
    /// HEAD: the headers only.
    pub head_only: bool,
    /// The decoded path (starts with `/`, no query or fragment).
    pub path: String,
    /// The `Content-Length` header, when there is one.
    pub content_length: Option<usize>,
    /// The bytes read after the head: the start of the body.
    pub body_start: Vec<u8>,
}

/// Reads a request head from `r` up to and including the blank line that ends it, refusing
/// a head longer than [`MAX_HEAD`] or a request line longer than [`MAX_REQUEST_LINE`]. A read
/// that times out is [`Status::RequestTimeout`]; a connection closed before the blank line
/// is an error (nothing to answer).
pub fn read_head(r: &mut impl Read) -> Result<(Vec<u8>, Vec<u8>), ReadError> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = read_some(r, &mut chunk)?;
        // Look for the end from a little before the new bytes (a `\r\n\r\n` split over reads).
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&head[from..]) {
            let rest = head.split_off(from + end);
            return Ok((check_line(head)?, rest));
        }
        if !head.contains(&b'\n') && head.len() > MAX_REQUEST_LINE {
            return Err(ReadError::Refuse(Status::UriTooLong));
        }
        if head.len() > MAX_HEAD {
            return Err(ReadError::Refuse(Status::HeadersTooLarge));
        }
    }
}

/// One read of at least one byte into `buf`, retried when interrupted: a closed connection is
/// [`ReadError::Closed`] and a read timeout [`Status::RequestTimeout`], for the head and the
/// body alike.
fn read_some(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, ReadError> {
    loop {
        return match r.read(buf) {
            Ok(0) => Err(ReadError::Closed),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(ReadError::Refuse(Status::RequestTimeout))
            }
            Err(e) => Err(ReadError::Io(e)),
        };
    }
}

/// Why no request head was read.
#[derive(Debug)]
pub enum ReadError {
    /// Answer with this status.
    Refuse(Status),
    /// The client went away before a whole head.
    Closed,
    /// The connection failed.
    Io(io::Error),
}

/// The length of the head in `bytes` through its blank line (`\r\n\r\n` or `\n\n`), if there.
fn head_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|i| {
        let rest = &bytes[i..];
        if rest.starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if rest.starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

/// Refuses a whole head whose request line is too long or that is too long itself.
fn check_line(head: Vec<u8>) -> Result<Vec<u8>, ReadError> {
    let line = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    if line > MAX_REQUEST_LINE {
        return Err(ReadError::Refuse(Status::UriTooLong));
    }
    if head.len() > MAX_HEAD {
        return Err(ReadError::Refuse(Status::HeadersTooLarge));
    }
    Ok(head)
}

/// Reads and parses one request from `r`: what the server does with the bytes a client
/// sends before it looks at the file system (then [`resolve`]). The fuzz target and the
/// replay test call it on arbitrary bytes; it returns for any input, never panics.
pub fn read_request(r: &mut impl Read) -> Result<Request, ReadError> {
    let (head, body_start) = read_head(r)?;
    let mut request = parse_head(&head).map_err(ReadError::Refuse)?;
    request.body_start = body_start;
    Ok(request)
}

/// Reads the body of `request` (its `Content-Length` bytes, of which `body_start` came with
/// the head) from `r`: [`Status::LengthRequired`] without a length, [`Status::PayloadTooLarge`]
/// beyond [`MAX_BODY`], [`Status::RequestTimeout`] when `r` times out.
pub fn read_body(request: &Request, r: &mut impl Read) -> Result<Vec<u8>, ReadError> {
    let len = request
        .content_length
        .ok_or(ReadError::Refuse(Status::LengthRequired))?;
    if len > MAX_BODY {
        return Err(ReadError::Refuse(Status::PayloadTooLarge));
    }
    let mut body = request.body_start.clone();
    if body.len() > len {
        // Pipelined bytes after the body: the server answers one request per connection.
        body.truncate(len);
    }
    let missing = len - body.len();
    let mut rest = vec![0u8; missing];
    let mut filled = 0;
    while filled < missing {
        filled += read_some(r, &mut rest[filled..])?;
    }
    body.extend_from_slice(&rest);
    Ok(body)
}

/// Parses a request head: `METHOD TARGET HTTP/x.y`, then headers (only `Content-Length` is
/// read; a malformed or repeated one is refused, and so is a POST with `Transfer-Encoding`,
/// which this server does not decode).
pub fn parse_head(head: &[u8]) -> Result<Request, Status> {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = std::str::from_utf8(&head[..line_end]).map_err(|_| Status::BadRequest)?;
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) => (m, t, v),
        _ => return Err(Status::BadRequest),
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() {
        return Err(Status::BadRequest);
    }
    let (method, head_only) = match method {
        "GET" => ("GET", false),
        "HEAD" => ("HEAD", true),
        "POST" => ("POST", false),
        _ => return Err(Status::MethodNotAllowed),
    };
    let path = target.split(['?', '#']).next().unwrap_or("");
    let path = percent_decode(path).ok_or(Status::BadRequest)?;
    if !path.starts_with('/') || path.contains('\0') || path.contains('\\') {
        return Err(Status::BadRequest);
    }
    let headers = String::from_utf8_lossy(&head[line_end..]);
    let mut content_length = None;
    for line in headers.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") && method == "POST" {
            return Err(Status::LengthRequired);
        }
        if name.eq_ignore_ascii_case("content-length") {
            let value = value.trim();
            let len = value
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| value.parse::<usize>().ok())
                .flatten()
                .ok_or(Status::BadRequest)?;
            if content_length.replace(len).is_some() {
                return Err(Status::BadRequest);
            }
        }
    }
    Ok(Request {
        method,
        head_only,
        path,
        content_length,
        body_start: Vec::new(),
    })
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

/// The response head for a body of `len` bytes. Every answer carries the cross-origin
/// isolation headers, and a 405 says what is allowed.
pub fn response_head(status: Status, content_type: &str, len: usize) -> String {
    let allow = if status == Status::MethodNotAllowed {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {}\r\n\
         Content-Type: {content_type}\r\n\
         Content-Length: {len}\r\n\
         {allow}\
         Cross-Origin-Opener-Policy: same-origin\r\n\
         Cross-Origin-Embedder-Policy: require-corp\r\n\
         Cross-Origin-Resource-Policy: same-origin\r\n\
         X-Content-Type-Options: nosniff\r\n\
         Cache-Control: no-cache\r\n\
         Connection: close\r\n\r\n",
        status.line()
    )
}
