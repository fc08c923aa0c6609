//! The 256-value super-block formats of llama.cpp: the K-quants `Q2_K` … `Q6_K` and `IQ4_XS`.
//!
//! A super-block splits its 256 values into sub-blocks (16 of 16 values, or 8 of 32) with
//! small integer scales (and minimums) of their own, multiplied by the super-block's f16
//! `d` (and `dmin`). Value `v` of a super-block, as gguf-py and ggml lay them out:
//!
//! | format | bytes | sub-blocks | `q` of value `v` | value |
//! | --- | --- | --- | --- | --- |
//! | `Q2_K` | `scales[16] qs[64] d dmin` | 16 × 16, scale `s & 15`, min `s >> 4` | bits `2l..2l+2` of `qs[32c + m]`, `v = 128c + 32l + m` | `(d·sc)·q − dmin·mn` |
//! | `Q3_K` | `hmask[32] qs[64] scales[12] d` | 16 × 16, 6-bit scale − 32 | low two bits as `Q2_K`; minus 4 unless bit `v / 32` of `hmask[v % 32]` is set | `(d·sc)·q` |
//! | `Q4_K` | `d dmin scales[12] qs[128]` | 8 × 32, 6-bit scale and min | nibble `h` of `qs[32c + m]`, `v = 64c + 32h + m` | `(d·sc)·q − dmin·mn` |
//! | `Q5_K` | `d dmin scales[12] qh[32] qs[128]` | as `Q4_K` | `Q4_K`'s nibble plus bit `v / 32` of `qh[v % 32]` as 16 | as `Q4_K` |
//! | `Q6_K` | `ql[128] qh[64] scales[16] d` | 16 × 16, int8 scale | nibble `h` of `ql[64c + m]` (`v = 128c + 64h + m`) plus bits `2l..` of `qh[32c + m']` (`v = 128c + 32l + m'`) as 16, 32; minus 32 | `(d·sc)·q` |
//! | `IQ4_XS` | `d scales_h:u16 scales_l[4] qs[128]` | 8 × 32, 6-bit scale − 32 | nibble `h` of `qs[16j + m]` (`v = 32j + 16h + m`), a level of [`IQ4_NL_LEVELS`] | `(d·sc)·q` |
//!
//! The 6-bit scales and mins of `Q4_K`/`Q5_K` ([`scales_mins_k4`]): sub-block `j < 4` has
//! `scales[j] & 63` and `scales[j + 4] & 63`; `j ≥ 4` has the low (scale) and high (min)
//! nibble of `scales[j + 4]` with bits 4–5 from the top two bits of `scales[j − 4]` and
//! `scales[j]`. `Q3_K`'s 16 scales: the low four bits are nibble `i / 8` of `scales[i % 8]`,
//! the top two bits `2(i / 4)..` of `scales[8 + i % 4]`.
//!
//! Every format is read as [`SuperBlockInts`]: 256 integers with a scale and an offset per 16
//! values, which dequantization and the integer products share. Every product is an f32
//! operation in the order of the table's last column (gguf-py's order; no fused
//! multiply-add), so dequantization is bit-exact with gguf-py. gguf-py has no quantizer for
//! these formats; webtensor reads them only.

use bytemuck::{Pod, Zeroable};

use super::legacy::IQ4_NL_LEVELS;
use super::{f16_value, Block};
use crate::dtype::DType;

/// `Q2_K` super-block.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ2K {
    scales: [u8; 16],
    qs: [u8; 64],
    d: [u8; 2],
    dmin: [u8; 2],
}

/// `Q3_K` super-block.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ3K {
    hmask: [u8; 32],
    qs: [u8; 64],
    scales: [u8; 12],
    d: [u8; 2],
}

/// `Q4_K` super-block.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4K {
    d: [u8; 2],
    dmin: [u8; 2],
    scales: [u8; 12],
    qs: [u8; 128],
}

/// `Q5_K` super-block.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5K {
    d: [u8; 2],
    dmin: [u8; 2],
    scales: [u8; 12],
    qh: [u8; 32],
    qs: [u8; 128],
}

/// `Q6_K` super-block.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ6K {
    ql: [u8; 128],
    qh: [u8; 64],
    scales: [u8; 16],
    d: [u8; 2],
}

/// `IQ4_XS` super-block.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq4Xs {
    d: [u8; 2],
    scales_h: [u8; 2],
    scales_l: [u8; 4],
    qs: [u8; 128],
}

fn half(b: [u8; 2]) -> f32 {
    f16_value(u16::from_le_bytes(b))
}

/// A super-block as integers: value `v` is `scale[v / 16] · q[v] − min[v / 16]`, the product
/// and the difference each rounded to f32 (gguf-py's order; `min` is 0 for the formats
/// without minimums, and `x − 0` is `x` for every f32). Dequantization and the integer
/// products both read a super-block this way.
#[derive(Clone, Copy)]
pub struct SuperBlockInts {
    /// The 256 integer values.
    pub q: [i8; 256],
    /// Each 16 values' scale (a 32-value sub-block's twice).
    pub scale: [f32; 16],
    /// Each 16 values' offset, subtracted.
    pub min: [f32; 16],
}

impl Default for SuperBlockInts {
    fn default() -> Self {
        SuperBlockInts {
            q: [0; 256],
            scale: [0.0; 16],
            min: [0.0; 16],
        }
    }
}

/// A 256-value super-block format.
pub trait SuperBlock: Block {
    /// The super-block's integer values, scales and offsets.
    fn ints(&self, out: &mut SuperBlockInts);
}

/// The values of a super-block: `scale · q − min` per value.
fn dequantize_super<B: SuperBlock>(block: &B, out: &mut [f32]) {
    let mut ints = SuperBlockInts::default();
    block.ints(&mut ints);
    for (v, o) in out.iter_mut().enumerate() {
        *o = ints.scale[v / 16] * ints.q[v] as f32 - ints.min[v / 16];
    }
}

/// The integer values, scales and offsets of one super-block of `format` (a K-quant or
/// `IQ4_XS`), read from its bytes.
pub fn super_block_ints(format: DType, bytes: &[u8], out: &mut SuperBlockInts) {
    fn read<B: SuperBlock>(bytes: &[u8], out: &mut SuperBlockInts) {
        bytemuck::from_bytes::<B>(bytes).ints(out)
    }
    match format {
        DType::Q2_K => read::<BlockQ2K>(bytes, out),
        DType::Q3_K => read::<BlockQ3K>(bytes, out),
        DType::Q4_K => read::<BlockQ4K>(bytes, out),
        DType::Q5_K => read::<BlockQ5K>(bytes, out),
        DType::Q6_K => read::<BlockQ6K>(bytes, out),
        DType::IQ4_XS => read::<BlockIq4Xs>(bytes, out),
        _ => unreachable!("{format} is not a super-block format"),
    }
}

/// Whether `format` is a 256-value super-block format ([`super_block_ints`]).
pub fn is_super_block(format: DType) -> bool {
    matches!(
        format,
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS
    )
}

/// The 6-bit scales (bytes 0..8) and minimums (bytes 8..16) of the eight sub-blocks of a
/// `Q4_K`/`Q5_K` super-block, four sub-blocks at a time in u32 words: sub-block `j < 4` has
/// `scales[j] & 63` and `scales[j + 4] & 63`, `j ≥ 4` the low and high nibble of
/// `scales[j + 4]` with the top two bits of `scales[j − 4]` and `scales[j]` as bits 4–5.
#[inline]
pub(crate) fn scales_mins_k4(scales: &[u8; 12]) -> [u8; 16] {
    let word = |i: usize| {
        u32::from_le_bytes([
            scales[4 * i],
            scales[4 * i + 1],
            scales[4 * i + 2],
            scales[4 * i + 3],
        ])
    };
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let (six, four, two) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x0303_0303);
    let out = [
        w0 & six,
        (w2 & four) | ((w0 >> 6) & two) << 4,
        w1 & six,
        ((w2 >> 4) & four) | ((w1 >> 6) & two) << 4,
    ];
    let mut bytes = [0u8; 16];
    for (b, w) in bytes.chunks_exact_mut(4).zip(out) {
        b.copy_from_slice(&w.to_le_bytes());
    }
    bytes
}

/// The 4-bit values of a `Q4_K`/`Q5_K` super-block's `qs`: value `64c + m` is the low
/// nibble of `qs[32c + m]`, value `64c + 32 + m` its high nibble.
fn k4_nibbles(qs: &[u8; 128], q: &mut [i8; 256]) {
    for (qs, values) in qs.chunks_exact(32).zip(q.chunks_exact_mut(64)) {
        let (low, high) = values.split_at_mut(32);
        for ((l, h), &b) in low.iter_mut().zip(high).zip(qs) {
            *l = (b & 15) as i8;
            *h = (b >> 4) as i8;
        }
    }
}

/// The scales and minimums of the 32-value sub-blocks of `Q4_K`/`Q5_K`, per 16 values.
fn k4_scales(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12], out: &mut SuperBlockInts) {
    let (d, dmin) = (half(d), half(dmin));
    let scales = scales_mins_k4(scales);
    for j in 0..8 {
        let (dl, ml) = (d * scales[j] as f32, dmin * scales[8 + j] as f32);
        out.scale[2 * j..2 * j + 2].fill(dl);
        out.min[2 * j..2 * j + 2].fill(ml);
    }
}

/// `Block` for a super-block format: its values through [`SuperBlock::ints`].
macro_rules! super_block {
    ($block:ty, $dtype:expr) => {
        impl Block for $block {
            const DTYPE: DType = $dtype;
            fn dequantize(&self, out: &mut [f32]) {
                dequantize_super(self, out)
            }
        }
    };
}

super_block!(BlockQ2K, DType::Q2_K);
super_block!(BlockQ3K, DType::Q3_K);
super_block!(BlockQ4K, DType::Q4_K);
super_block!(BlockQ5K, DType::Q5_K);
super_block!(BlockQ6K, DType::Q6_K);
super_block!(BlockIq4Xs, DType::IQ4_XS);

impl SuperBlock for BlockQ2K {
    fn ints(&self, out: &mut SuperBlockInts) {
        let (d, dmin) = (half(self.d), half(self.dmin));
        for (j, &s) in self.scales.iter().enumerate() {
            out.scale[j] = d * (s & 15) as f32;
            out.min[j] = dmin * (s >> 4) as f32;
        }
        for (c, qs) in self.qs.chunks_exact(32).enumerate() {
            for l in 0..4 {
                let values = &mut out.q[128 * c + 32 * l..128 * c + 32 * l + 32];
                for (q, &b) in values.iter_mut().zip(qs) {
                    *q = ((b >> (2 * l)) & 3) as i8;
                }
            }
        }
    }
}

impl SuperBlock for BlockQ3K {
    fn ints(&self, out: &mut SuperBlockInts) {
        let d = half(self.d);
        for (i, scale) in out.scale.iter_mut().enumerate() {
            let low = (self.scales[i % 8] >> (4 * (i / 8))) & 15;
            let high = (self.scales[8 + i % 4] >> (2 * (i / 4))) & 3;
            *scale = d * ((low | (high << 4)) as i8 - 32) as f32;
        }
        out.min = [0.0; 16];
        for (c, qs) in self.qs.chunks_exact(32).enumerate() {
            for l in 0..4 {
                // Value 128c + 32l + m: its high bit is bit 4c + l of hmask[m].
                let bit = 4 * c + l;
                let values = &mut out.q[128 * c + 32 * l..128 * c + 32 * l + 32];
                for ((q, &b), &h) in values.iter_mut().zip(qs).zip(&self.hmask) {
                    let low = ((b >> (2 * l)) & 3) as i8;
                    *q = low - 4 * (((h >> bit) & 1) ^ 1) as i8;
                }
            }
        }
    }
}

impl SuperBlock for BlockQ4K {
    fn ints(&self, out: &mut SuperBlockInts) {
        k4_scales(self.d, self.dmin, &self.scales, out);
        k4_nibbles(&self.qs, &mut out.q);
    }
}

impl SuperBlock for BlockQ5K {
    fn ints(&self, out: &mut SuperBlockInts) {
        k4_scales(self.d, self.dmin, &self.scales, out);
        k4_nibbles(&self.qs, &mut out.q);
        for (j, values) in out.q.chunks_exact_mut(32).enumerate() {
            for (q, &h) in values.iter_mut().zip(&self.qh) {
                *q |= (((h >> j) & 1) << 4) as i8;
            }
        }
    }
}

impl SuperBlock for BlockQ6K {
    fn ints(&self, out: &mut SuperBlockInts) {
        let d = half(self.d);
        for (j, &s) in self.scales.iter().enumerate() {
            out.scale[j] = d * s as i8 as f32;
        }
        out.min = [0.0; 16];
        for c in 0..2 {
            let qh = &self.qh[32 * c..32 * c + 32];
            for l in 0..4 {
                // Value 128c + 32l + m: nibble l / 2 of ql[64c + 32(l % 2) + m], bits 2l.. of
                // qh[32c + m].
                let ql = &self.ql[64 * c + 32 * (l % 2)..64 * c + 32 * (l % 2) + 32];
                let values = &mut out.q[128 * c + 32 * l..128 * c + 32 * l + 32];
                for ((q, &low), &high) in values.iter_mut().zip(ql).zip(qh) {
                    let low = (low >> (4 * (l / 2))) & 15;
                    *q = (low | (((high >> (2 * l)) & 3) << 4)) as i8 - 32;
                }
            }
        }
    }
}

impl SuperBlock for BlockIq4Xs {
    fn ints(&self, out: &mut SuperBlockInts) {
        let d = half(self.d);
        let scales_h = u16::from_le_bytes(self.scales_h);
        for j in 0..8 {
            let low = (self.scales_l[j / 2] >> (4 * (j % 2))) & 15;
            let high = ((scales_h >> (2 * j)) & 3) as u8;
            let dl = d * ((low | (high << 4)) as i8 - 32) as f32;
            out.scale[2 * j..2 * j + 2].fill(dl);
        }
        out.min = [0.0; 16];
        for (qs, values) in self.qs.chunks_exact(16).zip(out.q.chunks_exact_mut(32)) {
            let (low, high) = values.split_at_mut(16);
            for ((l, h), &b) in low.iter_mut().zip(high).zip(qs) {
                *l = IQ4_NL_LEVELS[(b & 15) as usize];
                *h = IQ4_NL_LEVELS[(b >> 4) as usize];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize, f16_bits};

    /// A `Q4_K` super-block written by hand: sub-block 5's scale and min come from the packed
    /// byte and the high bits of two others, so a mistake in the 6-bit unpacking shows.
    #[test]
    fn q4_k_six_bit_scales() {
        let mut b = [0u8; 144];
        b[..2].copy_from_slice(&f16_bits(0.5).to_le_bytes());
        b[2..4].copy_from_slice(&f16_bits(0.25).to_le_bytes());
        // Sub-block 5: scale 0b10_0011 = 35 (low nibble of scales[9], top bits of scales[1]),
        // min 0b01_0110 = 22 (high nibble of scales[9], top bits of scales[5]).
        b[4 + 9] = 0x63;
        b[4 + 1] = 0b1000_0000;
        b[4 + 5] = 0b0100_0000;
        // Value 5·32 + 3 = 163: chunk 2, high nibble of qs[64 + 3] = 7.
        b[16 + 64 + 3] = 0x70;
        let mut y = [0f32; 256];
        dequantize(DType::Q4_K, &b, &mut y);
        assert_eq!(y[163], 0.5 * 35.0 * 7.0 - 0.25 * 22.0);
        assert_eq!(y[160], -0.25 * 22.0);
        // Sub-block 1: scale scales[1] & 63 = 0, min scales[5] & 63 = 0.
        assert_eq!(y[40], 0.0);
    }
}
