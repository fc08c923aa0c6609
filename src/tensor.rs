//! Tensors: a shape, a dtype and device storage.
//!
//! A [`Tensor`] is a cheap handle (`Clone` copies an `Arc`). Its data lives on one backend of
//! its [`Device`]; on the GPU it may not even be computed yet: ops are recorded and run when a
//! result is read with [`Tensor::to_vec`]. Tensors are immutable and always contiguous
//! row-major; ops return new tensors.

use std::fmt;
use std::sync::Arc;

use crate::backend::{BackendRef, HostBytes, HostData, Storage};
use crate::device::Device;
/// Re-exported here, where they were defined before they got modules of their own, so
/// `webtensor::tensor::{DType, Shape}` keep working.
pub use crate::dtype::DType;
use crate::error::{Error, Result};
pub use crate::shape::Shape;

/// Element types that can be copied into and out of tensors.
pub trait Element: Copy + Send + Sync + 'static {
    /// The tensor dtype for this Rust type.
    const DTYPE: DType;
    /// Wrap owned data for upload.
    fn into_host(data: Vec<Self>) -> HostData;
    /// Unwrap downloaded data; `None` when the dtype differs.
    fn from_host(data: HostData) -> Option<Vec<Self>>;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn into_host(data: Vec<Self>) -> HostData {
        HostData::F32(data)
    }
    fn from_host(data: HostData) -> Option<Vec<Self>> {
        match data {
            HostData::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Element for u32 {
    const DTYPE: DType = DType::U32;
    fn into_host(data: Vec<Self>) -> HostData {
        HostData::U32(data)
    }
    fn from_host(data: HostData) -> Option<Vec<Self>> {
        match data {
            HostData::U32(v) => Some(v),
            _ => None,
        }
    }
}

/// Element types stored as raw little-endian bytes on the device.
macro_rules! byte_element {
    ($t:ty, $dtype:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn into_host(data: Vec<Self>) -> HostData {
                HostData::Bytes($dtype, bytemuck::cast_slice(&data).to_vec().into())
            }
            fn from_host(data: HostData) -> Option<Vec<Self>> {
                match data {
                    HostData::Bytes(d, bytes) if d == $dtype => {
                        Some(bytemuck::pod_collect_to_vec(&bytes))
                    }
                    _ => None,
                }
            }
        }
    };
}

byte_element!(i32, DType::I32);
byte_element!(i8, DType::I8);
byte_element!(half::f16, DType::F16);

/// An n-dimensional, contiguous, immutable array on a [`Device`].
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<TensorInner>,
}

struct TensorInner {
    storage: Storage,
    shape: Shape,
    dtype: DType,
    backend: BackendRef,
    device: Device,
    /// For u32 tensors: an exclusive upper bound on every value when one is known without
    /// reading the data (host data, argmax results). Lets `embedding` reject bad ids early.
    index_bound: Option<u32>,
}

impl Tensor {
    /// Copies `data` to the device's primary backend as a tensor of the given shape.
    ///
    /// Fails with [`Error::DataLength`] when `data.len()` is not the shape's element count, and
    /// with [`Error::TensorTooLarge`] when the backend cannot hold it.
    pub fn from_slice<T: Element>(
        device: &Device,
        data: &[T],
        shape: impl Into<Shape>,
    ) -> Result<Tensor> {
        Self::from_vec(device, data.to_vec(), shape)
    }

    /// Like [`Tensor::from_slice`], taking ownership of the data.
    pub fn from_vec<T: Element>(
        device: &Device,
        data: Vec<T>,
        shape: impl Into<Shape>,
    ) -> Result<Tensor> {
        let shape = shape.into();
        if data.len() != shape.numel() {
            return Err(Error::DataLength {
                len: data.len(),
                expected: shape.numel(),
                shape,
            });
        }
        let host = T::into_host(data);
        let index_bound = match &host {
            HostData::U32(v) => Some(v.iter().max().map_or(0, |m| m.saturating_add(1))),
            _ => None,
        };
        let backend = device.primary().clone();
        let storage = backend.upload(host)?;
        Ok(Tensor::from_parts(
            storage,
            shape,
            T::DTYPE,
            backend,
            device.clone(),
            index_bound,
        ))
    }

    /// A tensor of zeros. A shape whose host copy cannot be allocated is an
    /// [`Error::OutOfMemory`], not an abort.
    pub fn zeros(device: &Device, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        Self::from_vec(device, zero_data(&shape)?, shape)
    }

    /// Tensors of zeros of `shapes`, allocated together as [`Tensor::from_bytes_group`]
    /// uploads its parts: where the backend can, views of one allocation that a kernel can
    /// also write as one (a layer's key and value pools, which the wgpu backend's decode
    /// step stores into in one dispatch). Each is written in place on its own.
    pub fn zeros_group(device: &Device, shapes: &[Shape]) -> Result<Vec<Tensor>> {
        let hosts = shapes
            .iter()
            .map(|s| Ok(HostData::F32(zero_data(s)?)))
            .collect::<Result<Vec<_>>>()?;
        let backend = device.primary().clone();
        let storages = backend.upload_group(hosts)?;
        Ok(storages
            .into_iter()
            .zip(shapes)
            .map(|(storage, shape)| {
                let (backend, device) = (backend.clone(), device.clone());
                Tensor::from_parts(storage, shape.clone(), DType::F32, backend, device, None)
            })
            .collect())
    }

    /// A tensor of a packed dtype (`f16`, `i8`, a block format) from its raw bytes, laid out
    /// exactly as GGUF stores them; a GGUF tensor's bytes can be passed as they are, owned or
    /// borrowed from the mapped file ([`HostBytes::borrowed`]: host backends then keep no copy).
    ///
    /// Fails with [`Error::DataLength`] when the byte count does not fit the shape, and with
    /// [`Error::ShapeMismatch`] when the last dimension is not a whole number of blocks.
    pub fn from_bytes(
        device: &Device,
        dtype: DType,
        bytes: impl Into<HostBytes>,
        shape: impl Into<Shape>,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let host = host_from_bytes(dtype, bytes.into(), &shape)?;
        let backend = device.primary().clone();
        let storage = backend.upload(host)?;
        let bound = None;
        Ok(Tensor::from_parts(
            storage,
            shape,
            dtype,
            backend,
            device.clone(),
            bound,
        ))
    }

    /// Several tensors of raw bytes ([`Tensor::from_bytes`]) uploaded together: where the
    /// backend can, into one allocation, each at an offset it binds on its own, so that a
    /// kernel can also read them as one (`Backend::upload_group`: a layer's gate and up
    /// weights, which the wgpu backend multiplies in one dispatch).
    pub fn from_bytes_group<B: Into<HostBytes>>(
        device: &Device,
        parts: Vec<(DType, B, Shape)>,
    ) -> Result<Vec<Tensor>> {
        let mut hosts = Vec::with_capacity(parts.len());
        let mut shapes = Vec::with_capacity(parts.len());
        for (dtype, bytes, shape) in parts {
            hosts.push(host_from_bytes(dtype, bytes.into(), &shape)?);
            shapes.push((dtype, shape));
        }
        let backend = device.primary().clone();
        let storages = backend.upload_group(hosts)?;
        Ok(storages
            .into_iter()
            .zip(shapes)
            .map(|(storage, (dtype, shape))| {
                Tensor::from_parts(storage, shape, dtype, backend.clone(), device.clone(), None)
            })
            .collect())
    }

    /// Runs all recorded work this tensor depends on and copies its raw little-endian bytes to
    /// the host (any dtype; for block formats, the GGUF block bytes).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(host_bytes(
            self.inner.backend.download(&self.inner.storage)?,
        ))
    }

    pub(crate) fn from_parts(
        storage: Storage,
        shape: Shape,
        dtype: DType,
        backend: BackendRef,
        device: Device,
        index_bound: Option<u32>,
    ) -> Tensor {
        Tensor {
            inner: Arc::new(TensorInner {
                storage,
                shape,
                dtype,
                backend,
                device,
                index_bound,
            }),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.inner.shape
    }

    /// The dimensions (same as `shape().dims()`).
    pub fn dims(&self) -> &[usize] {
        self.inner.shape.dims()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// The device this tensor belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The name of the backend that holds the data right now (after a fallback it may differ
    /// from the device's primary backend).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.kind().name()
    }

    pub(crate) fn storage(&self) -> &Storage {
        &self.inner.storage
    }

    pub(crate) fn index_bound(&self) -> Option<u32> {
        self.inner.index_bound
    }

    /// The backend that holds this tensor's storage.
    pub fn backend(&self) -> &BackendRef {
        &self.inner.backend
    }

    /// Overwrites every element with `data` (one value per element, `T` of the tensor's
    /// dtype), in place and in order: work recorded before the call reads the old values, work
    /// recorded after it the new ones. On a GPU the values go into the tensor's own memory, so
    /// recorded work that reads it (a replayed decode step) sees them. A tensor shared with a
    /// clone is copied first, as for every in-place write.
    pub fn write<T: Element>(&mut self, data: &[T]) -> Result<()> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "write",
                argument: "data",
                expected: self.dtype(),
                got: T::DTYPE,
            });
        }
        if data.len() != self.shape().numel() {
            return Err(Error::DataLength {
                len: data.len(),
                expected: self.shape().numel(),
                shape: self.shape().clone(),
            });
        }
        let host = T::into_host(data.to_vec());
        let bound = match &host {
            HostData::U32(v) => Some(v.iter().max().map_or(0, |m| m.saturating_add(1))),
            _ => None,
        };
        let backend = self.inner.backend.clone();
        backend.write(self.storage_for_write()?, host)?;
        self.set_index_bound(bound);
        Ok(())
    }

    /// Copies `len` elements of `src` (from element `from` on) into this tensor at element
    /// `at`, in place and in order, on the device: both of one dtype whose elements are whole
    /// 4-byte words (f32, u32, i32) and on one backend, the ranges within both.
    pub fn copy_from(&mut self, at: usize, src: &Tensor, from: usize, len: usize) -> Result<()> {
        const OP: &str = "copy_from";
        if src.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                argument: "src",
                expected: self.dtype(),
                got: src.dtype(),
            });
        }
        if self.dtype().unit_bytes() != 4 || self.dtype().block_len() != 1 {
            return Err(Error::invalid(
                OP,
                format!(
                    "copies elements of 4 bytes (f32, u32, i32), not {}",
                    self.dtype()
                ),
            ));
        }
        let fits = |start: usize, t: &Tensor| {
            start
                .checked_add(len)
                .is_some_and(|end| end <= t.shape().numel())
        };
        if !fits(at, self) || !fits(from, src) {
            return Err(Error::shape(
                OP,
                format!("{len} elements from {from} into {at} run past a tensor"),
                &[self.shape(), src.shape()],
            ));
        }
        if !same_instance(self.backend(), src.backend()) {
            return Err(Error::DeviceMismatch {
                op: OP,
                first: format!("{:?}", self.device()),
                second: format!("{:?}", src.device()),
            });
        }
        let bound = self
            .index_bound()
            .zip(src.index_bound())
            .map(|(a, b)| a.max(b));
        let backend = self.inner.backend.clone();
        backend.copy_into((src.storage(), from), (self.storage_for_write()?, at), len)?;
        self.set_index_bound(bound);
        Ok(())
    }

    /// Sets the known bound of a u32 tensor's values after an in-place write (which made this
    /// handle the only one).
    fn set_index_bound(&mut self, bound: Option<u32>) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.index_bound = bound;
        }
    }

    /// This tensor's storage for an in-place write: first copied when another tensor (a clone
    /// or a reshape) shares it, so a write changes this tensor only.
    pub(crate) fn storage_for_write(&mut self) -> Result<&mut Storage> {
        let shared = Arc::get_mut(&mut self.inner).is_none_or(|i| i.storage.is_shared());
        if shared {
            let i = &self.inner;
            let units = expect_storage_len("write", i.dtype, &i.shape)?;
            self.inner = Arc::new(TensorInner {
                storage: i.backend.copy(&i.storage, units)?,
                shape: i.shape.clone(),
                dtype: i.dtype,
                backend: i.backend.clone(),
                device: i.device.clone(),
                index_bound: i.index_bound,
            });
        }
        let backend = self.inner.backend.kind();
        Arc::get_mut(&mut self.inner)
            .map(|i| &mut i.storage)
            .ok_or_else(|| Error::backend(backend, "a fresh copy is still shared"))
    }

    /// The same data under a new shape with the same number of elements (no copy).
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if shape.numel() != self.shape().numel() {
            return Err(Error::shape(
                "reshape",
                format!("the new shape must hold {} elements", self.shape().numel()),
                &[self.shape(), &shape],
            ));
        }
        expect_storage_len("reshape", self.dtype(), &shape)?;
        let i = &self.inner;
        Ok(Tensor::from_parts(
            i.storage.clone(),
            shape,
            i.dtype,
            i.backend.clone(),
            i.device.clone(),
            i.index_bound,
        ))
    }

    /// Runs all recorded work this tensor depends on and copies its elements to the host.
    ///
    /// `T` must match the dtype (`f32` for F32, `u32` for U32, `i32`, `i8`, `half::f16`); read
    /// block formats with [`Tensor::to_bytes`] or dequantize them first.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                argument: "self",
                expected: self.dtype(),
                got: T::DTYPE,
            });
        }
        let host = self.inner.backend.download(&self.inner.storage)?;
        T::from_host(host).ok_or_else(|| {
            Error::backend(
                self.inner.backend.kind(),
                "downloaded data has the wrong dtype",
            )
        })
    }

    /// Starts reading this tensor back now ([`crate::backend::Backend::download_started`]):
    /// on a GPU everything recorded so far is submitted with the copy, and work recorded
    /// after this call runs while it is in flight. The future resolves to the elements and
    /// does not borrow the tensor.
    pub fn download_started<T: Element>(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<T>>> + 'static {
        self.read_started("download_started")
    }

    /// [`Tensor::to_vec`] without blocking: the readback the browser needs (a GPU mapping
    /// completes from the event loop there, so the blocking form is an error on wasm32).
    /// Natively it resolves as soon as the data is on the host.
    pub async fn to_vec_async<T: Element>(&self) -> Result<Vec<T>> {
        self.read_started("to_vec_async").await
    }

    /// The readback of the async readers, started when called; `op` names the caller in a
    /// dtype error.
    fn read_started<T: Element>(
        &self,
        op: &'static str,
    ) -> impl std::future::Future<Output = Result<Vec<T>>> + 'static {
        let dtype = self.dtype();
        let kind = self.inner.backend.kind();
        let data = (T::DTYPE == dtype).then(|| {
            self.inner
                .backend
                .clone()
                .download_started(&self.inner.storage)
        });
        async move {
            let Some(data) = data else {
                return Err(Error::DTypeMismatch {
                    op,
                    argument: "self",
                    expected: dtype,
                    got: T::DTYPE,
                });
            };
            T::from_host(data.await?)
                .ok_or_else(|| Error::backend(kind, "downloaded data has the wrong dtype"))
        }
    }

    /// [`Tensor::to_bytes`] without blocking (see [`Tensor::to_vec_async`]).
    pub async fn to_bytes_async(&self) -> Result<Vec<u8>> {
        let host = self
            .inner
            .backend
            .clone()
            .download_started(&self.inner.storage)
            .await?;
        Ok(host_bytes(host))
    }

    /// Moves the data to another backend of the same device (or of another device) and
    /// returns a tensor living there. A no-op when it is already there.
    pub(crate) fn to_backend(&self, backend: &BackendRef) -> Result<Tensor> {
        // The same instance, not merely the same kind: separate GPU devices
        // (`DeviceBuilder::separate`) are backends of one kind with their own memory.
        if same_instance(backend, &self.inner.backend) {
            return Ok(self.clone());
        }
        let i = &self.inner;
        let storage = match (&i.storage, backend.kind().is_host()) {
            // cpu and reference share host storage: nothing to copy.
            (Storage::Host(_), true) => i.storage.clone(),
            _ => backend.upload(i.backend.download(&i.storage)?)?,
        };
        Ok(Tensor::from_parts(
            storage,
            i.shape.clone(),
            i.dtype,
            backend.clone(),
            i.device.clone(),
            i.index_bound,
        ))
    }

    /// Copies this tensor to another device (its primary backend).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        let moved = self.to_backend(device.primary())?;
        let i = &moved.inner;
        Ok(Tensor::from_parts(
            i.storage.clone(),
            i.shape.clone(),
            i.dtype,
            i.backend.clone(),
            device.clone(),
            i.index_bound,
        ))
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}, {}, on {})",
            self.shape(),
            self.dtype(),
            self.backend_name()
        )
    }
}

/// Whether two handles are one backend instance (their data pointers, whatever the vtables).
fn same_instance(a: &BackendRef, b: &BackendRef) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// `bytes` as the host data of a tensor of `dtype` and `shape`: fails with
/// [`Error::DataLength`] when the byte count does not fit the shape.
fn host_from_bytes(dtype: DType, bytes: HostBytes, shape: &Shape) -> Result<HostData> {
    let units = expect_storage_len("from_bytes", dtype, shape)?;
    let expected = units * dtype.unit_bytes();
    if bytes.len() != expected {
        return Err(Error::DataLength {
            len: bytes.len(),
            expected,
            shape: shape.clone(),
        });
    }
    Ok(match dtype {
        DType::F32 => HostData::F32(bytemuck::pod_collect_to_vec(&bytes)),
        DType::U32 => HostData::U32(bytemuck::pod_collect_to_vec(&bytes)),
        _ => HostData::Bytes(dtype, bytes),
    })
}

/// The f32 zeros of `shape` on the host, or [`Error::OutOfMemory`] where they cannot be
/// allocated.
fn zero_data(shape: &Shape) -> Result<Vec<f32>> {
    let n = shape.checked_numel().unwrap_or(usize::MAX);
    let mut data: Vec<f32> = Vec::new();
    data.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        what: format!("a zero tensor of shape {shape}"),
        bytes: (n as u64).saturating_mul(4),
        available: None,
        hint: "use a smaller shape".into(),
    })?;
    data.resize(n, 0.0);
    Ok(data)
}

/// The raw little-endian bytes of downloaded data.
fn host_bytes(host: HostData) -> Vec<u8> {
    match host {
        HostData::F32(v) => bytemuck::cast_slice(&v).to_vec(),
        HostData::U32(v) => bytemuck::cast_slice(&v).to_vec(),
        HostData::Bytes(_, b) => b.into_vec(),
    }
}

/// The storage units of a `dtype` tensor of `shape`, or a shape error when its last dimension
/// is not a whole number of the dtype's blocks.
pub(crate) fn expect_storage_len(op: &'static str, dtype: DType, shape: &Shape) -> Result<usize> {
    dtype
        .storage_len(shape.numel(), shape.last_dim())
        .ok_or_else(|| {
            Error::shape(
                op,
                format!(
                    "{dtype} packs the last axis in blocks of {}; its length must be a multiple of {}",
                    dtype.block_len(),
                    dtype.block_len()
                ),
                &[shape],
            )
        })
}
