//! Reading device buffers back to the host.
//!
//! A readback records a copy of the tensor into a fresh `MAP_READ` staging buffer, submits the
//! batch (so everything the tensor depends on runs first), and maps the staging buffer. Natively
//! the caller can block on the device; in the browser the mapping completes from the event loop,
//! so [`Readback::into_host`] is a future that resolves when the mapping callback fires.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::context::GpuContext;
use super::pool::GpuBuffer;
use super::recorder::Recorder;
use crate::backend::BackendKind;
use crate::backend::HostData;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The outcome of a wgpu callback (`map_async`, `on_submitted_work_done`) and the task
/// waiting for it.
#[derive(Default)]
struct MapState {
    result: Option<std::result::Result<(), String>>,
    waker: Option<Waker>,
}

/// A readback in flight: the copy is submitted and the staging buffer is being mapped.
pub(crate) struct Readback {
    staging: wgpu::Buffer,
    /// The submit that carries the copy.
    submission: wgpu::SubmissionIndex,
    dtype: DType,
    /// Bytes of data; the staging buffer may be up to 3 bytes longer.
    bytes: usize,
    state: Arc<Mutex<MapState>>,
}

impl Readback {
    /// Records the copy of `src` (not empty) into a staging buffer, submits everything recorded,
    /// and starts mapping.
    pub(crate) fn start(ctx: &GpuContext, recorder: &mut Recorder, src: &GpuBuffer) -> Readback {
        // Buffer copies move whole 4-byte words; pooled buffers are padded to 16 bytes.
        let bytes = src.byte_len().next_multiple_of(4);
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("webtensor readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        recorder.copy_region(ctx, (src.raw(), src.offset()), (&staging, 0), bytes);
        let submission = recorder.submit(ctx);
        let state = Arc::new(Mutex::new(MapState::default()));
        let callback_state = state.clone();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            if let Ok(mut s) = callback_state.lock() {
                s.result = Some(r.map_err(|e| e.to_string()));
                if let Some(w) = s.waker.take() {
                    w.wake();
                }
            }
        });
        Readback {
            staging,
            submission,
            dtype: src.dtype(),
            bytes: src.byte_len() as usize,
            state,
        }
    }

    /// The submit that carries the copy.
    pub(crate) fn submission(&self) -> &wgpu::SubmissionIndex {
        &self.submission
    }

    /// Waits for the mapping and copies the data out.
    pub(crate) async fn into_host(self) -> Result<HostData> {
        let mapped = MapFuture {
            state: self.state.clone(),
        }
        .await;
        mapped.map_err(|e| {
            Error::backend(
                BackendKind::Wgpu,
                format!("mapping the readback failed: {e}"),
            )
        })?;
        let host = {
            let view = self.staging.slice(..).get_mapped_range().map_err(|e| {
                Error::backend(
                    BackendKind::Wgpu,
                    format!("reading the readback failed: {e}"),
                )
            })?;
            let data = &view[..self.bytes];
            let words = data.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
            match self.dtype {
                DType::F32 => HostData::F32(words.map(f32::from_le_bytes).collect()),
                DType::U32 => HostData::U32(words.map(u32::from_le_bytes).collect()),
                d => HostData::Bytes(d, data.to_vec().into()),
            }
        };
        self.staging.unmap();
        Ok(host)
    }
}

/// A future that resolves when the queue has finished all work submitted so far (natively,
/// once the device has been polled; in the browser, from the event loop).
pub(crate) fn work_done(ctx: &GpuContext) -> impl Future<Output = std::result::Result<(), String>> {
    let state = Arc::new(Mutex::new(MapState::default()));
    let callback_state = state.clone();
    ctx.queue.on_submitted_work_done(move || {
        if let Ok(mut s) = callback_state.lock() {
            s.result = Some(Ok(()));
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    });
    MapFuture { state }
}

/// Resolves when a wgpu callback (buffer mapping, queue done) has run.
struct MapFuture {
    state: Arc<Mutex<MapState>>,
}

impl Future for MapFuture {
    type Output = std::result::Result<(), String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Ok(mut s) = self.state.lock() else {
            return Poll::Ready(Err("the readback state lock was poisoned".into()));
        };
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
