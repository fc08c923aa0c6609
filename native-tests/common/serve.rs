//! `webtensor serve` on a throwaway checkout, for the tests that talk to it over real
//! sockets (`serve.rs`, `cli.rs`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A served throwaway checkout and the server process; killed and removed on drop.
pub struct Server {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The served checkout: `demo/index.html` and `web/pkg/webtensor.js`; tests may add files.
    pub root: PathBuf,
    /// The lines the server has written on stderr so far (also passed on to the test's).
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        std::fs::remove_dir_all(&self.root).ok();
    }
}

/// The server on a new checkout; `tag` keeps the folders of concurrent tests apart.
pub fn start(tag: &str) -> Server {
    start_with(tag, None)
}

/// The server, with its file-handle limit lowered to `max_files` (through `sh -c ulimit`).
pub fn start_with(tag: &str, max_files: Option<u32>) -> Server {
    launch(tag, max_files, &[])
}

/// The server with more arguments (`--model builtin`, ...).
pub fn start_args(tag: &str, args: &[&str]) -> Server {
    launch(tag, None, args)
}

/// The server with the API on the built-in model, on the cpu backend with a context of `ctx`
/// tokens, and `extra` arguments.
pub fn start_builtin(tag: &str, ctx: usize, extra: &[&str]) -> Server {
    let ctx = ctx.to_string();
    let mut args = vec!["--model", "builtin", "--backend", "cpu", "--ctx", &ctx];
    args.extend_from_slice(extra);
    launch(tag, None, &args)
}

fn launch(tag: &str, max_files: Option<u32>, args: &[&str]) -> Server {
    let root = std::env::temp_dir().join(format!("webtensor-serve-{tag}-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    std::fs::create_dir_all(root.join("demo")).unwrap();
    std::fs::create_dir_all(root.join("web/pkg")).unwrap();
    std::fs::write(root.join("demo/index.html"), "<!doctype html>hello").unwrap();
    std::fs::write(root.join("web/pkg/webtensor.js"), "export {}").unwrap();
    let mut command = match max_files {
        None => Command::new(env!("CARGO_BIN_EXE_webtensor")),
        Some(n) => {
            let mut c = Command::new("sh");
            c.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\"")])
                .arg(env!("CARGO_BIN_EXE_webtensor"));
            c
        }
    };
    let mut child = command
        .args(["serve", "--port", "0", "--dir"])
        .arg(&root)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    // Read stderr all along, so the server never blocks on a full pipe.
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let (lines, pipe) = (stderr.clone(), child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            eprintln!("{line}");
            lines.lock().unwrap().push(line);
        }
    });
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Server {
        child,
        addr,
        root,
        stderr,
    }
}

impl Server {
    /// A connection with a 20 s read timeout.
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// Sends `request` and reads the whole answer (the server closes after it).
    pub fn ask(&self, request: &[u8]) -> String {
        let mut s = self.connect();
        // The server may answer and close before reading everything (a head too large).
        let _ = s.write_all(request);
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// The server's stderr lines that `keep` selects, once there are `count` of them (within
    /// 20 s; what there is then, if fewer).
    pub fn stderr_lines(&self, count: usize, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let lines: Vec<String> = self
                .stderr
                .lock()
                .unwrap()
                .iter()
                .filter(|l| keep(l))
                .cloned()
                .collect();
            if lines.len() >= count || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The threads the server runs (Linux; 0 elsewhere).
    pub fn threads(&self) -> usize {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// CPU time the server has used, in clock ticks (Linux; 0 elsewhere).
    pub fn cpu_ticks(&self) -> u64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command name (which may hold spaces): utime and stime are 14, 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        field(11) + field(12)
    }

    /// Whether the server is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}
