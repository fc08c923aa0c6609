//! Integer dot products for quantized weights: int8 × int8 blocks of 32 with per-block
//! scales (AVX2 `maddubs`, as llama.cpp does; `repack.rs` has the VNNI kernels), exact int8
//! sums, and the AND + popcount dot
//! of ternary bit-planes. Runtime dispatch on [`SimdLevel`] like `simd.rs`; the exact sums of
//! [`dot_q8_k`] (per 16 values) and [`dot_i8`] also have wasm simd128 and NEON kernels; the
//! rest runs plain loops that the compiler vectorises on those targets.

use super::simd::SimdLevel;
use crate::dtype::DType;
use crate::quant;
use crate::quant::kquants::SuperBlockInts;

/// `Σ_c (ad[c] · wd[c]) · Σ_{i < 32} aq[32c + i] · wq[32c + i]` over the chunks `c` that all
/// four slices cover: an int8 dot product with one scale per 32 values on each side.
pub fn dot_q8(level: SimdLevel, aq: &[i8], ad: &[f32], wq: &[i8], wd: &[f32]) -> f32 {
    let chunks = ad.len().min(wd.len()).min(aq.len() / 32).min(wq.len() / 32);
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2/Avx512 are only selected after runtime detection of AVX2 and FMA, and
        // every load below is within the first `chunks · 32` elements of `aq` and `wq`.
        SimdLevel::Avx2 | SimdLevel::Avx512 => unsafe { x86::dot_q8(aq, ad, wq, wd, chunks) },
        // Elsewhere the int8 sums of each chunk in the level's vectors (simd128, NEON); the
        // activations go second, as `dot_i8` asks (they hold no −128; the weights may).
        _ => (0..chunks)
            .map(|c| {
                let s = dot_i8(level, &wq[32 * c..32 * c + 32], &aq[32 * c..32 * c + 32]);
                s as f32 * (ad[c] * wd[c])
            })
            .sum(),
    }
}

/// The block formats [`dot_q_rows`] reads in place: every 32-value format with `Q8_0`
/// activations.
pub fn reads_in_place(format: DType) -> bool {
    matches!(
        format,
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4_NL
    )
}

/// Products of `acts` activation rows (1 or 2; `aq` and `ad` hold them one after the other)
/// with `n` packed weight rows of `row_bytes` each, in a format that [`reads_in_place`]:
/// `out[i · n + r] = Σ_c ad_i[c] · (d_rc · Σ_{j < 32} aq_i[32c + j] · q_rc[j] + m_rc · Σ_{j < 32}
/// aq_i[32c + j])`, where `m` is the minimum of `Q4_1`/`Q5_1` blocks (0 for the others). The
/// blocks are read in place (no decoded copy), their integers and f16 scales straight from
/// the bytes; four weight rows share each load of the activations, and both activation rows
/// share each weight block's unpacking.
#[allow(clippy::too_many_arguments)]
pub fn dot_q_rows(
    level: SimdLevel,
    format: DType,
    (aq, ad, acts): (&[i8], &[f32], usize),
    rows: &[u8],
    row_bytes: usize,
    n: usize,
    out: &mut [f32],
) {
    debug_assert!(reads_in_place(format), "{format} is not read in place");
    let size = format.block_bytes();
    let chunks = ad.len() / acts.max(1);
    let blocks = chunks
        .min(aq.len() / acts.max(1) / 32)
        .min(row_bytes / size);
    let n = n
        .min(rows.len() / row_bytes.max(1))
        .min(out.len() / acts.max(1));
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 if x86::has_f16c() && matches!(acts, 1 | 2) => {
            // Where AVX512-VNNI is present the repacked kernels (`repack.rs`) run instead
            // for `Q4_0` and `Q8_0`.
            let args = x86::RowArgs {
                aq,
                ad,
                chunks,
                rows: rows.as_ptr(),
                row_bytes,
                blocks,
                n,
                out,
            };
            // SAFETY: AVX2, FMA and F16C were detected at run time; `n` rows of
            // `row_bytes` ≥ `blocks · size` bytes lie in `rows`, each activation row covers
            // `blocks` blocks and `out` holds `acts · n` values.
            unsafe {
                match format {
                    DType::Q4_0 => x86::dot_q_rows_avx2::<{ x86::Q4_0 }>(acts, args),
                    DType::Q4_1 => x86::dot_q_rows_avx2::<{ x86::Q4_1 }>(acts, args),
                    DType::Q5_0 => x86::dot_q_rows_avx2::<{ x86::Q5_0 }>(acts, args),
                    DType::Q5_1 => x86::dot_q_rows_avx2::<{ x86::Q5_1 }>(acts, args),
                    DType::IQ4_NL => x86::dot_q_rows_avx2::<{ x86::IQ4_NL }>(acts, args),
                    _ => x86::dot_q_rows_avx2::<{ x86::Q8_0 }>(acts, args),
                }
            }
        }
        // Elsewhere each block's integers are unpacked and summed against the activations in
        // the level's vectors (simd128, NEON), the activations second as `dot_i8` asks.
        _ => {
            let mut q = [0i8; 32];
            for i in 0..acts {
                let (aq, ad) = (&aq[i * chunks * 32..], &ad[i * chunks..]);
                for r in 0..n {
                    let w = &rows[r * row_bytes..(r + 1) * row_bytes];
                    out[i * n + r] = (0..blocks)
                        .map(|c| {
                            let (b, a) = (&w[c * size..(c + 1) * size], &aq[32 * c..32 * c + 32]);
                            if quant::has_offset_ints(format) {
                                let (d, m) = quant::block_offset_ints(format, b, &mut q);
                                let sum: i32 = a.iter().map(|&v| v as i32).sum();
                                ad[c] * (d * dot_i8(level, &q, a) as f32 + m * sum as f32)
                            } else {
                                let d = quant::block_ints(format, b, &mut q);
                                dot_i8(level, &q, a) as f32 * (ad[c] * d)
                            }
                        })
                        .sum();
                }
            }
        }
    }
}

/// `Σ_b ad[b] · Σ_s (scale_bs · Σ_i aq[i] · q[i] − min_bs · sums[s])`: `Q8_K` activations
/// (`aq`, one scale `ad` per 256 values, `sums` of each 16) against super-blocks read as
/// integers, each sum over the 16 values `i` of sub-block `s` exact (i32), as llama.cpp's
/// K-quant dots group them (the offsets through the activations' sums of 16). The integer
/// sums are exact on every path, so every path gives the same result.
pub fn dot_q8_k(
    level: SimdLevel,
    aq: &[i8],
    ad: &[f32],
    sums: &[i32],
    w: &[SuperBlockInts],
) -> f32 {
    let mut total = 0f32;
    for (((a, &d), sums), b) in aq.chunks_exact(256).zip(ad).zip(sums.chunks(16)).zip(w) {
        let dots = dots_of_16(level, a, &b.q);
        let mut sum = 0f32;
        for s in 0..16 {
            sum += b.scale[s] * dots[s] as f32 - b.min[s] * sums[s] as f32;
        }
        total += d * sum;
    }
    total
}

/// `Σ a[i] · q[i]` over each 16 of a super-block's 256 values, exactly. `q` holds no −128
/// (no super-block format's integers do).
fn dots_of_16(level: SimdLevel, a: &[i8], q: &[i8; 256]) -> [i32; 16] {
    let mut dots = [0i32; 16];
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 was detected at run time; `a` holds the block's 256 values (a chunk of
        // 256 of the activations).
        SimdLevel::Avx2 | SimdLevel::Avx512 => unsafe { x86::dots_of_16(a, q, &mut dots) },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        SimdLevel::Simd128 => wasm::dots_of_16(a, q, &mut dots),
        #[cfg(target_arch = "aarch64")]
        // SAFETY: NEON is part of the aarch64 baseline (the target's default features).
        SimdLevel::Neon => unsafe { arm::dots_of_16(a, q, &mut dots) },
        _ => {
            for ((dot, a), q) in dots
                .iter_mut()
                .zip(a.chunks_exact(16))
                .zip(q.chunks_exact(16))
            {
                *dot = exact_scalar(a, q);
            }
        }
    }
    dots
}

/// The sums of each 16 activations, for [`dot_q8_k`].
pub fn sums_of_16(aq: &[i8]) -> Vec<i32> {
    aq.chunks(16)
        .map(|a| a.iter().map(|&v| v as i32).sum())
        .collect()
}

/// `Σ a[i] · b[i]` over the common length, exactly (i32). `a` may hold any int8; `b` must
/// not hold −128 (true of rounded activations, which stay within ±127, and of weights:
/// ternary, `Q4_0`, and `Q8_0` as quantized).
pub fn dot_i8(level: SimdLevel, a: &[i8], b: &[i8]) -> i32 {
    let len = a.len().min(b.len());
    // The vector kernels' sum over the whole vectors `..whole`; the rest added plainly.
    let (whole, head) = match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 => {
            let whole = len / 32 * 32;
            // SAFETY: AVX2 was detected at run time; both slices hold `whole` elements.
            (whole, unsafe { x86::dot_i8(&a[..whole], &b[..whole]) })
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        SimdLevel::Simd128 => {
            let whole = len / 16 * 16;
            (whole, wasm::dot_i8(&a[..whole], &b[..whole]))
        }
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => {
            let whole = len / 16 * 16;
            // SAFETY: NEON is part of the aarch64 baseline (the target's default features).
            (whole, unsafe { arm::dot_i8(&a[..whole], &b[..whole]) })
        }
        _ => (0, 0),
    };
    head + exact_scalar(&a[whole..len], &b[whole..len])
}

fn exact_scalar(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// An int8 vector split into bit-planes, 32 values per word: `planes[c][bit]` holds bit `bit`
/// of the two's-complement values `32c..32c + 32`.
pub struct BitSliced {
    planes: Vec<[u32; 8]>,
}

impl BitSliced {
    /// Slices `x` (its length a multiple of 32).
    pub fn new(x: &[i8]) -> BitSliced {
        let planes = x
            .chunks_exact(32)
            .map(|chunk| {
                let mut p = [0u32; 8];
                for (i, &v) in chunk.iter().enumerate() {
                    let v = v as u8;
                    for (bit, plane) in p.iter_mut().enumerate() {
                        *plane |= (((v >> bit) & 1) as u32) << i;
                    }
                }
                p
            })
            .collect();
        BitSliced { planes }
    }

    /// `Σ t[i] · x[i]` for ternary weights given as "+1" and "−1" planes whose word `c`
    /// covers values `32(first + c)..`: per bit, popcount of the AND with each plane; bit 7
    /// weighs −128.
    pub fn dot_planes(&self, first: usize, plus: &[u32], minus: &[u32]) -> i32 {
        let mut total = 0i32;
        let words = self.planes.get(first..).unwrap_or_default();
        for ((x, &p), &m) in words.iter().zip(plus).zip(minus) {
            for (bit, &plane) in x.iter().enumerate() {
                let count = (p & plane).count_ones() as i32 - (m & plane).count_ones() as i32;
                let weight = if bit == 7 { -128 } else { 1 << bit };
                total += weight * count;
            }
        }
        total
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::simd::x86::hsum256;
    use crate::quant::legacy::IQ4_NL_LEVELS;

    /// # Safety
    /// AVX2 and FMA must be present; `aq`, `wq` hold `32 · chunks` values, `ad`, `wd` `chunks`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_q8(
        aq: &[i8],
        ad: &[f32],
        wq: &[i8],
        wd: &[f32],
        chunks: usize,
    ) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for c in 0..chunks {
            let va = _mm256_loadu_si256(aq.as_ptr().add(32 * c) as *const __m256i);
            let vw = _mm256_loadu_si256(wq.as_ptr().add(32 * c) as *const __m256i);
            let scale = _mm256_set1_ps(ad[c] * wd[c]);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(products(va, vw)), scale, acc);
        }
        hsum256(acc)
    }

    /// # Safety
    /// AVX2 must be present; `a` and `q` hold 256 values.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dots_of_16(a: &[i8], q: &[i8; 256], dots: &mut [i32; 16]) {
        debug_assert!(a.len() >= 256);
        for c in 0..8 {
            let va = _mm256_loadu_si256(a.as_ptr().add(32 * c) as *const __m256i);
            let vq = _mm256_loadu_si256(q.as_ptr().add(32 * c) as *const __m256i);
            // Lanes 0..4 hold the sums of four of values 0..16, lanes 4..8 of values 16..32.
            let p = products(va, vq);
            let (low, high) = (_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
            let pairs = _mm_hadd_epi32(low, high);
            let both = _mm_hadd_epi32(pairs, pairs);
            dots[2 * c] = _mm_cvtsi128_si32(both);
            dots[2 * c + 1] = _mm_extract_epi32(both, 1);
        }
    }

    /// Eight i32 lanes of the pairwise products of a (any int8) and w (no −128).
    #[target_feature(enable = "avx2")]
    unsafe fn products(va: __m256i, vw: __m256i) -> __m256i {
        let ua = _mm256_sign_epi8(va, va);
        let sw = _mm256_sign_epi8(vw, va);
        _mm256_madd_epi16(_mm256_maddubs_epi16(ua, sw), _mm256_set1_epi16(1))
    }

    /// Whether F16C (the f16 scales' conversion) is present.
    pub(super) fn has_f16c() -> bool {
        std::arch::is_x86_feature_detected!("f16c")
    }

    /// The f16 at `p` as f32.
    #[target_feature(enable = "f16c")]
    unsafe fn f16_at(p: *const u8) -> f32 {
        let bits = u16::from_le_bytes([*p, *p.add(1)]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// The arguments of the row kernels (see [`super::dot_q_rows`]): `A` activation rows
    /// of `chunks` blocks each, `n` weight rows from `rows`, `A · n` outputs.
    pub(super) struct RowArgs<'a> {
        pub aq: &'a [i8],
        pub ad: &'a [f32],
        pub chunks: usize,
        pub rows: *const u8,
        pub row_bytes: usize,
        pub blocks: usize,
        pub n: usize,
        pub out: &'a mut [f32],
    }

    /// The formats of [`rows_kernel`], as its const parameter.
    pub const Q8_0: u8 = 0;
    pub const Q4_0: u8 = 1;
    pub const Q4_1: u8 = 2;
    pub const Q5_0: u8 = 3;
    pub const Q5_1: u8 = 4;
    pub const IQ4_NL: u8 = 5;

    /// # Safety
    /// AVX2, FMA and F16C must be present; `acts` is 1 or 2; see [`rows_kernel`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q_rows_avx2<const F: u8>(acts: usize, args: RowArgs<'_>) {
        if acts == 1 {
            rows_kernel::<F, 1>(args)
        } else {
            rows_kernel::<F, 2>(args)
        }
    }

    /// `Σ_i u[i] · s[i]` in 8 i32 lanes (4 neighbouring products per lane) for unsigned `u`
    /// and signed `s` bytes by `maddubs` + `madd` (exact here: no pair of products reaches
    /// the i16 limit, |u| ≤ 128 and |s| ≤ 127 or |u| ≤ 31).
    #[inline(always)]
    unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    /// 16 in byte `i` where bit `i` of `qh` is set, else 0: the fifth bits of a `Q5_0`/`Q5_1`
    /// block's 32 values.
    #[inline(always)]
    unsafe fn fifth_bits(qh: u32) -> __m256i {
        // Byte i takes byte i / 8 of qh (every 128-bit lane holds all four), then bit i % 8.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_setr_epi64x(
                0,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(16))
    }

    /// The 32 integers of the block at `p` in format `F`, in value order: unsigned (`0..16`
    /// or `0..32`) for `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`; signed for `Q8_0` and `IQ4_NL` (its
    /// table's levels).
    #[inline(always)]
    unsafe fn block_values<const F: u8>(p: *const u8, levels: __m256i) -> __m256i {
        if F == Q8_0 {
            return _mm256_loadu_si256(p.add(2) as *const __m256i);
        }
        // Where the 16 bytes of nibbles start: after d, and m and qh where the format has them.
        let nibbles_at = match F {
            Q4_1 => 4,
            Q5_0 => 6,
            Q5_1 => 8,
            _ => 2,
        };
        let packed = _mm_loadu_si128(p.add(nibbles_at) as *const __m128i);
        // Values 0..16 are the low nibbles, 16..32 the high ones.
        let low = _mm_set1_epi8(15);
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        let nibbles = _mm256_set_m128i(hi, lo);
        match F {
            IQ4_NL => _mm256_shuffle_epi8(levels, nibbles),
            Q5_0 | Q5_1 => {
                let qh = (p.add(nibbles_at - 4) as *const u32).read_unaligned();
                _mm256_or_si256(nibbles, fifth_bits(u32::from_le(qh)))
            }
            _ => nibbles,
        }
    }

    /// The weight rows of `args` in groups of four that share each activation load (a short
    /// last group repeats its final row), against `A` activation rows that share each
    /// weight block's unpacking; the next group's rows are prefetched as these are read.
    ///
    /// Unsigned integers (`Q4_0`: `u = q + 8`; `Q5_0`: `u = q + 16`) meet the signed
    /// activations directly, and the offset times `Σ a` of each activation block is taken
    /// off once per block: `Σ q·a = Σ u·a − 8 Σ a`. `Q4_1`/`Q5_1` add their minimum times
    /// `Σ a` instead. Signed integers (`Q8_0`, `IQ4_NL`) take the sign of each activation
    /// (`|a| · sign(a)·w`).
    ///
    /// # Safety
    /// Inlined only into the `target_feature` functions above. `rows` points at `n` rows of
    /// `row_bytes` bytes, each with `blocks` blocks of format `F`; `aq` holds
    /// `A · 32 · chunks` values and `ad` `A · chunks` scales with `blocks ≤ chunks`; `out`
    /// holds `A · n` values.
    #[inline(always)]
    unsafe fn rows_kernel<const F: u8, const A: usize>(args: RowArgs<'_>) {
        let RowArgs {
            aq,
            ad,
            chunks,
            rows: base,
            row_bytes,
            blocks,
            n,
            out,
        } = args;
        let size = match F {
            Q8_0 => 34,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            _ => 18,
        };
        let with_minimum = matches!(F, Q4_1 | Q5_1);
        let levels =
            _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_NL_LEVELS.as_ptr() as *const __m128i));
        for g in 0..n.div_ceil(4) {
            let count = (n - 4 * g).min(4);
            let rows = [0, 1, 2, 3].map(|r| base.add((4 * g + r.min(count - 1)) * row_bytes));
            let mut acc = [[_mm256_setzero_ps(); 4]; A];
            for c in 0..blocks {
                let va: [__m256i; A] = std::array::from_fn(|i| {
                    _mm256_loadu_si256(aq.as_ptr().add(32 * (i * chunks + c)) as *const __m256i)
                });
                let da: [f32; A] = std::array::from_fn(|i| *ad.get_unchecked(i * chunks + c));
                // The unsigned formats' offset times Σ a (Q4_0, Q5_0) or Σ a (Q4_1, Q5_1);
                // |a| for the signed ones.
                let shared: [__m256i; A] = std::array::from_fn(|i| match F {
                    Q4_0 => dot_us(_mm256_set1_epi8(8), va[i]),
                    Q5_0 => dot_us(_mm256_set1_epi8(16), va[i]),
                    Q4_1 | Q5_1 => dot_us(_mm256_set1_epi8(1), va[i]),
                    _ => _mm256_sign_epi8(va[i], va[i]),
                });
                for (w, row) in rows.iter().enumerate() {
                    let p = row.add(size * c);
                    // A prefetch never faults, so one past the weights is harmless.
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * row_bytes) as *const i8);
                    let dw = f16_at(p);
                    // Q4_1/Q5_1: the block's minimum, read once for every activation row.
                    let dm = if with_minimum { f16_at(p.add(2)) } else { 0.0 };
                    let values = block_values::<F>(p, levels);
                    for i in 0..A {
                        let sums = match F {
                            Q4_0 | Q5_0 => _mm256_sub_epi32(dot_us(values, va[i]), shared[i]),
                            Q4_1 | Q5_1 => dot_us(values, va[i]),
                            _ => dot_us(shared[i], _mm256_sign_epi8(values, va[i])),
                        };
                        let s = _mm256_set1_ps(da[i] * dw);
                        acc[i][w] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), s, acc[i][w]);
                        if with_minimum {
                            let m = _mm256_set1_ps(da[i] * dm);
                            let sum = _mm256_cvtepi32_ps(shared[i]);
                            acc[i][w] = _mm256_fmadd_ps(sum, m, acc[i][w]);
                        }
                    }
                }
            }
            for (i, acc) in acc.iter().enumerate() {
                for (w, &a) in acc.iter().enumerate().take(count) {
                    *out.get_unchecked_mut(i * n + 4 * g + w) = hsum256(a);
                }
            }
        }
    }

    /// # Safety
    /// AVX2 must be present; `a` and `b` have the same length, a multiple of 32.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
        let mut acc = _mm256_setzero_si256();
        for c in 0..a.len() / 32 {
            let va = _mm256_loadu_si256(a.as_ptr().add(32 * c) as *const __m256i);
            let vb = _mm256_loadu_si256(b.as_ptr().add(32 * c) as *const __m256i);
            // |a| as unsigned times b with a's sign (|−128| is 128 unsigned; b is never −128).
            acc = _mm256_add_epi32(acc, products(va, vb));
        }
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(acc),
            _mm256_extracti128_si256(acc, 1),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }
}

/// The wasm simd128 int8 sums: 16 values of each side widened to i16, `i32x4_dot_i16x8` (each
/// product within ±128 · 127, so exact).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm {
    use std::arch::wasm32::*;

    /// The four i32 partial sums of `Σ a[i] · b[i]` over the 16 values of `a` and `b` from `at`.
    #[inline(always)]
    fn dot16(a: &[i8], b: &[i8], at: usize) -> v128 {
        let (a, b) = (&a[at..at + 16], &b[at..at + 16]);
        // SAFETY: `a` and `b` hold 16 bytes each; `v128_load` reads unaligned.
        let (a, b) = unsafe {
            (
                v128_load(a.as_ptr() as *const v128),
                v128_load(b.as_ptr() as *const v128),
            )
        };
        let low = i32x4_dot_i16x8(i16x8_extend_low_i8x16(a), i16x8_extend_low_i8x16(b));
        let high = i32x4_dot_i16x8(i16x8_extend_high_i8x16(a), i16x8_extend_high_i8x16(b));
        i32x4_add(low, high)
    }

    /// The sum of the four i32 lanes of `v`.
    #[inline(always)]
    fn lane_sum(v: v128) -> i32 {
        i32x4_extract_lane::<0>(v)
            + i32x4_extract_lane::<1>(v)
            + i32x4_extract_lane::<2>(v)
            + i32x4_extract_lane::<3>(v)
    }

    /// [`super::dots_of_16`]'s sums; `a` and `q` hold 256 values.
    pub(super) fn dots_of_16(a: &[i8], q: &[i8; 256], dots: &mut [i32; 16]) {
        for (s, dot) in dots.iter_mut().enumerate() {
            *dot = lane_sum(dot16(a, q, 16 * s));
        }
    }

    /// `Σ a[i] · b[i]` over the whole 16s of `a`'s length (`b` at least as long).
    pub(super) fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
        let sum =
            (0..a.len() / 16).fold(i32x4_splat(0), |acc, c| i32x4_add(acc, dot16(a, b, 16 * c)));
        lane_sum(sum)
    }
}

/// The aarch64 NEON int8 sums: `vmull_s8` and `vmlal_high_s8`, two products per i16 lane (at
/// most 2 · 128 · 127 when one side holds no −128, so exact), widened into i32.
#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    /// The i16 pairs of products of the 16 values of `a` and `b` from `at`; `b` holds no −128.
    #[inline]
    #[target_feature(enable = "neon")]
    fn products16(a: &[i8], b: &[i8], at: usize) -> int16x8_t {
        let (a, b) = (&a[at..at + 16], &b[at..at + 16]);
        // SAFETY: `a` and `b` hold 16 bytes each.
        let (a, b) = unsafe { (vld1q_s8(a.as_ptr()), vld1q_s8(b.as_ptr())) };
        vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b)
    }

    /// [`super::dots_of_16`]'s sums; `a` and `q` hold 256 values.
    #[target_feature(enable = "neon")]
    pub(super) fn dots_of_16(a: &[i8], q: &[i8; 256], dots: &mut [i32; 16]) {
        for (s, dot) in dots.iter_mut().enumerate() {
            *dot = vaddlvq_s16(products16(a, q, 16 * s));
        }
    }

    /// `Σ a[i] · b[i]` over the whole 16s of `a`'s length (`b` at least as long, no −128).
    #[target_feature(enable = "neon")]
    pub(super) fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
        let mut acc = vdupq_n_s32(0);
        for c in 0..a.len() / 16 {
            acc = vpadalq_s16(acc, products16(a, b, 16 * c));
        }
        vaddvq_s32(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_int_dots_match_plain_sums() {
        let a: Vec<i8> = (0..96).map(|i| ((i * 37) % 255) as u8 as i8).collect();
        let t: Vec<i8> = (0..96).map(|i| ((i * 7) % 3) as i8 - 1).collect();
        let want: i32 = a.iter().zip(&t).map(|(&x, &y)| x as i32 * y as i32).sum();
        let level = SimdLevel::detect();
        assert_eq!(dot_i8(level, &a, &t), want);
        let sliced = BitSliced::new(&a);
        let mut plus = [0u32; 3];
        let mut minus = [0u32; 3];
        for (i, &v) in t.iter().enumerate() {
            if v > 0 {
                plus[i / 32] |= 1 << (i % 32);
            } else if v < 0 {
                minus[i / 32] |= 1 << (i % 32);
            }
        }
        assert_eq!(sliced.dot_planes(0, &plus, &minus), want);
        assert_eq!(
            sliced.dot_planes(1, &plus[1..], &minus[1..]),
            want - sliced.dot_planes(0, &plus[..1], &minus[..1])
        );
    }

    /// The super-block dots of every 16 values: the detected path equals plain sums, with
    /// activations at both ends of int8 (−128 included) and weights at the ends of theirs.
    #[test]
    fn dots_of_16_match_plain_sums() {
        let a: Vec<i8> = (0..256)
            .map(|i| ((i * 97 + 13) % 256) as u8 as i8)
            .collect();
        let mut q = [0i8; 256];
        for (i, v) in q.iter_mut().enumerate() {
            *v = (((i * 53 + 7) % 255) as i32 - 127) as i8;
        }
        let want: Vec<i32> = a
            .chunks(16)
            .zip(q.chunks(16))
            .map(|(a, q)| a.iter().zip(q).map(|(&x, &y)| x as i32 * y as i32).sum())
            .collect();
        for level in [SimdLevel::Scalar, SimdLevel::detect()] {
            assert_eq!(dots_of_16(level, &a, &q).to_vec(), want, "{level:?}");
        }
    }

    /// Every format read in place, on the detected path and the plain one, for one and two
    /// activation rows and a short last group of weight rows: equal to the products of the
    /// decoded blocks (`block_ints`, `block_offset_ints`) in f64. Random bytes reach every
    /// nibble, fifth bit and table level; a fifth bit or nibble taken from the wrong value
    /// moves a sum by whole units of `d · a`, far past the tolerance.
    #[test]
    fn rows_read_in_place_match_their_decoded_blocks() {
        let (blocks, n) = (3, 5);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for format in [
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::IQ4_NL,
        ] {
            let size = format.block_bytes();
            let row_bytes = blocks * size;
            let mut rows: Vec<u8> = (0..n * row_bytes).map(|_| next() as u8).collect();
            for block in rows.chunks_exact_mut(size) {
                // Finite scales (f16 0.5 ... 2) and, for Q4_1/Q5_1, minimums (−2 ... −0.5).
                block[..2].copy_from_slice(&(0x3800 + (next() % 0x800) as u16).to_le_bytes());
                if quant::has_offset_ints(format) {
                    block[2..4].copy_from_slice(&(0xb800 + (next() % 0x800) as u16).to_le_bytes());
                }
                if format == DType::Q8_0 {
                    // Quantized Q8_0 weights never hold −128.
                    for v in &mut block[2..] {
                        *v = (*v as i8).max(-127) as u8;
                    }
                }
            }
            for acts in [1, 2] {
                let aq: Vec<i8> = (0..acts * blocks * 32)
                    .map(|_| ((next() % 255) as i32 - 127) as i8)
                    .collect();
                let ad: Vec<f32> = (0..acts * blocks)
                    .map(|i| 0.01 + i as f32 * 0.003)
                    .collect();
                let mut want = vec![0f64; acts * n];
                let mut q = [0i8; 32];
                for i in 0..acts {
                    for r in 0..n {
                        for c in 0..blocks {
                            let b = &rows[r * row_bytes + c * size..][..size];
                            let a = &aq[(i * blocks + c) * 32..][..32];
                            let (d, m) = if quant::has_offset_ints(format) {
                                quant::block_offset_ints(format, b, &mut q)
                            } else {
                                (quant::block_ints(format, b, &mut q), 0.0)
                            };
                            let dot: i64 =
                                a.iter().zip(&q).map(|(&x, &y)| x as i64 * y as i64).sum();
                            let sum: i64 = a.iter().map(|&x| x as i64).sum();
                            let scale = ad[i * blocks + c] as f64;
                            want[i * n + r] +=
                                scale * (d as f64 * dot as f64 + m as f64 * sum as f64);
                        }
                    }
                }
                for level in [SimdLevel::Scalar, SimdLevel::detect()] {
                    let mut out = vec![0f32; acts * n];
                    dot_q_rows(
                        level,
                        format,
                        (&aq, &ad, acts),
                        &rows,
                        row_bytes,
                        n,
                        &mut out,
                    );
                    for (got, want) in out.iter().zip(&want) {
                        assert!(
                            (*got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{format} {level:?} acts {acts}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
