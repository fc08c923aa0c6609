//! Ternary block formats: 256 values in {−1, 0, +1} and one scale per block.
//!
//! * `TQ2_0` (GGUF): `qs[64]` then `d: f16`. Value `v = 128·c + 32·l + m` (chunk `c` of two,
//!   lane `l` of four, `m < 32`) is stored as `t + 1` in bits `2l..2l+2` of `qs[32c + m]`.
//! * `TQ1_0` (GGUF): `qs[48]`, `qh[4]`, then `d: f16`. Base-3 packing: a byte holds five
//!   trits (`qh`: four) as the fraction `⌈(Σ (t_n + 1)·3^(4−n)) · 256 / 243⌉`, so trit `n`
//!   is recovered as `((byte · 3^n) mod 256) · 3 >> 8`. Values `0..160` are trit `v / 32` of
//!   `qs[v % 32]`, values `160..240` trit `(v−160) / 16` of `qs[32 + (v−160) % 16]`, values
//!   `240..256` trit `(v−240) / 4` of `qh[(v−240) % 4]`.
//! * `TernaryPlanes` (webtensor's own): `d: f32`, then eight `u32` words of the "+1" plane
//!   and eight of the "−1" plane; value `v` is bit `v % 32` of word `v / 32`. A dot product
//!   with an integer vector split into bit-planes is AND plus popcount.

use super::{f16_bits, read_f16};
use crate::dtype::DType;

/// Values per ternary block.
pub const BLOCK: usize = 256;

/// Quantizes one block of 256 values: `d = max|x|`, trit = `round(x · (1/d))`.
pub fn quantize_block(format: DType, x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
    let mut t = [0i8; BLOCK];
    for (t, &v) in t.iter_mut().zip(x) {
        *t = (v * id).round() as i8;
    }
    encode(format, &t, amax, out);
}

/// Packs 256 trits and the scale `d` into one block of `format`.
pub fn encode(format: DType, t: &[i8; BLOCK], d: f32, out: &mut [u8]) {
    let u = |v: usize| (t[v] + 1) as u8;
    match format {
        DType::TQ2_0 => {
            for c in 0..2 {
                for m in 0..32 {
                    let mut q = 0u8;
                    for l in 0..4 {
                        q |= u(128 * c + 32 * l + m) << (2 * l);
                    }
                    out[32 * c + m] = q;
                }
            }
            out[64..66].copy_from_slice(&f16_bits(d).to_le_bytes());
        }
        DType::TQ1_0 => {
            let pack = |trits: &mut dyn Iterator<Item = u8>, shift_to_top: bool| -> u8 {
                let mut q = trits.fold(0u16, |q, v| q * 3 + v as u16);
                if shift_to_top {
                    q *= 3;
                }
                // ⌈q · 256 / 243⌉: the trits as a base-3 fraction of the byte.
                (q * 256).div_ceil(243) as u8
            };
            for (m, byte) in out[..32].iter_mut().enumerate() {
                *byte = pack(&mut (0..5).map(|n| u(32 * n + m)), false);
            }
            for (m, byte) in out[32..48].iter_mut().enumerate() {
                *byte = pack(&mut (0..5).map(|n| u(160 + 16 * n + m)), false);
            }
            for (j, byte) in out[48..52].iter_mut().enumerate() {
                *byte = pack(&mut (0..4).map(|n| u(240 + 4 * n + j)), true);
            }
            out[52..54].copy_from_slice(&f16_bits(d).to_le_bytes());
        }
        DType::TernaryPlanes => {
            let (plus, minus) = planes(t);
            out[..4].copy_from_slice(&d.to_le_bytes());
            for (i, w) in plus.iter().chain(&minus).enumerate() {
                out[4 + 4 * i..8 + 4 * i].copy_from_slice(&w.to_le_bytes());
            }
        }
        _ => unreachable!("{format} is not ternary"),
    }
}

/// The "+1" and "−1" bit-planes of 256 trits.
pub fn planes(t: &[i8; BLOCK]) -> ([u32; 8], [u32; 8]) {
    let (mut plus, mut minus) = ([0u32; 8], [0u32; 8]);
    for (v, &x) in t.iter().enumerate() {
        if x > 0 {
            plus[v / 32] |= 1 << (v % 32);
        } else if x < 0 {
            minus[v / 32] |= 1 << (v % 32);
        }
    }
    (plus, minus)
}

/// Trit `n` (0 = most significant) of a `TQ1_0` byte.
fn tq1_trit(byte: u8, n: usize) -> i8 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let q = byte.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as i8 - 1
}

/// Decodes one block of `format` into its 256 trits; returns the scale `d`.
pub fn block_trits(format: DType, bytes: &[u8], t: &mut [i8; BLOCK]) -> f32 {
    match format {
        DType::TQ2_0 => {
            for c in 0..2 {
                for l in 0..4 {
                    for m in 0..32 {
                        t[128 * c + 32 * l + m] = ((bytes[32 * c + m] >> (2 * l)) & 3) as i8 - 1;
                    }
                }
            }
            read_f16(bytes, 64)
        }
        DType::TQ1_0 => {
            for n in 0..5 {
                for m in 0..32 {
                    t[32 * n + m] = tq1_trit(bytes[m], n);
                }
                for m in 0..16 {
                    t[160 + 16 * n + m] = tq1_trit(bytes[32 + m], n);
                }
            }
            for n in 0..4 {
                for j in 0..4 {
                    t[240 + 4 * n + j] = tq1_trit(bytes[48 + j], n);
                }
            }
            read_f16(bytes, 52)
        }
        DType::TernaryPlanes => {
            let word =
                |i: usize| u32::from_le_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap());
            for (v, t) in t.iter_mut().enumerate() {
                let bit = 1 << (v % 32);
                let plus = word(v / 32) & bit != 0;
                let minus = word(8 + v / 32) & bit != 0;
                *t = plus as i8 - minus as i8;
            }
            f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
        }
        _ => unreachable!("{format} is not ternary"),
    }
}
