//! The 32-value GGUF formats beside `Q8_0`/`Q4_0`: `Q4_1`, `Q5_0`, `Q5_1` and `IQ4_NL`.
//!
//! Each block is a `#[repr(C)]` struct of byte arrays whose size the format table checks
//! against [`DType::block_bytes`] at compile time ([`super::FORMATS`]). Value `i < 16` sits in
//! the low nibble of `qs[i]`, value `i + 16` in its high nibble (as in `Q4_0`); the 5-bit
//! formats keep each value's fifth bit in bit `i` of the little-endian word `qh`.
//!
//! Dequantization is gguf-py's, in f32: `d · q` for the symmetric formats (`Q5_0`: `q − 16`,
//! `IQ4_NL`: the table level [`IQ4_NL_LEVELS`]`[q]`), `(d · q) + m` (two roundings) for the
//! formats with a minimum. Each block is read as its integers first, which the integer
//! products read too. Quantization follows GGUF's reference quantizers: `Q5_0` as `Q4_0`
//! with 16 levels a side (`d = m / −16`, `min(31, trunc(x · (1/d) + 16.5))`), `Q4_1` and
//! `Q5_1` with `d = (max − min) / 15` (or `/ 31`) and `trunc((x − min) · (1/d) + 0.5)`.

use bytemuck::{Pod, Zeroable};

use super::{f16_bits, f16_value, Block};
use crate::dtype::DType;

/// The 16 levels of `IQ4_NL` (and `IQ4_XS`), a non-uniform grid fitted to weight
/// distributions; an index selects one.
pub const IQ4_NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `Q4_1`: `d`, `m` (f16), 32 nibbles; value = `(d · q) + m`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_1 {
    d: [u8; 2],
    m: [u8; 2],
    qs: [u8; 16],
}

/// `Q5_0`: `d` (f16), fifth bits `qh`, 32 nibbles; value = `d · (q − 16)`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_0 {
    d: [u8; 2],
    qh: [u8; 4],
    qs: [u8; 16],
}

/// `Q5_1`: `d`, `m` (f16), fifth bits `qh`, 32 nibbles; value = `(d · q) + m`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_1 {
    d: [u8; 2],
    m: [u8; 2],
    qh: [u8; 4],
    qs: [u8; 16],
}

/// `IQ4_NL`: `d` (f16), 32 nibble indices; value = `d · IQ4_NL_LEVELS[q]`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq4Nl {
    d: [u8; 2],
    qs: [u8; 16],
}

fn half(b: [u8; 2]) -> f32 {
    f16_value(u16::from_le_bytes(b))
}

/// The 32 4-bit values of `qs`, value `i < 16` in the low nibble of byte `i`.
fn nibbles(qs: &[u8; 16]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (i, &b) in qs.iter().enumerate() {
        q[i] = b & 15;
        q[i + 16] = b >> 4;
    }
    q
}

/// The 32 5-bit values of `qs` and `qh`.
fn five_bits(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let high = u32::from_le_bytes(qh);
    let mut q = nibbles(qs);
    for (i, v) in q.iter_mut().enumerate() {
        *v |= (((high >> i) & 1) as u8) << 4;
    }
    q
}

impl BlockQ4_1 {
    /// Integer values `q` in `0..16`, the scale and the minimum: `value[i] = d · q[i] + m`.
    fn ints(&self, q: &mut [i8; 32]) -> (f32, f32) {
        for (o, v) in q.iter_mut().zip(nibbles(&self.qs)) {
            *o = v as i8;
        }
        (half(self.d), half(self.m))
    }
}

impl BlockQ5_1 {
    /// Integer values `q` in `0..32`, the scale and the minimum: `value[i] = d · q[i] + m`.
    fn ints(&self, q: &mut [i8; 32]) -> (f32, f32) {
        for (o, v) in q.iter_mut().zip(five_bits(&self.qs, self.qh)) {
            *o = v as i8;
        }
        (half(self.d), half(self.m))
    }
}

/// `(d · q) + m` from a block's integer values, as gguf-py computes them (two f32 roundings).
fn offset((d, m): (f32, f32), q: &[i8; 32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(q) {
        *o = d * v as f32 + m;
    }
}

impl Block for BlockQ4_1 {
    const DTYPE: DType = DType::Q4_1;
    fn dequantize(&self, out: &mut [f32]) {
        let mut q = [0i8; 32];
        offset(self.ints(&mut q), &q, out);
    }
}

impl Block for BlockQ5_1 {
    const DTYPE: DType = DType::Q5_1;
    fn dequantize(&self, out: &mut [f32]) {
        let mut q = [0i8; 32];
        offset(self.ints(&mut q), &q, out);
    }
}

/// Integer values, scale and minimum of a `Q4_1` or `Q5_1` block (see
/// [`super::block_offset_ints`]).
pub fn offset_ints(format: DType, bytes: &[u8], q: &mut [i8; 32]) -> (f32, f32) {
    match format {
        DType::Q4_1 => bytemuck::from_bytes::<BlockQ4_1>(bytes).ints(q),
        DType::Q5_1 => bytemuck::from_bytes::<BlockQ5_1>(bytes).ints(q),
        _ => unreachable!("{format} has no minimum per block"),
    }
}

impl BlockQ5_0 {
    /// Integer values `q` in `−16..16` and the scale: `value[i] = d · q[i]`.
    fn ints(&self, q: &mut [i8; 32]) -> f32 {
        for (o, v) in q.iter_mut().zip(five_bits(&self.qs, self.qh)) {
            *o = v as i8 - 16;
        }
        half(self.d)
    }
}

impl BlockIq4Nl {
    /// Integer values `q` (table levels) and the scale: `value[i] = d · q[i]`.
    fn ints(&self, q: &mut [i8; 32]) -> f32 {
        for (o, v) in q.iter_mut().zip(nibbles(&self.qs)) {
            *o = IQ4_NL_LEVELS[v as usize];
        }
        half(self.d)
    }
}

/// `d · q` from a block's integer values, as gguf-py computes them (one f32 product).
fn scaled(d: f32, q: &[i8; 32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(q) {
        *o = v as f32 * d;
    }
}

impl Block for BlockQ5_0 {
    const DTYPE: DType = DType::Q5_0;
    fn dequantize(&self, out: &mut [f32]) {
        let mut q = [0i8; 32];
        let d = self.ints(&mut q);
        scaled(d, &q, out);
    }
}

impl Block for BlockIq4Nl {
    const DTYPE: DType = DType::IQ4_NL;
    fn dequantize(&self, out: &mut [f32]) {
        let mut q = [0i8; 32];
        let d = self.ints(&mut q);
        scaled(d, &q, out);
    }
}

/// Integer values and scale of a `Q5_0` block (see [`super::block_ints`]).
pub fn q5_0_ints(bytes: &[u8], q: &mut [i8; 32]) -> f32 {
    bytemuck::from_bytes::<BlockQ5_0>(bytes).ints(q)
}

/// Integer values and scale of an `IQ4_NL` block (see [`super::block_ints`]).
pub fn iq4_nl_ints(bytes: &[u8], q: &mut [i8; 32]) -> f32 {
    bytemuck::from_bytes::<BlockIq4Nl>(bytes).ints(q)
}

/// The first value of largest magnitude, with its sign (GGUF's symmetric scale rule).
fn signed_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `1/d` in f32, 0 when `d` is 0.
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Packs 32 values below 32 into `qs` (low four bits) and `qh` (the fifth bits).
fn pack_five_bits(q: &[u8; 32], qs: &mut [u8], qh: &mut [u8]) {
    let mut high = 0u32;
    for (i, &v) in q.iter().enumerate() {
        high |= ((v >> 4) as u32 & 1) << i;
    }
    qh.copy_from_slice(&high.to_le_bytes());
    for j in 0..16 {
        qs[j] = (q[j] & 15) | ((q[j + 16] & 15) << 4);
    }
}

/// GGUF `Q5_0`: `d = m / −16` from the signed value of largest magnitude `m`, each value
/// `min(31, trunc(x · (1/d) + 16.5))`.
pub fn quantize_q5_0(x: &[f32], out: &mut [u8]) {
    let d = signed_max(x) / -16.0;
    let id = inverse(d);
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id) + 16.5).trunc().clamp(0.0, 31.0) as u8;
    }
    out[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
    let (qh, qs) = out[2..].split_at_mut(4);
    pack_five_bits(&q, qs, qh);
}

/// The asymmetric rule of `Q4_1` and `Q5_1` with `top` the largest level: `d = (max −
/// min) / top`, each value `min(top, trunc((x − min) · (1/d) + 0.5))`; returns `(d, min)`.
fn asymmetric(x: &[f32], top: f32, q: &mut [u8; 32]) -> (f32, f32) {
    let max = x.iter().copied().fold(x[0], f32::max);
    let min = x.iter().copied().fold(x[0], f32::min);
    let d = (max - min) / top;
    let id = inverse(d);
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v - min) * id + 0.5).trunc().clamp(0.0, top) as u8;
    }
    (d, min)
}

/// GGUF `Q4_1`.
pub fn quantize_q4_1(x: &[f32], out: &mut [u8]) {
    let mut q = [0u8; 32];
    let (d, min) = asymmetric(x, 15.0, &mut q);
    out[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
    out[2..4].copy_from_slice(&f16_bits(min).to_le_bytes());
    for j in 0..16 {
        out[4 + j] = q[j] | (q[j + 16] << 4);
    }
}

/// GGUF `Q5_1`.
pub fn quantize_q5_1(x: &[f32], out: &mut [u8]) {
    let mut q = [0u8; 32];
    let (d, min) = asymmetric(x, 31.0, &mut q);
    out[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
    out[2..4].copy_from_slice(&f16_bits(min).to_le_bytes());
    let (qh, qs) = out[4..].split_at_mut(4);
    pack_five_bits(&q, qs, qh);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize, quantize};

    #[test]
    fn five_bit_values_keep_their_high_bit() {
        // Levels 0..32 exactly: d = 1 after x / −16 with max −16 ... 15 rounds back.
        let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
        let mut b = [0u8; 22];
        quantize(DType::Q5_0, &x, &mut b);
        let mut y = [0f32; 32];
        dequantize(DType::Q5_0, &b, &mut y);
        assert_eq!(y.as_slice(), x.as_slice());
    }

    #[test]
    fn asymmetric_formats_keep_the_minimum() {
        let x: Vec<f32> = (0..32).map(|i| 3.0 + i as f32 * 0.5).collect();
        for (format, size) in [(DType::Q4_1, 20), (DType::Q5_1, 24)] {
            let mut b = vec![0u8; size];
            quantize(format, &x, &mut b);
            let mut y = [0f32; 32];
            dequantize(format, &b, &mut y);
            assert_eq!(y[0], 3.0, "{format}");
            assert!((y[31] - 18.5).abs() < 0.6, "{format}: {}", y[31]);
        }
    }
}
