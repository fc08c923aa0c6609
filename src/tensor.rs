//! Tensors: a shape, a dtype and device storage.
//!
//! A [`Tensor`] is a cheap handle (`Clone` copies an `Arc`). Its data lives on one backend of
//! its [`Device`]; on the GPU it may not even be computed yet: ops are recorded and run when a
//! result is read with [`Tensor::to_vec`]. Tensors are immutable and always contiguous
//! row-major; ops return new tensors.

use std::fmt;
use std::sync::Arc;

use crate::backend::{BackendRef, HostData, Storage};
use crate::device::Device;
use crate::error::{Error, Result};

/// Element type of a tensor.
///
/// `F32`, `U32` and `I32` are stored as 4-byte words. The other types are *packed*: stored as
/// raw little-endian bytes exactly as GGUF lays them out, so a model file's tensor bytes are
/// used as they are. Block formats group the last axis into blocks (32 or 256 values) that
/// share a scale; a tensor of a block format needs a last dimension divisible by the block
/// length. See [`crate::quant`] for each layout.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float: activations and weights.
    F32,
    /// 32-bit unsigned integer: token ids, positions, argmax results.
    U32,
    /// 32-bit signed integer: exact integer dot products.
    I32,
    /// 16-bit IEEE float (binary16), 2 bytes per value.
    F16,
    /// 8-bit signed integer: quantized activations.
    I8,
    /// GGUF `Q8_0`: blocks of 32 values, an f16 scale and 32 `i8` (34 bytes, 8.5 bits/value).
    Q8_0,
    /// GGUF `Q4_0`: blocks of 32 values, an f16 scale and 16 bytes of 4-bit values
    /// (18 bytes, 4.5 bits/value).
    Q4_0,
    /// GGUF `TQ1_0`: ternary blocks of 256 values in base-3 packing and an f16 scale
    /// (54 bytes, 1.6875 bits/value).
    TQ1_0,
    /// GGUF `TQ2_0`: ternary blocks of 256 values at 2 bits each and an f16 scale
    /// (66 bytes, 2.0625 bits/value).
    TQ2_0,
    /// Ternary bit-planes: blocks of 256 values as an f32 scale, a "+1" plane and a "−1" plane
    /// of 8 `u32` words each (68 bytes, 2.125 bits/value); integer dot products are AND plus
    /// popcount.
    TernaryPlanes,
}

impl DType {
    /// Every dtype.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::U32,
        DType::I32,
        DType::F16,
        DType::I8,
        DType::Q8_0,
        DType::Q4_0,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::TernaryPlanes,
    ];

    /// Bytes of one storage unit: an element for the 4-byte types, a byte for packed types.
    /// Backends count buffer lengths in these units.
    pub fn unit_bytes(self) -> usize {
        if self.is_packed() {
            1
        } else {
            4
        }
    }

    /// Whether the data is stored as raw bytes (f16, i8 and the block formats).
    pub fn is_packed(self) -> bool {
        !matches!(self, DType::F32 | DType::U32 | DType::I32)
    }

    /// Whether this is a block-quantized weight format (values share a per-block scale).
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// Whether this is one of the ternary formats (values −1, 0, +1 times a block scale).
    pub fn is_ternary(self) -> bool {
        matches!(self, DType::TQ1_0 | DType::TQ2_0 | DType::TernaryPlanes)
    }

    /// Values per block: 1 for plain types, 32 for `Q8_0`/`Q4_0`, 256 for the ternary formats.
    pub fn block_len(self) -> usize {
        match self {
            DType::Q8_0 | DType::Q4_0 => 32,
            DType::TQ1_0 | DType::TQ2_0 | DType::TernaryPlanes => 256,
            _ => 1,
        }
    }

    /// Bytes per block (per element for plain types).
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::F16 => 2,
            DType::I8 => 1,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::TQ1_0 => 54,
            DType::TQ2_0 => 66,
            DType::TernaryPlanes => 68,
        }
    }

    /// Average bits per value, scales included.
    pub fn bits_per_value(self) -> f64 {
        (self.block_bytes() * 8) as f64 / self.block_len() as f64
    }

    /// Bytes of one row of `row_len` values (a whole number of blocks for block formats;
    /// saturates at `usize::MAX`, a size no buffer has).
    pub fn row_bytes(self, row_len: usize) -> usize {
        (row_len / self.block_len()).saturating_mul(self.block_bytes())
    }

    /// Storage units (see [`DType::unit_bytes`]) of `count` values laid out in rows of
    /// `row_len`, or `None` when `row_len` is not a whole number of blocks or the byte count
    /// overflows `usize`.
    pub fn storage_len(self, count: usize, row_len: usize) -> Option<usize> {
        let block = self.block_len();
        if block > 1 && !row_len.is_multiple_of(block) {
            return None;
        }
        let bytes = (count / block).checked_mul(self.block_bytes())?;
        Some(bytes / self.unit_bytes())
    }

    /// Parses a name as displayed (`f32`, `q8_0`, `tq2_0`, `ternary_planes`, ...).
    pub fn parse(name: &str) -> Option<DType> {
        let wanted = name.trim().to_ascii_lowercase();
        DType::ALL.into_iter().find(|d| d.name() == wanted)
    }

    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::F16 => "f16",
            DType::I8 => "i8",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::TQ1_0 => "tq1_0",
            DType::TQ2_0 => "tq2_0",
            DType::TernaryPlanes => "ternary_planes",
        }
    }
}

impl serde::Serialize for DType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The dimensions of a tensor, outermost first. A rank-0 shape `[]` holds one element.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (the product of the dimensions; 1 for rank 0). A product that
    /// overflows saturates at `usize::MAX`, which no data length matches and no allocation
    /// grants; [`Shape::checked_numel`] tells the two apart.
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// The number of elements, or `None` when the product overflows `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// The last dimension, or 1 for a rank-0 shape.
    pub fn last_dim(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }

    /// The product of every dimension but the last: the number of rows when a tensor is
    /// viewed as a matrix over its last axis.
    pub fn rows(&self) -> usize {
        match self.0.split_last() {
            Some((_, lead)) => lead
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .unwrap_or(usize::MAX),
            None => 1,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}

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
                HostData::Bytes($dtype, bytemuck::cast_slice(&data).to_vec())
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
        let n = shape.checked_numel().unwrap_or(usize::MAX);
        let mut data: Vec<f32> = Vec::new();
        data.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
            what: format!("a zero tensor of shape {shape}"),
            bytes: (n as u64).saturating_mul(4),
            available: None,
            hint: "use a smaller shape".into(),
        })?;
        data.resize(n, 0.0);
        Self::from_vec(device, data, shape)
    }

    /// A tensor of a packed dtype (`f16`, `i8`, a block format) from its raw bytes, laid out
    /// exactly as GGUF stores them; a GGUF tensor's bytes can be passed as they are.
    ///
    /// Fails with [`Error::DataLength`] when the byte count does not fit the shape, and with
    /// [`Error::ShapeMismatch`] when the last dimension is not a whole number of blocks.
    pub fn from_bytes(
        device: &Device,
        dtype: DType,
        bytes: Vec<u8>,
        shape: impl Into<Shape>,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let units = expect_storage_len("from_bytes", dtype, &shape)?;
        let expected = units * dtype.unit_bytes();
        if bytes.len() != expected {
            return Err(Error::DataLength {
                len: bytes.len(),
                expected,
                shape,
            });
        }
        let host = match dtype {
            DType::F32 => HostData::F32(bytemuck::pod_collect_to_vec(&bytes)),
            DType::U32 => HostData::U32(bytemuck::pod_collect_to_vec(&bytes)),
            _ => HostData::Bytes(dtype, bytes),
        };
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

    pub(crate) fn backend(&self) -> &BackendRef {
        &self.inner.backend
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
        let backend = self.backend_name();
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
            Error::backend(self.backend_name(), "downloaded data has the wrong dtype")
        })
    }

    /// [`Tensor::to_vec`] without blocking: the readback the browser needs (a GPU mapping
    /// completes from the event loop there, so the blocking form is an error on wasm32).
    /// Natively it resolves as soon as the data is on the host.
    pub async fn to_vec_async<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "to_vec_async",
                argument: "self",
                expected: self.dtype(),
                got: T::DTYPE,
            });
        }
        let host = self
            .inner
            .backend
            .download_async(&self.inner.storage)
            .await?;
        T::from_host(host).ok_or_else(|| {
            Error::backend(self.backend_name(), "downloaded data has the wrong dtype")
        })
    }

    /// [`Tensor::to_bytes`] without blocking (see [`Tensor::to_vec_async`]).
    pub async fn to_bytes_async(&self) -> Result<Vec<u8>> {
        let host = self
            .inner
            .backend
            .download_async(&self.inner.storage)
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

/// The raw little-endian bytes of downloaded data.
fn host_bytes(host: HostData) -> Vec<u8> {
    match host {
        HostData::F32(v) => bytemuck::cast_slice(&v).to_vec(),
        HostData::U32(v) => bytemuck::cast_slice(&v).to_vec(),
        HostData::Bytes(_, b) => b,
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
