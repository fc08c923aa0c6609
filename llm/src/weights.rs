//! Tensors as stored in a model file, before they are placed on a device.

use std::ops::Range;
use std::sync::Arc;

use super::files::FileBytes;
use webtensor::backend::BackendKind;
use webtensor::backend::{HostBytes, SharedBytes};
use webtensor::device::Device;
use webtensor::dtype::DType;
use webtensor::error::Result;
use webtensor::tensor::Tensor;

/// A dtype as found in a file.
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
/// widened: its primary backend is a host one (cpu, reference), whose embedding gathers read a
/// packed table and whose products read bf16 in rows of any length. The GPU gathers read f32,
/// so for them the embedding table is widened to f32, and so are bf16 matrices whose rows are
/// not whole groups of 32 values ([`keeps_bf16`]).
pub fn keeps_packed(device: &Device) -> bool {
    matches!(
        device.chain().first(),
        Some(BackendKind::Cpu | BackendKind::Reference)
    )
}

/// Whether `device` keeps a bf16 matrix of `shape` as bf16: the host backends always, the GPU
/// backends where its rows are whole groups of 32 values, which their group decoders read
/// (`decodes_groups`); other rows are widened to f32 for them (no model we know has such).
pub fn keeps_bf16(device: &Device, shape: &[usize]) -> bool {
    keeps_packed(device) || rows_of_whole_groups(shape)
}

/// Whether the rows of `shape` (its last dimension) are whole groups of 32 values.
fn rows_of_whole_groups(shape: &[usize]) -> bool {
    shape.last().is_some_and(|k| k.is_multiple_of(32))
}

/// A tensor's name in Hugging Face folders and in GGUF files: the one place the loader, the
/// engine and the memory estimate take the names they share from.
pub(crate) struct TensorName {
    /// In a Hugging Face folder.
    pub hf: &'static str,
    /// In a GGUF file.
    pub gguf: &'static str,
}

impl TensorName {
    /// Whether `name` is this one, in either convention.
    fn is(&self, name: &str) -> bool {
        name == self.hf || name == self.gguf
    }
}

/// The embedding table.
pub(crate) const EMBEDDING: TensorName = TensorName {
    hf: "model.embed_tokens.weight",
    gguf: "token_embd.weight",
};
/// The output projection; a model without one ties it to the embedding table.
pub(crate) const OUTPUT: TensorName = TensorName {
    hf: "lm_head.weight",
    gguf: "output.weight",
};
/// What every decoder layer's tensor names begin with, before the layer's number.
pub(crate) const LAYER_PREFIX: TensorName = TensorName {
    hf: "model.layers.",
    gguf: "blk.",
};

/// Whether the tensor `name` belongs to a decoder layer (`blk.N.` in GGUF, `model.layers.N.`
/// in Hugging Face folders).
pub fn is_layer_tensor(name: &str) -> bool {
    name.starts_with(LAYER_PREFIX.hf) || name.starts_with(LAYER_PREFIX.gguf)
}

/// The bytes the tensor `name` takes on a device once loaded: as stored where the device
/// keeps weights packed ([`keeps_packed`]); elsewhere the embedding table and bf16 weights
/// whose rows are not whole groups of 32 ([`keeps_bf16`]) are widened to f32. The one sizing
/// rule of the loader's memory check and of the page's estimate before a download
/// (web/src/estimate.rs).
pub fn loaded_bytes(name: &str, t: &RawTensor, keeps_packed: bool) -> u64 {
    let stored = t.range.len() as u64;
    if keeps_packed {
        stored
    } else if EMBEDDING.is(name) {
        (t.shape.iter().product::<usize>() as u64).saturating_mul(4)
    } else if t.dtype == StoredDType::BF16 && !rows_of_whole_groups(&t.shape) {
        stored * 2
    } else {
        stored
    }
}

/// The bytes the tensors outside the decoder layers take on a device once loaded (the
/// embedding table, the output projection, the final norm), each by [`loaded_bytes`]; for a
/// model whose output projection is tied to the embedding table, the table once more as
/// stored, which the output projection reads where the table itself was widened.
pub fn outside_layers_bytes<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a RawTensor)>,
    keeps_packed: bool,
) -> u64 {
    let mut bytes = 0u64;
    let mut embedding = None;
    let mut tied = true;
    for (name, t) in tensors {
        if is_layer_tensor(name) {
            continue;
        }
        bytes = bytes.saturating_add(loaded_bytes(name, t, keeps_packed));
        if EMBEDDING.is(name) {
            embedding = Some(t);
        }
        tied &= !OUTPUT.is(name);
    }
    match embedding {
        Some(t) if tied && !keeps_packed => bytes.saturating_add(t.range.len() as u64),
        _ => bytes,
    }
}

impl RawTensor {
    /// Uploads the tensor from its `file` to `device`: f32, f16 and block formats as they
    /// are, bf16 as it is where the device keeps it ([`keeps_bf16`]), else widened to f32.
    pub fn to_device(&self, device: &Device, file: &Arc<FileBytes>) -> Result<Tensor> {
        let (dtype, data) = self.device_bytes(file, keeps_bf16(device, &self.shape))?;
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
        webtensor::quant::dequantize(format, data, &mut out);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(dtype: StoredDType, shape: &[usize], stored: usize) -> RawTensor {
        RawTensor {
            dtype,
            shape: shape.to_vec(),
            range: 1000..1000 + stored,
        }
    }

    #[test]
    fn gpu_sizes_widen_the_embedding_and_ragged_bf16_and_host_sizes_keep_them() {
        let q4 = StoredDType::Packed(DType::Q4_0);
        // A Q4_0 table of 64 × 32 values: 18 bytes a block of 32.
        let embedding = tensor(q4, &[64, 32], 64 * 18);
        // bf16 rows of 40 values are not whole groups of 32: the GPUs widen them.
        let bf16 = tensor(StoredDType::BF16, &[32, 40], 32 * 40 * 2);
        let grouped = tensor(StoredDType::BF16, &[32, 64], 32 * 64 * 2);
        assert_eq!(
            loaded_bytes("blk.0.attn_q.weight", &grouped, false),
            32 * 64 * 2
        );
        assert_eq!(
            loaded_bytes("token_embd.weight", &embedding, false),
            64 * 32 * 4
        );
        assert_eq!(
            loaded_bytes("model.embed_tokens.weight", &embedding, false),
            64 * 32 * 4
        );
        assert_eq!(loaded_bytes("token_embd.weight", &embedding, true), 64 * 18);
        assert_eq!(
            loaded_bytes("blk.0.attn_q.weight", &bf16, false),
            32 * 40 * 4
        );
        assert_eq!(
            loaded_bytes("blk.0.attn_q.weight", &bf16, true),
            32 * 40 * 2
        );
        assert_eq!(
            loaded_bytes("blk.0.attn_q.weight", &embedding, false),
            64 * 18
        );
    }

    #[test]
    fn a_tied_head_is_the_table_again_where_the_table_was_widened() {
        let q4 = StoredDType::Packed(DType::Q4_0);
        let embedding = tensor(q4, &[64, 32], 64 * 18);
        let head = tensor(q4, &[64, 32], 64 * 18);
        let norm = tensor(StoredDType::F32, &[32], 128);
        let layer = tensor(q4, &[32, 32], 32 * 18);
        let untied = [
            ("blk.0.attn_q.weight", &layer),
            ("output.weight", &head),
            ("output_norm.weight", &norm),
            ("token_embd.weight", &embedding),
        ];
        let tied = [
            ("blk.0.attn_q.weight", &layer),
            ("output_norm.weight", &norm),
            ("token_embd.weight", &embedding),
        ];
        // The layer's tensor is left out; the table widened, the head as stored.
        assert_eq!(
            outside_layers_bytes(untied, false),
            64 * 32 * 4 + 64 * 18 + 128
        );
        assert_eq!(
            outside_layers_bytes(tied, false),
            64 * 32 * 4 + 64 * 18 + 128
        );
        // On a host backend the head reads the table's own stored bytes.
        assert_eq!(outside_layers_bytes(untied, true), 2 * 64 * 18 + 128);
        assert_eq!(outside_layers_bytes(tied, true), 64 * 18 + 128);
    }
}
