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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit IEEE float: activations and weights.
    F32,
    /// 32-bit unsigned integer: token ids, positions, argmax results.
    U32,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        4
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::U32 => "u32",
        })
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

    /// Number of elements (the product of the dimensions; 1 for rank 0).
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// The last dimension, or 1 for a rank-0 shape.
    pub fn last_dim(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }

    /// The product of every dimension but the last: the number of rows when a tensor is
    /// viewed as a matrix over its last axis.
    pub fn rows(&self) -> usize {
        match self.0.split_last() {
            Some((_, lead)) => lead.iter().product(),
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
            HostData::F32(_) => None,
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

    /// A tensor of zeros.
    pub fn zeros(device: &Device, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        Self::from_vec(device, vec![0f32; shape.numel()], shape)
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
    /// `T` must match the dtype (`f32` for F32, `u32` for U32).
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

    /// Moves the data to another backend of the same device (or of another device) and
    /// returns a tensor living there. A no-op when it is already there.
    pub(crate) fn to_backend(&self, backend: &BackendRef) -> Result<Tensor> {
        if backend.kind() == self.inner.backend.kind() {
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
