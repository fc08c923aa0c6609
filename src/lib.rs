//! # webtensor
//!
//! Neural-network tensor ops that run with the same numbers on every device: GPUs through
//! wgpu (Vulkan, Metal, DX12, and WebGPU in the browser), CPUs through a rayon + SIMD backend,
//! and a scalar `reference` backend that every other backend is tested against.
//!
//! ```
//! use webtensor::{ops, Device, Tensor};
//!
//! # fn main() -> webtensor::Result<()> {
//! let dev = Device::auto()?; // or Device::new("wgpu")?, Device::cpu()
//! let x = Tensor::from_slice(&dev, &[1.0f32, -2.0, 3.0, 0.5, 0.0, -1.0], [2, 3])?;
//! let w = Tensor::from_slice(&dev, &[1.0f32, 1.0, 1.0], [3])?;
//! let y = ops::silu(&ops::rms_norm(&x, &w, 1e-6)?)?; // recorded, not yet run on a GPU
//! let out: Vec<f32> = y.to_vec()?; // runs the work and reads it back
//! assert_eq!(out.len(), 6);
//!
//! // Bad input is a typed error, never a panic.
//! let wrong = Tensor::from_slice(&dev, &[1.0f32; 4], [4])?;
//! assert!(matches!(ops::rms_norm(&x, &wrong, 1e-6), Err(webtensor::Error::ShapeMismatch { .. })));
//! # Ok(())
//! # }
//! ```
//!
//! Start with [`Device`] (choosing a backend), [`Tensor`] and the functions in [`ops`]. The
//! repository's ARCHITECTURE.md shows how a call flows from here to a kernel.

#![warn(missing_docs)]
// The threaded wasm build has no wgpu backend, so `Storage` is host memory alone there and the
// matches that set GPU storage aside cannot fail; every other build needs them.
#![cfg_attr(
    all(target_arch = "wasm32", target_feature = "atomics"),
    allow(unreachable_patterns, irrefutable_let_patterns)
)]

pub mod backend;
pub mod bench;
pub mod device;
pub mod dtype;
pub mod error;
pub mod memory;
pub mod ops;
pub mod quant;
pub mod shape;
pub mod tensor;

pub use backend::{BackendInfo, BackendKind, BackendOptions, OpKind};
pub use device::{Device, DeviceBuilder};
pub use dtype::DType;
pub use error::{Error, Result, TemplateBound};
/// IEEE binary16, the element type of `DType::F16` tensors (from the `half` crate).
pub use half::f16;
pub use shape::Shape;
pub use tensor::{Element, Tensor};

/// The README's Rust example runs as a doc test, so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
