//! Activation quantization for the integer products, vectorised: the same numbers as
//! [`quant::quantize_i8`] and [`quant::quantize_q8_k`] (the scalar definitions, shared with
//! every backend), bit for bit, including `quantize_i8`'s rounding of halves away from zero,
//! which no SIMD rounding mode does.

use super::simd::SimdLevel;
use crate::quant;

/// `q[i] = round(x[i] / d)` with `d = max |x| / 127`; returns `d`. Equal to
/// [`quant::quantize_i8`] for every input.
pub fn quantize_i8(level: SimdLevel, x: &[f32], q: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2 && x.len().is_multiple_of(32) && q.len() >= x.len() {
        // SAFETY: AVX2 is present at these levels (`SimdLevel::detect`, or a forced level
        // checked with `is_supported`); the lengths are checked above.
        return unsafe { x86::quantize_i8(x, q) };
    }
    let _ = level;
    quant::quantize_i8(x, q)
}

/// `q[i] = round_ties_even(x[i] · s)` with `s = −127 / m`, `m` the first value of greatest
/// magnitude; returns `1 / s`. Equal to [`quant::quantize_q8_k`] for every input. The K-quant
/// products round every linear layer's input this way; the scalar rounding, a `rintf` call per
/// value (SSE4.1 is not assumed), took 5% of TinyLlama `Q4_K_M` decode.
pub fn quantize_q8_k(level: SimdLevel, x: &[f32], q: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2 && x.len().is_multiple_of(32) && q.len() >= x.len() {
        // SAFETY: as in `quantize_i8`.
        if let Some(d) = unsafe { x86::quantize_q8_k(x, q) } {
            return d;
        }
    }
    let _ = level;
    quant::quantize_q8_k(x, q)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The greatest magnitude of `x` (NaN skipped, as `f32::max` and the scalar `>` skip it).
    ///
    /// # Safety
    /// AVX2 must be present; `x.len()` is a multiple of 8.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn abs_max(x: &[f32]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut max = _mm256_setzero_ps();
        for c in x.chunks_exact(8) {
            // `max_ps` returns its second operand when either is NaN.
            max = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(c.as_ptr())), max);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), max);
        lanes.iter().fold(0f32, |m, &v| m.max(v))
    }

    /// `q[i] = round(x[i] · scale)` as int8, NaN to 0: halves away from zero and saturated like
    /// `as i8` with `HALF_AWAY` (`quantize_i8`), else ties to even (`quantize_q8_k`, whose
    /// values are within ±127 and a little).
    ///
    /// # Safety
    /// AVX2 must be present; `x.len()` is a multiple of 32 and `q` at least as long.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn round_into<const HALF_AWAY: bool>(x: &[f32], q: &mut [i8], scale: f32) {
        let sign = _mm256_set1_ps(-0.0);
        let s = _mm256_set1_ps(scale);
        let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
        let (hi, lo) = (_mm256_set1_ps(127.0), _mm256_set1_ps(-128.0));
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (xs, qs) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)) {
            let mut ints = [_mm256_setzero_si256(); 4];
            for (i, int) in ints.iter_mut().enumerate() {
                let v = _mm256_mul_ps(_mm256_loadu_ps(xs.as_ptr().add(8 * i)), s);
                let r = if HALF_AWAY {
                    // Truncate, then step one away from zero where the dropped fraction is at
                    // least a half (the fraction is exact); saturate (±∞ after an overflowing
                    // scale).
                    let t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                    let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
                    let step = _mm256_or_ps(_mm256_and_ps(v, sign), one);
                    let up = _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), step);
                    _mm256_max_ps(_mm256_min_ps(_mm256_add_ps(t, up), hi), lo)
                } else {
                    _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                };
                let r = _mm256_and_ps(r, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
                *int = _mm256_cvttps_epi32(r);
            }
            let words = _mm256_packs_epi16(
                _mm256_packs_epi32(ints[0], ints[1]),
                _mm256_packs_epi32(ints[2], ints[3]),
            );
            let bytes = _mm256_permutevar8x32_epi32(words, order);
            _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, bytes);
        }
    }

    /// # Safety
    /// AVX2 must be present; `x.len()` is a multiple of 32 and `q` at least as long.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_i8(x: &[f32], q: &mut [i8]) -> f32 {
        let d = abs_max(x) / 127.0;
        round_into::<true>(x, q, if d != 0.0 { 1.0 / d } else { 0.0 });
        d
    }

    /// The vector [`quantize_q8_k`](super::quantize_q8_k), or `None` (nothing written) where
    /// the greatest magnitude or the scale is not finite: the scalar definition's saturating
    /// casts decide those.
    ///
    /// # Safety
    /// AVX2 must be present; `x.len()` is a multiple of 32 and `q` at least as long.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_q8_k(x: &[f32], q: &mut [i8]) -> Option<f32> {
        let amax = abs_max(x);
        if amax == 0.0 || !amax.is_finite() {
            return None;
        }
        // The sign is the first value of that magnitude's, as the scalar scan keeps the first.
        let max = *x.iter().find(|v| v.abs() == amax)?;
        let iscale = -127.0 / max;
        if !iscale.is_finite() {
            return None;
        }
        round_into::<false>(x, q, iscale);
        Some(1.0 / iscale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector kernel against the scalar definition: random rows, exact halves of both
    /// signs (scale 1), zeros, NaN, infinities, and a subnormal maximum whose 1/d overflows.
    #[test]
    fn vector_quantization_equals_the_scalar_definition() {
        let mut seed = 12345u32;
        let mut rows: Vec<Vec<f32>> = [32, 64, 256]
            .iter()
            .map(|&len| random_row(len, &mut seed))
            .collect();
        // max 127 gives d = 1, so these halves stay exact halves.
        let mut halves: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        halves[31] = 127.0;
        halves[30] = -2.5;
        rows.push(halves);
        rows.push(vec![0.0; 32]);
        let mut odd = vec![1.0f32; 32];
        odd[3] = f32::NAN;
        odd[4] = -0.0;
        rows.push(odd.clone());
        odd[5] = f32::INFINITY;
        odd[6] = f32::NEG_INFINITY;
        rows.push(odd);
        let mut tiny = vec![0.0f32; 32];
        // 2^-133: d = amax / 127 is subnormal and 1/d overflows to infinity.
        tiny[0] = f32::from_bits(1 << 16);
        tiny[1] = -f32::from_bits(1 << 16);
        rows.push(tiny);
        assert_same(&rows, quant::quantize_i8, |x, q| {
            quantize_i8(SimdLevel::detect(), x, q)
        });
    }

    /// The vector `Q8_K` rounding against the scalar definition: random rows, halves rounded to
    /// even (scale 1), a greatest magnitude met first with either sign, zeros, NaN, infinities,
    /// and a subnormal maximum whose scale overflows.
    #[test]
    fn vector_q8_k_quantization_equals_the_scalar_definition() {
        let mut seed = 777u32;
        let mut rows: Vec<Vec<f32>> = (0..4).map(|_| random_row(256, &mut seed)).collect();
        // max −127 gives the scale 1, so these halves stay exact halves.
        let mut halves: Vec<f32> = (0..256).map(|i| (i % 64) as f32 - 31.5).collect();
        halves[7] = -127.0;
        halves[9] = 127.0;
        rows.push(halves.clone());
        halves[7] = 127.0;
        halves[9] = -127.0;
        rows.push(halves);
        rows.push(vec![0.0; 256]);
        let mut odd = vec![1.0f32; 256];
        odd[3] = f32::NAN;
        odd[4] = -0.0;
        odd[5] = -2.0;
        rows.push(odd.clone());
        odd[6] = f32::INFINITY;
        rows.push(odd);
        let mut tiny = vec![0.0f32; 256];
        // 2^-133: −127 / max overflows to infinity.
        tiny[0] = f32::from_bits(1 << 16);
        tiny[1] = -f32::from_bits(1 << 15);
        rows.push(tiny);
        assert_same(&rows, quant::quantize_q8_k, |x, q| {
            quantize_q8_k(SimdLevel::detect(), x, q)
        });
    }

    /// `len` values uniform in [−3, 3) from a linear congruential `seed`.
    fn random_row(len: usize, seed: &mut u32) -> Vec<f32> {
        (0..len)
            .map(|_| {
                *seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                (*seed >> 8) as f32 / (1 << 24) as f32 * 6.0 - 3.0
            })
            .collect()
    }

    /// `vector` writes `scalar`'s integers and returns its scale, bit for bit, on every row.
    fn assert_same(
        rows: &[Vec<f32>],
        scalar: impl Fn(&[f32], &mut [i8]) -> f32,
        vector: impl Fn(&[f32], &mut [i8]) -> f32,
    ) {
        for (r, x) in rows.iter().enumerate() {
            let (mut want, mut got) = (vec![0i8; x.len()], vec![0i8; x.len()]);
            let dw = scalar(x, &mut want);
            let dg = vector(x, &mut got);
            assert_eq!(dw.to_bits(), dg.to_bits(), "row {r}: scale");
            assert_eq!(want, got, "row {r}");
        }
    }
}
