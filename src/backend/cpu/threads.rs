//! Splitting work across threads: the spinning pool of `pool.rs` natively and in the threaded
//! wasm build (`+atomics`), rayon when that pool is busy, one thread in the one-thread wasm
//! build. Kernels call these helpers so they never carry `cfg`s of their own.

/// Below this much work (in plain element copies) a kernel runs on the calling thread when it
/// would go to rayon: waking rayon's sleeping workers costs tens of microseconds, more than a
/// decode step's small products take (SmolLM-135M's 576×576 q4_0 matrices decoded slower on
/// two threads than on one at 16K).
const MIN_PARALLEL_ELEMENTS: usize = 256 * 1024;

/// The same for the spinning pool, whose awake workers take a job in well under a
/// microsecond: a SmolLM-135M 576×576 product (about 41K) is split, a 576-wide norm is not.
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
const MIN_POOL_ELEMENTS: usize = 16 * 1024;

/// Work per task when a kernel does fan out: small enough to balance the threads.
const TASK_ELEMENTS: usize = 16 * 1024;

/// Calls `f(row_index, row)` for every `row_len`-long row of `out`, in parallel when the work
/// is large enough. `weight` is the cost of one output element relative to a plain copy.
pub fn for_each_row<T: Send>(
    out: &mut [T],
    row_len: usize,
    weight: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if row_len == 0 {
        return;
    }
    let rows = out.len() / row_len;
    let total = out.len().saturating_mul(weight.max(1));
    // Enough rows per task to amortise scheduling, enough tasks to balance the threads.
    let rows_per_task =
        (TASK_ELEMENTS / (row_len * weight.max(1))).clamp(1, rows.div_ceil(threads() * 4).max(1));
    let chunk = rows_per_task * row_len;
    let len = out.len();
    let base = SendPtr(out.as_mut_ptr());
    run_split(len.div_ceil(chunk), total, |t| {
        let start = t * chunk;
        // SAFETY: tasks cover disjoint ranges `start..start + chunk` of `out`, which is
        // borrowed mutably for the whole call (`run_split` returns when all have run).
        let part = unsafe {
            std::slice::from_raw_parts_mut(base.get().add(start), chunk.min(len - start))
        };
        for (j, row) in part.chunks_mut(row_len).enumerate() {
            f(t * rows_per_task + j, row);
        }
    });
}

/// Runs `f(task_index)` for `0..tasks` and collects the results in order. `work` is the
/// whole job's cost in plain element copies (see [`run_split`]).
pub fn map_tasks<R: Send>(
    tasks: usize,
    work: usize,
    f: impl Fn(usize) -> R + Sync + Send,
) -> Vec<R> {
    let mut results: Vec<Option<R>> = (0..tasks).map(|_| None).collect();
    let base = SendPtr(results.as_mut_ptr());
    run_split(tasks, work, |t| {
        let r = f(t);
        // SAFETY: task `t` alone writes slot `t` of `results`, which outlives the job.
        unsafe { *base.get().add(t) = Some(r) };
    });
    results.into_iter().flatten().collect()
}

/// The one place that decides where `f(0..tasks)` runs, every task exactly once: on the
/// calling thread when `work` (the job's cost in plain element copies) is below
/// [`min_parallel`] or there is one thread; else on the spinning pool; when the pool is busy
/// (a second caller, a nested call), on rayon from [`MIN_PARALLEL_ELEMENTS`] and on the
/// calling thread below it.
fn run_split(tasks: usize, work: usize, f: impl Fn(usize) + Sync + Send) {
    if work < min_parallel() || tasks < 2 || threads() < 2 {
        return (0..tasks).for_each(f);
    }
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    {
        if let Some(pool) = super::pool::Pool::global() {
            if pool.try_run(tasks, &f) {
                return;
            }
        }
        if work >= MIN_PARALLEL_ELEMENTS {
            use rayon::prelude::*;
            return (0..tasks).into_par_iter().for_each(f);
        }
    }
    (0..tasks).for_each(f)
}

/// A pointer handed to tasks, each of which uses its own part of the data.
pub(super) struct SendPtr<T>(pub(super) *mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}

// SAFETY: only used to give each task a disjoint part of one mutably borrowed slice.
unsafe impl<T: Send> Sync for SendPtr<T> {}
unsafe impl<T: Send> Send for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw field).
    pub(super) fn get(self) -> *mut T {
        self.0
    }
}

/// The least work worth splitting: the pool's threshold where it runs, rayon's elsewhere.
fn min_parallel() -> usize {
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    if super::pool::Pool::global().is_some() {
        return MIN_POOL_ELEMENTS;
    }
    MIN_PARALLEL_ELEMENTS
}

/// Worker threads available.
pub fn threads() -> usize {
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    {
        rayon::current_num_threads()
    }
    #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
    {
        1
    }
}
