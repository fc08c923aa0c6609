//! `Q4_0`/`Q8_0` weights (and `Q5_0`/`IQ4_NL` ones, as `Q8_0`) and `Q4_K`/`Q5_K`/`Q6_K` ones
//! repacked for the integer products, the way llama.cpp's `repack` buffers are: eight weight rows
//! interleaved block by block, so one 256-bit register holds four neighbouring values of each of
//! the eight rows, and one broadcast of four activation bytes feeds all eight rows in a single
//! `vpdpbusd`. Each lane of the accumulator is one output row: the eight rows' scales are converted
//! with one `vcvtph2ps`, and no row needs a horizontal sum per block. About a third of the
//! instructions per weight of the row-major kernel in `int_dot.rs`, and half of those of
//! `kquant_dot.rs`'s.
//!
//! The repacked copy is made on a weight's first product and kept in [`RepackCache`] while the
//! weight lives. The weight's own bytes stay as they are (the reference backend and every other op
//! read them), but where they are borrowed from a mapped model file their pages are released once
//! the copy is made ([`HostBytes::release`](crate::backend::HostBytes)): the copy replaces them in
//! memory, and a rare read of the original layout faults them back in from the file. It runs only
//! where AVX512-VNNI with AVX512VL and F16C are present; elsewhere the row-major kernels run.
//!
//! Layout of one group of eight rows, block by block (`blocks` per row): a header, then the values
//! in 32-byte chunks, chunk `t`, lane `j` (4 bytes) holding bytes `4t..4t + 4` of row `j`'s values
//! in the block. For the 32-value blocks (`Q8_0` activations) the header is the eight rows' f16
//! scales (16 bytes) and the values are value `4t..4t + 4` of the block: `Q4_0` keeps its bytes
//! (low nibbles are values 0..16, high ones 16..32), 4 chunks; `Q8_0` stores each value plus 128 as
//! unsigned, 8 chunks. A short last group repeats its final row. `Q5_0` and `IQ4_NL` blocks are an
//! f16 scale and 32 integers that fit int8 (−16..16, the table's levels), so they are written as
//! the `Q8_0` blocks of the same values and scale and run the `Q8_0` kernel: the same integer sums,
//! at 34 bytes a block instead of 22 or 18 (llama.cpp's `Q5_0` has no repacked kernel and reads the
//! 5-bit values row by row, about three times slower here).
//!
//! The super-blocks (`Q8_K` activations) keep their packed values, interleaved the same way, and
//! have their 6-bit scales widened once: `Q4_K`'s header is the eight `d`, the eight `dmin` (f16),
//! then for each pair of sub-blocks of 32 the eight rows' two scales (16 bytes), then likewise the
//! mins: 160 bytes, and the 128 bytes of nibbles of each row in 32 chunks (1184 bytes for 1152 in
//! the file); `Q5_K` is laid out as `Q4_K` with the 32 bytes of `qh` of each row in 8 chunks before
//! the nibbles (1440 bytes for 1408). `Q6_K`'s header is the eight `d`, then for each sub-block of
//! 16 the eight rows' int8 scales: 144 bytes, padded to 160 (so that every block's chunks sit at
//! the same 32-byte alignment, as `Q4_K`'s do), and the 192 bytes of `ql` and `qh` of each row in 48 chunks (1696 bytes for 1680 in
//! the file), each `qh` byte's nibbles swapped so that one `vpternlogd` joins a value's low four
//! and high two bits. The chunks are ordered as the kernel reads them (see [`q6_k_chunk`]): for
//! each 128 values `c` and each `t < 8`, bytes `4t..4t + 4` of the first and second 32 bytes of
//! `c`'s 64 of `ql`, then of its 32 of `qh`, which hold values `128c + 32l + 4t..` (`l < 4`). The
//! block is then read in address order, one stream that the hardware prefetcher follows; in the
//! file's order (three streams 256 bytes apart, each broken off after 128 bytes) a one-row product
//! streamed a third of the memory bandwidth (TinyLlama `Q6_K` decode 7.8 tokens/s, 21 after).
//! The kernels take the unsigned 4-, 5- and 6-bit values as the unsigned side of `vpdpbusd`, one
//! accumulator per sub-block, and scale it (`vpmulld`); `Q4_K`/`Q5_K` take off the mins with one
//! `vpmaddwd` of a pair of mins against the activations' sums of the pair of sub-blocks, and
//! `Q6_K`'s accumulators start from −32 times the activations' sum of their sub-block (the offset
//! of its values). Every integer sum is exact and
//! the f32 step is `kquant_dot.rs`'s, so the products equal its bit for bit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::simd::SimdLevel;
use crate::backend::{Activations, HostData};
use crate::dtype::DType;
use crate::quant::kquants::scales_mins_k4;

/// Rows per interleaved group.
pub const GROUP: usize = 8;

/// A weight matrix `[n, k]` in the interleaved layout above.
pub struct Repacked {
    /// The weight's own format.
    source: DType,
    /// The layout's: `Q8_0` for `Q5_0` and `IQ4_NL`, else the source's own.
    format: DType,
    bytes: Vec<u8>,
    n: usize,
    /// Blocks per row: of 32 values, or of 256 in the super-block layouts.
    blocks: usize,
}

/// The layout weights of `format` are repacked into for products with `act` activations,
/// if any: the symmetric 32-value formats (an f16 scale and integers that fit int8) with
/// `Q8_0` ones, `Q4_K`, `Q5_K` and `Q6_K` with `Q8_K` ones.
fn layout(format: DType, act: Activations) -> Option<DType> {
    match (format, act) {
        (DType::Q4_0, Activations::Q8_0) => Some(DType::Q4_0),
        (DType::Q8_0 | DType::Q5_0 | DType::IQ4_NL, Activations::Q8_0) => Some(DType::Q8_0),
        (DType::Q4_K | DType::Q5_K | DType::Q6_K, Activations::Q8_K) => Some(format),
        _ => None,
    }
}

/// Of a `layout`: values per block, activation sums per block (see
/// [`Repacked::activation_sums`]), bytes of one block of one group, and the offset of its
/// interleaved values in those bytes.
fn shape(layout: DType) -> (usize, usize, usize, usize) {
    match layout {
        DType::Q4_0 => (32, 1, 16 + 128, 16),
        DType::Q4_K => (256, 4, 160 + 1024, 160),
        DType::Q5_K => (256, 4, 160 + 1280, 160),
        DType::Q6_K => (256, 16, 160 + 1536, 160),
        _ => (32, 1, 16 + 256, 16),
    }
}

/// The place, among a `Q6_K` block's 48 chunks of the layout, of chunk `t` in the file's order
/// (`t < 32`: bytes `4t..4t + 4` of `ql`, else of `qh`): the three chunks that hold values
/// `128c + 32l + 4u..128c + 32l + 4u + 4` (`l < 4`), bytes `4u..` of `ql`'s `64c..` and
/// `64c + 32..` and of `qh`'s `32c..`, are neighbours, in that order, at `3 · (8c + u)`.
fn q6_k_chunk(t: usize) -> usize {
    let (c, u, part) = if t < 32 {
        (t / 16, t % 8, t % 16 / 8)
    } else {
        ((t - 32) / 8, (t - 32) % 8, 2)
    };
    3 * (8 * c + u) + part
}

/// `row` (blocks of `format`) as the `Q8_0` blocks of the same scales and integers.
fn as_q8_0(format: DType, row: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(row.len() / format.block_bytes() * 34);
    let mut q = [0i8; 32];
    for block in row.chunks_exact(format.block_bytes()) {
        crate::quant::block_ints(format, block, &mut q);
        out.extend_from_slice(&block[..2]);
        out.extend(q.iter().map(|&v| v as u8));
    }
    out
}

/// Writes row `j`'s share of one block of a group in `layout` (`dst`, see the module doc)
/// from its `block`, all but the interleaved values: the scales, and for the super-blocks
/// the sub-blocks' scales and mins as bytes. Returns the bytes of `block` interleaved four at
/// a time.
fn put_header<'a>(layout: DType, block: &'a [u8], j: usize, dst: &mut [u8]) -> &'a [u8] {
    match layout {
        DType::Q4_K | DType::Q5_K => {
            dst[2 * j..2 * j + 2].copy_from_slice(&block[..2]);
            dst[16 + 2 * j..16 + 2 * j + 2].copy_from_slice(&block[2..4]);
            let scales = scales_mins_k4(block[4..16].try_into().expect("12 scale bytes"));
            for p in 0..4 {
                let at = 32 + 16 * p + 2 * j;
                dst[at..at + 2].copy_from_slice(&scales[2 * p..2 * p + 2]);
                dst[at + 64..at + 66].copy_from_slice(&scales[8 + 2 * p..10 + 2 * p]);
            }
            &block[16..]
        }
        DType::Q6_K => {
            dst[2 * j..2 * j + 2].copy_from_slice(&block[208..210]);
            for (sub, &scale) in block[192..208].iter().enumerate() {
                dst[16 + 8 * sub + j] = scale;
            }
            &block[..192]
        }
        _ => {
            dst[2 * j..2 * j + 2].copy_from_slice(&block[..2]);
            &block[2..]
        }
    }
}

impl Repacked {
    /// Interleaves the `n` rows of `k` values in `w` (`source`) into `format` (its
    /// [`layout`]).
    fn new(source: DType, format: DType, w: &[u8], n: usize, k: usize) -> Repacked {
        let size = format.block_bytes();
        let (values, _, stride, at) = shape(format);
        let (source_row_bytes, blocks) = (source.row_bytes(k), k / values);
        let groups = n.div_ceil(GROUP);
        let mut bytes = vec![0u8; groups * blocks * stride];
        // Read row by row (the source streams in order); one group's output stays in L1.
        // `Q8_0` values plus 128; `Q6_K`'s `qh` (chunks 32.. of its values) with the two-bit
        // fields h0 h1 h2 h3 of each byte (low bits first) reordered to h2 h3 h0 h1.
        let recode = |t: usize, v: u32| match format {
            DType::Q8_0 => v ^ 0x8080_8080,
            DType::Q6_K if t >= 32 => ((v >> 4) & 0x0f0f_0f0f) | ((v & 0x0f0f_0f0f) << 4),
            _ => v,
        };
        super::threads::for_each_row(&mut bytes, blocks * stride, 4, |g, out| {
            for j in 0..GROUP {
                let r = (g * GROUP + j).min(n - 1);
                let row = &w[r * source_row_bytes..(r + 1) * source_row_bytes];
                let converted;
                let row = if source == format {
                    row
                } else {
                    converted = as_q8_0(source, row);
                    &converted[..]
                };
                for (block, dst) in row.chunks_exact(size).zip(out.chunks_exact_mut(stride)) {
                    let values = put_header(format, block, j, dst);
                    for (t, four) in values.chunks_exact(4).enumerate() {
                        let v = recode(t, u32::from_le_bytes([four[0], four[1], four[2], four[3]]));
                        let chunk = if format == DType::Q6_K {
                            q6_k_chunk(t)
                        } else {
                            t
                        };
                        let at = at + 32 * chunk + 4 * j;
                        dst[at..at + 4].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        });
        Repacked {
            source,
            format,
            bytes,
            n,
            blocks,
        }
    }

    /// Whether the products take activations `act`.
    pub fn takes(&self, act: Activations) -> bool {
        layout(self.source, act) == Some(self.format)
    }

    /// The sums of the activations `q` (rows of `Q8_0` or `Q8_K` values) that the products
    /// take: the sum of each 32 for the 32-value layouts; for `Q4_K`/`Q5_K` those of each 64
    /// values' two halves of 32, as two i16 in one i32 (low half first; a sum of 32 int8 fits
    /// i16); for `Q6_K` −32 times the sum of each 16 (the offset of its values).
    pub fn activation_sums(&self, q: &[i8]) -> Vec<i32> {
        let sum = |a: &[i8]| a.iter().map(|&v| v as i32).sum::<i32>();
        match self.format {
            DType::Q4_K | DType::Q5_K => q
                .chunks_exact(64)
                .map(|a| {
                    let (lo, hi) = a.split_at(32);
                    (sum(lo) as i16 as u16 as u32 | (sum(hi) as i16 as u16 as u32) << 16) as i32
                })
                .collect(),
            DType::Q6_K => q.chunks_exact(16).map(|a| -32 * sum(a)).collect(),
            _ => q.chunks_exact(32).map(sum).collect(),
        }
    }

    /// Rows of the matrix.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// `out[i · ldo + (j − 8·g0)]` = the product of weight row `j` with activation row
    /// `first + i`, for `i < A` and the rows `j` of groups `g0..g1`, clipped to the matrix's
    /// `n` rows. The activations are the rows' int8 values `aq`, their scales `ad` (one per
    /// block: per 32 values for `Q8_0`, per 256 for `Q8_K`) and their
    /// [`activation_sums`](Self::activation_sums) `asum`, rows one after the other.
    pub fn product<const A: usize>(
        &self,
        (aq, ad, asum): (&[i8], &[f32], &[i32]),
        first: usize,
        groups: std::ops::Range<usize>,
        out: &mut [f32],
        ldo: usize,
    ) {
        let blocks = self.blocks;
        let (values, sums_per_block, stride, _) = shape(self.format);
        let (q_row, s_row) = (values * blocks, sums_per_block * blocks);
        let rows = first + A;
        assert!(
            aq.len() >= rows * q_row && ad.len() >= rows * blocks && asum.len() >= rows * s_row
        );
        let acts = (
            &aq[first * q_row..],
            &ad[first * blocks..],
            &asum[first * s_row..],
        );
        let g1 = groups.end.min(self.n.div_ceil(GROUP));
        let cols = (g1 * GROUP)
            .min(self.n)
            .saturating_sub(groups.start * GROUP);
        assert!(A == 0 || out.len() >= (A - 1) * ldo + cols);
        for g in groups.start..g1 {
            let base = &self.bytes[g * blocks * stride..(g + 1) * blocks * stride];
            let mut sums = [[0f32; GROUP]; A];
            group_sums(self.format, base, blocks, acts, &mut sums);
            let first = (g - groups.start) * GROUP;
            let count = (self.n - g * GROUP).min(GROUP);
            for (i, s) in sums.iter().enumerate() {
                out[i * ldo + first..i * ldo + first + count].copy_from_slice(&s[..count]);
            }
        }
    }
}

/// One group's products (see [`x86::group`], [`x86::group_q4_k`], [`x86::group_q6_k`]); only
/// reached where [`supported`] holds.
fn group_sums<const A: usize>(
    format: DType,
    base: &[u8],
    blocks: usize,
    acts: (&[i8], &[f32], &[i32]),
    sums: &mut [[f32; GROUP]; A],
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supported(level)` (checked by `RepackCache::get`, the only source of a
    // `Repacked`) means AVX2, FMA, F16C, AVX512-VNNI and AVX512VL; `base` holds `blocks`
    // blocks of the group and the activations cover `A` rows of `blocks` blocks (asserted by
    // `product`).
    unsafe {
        let base = base.as_ptr();
        match format {
            DType::Q4_0 => x86::group::<true, A>(base, blocks, acts, sums),
            DType::Q4_K => x86::group_q4_k::<A, false>(base, blocks, acts, sums),
            DType::Q5_K => x86::group_q4_k::<A, true>(base, blocks, acts, sums),
            DType::Q6_K => x86::group_q6_k::<A>(base, blocks, acts, sums),
            _ => x86::group::<false, A>(base, blocks, acts, sums),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (format, base, blocks, acts, sums);
        unreachable!("the repacked kernels run only on x86_64");
    }
}

/// Whether this SIMD level on this CPU runs the repacked kernels.
pub fn supported(level: SimdLevel) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        level == SimdLevel::Avx512
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("f16c")
            && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        false
    }
}

/// Repacked copies of the weights a backend has multiplied, each kept while its weight lives.
/// A weight is known by its storage's allocation; the [`Weak`] kept with the copy keeps that
/// address from being reused and stops upgrading once the weight is dropped or changed
/// (`Arc::make_mut` detaches weak references), so a stale copy is never used.
#[derive(Default)]
pub struct RepackCache {
    entries: Mutex<HashMap<usize, Entry>>,
}

struct Entry {
    weight: Weak<HostData>,
    k: usize,
    repacked: Arc<Repacked>,
}

impl std::fmt::Debug for RepackCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.entries.lock().map(|e| e.len()).unwrap_or(0);
        write!(f, "RepackCache({count} weights)")
    }
}

impl RepackCache {
    /// The repacked copy of `weight` (`n` rows of `k` values of `format`, its bytes `w`) for
    /// products with `act` activations, made now if it is not kept yet; `None` where the
    /// repacked kernels do not run.
    pub fn get(
        &self,
        level: SimdLevel,
        weight: &Arc<HostData>,
        (format, w): (DType, &[u8]),
        act: Activations,
        (n, k): (usize, usize),
    ) -> Option<Arc<Repacked>> {
        let to = layout(format, act)?;
        let fits = k.is_multiple_of(shape(to).0) && n > 0 && w.len() >= n * format.row_bytes(k);
        if !fits || !supported(level) {
            return None;
        }
        let key = Arc::as_ptr(weight) as usize;
        let mut entries = self.entries.lock().ok()?;
        if let Some(e) = entries.get(&key) {
            let same = e.weight.upgrade().is_some_and(|a| Arc::ptr_eq(&a, weight));
            let kept = &e.repacked;
            if same && e.k == k && kept.n == n && kept.source == format && kept.format == to {
                return Some(e.repacked.clone());
            }
        }
        entries.retain(|_, e| e.weight.strong_count() > 0);
        let repacked = Arc::new(Repacked::new(format, to, w, n, k));
        if let HostData::Bytes(_, bytes) = &**weight {
            bytes.release();
        }
        entries.insert(
            key,
            Entry {
                weight: Arc::downgrade(weight),
                k,
                repacked: repacked.clone(),
            },
        );
        Some(repacked)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One group of eight rows against `A` activation rows: `sums[i][j]` for row `j`.
    ///
    /// `Q4_0` values are used unsigned (`q + 8`) and `8 · Σ a` of each block is taken off;
    /// `Q8_0` values are stored plus 128 and `128 · Σ a` is taken off.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX512-VNNI and AVX512VL must be present; `base` points at `blocks`
    /// blocks of the group and the activations hold `A` rows of `blocks` blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    pub(super) unsafe fn group<const Q4: bool, const A: usize>(
        base: *const u8,
        blocks: usize,
        (aq, ad, asum): (&[i8], &[f32], &[i32]),
        sums: &mut [[f32; 8]; A],
    ) {
        let stride = if Q4 { 16 + 128 } else { 16 + 256 };
        let low = _mm256_set1_epi8(15);
        let offset = if Q4 { 8 } else { 128 };
        let mut acc = [_mm256_setzero_ps(); A];
        let a32 = aq.as_ptr() as *const i32;
        for c in 0..blocks {
            let p = base.add(c * stride);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            let v = p.add(16);
            let mut s = [[_mm256_setzero_si256(); 2]; A];
            if Q4 {
                for t in 0..4 {
                    let packed = _mm256_loadu_si256(v.add(32 * t) as *const __m256i);
                    let lo = _mm256_and_si256(packed, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
                    for (i, s) in s.iter_mut().enumerate() {
                        let a = a32.add(i * 8 * blocks + 8 * c);
                        let al = _mm256_set1_epi32(a.add(t).read_unaligned());
                        let ah = _mm256_set1_epi32(a.add(4 + t).read_unaligned());
                        s[0] = _mm256_dpbusd_epi32(s[0], lo, al);
                        s[1] = _mm256_dpbusd_epi32(s[1], hi, ah);
                    }
                }
            } else {
                for t in 0..8 {
                    let values = _mm256_loadu_si256(v.add(32 * t) as *const __m256i);
                    for (i, s) in s.iter_mut().enumerate() {
                        let a = a32.add(i * 8 * blocks + 8 * c);
                        let at = _mm256_set1_epi32(a.add(t).read_unaligned());
                        s[t % 2] = _mm256_dpbusd_epi32(s[t % 2], values, at);
                    }
                }
            }
            for i in 0..A {
                let shift = _mm256_set1_epi32(offset * *asum.get_unchecked(i * blocks + c));
                let total = _mm256_sub_epi32(_mm256_add_epi32(s[i][0], s[i][1]), shift);
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(*ad.get_unchecked(i * blocks + c)));
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, acc[i]);
            }
        }
        for i in 0..A {
            _mm256_storeu_ps(sums[i].as_mut_ptr(), acc[i]);
        }
    }

    /// One group of eight `Q4_K` rows (`Q5_K` with `FIVE`) against `A` `Q8_K` activation
    /// rows: `sums[i][j]` for row `j`. Per super-block and lane the exact `isum = Σ_j sc_j · Σ q·a` and
    /// `msum = Σ_j mn_j · Σ a` (the mins by `madd` of the i16 pairs of mins and of the
    /// activations' sums of 32), then `kquant_dot`'s f32 step: `(d · d_a) · isum −
    /// (dmin · d_a) · msum`, added in order, so the value is the row-major kernels' bit for
    /// bit.
    ///
    /// # Safety
    /// As [`group`], with `base` holding `blocks` `Q4_K` (`Q5_K`) blocks of the group and the
    /// activations `A` rows of `256 · blocks` values, `blocks` scales and `4 · blocks` sums.
    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    pub(super) unsafe fn group_q4_k<const A: usize, const FIVE: bool>(
        base: *const u8,
        blocks: usize,
        (aq, ad, asum): (&[i8], &[f32], &[i32]),
        sums: &mut [[f32; 8]; A],
    ) {
        let low = _mm256_set1_epi8(15);
        let (word, one) = (_mm256_set1_epi32(0xffff), _mm256_set1_epi8(1));
        // `Q5_K`'s eight chunks of `qh` come before the nibbles.
        let (stride, qs) = if FIVE { (1440, 416) } else { (1184, 160) };
        let mut total = [_mm256_setzero_ps(); A];
        let a32 = aq.as_ptr() as *const i32;
        for b in 0..blocks {
            let p = base.add(b * stride);
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            let mw = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
            let mut isum = [_mm256_setzero_si256(); A];
            let mut msum = [_mm256_setzero_si256(); A];
            for c in 0..4 {
                // Sub-blocks 2c (low nibbles) and 2c + 1 (high), two accumulators each.
                let mut s = [[_mm256_setzero_si256(); 4]; A];
                for t in 0..8 {
                    let packed = _mm256_loadu_si256(p.add(qs + 256 * c + 32 * t) as *const __m256i);
                    let mut lo = _mm256_and_si256(packed, low);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
                    if FIVE {
                        // Bits 2c and 2c + 1 of `qh` are bit 4 of the low and high values,
                        // masked to bit 0 before the 16-bit shift left: nothing crosses bytes.
                        let qh = _mm256_loadu_si256(p.add(160 + 32 * t) as *const __m256i);
                        let qh = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32));
                        let bit = |v: __m256i| _mm256_slli_epi16(_mm256_and_si256(v, one), 4);
                        lo = _mm256_or_si256(lo, bit(qh));
                        hi = _mm256_or_si256(hi, bit(_mm256_srli_epi16(qh, 1)));
                    }
                    for (i, s) in s.iter_mut().enumerate() {
                        let a = a32.add(i * 64 * blocks + 64 * b + 16 * c);
                        let al = _mm256_set1_epi32(a.add(t).read_unaligned());
                        let ah = _mm256_set1_epi32(a.add(8 + t).read_unaligned());
                        s[t % 2] = _mm256_dpbusd_epi32(s[t % 2], lo, al);
                        s[2 + t % 2] = _mm256_dpbusd_epi32(s[2 + t % 2], hi, ah);
                    }
                }
                // The eight rows' scales (and mins) of sub-blocks 2c, 2c + 1 as i16 pairs.
                let sc =
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(32 + 16 * c) as *const __m128i));
                let mn =
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(96 + 16 * c) as *const __m128i));
                let (sc_lo, sc_hi) = (_mm256_and_si256(sc, word), _mm256_srli_epi32(sc, 16));
                for i in 0..A {
                    let lo = _mm256_mullo_epi32(_mm256_add_epi32(s[i][0], s[i][1]), sc_lo);
                    let hi = _mm256_mullo_epi32(_mm256_add_epi32(s[i][2], s[i][3]), sc_hi);
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_add_epi32(lo, hi));
                    let pair = *asum.get_unchecked(i * 4 * blocks + 4 * b + c);
                    msum[i] =
                        _mm256_add_epi32(msum[i], _mm256_madd_epi16(mn, _mm256_set1_epi32(pair)));
                }
            }
            for i in 0..A {
                let da = _mm256_set1_ps(*ad.get_unchecked(i * blocks + b));
                let scaled = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[i]));
                let mins = _mm256_mul_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(msum[i]));
                total[i] = _mm256_add_ps(total[i], _mm256_sub_ps(scaled, mins));
            }
        }
        for i in 0..A {
            _mm256_storeu_ps(sums[i].as_mut_ptr(), total[i]);
        }
    }

    /// One group of eight `Q6_K` rows against `A` `Q8_K` activation rows: `sums[i][j]` for
    /// row `j`. Per super-block and lane the exact `Σ_s sc_s · (Σ u·a − 32 Σ a)` of the
    /// unsigned 6-bit `u = q + 32`, each sub-block's accumulator starting from its `−32 Σ a`,
    /// then `kquant_dot`'s f32 step `(d · d_a) · isum`, added in order, so the value is the
    /// row-major kernels' bit for bit.
    ///
    /// # Safety
    /// As [`group`], with `base` holding `blocks` `Q6_K` blocks of the group and the
    /// activations `A` rows of `256 · blocks` values, `blocks` scales and `16 · blocks` sums.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
    pub(super) unsafe fn group_q6_k<const A: usize>(
        base: *const u8,
        blocks: usize,
        (aq, ad, asum): (&[i8], &[f32], &[i32]),
        sums: &mut [[f32; 8]; A],
    ) {
        let (nibble, pairs) = (_mm256_set1_epi8(15), _mm256_set1_epi8(0x33));
        // Bits 0–3 from the second operand where the first is set, 4–7 from the third.
        let select = |a: __m256i, b: __m256i| _mm256_ternarylogic_epi32::<0xca>(nibble, a, b);
        let mut total = [_mm256_setzero_ps(); A];
        let a32 = aq.as_ptr() as *const i32;
        for b in 0..blocks {
            let p = base.add(b * (160 + 1536));
            let mut isum = [_mm256_setzero_si256(); A];
            for c in 0..2 {
                for half in 0..2 {
                    // Values 128c + 32l + 4t.. for t in 4·half..4·half + 4: sub-block
                    // 8c + 2l + half, one accumulator for each l.
                    let mut s = [[_mm256_setzero_si256(); 4]; A];
                    for (i, s) in s.iter_mut().enumerate() {
                        for (l, s) in s.iter_mut().enumerate() {
                            let at = i * 16 * blocks + 16 * b + 8 * c + 2 * l + half;
                            *s = _mm256_set1_epi32(*asum.get_unchecked(at));
                        }
                    }
                    for t in 4 * half..4 * half + 4 {
                        // The three chunks of these values are neighbours (`q6_k_chunk`).
                        let chunks = p.add(160 + 96 * (8 * c + t)) as *const __m256i;
                        let ql0 = _mm256_loadu_si256(chunks);
                        let ql1 = _mm256_loadu_si256(chunks.add(1));
                        let qh = _mm256_loadu_si256(chunks.add(2));
                        // qh bytes are h2 h3 h0 h1: h2 at bits 0–1 and h0 at 4–5 (h3, h1
                        // after a shift by 2), masked before the 16-bit shifts, so nothing
                        // crosses into bits 4–7 of the neighbouring byte.
                        let h02 = _mm256_and_si256(qh, pairs);
                        let h13 = _mm256_and_si256(_mm256_srli_epi16(qh, 2), pairs);
                        let u = [
                            select(ql0, h02),
                            select(ql1, h13),
                            select(_mm256_srli_epi16(ql0, 4), _mm256_slli_epi16(h02, 4)),
                            select(_mm256_srli_epi16(ql1, 4), _mm256_slli_epi16(h13, 4)),
                        ];
                        for (i, s) in s.iter_mut().enumerate() {
                            let a = a32.add(i * 64 * blocks + 64 * b + 32 * c + t);
                            for (l, s) in s.iter_mut().enumerate() {
                                let at = _mm256_set1_epi32(a.add(8 * l).read_unaligned());
                                *s = _mm256_dpbusd_epi32(*s, u[l], at);
                            }
                        }
                    }
                    let scales: [__m256i; 4] = std::array::from_fn(|l| {
                        let sub = 8 * c + 2 * l + half;
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(16 + 8 * sub) as *const __m128i))
                    });
                    for (isum, s) in isum.iter_mut().zip(&s) {
                        for (&s, &sc) in s.iter().zip(&scales) {
                            *isum = _mm256_add_epi32(*isum, _mm256_mullo_epi32(s, sc));
                        }
                    }
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            for i in 0..A {
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*ad.get_unchecked(i * blocks + b)));
                total[i] =
                    _mm256_add_ps(total[i], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum[i])));
            }
        }
        for i in 0..A {
            _mm256_storeu_ps(sums[i].as_mut_ptr(), total[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{HostBytes, SharedBytes};
    use crate::quant;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Bytes that count the releases asked of them.
    struct Counted(Vec<u8>, AtomicUsize);

    impl SharedBytes for Counted {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
        fn release(&self, _range: std::ops::Range<usize>) {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A weight borrowed from a shared buffer is released once, when its repacked copy is
    /// made (not again on later products), and it still reads as the original bytes.
    #[test]
    fn a_borrowed_weight_is_released_once_its_copy_is_made() {
        let level = SimdLevel::detect();
        if !supported(level) {
            eprintln!("skipped: this CPU has no AVX512-VNNI, so the repacked kernels never run");
            return;
        }
        let (n, k) = (9, 64);
        let values: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 - 6.0).collect();
        let mut w = vec![0u8; n * DType::Q4_0.row_bytes(k)];
        quant::quantize(DType::Q4_0, &values, &mut w);
        let source = Arc::new(Counted(w.clone(), AtomicUsize::new(0)));
        let bytes = HostBytes::borrowed(source.clone(), 0..w.len()).unwrap();
        let weight = Arc::new(HostData::Bytes(DType::Q4_0, bytes));
        let cache = RepackCache::default();
        for _ in 0..2 {
            let format = (DType::Q4_0, weight.bytes());
            let rep = cache.get(level, &weight, format, Activations::Q8_0, (n, k));
            assert!(rep.is_some());
            assert_eq!(source.1.load(Ordering::Relaxed), 1, "released once");
        }
        assert_eq!(weight.bytes(), &w[..]);
    }

    /// Every row of a repacked `Q4_0`/`Q8_0`/`Q5_0`/`IQ4_NL` matrix (with a short last group)
    /// against plain integer sums of the original blocks, for one and four activation rows.
    #[test]
    fn repacked_products_match_plain_block_sums() {
        let level = SimdLevel::detect();
        if !supported(level) {
            eprintln!("skipped: this CPU has no AVX512-VNNI, so the repacked kernels never run");
            return;
        }
        let (n, k) = (21, 96);
        let value = |i: usize| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 5) as f32);
        let weights: Vec<f32> = (0..n * k).map(value).collect();
        let acts: Vec<f32> = (0..4 * k).map(|i| value(i + 12345) * 3.0).collect();
        let mut aq = vec![0i8; acts.len()];
        let ad: Vec<f32> = acts
            .chunks(32)
            .zip(aq.chunks_mut(32))
            .map(|(x, q)| quant::quantize_i8(x, q))
            .collect();
        let sums: Vec<i32> = aq
            .chunks(32)
            .map(|b| b.iter().map(|&v| v as i32).sum())
            .collect();
        for format in [DType::Q4_0, DType::Q8_0, DType::Q5_0, DType::IQ4_NL] {
            let mut w = vec![0u8; n * format.row_bytes(k)];
            if format == DType::IQ4_NL {
                // No quantizer: bytes that reach every level, scales of 1/64 … 1/32.
                for (i, b) in w.iter_mut().enumerate() {
                    *b = (i * 7919 % 251) as u8;
                }
                for block in w.chunks_exact_mut(format.block_bytes()) {
                    let scale = 0x2400 + block[2] as u16;
                    block[..2].copy_from_slice(&scale.to_le_bytes());
                }
            } else {
                quant::quantize(format, &weights, &mut w);
            }
            let to = layout(format, Activations::Q8_0).unwrap();
            let rep = Repacked::new(format, to, &w, n, k);
            let (mut one, mut four) = (vec![0f32; n], vec![0f32; 4 * n]);
            rep.product::<1>((&aq, &ad, &sums), 0, 0..3, &mut one, 0);
            rep.product::<4>((&aq, &ad, &sums), 0, 0..3, &mut four, n);
            let size = format.block_bytes();
            for i in 0..4 {
                for r in 0..n {
                    let mut want = 0f64;
                    for c in 0..k / 32 {
                        let at = r * format.row_bytes(k) + c * size;
                        let mut q = [0i8; 32];
                        let d = quant::block_ints(format, &w[at..at + size], &mut q);
                        let a = &aq[i * k + 32 * c..i * k + 32 * c + 32];
                        let dot: i32 = a.iter().zip(&q).map(|(&x, &y)| x as i32 * y as i32).sum();
                        want += (ad[i * k / 32 + c] * d) as f64 * dot as f64;
                    }
                    let got = four[i * n + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{format} row {r} act {i}: {got} vs {want}"
                    );
                    if i == 0 {
                        assert_eq!(one[r], four[r], "{format} row {r}");
                    }
                }
            }
        }
    }

    /// Every product of a repacked `Q4_K`/`Q5_K`/`Q6_K` matrix (short last groups, one and several
    /// super-blocks, random scales, mins and values in every row and block) equals the
    /// row-major `kquant_dot` product (checked there against f64 sums) bit for bit, for four
    /// activation rows at a time, single rows, and a range of groups written at an offset.
    #[test]
    fn repacked_super_blocks_equal_the_row_major_products() {
        use crate::backend::cpu::int_dot::sums_of_16;
        use crate::backend::cpu::kquant_dot::{dot_rows, Q8KRows};
        let level = SimdLevel::detect();
        if !supported(level) {
            eprintln!("skipped: this CPU has no AVX512-VNNI, so the repacked kernels never run");
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let rows = 6;
        for format in [DType::Q4_K, DType::Q5_K, DType::Q6_K] {
            for (n, blocks) in [(21, 1), (8, 3), (13, 2)] {
                let (k, size) = (256 * blocks, format.block_bytes());
                let row_bytes = blocks * size;
                let mut w: Vec<u8> = (0..n * row_bytes).map(|_| next() as u8).collect();
                // Random bytes could make an f16 scale infinite: small ones instead.
                let d_at: &[usize] = if format == DType::Q6_K {
                    &[208]
                } else {
                    &[0, 2]
                };
                for block in w.chunks_exact_mut(size) {
                    for &at in d_at {
                        let bits = quant::f16_bits(0.001 * (1 + next() % 97) as f32);
                        block[at..at + 2].copy_from_slice(&bits.to_le_bytes());
                    }
                }
                let x: Vec<f32> = (0..rows * k)
                    .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                    .collect();
                let mut q = vec![0i8; rows * k];
                let d: Vec<f32> = x
                    .chunks(256)
                    .zip(q.chunks_mut(256))
                    .map(|(x, q)| quant::quantize_q8_k(x, q))
                    .collect();
                let sixteen = sums_of_16(&q);
                let acts = Q8KRows {
                    q: &q,
                    d: &d,
                    sums: &sixteen,
                    k,
                };
                let want = |i: usize, j: usize| {
                    let mut out = [0f32];
                    let weight = (&w[j * row_bytes..], row_bytes, 1);
                    dot_rows(SimdLevel::Scalar, format, weight, &acts, (i, 1), &mut out);
                    out[0]
                };

                let rep = Repacked::new(format, format, &w, n, k);
                assert!(rep.takes(Activations::Q8_K) && !rep.takes(Activations::Q8_0));
                let sums = rep.activation_sums(&q);
                let (groups, acts) = (n.div_ceil(GROUP), (&q[..], &d[..], &sums[..]));
                let mut got = vec![f32::NAN; rows * n];
                rep.product::<4>(acts, 0, 0..groups, &mut got, n);
                for i in 4..rows {
                    rep.product::<1>(acts, i, 0..groups, &mut got[i * n..], 0);
                }
                for i in 0..rows {
                    for j in 0..n {
                        let (g, e) = (got[i * n + j], want(i, j));
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{format} {n}×{k} {j}·{i}: {g} vs {e}"
                        );
                    }
                }
                let mut tail = vec![f32::NAN; n - GROUP];
                rep.product::<1>(acts, 5, 1..groups, &mut tail, 0);
                for (j, &g) in tail.iter().enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        want(5, GROUP + j).to_bits(),
                        "{format} tail {j}"
                    );
                }
            }
        }
    }
}
