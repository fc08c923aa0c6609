//! Scans on the cpu as associative prefix combinations in f64.
//!
//! Each scan is a monoid over a pair state (see [`Scan`]). Many channels run in parallel, one
//! sequential pass each, a task scanning a block of neighbouring channels side by side so it
//! reads whole rows of the `[outer, len, inner]` view (not one strided element per cache
//! line); few long channels are split into chunks scanned in three phases
//! (chunk totals in parallel, a short sequential pass over the totals, then each chunk again
//! from its carry), so a single channel of a million steps still uses every thread.

use super::threads::{map_tasks, threads};
use crate::backend::ScanOp;

/// A scan state: an affine map `x ↦ .0·x + .1` for the linear scans and the log-space
/// cumulative product, `(max, sum)` with value `max + ln(sum)` for log-sum-exp.
#[derive(Clone, Copy, Debug)]
struct State(f64, f64);

/// Below this many steps per channel, chunking a channel does not pay.
const MIN_CHUNKED_LEN: usize = 1 << 14;

/// The most channels one task scans side by side (their states stay in L1).
const MAX_BLOCK: usize = 64;

/// One scan over an `[outer, len, inner]` view: how to read step `t` of channel `c`, how to
/// combine states, and what to output.
struct Scan<'a> {
    op: ScanOp,
    outer: usize,
    len: usize,
    inner: usize,
    x: &'a [f32],
    y: &'a [f32],
    h0: &'a [f32],
}

impl Scan<'_> {
    /// Flat index of step `t` (in scan order: reversed for the adjoint) of channel `c`.
    fn index(&self, c: usize, t: usize) -> usize {
        (c / self.inner * self.len + self.step(t)) * self.inner + c % self.inner
    }

    /// Position along the axis of scan-order step `t`.
    fn step(&self, t: usize) -> usize {
        if self.op == ScanOp::LinearAdjoint {
            self.len - 1 - t
        } else {
            t
        }
    }

    fn initial(&self, c: usize) -> State {
        match self.op {
            ScanOp::Linear => State(0.0, self.h0[c] as f64),
            ScanOp::LinearAdjoint => State(0.0, 0.0),
            ScanOp::LogCumprod => State(1.0, 0.0),
            ScanOp::LogCumSumExp => State(f64::NEG_INFINITY, 0.0),
        }
    }

    fn element(&self, c: usize, t: usize) -> State {
        self.element_at(self.index(c, t), t)
    }

    /// Scan-order step `t` stored at flat index `at`.
    fn element_at(&self, at: usize, t: usize) -> State {
        match self.op {
            ScanOp::Linear => State(self.x[at] as f64, self.y[at] as f64),
            ScanOp::LinearAdjoint => {
                // Step t of the reverse scan multiplies by a at the next position forward.
                let a_next = if t == 0 {
                    0.0
                } else {
                    self.x[at + self.inner] as f64
                };
                State(a_next, self.y[at] as f64)
            }
            ScanOp::LogCumprod => State(1.0, (self.x[at] as f64).ln()),
            ScanOp::LogCumSumExp => State(self.x[at] as f64, 1.0),
        }
    }

    /// `first` then `second`.
    fn combine(&self, first: State, second: State) -> State {
        match self.op {
            ScanOp::LogCumSumExp => {
                if first.0.is_nan() || second.0.is_nan() {
                    return State(f64::NAN, f64::NAN);
                }
                // Scale only the smaller term: equal maxima (both ±∞ included) add their sums,
                // where `∞ − ∞` would give NaN.
                if first.0 == second.0 {
                    State(first.0, first.1 + second.1)
                } else if first.0 > second.0 {
                    State(first.0, first.1 + second.1 * (second.0 - first.0).exp())
                } else {
                    State(second.0, first.1 * (first.0 - second.0).exp() + second.1)
                }
            }
            _ => State(first.0 * second.0, second.0 * first.1 + second.1),
        }
    }

    fn output(&self, s: State) -> f32 {
        (match self.op {
            ScanOp::LogCumprod => s.1.exp(),
            ScanOp::LogCumSumExp => s.0 + s.1.ln(),
            _ => s.1,
        }) as f32
    }

    /// Scans steps `from..to` of channel `c` starting from `carry`; returns the outputs.
    fn run(&self, c: usize, from: usize, to: usize, mut carry: State) -> Vec<f32> {
        (from..to)
            .map(|t| {
                carry = self.combine(carry, self.element(c, t));
                self.output(carry)
            })
            .collect()
    }

    fn total(&self, c: usize, from: usize, to: usize) -> Option<State> {
        (from..to)
            .map(|t| self.element(c, t))
            .reduce(|a, b| self.combine(a, b))
    }

    /// Outputs of channel `c` in scan order, chunked across threads.
    fn chunked(&self, c: usize) -> Vec<f32> {
        let chunks = threads() * 4;
        let size = self.len.div_ceil(chunks);
        let bounds = |k: usize| (k * size, ((k + 1) * size).min(self.len));
        let totals = map_tasks(chunks, self.len, |k| {
            let (from, to) = bounds(k);
            self.total(c, from, to)
        });
        let mut carries = Vec::with_capacity(chunks);
        let mut carry = self.initial(c);
        for total in totals {
            carries.push(carry);
            if let Some(t) = total {
                carry = self.combine(carry, t);
            }
        }
        map_tasks(chunks, self.len, |k| {
            let (from, to) = bounds(k);
            self.run(c, from, to.max(from), carries[k])
        })
        .concat()
    }

    /// Outputs of channels `o·inner + i0 ..+ width` (neighbours in memory), scanned side by
    /// side: `[len, width]` in scan order.
    fn block(&self, o: usize, i0: usize, width: usize) -> Vec<f32> {
        let mut states: Vec<State> = (0..width)
            .map(|j| self.initial(o * self.inner + i0 + j))
            .collect();
        let mut out = Vec::with_capacity(self.len * width);
        for t in 0..self.len {
            let row = (o * self.len + self.step(t)) * self.inner + i0;
            for (j, state) in states.iter_mut().enumerate() {
                *state = self.combine(*state, self.element_at(row + j, t));
                out.push(self.output(*state));
            }
        }
        out
    }

    fn all(&self) -> Vec<f32> {
        let channels = self.outer * self.inner;
        let mut out = vec![0f32; channels * self.len];
        if channels < threads() && self.len >= MIN_CHUNKED_LEN {
            for c in 0..channels {
                for (t, v) in self.chunked(c).into_iter().enumerate() {
                    out[self.index(c, t)] = v;
                }
            }
            return out;
        }
        // Blocks of neighbouring channels, narrow enough that every thread gets several.
        let per_outer = (threads() * 4).div_ceil(self.outer.max(1));
        let width = self.inner.div_ceil(per_outer).clamp(1, MAX_BLOCK);
        let blocks = self.inner.div_ceil(width);
        let parts = map_tasks(self.outer * blocks, channels * self.len, |k| {
            let (o, i0) = (k / blocks, k % blocks * width);
            self.block(o, i0, width.min(self.inner - i0))
        });
        for (k, part) in parts.iter().enumerate() {
            let (o, i0) = (k / blocks, k % blocks * width);
            let w = width.min(self.inner - i0);
            for (t, values) in part.chunks_exact(w).enumerate() {
                let row = (o * self.len + self.step(t)) * self.inner + i0;
                out[row..row + w].copy_from_slice(values);
            }
        }
        out
    }
}

/// `OpSpec::Scan`: `x` is `a` (or the values), `y` is `b` or the incoming gradient, `h0` the
/// initial state of the linear scan.
pub fn scan(
    op: ScanOp,
    (outer, len, inner): (usize, usize, usize),
    x: &[f32],
    y: &[f32],
    h0: &[f32],
) -> Vec<f32> {
    Scan {
        op,
        outer,
        len,
        inner,
        x,
        y,
        h0,
    }
    .all()
}
