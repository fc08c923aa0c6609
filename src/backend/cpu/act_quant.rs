//! Activation quantization for the integer products, vectorised: the same numbers as
//! [`quant::quantize_i8`] (the scalar definition, shared with every backend), bit for bit,
//! including its rounding of halves away from zero, which no SIMD rounding mode does.

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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 must be present; `x.len()` is a multiple of 32 and `q` at least as long.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_i8(x: &[f32], q: &mut [i8]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut max = _mm256_setzero_ps();
        for c in x.chunks_exact(8) {
            // `max_ps` returns its second operand when either is NaN, as `f32::max` skips a NaN.
            max = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(c.as_ptr())), max);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), max);
        let amax = lanes.iter().fold(0f32, |m, &v| m.max(v));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
        let (hi, lo) = (_mm256_set1_ps(127.0), _mm256_set1_ps(-128.0));
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (xs, qs) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)) {
            let mut ints = [_mm256_setzero_si256(); 4];
            for (i, int) in ints.iter_mut().enumerate() {
                let v = _mm256_mul_ps(_mm256_loadu_ps(xs.as_ptr().add(8 * i)), id);
                // Halves away from zero: truncate, then step one away from zero where the
                // dropped fraction is at least a half (the fraction is exact).
                let t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
                let step = _mm256_or_ps(_mm256_and_ps(v, sign), one);
                let up = _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), step);
                // Saturated like `as i8` (±∞ after an overflowing 1/d), NaN to 0.
                let r = _mm256_max_ps(_mm256_min_ps(_mm256_add_ps(t, up), hi), lo);
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
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector kernel against the scalar definition: random rows, exact halves of both
    /// signs (scale 1), zeros, NaN, infinities, and a subnormal maximum whose 1/d overflows.
    #[test]
    fn vector_quantization_equals_the_scalar_definition() {
        let level = SimdLevel::detect();
        let mut rows: Vec<Vec<f32>> = Vec::new();
        let mut seed = 12345u32;
        for len in [32, 64, 256] {
            rows.push(
                (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                        (seed >> 8) as f32 / (1 << 24) as f32 * 6.0 - 3.0
                    })
                    .collect(),
            );
        }
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
        for (r, x) in rows.iter().enumerate() {
            let (mut want, mut got) = (vec![0i8; x.len()], vec![0i8; x.len()]);
            let dw = quant::quantize_i8(x, &mut want);
            let dg = quantize_i8(level, x, &mut got);
            assert_eq!(dw.to_bits(), dg.to_bits(), "row {r}: scale");
            assert_eq!(want, got, "row {r}");
        }
    }
}
