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
/// length. See [`crate::quant`] for each layout ([`crate::quant::FORMATS`]: one row per
/// block format).
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
    /// bfloat16 (the high half of an f32), 2 bytes per value: Hugging Face's and GGUF's
    /// `BF16` weights kept as stored.
    BF16,
    /// 8-bit signed integer: quantized activations.
    I8,
    /// GGUF `Q8_0`: blocks of 32 values, an f16 scale and 32 `i8` (34 bytes, 8.5 bits/value).
    Q8_0,
    /// GGUF `Q4_0`: blocks of 32 values, an f16 scale and 16 bytes of 4-bit values
    /// (18 bytes, 4.5 bits/value).
    Q4_0,
    /// GGUF `Q4_1`: blocks of 32 4-bit values with an f16 scale and an f16 minimum (20 bytes).
    Q4_1,
    /// GGUF `Q5_0`: blocks of 32 5-bit values (low nibbles and a word of fifth bits) with an
    /// f16 scale (22 bytes).
    Q5_0,
    /// GGUF `Q5_1`: `Q5_0`'s values with an f16 scale and an f16 minimum (24 bytes).
    Q5_1,
    /// GGUF `Q2_K`: super-blocks of 256 2-bit values, 16 sub-blocks with 4-bit scales and
    /// minimums, f16 super-scales (84 bytes, 2.625 bits/value).
    Q2_K,
    /// GGUF `Q3_K`: super-blocks of 256 3-bit values, 16 sub-blocks with 6-bit scales, an f16
    /// super-scale (110 bytes, 3.4375 bits/value).
    Q3_K,
    /// GGUF `Q4_K`: super-blocks of 256 4-bit values, 8 sub-blocks with 6-bit scales and
    /// minimums, f16 super-scales (144 bytes, 4.5 bits/value).
    Q4_K,
    /// GGUF `Q5_K`: `Q4_K` with a fifth bit per value (176 bytes, 5.5 bits/value).
    Q5_K,
    /// GGUF `Q6_K`: super-blocks of 256 6-bit values, 16 sub-blocks with int8 scales, an f16
    /// super-scale (210 bytes, 6.5625 bits/value).
    Q6_K,
    /// GGUF `IQ4_NL`: blocks of 32 4-bit indices into a fixed non-linear table of 16 levels,
    /// an f16 scale (18 bytes, 4.5 bits/value).
    IQ4_NL,
    /// GGUF `IQ4_XS`: super-blocks of 256 `IQ4_NL` indices, 8 sub-blocks with 6-bit scales, an
    /// f16 super-scale (136 bytes, 4.25 bits/value).
    IQ4_XS,
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
    pub const ALL: [DType; 21] = [
        DType::F32,
        DType::U32,
        DType::I32,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
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

    /// Values per block: 1 for plain types, 32 for the legacy formats (`Q8_0`, `Q4_0`, `Q4_1`,
    /// `Q5_0`, `Q5_1`) and `IQ4_NL`, 256 for the K-quants, `IQ4_XS` and the ternary formats.
    pub const fn block_len(self) -> usize {
        match self {
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4_NL => {
                32
            }
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::IQ4_XS
            | DType::TQ1_0
            | DType::TQ2_0
            | DType::TernaryPlanes => 256,
            DType::F32 | DType::U32 | DType::I32 | DType::F16 | DType::BF16 | DType::I8 => 1,
        }
    }

    /// Bytes per block (per element for plain types).
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 => 1,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::IQ4_NL => 18,
            DType::IQ4_XS => 136,
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
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q2_K => "q2_k",
            DType::Q3_K => "q3_k",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
            DType::IQ4_NL => "iq4_nl",
            DType::IQ4_XS => "iq4_xs",
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
