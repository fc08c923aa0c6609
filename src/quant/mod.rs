//! Block formats shared by every backend: byte layouts, quantize (f32 → blocks) and
//! dequantize (blocks → f32), bit for bit as GGUF defines them.
//!
//! | dtype | values/block | bytes/block | layout (little-endian) |
//! | --- | --- | --- | --- |
//! | `F16` | 1 | 2 | IEEE binary16 |
//! | `Q8_0` | 32 | 34 | `d: f16`, `qs: [i8; 32]`; value `i` = `d · qs[i]` |
//! | `Q4_0` | 32 | 18 | `d: f16`, `qs: [u8; 16]`; value `i < 16` = `d · ((qs[i] & 15) − 8)`, value `i + 16` = `d · ((qs[i] >> 4) − 8)` |
//! | `TQ1_0` | 256 | 54 | `qs: [u8; 48]`, `qh: [u8; 4]`, `d: f16`; five (four in `qh`) base-3 trits per byte, see [`ternary`] |
//! | `TQ2_0` | 256 | 66 | `qs: [u8; 64]`, `d: f16`; value `32·(4j + l) + m` in bits `2l..2l+2` of `qs[32j + m]`, stored as trit + 1 |
//! | `TernaryPlanes` | 256 | 68 | `d: f32`, `plus: [u32; 8]`, `minus: [u32; 8]`; bit `i % 32` of word `i / 32` |
//!
//! Quantization follows the GGUF reference quantizers (ggml's `quantize_row_*_ref`, also
//! `gguf.quants` in gguf-py): per block `Q8_0` uses `d = max|x| / 127` and
//! `round(x · (1/d))`, `Q4_0` uses `d = m / −8` where `m` is the value of largest magnitude
//! and `min(15, trunc(x · (1/d) + 8.5))`, and the ternary formats use `d = max|x|` and
//! `round(x · (1/d))`; all arithmetic is f32, `round` is half away from zero, and scales are
//! rounded to f16 to nearest even. `TernaryPlanes` rounds like the ternary formats but keeps
//! the f32 scale. The tests check every format against bytes written by gguf-py
//! (`scripts/quant_fixtures.py`).
//!
//! The per-row activation quantization of [`crate::ops::Activations`] lives here too:
//! [`quantize_i8`] is `Q8_0`'s rounding over any block length.

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

/// Quantizes whole rows: `x.len()` is a multiple of `format`'s block length and `out` holds
/// `x.len() / block_len · block_bytes` bytes. `format` is `F16`, `I8` is not a target (it
/// has no scale), and every block format.
pub fn quantize(format: DType, x: &[f32], out: &mut [u8]) {
    let (len, bytes) = (format.block_len(), format.block_bytes());
    for (xb, ob) in x.chunks_exact(len).zip(out.chunks_exact_mut(bytes)) {
        quantize_block(format, xb, ob);
    }
}

/// Dequantizes whole blocks of `format` (any packed dtype but `I8`) into `out`.
pub fn dequantize(format: DType, bytes: &[u8], out: &mut [f32]) {
    if format == DType::F16 {
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = f16_value(u16::from_le_bytes([b[0], b[1]]));
        }
        return;
    }
    let (len, size) = (format.block_len(), format.block_bytes());
    for (b, o) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(len)) {
        dequantize_block(format, b, o);
    }
}

/// One block (one value for `F16`).
pub fn quantize_block(format: DType, x: &[f32], out: &mut [u8]) {
    match format {
        DType::F16 => out.copy_from_slice(&f16_bits(x[0]).to_le_bytes()),
        DType::Q8_0 => {
            let mut q = [0i8; 32];
            let d = quantize_i8(x, &mut q);
            out[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
            for (o, v) in out[2..].iter_mut().zip(q) {
                *o = v as u8;
            }
        }
        DType::Q4_0 => quantize_q4_0(x, out),
        DType::TQ1_0 | DType::TQ2_0 | DType::TernaryPlanes => {
            ternary::quantize_block(format, x, out)
        }
        _ => unreachable!("{format} is not a quantization target"),
    }
}

/// One block (one value for `F16`).
pub fn dequantize_block(format: DType, bytes: &[u8], out: &mut [f32]) {
    match format {
        DType::F16 => out[0] = read_f16(bytes, 0),
        DType::Q8_0 | DType::Q4_0 => {
            let mut q = [0i8; 32];
            let d = block_ints(format, bytes, &mut q);
            for (o, v) in out.iter_mut().zip(q) {
                *o = v as f32 * d;
            }
        }
        DType::TQ1_0 | DType::TQ2_0 | DType::TernaryPlanes => {
            let mut t = [0i8; 256];
            let d = ternary::block_trits(format, bytes, &mut t);
            for (o, v) in out.iter_mut().zip(t) {
                *o = v as f32 * d;
            }
        }
        _ => unreachable!("{format} has no dequantization"),
    }
}

/// Integer values and scale of one `Q8_0` or `Q4_0` block: `value[i] = d · q[i]`.
pub fn block_ints(format: DType, bytes: &[u8], q: &mut [i8; 32]) -> f32 {
    let d = read_f16(bytes, 0);
    match format {
        DType::Q8_0 => {
            for (o, &b) in q.iter_mut().zip(&bytes[2..34]) {
                *o = b as i8;
            }
        }
        _ => {
            for (i, &b) in bytes[2..18].iter().enumerate() {
                q[i] = (b & 15) as i8 - 8;
                q[i + 16] = (b >> 4) as i8 - 8;
            }
        }
    }
    d
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
