//! `webtensor serve`: a small static HTTP server for the browser demo.
//!
//! It serves `demo/` at `/` and `web/pkg/` (what `web/build.sh` builds) at `/pkg/`, on
//! 127.0.0.1 only, one thread per connection, GET and HEAD only. Every answer carries the
//! headers that make the page cross-origin isolated (`Cross-Origin-Opener-Policy:
//! same-origin`, `Cross-Origin-Embedder-Policy: require-corp`), and `.wasm` is served as
//! `application/wasm` so browsers compile it while it streams. A path that leaves its folder
//! (`..`, a symbolic link out) is refused.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};

/// The folders served: URL prefix → directory under the checkout.
const MOUNTS: [(&str, &str); 2] = [("/pkg/", "web/pkg"), ("/", "demo")];

/// Serves `root`'s demo on `127.0.0.1:port` (0: any free port) until the process ends,
/// printing the address first.
pub fn run(root: &Path, port: u16) -> io::Result<()> {
    let demo = root.join("demo");
    if !demo.join("index.html").is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} has no index.html; run serve from the webtensor checkout or pass --dir",
                demo.display()
            ),
        ));
    }
    if !root.join("web/pkg/webtensor.js").is_file() {
        eprintln!("serve: web/pkg is not built yet; run ./web/build.sh first");
    }
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    let addr = listener.local_addr()?;
    println!(
        "webtensor serve: http://{addr}/ (serving {}; Ctrl-C stops)",
        root.display()
    );
    io::stdout().flush()?;
    let root = root.to_path_buf();
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let root = root.clone();
        std::thread::spawn(move || {
            if let Err(e) = handle(stream, &root) {
                log::debug!("serve: connection ended: {e}");
            }
        });
    }
    Ok(())
}

/// Answers one request and closes the connection.
fn handle(stream: TcpStream, root: &Path) -> io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Read the headers up to the blank line; none of them changes the answer.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut out = stream;
    if method != "GET" && method != "HEAD" {
        return respond(
            &mut out,
            "405 Method Not Allowed",
            "text/plain",
            b"GET or HEAD only\n",
            true,
        );
    }
    let head_only = method == "HEAD";
    match resolve(root, target) {
        Ok(file) => match std::fs::read(&file) {
            Ok(body) => respond(&mut out, "200 OK", mime(&file), &body, head_only),
            Err(_) => respond(
                &mut out,
                "404 Not Found",
                "text/plain",
                b"not found\n",
                head_only,
            ),
        },
        Err(status) => {
            let body = format!("{status}\n");
            respond(&mut out, status, "text/plain", body.as_bytes(), head_only)
        }
    }
}

/// The file a request target names, or the HTTP status refusing it.
fn resolve(root: &Path, target: &str) -> Result<PathBuf, &'static str> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    let path = percent_decode(path).ok_or("400 Bad Request")?;
    if !path.starts_with('/') || path.contains('\0') || path.contains('\\') {
        return Err("400 Bad Request");
    }
    let (prefix, dir) = MOUNTS
        .iter()
        .find(|(prefix, _)| path.starts_with(prefix))
        .ok_or("404 Not Found")?;
    let rest = Path::new(&path[prefix.len()..]);
    // Only plain names: no `..`, no root or drive prefix inside the path.
    if !rest.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err("403 Forbidden");
    }
    let base = root.join(dir);
    let mut file = base.join(rest);
    if file.is_dir() {
        file = file.join("index.html");
    }
    // A symbolic link may still point out of the folder: compare the real paths.
    let real_base = base.canonicalize().map_err(|_| "404 Not Found")?;
    let real = file.canonicalize().map_err(|_| "404 Not Found")?;
    if !real.starts_with(&real_base) {
        return Err("403 Forbidden");
    }
    Ok(real)
}

/// Decodes `%XX` escapes; `None` for a malformed escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
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
fn mime(path: &Path) -> &'static str {
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

fn respond(
    out: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> io::Result<()> {
    write!(
        out,
        "HTTP/1.1 {status}\r\n\
         Content-Type: {content_type}\r\n\
         Content-Length: {}\r\n\
         Cross-Origin-Opener-Policy: same-origin\r\n\
         Cross-Origin-Embedder-Policy: require-corp\r\n\
         Cross-Origin-Resource-Policy: same-origin\r\n\
         X-Content-Type-Options: nosniff\r\n\
         Cache-Control: no-cache\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )?;
    if !head_only {
        out.write_all(body)?;
    }
    out.flush()
}
