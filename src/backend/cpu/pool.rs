//! A small persistent thread pool for the many small kernels of a decode step.
//!
//! Rayon's workers fall asleep within microseconds of running out of work, and waking them
//! again costs tens of microseconds, more than one of SmolLM-135M's products takes on one
//! thread. Here `threads − 1` workers spin for [`SPIN`] after each job before they park, so a
//! decode step's next product (a few microseconds later) finds them awake: handing it out
//! costs a few atomic operations. The caller runs tasks too and returns only when every task
//! is done, so a job may borrow from the caller's stack. Each thread takes its own contiguous
//! lane of a job's tasks first ([`Job`]): with one shared counter, two threads taking turns
//! each read a decode product's weight in pieces, and TinyLlama's 2-thread decode ran 5–10%
//! slower.
//!
//! One job at a time: a caller that finds the pool busy (another thread's job, or a kernel
//! called from inside a task) is told so and runs its work another way.
//!
//! The same pool runs in the threaded wasm build, whose workers are Web Workers: there its
//! workers are long-lived jobs on rayon's pool (wasm-bindgen-rayon's workers; std cannot spawn
//! threads in wasm), and idle polling is counted in polls, as std has no clock there. The
//! caller never sleeps (it spins, and takes the lock only with `try_lock`), so it may be a
//! page's own thread, where `Atomics.wait` is not allowed.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Condvar, Mutex, OnceLock};

/// How long an idle worker keeps polling for the next job before it parks: longer than the
/// gaps between a decode step's products, short enough not to hold a core between requests.
#[cfg(not(target_arch = "wasm32"))]
const SPIN: std::time::Duration = std::time::Duration::from_micros(500);

/// `SPIN` in wasm, as a poll count: a poll (one atomic load) takes a few nanoseconds, so
/// this is about a millisecond or less.
#[cfg(target_arch = "wasm32")]
const SPIN_POLLS: u32 = 1 << 18;

/// Polls of a waiting loop before it starts yielding its core at each poll: on a machine with
/// more runnable threads than cores, the thread it waits for may need that core.
const PURE_SPINS: u32 = 2000;

/// Lanes a job's tasks are split into, at most: one per thread up to this many (threads past
/// it share lanes).
const MAX_LANES: usize = 16;

/// The next unclaimed task of one lane, alone on its cache line: the threads claiming from
/// different lanes do not contend for one line.
#[repr(align(64))]
struct Lane(AtomicUsize);

/// One job, on the caller's stack while it runs: the task function, its count, the next task
/// of each lane to claim and whether one panicked on a worker.
///
/// The tasks are split into `lanes` contiguous ranges, one per thread: each thread claims its
/// own range's tasks in order, then helps with the others'. A decode product's tasks are
/// neighbouring slices of one weight matrix, so each thread streams one run of memory that the
/// hardware prefetcher follows, instead of a slice here and there as the threads take turns
/// on one counter.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    tasks: usize,
    lanes: usize,
    next: [Lane; MAX_LANES],
    panicked: AtomicBool,
}

impl Job<'_> {
    fn new(f: &(dyn Fn(usize) + Sync), tasks: usize, threads: usize) -> Job<'_> {
        let lanes = threads.clamp(1, MAX_LANES).min(tasks.max(1));
        Job {
            f,
            tasks,
            lanes,
            next: std::array::from_fn(|l| Lane(AtomicUsize::new(Self::start(tasks, lanes, l)))),
            panicked: AtomicBool::new(false),
        }
    }

    /// The first task of lane `l` of `lanes` (lane `lanes` starts at `tasks`).
    fn start(tasks: usize, lanes: usize, l: usize) -> usize {
        tasks * l.min(lanes) / lanes
    }

    /// Claims and runs task indices until none is left: those of lane `own` first (thread
    /// `own`'s), then those left in the following lanes.
    fn claim_tasks(&self, own: usize) {
        for step in 0..self.lanes {
            let l = (own + step) % self.lanes;
            let end = Self::start(self.tasks, self.lanes, l + 1);
            loop {
                let t = self.next[l].0.fetch_add(1, Relaxed);
                if t >= end {
                    break;
                }
                (self.f)(t);
            }
        }
    }
}

struct Shared {
    /// The job being run, null between jobs. A worker counts itself in `active` before it
    /// loads this, and the caller nulls it before it waits for `active` to drop to 0 (SeqCst
    /// on both sides), so a worker that sees a job may use it until it leaves `active`.
    job: AtomicPtr<Job<'static>>,
    /// Bumped after each new job is published: the workers' wake-up signal.
    generation: AtomicU64,
    /// Workers inside a job.
    active: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The pool: its workers and the flag that admits one job at a time.
pub struct Pool {
    shared: &'static Shared,
    /// Worker threads (the caller is one more).
    workers: usize,
    busy: AtomicBool,
}

impl Pool {
    /// The process's pool, started on first use with one worker fewer than rayon's threads
    /// (the caller is the last thread; in wasm one of rayon's workers stays free for rayon's
    /// own jobs); `None` with one thread.
    pub fn global() -> Option<&'static Pool> {
        static POOL: OnceLock<Option<Pool>> = OnceLock::new();
        POOL.get_or_init(|| Pool::start(rayon::current_num_threads().saturating_sub(1)))
            .as_ref()
    }

    fn start(workers: usize) -> Option<Pool> {
        if workers == 0 {
            return None;
        }
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            job: AtomicPtr::new(std::ptr::null_mut()),
            generation: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        for i in 0..workers {
            spawn_worker(i, shared)?;
        }
        Some(Pool {
            shared,
            workers,
            busy: AtomicBool::new(false),
        })
    }

    /// Runs `f(t)` for every `t < tasks` on the workers and the calling thread, and returns
    /// `true` when all have run; `false` (nothing run) when the pool is busy with another job.
    /// A panic in a task is raised again here once every task has finished. Workers that come
    /// late find the tasks taken and are not waited for.
    pub fn try_run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
        if self
            .busy
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_err()
        {
            return false;
        }
        let s = self.shared;
        let job = Job::new(f, tasks, self.workers + 1);
        // The lifetime is erased: the pointer is withdrawn, and every worker that loaded it
        // has left (`active` is 0), before `job` goes out of scope below.
        s.job
            .store(&job as *const Job<'_> as *mut Job<'static>, SeqCst);
        s.generation.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            // `try_lock` in a spin, not `lock`: a contended `lock` sleeps, which a page's
            // own thread may not do in wasm. A worker holds the lock only while it parks.
            let mut polls = 0u32;
            let _guard = loop {
                match s.lock.try_lock() {
                    Ok(guard) => break guard,
                    Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
                    Err(std::sync::TryLockError::WouldBlock) => pause(&mut polls),
                }
            };
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| job.claim_tasks(0)));
        s.job.store(std::ptr::null_mut(), SeqCst);
        let mut polls = 0u32;
        while s.active.load(SeqCst) > 0 {
            pause(&mut polls);
        }
        self.busy.store(false, Release);
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        if job.panicked.load(Relaxed) {
            panic!("a task of the cpu backend's thread pool panicked");
        }
        true
    }
}

/// One poll of a waiting loop: a spin hint, or after [`PURE_SPINS`] polls a yield.
fn pause(polls: &mut u32) {
    *polls = polls.saturating_add(1);
    if *polls < PURE_SPINS {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Starts worker `i`: an OS thread natively.
#[cfg(not(target_arch = "wasm32"))]
fn spawn_worker(i: usize, shared: &'static Shared) -> Option<()> {
    std::thread::Builder::new()
        .name(format!("webtensor-cpu-{i}"))
        .spawn(move || worker(i + 1, shared))
        .ok()
        .map(drop)
}

/// Starts worker `i`: in wasm a job that never ends on one of rayon's Web Workers.
#[cfg(target_arch = "wasm32")]
fn spawn_worker(i: usize, shared: &'static Shared) -> Option<()> {
    rayon::spawn(move || worker(i + 1, shared));
    Some(())
}

/// A worker's loop: waits for a job, claims tasks starting with its `lane` (the caller's is
/// 0), and waits again.
fn worker(lane: usize, s: &'static Shared) {
    let mut seen = 0u64;
    loop {
        seen = wait_for_job(s, seen);
        s.active.fetch_add(1, SeqCst);
        let job = s.job.load(SeqCst);
        if !job.is_null() {
            // SAFETY: the caller keeps the job alive until `active` is back to 0 after it
            // withdrew the pointer, and this worker counted itself in `active` before it
            // loaded the pointer.
            let job = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| job.claim_tasks(lane))).is_err() {
                job.panicked.store(true, Relaxed);
            }
        }
        s.active.fetch_sub(1, SeqCst);
    }
}

/// Polls for [`SPIN`], then parks, until the generation differs from `seen`; returns it.
fn wait_for_job(s: &Shared, seen: u64) -> u64 {
    let spin = SpinClock::start();
    let mut polls = 0u32;
    loop {
        let g = s.generation.load(SeqCst);
        if g != seen {
            return g;
        }
        pause(&mut polls);
        if polls.is_multiple_of(64) && spin.spent(polls) {
            break;
        }
    }
    let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
    // Counted as a sleeper before the last look at the generation: a caller that bumps it
    // afterwards sees the count and notifies under the lock (SeqCst on both sides).
    s.sleepers.fetch_add(1, SeqCst);
    loop {
        let g = s.generation.load(SeqCst);
        if g != seen {
            s.sleepers.fetch_sub(1, SeqCst);
            return g;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}

/// Whether an idle worker has polled for its [`SPIN`]: natively by the clock.
#[cfg(not(target_arch = "wasm32"))]
struct SpinClock(std::time::Instant);

#[cfg(not(target_arch = "wasm32"))]
impl SpinClock {
    fn start() -> Self {
        SpinClock(std::time::Instant::now())
    }

    fn spent(&self, _polls: u32) -> bool {
        self.0.elapsed() > SPIN
    }
}

/// Whether an idle worker has polled for its spin: in wasm, where std has no clock, by the
/// poll count ([`SPIN_POLLS`]).
#[cfg(target_arch = "wasm32")]
struct SpinClock;

#[cfg(target_arch = "wasm32")]
impl SpinClock {
    fn start() -> Self {
        SpinClock
    }

    fn spent(&self, polls: u32) -> bool {
        polls >= SPIN_POLLS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every task runs exactly once, across many jobs (some after the workers parked), and a
    /// nested call finds the pool busy instead of deadlocking.
    #[test]
    fn every_task_runs_once_per_job() {
        let pool = Pool::start(1).expect("one worker");
        for round in 0..200 {
            let tasks = round % 37;
            let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            let nested = AtomicBool::new(false);
            assert!(pool.try_run(tasks, &|t| {
                counts[t].fetch_add(1, Relaxed);
                if t == 0 && !pool.try_run(1, &|_| {}) {
                    nested.store(true, Relaxed);
                }
            }));
            assert!(counts.iter().all(|c| c.load(Relaxed) == 1), "round {round}");
            assert_eq!(nested.load(Relaxed), tasks > 0);
            if round % 50 == 0 {
                std::thread::sleep(SPIN * 4);
            }
        }
    }

    /// A thread claims its own lane's contiguous range first, in order, then what is left of
    /// the following lanes, wrapping around: one thread alone runs every task once.
    #[test]
    fn a_thread_takes_its_own_range_first_then_the_rest_in_lane_order() {
        let order = Mutex::new(Vec::new());
        let f = |t: usize| order.lock().expect("not poisoned").push(t);
        // Ten tasks over three lanes: 0..3, 3..6, 6..10.
        Job::new(&f, 10, 3).claim_tasks(1);
        let order = order.into_inner().expect("not poisoned");
        assert_eq!(order, [3, 4, 5, 6, 7, 8, 9, 0, 1, 2]);
        // More lanes than tasks: one lane per task, none empty.
        let count = AtomicUsize::new(0);
        Job::new(&|_| _ = count.fetch_add(1, Relaxed), 2, 8).claim_tasks(1);
        assert_eq!(count.load(Relaxed), 2);
    }

    /// A panicking task is reported to the caller, and the pool runs the next job.
    #[test]
    fn a_panicking_task_reaches_the_caller() {
        let pool = Pool::start(1).expect("one worker");
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.try_run(8, &|t| assert!(t != 5, "task 5"))
        }));
        assert!(result.is_err());
        let ran = AtomicUsize::new(0);
        assert!(pool.try_run(8, &|_| {
            ran.fetch_add(1, Relaxed);
        }));
        assert_eq!(ran.load(Relaxed), 8);
    }
}
