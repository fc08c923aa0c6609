//! The `wgpu` backend: WGSL compute shaders on Vulkan, Metal, DX12 and WebGPU.
//!
//! How it fits together:
//!
//! * `context` opens the adapter and device (with the adapter's real limits) and reports
//!   what it found; in the browser `browser` names the adapter from `GPUAdapterInfo`.
//! * `pool` holds tensor memory: [`GpuBuffer`] handles whose buffers are recycled by size
//!   class when the last handle drops.
//! * `pipelines` compiles each shader of `shaders/` once and caches a pipeline per entry
//!   point.
//! * `recorder` keeps one open command encoder and the per-batch parameter arena:
//!   [`Backend::execute`] only records, and work is submitted at [`Backend::download`],
//!   [`Backend::synchronize`], or when the arena is full.
//! * `profiler` (the option `wgpu.profile`) times each dispatch with timestamp queries and
//!   totals the GPU time per kernel ([`Backend::kernel_profile`]).
//! * `kernels` turns each [`OpSpec`] into parameters, a kernel and a grid.
//! * `readback` copies results to the host: blocking natively, as a future in the browser
//!   ([`Backend::download_started`]); [`Backend::synchronize_async`] waits for the queue the
//!   same way.
//!
//! A tensor may be larger than one storage binding (up to `max_buffer_size`): the weight of a
//! product and the table of an embedding gather are then read one row range per binding
//! (`kernels/split.rs`); every other op refuses it with [`Error::TensorTooLarge`]. wgpu
//! errors (validation, out of memory, device loss) become [`Error::Backend`] at the next call.

mod bindings;
#[cfg(target_arch = "wasm32")]
mod browser;
mod capture;
mod context;
mod kernels;
mod params;
mod pipelines;
mod pool;
mod profiler;
mod readback;
mod recorder;
mod selfcheck;
mod shared_rounding;
mod staging;
mod texels;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

pub use pipelines::{compose_module, shader_modules};
pub use pool::GpuBuffer;

use self::context::{GpuContext, GpuFault};
use self::kernels::{Encoder, Operand};
use self::pipelines::Pipelines;
use self::pool::BufferPool;
use self::readback::Readback;
use self::recorder::Recorder;
use self::shared_rounding::SharedRounding;
use self::texels::WeightTexels;
use crate::backend::{
    Activations, Backend, BackendFuture, BackendInfo, BackendKind, CapturedStep, HostData,
    KernelProfile, OpKind, OpSpec, RecordedWork, RopeLayout, Storage, WgpuOptions,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The wgpu backend: one adapter and device, shared by every [`crate::Device`] that uses it.
pub struct WgpuBackend {
    ctx: GpuContext,
    pool: Arc<BufferPool>,
    pipelines: Pipelines,
    recorder: Mutex<Recorder>,
    /// The last normed rounding, for the next normed product of the same rows.
    shared_rounding: SharedRounding<GpuBuffer>,
}

impl fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuBackend")
            .field("adapter", &self.ctx.adapter_info.name)
            .field("backend", &self.ctx.adapter_info.backend)
            .finish_non_exhaustive()
    }
}

impl WgpuBackend {
    /// Starts the backend on the best adapter with `options` (blocking). `Err` says in words
    /// why no adapter or device is available. In the browser, use [`WgpuBackend::new_async`].
    pub fn new(options: &WgpuOptions) -> std::result::Result<Self, String> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            pollster::block_on(Self::new_async(options))
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = options;
            Err(
                "the wgpu backend must be started with WgpuBackend::new_async in the browser"
                    .into(),
            )
        }
    }

    /// Starts the backend on the best adapter with `options` without blocking.
    pub async fn new_async(options: &WgpuOptions) -> std::result::Result<Self, String> {
        let ctx = GpuContext::new(options).await?;
        let (max_binding, _) = ctx.max_binding();
        let pool = BufferPool::new(ctx.device.clone(), max_binding);
        let pipelines = Pipelines::new(&ctx.device);
        let recorder = Mutex::new(Recorder::new(&ctx, pool.clone()));
        if let Some(e) = ctx.errors.take() {
            return Err(format!("the wgpu device failed to start: {e}"));
        }
        #[allow(unused_mut)] // changed by the self-check, which runs natively only
        let mut backend = WgpuBackend {
            ctx,
            pool,
            pipelines,
            recorder,
            shared_rounding: SharedRounding::default(),
        };
        #[cfg(not(target_arch = "wasm32"))]
        backend.self_check();
        Ok(backend)
    }

    /// Runs the self-check of the variants this adapter's features selected (see
    /// `selfcheck`) and demotes each one that disagrees with the reference.
    #[cfg(not(target_arch = "wasm32"))]
    fn self_check(&mut self) {
        use selfcheck::{Variant, Verdict};
        // The noop device computes nothing, so every variant would disagree.
        if selfcheck::disabled(self) || self.ctx.adapter_info.backend == wgpu::Backend::Noop {
            return;
        }
        if self.ctx.row_teams && self.ctx.subgroups {
            let verdict = selfcheck::check(self, Variant::Subgroups);
            if matches!(verdict, Verdict::Demoted(_)) {
                self.ctx.subgroups = false;
                // Modules already compiled hold the subgroup prelude.
                self.pipelines = Pipelines::new(&self.ctx.device);
            }
            self.ctx.subgroups_check = Some(verdict);
        }
        if self.ctx.native_f16 {
            let verdict = selfcheck::check(self, Variant::NativeF16);
            if matches!(verdict, Verdict::Demoted(_)) {
                self.ctx.native_f16 = false;
            }
            self.ctx.f16_check = Some(verdict);
        }
        if self.ctx.int_dot {
            let verdict = selfcheck::check(self, Variant::IntDot);
            if matches!(verdict, Verdict::Demoted(_)) {
                self.ctx.int_dot = false;
                // Modules already compiled hold the `dot4I8Packed` prelude.
                self.pipelines = Pipelines::new(&self.ctx.device);
            }
            self.ctx.int_dot_check = Some(verdict);
        }
        if self.ctx.row_teams && self.ctx.tiled_prefill {
            let verdict = selfcheck::check(self, Variant::TiledPrefill);
            if matches!(verdict, Verdict::Demoted(_)) {
                self.ctx.tiled_prefill = false;
            }
            self.ctx.tiled_prefill_check = Some(verdict);
        }
    }

    /// Fails with [`Error::TensorTooLarge`] when a buffer of `bytes` cannot be bound.
    fn check_size(&self, op: &'static str, bytes: u64) -> Result<()> {
        let (limit, limit_name) = self.ctx.max_binding();
        if bytes > limit {
            return Err(Error::TensorTooLarge {
                op,
                backend: BackendKind::Wgpu,
                bytes,
                limit_name,
                limit,
            });
        }
        Ok(())
    }

    /// Turns errors wgpu reported since the last check into an error.
    fn check_errors(&self) -> Result<()> {
        let backend = BackendKind::Wgpu;
        match self.ctx.errors.take_fault() {
            None => Ok(()),
            Some((GpuFault::Validation, message)) => Err(Error::Backend { backend, message }),
            Some((GpuFault::OutOfMemory, message)) => {
                Err(Error::DeviceOutOfMemory { backend, message })
            }
            Some((GpuFault::Lost, message)) => Err(Error::DeviceLost { backend, message }),
        }
    }

    fn recorder(&self) -> Result<MutexGuard<'_, Recorder>> {
        self.recorder
            .lock()
            .map_err(|_| Error::backend(BackendKind::Wgpu, "the recorder lock was poisoned"))
    }

    /// Marks an open capture as one a replay cannot repeat (`why`): host data reached or left
    /// the device while it was open.
    fn spoil_capture(&self, why: &'static str) -> Result<()> {
        if let Some(log) = self.recorder()?.capture() {
            log.spoil(why);
        }
        Ok(())
    }

    /// Pins `buffers` to an open capture, whose recorded work binds them.
    fn pin_to_capture(&self, buffers: &[&GpuBuffer]) -> Result<()> {
        if let Some(log) = self.recorder()?.capture() {
            log.pin(buffers);
        }
        Ok(())
    }

    /// Fails with [`Error::TensorTooLarge`] when no buffer of `bytes` can be created.
    fn check_buffer_size(&self, op: &'static str, bytes: u64) -> Result<()> {
        let limit = self.ctx.limits.max_buffer_size;
        if bytes > limit {
            return Err(Error::TensorTooLarge {
                op,
                backend: BackendKind::Wgpu,
                bytes,
                limit_name: "max_buffer_size",
                limit,
            });
        }
        Ok(())
    }

    /// Records work through an [`Encoder`] on the locked recorder, then reports any error the
    /// device raised while it was recorded.
    fn record(&self, work: impl FnOnce(&mut Encoder<'_>) -> Result<()>) -> Result<()> {
        {
            let mut rec = self.recorder()?;
            let mut encoder = Encoder {
                ctx: &self.ctx,
                pipelines: &self.pipelines,
                recorder: &mut rec,
                windows: Vec::new(),
                table_filled: false,
                values_at: None,
            };
            work(&mut encoder)?;
        }
        self.check_errors()
    }

    /// A pooled buffer for `len` elements of `dtype`, contents undefined.
    fn alloc(&self, op: &'static str, len: usize, dtype: DType) -> Result<GpuBuffer> {
        let bytes = (len as u64).saturating_mul(dtype.unit_bytes() as u64);
        self.check_size(op, bytes)?;
        let buffer = self.pool.take(self.pool.size_class(bytes));
        Ok(GpuBuffer::new(buffer, len, dtype, &self.pool))
    }

    /// A new buffer holding `bytes`, written through a mapping at creation (never with
    /// `write_buffer`, which could overtake recorded work; see `recorder`).
    fn upload_bytes(
        &self,
        op: &'static str,
        bytes: &[u8],
        len: usize,
        dtype: DType,
    ) -> Result<GpuBuffer> {
        let buffer = self.mapped_buffer(op, bytes.len() as u64, &[(0, bytes)])?;
        Ok(GpuBuffer::new(buffer, len, dtype, &self.pool))
    }

    /// A new buffer of `size` bytes with each of `parts` (offset, bytes) written through a
    /// mapping at creation (never with `write_buffer`, which could overtake recorded work; see
    /// `recorder`).
    fn mapped_buffer(
        &self,
        op: &'static str,
        size: u64,
        parts: &[(u64, &[u8])],
    ) -> Result<wgpu::Buffer> {
        // Uploads may exceed one binding: see `kernels/split.rs` for the ops that read them.
        self.check_buffer_size(op, size)?;
        self.spoil_capture("host data was uploaded")?;
        let buffer = self.pool.create_mapped(self.pool.size_class(size));
        if size > 0 {
            let mut view = match buffer.slice(..).get_mapped_range_mut() {
                Ok(view) => view,
                // A lost device makes every new buffer invalid: say that, not the symptom.
                Err(e) => {
                    self.check_errors()?;
                    let message = format!("{op}: mapping a new buffer failed: {e}");
                    return Err(Error::backend(BackendKind::Wgpu, message));
                }
            };
            for &(at, bytes) in parts {
                let at = at as usize;
                view.slice(at..at + bytes.len()).copy_from_slice(bytes);
            }
        }
        buffer.unmap();
        self.check_errors()?;
        Ok(buffer)
    }

    /// The temporary buffers `spec`'s kernels need beside its inputs, in the order they are
    /// passed after them (see [`kernels`]' encoders): the gate product of a fused SwiGLU, the
    /// int8 table of an integer product, a scan's partial results, a greedy sample's (key,
    /// index) pairs, the partials of an attention split over its keys.
    fn extra_buffers(&self, spec: &OpSpec) -> Result<Vec<GpuBuffer>> {
        let op = spec.kind().name();
        let int_activations = |activations: Activations, m: usize, k: usize| {
            kernels::int_activation_words(activations, (m, k), self.ctx.mv_shape())
        };
        let mut extras = Vec::new();
        let table = match *spec {
            OpSpec::QMatmul {
                activations, m, k, ..
            } => int_activations(activations, m, k),
            OpSpec::NormLinear(l)
            | OpSpec::NormLinearInto { l, .. }
            | OpSpec::LinearResidual(l) => int_activations(l.activations, l.m, l.k),
            OpSpec::SwigluLinear(l) => {
                extras.push(self.alloc(op, l.m * l.n, DType::F32)?);
                int_activations(l.activations, l.m, l.k)
            }
            _ => None,
        };
        if let Some(words) = table {
            extras.push(self.alloc(op, words, DType::U32)?);
        }
        if let OpSpec::Sample {
            rows,
            vocab,
            params,
        } = *spec
        {
            if let Some(words) = kernels::sample_temp_words(rows, vocab, params.is_greedy()) {
                extras.push(self.alloc(op, words, DType::U32)?);
            }
        }
        if let OpSpec::Scan {
            outer, len, inner, ..
        } = *spec
        {
            let len = kernels::scan_temp_len(outer * inner, len);
            extras.push(self.alloc(op, len, DType::F32)?);
        }
        if let OpSpec::PagedAttention(a) = spec {
            let plan = kernels::AttentionPlan::of(a, self.ctx.mv_shape());
            if let Some(len) = plan.partials_len(a) {
                extras.push(self.alloc(op, len, DType::F32)?);
            }
        }
        Ok(extras)
    }

    /// Records `spec` reading `inputs` and writing `out`, with the extra buffers its kernels
    /// need ([`Self::extra_buffers`]) after the inputs. The int8 table of a normed product is
    /// the last normed rounding's where that rounded the same rows with the same norm
    /// ([`SharedRounding`]), and the product then skips its own rounding; a product that
    /// rounded is remembered for the next.
    ///
    /// An output that is a view is bound as its range; for a paired pool store it spans both
    /// pools, the value pool from element `values_at` on ([`Encoder::values_at`]).
    fn record_op(
        &self,
        spec: &OpSpec,
        (out, values_at): (&GpuBuffer, Option<u32>),
        inputs: &[&GpuBuffer],
    ) -> Result<()> {
        let copies = self.apart_from_other_views(spec, out, inputs)?;
        let apart: Vec<&GpuBuffer> = copies
            .iter()
            .zip(inputs)
            .map(|(copy, &b)| copy.as_ref().unwrap_or(b))
            .collect();
        let inputs = if copies.is_empty() { inputs } else { &apart };
        let mut extras = self.extra_buffers(spec)?;
        let mut filled = false;
        if let ([table], Some(rounded)) = (
            extras.as_mut_slice(),
            self.shared_rounding.find(spec, inputs),
        ) {
            *table = rounded;
            filled = true;
        }
        let mut operands: Vec<Operand<'_>> = inputs.iter().map(|b| Operand::of(b)).collect();
        operands.extend(extras.iter().map(Operand::of));
        self.record(|encoder| {
            encoder.table_filled = filled;
            encoder.values_at = values_at;
            // Views of grouped tensors are bound as their ranges, the output's first.
            encoder.windows = std::iter::once(Operand::of(out))
                .chain(operands.iter().copied())
                .filter_map(|o| o.window())
                .collect();
            encoder.encode(spec, out.raw(), &operands)
        })?;
        let bound: Vec<&GpuBuffer> = std::iter::once(out)
            .chain(inputs.iter().copied())
            .chain(&extras)
            .collect();
        self.pin_to_capture(&bound)?;
        if let ([table], false) = (extras.as_slice(), filled) {
            self.shared_rounding.remember(spec, inputs, table);
        }
        Ok(())
    }

    /// Copies of the inputs of `spec` that must not be bound as they are: views of a buffer
    /// that the output or an earlier input views at another range (tensors allocated
    /// together, `Tensor::zeros_group`). The encoder binds a buffer's views by the buffer, so
    /// such a pair would both be bound at one range. Kernels that read views of one buffer as
    /// one range themselves (the paired gate · up product, the paired key · value store,
    /// attention over key and value pools) take none; for any other op the input is copied
    /// into memory of its own first (a user's op on grouped tensors, never the engine's).
    /// Empty, and nothing allocated, when no input needs one (every op without views).
    fn apart_from_other_views(
        &self,
        spec: &OpSpec,
        out: &GpuBuffer,
        inputs: &[&GpuBuffer],
    ) -> Result<Vec<Option<GpuBuffer>>> {
        let spans_views = matches!(
            spec,
            OpSpec::SwigluLinear(_) | OpSpec::NormLinearInto { .. } | OpSpec::PagedAttention(_)
        );
        let clashes = |a: &GpuBuffer, b: &GpuBuffer| {
            (a.is_view() || b.is_view()) && a.raw() == b.raw() && a.offset() != b.offset()
        };
        let clashing = |i: usize| {
            std::iter::once(out)
                .chain(inputs[..i].iter().copied())
                .any(|b| clashes(b, inputs[i]))
        };
        if spans_views || !(0..inputs.len()).any(clashing) {
            return Ok(Vec::new());
        }
        (0..inputs.len())
            .map(|i| {
                clashing(i)
                    .then(|| self.copy_of(inputs[i], inputs[i].len()))
                    .transpose()
            })
            .collect()
    }

    /// A copy of the first `len` elements of `b` in a pooled buffer of its own, recorded in
    /// order.
    fn copy_of(&self, b: &GpuBuffer, len: usize) -> Result<GpuBuffer> {
        let copy = self.alloc("copy", len, b.dtype())?;
        // Buffer copies move whole 4-byte words; pooled buffers are padded to 16 bytes.
        let bytes = (len as u64 * b.dtype().unit_bytes() as u64).next_multiple_of(4);
        self.recorder()?
            .copy_region(&self.ctx, (b.raw(), b.offset()), (copy.raw(), 0), bytes);
        self.pin_to_capture(&[b, &copy])?;
        Ok(copy)
    }

    /// Records a paired pool store ([`OpSpec::NormLinearInto`] into a layer's `keys` and
    /// `values`): one dispatch where the two pools are views of one buffer, the values' after
    /// the keys' (`KvPool` allocates them so, `Tensor::zeros_group`), as are the two weights
    /// (`Tensor::from_bytes_group`), and the product pairs at its sizes
    /// ([`kernels::pairs_store`]); otherwise its two `stores`, one after the other.
    fn store_pair(
        &self,
        spec: &OpSpec,
        (keys, values): (&GpuBuffer, &GpuBuffer),
        stores: [(OpSpec, Vec<usize>); 2],
        inputs: &[&GpuBuffer],
    ) -> Result<()> {
        let weights = |(_, picks): &(OpSpec, Vec<usize>)| inputs.get(picks[1]).copied();
        let (k, v) = (weights(&stores[0]), weights(&stores[1]));
        let pairs = match (spec, k.zip(v)) {
            (OpSpec::NormLinearInto { l, .. }, Some((k, v))) => {
                Operand::of(k).spanning(&Operand::of(v)).is_some()
                    && kernels::pairs_store(l, self.ctx.mv_shape())
            }
            _ => false,
        };
        if let Some((both, at)) = keys.spanning(values).filter(|_| pairs) {
            let at = u32::try_from(at).map_err(|_| {
                Error::backend(BackendKind::Wgpu, "a value pool past 2^32 elements")
            })?;
            return self.record_op(spec, (&both, Some(at)), inputs);
        }
        for ((store, picks), target) in stores.iter().zip([keys, values]) {
            let picked = picks
                .iter()
                .map(|&i| inputs.get(i).copied())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Error::backend(BackendKind::Wgpu, "a pool store's inputs"))?;
            self.record_op(store, (target, None), &picked)?;
        }
        Ok(())
    }

    /// Submits everything recorded and waits for the device to finish it.
    fn submit_and_wait(&self) -> Result<()> {
        self.recorder()?.submit(&self.ctx);
        self.ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| {
                Error::backend(
                    BackendKind::Wgpu,
                    format!("waiting for the device failed: {e}"),
                )
            })?;
        self.check_errors()
    }

    /// Submits everything recorded and resolves when the device has finished it, without
    /// blocking the browser's event loop. Natively it blocks, then resolves at once.
    async fn finish_async(&self) -> Result<()> {
        self.recorder()?.submit(&self.ctx);
        let done = readback::work_done(&self.ctx);
        self.ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| {
                Error::backend(
                    BackendKind::Wgpu,
                    format!("waiting for the device failed: {e}"),
                )
            })?;
        done.await.map_err(|e| {
            Error::backend(
                BackendKind::Wgpu,
                format!("waiting for the queue failed: {e}"),
            )
        })?;
        self.check_errors()
    }

    /// Submits the copy of `storage` to a staging buffer with everything recorded before it:
    /// the start of every readback, blocking ([`Backend::download`]) or not
    /// ([`Backend::download_started`], with [`WgpuBackend::finish_read`]).
    fn start_read(&self, storage: &Storage) -> Result<StartedRead> {
        let src = gpu_storage("download", storage)?;
        self.spoil_capture("a tensor was read back")?;
        if src.byte_len() == 0 {
            return Ok(StartedRead::Empty(HostData::empty(src.dtype())));
        }
        let readback = Readback::start(&self.ctx, &mut *self.recorder()?, src);
        Ok(StartedRead::Copying(readback))
    }

    /// Waits for a readback [`WgpuBackend::start_read`] began, and no later submission.
    async fn finish_read(&self, started: Result<StartedRead>) -> Result<HostData> {
        let readback = match started? {
            StartedRead::Copying(readback) => readback,
            StartedRead::Empty(empty) => {
                self.check_errors()?;
                return Ok(empty);
            }
        };
        // Natively this waits for the copy's submission and runs the mapping callback; on the
        // web it returns at once and the browser delivers the callback.
        let wait = wgpu::PollType::Wait {
            submission_index: Some(readback.submission().clone()),
            timeout: None,
        };
        if let Err(e) = self.ctx.device.poll(wait) {
            // A lost device fails the submit, so the wait does not know its index: a wait for
            // everything runs the loss callback, and the error sink then reports the loss
            // rather than the wait's own complaint.
            let _ = self.ctx.device.poll(wgpu::PollType::wait_indefinitely());
            self.check_errors()?;
            return Err(Error::backend(
                BackendKind::Wgpu,
                format!("waiting for the device failed: {e}"),
            ));
        }
        self.check_errors()?;
        let host = readback.into_host().await?;
        self.check_errors()?;
        Ok(host)
    }
}

/// A readback as [`WgpuBackend::start_read`] left it.
enum StartedRead {
    /// The copy is submitted and the staging buffer is being mapped.
    Copying(Readback),
    /// The storage was empty: nothing to copy.
    Empty(HostData),
}

/// The wgpu buffer of a storage, or an error naming `op`.
fn gpu_storage<'a>(op: &str, storage: &'a Storage) -> Result<&'a GpuBuffer> {
    match storage {
        Storage::Wgpu(b) => Ok(b),
        _ => Err(Error::backend(
            BackendKind::Wgpu,
            format!("{op}: an input is not in wgpu memory"),
        )),
    }
}

impl Backend for WgpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Wgpu
    }

    /// Every op but a gather from a packed table, which the host backends run (the engine
    /// keeps an embedding packed only where one of them is primary).
    fn supports(&self, op: OpKind, dtype: DType) -> bool {
        op != OpKind::Embedding || dtype == DType::F32
    }

    /// The fused kernels bind their weights and pools whole, so a larger one than a binding
    /// goes through the composition, whose products and gathers read it in row ranges
    /// (`kernels/split.rs`). Attention for more than a decode step's few queries composes
    /// too: the kernel's one workgroup per (query, head) reads every key once per query, and
    /// the gathered keys' tiled products were faster on lavapipe (prompt 57–60 against
    /// 41–46 tok/s on a SmolLM-135M-shape model).
    fn prefers_composition(&self, spec: &OpSpec) -> bool {
        let binding = self.ctx.max_binding().0;
        let over = |bytes: Option<usize>| bytes.is_none_or(|b| b as u64 > binding);
        match *spec {
            OpSpec::PagedAttention(a) => {
                a.t > kernels::MATVEC_MAX_M || over(a.pool_rows.checked_mul(a.head_dim * 4))
            }
            // The pool is bound whole as the output (both pools, for a paired store).
            OpSpec::NormLinearInto {
                head_dim,
                pool_rows,
                paired,
                ..
            } if over(
                pool_rows
                    .checked_mul(head_dim * 4)
                    .and_then(|b| b.checked_mul(1 + usize::from(paired))),
            ) =>
            {
                true
            }
            OpSpec::NormLinear(l)
            | OpSpec::NormLinearInto { l, .. }
            | OpSpec::SwigluLinear(l)
            | OpSpec::LinearResidual(l) => {
                let units = l.format.storage_len(l.weight_len(), l.k);
                // The norm folds only into an int8 rounding (the decode kernel's on GPUs, its
                // own dispatch on CPU adapters), a rope only with interleaved pairs (a pair's
                // rows are stored together).
                let mv = self.ctx.mv_shape();
                let folds = kernels::folds_norm(l.format, l.activations, (l.m, l.k), mv);
                let rope_folds = l.rope.is_none_or(|r| r.layout == RopeLayout::Interleaved);
                let unfoldable = (l.norm.is_some() && !folds) || !rope_folds;
                unfoldable || over(units.and_then(|u| u.checked_mul(l.format.unit_bytes())))
            }
            _ => false,
        }
    }

    fn info(&self) -> BackendInfo {
        self.ctx.info()
    }

    fn upload(&self, data: HostData) -> Result<Storage> {
        let dtype = data.dtype();
        let buffer = self.upload_bytes("upload", data.bytes(), data.len(), dtype)?;
        // On CPU adapters a Q4_0 tensor's decode products read a texel copy (`texels.rs`).
        let texels = (dtype == DType::Q4_0 && self.ctx.weight_texels)
            .then(|| {
                let gpu = (&self.ctx.device, &self.ctx.queue, &self.ctx.limits);
                WeightTexels::of_q4_0(gpu, self.pool.release_counter(), data.bytes())
            })
            .flatten();
        self.check_errors()?;
        data.release_borrowed();
        Ok(Storage::Wgpu(buffer.with_texels(texels)))
    }

    /// On GPUs (the row-team shapes, whose fused gate and up product reads the two as one):
    /// parts of one dtype in one buffer, each at a multiple of the storage offset alignment and
    /// padded to whole vec4s, when the group fits one binding. Otherwise each on its own.
    fn upload_group(&self, parts: Vec<HostData>) -> Result<Vec<Storage>> {
        let one_dtype = parts.windows(2).all(|w| w[0].dtype() == w[1].dtype());
        let align = u64::from(self.ctx.limits.min_storage_buffer_offset_alignment).max(16);
        let mut offsets = Vec::with_capacity(parts.len());
        let mut end = 0u64;
        for part in &parts {
            let at = end.next_multiple_of(align);
            offsets.push(at);
            end = at + (part.bytes().len() as u64).next_multiple_of(16).max(16);
        }
        if !self.ctx.row_teams || parts.len() < 2 || !one_dtype || end > self.ctx.max_binding().0 {
            return parts.into_iter().map(|p| self.upload(p)).collect();
        }
        let writes: Vec<(u64, &[u8])> = offsets
            .iter()
            .zip(&parts)
            .map(|(&at, p)| (at, p.bytes()))
            .collect();
        let buffer = self.mapped_buffer("upload", end, &writes)?;
        parts.iter().for_each(HostData::release_borrowed);
        let whole = GpuBuffer::new(buffer, 0, parts[0].dtype(), &self.pool);
        Ok(parts
            .iter()
            .zip(offsets)
            .map(|(p, at)| Storage::Wgpu(whole.view(at, p.len(), p.dtype())))
            .collect())
    }

    fn download(&self, storage: &Storage) -> Result<HostData> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            pollster::block_on(self.finish_read(self.start_read(storage)))
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = storage;
            Err(Error::backend(
                BackendKind::Wgpu,
                "a blocking readback is impossible in the browser; use the async readback \
                 (Tensor::to_vec_async)",
            ))
        }
    }

    fn write_into(
        &self,
        spec: &OpSpec,
        targets: &mut [&mut Storage],
        inputs: &[&Storage],
    ) -> Result<()> {
        let op = spec.kind().name();
        for target in targets.iter_mut() {
            if let Storage::Wgpu(b) = target {
                b.drop_texels();
            }
        }
        let targets = targets
            .iter()
            .map(|t| gpu_storage(op, t))
            .collect::<Result<Vec<_>>>()?;
        for target in &targets {
            self.shared_rounding.forget_writes_to(target);
        }
        let buffers = inputs
            .iter()
            .map(|s| gpu_storage(op, s))
            .collect::<Result<Vec<_>>>()?;
        match (spec.paired_stores(), targets.as_slice()) {
            (Some(stores), &[keys, values]) => {
                self.store_pair(spec, (keys, values), stores, &buffers)
            }
            (None, &[target]) => self.record_op(spec, (target, None), &buffers),
            _ => Err(Error::backend(
                BackendKind::Wgpu,
                format!(
                    "{op} writes {} targets, got {}",
                    spec.targets(),
                    targets.len()
                ),
            )),
        }
    }

    fn execute(&self, spec: &OpSpec, inputs: &[&Storage]) -> Result<Storage> {
        let op = spec.kind().name();
        let buffers = inputs
            .iter()
            .map(|s| gpu_storage(op, s))
            .collect::<Result<Vec<_>>>()?;
        // The operand a split op reads one row range at a time may exceed one binding.
        let split = kernels::split_operand(spec).map(|s| s.0);
        for (i, b) in buffers.iter().enumerate() {
            if split != Some(i) {
                self.check_size(op, b.byte_len())?;
            }
        }
        let out_dtype = spec.output_dtype(buffers.first().map_or(DType::F32, |b| b.dtype()));
        let out = self.alloc(op, spec.output_len(), out_dtype)?;
        self.record_op(spec, (&out, None), &buffers)?;
        Ok(Storage::Wgpu(out))
    }

    fn copy(&self, x: &Storage, len: usize) -> Result<Storage> {
        let src = gpu_storage("copy", x)?;
        if len > src.len() {
            return Err(Error::invalid(
                "copy",
                format!("cannot copy {len} elements from a buffer of {}", src.len()),
            ));
        }
        Ok(Storage::Wgpu(self.copy_of(src, len)?))
    }

    /// Writes into the target's own memory in the write's place in the recording (the
    /// recorder's `write`): recorded work before it reads the old contents, after it the new.
    fn write(&self, target: &mut Storage, data: HostData) -> Result<()> {
        let target = gpu_storage("write", target)?;
        self.spoil_capture("host data was written")?;
        self.shared_rounding.forget_writes_to(target);
        let bytes = data.bytes();
        if bytes.len() as u64 != target.byte_len() || data.dtype() != target.dtype() {
            return Err(Error::invalid(
                "write",
                format!(
                    "{} bytes of {} cannot overwrite a tensor of {} bytes of {}",
                    bytes.len(),
                    data.dtype(),
                    target.byte_len(),
                    target.dtype()
                ),
            ));
        }
        // Buffer writes and copies move whole 4-byte words; pooled buffers are padded to 16
        // bytes.
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().next_multiple_of(4), 0);
        self.recorder()?
            .write(&self.ctx, (target.raw(), target.offset()), &padded);
        self.check_errors()
    }

    /// A recorded buffer copy. Buffer copies move whole 4-byte words, so both ranges must
    /// start and end on one (f32 and u32 tensors always do).
    fn copy_into(
        &self,
        (src, from): (&Storage, usize),
        (target, at): (&mut Storage, usize),
        units: usize,
    ) -> Result<()> {
        let src = gpu_storage("copy_into", src)?;
        let target = gpu_storage("copy_into", target)?;
        let unit = src.dtype().unit_bytes() as u64;
        let (from, at, bytes) = (from as u64 * unit, at as u64 * unit, units as u64 * unit);
        let (from, at) = (src.offset() + from, target.offset() + at);
        if !(from.is_multiple_of(4) && at.is_multiple_of(4) && bytes.is_multiple_of(4)) {
            return Err(Error::invalid(
                "copy_into",
                format!(
                    "the wgpu backend copies whole 4-byte words; {units} units of {} at {from}                      and {at} are not",
                    src.dtype()
                ),
            ));
        }
        self.shared_rounding.forget_writes_to(target);
        self.recorder()?
            .copy_region(&self.ctx, (src.raw(), from), (target.raw(), at), bytes);
        self.pin_to_capture(&[src, target])?;
        self.check_errors()
    }

    fn begin_capture(&self) -> bool {
        self.recorder().is_ok_and(|mut r| r.begin_capture())
    }

    fn end_capture(&self) -> Option<CapturedStep> {
        // The last normed rounding's table is the step's own temporary from now on.
        self.shared_rounding.forget();
        let mut recorder = self.recorder().ok()?;
        let layout = recorder.params_layout();
        let log = recorder.end_capture()?;
        match log.finish(&self.ctx.device, layout) {
            Ok(step) => Some(CapturedStep {
                kind: BackendKind::Wgpu,
                dispatches: step.dispatches,
                work: Box::new(step),
            }),
            Err(why) => {
                log::debug!("webtensor: the decode step is not replayed: {why}");
                None
            }
        }
    }

    fn replay(&self, step: &CapturedStep, keys: usize) -> Result<()> {
        let (step, keys) = step.replay_args::<capture::WgpuStep>(BackendKind::Wgpu, keys)?;
        // Inputs the step reads may now hold what no remembered rounding was made from.
        self.shared_rounding.forget();
        self.recorder()?.replay(&self.ctx, step, keys);
        self.check_errors()
    }

    fn read_probe(&self, x: &Storage) -> Result<Option<(Storage, u64)>> {
        let src = gpu_storage("read_probe", x)?;
        let bytes = src.byte_len();
        // The probe binds the whole buffer.
        self.check_size("read_probe", bytes)?;
        let invocations =
            kernels::probe_invocations(bytes, self.ctx.limits.max_compute_workgroups_per_dimension);
        if invocations == 0 {
            return Err(Error::invalid(
                "read_probe",
                format!("a buffer of {bytes} bytes is too small to probe"),
            ));
        }
        let out = self.alloc("read_probe", invocations as usize, DType::U32)?;
        self.record(|encoder| encoder.read_probe(out.raw(), src.raw(), invocations))?;
        Ok(Some((
            Storage::Wgpu(out),
            kernels::probe_bytes(invocations),
        )))
    }

    fn recorded_work(&self) -> Option<RecordedWork> {
        self.recorder().ok().map(|r| r.recorded_work())
    }

    fn kernel_profile(&self) -> Option<KernelProfile> {
        self.recorder().ok().and_then(|r| r.kernel_profile())
    }

    fn synchronize(&self) -> Result<()> {
        self.submit_and_wait()
    }

    fn lose_device(&self) {
        self.ctx.device.destroy();
    }

    fn download_started(self: Arc<Self>, storage: &Storage) -> BackendFuture<'static, HostData> {
        let started = self.start_read(storage);
        Box::pin(async move { self.finish_read(started).await })
    }

    fn synchronize_async(&self) -> BackendFuture<'_, ()> {
        Box::pin(self.finish_async())
    }
}
