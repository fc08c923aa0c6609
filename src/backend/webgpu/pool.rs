//! Device buffers: [`GpuBuffer`] handles and the pool that recycles their memory.
//!
//! Creating a wgpu buffer costs a driver allocation, and inference allocates the same few
//! activation sizes over and over, so buffers are recycled: when the last handle to a
//! [`GpuBuffer`] drops, its `wgpu::Buffer` goes back to a free list keyed by its size class,
//! and the next op that needs that class takes it instead of allocating.
//!
//! Reuse is safe because all GPU work runs in queue order: an op recorded after a buffer was
//! freed runs after every op recorded before, so a recycled buffer is only written once its
//! previous readers are done. The one exception is `queue.write_buffer`, which runs at the next
//! submit *before* that submit's command buffers; the backend therefore never writes a pooled
//! buffer with `write_buffer` while work that reads it is recorded and unsubmitted (uploads
//! get a fresh buffer mapped at creation; in-place writes are copies recorded in their place,
//! `staging.rs`).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::shared_rounding::Handle;
use super::texels::WeightTexels;
use crate::dtype::DType;

/// Usage of every pooled buffer: bound as storage, and copied from and to.
pub(crate) const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Free buffers beyond this many bytes are released to the driver instead of kept.
const MAX_POOLED_BYTES: u64 = 1 << 30;

/// The smallest buffer: every buffer is a multiple of 16 bytes so kernels can bind any of
/// them as an array of `vec4<f32>`.
const MIN_BUFFER: u64 = 16;

/// Recycles buffers by size class.
#[derive(Debug)]
pub(crate) struct BufferPool {
    device: wgpu::Device,
    /// The largest buffer a storage binding can cover.
    max_binding: u64,
    free: Mutex<FreeLists>,
    /// How many times a freed buffer was released to the driver instead of kept (or memory
    /// outside the pool freed: a texel copy, `texels.rs`).
    releases: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct FreeLists {
    by_class: HashMap<u64, Vec<wgpu::Buffer>>,
    bytes: u64,
}

impl BufferPool {
    pub(crate) fn new(device: wgpu::Device, max_binding: u64) -> Arc<Self> {
        Arc::new(BufferPool {
            device,
            max_binding,
            free: Mutex::new(FreeLists::default()),
            releases: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The allocation size for `bytes` (see [`size_class`]).
    pub(crate) fn size_class(&self, bytes: u64) -> u64 {
        size_class(bytes, self.max_binding)
    }

    /// A storage buffer of `class` bytes: recycled when one is free, else new. Its contents are
    /// undefined.
    pub(crate) fn take(&self, class: u64) -> wgpu::Buffer {
        if let Ok(mut free) = self.free.lock() {
            if let Some(buffer) = free.by_class.get_mut(&class).and_then(|list| list.pop()) {
                free.bytes -= class;
                return buffer;
            }
        }
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("webtensor pooled"),
            size: class,
            usage: STORAGE_USAGE,
            mapped_at_creation: false,
        })
    }

    /// A new storage buffer of `class` bytes, mapped for writing: the way data gets onto the
    /// device without `write_buffer` (see the module docs). It joins the pool when freed.
    pub(crate) fn create_mapped(&self, class: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("webtensor upload"),
            size: class,
            usage: STORAGE_USAGE,
            mapped_at_creation: true,
        })
    }

    /// How many freed buffers were released to the driver so far.
    pub(crate) fn releases(&self) -> u64 {
        self.releases.load(Ordering::Relaxed)
    }

    /// The release counter, for memory freed outside the pool to count itself as a release
    /// (a texel copy, `texels.rs`), so that the recorder empties its bind group cache, which
    /// may still hold it.
    pub(crate) fn release_counter(&self) -> &Arc<AtomicU64> {
        &self.releases
    }

    fn give_back(&self, buffer: wgpu::Buffer) {
        let class = buffer.size();
        let Ok(mut free) = self.free.lock() else {
            return;
        };
        if free.bytes + class > MAX_POOLED_BYTES {
            // Dropped: wgpu frees it once pending work no longer uses it (and once no cached
            // bind group holds it; the count tells the recorder to empty its cache).
            self.releases.fetch_add(1, Ordering::Relaxed);
            return;
        }
        free.bytes += class;
        free.by_class.entry(class).or_default().push(buffer);
    }
}

/// The allocation size for `bytes`: at least 16, a multiple of 16, powers of two up to 4 KiB
/// and four classes per octave above, so at most a quarter is wasted; no more than a multiple
/// of 16 past the binding limit.
fn size_class(bytes: u64, max_binding: u64) -> u64 {
    let b = round_up(bytes.max(MIN_BUFFER), MIN_BUFFER);
    let class = if b <= 4096 {
        b.next_power_of_two()
    } else {
        round_up(b, b.next_power_of_two() / 8)
    };
    if class <= max_binding {
        class
    } else if b <= max_binding || bytes > max_binding {
        // Beyond one binding (a tensor read in row ranges): whole vec4s, nothing more.
        b
    } else {
        round_up(bytes.max(4), 4)
    }
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

/// A tensor's storage on a wgpu device: a buffer, or a part of one (a view: tensors uploaded
/// together, `Backend::upload_group`, each at its own offset). Cloning shares the buffer; when
/// the last handle on it drops, the memory returns to the backend's pool.
#[derive(Clone)]
pub struct GpuBuffer {
    inner: Arc<Inner>,
    /// The handles on this tensor's bytes (the whole buffer, or one view of it), which decide
    /// whether an in-place write must copy first: views of one buffer are separate tensors
    /// (a layer's key and value pools are written in place, each on its own).
    part: Arc<Part>,
    /// Where the tensor's bytes start in the buffer: 0, or for a view a multiple of the
    /// device's storage offset alignment, so it can be bound on its own.
    offset: u64,
    /// Whether this is a view of part of a buffer that holds other tensors too.
    view: bool,
    len: usize,
    dtype: DType,
    /// The texel copy of an uploaded Q4_0 tensor on a CPU adapter (`texels.rs`), dropped with
    /// the last handle or at the first in-place write (which has the only handle).
    texels: Option<Arc<WeightTexels>>,
}

struct Inner {
    buffer: wgpu::Buffer,
    pool: Weak<BufferPool>,
    /// Handles held by recorded work ([`PinnedBuffer`]): they keep the memory out of the pool
    /// without making the tensor shared (an in-place write still writes it, not a copy).
    pins: AtomicUsize,
}

/// One part of a buffer that tensors share: the pins among its handles.
#[derive(Default)]
struct Part {
    pins: AtomicUsize,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(self.buffer.clone());
        }
    }
}

impl GpuBuffer {
    pub(crate) fn new(
        buffer: wgpu::Buffer,
        len: usize,
        dtype: DType,
        pool: &Arc<BufferPool>,
    ) -> Self {
        GpuBuffer {
            inner: Arc::new(Inner {
                buffer,
                pool: Arc::downgrade(pool),
                pins: AtomicUsize::new(0),
            }),
            part: Arc::default(),
            offset: 0,
            view: false,
            len,
            dtype,
            texels: None,
        }
    }

    /// A view of `len` elements of `dtype` at byte `offset` of this handle's buffer (which
    /// must hold them; `offset` a multiple of the storage offset alignment).
    pub(crate) fn view(&self, offset: u64, len: usize, dtype: DType) -> GpuBuffer {
        GpuBuffer {
            inner: self.inner.clone(),
            part: Arc::default(),
            offset,
            view: true,
            len,
            dtype,
            texels: None,
        }
    }

    /// Where the data starts in the buffer ([`GpuBuffer::raw`]), in bytes.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether this is a view of part of a buffer, which a kernel binds as a range.
    pub(crate) fn is_view(&self) -> bool {
        self.view
    }

    /// The bytes a binding of the data spans: its length rounded up to whole vec4s (each
    /// tensor of a group is laid out with room for that).
    pub(crate) fn bound_bytes(&self) -> u64 {
        self.byte_len().next_multiple_of(16).max(16)
    }

    /// This buffer with `texels`, its data's texel copy.
    pub(crate) fn with_texels(mut self, texels: Option<WeightTexels>) -> Self {
        self.texels = texels.map(Arc::new);
        self
    }

    /// The texel copy of the data, if it has one.
    pub(crate) fn texels(&self) -> Option<&WeightTexels> {
        self.texels.as_deref()
    }

    /// Forgets the texel copy: the data is about to change.
    pub(crate) fn drop_texels(&mut self) {
        self.texels = None;
    }

    /// Number of elements (the buffer itself may be larger: it is rounded to a size class).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of the data (`len` storage units of the dtype).
    pub fn byte_len(&self) -> u64 {
        self.len as u64 * self.dtype.unit_bytes() as u64
    }

    /// The bytes of the buffer from the data's start on (at least 16, and at least
    /// [`GpuBuffer::byte_len`]).
    pub fn capacity(&self) -> u64 {
        self.inner.buffer.size() - self.offset
    }

    /// Whether another handle shares this tensor's bytes (a pin is not one: see
    /// [`PinnedBuffer`]; another view of the same buffer is not either).
    pub(crate) fn is_shared(&self) -> bool {
        let pins = self.part.pins.load(Ordering::Acquire);
        Arc::strong_count(&self.part).saturating_sub(pins) > 1
    }

    /// A handle that keeps this buffer's memory out of the pool for recorded work that binds
    /// it, without counting as a sharer.
    pub(crate) fn pin(&self) -> PinnedBuffer {
        let (inner, part) = (self.inner.clone(), self.part.clone());
        inner.pins.fetch_add(1, Ordering::AcqRel);
        part.pins.fetch_add(1, Ordering::AcqRel);
        PinnedBuffer(inner, part)
    }

    /// A view from this one's first byte to the last of `other`, a view of the same buffer
    /// that lies after it (two tensors allocated together, bound as one range), and where
    /// `other`'s data starts in it, in elements; `None` for any other pair.
    pub(crate) fn spanning(&self, other: &GpuBuffer) -> Option<(GpuBuffer, u64)> {
        let unit = self.dtype.unit_bytes() as u64;
        let from = other.offset.checked_sub(self.offset)?;
        let fits = Arc::ptr_eq(&self.inner, &other.inner)
            && self.view
            && other.view
            && self.dtype == other.dtype
            && from >= self.byte_len()
            && from.is_multiple_of(unit);
        let at = from / unit;
        let len = usize::try_from(at).ok()?.checked_add(other.len)?;
        fits.then(|| (self.view(self.offset, len, self.dtype), at))
    }

    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        &self.inner.buffer
    }
}

/// A handle on a buffer held by recorded work (a captured decode step, `capture.rs`), which
/// binds it: the memory stays out of the pool while the pin lives. A tensor whose other
/// handles are pins is not shared, so the engine's in-place writes (the KV cache, the decode
/// step's inputs) land in the very buffer the recorded work reads.
pub(crate) struct PinnedBuffer(Arc<Inner>, Arc<Part>);

impl PinnedBuffer {
    /// Whether only pins hold the buffer: no tensor has it any more.
    pub(crate) fn only_pinned(&self) -> bool {
        Arc::strong_count(&self.0) == self.0.pins.load(Ordering::Acquire)
    }

    /// Whether both pin the same buffer.
    pub(crate) fn same(&self, other: &PinnedBuffer) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("capacity", &self.0.buffer.size())
            .finish()
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        self.0.pins.fetch_sub(1, Ordering::AcqRel);
        self.1.pins.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The identity of a tensor's storage (its buffer and where in it), held without keeping it
/// alive: once every handle has dropped (and its buffer gone back to the pool for another
/// tensor), no handle is it ([`Handle::is`]).
#[derive(Debug)]
pub(crate) struct BufferId(Weak<Inner>, u64);

impl Handle for GpuBuffer {
    type Id = BufferId;

    fn id(&self) -> BufferId {
        BufferId(Arc::downgrade(&self.inner), self.offset)
    }

    /// (The weak reference keeps the allocation, so no later storage has the same address.)
    fn is(&self, id: &BufferId) -> bool {
        std::ptr::eq(id.0.as_ptr(), Arc::as_ptr(&self.inner)) && id.1 == self.offset
    }
}

impl fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuBuffer")
            .field("len", &self.len)
            .field("dtype", &self.dtype)
            .field("offset", &self.offset)
            .field("capacity", &self.inner.buffer.size())
            .field("texels", &self.texels.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::webgpu::pool::size_class;

    #[test]
    fn size_classes_cover_the_request_and_waste_at_most_a_quarter() {
        let limit = 128 << 20;
        for bytes in (0..20_000).chain([65_537, 1 << 20, (1 << 20) + 4, 100_000_004, limit]) {
            let c = size_class(bytes, limit);
            assert!(
                c >= bytes.max(16) && c.is_multiple_of(16) && c <= limit,
                "{bytes} -> {c}"
            );
            if bytes > 4096 {
                assert!(c * 4 <= bytes * 5 + 64, "{bytes} -> {c} wastes too much");
            }
        }
        // Near the binding limit the class never exceeds it.
        assert_eq!(size_class(limit - 16, limit), limit);
        assert_eq!(size_class(100_000_000, 100_000_016), 100_000_000);
        assert_eq!(size_class(100_000_004, 100_000_008), 100_000_004);
        // Past the binding limit: whole vec4s.
        assert_eq!(size_class(100_000_004, 1 << 20), 100_000_016);
    }
}
