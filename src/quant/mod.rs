//! Block formats shared by every backend: byte layouts, quantize (f32 → blocks) and
//! dequantize (blocks → f32), bit for bit as GGUF defines them.
//!
//! A block format is one row of [`FORMATS`]: its dtype (block length and bytes in
//! [`DType`]), its ggml type id in GGUF files, its dequantize and, where GGUF's reference
//! quantizer is implemented, its quantize. The formats laid out as typed block structs
//! ([`Block`]) have their struct size checked against [`DType::block_bytes`] when the table is
//! compiled.
//!
//! | dtype | values/block | bytes/block | layout (little-endian) |
//! | --- | --- | --- | --- |
//! | `F16` | 1 | 2 | IEEE binary16 |
//! | `Q8_0` | 32 | 34 | `d: f16`, `qs: [i8; 32]`; value `i` = `d · qs[i]` |
//! | `Q4_0` | 32 | 18 | `d: f16`, `qs: [u8; 16]`; value `i < 16` = `d · ((qs[i] & 15) − 8)`, value `i + 16` = `d · ((qs[i] >> 4) − 8)` |
//! | `Q4_1`, `Q5_0`, `Q5_1`, `IQ4_NL` | 32 | 20, 22, 24, 18 | see [`legacy`] |
//! | `Q2_K` … `Q6_K`, `IQ4_XS` | 256 | 84, 110, 144, 176, 210, 136 | see [`kquants`] |
//! | `TQ1_0` | 256 | 54 | `qs: [u8; 48]`, `qh: [u8; 4]`, `d: f16`; five (four in `qh`) base-3 trits per byte, see [`ternary`] |
//! | `TQ2_0` | 256 | 66 | `qs: [u8; 64]`, `d: f16`; value `32·(4j + l) + m` in bits `2l..2l+2` of `qs[32j + m]`, stored as trit + 1 |
//! | `TernaryPlanes` | 256 | 68 | `d: f32`, `plus: [u32; 8]`, `minus: [u32; 8]`; bit `i % 32` of word `i / 32` |
//!
//! Quantization follows the GGUF reference quantizers (ggml's `quantize_row_*_ref`, also
//! `gguf.quants` in gguf-py): per block `Q8_0` uses `d = max|x| / 127` and
//! `round(x · (1/d))`, `Q4_0` uses `d = m / −8` where `m` is the value of largest magnitude
//! and `min(15, trunc(x · (1/d) + 8.5))` (`Q4_1`, `Q5_0`, `Q5_1`: [`legacy`]), and the ternary
//! formats use `d = max|x|` and `round(x · (1/d))`; all arithmetic is f32, `round` is half
//! away from zero, and scales are rounded to f16 to nearest even. `TernaryPlanes` rounds like
//! the ternary formats but keeps the f32 scale. The K-quants and the `IQ4` formats are read,
//! not written (gguf-py has no quantizer for them either). A scale that is NaN or infinite
//! is not an error: its block's values are what GGUF's arithmetic gives (NaN or ±∞), as in
//! gguf-py and llama.cpp. The tests check every format against values and bytes written by
//! gguf-py (`scripts/quant_fixtures.py`).
//!
//! The per-row activation quantization of [`crate::ops::Activations`] lives here too:
//! [`quantize_i8`] is `Q8_0`'s rounding over any block length.

pub mod kquants;
pub mod legacy;
pub mod ternary;

use std::sync::OnceLock;

use half::f16;

use crate::dtype::DType;

/// `x` rounded to f16 (to nearest even), as its bits.
pub fn f16_bits(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// The f32 value of f16 `bits` (exact), from a table of all 65,536 values built on first use
/// (256 KiB; converting in software per value would dominate f16 and block-scale decoding).
pub fn f16_value(bits: u16) -> f32 {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    let table = TABLE.get_or_init(|| (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect());
    table[bits as usize]
}

/// Reads the f16 at `bytes[at..at + 2]`.
pub fn read_f16(bytes: &[u8], at: usize) -> f32 {
    f16_value(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// The GGUF scale rule of `Q8_0` (and of the int8 activations): `d = max|x| / 127`, then
/// `q = round(x · (1/d))` with `1/d` in f32 (0 when `d` is 0). Returns `d`.
pub fn quantize_i8(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    d
}

/// llama.cpp's `Q8_K` rounding of activations (`quantize_row_q8_K_ref`), for 256 values: from
/// the signed value of largest magnitude `max` (the first on ties), `s = −127 / max`, each
/// `q = min(127, round_half_even(x · s))`, and `d = 1 / s`, all in f32; a block of zeros has
/// `d = 0`. Returns `d`.
pub fn quantize_q8_k(x: &[f32], q: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * iscale).round_ties_even() as i32).min(127) as i8;
    }
    1.0 / iscale
}

/// Encodes one block of values into a format's bytes.
pub type QuantizeFn = fn(&[f32], &mut [u8]);

/// Rounds values to int8 (`q`) and returns their scale: an activation rounding.
pub type RoundFn = fn(&[f32], &mut [i8]) -> f32;

/// One block format: everything a backend or a file reader needs to know of it.
pub struct Format {
    /// The dtype (its block length and bytes: [`DType::block_len`], [`DType::block_bytes`]).
    pub dtype: DType,
    /// ggml's type id, as GGUF files name the format.
    pub ggml_type: Option<u32>,
    /// Decodes one block of [`DType::block_bytes`] bytes into [`DType::block_len`] values.
    pub dequantize: fn(&[u8], &mut [f32]),
    /// Encodes one block of values, where webtensor has GGUF's reference quantizer.
    pub quantize: Option<QuantizeFn>,
    /// Byte offsets of the block's f16 scales (`d`, and `dmin` where it has one): what a
    /// block of random bytes needs set to a finite value to stand for real weights (tests and
    /// benchmarks of the formats without a quantizer).
    pub f16_scales: &'static [usize],
}

/// A block format laid out as a plain struct of bytes: reading a block is a cast.
pub trait Block: bytemuck::Pod {
    /// The format.
    const DTYPE: DType;
    /// Writes the block's [`DType::block_len`] values into `out`.
    fn dequantize(&self, out: &mut [f32]);
}

/// Decodes one block of `B`'s bytes.
fn dequantize_as<B: Block>(bytes: &[u8], out: &mut [f32]) {
    bytemuck::from_bytes::<B>(bytes).dequantize(out)
}

/// The row of a [`Block`] format; fails to compile when the struct is not the dtype's size.
const fn row<B: Block>(
    ggml_type: u32,
    quantize: Option<QuantizeFn>,
    f16_scales: &'static [usize],
) -> Format {
    assert!(std::mem::size_of::<B>() == B::DTYPE.block_bytes());
    Format {
        dtype: B::DTYPE,
        ggml_type: Some(ggml_type),
        dequantize: dequantize_as::<B>,
        quantize,
        f16_scales,
    }
}

/// Every block format (and `F16` and `BF16`, one value a block), one row each.
pub static FORMATS: [Format; 17] = [
    Format {
        dtype: DType::F16,
        ggml_type: Some(1),
        dequantize: |b, out| out[0] = read_f16(b, 0),
        quantize: Some(|x, out| out.copy_from_slice(&f16_bits(x[0]).to_le_bytes())),
        f16_scales: &[],
    },
    Format {
        dtype: DType::BF16,
        ggml_type: Some(30),
        dequantize: |b, out| out[0] = bf16_value(u16::from_le_bytes([b[0], b[1]])),
        quantize: None,
        f16_scales: &[],
    },
    Format {
        dtype: DType::Q8_0,
        ggml_type: Some(8),
        dequantize: |b, out| dequantize_ints(DType::Q8_0, b, out),
        quantize: Some(quantize_q8_0),
        f16_scales: &[0],
    },
    Format {
        dtype: DType::Q4_0,
        ggml_type: Some(2),
        dequantize: |b, out| dequantize_ints(DType::Q4_0, b, out),
        quantize: Some(quantize_q4_0),
        f16_scales: &[0],
    },
    row::<legacy::BlockQ4_1>(3, Some(legacy::quantize_q4_1), &[0, 2]),
    row::<legacy::BlockQ5_0>(6, Some(legacy::quantize_q5_0), &[0]),
    row::<legacy::BlockQ5_1>(7, Some(legacy::quantize_q5_1), &[0, 2]),
    row::<kquants::BlockQ2K>(10, None, &[80, 82]),
    row::<kquants::BlockQ3K>(11, None, &[108]),
    row::<kquants::BlockQ4K>(12, None, &[0, 2]),
    row::<kquants::BlockQ5K>(13, None, &[0, 2]),
    row::<kquants::BlockQ6K>(14, None, &[208]),
    row::<legacy::BlockIq4Nl>(20, None, &[0]),
    row::<kquants::BlockIq4Xs>(23, None, &[0]),
    Format {
        dtype: DType::TQ1_0,
        ggml_type: Some(34),
        dequantize: |b, out| dequantize_trits(DType::TQ1_0, b, out),
        quantize: Some(|x, out| ternary::quantize_block(DType::TQ1_0, x, out)),
        f16_scales: &[52],
    },
    Format {
        dtype: DType::TQ2_0,
        ggml_type: Some(35),
        dequantize: |b, out| dequantize_trits(DType::TQ2_0, b, out),
        quantize: Some(|x, out| ternary::quantize_block(DType::TQ2_0, x, out)),
        f16_scales: &[64],
    },
    Format {
        dtype: DType::TernaryPlanes,
        ggml_type: None,
        dequantize: |b, out| dequantize_trits(DType::TernaryPlanes, b, out),
        quantize: Some(|x, out| ternary::quantize_block(DType::TernaryPlanes, x, out)),
        // Its scale is an f32.
        f16_scales: &[],
    },
];

/// The row of `dtype`, if it is `F16` or a block format.
pub fn format(dtype: DType) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.dtype == dtype)
}

/// Whether `dtype` is a packed weight format, one of [`FORMATS`]: f16, bf16 or a block format.
/// Products with such a weight read it packed (`qmatmul_t`).
pub fn is_weight_format(dtype: DType) -> bool {
    format(dtype).is_some()
}

/// The row of ggml type id `ggml_type`, if webtensor reads that format.
pub fn format_of_ggml(ggml_type: u32) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.ggml_type == Some(ggml_type))
}

/// Whether webtensor can quantize to `format` (GGUF's reference quantizer is implemented).
pub fn can_quantize(format: DType) -> bool {
    self::format(format).is_some_and(|f| f.quantize.is_some())
}

/// The formats [`can_quantize`] accepts, by name, for messages.
pub fn quantize_targets() -> String {
    FORMATS
        .iter()
        .filter(|f| f.quantize.is_some())
        .map(|f| f.dtype.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `format`'s blocks are int8 values times one scale per 32 values
/// ([`block_ints`]): the formats whose products take `Q8_0` activations in integers.
pub fn has_block_ints(format: DType) -> bool {
    matches!(
        format,
        DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4_NL
    )
}

/// Whether `format`'s blocks are int8 values with one scale and one minimum per 32 values
/// ([`block_offset_ints`]: `Q4_1`, `Q5_1`), which take `Q8_0` activations in integers too:
/// `Σ a · (d · q + m) = d · Σ a · q + m · Σ a` (llama.cpp's `Q8_1` carries `Σ a` with them).
pub fn has_offset_ints(format: DType) -> bool {
    matches!(format, DType::Q4_1 | DType::Q5_1)
}

/// Integer values, scale and minimum of one block of a format with [`has_offset_ints`]:
/// `value[i] = d · q[i] + m`.
pub fn block_offset_ints(format: DType, bytes: &[u8], q: &mut [i8; 32]) -> (f32, f32) {
    legacy::offset_ints(format, bytes, q)
}

/// Quantizes whole rows: `x.len()` is a multiple of `format`'s block length and `out` holds
/// `x.len() / block_len · block_bytes` bytes. `format` is one that [`can_quantize`].
pub fn quantize(format: DType, x: &[f32], out: &mut [u8]) {
    let (len, bytes) = (format.block_len(), format.block_bytes());
    let encode = self::format(format)
        .and_then(|f| f.quantize)
        .unwrap_or_else(|| unreachable!("{format} is not a quantization target"));
    for (xb, ob) in x.chunks_exact(len).zip(out.chunks_exact_mut(bytes)) {
        encode(xb, ob);
    }
}

/// Dequantizes whole blocks of `format` (any row of [`FORMATS`]) into `out`.
pub fn dequantize(format: DType, bytes: &[u8], out: &mut [f32]) {
    // Per value, without the row's call through a pointer: f16 and bf16 weights decode here.
    fn widen_halves(bytes: &[u8], out: &mut [f32], widen: impl Fn(u16) -> f32) {
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = widen(u16::from_le_bytes([b[0], b[1]]));
        }
    }
    match format {
        DType::F16 => return widen_halves(bytes, out, f16_value),
        DType::BF16 => return widen_halves(bytes, out, bf16_value),
        _ => {}
    }
    let (len, size) = (format.block_len(), format.block_bytes());
    let decode = self::format(format)
        .map(|f| f.dequantize)
        .unwrap_or_else(|| unreachable!("{format} has no dequantization"));
    for (b, o) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(len)) {
        decode(b, o);
    }
}

/// The f32 a bfloat16 stands for: its bits are the f32's high half (exact).
pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `d · q` of `Q8_0` or `Q4_0` ([`block_ints`]).
fn dequantize_ints(format: DType, bytes: &[u8], out: &mut [f32]) {
    let mut q = [0i8; 32];
    let d = block_ints(format, bytes, &mut q);
    for (o, v) in out.iter_mut().zip(q) {
        *o = v as f32 * d;
    }
}

/// `d · trit` of a ternary format.
fn dequantize_trits(format: DType, bytes: &[u8], out: &mut [f32]) {
    let mut t = [0i8; ternary::BLOCK];
    let d = ternary::block_trits(format, bytes, &mut t);
    for (o, v) in out.iter_mut().zip(t) {
        *o = v as f32 * d;
    }
}

/// GGUF `Q8_0`: [`quantize_i8`] with the scale rounded to f16.
fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    let mut q = [0i8; 32];
    let d = quantize_i8(x, &mut q);
    out[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
    for (o, v) in out[2..].iter_mut().zip(q) {
        *o = v as u8;
    }
}

/// Integer values and scale of one block of a format with [`has_block_ints`] (`Q8_0`,
/// `Q4_0`, `Q5_0`, `IQ4_NL`): `value[i] = d · q[i]`.
pub fn block_ints(format: DType, bytes: &[u8], q: &mut [i8; 32]) -> f32 {
    match format {
        DType::Q8_0 => {
            for (o, &b) in q.iter_mut().zip(&bytes[2..34]) {
                *o = b as i8;
            }
        }
        DType::Q4_0 => {
            for (i, &b) in bytes[2..18].iter().enumerate() {
                q[i] = (b & 15) as i8 - 8;
                q[i + 16] = (b >> 4) as i8 - 8;
            }
        }
        DType::Q5_0 => return legacy::q5_0_ints(bytes, q),
        DType::IQ4_NL => return legacy::iq4_nl_ints(bytes, q),
        _ => unreachable!("{format} has no int8 values with one scale per 32"),
    }
    read_f16(bytes, 0)
}

/// GGUF `Q4_0`: the signed value of largest magnitude `m` (the first one on ties) gives
/// `d = m / −8`; each value becomes `min(15, trunc(x · (1/d) + 8.5))` with two f32 roundings.
fn quantize_q4_0(x: &[f32], out: &mut [u8]) {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
    let level = |v: f32| ((v * id) + 8.5).trunc().clamp(0.0, 15.0) as u8;
    for j in 0..16 {
        out[2 + j] = level(x[j]) | (level(x[j + 16]) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_rounds_ties_away_from_zero() {
        // max 127 makes d = 1, so each value is rounded on its own.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.49999997;
        let mut q = [0i8; 32];
        assert_eq!(quantize_i8(&x, &mut q), 1.0);
        assert_eq!(&q[..4], &[127, 3, -3, 0]);
    }

    /// llama.cpp's `Q8_K`: the scale from the signed largest value, ties to even.
    #[test]
    fn q8_k_rounds_ties_to_even() {
        let mut x = [0f32; 256];
        x[0] = -127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        x[3] = 127.0;
        let mut q = [0i8; 256];
        // s = −127 / −127 = 1.
        assert_eq!(quantize_q8_k(&x, &mut q), 1.0);
        assert_eq!(&q[..4], &[-127, 2, -4, 127]);
        x[0] = 127.0;
        x[3] = 0.0;
        // s = −1: the signs flip, d = −1.
        assert_eq!(quantize_q8_k(&x, &mut q), -1.0);
        assert_eq!(&q[..3], &[-127, -2, 4]);
        assert_eq!(quantize_q8_k(&[0.0; 256], &mut q), 0.0);
        assert!(q.iter().all(|&v| v == 0));
    }

    #[test]
    fn q4_0_takes_the_sign_of_the_largest_value() {
        let mut x = [0.5f32; 32];
        x[5] = -4.0;
        let mut b = [0u8; 18];
        quantize(DType::Q4_0, &x, &mut b);
        assert_eq!(read_f16(&b, 0), 0.5);
        let mut y = [0f32; 32];
        dequantize(DType::Q4_0, &b, &mut y);
        assert_eq!(y[5], -4.0);
        assert_eq!(y[0], 0.5);
    }
}
