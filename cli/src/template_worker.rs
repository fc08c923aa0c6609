//! Chat templates rendered in a worker process, so that a template which ends the process it
//! runs in ends only the worker, not `webtensor chat` or the server.
//!
//! minijinja's fuel bounds almost everything a template can do ([`webtensor_llm::RenderLimits`]),
//! but not all (see [`TemplateRenderer`]): a list doubled with `+` past memory aborts on a failed
//! allocation, a namespace nested in itself and printed overflows the stack. Neither can be caught
//! inside the process. So the command renders through [`TemplateWorker`]: one long-lived child,
//! this same program started as `webtensor template-worker` ([`serve`]), that reads one
//! [`RenderRequest`] per line of its stdin and writes one [`Reply`] per line of its stdout. A
//! render costs a round trip through two pipes (tens of microseconds). The child's data (heap and
//! other private memory) is limited to [`WORKER_MEMORY`] and it writes no core file, so a
//! doubling list fails within seconds instead of taking the machine's memory first.
//!
//! When the worker ends mid-request, the request gets [`Error::TemplateAborted`] with the exit
//! status and what the worker wrote on stderr, and the next request starts a new worker. A worker
//! that had already served requests may have been ended by something else (a signal from
//! outside), so its request is tried once more on a fresh worker before the template is blamed.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use webtensor::error::TemplateBound;
use webtensor::Error;
use webtensor_llm::{RenderRequest, TemplateRenderer};

/// The hidden subcommand that starts a worker.
pub const SUBCOMMAND: &str = "template-worker";

/// The worker's limit on data (`RLIMIT_DATA`: heap and private mappings, not the program's own
/// mapped file): above what the fuel lets a render make (64 bytes a fuel: 150 MB for a context
/// of 128k tokens), far below a machine's memory. A list doubled without end reaches it in a
/// few seconds; the larger the limit, the longer it takes.
pub const WORKER_MEMORY: u64 = 256 << 20;

/// A render's answer, one JSON line from the worker.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    /// The rendered text.
    Text(String),
    /// [`Error::TemplateLimit`].
    Limit {
        template: String,
        bound: TemplateBound,
    },
    /// Any other error of the render, as its reason ([`Error::InvalidArgument`] of `chat`).
    Failed(String),
}

impl Reply {
    fn of(result: Result<String, Error>) -> Reply {
        match result {
            Ok(text) => Reply::Text(text),
            Err(Error::TemplateLimit { template, bound }) => Reply::Limit { template, bound },
            Err(Error::InvalidArgument { reason, .. }) => Reply::Failed(reason),
            Err(e) => Reply::Failed(e.to_string()),
        }
    }

    fn into_result(self) -> Result<String, Error> {
        match self {
            Reply::Text(text) => Ok(text),
            Reply::Limit { template, bound } => Err(Error::TemplateLimit { template, bound }),
            Reply::Failed(reason) => Err(Error::invalid("chat", reason)),
        }
    }
}

/// `webtensor template-worker`: renders each request line of stdin and answers it on stdout,
/// until stdin ends.
pub fn serve() -> Result<(), Error> {
    let failed = |e: &dyn std::fmt::Display| Error::Tool {
        part: "template-worker",
        message: e.to_string(),
    };
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lines() {
        let line = line.map_err(|e| failed(&e))?;
        let reply = match serde_json::from_str::<RenderRequest>(&line) {
            Ok(request) => Reply::of(request.render()),
            Err(e) => Reply::Failed(format!("the worker could not read the request: {e}")),
        };
        let mut text = serde_json::to_string(&reply).map_err(|e| failed(&e))?;
        text.push('\n');
        stdout.write_all(text.as_bytes()).map_err(|e| failed(&e))?;
        stdout.flush().map_err(|e| failed(&e))?;
    }
    Ok(())
}

/// A running worker and its pipes.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Requests it has answered.
    served: u64,
}

impl Worker {
    fn start(program: &PathBuf) -> Result<Worker, Error> {
        let mut command = Command::new(program);
        command
            .arg(SUBCOMMAND)
            // Its last words name how it ended ("memory allocation of … bytes failed", "has
            // overflowed its stack"), without a backtrace after them.
            .env("RUST_BACKTRACE", "0")
            // Nothing else reaches its stderr, which is read only once it has ended: a pipe
            // nobody drains would stop it once full.
            .env("RUST_LOG", "off")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        limit_resources(&mut command);
        let mut child = command.spawn().map_err(|e| Error::Tool {
            part: "chat",
            message: format!(
                "could not start the template worker ({} {SUBCOMMAND}): {e}",
                program.display()
            ),
        })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(Error::Tool {
                part: "chat",
                message: "the template worker started without its pipes".into(),
            });
        };
        Ok(Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            served: 0,
        })
    }

    /// Sends `request` and reads the reply; `None` when the worker is gone.
    fn ask(&mut self, request: &str) -> Option<Reply> {
        self.stdin.write_all(request.as_bytes()).ok()?;
        self.stdin.flush().ok()?;
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(n) if n > 0 => serde_json::from_str(&line).ok(),
            _ => None,
        }
    }

    /// How a worker that stopped answering ended: its exit status and the end of its stderr.
    fn ending(mut self) -> String {
        // It may still be alive with its reply garbled: end it first.
        let _ = self.child.kill();
        let status = self
            .child
            .wait()
            .map_or_else(|e| format!("no exit status: {e}"), |s| s.to_string());
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        let said = stderr
            .lines()
            .filter(|line| !line.starts_with("note: run with `RUST_BACKTRACE"))
            .flat_map(str::split_whitespace)
            .collect::<Vec<_>>()
            .join(" ");
        // Its last 300 characters.
        let tail = said
            .char_indices()
            .rev()
            .nth(299)
            .map_or(said.as_str(), |(at, _)| &said[at..]);
        if tail.is_empty() {
            status
        } else {
            format!("{status}: {tail}")
        }
    }
}

/// Limits the worker's data to [`WORKER_MEMORY`] and turns off its core file.
#[cfg(unix)]
fn limit_resources(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let limit = |resource, value: u64| {
        let limit = libc::rlimit {
            rlim_cur: value as libc::rlim_t,
            rlim_max: value as libc::rlim_t,
        };
        // SAFETY: setrlimit is async-signal-safe and only reads `limit`.
        if unsafe { libc::setrlimit(resource, &limit) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: the closure only calls setrlimit (async-signal-safe) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            limit(libc::RLIMIT_DATA, WORKER_MEMORY)?;
            limit(libc::RLIMIT_CORE, 0)
        });
    }
}

/// Elsewhere the worker runs unlimited: a runaway template still ends only the worker.
#[cfg(not(unix))]
fn limit_resources(_command: &mut Command) {}

/// Renders chat templates in a worker process (see the module's documentation).
#[derive(Debug)]
pub struct TemplateWorker {
    /// This program, started again as the worker.
    program: PathBuf,
    worker: Mutex<Option<Worker>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Worker(pid {}, {} served)", self.child.id(), self.served)
    }
}

impl TemplateWorker {
    /// A renderer whose worker is this program (started on the first render).
    pub fn new() -> Result<TemplateWorker, Error> {
        let program = std::env::current_exe().map_err(|e| Error::Tool {
            part: "chat",
            message: format!("could not find this program to start the template worker: {e}"),
        })?;
        Ok(TemplateWorker {
            program,
            worker: Mutex::new(None),
        })
    }
}

impl TemplateRenderer for TemplateWorker {
    fn render(&self, request: RenderRequest) -> Result<String, Error> {
        let mut line = serde_json::to_string(&request).map_err(|e| Error::Tool {
            part: "chat",
            message: format!("could not write the render request: {e}"),
        })?;
        line.push('\n');
        let mut slot = self.worker.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let mut worker = match slot.take() {
                Some(worker) => worker,
                None => Worker::start(&self.program)?,
            };
            if let Some(reply) = worker.ask(&line) {
                worker.served += 1;
                *slot = Some(worker);
                return reply.into_result();
            }
            let fresh = worker.served == 0;
            let reason = worker.ending();
            if fresh {
                return Err(Error::TemplateAborted {
                    template: request.template.origin,
                    reason,
                });
            }
            log::warn!("the template worker had ended ({reason}); starting another");
        }
    }
}
