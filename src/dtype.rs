//! [`DType`]: the element types of tensors and their storage layout.
//!
//! A leaf module: it imports nothing from the crate, so the error type, the backends and the
//! device can all name a dtype without depending on [`crate::tensor`].

use std::fmt;

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
