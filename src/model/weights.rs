//! Tensors as stored in a model file, before they are placed on a device.

use std::ops::Range;
use std::sync::Arc;

use super::files::FileBytes;
use crate::backend::BackendKind;
use crate::backend::{HostBytes, SharedBytes};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// A dtype as found in a file. BF16 has no device dtype: it is widened to f32 on load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredDType {
    /// f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    BF16,
    /// A packed device dtype stored as is (GGUF block formats).
    Packed(DType),
}

impl StoredDType {
    /// Bytes per value of the unpacked dtypes (0 for block formats).
    pub fn bytes_per_value(self) -> usize {
        match self {
            StoredDType::F32 => 4,
            StoredDType::F16 | StoredDType::BF16 => 2,
            StoredDType::Packed(_) => 0,
        }
    }
}

impl std::fmt::Display for StoredDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoredDType::F32 => f.write_str("F32"),
            StoredDType::F16 => f.write_str("F16"),
            StoredDType::BF16 => f.write_str("BF16"),
            StoredDType::Packed(d) => f.write_str(&d.name().to_ascii_uppercase()),
        }
    }
}

/// One tensor of a file: dtype, row-major shape, and its bytes within the file.
#[derive(Clone, Debug, PartialEq)]
pub struct RawTensor {
    /// As stored.
    pub dtype: StoredDType,
    /// Row-major dimensions (outermost first).
    pub shape: Vec<usize>,
    /// Byte range in the file.
    pub range: Range<usize>,
}

/// Whether `device` keeps weights as they are stored where the GPU backends would need them
/// widened: its primary backend is a host one (cpu, reference), whose products read bf16 and
/// whose embedding gathers read a packed table. The GPU kernels have neither (bf16 has no
/// reader in [`crate::backend::kernel_consts`], their gathers read f32), so for them bf16
/// weights and the embedding table are widened to f32.
pub(crate) fn keeps_packed(device: &Device) -> bool {
    matches!(
        device.chain().first(),
        Some(BackendKind::Cpu | BackendKind::Reference)
    )
}

impl RawTensor {
    /// Uploads the tensor from its `file` to `device`: f32, f16 and block formats as they
    /// are, bf16 as it is on the host backends and widened to f32 for the GPU ones.
    pub fn to_device(&self, device: &Device, file: &Arc<FileBytes>) -> Result<Tensor> {
        let (dtype, data) = self.device_bytes(file, keeps_packed(device))?;
        Tensor::from_bytes(device, dtype, data, self.shape.as_slice())
    }

    /// The dtype and bytes the tensor takes on a device: f16 and block formats borrowed from
    /// the file as they are (a host backend keeps no copy of them), f32 copied (host f32
    /// data is a vector of floats), bf16 borrowed where `keep_bf16`, else widened to f32; the
    /// file's pages of a copied tensor are released ([`SharedBytes::release`]), as the copy
    /// replaces them.
    pub(crate) fn device_bytes(
        &self,
        file: &Arc<FileBytes>,
        keep_bf16: bool,
    ) -> Result<(DType, HostBytes)> {
        let copied = |dtype, bytes: Vec<u8>| {
            file.release(self.range.clone());
            (dtype, bytes.into())
        };
        Ok(match self.dtype {
            StoredDType::F32 => copied(DType::F32, file.bytes()[self.range.clone()].to_vec()),
            StoredDType::BF16 if keep_bf16 => (DType::BF16, self.borrowed(file)?),
            StoredDType::BF16 => copied(
                DType::F32,
                bytemuck::cast_slice(&self.to_f32(file.bytes())).to_vec(),
            ),
            StoredDType::F16 => (DType::F16, self.borrowed(file)?),
            StoredDType::Packed(d) => (d, self.borrowed(file)?),
        })
    }

    /// The tensor's bytes, borrowed from its file.
    fn borrowed(&self, file: &Arc<FileBytes>) -> Result<HostBytes> {
        HostBytes::borrowed(file.clone(), self.range.clone())
    }

    fn dequantized(&self, format: DType, data: &[u8]) -> Vec<f32> {
        let mut out = vec![0f32; self.shape.iter().product()];
        crate::quant::dequantize(format, data, &mut out);
        out
    }

    /// The values as f32 on the host (norm weights and other small vectors).
    pub fn to_f32(&self, bytes: &[u8]) -> Vec<f32> {
        let data = &bytes[self.range.clone()];
        match self.dtype {
            StoredDType::F32 => bytemuck::pod_collect_to_vec(data),
            StoredDType::BF16 => data
                .chunks_exact(2)
                .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
                .collect(),
            StoredDType::F16 => self.dequantized(DType::F16, data),
            StoredDType::Packed(d) => self.dequantized(d, data),
        }
    }
}
