//! Explicit SIMD kernels with runtime dispatch: the inner loops of matmul.
//!
//! [`SimdLevel`] is detected once when the backend starts (or forced with the option
//! `cpu.simd`, so every path can be tested on one machine). Each kernel has a scalar
//! version that defines it and vector versions that must agree with it; tails shorter than a
//! vector fall back to scalar code.

use std::fmt;

/// The instruction set the cpu backend's kernels use.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub enum SimdLevel {
    /// Plain Rust: works everywhere.
    Scalar,
    /// ARM NEON (aarch64).
    Neon,
    /// WebAssembly 128-bit SIMD.
    Simd128,
    /// x86-64 AVX2 with FMA: 8 lanes.
    Avx2,
    /// x86-64 AVX-512F: 16 lanes.
    Avx512,
}

impl SimdLevel {
    /// The best level this CPU supports.
    pub fn detect() -> SimdLevel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return SimdLevel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return SimdLevel::Avx2;
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                return SimdLevel::Neon;
            }
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        {
            return SimdLevel::Simd128;
        }
        #[allow(unreachable_code)]
        SimdLevel::Scalar
    }

    /// Whether this CPU can run `self`.
    pub fn is_supported(self) -> bool {
        self == SimdLevel::Scalar
            || self <= SimdLevel::detect() && self.same_family(SimdLevel::detect())
    }

    fn same_family(self, other: SimdLevel) -> bool {
        let family = |l: SimdLevel| match l {
            SimdLevel::Scalar => 0,
            SimdLevel::Neon => 1,
            SimdLevel::Simd128 => 2,
            SimdLevel::Avx2 | SimdLevel::Avx512 => 3,
        };
        family(self) == family(other)
    }

    /// Parses a level's name (`auto` means detect), as `WEBTENSOR_CPU_SIMD` gives it.
    pub fn parse(name: &str) -> Option<SimdLevel> {
        match name.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Some(SimdLevel::detect()),
            "scalar" => Some(SimdLevel::Scalar),
            "neon" => Some(SimdLevel::Neon),
            "simd128" => Some(SimdLevel::Simd128),
            "avx2" => Some(SimdLevel::Avx2),
            "avx512" => Some(SimdLevel::Avx512),
            _ => None,
        }
    }

    /// The name used in the options, `WEBTENSOR_CPU_SIMD` and `webtensor info`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Neon => "neon",
            SimdLevel::Simd128 => "simd128",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The CPU features relevant to the kernels, for `webtensor info`.
// On wasm32 with simd128 the one push follows the creation directly.
#[allow(clippy::vec_init_then_push)]
pub fn detected_features() -> Vec<String> {
    // Some targets (wasm32 without simd128) push nothing.
    #[allow(unused_mut)]
    let mut features = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        for (name, present) in [
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
        ] {
            if present {
                features.push(name.to_string());
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("neon") {
        features.push("neon".to_string());
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    features.push("simd128".to_string());
    features
}

/// `Σ a[i]·b[i]` for each of four rows `b[r]` against one `a` (all of `a`'s length): the inner
/// loop of `a·bᵀ`, sharing each load of `a` between four outputs.
pub fn dot4(level: SimdLevel, a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the backend only selects Avx512/Avx2 after runtime detection confirmed them.
        SimdLevel::Avx512 => unsafe { x86::dot4_avx512(a, b) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::dot4_avx2(a, b) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: NEON was detected at run time.
        SimdLevel::Neon => unsafe { arm::dot4_neon(a, b) },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        SimdLevel::Simd128 => wasm::dot4_simd128(a, b),
        _ => dot4_scalar(a, b),
    }
}

/// `Σ a[i]·b[i]`.
pub fn dot(level: SimdLevel, a: &[f32], b: &[f32]) -> f32 {
    dot4(level, a, [b, b, b, b])[0]
}

/// `y[i] += alpha · x[i]`: the inner loop of `a·b`.
pub fn axpy(level: SimdLevel, alpha: f32, x: &[f32], y: &mut [f32]) {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2+FMA (implied by Avx512 on every CPU that has it) was detected at run time.
        SimdLevel::Avx2 | SimdLevel::Avx512 => unsafe { x86::axpy_avx2(alpha, x, y) },
        _ => axpy_scalar(alpha, x, y),
    }
}

/// `y[j] += a[0]·x[0][j] + a[1]·x[1][j] + a[2]·x[2][j] + a[3]·x[3][j]` over `y`'s length (every
/// `x[r]` at least as long): the inner loop of decode's `a·b`, which loads and stores each
/// element of `y` once per four rows of `b` instead of once per row.
pub fn axpy4(level: SimdLevel, a: [f32; 4], x: [&[f32]; 4], y: &mut [f32]) {
    assert!(x.iter().all(|r| r.len() >= y.len()));
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the backend only selects Avx512 after runtime detection confirmed it; the
        // lengths were checked above.
        SimdLevel::Avx512 => unsafe { x86::axpy4_avx512(a, x, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2+FMA.
        SimdLevel::Avx2 => unsafe { x86::axpy4_avx2(a, x, y) },
        _ => axpy4_portable(a, x, y),
    }
}

/// [`axpy4`] in plain Rust, written so compilers vectorise it (NEON, wasm `simd128`): a plain
/// multiply and add, since `mul_add` is a library call where the target has no FMA.
fn axpy4_portable(a: [f32; 4], x: [&[f32]; 4], y: &mut [f32]) {
    let n = y.len();
    let (x0, x1, x2, x3) = (&x[0][..n], &x[1][..n], &x[2][..n], &x[3][..n]);
    for j in 0..n {
        y[j] += a[0] * x0[j] + a[1] * x1[j] + a[2] * x2[j] + a[3] * x3[j];
    }
}

fn dot4_scalar(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    // Eight partial sums per output keep rounding error growth close to the vector paths'.
    let mut acc = [[0f32; 8]; 4];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let a_chunk = &a[c * 8..c * 8 + 8];
        for (acc_row, row) in acc.iter_mut().zip(&b) {
            for ((lane, &x), &y) in acc_row.iter_mut().zip(a_chunk).zip(&row[c * 8..c * 8 + 8]) {
                *lane = x.mul_add(y, *lane);
            }
        }
    }
    let mut out = [0f32; 4];
    for (r, row) in b.iter().enumerate() {
        let tail: f32 = (chunks * 8..a.len()).map(|i| a[i] * row[i]).sum();
        out[r] = acc[r].iter().sum::<f32>() + tail;
    }
    out
}

fn axpy_scalar(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = alpha.mul_add(xi, *yi);
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    /// The sum of eight f32 lanes.
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::backend::cpu) unsafe fn hsum256(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; every `b[r]` must be at least as long as `a`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot4_avx2(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        let n = a.len();
        assert!(b.iter().all(|r| r.len() >= n));
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= n {
            let va = _mm256_loadu_ps(a.as_ptr().add(i));
            for r in 0..4 {
                acc[r] = _mm256_fmadd_ps(va, _mm256_loadu_ps(b[r].as_ptr().add(i)), acc[r]);
            }
            i += 8;
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            out[r] = hsum256(acc[r]) + (i..n).map(|j| a[j] * b[r][j]).sum::<f32>();
        }
        out
    }

    /// # Safety
    /// The CPU must support AVX-512F; every `b[r]` must be at least as long as `a`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot4_avx512(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        let n = a.len();
        assert!(b.iter().all(|r| r.len() >= n));
        // Two accumulators per row, so eight independent FMA chains hide the FMA latency.
        let mut acc = [[_mm512_setzero_ps(); 4]; 2];
        let mut i = 0;
        while i + 32 <= n {
            let va = [0, 16].map(|h| _mm512_loadu_ps(a.as_ptr().add(i + h)));
            for r in 0..4 {
                for h in 0..2 {
                    let vb = _mm512_loadu_ps(b[r].as_ptr().add(i + 16 * h));
                    acc[h][r] = _mm512_fmadd_ps(va[h], vb, acc[h][r]);
                }
            }
            i += 32;
        }
        if i + 16 <= n {
            let va = _mm512_loadu_ps(a.as_ptr().add(i));
            for r in 0..4 {
                acc[0][r] = _mm512_fmadd_ps(va, _mm512_loadu_ps(b[r].as_ptr().add(i)), acc[0][r]);
            }
            i += 16;
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            let sum = _mm512_add_ps(acc[0][r], acc[1][r]);
            out[r] = _mm512_reduce_add_ps(sum) + (i..n).map(|j| a[j] * b[r][j]).sum::<f32>();
        }
        out
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let va = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            let vy = _mm256_loadu_ps(y.as_ptr().add(i));
            let vx = _mm256_loadu_ps(x.as_ptr().add(i));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(va, vx, vy));
            i += 8;
        }
        for j in i..n {
            y[j] = alpha.mul_add(x[j], y[j]);
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; every `x[r]` must be at least as long as `y`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy4_avx2(a: [f32; 4], x: [&[f32]; 4], y: &mut [f32]) {
        let n = y.len();
        let va = a.map(|v| _mm256_set1_ps(v));
        let mut j = 0;
        while j + 8 <= n {
            let mut acc = _mm256_loadu_ps(y.as_ptr().add(j));
            for r in 0..4 {
                acc = _mm256_fmadd_ps(va[r], _mm256_loadu_ps(x[r].as_ptr().add(j)), acc);
            }
            _mm256_storeu_ps(y.as_mut_ptr().add(j), acc);
            j += 8;
        }
        for t in j..n {
            y[t] = (0..4).fold(y[t], |acc, r| a[r].mul_add(x[r][t], acc));
        }
    }

    /// # Safety
    /// The CPU must support AVX-512F; every `x[r]` must be at least as long as `y`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn axpy4_avx512(a: [f32; 4], x: [&[f32]; 4], y: &mut [f32]) {
        let n = y.len();
        let va = a.map(|v| _mm512_set1_ps(v));
        let mut j = 0;
        while j + 16 <= n {
            let mut acc = _mm512_loadu_ps(y.as_ptr().add(j));
            for r in 0..4 {
                acc = _mm512_fmadd_ps(va[r], _mm512_loadu_ps(x[r].as_ptr().add(j)), acc);
            }
            _mm512_storeu_ps(y.as_mut_ptr().add(j), acc);
            j += 16;
        }
        if j < n {
            // The tail as one masked vector: lanes past `n` are neither loaded nor stored.
            let mask: __mmask16 = (1u16 << (n - j)) - 1;
            let mut acc = _mm512_maskz_loadu_ps(mask, y.as_ptr().add(j));
            for r in 0..4 {
                let vx = _mm512_maskz_loadu_ps(mask, x[r].as_ptr().add(j));
                acc = _mm512_fmadd_ps(va[r], vx, acc);
            }
            _mm512_mask_storeu_ps(y.as_mut_ptr().add(j), mask, acc);
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    /// # Safety
    /// The CPU must support NEON; every `b[r]` must be at least as long as `a`.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn dot4_neon(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        let n = a.len();
        assert!(b.iter().all(|r| r.len() >= n));
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 4 <= n {
            let va = vld1q_f32(a.as_ptr().add(i));
            for r in 0..4 {
                acc[r] = vfmaq_f32(acc[r], va, vld1q_f32(b[r].as_ptr().add(i)));
            }
            i += 4;
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            out[r] = vaddvq_f32(acc[r]) + (i..n).map(|j| a[j] * b[r][j]).sum::<f32>();
        }
        out
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm {
    use std::arch::wasm32::*;

    pub(super) fn dot4_simd128(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        let n = a.len();
        let mut acc = [f32x4_splat(0.0); 4];
        let mut i = 0;
        while i + 4 <= n {
            let va = f32x4(a[i], a[i + 1], a[i + 2], a[i + 3]);
            for r in 0..4 {
                let vb = f32x4(b[r][i], b[r][i + 1], b[r][i + 2], b[r][i + 3]);
                acc[r] = f32x4_add(acc[r], f32x4_mul(va, vb));
            }
            i += 4;
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            let v = acc[r];
            let lanes = f32x4_extract_lane::<0>(v)
                + f32x4_extract_lane::<1>(v)
                + f32x4_extract_lane::<2>(v)
                + f32x4_extract_lane::<3>(v);
            out[r] = lanes + (i..n).map(|j| a[j] * b[r][j]).sum::<f32>();
        }
        out
    }
}
