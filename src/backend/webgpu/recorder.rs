//! The open command encoder and the per-batch parameter arena.
//!
//! Ops do not run when they are called: each is recorded as a dispatch into one open compute
//! pass of a single open `CommandEncoder`, and the batch is submitted only when the host needs
//! a result (`download`), when asked (`synchronize`), or when the parameter arena or the
//! staging arena (`staging.rs`, small host writes in their place in the recording) is full.
//! So a batch of decode steps, each with its inputs written before it, is one submit. The
//! pass stays open from dispatch to dispatch (wgpu puts the barriers between dispatches that
//! one's writes and the next one's reads need) and ends only for a buffer copy or the submit:
//! a pass per dispatch cost the host a pass's begin, end and state tracking each time. With
//! the profiler on, each dispatch has its own pass, which carries its timestamp writes.
//!
//! # Why parameters live in an arena
//!
//! Each op needs a few parameters (sizes, eps, flags) in a uniform buffer. The obvious design,
//! one small uniform buffer reused by every op and filled with `queue.write_buffer`, is wrong:
//! `write_buffer` does not happen where it is called in the recording, it happens at the
//! *next submit, before that submit's command buffers*. Every op of the batch would then read
//! the parameters of the last op recorded. The same hazard applies to writing any buffer that
//! pending recorded commands still read.
//!
//! So each op appends its parameters to a CPU-side arena (one slot per dispatch, aligned to the
//! device's `min_uniform_buffer_offset_alignment`) and binds the arena buffer with a dynamic
//! offset to its slot. At submit time the whole arena is written with one `write_buffer` and
//! the batch is submitted right after it: the write lands before the batch's commands and after
//! every earlier submit, which has finished reading the previous batch's parameters.

use std::collections::HashMap;
use std::sync::Arc;

use super::bindings::{self, BindKey};
use super::capture::{CaptureLog, CopyCommand, StepItem, WgpuStep};
use super::context::{GpuContext, Profiling};
use super::pipelines::{Kernel, KernelId, PARAMS_BYTES};
use super::pool::BufferPool;
use super::profiler::Profiler;
use super::staging::{Staging, MAX_STAGED_WRITE};
use crate::backend::{KernelProfile, RecordedWork};

/// Bytes of the parameter arena: 4096 dispatches of 256 bytes per batch.
const ARENA_BYTES: u64 = 1 << 20;

/// Bind groups kept for reuse before the cache is emptied.
const MAX_CACHED_BIND_GROUPS: usize = 4096;

/// One dispatch of a kernel.
pub(crate) struct Dispatch<'a> {
    pub(crate) kernel: &'a Kernel,
    /// The parameter block (at most [`PARAMS_BYTES`]; padded with zeros).
    pub(crate) params: &'a [u8],
    pub(crate) output: &'a wgpu::Buffer,
    pub(crate) inputs: &'a [&'a wgpu::Buffer],
    /// Workgroups in x, y, z (each within the device's per-dimension limit).
    pub(crate) groups: [u32; 3],
    /// Byte ranges to bind instead of whole buffers (the row ranges of a tensor larger than
    /// one binding); a buffer not named here is bound whole.
    pub(crate) windows: &'a [Window],
    /// The texture of a kernel compiled to bind one (`Pipelines::kernel` with a texture).
    pub(crate) texture: Option<&'a wgpu::TextureView>,
    /// Where in `params` an attention kernel keeps its key count, which a replay of a
    /// captured step sets (`capture.rs`).
    pub(crate) keys_at: Option<u32>,
}

/// A byte range of a buffer bound in place of the whole buffer. `offset` is a multiple of the
/// device's `min_storage_buffer_offset_alignment`.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// The recording state of one backend; lives behind a mutex.
#[derive(Debug)]
pub(crate) struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    /// The compute pass open in `encoder`, which it locks until the pass ends.
    pass: Option<wgpu::ComputePass<'static>>,
    arena: Vec<u8>,
    arena_buffer: wgpu::Buffer,
    slot: u64,
    capacity: u64,
    pool: Arc<BufferPool>,
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    /// The pool's release count when the bind group cache was last checked.
    seen_releases: u64,
    /// Dispatches recorded and submits made since the backend started.
    work: RecordedWork,
    /// The timestamp profiler, when profiling is on (`None` costs nothing per dispatch).
    profiler: Option<Profiler<KernelId>>,
    /// The capture in progress, if any (`capture.rs`).
    capture: Option<CaptureLog>,
    /// Host writes staged for this batch (`staging.rs`).
    staging: Staging,
}

impl Recorder {
    pub(crate) fn new(ctx: &GpuContext, pool: Arc<BufferPool>) -> Self {
        let align = u64::from(ctx.limits.min_uniform_buffer_offset_alignment).max(1);
        let slot = PARAMS_BYTES.div_ceil(align) * align;
        let capacity = ARENA_BYTES
            .max(slot)
            .min(ctx.limits.max_buffer_size / slot * slot);
        let arena_buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("webtensor params arena"),
            size: capacity,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Recorder {
            encoder: None,
            pass: None,
            arena: Vec::new(),
            arena_buffer,
            slot,
            capacity,
            pool,
            bind_groups: HashMap::new(),
            seen_releases: 0,
            work: RecordedWork::default(),
            profiler: (ctx.profiling == Profiling::On)
                .then(|| Profiler::new(&ctx.device, &ctx.queue)),
            capture: None,
            staging: Staging::new(&ctx.device),
        }
    }

    /// The open encoder, with no pass open in it (an open one ends here).
    fn encoder(&mut self, ctx: &GpuContext) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(|| {
            ctx.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("webtensor batch"),
                })
        })
    }

    /// The compute pass open in the encoder, begun if there is none.
    fn pass(&mut self, ctx: &GpuContext) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder(ctx)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("a pass was just begun")
    }

    /// Records one dispatch into the open compute pass (with the profiler on, as its own
    /// pass). Submits the batch first when the arena has no slot left.
    pub(crate) fn dispatch(&mut self, ctx: &GpuContext, d: Dispatch<'_>) {
        if self.arena.len() as u64 + self.slot > self.capacity {
            self.submit(ctx);
        }
        let offset = self.arena.len();
        let used = d.params.len().min(PARAMS_BYTES as usize);
        self.arena.extend_from_slice(&d.params[..used]);
        self.arena.resize(offset + self.slot as usize, 0);

        self.work.dispatches += 1;
        let key = self.bind_key(&d);
        let bind_group = self.bind_group(ctx, &d, &key);
        if let Some(log) = CaptureLog::of_this_thread(&mut self.capture) {
            let kernel = (&d.kernel.pipeline, &d.kernel.layout);
            log.dispatch(kernel, key, &self.arena[offset..], d.groups, d.keys_at);
        }
        let mut timed_pass;
        let pass = match self.profiler.as_mut().map(|p| p.next_pass(d.kernel.id)) {
            None => self.pass(ctx),
            Some((queries, i)) => {
                timed_pass = self
                    .encoder(ctx)
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                            query_set: &queries,
                            beginning_of_pass_write_index: Some(2 * i),
                            end_of_pass_write_index: Some(2 * i + 1),
                        }),
                    })
                    .forget_lifetime();
                &mut timed_pass
            }
        };
        pass.set_pipeline(&d.kernel.pipeline);
        pass.set_bind_group(0, &bind_group, &[offset as u32]);
        pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
    }

    /// What `d` binds after its parameters.
    fn bind_key(&self, d: &Dispatch<'_>) -> BindKey {
        // A kernel's layout may have more input slots than the op has inputs (never fewer):
        // repeat the last input in the spare ones.
        let inputs = (0..d.kernel.inputs).map(|i| {
            d.inputs
                .get(i)
                .or(d.inputs.last())
                .copied()
                .unwrap_or(d.output)
        });
        let buffers = std::iter::once(d.output)
            .chain(inputs)
            .map(|b| match d.windows.iter().find(|w| &w.buffer == b) {
                Some(w) => (b.clone(), w.offset, w.size),
                None => (b.clone(), 0, 0),
            })
            .collect();
        BindKey {
            buffers,
            texture: d.texture.cloned(),
        }
    }

    /// The bind group for `d`'s buffers (`key`): cached, since inference binds the same
    /// weights and the same recycled activation buffers step after step. A cached bind group
    /// keeps its buffers alive, so the cache is bounded and is emptied whenever the pool has
    /// released buffers to the driver (their memory must really be freed).
    fn bind_group(&mut self, ctx: &GpuContext, d: &Dispatch<'_>, key: &BindKey) -> wgpu::BindGroup {
        let releases = self.pool.releases();
        if releases != self.seen_releases || self.bind_groups.len() >= MAX_CACHED_BIND_GROUPS {
            self.bind_groups.clear();
            self.seen_releases = releases;
        }
        if let Some(bind_group) = self.bind_groups.get(key) {
            return bind_group.clone();
        }
        let params = (&self.arena_buffer, PARAMS_BYTES);
        let bind_group = bindings::bind_group(&ctx.device, &d.kernel.layout, params, key);
        self.bind_groups.insert(key.clone(), bind_group.clone());
        bind_group
    }

    /// Dispatches recorded and submits made since the backend started.
    pub(crate) fn recorded_work(&self) -> RecordedWork {
        self.work
    }

    /// The profiler's totals, when profiling is on.
    pub(crate) fn kernel_profile(&self) -> Option<KernelProfile> {
        self.profiler.as_ref().map(|p| p.profile(KernelId::label))
    }

    /// Records a copy of `bytes` (a multiple of 4) from `src` at `src_offset` to `dst` at
    /// `dst_offset` (both multiples of 4).
    pub(crate) fn copy_region(
        &mut self,
        ctx: &GpuContext,
        (src, src_offset): (&wgpu::Buffer, u64),
        (dst, dst_offset): (&wgpu::Buffer, u64),
        bytes: u64,
    ) {
        if bytes > 0 {
            self.encoder(ctx)
                .copy_buffer_to_buffer(src, src_offset, dst, dst_offset, bytes);
            if let Some(log) = CaptureLog::of_this_thread(&mut self.capture) {
                log.copy(CopyCommand {
                    src: (src.clone(), src_offset),
                    dst: (dst.clone(), dst_offset),
                    bytes,
                });
            }
        }
    }

    /// Starts logging what is recorded for a replay; `false` with the profiler on (whose
    /// passes a replay would not time) or when a capture is already open.
    pub(crate) fn begin_capture(&mut self) -> bool {
        if self.profiler.is_some() || self.capture.is_some() {
            return false;
        }
        self.capture = Some(CaptureLog::new());
        true
    }

    /// The open capture, if any and the calling thread opened it (another thread's call
    /// spoils it: see `capture.rs`).
    pub(crate) fn capture(&mut self) -> Option<&mut CaptureLog> {
        CaptureLog::of_this_thread(&mut self.capture)
    }

    /// Ends the open capture: its log, or `None` when none was open.
    pub(crate) fn end_capture(&mut self) -> Option<CaptureLog> {
        self.capture.take()
    }

    /// What `finish` builds a captured step's bind groups with: the slot of one parameter
    /// block and the block's bytes.
    pub(crate) fn params_layout(&self) -> (u64, u64) {
        (self.slot, PARAMS_BYTES)
    }

    /// Whether something is recorded and not yet submitted (a staged write is recorded as its
    /// copy).
    pub(crate) fn has_pending(&self) -> bool {
        self.encoder.is_some() || !self.arena.is_empty()
    }

    /// Records a captured step again (see `capture.rs`) with its attention kernels' key count
    /// set to `keys`: the count is written into the step's own parameter blocks in its place
    /// in the recording (`staging.rs`), so steps replayed one after another share a submit.
    pub(crate) fn replay(&mut self, ctx: &GpuContext, step: &WgpuStep, keys: u32) {
        for &field in &step.key_fields {
            self.write(ctx, (&step.params, field), &keys.to_le_bytes());
        }
        for item in &step.items {
            match item {
                StepItem::Dispatch {
                    pipeline,
                    bind_group,
                    offset,
                    groups,
                } => {
                    let pass = self.pass(ctx);
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, bind_group, &[*offset]);
                    pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                }
                StepItem::Copy(c) => {
                    self.encoder(ctx)
                        .copy_buffer_to_buffer(&c.src.0, c.src.1, &c.dst.0, c.dst.1, c.bytes);
                }
            }
        }
        self.work.dispatches += step.dispatches as u64;
    }

    /// Writes `data` (a multiple of 4 bytes) into `dst` from byte `offset` on, in its place in
    /// the recording: work recorded before reads the old contents, work recorded after the
    /// new. A small write is staged and copied (`staging.rs`); a larger one submits what is
    /// recorded and goes by `write_buffer`, which lands before the next submit's commands.
    pub(crate) fn write(
        &mut self,
        ctx: &GpuContext,
        (dst, offset): (&wgpu::Buffer, u64),
        data: &[u8],
    ) {
        if data.is_empty() {
            return;
        }
        if data.len() > MAX_STAGED_WRITE {
            if self.has_pending() {
                self.submit(ctx);
            }
            ctx.queue.write_buffer(dst, offset, data);
            return;
        }
        if !self.staging.has_room(data.len()) {
            self.submit(ctx);
        }
        let at = self.staging.stage(data);
        let src = self.staging.buffer().clone();
        self.encoder(ctx)
            .copy_buffer_to_buffer(&src, at, dst, offset, data.len() as u64);
    }

    /// The pool temporary buffers come from.
    pub(crate) fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// Writes the parameter arena and submits everything recorded (possibly nothing). With
    /// profiling on, the batch ends by resolving its timestamps, and the submit waits for the
    /// batch to finish and reads them back.
    pub(crate) fn submit(&mut self, ctx: &GpuContext) -> wgpu::SubmissionIndex {
        self.pass = None;
        let mut encoder = self.encoder.take();
        if !self.arena.is_empty() {
            ctx.queue.write_buffer(&self.arena_buffer, 0, &self.arena);
            self.arena.clear();
        }
        self.staging.flush(&ctx.queue);
        if let (Some(profiler), Some(encoder)) = (&self.profiler, &mut encoder) {
            profiler.resolve(encoder);
        }
        self.work.submits += u64::from(encoder.is_some());
        let index = ctx.queue.submit(encoder.map(|e| e.finish()));
        if let Some(profiler) = &mut self.profiler {
            profiler.collect();
        }
        index
    }
}
