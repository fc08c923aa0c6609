//! A decode step captured on wgpu and replayed (see `crate::backend::CapturedStep`).
//!
//! While a capture is open the recorder logs each dispatch it records (pipeline, what it
//! binds, its parameter block, its grid) and each buffer copy, and the backend pins the
//! buffers those bind ([`PinnedBuffer`]). At the end the step is built once: its parameter
//! blocks, identical ones merged, in a uniform buffer of its own, and a bind group per
//! dispatch over it. The pins of buffers nothing else holds (the step's temporaries) stay
//! with the step, so no later op takes their memory; buffers others hold (weights, the KV
//! pool, the step's inputs) are released, their owners keep them.
//!
//! A replay records the same dispatches and copies again, after writing the key count of
//! the attention kernels into their parameter blocks: per token the host sets a pipeline, a
//! bind group and a grid per dispatch, and builds nothing.
//!
//! The backend is one per process and its recorder is shared: work another thread records
//! while a capture is open is not the step's, so it spoils the capture instead of joining it
//! (a replay would otherwise run that thread's dispatches again, into its buffers).

use std::collections::HashMap;
use std::thread::ThreadId;

use super::bindings::{self, BindKey};
use super::pool::{GpuBuffer, PinnedBuffer};

/// A buffer-to-buffer copy: (source, offset), (destination, offset), bytes.
#[derive(Clone, Debug)]
pub(crate) struct CopyCommand {
    pub(crate) src: (wgpu::Buffer, u64),
    pub(crate) dst: (wgpu::Buffer, u64),
    pub(crate) bytes: u64,
}

/// One dispatch as the recorder recorded it.
#[derive(Debug)]
struct LoggedDispatch {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    key: BindKey,
    params: Vec<u8>,
    groups: [u32; 3],
    /// Where in `params` the attention kernel's key count is.
    keys_at: Option<u32>,
}

#[derive(Debug)]
enum Logged {
    Dispatch(LoggedDispatch),
    Copy(CopyCommand),
}

/// What an open capture has recorded so far.
#[derive(Debug)]
pub(crate) struct CaptureLog {
    /// The thread that captures: work recorded from another meanwhile spoils the capture.
    owner: ThreadId,
    items: Vec<Logged>,
    pins: Vec<PinnedBuffer>,
    /// Why the capture cannot be replayed, once something ran that a replay would not repeat.
    spoiled: Option<&'static str>,
}

impl CaptureLog {
    /// An empty log, owned by the calling thread.
    pub(crate) fn new() -> CaptureLog {
        CaptureLog {
            owner: std::thread::current().id(),
            items: Vec::new(),
            pins: Vec::new(),
            spoiled: None,
        }
    }

    /// The open capture `capture`, if work recorded from the calling thread belongs to it;
    /// from another thread the capture is spoiled instead, and `None`.
    pub(crate) fn of_this_thread(capture: &mut Option<CaptureLog>) -> Option<&mut CaptureLog> {
        let log = capture.as_mut()?;
        if log.owner != std::thread::current().id() {
            log.spoil("another thread recorded work meanwhile");
            return None;
        }
        Some(log)
    }

    /// Logs a dispatch of a kernel (its pipeline and bind group layout) binding `key`, with
    /// its parameter block and grid.
    pub(crate) fn dispatch(
        &mut self,
        (pipeline, layout): (&wgpu::ComputePipeline, &wgpu::BindGroupLayout),
        key: BindKey,
        params: &[u8],
        groups: [u32; 3],
        keys_at: Option<u32>,
    ) {
        self.items.push(Logged::Dispatch(LoggedDispatch {
            pipeline: pipeline.clone(),
            layout: layout.clone(),
            key,
            params: params.to_vec(),
            groups,
            keys_at,
        }));
    }

    /// Logs a buffer copy.
    pub(crate) fn copy(&mut self, command: CopyCommand) {
        self.items.push(Logged::Copy(command));
    }

    /// Pins the buffers recorded work binds (each once).
    pub(crate) fn pin(&mut self, buffers: &[&GpuBuffer]) {
        for b in buffers {
            let pin = b.pin();
            if !self.pins.iter().any(|p| p.same(&pin)) {
                self.pins.push(pin);
            }
        }
    }

    /// Marks the capture as one a replay cannot repeat, and why.
    pub(crate) fn spoil(&mut self, why: &'static str) {
        self.spoiled.get_or_insert(why);
    }

    /// The step to replay, built on `device` with parameter slots of `slot` bytes (the
    /// device's uniform offset alignment, at least a parameter block) that bind blocks of
    /// `params_bytes`: `Err` says why there is none.
    pub(crate) fn finish(
        self,
        device: &wgpu::Device,
        (slot, params_bytes): (u64, u64),
    ) -> std::result::Result<WgpuStep, &'static str> {
        if let Some(why) = self.spoiled {
            return Err(why);
        }
        if self.items.is_empty() {
            return Err("nothing was recorded");
        }
        // Identical parameter blocks share a slot, unless one of them has its key count set
        // by each replay.
        let mut slots: HashMap<(&[u8], Option<u32>), u64> = HashMap::new();
        let mut blocks: Vec<&[u8]> = Vec::new();
        let mut key_fields = Vec::new();
        for item in &self.items {
            if let Logged::Dispatch(d) = item {
                let next = blocks.len() as u64;
                slots.entry((&d.params, d.keys_at)).or_insert_with(|| {
                    blocks.push(&d.params);
                    if let Some(field) = d.keys_at {
                        key_fields.push(next * slot + u64::from(field));
                    }
                    next
                });
            }
        }
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("webtensor captured step params"),
            size: (blocks.len() as u64).max(1) * slot,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        if let Ok(mut view) = params.slice(..).get_mapped_range_mut() {
            for (i, block) in blocks.iter().enumerate() {
                let at = i * slot as usize;
                view.slice(at..at + block.len()).copy_from_slice(block);
            }
        }
        params.unmap();
        let mut dispatches = 0;
        let items = self
            .items
            .iter()
            .map(|item| match item {
                Logged::Dispatch(d) => {
                    dispatches += 1;
                    let at = slots[&(d.params.as_slice(), d.keys_at)];
                    StepItem::Dispatch {
                        pipeline: d.pipeline.clone(),
                        bind_group: bindings::bind_group(
                            device,
                            &d.layout,
                            (&params, params_bytes),
                            &d.key,
                        ),
                        offset: (at * slot) as u32,
                        groups: d.groups,
                    }
                }
                Logged::Copy(c) => StepItem::Copy(c.clone()),
            })
            .collect();
        // The step keeps its temporaries; tensors that still exist are their owners'.
        let scratch = self.pins.into_iter().filter(|p| p.only_pinned()).collect();
        Ok(WgpuStep {
            items,
            params,
            key_fields,
            _scratch: scratch,
            dispatches,
        })
    }
}

/// One recorded item of a step, ready to record again.
#[derive(Debug)]
pub(crate) enum StepItem {
    Dispatch {
        pipeline: wgpu::ComputePipeline,
        bind_group: wgpu::BindGroup,
        /// The dynamic offset of its parameter block.
        offset: u32,
        groups: [u32; 3],
    },
    Copy(CopyCommand),
}

/// A captured step: what [`crate::backend::CapturedStep`] holds for the wgpu backend.
#[derive(Debug)]
pub(crate) struct WgpuStep {
    pub(crate) items: Vec<StepItem>,
    /// The step's parameter blocks.
    pub(crate) params: wgpu::Buffer,
    /// Byte offsets in `params` of the attention kernels' key counts.
    pub(crate) key_fields: Vec<u64>,
    /// The step's temporaries, kept out of the pool while the step lives.
    _scratch: Vec<PinnedBuffer>,
    pub(crate) dispatches: usize,
}
