//! Splitting work across threads: rayon natively and in the threaded wasm build (`+atomics`),
//! one thread in the one-thread wasm build. Kernels call these helpers so they never carry
//! `cfg`s of their own.

/// Below this much work (in plain element copies) a kernel runs on the calling thread: waking
/// the pool's sleeping workers costs tens of microseconds, more than a decode step's small
/// products take (SmolLM-135M's 576×576 q4_0 matrices decoded slower on two threads than on
/// one at 16K).
const MIN_PARALLEL_ELEMENTS: usize = 256 * 1024;

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
    if total < MIN_PARALLEL_ELEMENTS || rows < 2 || threads() < 2 {
        out.chunks_mut(row_len)
            .enumerate()
            .for_each(|(i, row)| f(i, row));
        return;
    }
    // Enough rows per task to amortise scheduling, enough tasks to balance the threads.
    let rows_per_task =
        (TASK_ELEMENTS / (row_len * weight.max(1))).clamp(1, rows.div_ceil(threads() * 4).max(1));
    par_chunks(out, rows_per_task * row_len, |task, chunk| {
        for (j, row) in chunk.chunks_mut(row_len).enumerate() {
            f(task * rows_per_task + j, row);
        }
    });
}

/// Runs `f(task_index)` for `0..tasks` and collects the results in order. `work` is the
/// whole job's cost in plain element copies: below [`MIN_PARALLEL_ELEMENTS`] it runs on the
/// calling thread, where a fan-out to the pool would cost more than it saves.
pub fn map_tasks<R: Send>(
    tasks: usize,
    work: usize,
    f: impl Fn(usize) -> R + Sync + Send,
) -> Vec<R> {
    if work < MIN_PARALLEL_ELEMENTS || tasks < 2 || threads() < 2 {
        return (0..tasks).map(f).collect();
    }
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    {
        use rayon::prelude::*;
        (0..tasks).into_par_iter().map(f).collect()
    }
    #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
    {
        (0..tasks).map(f).collect()
    }
}

fn par_chunks<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
    #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
    {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
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
