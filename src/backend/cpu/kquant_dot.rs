//! Products of `Q4_K`, `Q5_K` and `Q6_K` weight rows with `Q8_K` activations, read straight from the
//! packed super-blocks: no unpacked copy of the weights, as llama.cpp's K-quant dots do.
//!
//! Per super-block and activation row the integer sums are exact (i32) on every path:
//! `Q4_K`/`Q5_K` give `Σ_j sc_j · Σ_{32} q·a` and `Σ_j mn_j · Σ_{32} a` (the latter from the
//! activations' sums of 16), `Q6_K` gives `Σ_s sc_s · (Σ_{16} u·a − 32 Σ_{16} a)` with the
//! unsigned 6-bit `u = q + 32`. The f32 part is then one scalar expression per super-block
//! ([`q4_k_value`], [`q6_k_value`]), which the AVX2 kernels evaluate lane by lane with the
//! same operations in the same order, so every path gives identical results. The AVX2
//! kernels unpack each 32 weights once (nibbles by AND and shift, the high bits ORed in) for
//! up to four products at a time: four weight rows against decode's one activation row, or
//! one weight row against four of prefill's, their integer sums reduced together.
//! Where AVX512-VNNI is present the three formats run `repack.rs`'s interleaved kernels
//! instead, which give the same values.
//!
//! Every other path goes through one driver ([`products`]): a kernel family ([`BlockInts`]:
//! the portable loops, wasm simd128, aarch64 NEON) gives each super-block's exact integer sums
//! for the same four shapes, and the driver applies the portable f32 step
//! ([`super_block_value`]) to them, so those paths equal the portable one by construction once
//! their integers do. On wasm32 and aarch64 the weights are never repacked (`repack.rs` is
//! x86-only), so these kernels read the GGUF row-major super-blocks.

use super::simd::SimdLevel;
use crate::dtype::DType;
use crate::quant::f16_value;
use crate::quant::kquants::scales_mins_k4;

/// Activation rows as `Q8_K`: `k` int8 values per row, one scale per 256 (`d`) and the sum
/// of each 16 values (`sums`), the rows one after the other.
pub struct Q8KRows<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
    pub sums: &'a [i32],
    pub k: usize,
}

/// Products (weight rows × activation rows) one call computes at most.
pub const MAX_SLOTS: usize = 4;

/// Whether [`dot_rows`] reads `format`.
pub fn reads_packed(format: DType) -> bool {
    matches!(format, DType::Q4_K | DType::Q5_K | DType::Q6_K)
}

/// `out[r · count + i] = Σ w · a` of weight row `r` (packed `Q4_K`, `Q5_K` or `Q6_K`, `k / 256`
/// super-blocks; `weights` rows of `row_bytes` in `w`) with activation row `first + i`, for
/// `r < weights`, `i < count` and `weights · count ≤ MAX_SLOTS`: several weight rows against
/// one activation row for decode, one weight row against several activation rows for prefill.
///
/// # Panics
/// If `format` is not one [`reads_packed`] accepts, the products are more than
/// [`MAX_SLOTS`] or `out` holds fewer, or `w` or `acts` are shorter than `k` says (the
/// caller's own sizes).
#[allow(clippy::too_many_arguments)]
pub fn dot_rows(
    level: SimdLevel,
    format: DType,
    (w, row_bytes, weights): (&[u8], usize, usize),
    acts: &Q8KRows<'_>,
    (first, count): (usize, usize),
    out: &mut [f32],
) {
    let k = acts.k;
    let blocks = k / 256;
    let size = format.block_bytes();
    assert!(reads_packed(format) && weights * count <= MAX_SLOTS && out.len() >= weights * count);
    assert!(
        weights > 0
            && row_bytes >= blocks * size
            && w.len() >= (weights - 1) * row_bytes + blocks * size
    );
    let rows = first + count;
    assert!(acts.q.len() >= rows * k && acts.d.len() >= rows * blocks);
    assert!(acts.sums.len() >= rows * k / 16);
    let (weights_of, rows_of) = ((w, row_bytes, weights), (first, count));
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 => {
            let args = x86::Args {
                w: w.as_ptr(),
                row_bytes,
                acts,
                first,
                out,
            };
            // SAFETY: AVX2 was detected at run time; the asserts above bound every read.
            unsafe {
                match (format, weights, count) {
                    (DType::Q4_K, 1, 1) => x86::q4_k::<1, 1, false>(args, blocks),
                    (DType::Q4_K, 1, 2) => x86::q4_k::<1, 2, false>(args, blocks),
                    (DType::Q4_K, 1, 3) => x86::q4_k::<1, 3, false>(args, blocks),
                    (DType::Q4_K, 1, _) => x86::q4_k::<1, 4, false>(args, blocks),
                    (DType::Q4_K, 2, _) => x86::q4_k::<2, 1, false>(args, blocks),
                    (DType::Q4_K, 3, _) => x86::q4_k::<3, 1, false>(args, blocks),
                    (DType::Q4_K, _, _) => x86::q4_k::<4, 1, false>(args, blocks),
                    (DType::Q5_K, 1, 1) => x86::q4_k::<1, 1, true>(args, blocks),
                    (DType::Q5_K, 1, 2) => x86::q4_k::<1, 2, true>(args, blocks),
                    (DType::Q5_K, 1, 3) => x86::q4_k::<1, 3, true>(args, blocks),
                    (DType::Q5_K, 1, _) => x86::q4_k::<1, 4, true>(args, blocks),
                    (DType::Q5_K, 2, _) => x86::q4_k::<2, 1, true>(args, blocks),
                    (DType::Q5_K, 3, _) => x86::q4_k::<3, 1, true>(args, blocks),
                    (DType::Q5_K, _, _) => x86::q4_k::<4, 1, true>(args, blocks),
                    (_, 1, 1) => x86::q6_k::<1, 1>(args, blocks),
                    (_, 1, 2) => x86::q6_k::<1, 2>(args, blocks),
                    (_, 1, 3) => x86::q6_k::<1, 3>(args, blocks),
                    (_, 1, _) => x86::q6_k::<1, 4>(args, blocks),
                    (_, 2, _) => x86::q6_k::<2, 1>(args, blocks),
                    (_, 3, _) => x86::q6_k::<3, 1>(args, blocks),
                    (_, _, _) => x86::q6_k::<4, 1>(args, blocks),
                }
            }
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        SimdLevel::Simd128 => by_shape::<wasm::Simd128>(format, weights_of, acts, rows_of, out),
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => by_shape::<arm::Neon>(format, weights_of, acts, rows_of, out),
        _ => by_shape::<Portable>(format, weights_of, acts, rows_of, out),
    }
}

/// The integer sums of one super-block position for `R` weight rows (`blocks`, one block of
/// each) against `A` activation rows (`a`, its 256 values of each): the part of a product
/// each kernel family computes its own way. Product `r · A + i` is the exact i32 sum, so every
/// family gives the same integers and [`products`] turns them into the same f32 values.
trait BlockInts {
    /// `Σ_j sc_j · Σ q·a` over the eight sub-blocks of 32 of `Q4_K` blocks (`Q5_K` with
    /// `FIVE`), `sc_j` byte `j` of the row's `scales` ([`block_scales`]).
    fn q4_k<const R: usize, const A: usize, const FIVE: bool>(
        blocks: [&[u8]; R],
        scales: &[[u8; 16]; R],
        a: [&[i8; 256]; A],
    ) -> [i32; MAX_SLOTS];

    /// `Σ_s sc_s · Σ u·a` over the sixteen sub-blocks of 16 of `Q6_K` blocks, with the
    /// unsigned 6-bit `u = q + 32` and the signed scales of the block (the offset 32 is taken
    /// off by [`super_block_value`]).
    fn q6_k<const R: usize, const A: usize>(
        blocks: [&[u8]; R],
        a: [&[i8; 256]; A],
    ) -> [i32; MAX_SLOTS];
}

/// The plain loops of [`q4_k_ints`] and [`q6_k_ints`], one product at a time: the definition
/// the vector families must equal.
struct Portable;

impl BlockInts for Portable {
    fn q4_k<const R: usize, const A: usize, const FIVE: bool>(
        blocks: [&[u8]; R],
        scales: &[[u8; 16]; R],
        a: [&[i8; 256]; A],
    ) -> [i32; MAX_SLOTS] {
        each_product::<R, A>(|r, i| q4_k_ints(blocks[r], &scales[r][..8], a[i], FIVE))
    }

    fn q6_k<const R: usize, const A: usize>(
        blocks: [&[u8]; R],
        a: [&[i8; 256]; A],
    ) -> [i32; MAX_SLOTS] {
        each_product::<R, A>(|r, i| q6_k_ints(blocks[r], a[i]))
    }
}

/// Slot `r · A + i` of the result is `sum(r, i)` for weight row `r < R` and activation row
/// `i < A`; the slots past `R · A` are 0: the product order every [`BlockInts`] family uses.
fn each_product<const R: usize, const A: usize>(
    sum: impl Fn(usize, usize) -> i32,
) -> [i32; MAX_SLOTS] {
    std::array::from_fn(|s| if s < R * A { sum(s / A, s % A) } else { 0 })
}

/// [`products`] with the shape `(weights, count)` of [`dot_rows`] as its const parameters:
/// one weight row against up to four activation rows, or up to four weight rows against one.
fn by_shape<K: BlockInts>(
    format: DType,
    (w, row_bytes, weights): (&[u8], usize, usize),
    acts: &Q8KRows<'_>,
    (first, count): (usize, usize),
    out: &mut [f32],
) {
    let w = (w, row_bytes);
    match (weights, count) {
        (1, 1) => products::<K, 1, 1>(format, w, acts, first, out),
        (1, 2) => products::<K, 1, 2>(format, w, acts, first, out),
        (1, 3) => products::<K, 1, 3>(format, w, acts, first, out),
        (1, _) => products::<K, 1, 4>(format, w, acts, first, out),
        (2, _) => products::<K, 2, 1>(format, w, acts, first, out),
        (3, _) => products::<K, 3, 1>(format, w, acts, first, out),
        (_, _) => products::<K, 4, 1>(format, w, acts, first, out),
    }
}

/// The `R · A` products of [`dot_rows`] through the kernel family `K`: per super-block its
/// exact integer sums, then the shared f32 step ([`super_block_value`]) added in order, so
/// every family gives the portable values bit for bit.
fn products<K: BlockInts, const R: usize, const A: usize>(
    format: DType,
    (w, row_bytes): (&[u8], usize),
    acts: &Q8KRows<'_>,
    first: usize,
    out: &mut [f32],
) {
    let (k, blocks, size) = (acts.k, acts.k / 256, format.block_bytes());
    let mut total = [0f32; MAX_SLOTS];
    for b in 0..blocks {
        let block: [&[u8]; R] = std::array::from_fn(|r| &w[r * row_bytes + size * b..][..size]);
        let a: [&[i8; 256]; A] = std::array::from_fn(|i| {
            acts.q[(first + i) * k + 256 * b..][..256]
                .try_into()
                .expect("a super-block holds 256 activations")
        });
        let scales = block.map(|w| block_scales(format, w));
        let isum = match format {
            DType::Q4_K => K::q4_k::<R, A, false>(block, &scales, a),
            DType::Q5_K => K::q4_k::<R, A, true>(block, &scales, a),
            _ => K::q6_k::<R, A>(block, a),
        };
        for (s, total) in total.iter_mut().enumerate().take(R * A) {
            let (r, row) = (s / A, first + s % A);
            let sums = &acts.sums[row * k / 16 + 16 * b..][..16];
            let d = acts.d[row * blocks + b];
            *total += super_block_value(format, block[r], &scales[r], d, (isum[s], sums));
        }
    }
    out[..R * A].copy_from_slice(&total[..R * A]);
}

/// A super-block's scale bytes: `Q4_K`/`Q5_K`'s 6-bit scales (0..8) and mins (8..16), or
/// `Q6_K`'s sixteen signed scales as bytes.
#[inline(always)]
fn block_scales(format: DType, block: &[u8]) -> [u8; 16] {
    if format == DType::Q6_K {
        block[192..208]
            .try_into()
            .expect("a Q6_K block has 16 scales")
    } else {
        q4_k_scales(block)
    }
}

/// A super-block's share of a product from its [`BlockInts`] sum `isum`, the activations'
/// scale `d` and `sums` of each 16: `Q4_K`/`Q5_K` through [`q4_k_value`] with the mins,
/// `Q6_K` through [`q6_k_value`] with its offset `32 · Σ_s sc_s · Σ a` taken off.
#[inline(always)]
fn super_block_value(
    format: DType,
    block: &[u8],
    scales: &[u8; 16],
    d: f32,
    (isum, sums): (i32, &[i32]),
) -> f32 {
    if format == DType::Q6_K {
        let offset: i32 = (0..16).map(|s| scales[s] as i8 as i32 * sums[s]).sum();
        q6_k_value(block, d, isum - 32 * offset)
    } else {
        q4_k_value(block, d, isum, mins(&scales[8..], sums))
    }
}

/// A `Q4_K`/`Q5_K` super-block's 6-bit scales (bytes 0..8) and mins (8..16) of its
/// sub-blocks.
#[inline(always)]
fn q4_k_scales(block: &[u8]) -> [u8; 16] {
    scales_mins_k4(
        block[4..16]
            .try_into()
            .expect("a Q4_K/Q5_K block has 12 scale bytes"),
    )
}

/// `Σ_j mn_j · Σ a` over the eight sub-blocks of 32 (`sums` of each 16 activations).
fn mins(mn: &[u8], sums: &[i32]) -> i32 {
    (0..8)
        .map(|j| mn[j] as i32 * (sums[2 * j] + sums[2 * j + 1]))
        .sum()
}

/// `Σ_j sc_j · Σ q·a` of a `Q4_K` super-block, or with `five` of a `Q5_K` one: value
/// `64c + 32h + m` is nibble `h` of `qs[32c + m]`, in sub-block `2c + h`, and for `Q5_K` bit
/// `2c + h` of `qh[m]` is its bit 4.
fn q4_k_ints(block: &[u8], sc: &[u8], a: &[i8], five: bool) -> i32 {
    let (qh, qs) = if five {
        (&block[16..48], &block[48..176])
    } else {
        (&block[..0], &block[16..144])
    };
    let fifth = |m: usize, bit: usize| qh.get(m).map_or(0, |&h| ((h >> bit) & 1) << 4);
    let mut isum = 0;
    for c in 0..4 {
        let (mut lo, mut hi) = (0i32, 0i32);
        for m in 0..32 {
            let b = qs[32 * c + m];
            lo += ((b & 15) | fifth(m, 2 * c)) as i32 * a[64 * c + m] as i32;
            hi += ((b >> 4) | fifth(m, 2 * c + 1)) as i32 * a[64 * c + 32 + m] as i32;
        }
        isum += sc[2 * c] as i32 * lo + sc[2 * c + 1] as i32 * hi;
    }
    isum
}

/// A `Q4_K`/`Q5_K` super-block's share of the product, from its integer sums (`isum` of scaled
/// products, `msum` of scaled activation sums) and the activations' scale `d`.
#[inline(always)]
fn q4_k_value(block: &[u8], d: f32, isum: i32, msum: i32) -> f32 {
    let scale = f16_value(u16::from_le_bytes([block[0], block[1]])) * d;
    let min = f16_value(u16::from_le_bytes([block[2], block[3]])) * d;
    scale * isum as f32 - min * msum as f32
}

/// `Σ_s sc_s · Σ u·a` of a `Q6_K` super-block with the unsigned `u = q + 32`: value
/// `128c + 32l + m` has nibble `l / 2` of `ql[64c + 32(l % 2) + m]` and bits `2l..2l + 2` of
/// `qh[32c + m]` as its bits 4–5.
fn q6_k_ints(block: &[u8], a: &[i8]) -> i32 {
    let (ql, qh, scales) = (&block[..128], &block[128..192], &block[192..208]);
    let mut dots = [0i32; 16];
    for c in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                let low = (ql[64 * c + 32 * (l % 2) + m] >> (4 * (l / 2))) & 15;
                let u = low | (((qh[32 * c + m] >> (2 * l)) & 3) << 4);
                let v = 128 * c + 32 * l + m;
                dots[v / 16] += u as i32 * a[v] as i32;
            }
        }
    }
    (0..16).map(|s| scales[s] as i8 as i32 * dots[s]).sum()
}

/// A `Q6_K` super-block's share of the product from its integer sum and the activations'
/// scale `d`.
#[inline(always)]
fn q6_k_value(block: &[u8], d: f32, isum: i32) -> f32 {
    f16_value(u16::from_le_bytes([block[208], block[209]])) * d * isum as f32
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{q4_k_scales, Q8KRows, MAX_SLOTS};
    use crate::quant::f16_value;

    /// The arguments of the kernels (see [`super::dot_rows`]): `R` weight rows from `w`,
    /// activation rows `first..first + A`, the `R · A` products into `out`.
    pub(super) struct Args<'a> {
        pub w: *const u8,
        pub row_bytes: usize,
        pub acts: &'a Q8KRows<'a>,
        pub first: usize,
        pub out: &'a mut [f32],
    }

    /// Lane `s` of the result: the sum of the eight i32 lanes of `v[s]`.
    #[inline(always)]
    unsafe fn hsum4(v: [__m256i; MAX_SLOTS]) -> __m128i {
        // [v0 01 v0 23 v1 01 v1 23 | v0 45 …], then [v0 0123 v1 0123 v2 0123 v3 0123 | …4567].
        let a = _mm256_hadd_epi32(v[0], v[1]);
        let b = _mm256_hadd_epi32(v[2], v[3]);
        let c = _mm256_hadd_epi32(a, b);
        _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1))
    }

    /// The f16 at `p` as f32 (exact), as the portable path reads it.
    #[inline(always)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        f16_value(u16::from_le_bytes([*p, *p.add(1)]))
    }

    /// A `pshufb` control that fills the low 128-bit half with i16 lane `lo` of its source
    /// half and the high half with lane `hi`.
    #[inline(always)]
    unsafe fn lane_shuffle(lo: usize, hi: usize) -> __m256i {
        let mut c = [0u8; 32];
        for (i, b) in c.iter_mut().enumerate() {
            let lane = if i < 16 { lo } else { hi };
            *b = (2 * lane + i % 2) as u8;
        }
        _mm256_loadu_si256(c.as_ptr() as *const __m256i)
    }

    /// `Σ u·a` per pair of bytes times the i16 `scales`, in eight i32 lanes: `maddubs` of
    /// the unsigned weights (≤ 63) and signed activations stays within i16 (2 · 63 · 128).
    #[inline(always)]
    unsafe fn scaled(u: __m256i, a: *const i8, scales: __m256i) -> __m256i {
        let a = _mm256_loadu_si256(a as *const __m256i);
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), scales)
    }

    /// The per-product f32 factors of super-block `b`: lane `r · A + i` holds `f(r) · d_a`
    /// with `f(r)` the weight row's f16 at byte `at` of its block and `d_a` the activation
    /// row's scale (the portable path's `f16 · d`); unused lanes 0.
    #[inline(always)]
    unsafe fn factors<const R: usize, const A: usize>(
        args: &Args<'_>,
        (b, size, at): (usize, usize, usize),
    ) -> __m128 {
        let blocks = args.acts.k / 256;
        let mut f = [0f32; MAX_SLOTS];
        for r in 0..R {
            let dw = f16_at(args.w.add(r * args.row_bytes + size * b + at));
            for i in 0..A {
                f[r * A + i] = dw * *args.acts.d.get_unchecked((args.first + i) * blocks + b);
            }
        }
        _mm_loadu_ps(f.as_ptr())
    }

    /// # Safety
    /// AVX2 must be present; `args.w` holds `R` rows of `blocks` `Q4_K` super-blocks (`Q5_K`
    /// with `FIVE`), `args.acts` the rows `first..first + A` and `out` `R · A ≤ 4` values.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q4_k<const R: usize, const A: usize, const FIVE: bool>(
        args: Args<'_>,
        blocks: usize,
    ) {
        let acts = args.acts;
        let k = acts.k;
        let nibble = _mm256_set1_epi8(15);
        let one = _mm256_set1_epi8(1);
        let (size, qs) = if FIVE { (176, 48) } else { (144, 16) };
        let pick: [__m256i; 8] = std::array::from_fn(|j| lane_shuffle(j, j));
        let mut total = _mm_setzero_ps();
        for b in 0..blocks {
            let w: [*const u8; R] =
                std::array::from_fn(|r| args.w.add(r * args.row_bytes + size * b));
            // Per weight row: i16 scales 0..8 in both halves, the mins as i32, and (Q5_K) qh,
            // whose bit 2c + h of each byte is moved to bit 0 as chunk c is read.
            let mut sc = [_mm256_setzero_si256(); R];
            let mut mn = [_mm256_setzero_si256(); R];
            let mut qh = [_mm256_setzero_si256(); R];
            for r in 0..R {
                let scales = q4_k_scales(std::slice::from_raw_parts(w[r], 16));
                let bytes = _mm_loadu_si128(scales.as_ptr() as *const __m128i);
                sc[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(bytes));
                mn[r] = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
                if FIVE {
                    qh[r] = _mm256_loadu_si256(w[r].add(16) as *const __m256i);
                }
            }
            let mut acc = [_mm256_setzero_si256(); MAX_SLOTS];
            for c in 0..4 {
                for r in 0..R {
                    let packed = _mm256_loadu_si256(w[r].add(qs + 32 * c) as *const __m256i);
                    let mut lo = _mm256_and_si256(packed, nibble);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
                    if FIVE {
                        // Masked to bit 0 before the 16-bit shift left: nothing crosses bytes.
                        let bit = |v: __m256i| _mm256_slli_epi16(_mm256_and_si256(v, one), 4);
                        lo = _mm256_or_si256(lo, bit(qh[r]));
                        hi = _mm256_or_si256(hi, bit(_mm256_srli_epi16(qh[r], 1)));
                        qh[r] = _mm256_srli_epi16(qh[r], 2);
                    }
                    let sl = _mm256_shuffle_epi8(sc[r], pick[2 * c]);
                    let sh = _mm256_shuffle_epi8(sc[r], pick[2 * c + 1]);
                    for i in 0..A {
                        let a = acts.q.as_ptr().add((args.first + i) * k + 256 * b + 64 * c);
                        let both = _mm256_add_epi32(scaled(lo, a, sl), scaled(hi, a.add(32), sh));
                        acc[r * A + i] = _mm256_add_epi32(acc[r * A + i], both);
                    }
                }
            }
            // Σ_j mn_j · Σ a over each 32, from the sums of 16: [p0 p1 p4 p5 | p2 p3 p6 p7]
            // put in order.
            let mut msum = [_mm256_setzero_si256(); MAX_SLOTS];
            for i in 0..A {
                let sums = acts.sums.as_ptr().add((args.first + i) * k / 16 + 16 * b);
                let s_lo = _mm256_loadu_si256(sums as *const __m256i);
                let s_hi = _mm256_loadu_si256(sums.add(8) as *const __m256i);
                let pairs = _mm256_permute4x64_epi64(_mm256_hadd_epi32(s_lo, s_hi), 0b11_01_10_00);
                for r in 0..R {
                    msum[r * A + i] = _mm256_mullo_epi32(pairs, mn[r]);
                }
            }
            // The portable `scale · isum − min · msum` per lane.
            let scale = factors::<R, A>(&args, (b, size, 0));
            let min = factors::<R, A>(&args, (b, size, 2));
            let isum = _mm_cvtepi32_ps(hsum4(acc));
            let msum = _mm_cvtepi32_ps(hsum4(msum));
            let value = _mm_sub_ps(_mm_mul_ps(scale, isum), _mm_mul_ps(min, msum));
            total = _mm_add_ps(total, value);
        }
        let mut out = [0f32; MAX_SLOTS];
        _mm_storeu_ps(out.as_mut_ptr(), total);
        args.out[..R * A].copy_from_slice(&out[..R * A]);
    }

    /// # Safety
    /// AVX2 must be present; `args.w` holds `R` rows of `blocks` `Q6_K` super-blocks,
    /// `args.acts` the rows `first..first + A` and `out` `R · A ≤ 4` values.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q6_k<const R: usize, const A: usize>(args: Args<'_>, blocks: usize) {
        let acts = args.acts;
        let k = acts.k;
        let nibble = _mm256_set1_epi8(15);
        let bits = [0x03, 0x0c, 0x30, 0xc0u8].map(|m| _mm256_set1_epi8(m as i8));
        let pick: [__m256i; 4] = std::array::from_fn(|l| lane_shuffle(2 * l, 2 * l + 1));
        let mut total = _mm_setzero_ps();
        for b in 0..blocks {
            let w: [*const u8; R] =
                std::array::from_fn(|r| args.w.add(r * args.row_bytes + 210 * b));
            let mut acc = [_mm256_setzero_si256(); MAX_SLOTS];
            for c in 0..2 {
                for (r, &p) in w.iter().enumerate() {
                    let ql0 = _mm256_loadu_si256(p.add(64 * c) as *const __m256i);
                    let ql1 = _mm256_loadu_si256(p.add(64 * c + 32) as *const __m256i);
                    let qh = _mm256_loadu_si256(p.add(128 + 32 * c) as *const __m256i);
                    // Bits 2l.. of qh moved to bits 4–5 of each byte (masked before the
                    // 16-bit shifts, so nothing crosses into the neighbouring byte).
                    let high = [
                        _mm256_slli_epi16(_mm256_and_si256(qh, bits[0]), 4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, bits[1]), 2),
                        _mm256_and_si256(qh, bits[2]),
                        _mm256_srli_epi16(_mm256_and_si256(qh, bits[3]), 2),
                    ];
                    let low = [
                        _mm256_and_si256(ql0, nibble),
                        _mm256_and_si256(ql1, nibble),
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), nibble),
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), nibble),
                    ];
                    // The i16 scales of sub-blocks 8c..8c + 8 in both halves.
                    let half = _mm_loadl_epi64(p.add(192 + 8 * c) as *const __m128i);
                    let sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(half));
                    for l in 0..4 {
                        let u = _mm256_or_si256(low[l], high[l]);
                        let sc = _mm256_shuffle_epi8(sc, pick[l]);
                        for i in 0..A {
                            let at = (args.first + i) * k + 256 * b + 128 * c + 32 * l;
                            let s = r * A + i;
                            acc[s] =
                                _mm256_add_epi32(acc[s], scaled(u, acts.q.as_ptr().add(at), sc));
                        }
                    }
                }
            }
            // The offset: 32 · Σ_s sc_s · Σ a over each 16.
            for (r, &p) in w.iter().enumerate() {
                let scales = _mm_loadu_si128(p.add(192) as *const __m128i);
                let sc_lo = _mm256_cvtepi8_epi32(scales);
                let sc_hi = _mm256_cvtepi8_epi32(_mm_srli_si128(scales, 8));
                for i in 0..A {
                    let sums = acts.sums.as_ptr().add((args.first + i) * k / 16 + 16 * b);
                    let s_lo = _mm256_loadu_si256(sums as *const __m256i);
                    let s_hi = _mm256_loadu_si256(sums.add(8) as *const __m256i);
                    let offset = _mm256_add_epi32(
                        _mm256_mullo_epi32(sc_lo, s_lo),
                        _mm256_mullo_epi32(sc_hi, s_hi),
                    );
                    let s = r * A + i;
                    acc[s] = _mm256_sub_epi32(acc[s], _mm256_slli_epi32(offset, 5));
                }
            }
            // The portable `(f16 d · d_a) · isum` per lane.
            let scale = factors::<R, A>(&args, (b, 210, 208));
            total = _mm_add_ps(total, _mm_mul_ps(scale, _mm_cvtepi32_ps(hsum4(acc))));
        }
        let mut out = [0f32; MAX_SLOTS];
        _mm_storeu_ps(out.as_mut_ptr(), total);
        args.out[..R * A].copy_from_slice(&out[..R * A]);
    }
}

/// The wasm simd128 family: each 16 weights widened to i16 and multiplied by their sub-block's
/// scale (at most 31 · 63 for `Q4_K`/`Q5_K`, 63 · 128 for `Q6_K`: within i16), then
/// `i32x4_dot_i16x8` with the activations widened to i16 into one i32x4 per product. The
/// weights are unpacked and scaled once for every activation row, the activations widened
/// once for every weight row.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm {
    use std::arch::wasm32::*;

    use super::{BlockInts, MAX_SLOTS};

    pub(super) struct Simd128;

    /// The 16 one-byte values (`u8` or `i8`) of `values` from `at`.
    #[inline(always)]
    fn load<T: Copy>(values: &[T], at: usize) -> v128 {
        assert!(std::mem::size_of::<T>() == 1);
        let chunk = &values[at..at + 16];
        // SAFETY: `chunk` holds 16 one-byte values; `v128_load` reads unaligned.
        unsafe { v128_load(chunk.as_ptr() as *const v128) }
    }

    /// 16 signed bytes as two i16x8 (low, high).
    #[inline(always)]
    fn widen(a: v128) -> [v128; 2] {
        [i16x8_extend_low_i8x16(a), i16x8_extend_high_i8x16(a)]
    }

    /// 16 unsigned bytes (at most 63) times `sc` as two i16x8 (low, high); the products fit
    /// i16 (see the module's comment), so the wrapping multiply is exact.
    #[inline(always)]
    fn scaled(u: v128, sc: i16) -> [v128; 2] {
        let sc = i16x8_splat(sc);
        let (lo, hi) = (u16x8_extend_low_u8x16(u), u16x8_extend_high_u8x16(u));
        [i16x8_mul(lo, sc), i16x8_mul(hi, sc)]
    }

    /// `acc` plus the pairwise i32 products of the 16 scaled weights `w` and activations `a`.
    #[inline(always)]
    fn dot(acc: v128, w: [v128; 2], a: [v128; 2]) -> v128 {
        let both = i32x4_add(i32x4_dot_i16x8(w[0], a[0]), i32x4_dot_i16x8(w[1], a[1]));
        i32x4_add(acc, both)
    }

    /// The sum of the four i32 lanes of each accumulator.
    #[inline(always)]
    fn lane_sums(acc: [v128; MAX_SLOTS]) -> [i32; MAX_SLOTS] {
        acc.map(|v| {
            i32x4_extract_lane::<0>(v)
                + i32x4_extract_lane::<1>(v)
                + i32x4_extract_lane::<2>(v)
                + i32x4_extract_lane::<3>(v)
        })
    }

    impl BlockInts for Simd128 {
        /// Chunk `c` of 32 packed bytes holds sub-block `2c` in its low nibbles and `2c + 1` in
        /// its high ones; `Q5_K`'s `qh` gives bit `2c` (low) and `2c + 1` (high) of each byte,
        /// moved down by two per chunk.
        #[inline(always)]
        fn q4_k<const R: usize, const A: usize, const FIVE: bool>(
            blocks: [&[u8]; R],
            scales: &[[u8; 16]; R],
            a: [&[i8; 256]; A],
        ) -> [i32; MAX_SLOTS] {
            let qs = if FIVE { 48 } else { 16 };
            let (nibble, one) = (u8x16_splat(15), u8x16_splat(1));
            let mut acc = [i32x4_splat(0); MAX_SLOTS];
            let mut qh: [[v128; 2]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|h| {
                    if FIVE {
                        load(blocks[r], 16 + 16 * h)
                    } else {
                        i32x4_splat(0)
                    }
                })
            });
            for c in 0..4 {
                // Activation values 64c + 16t.. as i16, t = 0, 1 low nibbles, 2, 3 high ones.
                let wide: [[[v128; 2]; 4]; A] = std::array::from_fn(|i| {
                    std::array::from_fn(|t| widen(load(a[i], 64 * c + 16 * t)))
                });
                for r in 0..R {
                    for h in 0..2 {
                        let packed = load(blocks[r], qs + 32 * c + 16 * h);
                        let mut lo = v128_and(packed, nibble);
                        let mut hi = u8x16_shr(packed, 4);
                        if FIVE {
                            let bits = qh[r][h];
                            lo = v128_or(lo, i8x16_shl(v128_and(bits, one), 4));
                            hi = v128_or(hi, i8x16_shl(v128_and(u8x16_shr(bits, 1), one), 4));
                            qh[r][h] = u8x16_shr(bits, 2);
                        }
                        let lo = scaled(lo, scales[r][2 * c] as i16);
                        let hi = scaled(hi, scales[r][2 * c + 1] as i16);
                        for (i, wide) in wide.iter().enumerate() {
                            let s = r * A + i;
                            acc[s] = dot(dot(acc[s], lo, wide[h]), hi, wide[2 + h]);
                        }
                    }
                }
            }
            lane_sums(acc)
        }

        /// Value `128c + 32l + m` of sub-block `8c + 2l + m / 16`: nibble `l / 2` of
        /// `ql[64c + 32(l % 2) + m]`, bits `2l..2l + 2` of `qh[32c + m]` as bits 4–5.
        #[inline(always)]
        fn q6_k<const R: usize, const A: usize>(
            blocks: [&[u8]; R],
            a: [&[i8; 256]; A],
        ) -> [i32; MAX_SLOTS] {
            let (nibble, two_bits) = (u8x16_splat(15), u8x16_splat(3));
            let mut acc = [i32x4_splat(0); MAX_SLOTS];
            for c in 0..2 {
                for l in 0..4 {
                    let at = 128 * c + 32 * l;
                    let wide: [[[v128; 2]; 2]; A] = std::array::from_fn(|i| {
                        std::array::from_fn(|h| widen(load(a[i], at + 16 * h)))
                    });
                    for (r, block) in blocks.iter().enumerate() {
                        for h in 0..2 {
                            let ql = load(block, 64 * c + 32 * (l % 2) + 16 * h);
                            let qh = load(block, 128 + 32 * c + 16 * h);
                            let low = v128_and(u8x16_shr(ql, 4 * (l as u32 / 2)), nibble);
                            let high =
                                i8x16_shl(v128_and(u8x16_shr(qh, 2 * l as u32), two_bits), 4);
                            let sc = block[192 + 8 * c + 2 * l + h] as i8 as i16;
                            let w = scaled(v128_or(low, high), sc);
                            for (i, wide) in wide.iter().enumerate() {
                                acc[r * A + i] = dot(acc[r * A + i], w, wide[h]);
                            }
                        }
                    }
                }
            }
            lane_sums(acc)
        }
    }
}

/// The aarch64 NEON family (plain NEON, no `dotprod`): weights times activations as i8 with
/// `vmull_s8`/`vmlal_high_s8` into i16 (at most four products of 63 · 128 per lane), those
/// widened pairwise into i32 and multiplied by their sub-block's scale into one i32x4 per
/// product. The weights are unpacked once for every activation row.
#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    use super::{BlockInts, MAX_SLOTS};

    pub(super) struct Neon;

    impl BlockInts for Neon {
        fn q4_k<const R: usize, const A: usize, const FIVE: bool>(
            blocks: [&[u8]; R],
            scales: &[[u8; 16]; R],
            a: [&[i8; 256]; A],
        ) -> [i32; MAX_SLOTS] {
            // SAFETY: NEON is part of the aarch64 baseline (the target's default features).
            unsafe { q4_k::<R, A, FIVE>(blocks, scales, a) }
        }

        fn q6_k<const R: usize, const A: usize>(
            blocks: [&[u8]; R],
            a: [&[i8; 256]; A],
        ) -> [i32; MAX_SLOTS] {
            // SAFETY: NEON is part of the aarch64 baseline (the target's default features).
            unsafe { q6_k::<R, A>(blocks, a) }
        }
    }

    /// The 16 bytes of `bytes` from `at`.
    #[inline]
    #[target_feature(enable = "neon")]
    fn load_u8(bytes: &[u8], at: usize) -> uint8x16_t {
        let chunk = &bytes[at..at + 16];
        // SAFETY: `chunk` holds 16 bytes.
        unsafe { vld1q_u8(chunk.as_ptr()) }
    }

    /// The 16 activations of `a` from `at`.
    #[inline]
    #[target_feature(enable = "neon")]
    fn load_i8(a: &[i8; 256], at: usize) -> int8x16_t {
        let chunk = &a[at..at + 16];
        // SAFETY: `chunk` holds 16 bytes.
        unsafe { vld1q_s8(chunk.as_ptr()) }
    }

    /// `p` plus the products of the 16 unsigned weights `u` (at most 63, so exact as i8) and
    /// the activations `a`, two per i16 lane.
    #[inline]
    #[target_feature(enable = "neon")]
    fn mul_add(p: int16x8_t, u: uint8x16_t, a: int8x16_t) -> int16x8_t {
        let w = vreinterpretq_s8_u8(u);
        vmlal_high_s8(vmlal_s8(p, vget_low_s8(w), vget_low_s8(a)), w, a)
    }

    /// `acc` plus the i16 sums `p` of one sub-block, widened pairwise, times its scale `sc`.
    #[inline]
    #[target_feature(enable = "neon")]
    fn add_scaled(acc: int32x4_t, p: int16x8_t, sc: i32) -> int32x4_t {
        vmlaq_n_s32(acc, vpaddlq_s16(p), sc)
    }

    /// The sum of the four i32 lanes of each accumulator.
    #[inline]
    #[target_feature(enable = "neon")]
    fn lane_sums(acc: [int32x4_t; MAX_SLOTS]) -> [i32; MAX_SLOTS] {
        let mut out = [0; MAX_SLOTS];
        for (out, &v) in out.iter_mut().zip(&acc) {
            *out = vaddvq_s32(v);
        }
        out
    }

    /// [`BlockInts::q4_k`]: chunk `c` of 32 packed bytes holds sub-block `2c` in its low
    /// nibbles and `2c + 1` in its high ones; `Q5_K`'s `qh` gives bit `2c` (low) and `2c + 1`
    /// (high) of each byte, moved down by two per chunk.
    #[inline]
    #[target_feature(enable = "neon")]
    fn q4_k<const R: usize, const A: usize, const FIVE: bool>(
        blocks: [&[u8]; R],
        scales: &[[u8; 16]; R],
        a: [&[i8; 256]; A],
    ) -> [i32; MAX_SLOTS] {
        let qs = if FIVE { 48 } else { 16 };
        let (nibble, one, two) = (vdupq_n_u8(15), vdupq_n_u8(1), vdupq_n_u8(2));
        let (zero8, zero16) = (vdupq_n_u8(0), vdupq_n_s16(0));
        let mut acc = [vdupq_n_s32(0); MAX_SLOTS];
        let mut qh = [[zero8; 2]; R];
        if FIVE {
            for (qh, block) in qh.iter_mut().zip(blocks) {
                *qh = [load_u8(block, 16), load_u8(block, 32)];
            }
        }
        for c in 0..4 {
            // Activation values 64c + 16t.., t = 0, 1 for the low nibbles, 2, 3 the high.
            let mut acts = [[vdupq_n_s8(0); 4]; A];
            for (acts, a) in acts.iter_mut().zip(a) {
                for (t, v) in acts.iter_mut().enumerate() {
                    *v = load_i8(a, 64 * c + 16 * t);
                }
            }
            for r in 0..R {
                let (mut lo, mut hi) = ([zero8; 2], [zero8; 2]);
                for h in 0..2 {
                    let packed = load_u8(blocks[r], qs + 32 * c + 16 * h);
                    lo[h] = vandq_u8(packed, nibble);
                    hi[h] = vshrq_n_u8::<4>(packed);
                    if FIVE {
                        let bits = qh[r][h];
                        lo[h] = vorrq_u8(lo[h], vshlq_n_u8::<4>(vandq_u8(bits, one)));
                        hi[h] = vorrq_u8(hi[h], vshlq_n_u8::<3>(vandq_u8(bits, two)));
                        qh[r][h] = vshrq_n_u8::<2>(bits);
                    }
                }
                let (sl, sh) = (scales[r][2 * c] as i32, scales[r][2 * c + 1] as i32);
                for (i, acts) in acts.iter().enumerate() {
                    let s = r * A + i;
                    let low = mul_add(mul_add(zero16, lo[0], acts[0]), lo[1], acts[1]);
                    let high = mul_add(mul_add(zero16, hi[0], acts[2]), hi[1], acts[3]);
                    acc[s] = add_scaled(add_scaled(acc[s], low, sl), high, sh);
                }
            }
        }
        lane_sums(acc)
    }

    /// [`BlockInts::q6_k`]: value `128c + 32l + m` of sub-block `8c + 2l + m / 16` is nibble
    /// `l / 2` of `ql[64c + 32(l % 2) + m]` with bits `2l..2l + 2` of `qh[32c + m]` as bits 4–5.
    #[inline]
    #[target_feature(enable = "neon")]
    fn q6_k<const R: usize, const A: usize>(
        blocks: [&[u8]; R],
        a: [&[i8; 256]; A],
    ) -> [i32; MAX_SLOTS] {
        let (nibble, two_bits) = (vdupq_n_u8(15), vdupq_n_u8(3));
        let zero16 = vdupq_n_s16(0);
        let mut acc = [vdupq_n_s32(0); MAX_SLOTS];
        for c in 0..2 {
            for l in 0..4 {
                let at = 128 * c + 32 * l;
                let mut acts = [[vdupq_n_s8(0); 2]; A];
                for (acts, a) in acts.iter_mut().zip(a) {
                    *acts = [load_i8(a, at), load_i8(a, at + 16)];
                }
                // Variable shifts: a negative count shifts right.
                let (low_shift, high_shift) =
                    (vdupq_n_s8(-4 * (l as i8 / 2)), vdupq_n_s8(-2 * l as i8));
                for (r, block) in blocks.iter().enumerate() {
                    for h in 0..2 {
                        let ql = load_u8(block, 64 * c + 32 * (l % 2) + 16 * h);
                        let qh = load_u8(block, 128 + 32 * c + 16 * h);
                        let low = vandq_u8(vshlq_u8(ql, low_shift), nibble);
                        let high = vandq_u8(vshlq_u8(qh, high_shift), two_bits);
                        let u = vorrq_u8(low, vshlq_n_u8::<4>(high));
                        let sc = block[192 + 8 * c + 2 * l + h] as i8 as i32;
                        for (i, acts) in acts.iter().enumerate() {
                            let s = r * A + i;
                            acc[s] = add_scaled(acc[s], mul_add(zero16, u, acts[h]), sc);
                        }
                    }
                }
            }
        }
        lane_sums(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::int_dot::sums_of_16;
    use crate::quant::kquants::{super_block_ints, SuperBlockInts};
    use crate::quant::quantize_q8_k;

    /// Random bytes for `blocks` super-blocks of `format` with small f16 scales, and `rows`
    /// `Q8_K` activation rows (−128 included), from a fixed seed.
    fn inputs(format: DType, blocks: usize, rows: usize) -> (Vec<u8>, Vec<i8>, Vec<f32>) {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let size = format.block_bytes();
        let mut w: Vec<u8> = (0..blocks * size).map(|_| next() as u8).collect();
        let d_at: &[usize] = if format != DType::Q6_K {
            &[0, 2]
        } else {
            &[208]
        };
        for block in w.chunks_exact_mut(size) {
            for &at in d_at {
                let bits = crate::quant::f16_bits(0.001 * (1 + next() % 7) as f32);
                block[at..at + 2].copy_from_slice(&bits.to_le_bytes());
            }
        }
        let x: Vec<f32> = (0..rows * blocks * 256)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let mut q = vec![0i8; x.len()];
        let d = x
            .chunks(256)
            .zip(q.chunks_mut(256))
            .map(|(x, q)| quantize_q8_k(x, q))
            .collect();
        q[3] = -128;
        (w, q, d)
    }

    /// Every SIMD level this machine runs; on aarch64 (natively or under qemu) and on wasm32
    /// with simd128 the vector level must be among them, so its kernels cannot go untested.
    fn levels() -> Vec<SimdLevel> {
        #[cfg(target_arch = "aarch64")]
        assert_eq!(SimdLevel::detect(), SimdLevel::Neon);
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        assert_eq!(SimdLevel::detect(), SimdLevel::Simd128);
        let all = [
            SimdLevel::Scalar,
            SimdLevel::Neon,
            SimdLevel::Simd128,
            SimdLevel::Avx2,
            SimdLevel::Avx512,
        ];
        all.into_iter().filter(|l| l.is_supported()).collect()
    }

    /// Every path and every count of activation rows gives the same values, bit for bit, and
    /// they agree with the plain sums of the super-blocks read by `super_block_ints` (the
    /// dequantization's reading, so a wrong nibble or bit order fails).
    #[test]
    fn packed_k_dots_match_super_block_ints() {
        for format in [DType::Q4_K, DType::Q5_K, DType::Q6_K] {
            // `n` weight rows of `blocks` super-blocks, `rows` activation rows.
            let (blocks, n, rows) = (3, 5, 5);
            let row_bytes = blocks * format.block_bytes();
            let (w, q, d) = inputs(format, blocks * n, rows);
            let k = 256 * blocks;
            let sums = sums_of_16(&q[..rows * k]);
            let acts = Q8KRows {
                q: &q[..rows * k],
                d: &d[..rows * blocks],
                sums: &sums,
                k,
            };
            // scalar[j · rows + i]: weight row j, activation row i, one product per call.
            let mut scalar = vec![0f32; n * rows];
            for j in 0..n {
                for i in 0..rows {
                    let weights = (&w[j * row_bytes..], row_bytes, 1);
                    let out = &mut scalar[j * rows + i..];
                    dot_rows(SimdLevel::Scalar, format, weights, &acts, (i, 1), out);
                    // Σ_b d_b · Σ_v (scale_v · q_v − min_v) · a_v in f64; `mag` sums the
                    // terms' sizes: the f32 roundings differ by ~1e-7 of those.
                    let (mut want, mut mag) = (0f64, 0f64);
                    let row = &w[j * row_bytes..(j + 1) * row_bytes];
                    for (b, bytes) in row.chunks_exact(format.block_bytes()).enumerate() {
                        let mut ints = SuperBlockInts::default();
                        super_block_ints(format, bytes, &mut ints);
                        let a = &q[i * k + 256 * b..i * k + 256 * (b + 1)];
                        for (v, &a) in a.iter().enumerate() {
                            let value = ints.scale[v / 16] as f64 * ints.q[v] as f64
                                - ints.min[v / 16] as f64;
                            let term = d[i * blocks + b] as f64 * value * a as f64;
                            want += term;
                            mag += term.abs();
                        }
                    }
                    let got = scalar[j * rows + i];
                    let err = (got as f64 - want).abs();
                    assert!(
                        err <= 1e-5 * mag,
                        "{format} {j}·{i}: {got} vs {want} ({mag})"
                    );
                }
            }
            // Every path this machine runs, several activation rows against one weight row and
            // several weight rows against one activation row, gives the same values bit for bit.
            for level in levels() {
                for j in 0..n {
                    for count in 1..=MAX_SLOTS {
                        for first in 0..=rows - count {
                            let mut got = vec![0f32; count];
                            let weights = (&w[j * row_bytes..], row_bytes, 1);
                            dot_rows(level, format, weights, &acts, (first, count), &mut got);
                            let want = &scalar[j * rows + first..j * rows + first + count];
                            assert_eq!(got, want, "{format} {level:?} {j} {first}+{count}");
                        }
                    }
                }
                for i in 0..rows {
                    for weights in 2..=MAX_SLOTS {
                        for j in 0..=n - weights {
                            let mut got = vec![0f32; weights];
                            let ws = (&w[j * row_bytes..], row_bytes, weights);
                            dot_rows(level, format, ws, &acts, (i, 1), &mut got);
                            let want: Vec<f32> =
                                (j..j + weights).map(|j| scalar[j * rows + i]).collect();
                            assert_eq!(got, want, "{format} {level:?} {j}+{weights} {i}");
                        }
                    }
                }
            }
        }
    }
}
