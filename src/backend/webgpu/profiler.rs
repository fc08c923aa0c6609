//! The per-kernel GPU timestamp profiler (the option `wgpu.profile`, [`crate::backend::WgpuOptions`]).
//!
//! Each dispatch is its own compute pass (see `recorder`), so timing a kernel is asking its
//! pass for timestamp writes at its beginning and end. The queries go into slabs of
//! [`PASSES_PER_SLAB`] passes: a `Timestamp` query set with its `QUERY_RESOLVE` and
//! `MAP_READ` buffers. A batch uses as many slabs as it has dispatches; at submit each slab
//! used is resolved and copied into its readback buffer inside the batch, and after the
//! submit the readback buffers are mapped with a blocking wait (native only: the browser
//! cannot block, so the profiler is unavailable there) and the times are added up per
//! kernel. The submit's span, from its first pass's start to its last pass's end, is kept
//! too: the difference to the kernels' sum is the GPU's idle time between passes.
//!
//! It knows kernels only as keys (the recorder's kernel ids), so it depends on no other part
//! of the backend.
//!
//! The profiler exists only when asked for: the recorder holds `Option<Profiler>`, and with
//! `None` no query set is created and no pass has timestamp writes.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use crate::backend::{KernelProfile, KernelTime};

/// Passes per query set: two timestamps each, as many as one query set may hold.
const PASSES_PER_SLAB: u32 = wgpu::QUERY_SET_MAX_QUERIES / 2;

/// Bytes of one resolved timestamp.
const TIMESTAMP_BYTES: u64 = 8;

/// A query set and the buffers its timestamps are resolved and read back through.
#[derive(Debug)]
struct Slab {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
}

impl Slab {
    fn new(device: &wgpu::Device) -> Slab {
        let bytes = u64::from(PASSES_PER_SLAB) * 2 * TIMESTAMP_BYTES;
        let buffer = |label, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Slab {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("webtensor profiler timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: PASSES_PER_SLAB * 2,
            }),
            resolve: buffer(
                "webtensor profiler resolve",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            readback: buffer(
                "webtensor profiler readback",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
        }
    }
}

/// Per-kernel totals: dispatches and GPU nanoseconds.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    dispatches: u64,
    ns: f64,
}

/// The profiler's state, per kernel key `K`; lives in the recorder.
#[derive(Debug)]
pub(crate) struct Profiler<K> {
    device: wgpu::Device,
    /// Nanoseconds per timestamp tick.
    period_ns: f64,
    /// Slabs not in use.
    free: Vec<Slab>,
    /// Slabs the open batch writes, in order, each with the kernel of each pass it timed; the
    /// last one is being filled.
    open: Vec<(Slab, Vec<K>)>,
    totals: HashMap<K, Totals>,
    submits: u64,
    span_ns: f64,
}

impl<K: Copy + Eq + Hash> Profiler<K> {
    /// A profiler for a device with the `TIMESTAMP_QUERY` feature.
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Profiler<K> {
        Profiler {
            device: device.clone(),
            period_ns: f64::from(queue.get_timestamp_period()),
            free: Vec::new(),
            open: Vec::new(),
            totals: HashMap::new(),
            submits: 0,
            span_ns: 0.0,
        }
    }

    /// The query set and the pass's index in it (its timestamps are `2 × index` and
    /// `2 × index + 1`) for the next pass of the open batch, which runs `kernel`.
    pub(crate) fn next_pass(&mut self, kernel: K) -> (wgpu::QuerySet, u32) {
        let full = self
            .open
            .last()
            .is_none_or(|(_, kernels)| kernels.len() as u32 == PASSES_PER_SLAB);
        if full {
            let slab = self.free.pop().unwrap_or_else(|| Slab::new(&self.device));
            self.open.push((slab, Vec::new()));
        }
        let (slab, kernels) = self.open.last_mut().expect("a slab was just opened");
        kernels.push(kernel);
        (slab.queries.clone(), kernels.len() as u32 - 1)
    }

    /// Records, at the end of the batch, the resolve of every slab it wrote and the copy into
    /// the slab's readback buffer.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        for (slab, kernels) in &self.open {
            let queries = kernels.len() as u32 * 2;
            encoder.resolve_query_set(&slab.queries, 0..queries, &slab.resolve, 0);
            let bytes = u64::from(queries) * TIMESTAMP_BYTES;
            encoder.copy_buffer_to_buffer(&slab.resolve, 0, &slab.readback, 0, bytes);
        }
    }

    /// After the batch's submit: waits for it, reads its timestamps back and adds them to the
    /// totals. A batch whose timestamps cannot be read (a lost device) is left out.
    pub(crate) fn collect(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let open = std::mem::take(&mut self.open);
        let mapped: Vec<Arc<Mutex<Option<bool>>>> = open
            .iter()
            .map(|(slab, kernels)| {
                let done = Arc::new(Mutex::new(None));
                let flag = done.clone();
                let bytes = kernels.len() as u64 * 2 * TIMESTAMP_BYTES;
                slab.readback
                    .slice(..bytes)
                    .map_async(wgpu::MapMode::Read, move |r| {
                        if let Ok(mut d) = flag.lock() {
                            *d = Some(r.is_ok());
                        }
                    });
                done
            })
            .collect();
        let waited = self
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .is_ok();
        let mut first = u64::MAX;
        let mut last = 0u64;
        let mut batch: Vec<(K, u64)> = Vec::new();
        let mut complete = waited;
        for ((slab, kernels), done) in open.iter().zip(&mapped) {
            let ok = waited && done.lock().is_ok_and(|d| *d == Some(true));
            if !ok {
                complete = false;
                continue;
            }
            let bytes = kernels.len() as u64 * 2 * TIMESTAMP_BYTES;
            if let Ok(view) = slab.readback.slice(..bytes).get_mapped_range() {
                let ticks: Vec<u64> = view
                    .chunks_exact(TIMESTAMP_BYTES as usize)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect();
                for (kernel, pair) in kernels.iter().zip(ticks.chunks_exact(2)) {
                    first = first.min(pair[0]);
                    last = last.max(pair[1]);
                    batch.push((*kernel, pair[1].saturating_sub(pair[0])));
                }
            } else {
                complete = false;
            }
            slab.readback.unmap();
        }
        if complete {
            for (kernel, ticks) in batch {
                let t = self.totals.entry(kernel).or_default();
                t.dispatches += 1;
                t.ns += ticks as f64 * self.period_ns;
            }
            self.submits += 1;
            self.span_ns += last.saturating_sub(first) as f64 * self.period_ns;
        }
        self.free.extend(open.into_iter().map(|(slab, _)| slab));
    }

    /// The totals so far, each kernel named by `label`, sorted by name.
    pub(crate) fn profile(&self, label: impl Fn(K) -> String) -> KernelProfile {
        let mut kernels: Vec<KernelTime> = self
            .totals
            .iter()
            .map(|(id, t)| KernelTime {
                label: label(*id),
                dispatches: t.dispatches,
                gpu_ns: t.ns,
            })
            .collect();
        kernels.sort_by(|a, b| a.label.cmp(&b.label));
        KernelProfile {
            kernels,
            submits: self.submits,
            span_ns: self.span_ns,
        }
    }
}
