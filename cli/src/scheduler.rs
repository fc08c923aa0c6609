//! The batching scheduler behind the OpenAI-compatible API: one model, one paged KV pool, and
//! one engine thread that runs every active request as a sequence of the pool.
//!
//! Each step is one [`Llama::last_logits`] over all active sequences: a request admitted
//! since the last step contributes its whole prompt, every other one its last token. The next
//! token of each sequence is drawn from its last row on the device with the request's own
//! [`Sampler`] (so requests keep their own temperature and seed), only the ids are read back,
//! and each is decoded to text and sent to the request's channel. A request leaves the batch at its end-of-turn token, at its
//! `max_tokens`, at the end of the context, or when its client has gone (its channel is closed).
//!
//! Admission is bounded: at most `max_sequences` requests are in flight; the pool holds that
//! many full contexts, so no admitted request can run out of cache blocks. A request beyond
//! that waits in a line of at most `queue` requests, admitted in the order they came as places
//! free up; a request that finds the line full is refused at once ([`Busy`]) for the HTTP
//! layer to answer 503, and one whose client hangs up while it waits leaves the line unrun.
//!
//! Requests share the pool's blocks of the ids they begin alike with: a prompt's full blocks
//! are offered once its pass has run ([`KvCache::share`]), and those of the whole sequence,
//! prompt and answer, when it ends. A later prompt that begins with the same ids starts from
//! them ([`KvPool::sequence_sharing`]), so only the rest of it runs (a block shared in part
//! runs again). That is how a conversation's next turn, which repeats the last answer after
//! the last prompt, runs only its new message. Blocks no request holds stay cached until the
//! pool needs them, so sharing never refuses a request.
//!
//! [`Scheduler::load`] reports the places taken, the line, the pool's blocks and the prompt
//! tokens served from shared blocks for `/health` and `/metrics`. A finished sequence gives
//! its blocks back before its request hears that it is done, like its place.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use webtensor::{ops, Error, Tensor};
use webtensor_llm::generate::is_stop;
use webtensor_llm::{
    CacheLayout, KvCache, KvPool, Llama, Sampler, Sampling, SequenceInput, StreamDecoder, Tokenizer,
};

/// Tokens per block of the paged pool.
const BLOCK_SIZE: usize = 16;

/// How often a request waiting in line, or for its whole answer, asks whether its client is
/// still there.
pub const CLIENT_CHECK: Duration = Duration::from_millis(50);

/// One request for the engine.
pub struct Job {
    /// The prompt's ids (checked to fit the context with room for one more).
    pub ids: Vec<u32>,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Where the engine sends what happens; dropping the receiver cancels the request.
    pub events: Sender<Event>,
    /// The request's place, given back by the engine before it reports the end: a client that
    /// sends its next request as soon as it has the answer finds the place free.
    pub ticket: Ticket,
}

/// What the engine reports to a request.
#[derive(Debug)]
pub enum Event {
    /// One more token was generated; its text (empty while a character is incomplete).
    Token(String),
    /// Generation ended: the text of the last token and of the decoder's held bytes, why,
    /// and how many tokens were generated (an end-of-turn token included).
    Done {
        tail: String,
        finish: Finish,
        tokens: usize,
    },
    /// The step failed; the request is over.
    Failed(String),
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The model ended its turn (or a stop string was met).
    Stop,
    /// `max_tokens` or the context was reached.
    Length,
}

impl Finish {
    /// The OpenAI `finish_reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// The pool is full and so is the line waiting for it.
#[derive(Debug)]
pub struct Busy {
    pub max_sequences: usize,
    pub queue: usize,
}

/// What the scheduler holds at one moment, for `/health` and `/metrics`.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Requests holding a sequence place (generating, or about to).
    pub active_sequences: usize,
    pub max_sequences: usize,
    /// Requests waiting in line for a place.
    pub queue_depth: usize,
    /// Requests that may wait in line.
    pub queue_capacity: usize,
    /// Blocks of the pool that sequences hold.
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Prompt tokens, since the start, whose keys and values came from blocks computed for an
    /// earlier request rather than run again.
    pub prompt_tokens_reused: u64,
}

/// The handle requests are submitted through; cloning shares the engine.
#[derive(Clone)]
pub struct Scheduler {
    submit: Sender<Job>,
    admission: Arc<Admission>,
    /// The engine's pool, shared to report its blocks.
    pool: KvPool,
    /// Prompt tokens the engine took from shared blocks ([`Load::prompt_tokens_reused`]).
    reused: Arc<AtomicU64>,
}

/// The places among the in-flight requests, and the line of requests waiting for one.
struct Admission {
    line: Mutex<Line>,
    /// Signalled when a place is given back or the head of the line moves.
    changed: Condvar,
    max_sequences: usize,
    queue: usize,
}

/// The state of [`Admission`]: numbers are handed out in order of arrival to requests that
/// must wait, and admitted in that order.
#[derive(Default)]
struct Line {
    in_flight: usize,
    /// The number the next waiting request takes.
    next: u64,
    /// The number admitted next: the numbers from it to `next` wait, but those in `left`.
    serving: u64,
    /// Numbers past `serving` whose clients hung up while waiting.
    left: BTreeSet<u64>,
}

impl Line {
    fn waiting(&self) -> u64 {
        self.next - self.serving - self.left.len() as u64
    }

    /// Moves the head of the line past the requests that left it.
    fn skip_left(&mut self) {
        while self.left.remove(&self.serving) {
            self.serving += 1;
        }
    }
}

impl Admission {
    fn new(max_sequences: usize, queue: usize) -> Arc<Admission> {
        Arc::new(Admission {
            line: Mutex::new(Line::default()),
            changed: Condvar::new(),
            max_sequences,
            queue,
        })
    }

    /// The line; a panic while it was held cannot leave it inconsistent (each update is one
    /// step), so a poisoned lock is used as it is.
    fn lock(&self) -> MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// See [`Scheduler::admit`].
    fn admit(self: &Arc<Self>, gone: &dyn Fn() -> bool) -> Result<Option<Ticket>, Busy> {
        let mut line = self.lock();
        let waiting = line.waiting();
        if waiting == 0 && line.in_flight < self.max_sequences {
            line.in_flight += 1;
        } else if waiting >= self.queue as u64 {
            return Err(Busy {
                max_sequences: self.max_sequences,
                queue: self.queue,
            });
        } else {
            let mine = line.next;
            line.next += 1;
            while line.serving != mine || line.in_flight >= self.max_sequences {
                line = self
                    .changed
                    .wait_timeout(line, CLIENT_CHECK)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                if gone() {
                    line.left.insert(mine);
                    line.skip_left();
                    self.changed.notify_all();
                    return Ok(None);
                }
            }
            line.serving += 1;
            line.skip_left();
            line.in_flight += 1;
            // The next in line may find a place too.
            self.changed.notify_all();
        }
        Ok(Some(Ticket {
            admission: self.clone(),
        }))
    }
}

/// A place among the in-flight requests, given back when dropped.
pub struct Ticket {
    admission: Arc<Admission>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.lock().in_flight -= 1;
        self.admission.changed.notify_all();
    }
}

impl Scheduler {
    /// Allocates a paged pool for `max_sequences` full contexts and starts the engine thread.
    /// A pool the device cannot hold is an error here, before the server listens (lower
    /// `--ctx` or `--max-sequences`).
    /// Up to `queue` requests beyond them wait for a place.
    pub fn start(
        llama: Arc<Llama>,
        max_sequences: usize,
        queue: usize,
    ) -> Result<Scheduler, Error> {
        let c = &llama.config;
        let token_bytes = c.num_hidden_layers * 2 * c.kv_dim() * 4;
        let tokens = max_sequences * c.context_len().div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        let layout = CacheLayout::Paged {
            block_size: BLOCK_SIZE,
            budget_bytes: tokens.saturating_mul(token_bytes),
        };
        let pool = llama.new_pool(layout)?;
        let (submit, jobs) = mpsc::channel();
        let reused = Arc::new(AtomicU64::new(0));
        let (engine_pool, engine_reused) = (pool.clone(), reused.clone());
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || engine(&llama, &engine_pool, &jobs, &engine_reused))
            .map_err(|e| Error::Tool {
                part: "serve",
                message: format!("the engine thread did not start: {e}"),
            })?;
        Ok(Scheduler {
            submit,
            admission: Admission::new(max_sequences, queue),
            pool,
            reused,
        })
    }

    /// Requests that may be in flight.
    pub fn max_sequences(&self) -> usize {
        self.admission.max_sequences
    }

    /// Requests that may wait for a place.
    pub fn queue(&self) -> usize {
        self.admission.queue
    }

    /// Takes a place for a request, waiting in line (behind the requests that came before it)
    /// while `max_sequences` are in flight; [`Busy`] when `queue` requests wait already, and
    /// `None` when `gone` (asked every [`CLIENT_CHECK`] while it waits) says its client hung up:
    /// it left the line.
    pub fn admit(&self, gone: &dyn Fn() -> bool) -> Result<Option<Ticket>, Busy> {
        self.admission.admit(gone)
    }

    /// The places taken, the line and the pool's blocks now; an error only when the pool's
    /// lock was poisoned by a panic.
    pub fn load(&self) -> Result<Load, Error> {
        let (active_sequences, queue_depth) = {
            let line = self.admission.lock();
            (line.in_flight, line.waiting() as usize)
        };
        let kv_blocks_total = self.pool.total_blocks()?;
        Ok(Load {
            active_sequences,
            max_sequences: self.admission.max_sequences,
            queue_depth,
            queue_capacity: self.admission.queue,
            kv_blocks_used: kv_blocks_total.saturating_sub(self.pool.free_blocks()?),
            kv_blocks_total,
            prompt_tokens_reused: self.reused.load(Ordering::Relaxed),
        })
    }

    /// Hands a job to the engine (its [`Ticket`] held by the caller until it is done).
    pub fn run(&self, job: Job) -> Result<(), Error> {
        self.submit.send(job).map_err(|_| Error::Tool {
            part: "serve",
            message: "the engine has stopped".into(),
        })
    }
}

/// One request in the batch.
struct Running<'t> {
    cache: KvCache,
    /// Tokens the next step runs: the prompt (past the ids shared blocks hold), then the last
    /// token drawn.
    pending: Vec<u32>,
    /// The ids the cache holds or is about to: the prompt, then each token drawn. Its blocks
    /// are offered to later requests when the prompt's pass has run (the step that draws its
    /// first token) and when the request ends.
    ids: Vec<u32>,
    sampler: Sampler,
    decoder: StreamDecoder<'t>,
    generated: usize,
    max_tokens: usize,
    events: Sender<Event>,
    /// Dropped before [`Event::Done`] is sent (see [`Job::ticket`]).
    ticket: Option<Ticket>,
}

/// The engine loop: waits for work when idle, otherwise admits what arrived and runs a step.
fn engine(llama: &Llama, pool: &KvPool, jobs: &Receiver<Job>, reused: &AtomicU64) {
    let Some(tokenizer) = llama.tokenizer.as_ref() else {
        return;
    };
    let mut running: Vec<Running> = Vec::new();
    loop {
        let arrived = if running.is_empty() {
            match jobs.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            }
        } else {
            match jobs.try_recv() {
                Ok(job) => Some(job),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return,
            }
        };
        // Take everything that is waiting into the same step.
        for job in arrived
            .into_iter()
            .chain(std::iter::from_fn(|| jobs.try_recv().ok()))
        {
            running.extend(start(job, pool, tokenizer, reused));
        }
        if running.is_empty() {
            continue;
        }
        if let Err(e) = step(llama, tokenizer, &mut running) {
            for r in running.drain(..) {
                let _ = r.events.send(Event::Failed(e.to_string()));
            }
        }
    }
}

/// A request's sequence, holding the shared blocks its prompt begins with; `None` (and the
/// request told) when the pool cannot be read.
fn start<'t>(
    job: Job,
    pool: &KvPool,
    tokenizer: &'t Tokenizer,
    reused: &AtomicU64,
) -> Option<Running<'t>> {
    let cache = match pool.sequence_sharing(&job.ids) {
        Ok(cache) => cache,
        Err(e) => {
            let _ = job.events.send(Event::Failed(e.to_string()));
            return None;
        }
    };
    reused.fetch_add(cache.len() as u64, Ordering::Relaxed);
    Some(Running {
        pending: job.ids[cache.len()..].to_vec(),
        cache,
        ids: job.ids,
        sampler: Sampler::new(job.sampling),
        decoder: tokenizer.stream(),
        generated: 0,
        max_tokens: job.max_tokens,
        events: job.events,
        ticket: Some(job.ticket),
    })
}

/// Each sequence's next token from its row of `last` (`[sequences, vocab]`), drawn on the
/// device with its own sampler's parameters and number: one [`ops::sample`] per run of
/// neighbouring sequences with the same parameters (usually one for the whole batch), and one
/// readback of the ids rather than of the logits.
fn draw(last: &Tensor, running: &mut [Running]) -> Result<Vec<u32>, Error> {
    let mut ids: Option<Tensor> = None;
    let mut start = 0;
    while start < running.len() {
        let params = running[start].sampler.params();
        let len = running[start..]
            .iter()
            .take_while(|r| r.sampler.params() == params)
            .count();
        let numbers: Vec<f32> = running[start..start + len]
            .iter_mut()
            .flat_map(|r| r.sampler.next_uniforms(1))
            .collect();
        let numbers = Tensor::from_vec(last.device(), numbers, [len])?;
        let rows = if len == running.len() {
            last.clone()
        } else {
            ops::narrow(last, 0, start, len)?
        };
        let drawn = ops::sample(&rows, &numbers, params)?;
        ids = Some(match ids {
            None => drawn,
            Some(before) => ops::concat(&before, &drawn, 0)?,
        });
        start += len;
    }
    ids.map_or(Ok(Vec::new()), |ids| ids.to_vec())
}

/// One forward pass over every running sequence, one token drawn for each; the sequences that
/// end (or whose clients left) leave `running`.
fn step(llama: &Llama, tokenizer: &Tokenizer, running: &mut Vec<Running>) -> Result<(), Error> {
    let rows: usize = running.iter().map(|r| r.pending.len()).sum();
    let mut batch: Vec<SequenceInput> = running
        .iter_mut()
        .map(|r| SequenceInput {
            tokens: &r.pending,
            cache: &mut r.cache,
        })
        .collect();
    log::debug!("step: {} sequences, {rows} rows", batch.len());
    let logits = llama.last_logits(&mut batch)?;
    drop(batch);
    // The prompts whose pass this step ran: those that have drawn nothing yet.
    for r in running.iter().filter(|r| r.generated == 0) {
        r.cache.share(&r.ids)?;
    }
    let ids = draw(&logits, running)?;
    let mut ids = ids.into_iter();
    running.retain_mut(|r| {
        let Some(id) = ids.next() else {
            let _ = r.events.send(Event::Failed("no token was drawn".into()));
            return false;
        };
        r.generated += 1;
        let finish = if is_stop(llama, tokenizer, id) {
            Some(Finish::Stop)
        } else if r.generated >= r.max_tokens || r.cache.len() >= r.cache.capacity() {
            Some(Finish::Length)
        } else {
            None
        };
        let text = if finish == Some(Finish::Stop) {
            String::new()
        } else {
            r.decoder.push(id)
        };
        let sent = match finish {
            None => r.events.send(Event::Token(text)),
            Some(finish) => {
                let tail = text + &r.decoder.finish();
                let tokens = r.generated;
                // The request is over whether or not its client still listens; its place
                // and its cache blocks are free before the client can hear so. Its blocks,
                // answer included, stay cached for the conversation's next turn (the last
                // token drawn was never run, and `share` takes only the ids the cache holds).
                drop(r.ticket.take());
                if let Err(e) = r.cache.share(&r.ids) {
                    log::warn!("the finished sequence's blocks could not be offered: {e}");
                }
                r.cache.reset();
                let _ = r.events.send(Event::Done {
                    tail,
                    finish,
                    tokens,
                });
                return false;
            }
        };
        r.pending = vec![id];
        r.ids.push(id);
        sent.is_ok()
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With one place and a line of two: the two waiting are admitted in the order they came,
    /// and a third finds the line full.
    #[test]
    fn the_line_is_served_in_order() {
        let admission = Admission::new(1, 2);
        let first = admission.admit(&|| false).unwrap().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for name in ["second", "third"] {
            let (line, order) = (admission.clone(), order.clone());
            let before = admission.lock().next;
            waiting.push(std::thread::spawn(move || {
                let ticket = line.admit(&|| false).unwrap().unwrap();
                order.lock().unwrap().push(name);
                drop(ticket);
            }));
            // Wait until it has taken its number.
            while admission.lock().next == before {
                std::thread::yield_now();
            }
        }
        let busy = admission.admit(&|| false).err().unwrap();
        assert_eq!((busy.max_sequences, busy.queue), (1, 2));
        assert!(order.lock().unwrap().is_empty());
        drop(first);
        for w in waiting {
            w.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["second", "third"]);
        assert_eq!(admission.lock().in_flight, 0);
    }

    /// A request whose client hangs up while it waits leaves the line: it is never admitted,
    /// and the one behind it takes the place that frees up.
    #[test]
    fn a_request_whose_client_leaves_is_not_admitted() {
        use std::sync::atomic::AtomicBool;
        let admission = Admission::new(1, 2);
        let first = admission.admit(&|| false).unwrap().unwrap();
        let hung_up = Arc::new(AtomicBool::new(false));
        let waiter = |gone: Arc<AtomicBool>| {
            let line = admission.clone();
            let before = admission.lock().next;
            let thread = std::thread::spawn(move || {
                line.admit(&|| gone.load(Ordering::Relaxed))
                    .unwrap()
                    .is_some()
            });
            while admission.lock().next == before {
                std::thread::yield_now();
            }
            thread
        };
        let leaving = waiter(hung_up.clone());
        let staying = waiter(Arc::new(AtomicBool::new(false)));
        assert_eq!(admission.lock().waiting(), 2);
        hung_up.store(true, Ordering::Relaxed);
        assert!(!leaving.join().unwrap(), "admitted after its client left");
        assert_eq!(admission.lock().waiting(), 1);
        drop(first);
        assert!(staying.join().unwrap());
        let line = admission.lock();
        assert_eq!((line.in_flight, line.waiting()), (0, 0));
        assert!(line.left.is_empty());
    }
}
