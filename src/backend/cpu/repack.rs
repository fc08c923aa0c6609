//! `Q4_0`/`Q8_0` weights (and `Q5_0`/`IQ4_NL` ones, as `Q8_0`) repacked for the integer
//! products, the way llama.cpp's `repack` buffers are: eight weight rows interleaved block by block, so one 256-bit register holds
//! four neighbouring values of each of the eight rows, and one broadcast of four activation
//! bytes feeds all eight rows in a single `vpdpbusd`. Each lane of the accumulator is one
//! output row: the eight rows' scales are converted with one `vcvtph2ps`, and no row needs a
//! horizontal sum per block. About a third of the instructions per weight of the row-major
//! kernel in `int_dot.rs`.
//!
//! The repacked copy is made on a weight's first product and kept in [`RepackCache`] while
//! the weight lives. The weight's own bytes stay as they are (the reference backend and every
//! other op read them), but where they are borrowed from a mapped model file their pages are
//! released once the copy is made ([`HostBytes::release`](crate::backend::HostBytes)): the
//! copy replaces them in memory, and a rare read of the original layout faults them back in
//! from the file. It runs only where AVX512-VNNI with AVX512VL and F16C are present;
//! elsewhere the row-major kernels run.
//!
//! Layout of one group of eight rows, block by block (`blocks` per row): the eight rows' f16
//! scales (16 bytes), then the values in 32-byte chunks, chunk `t`, lane `j` (4 bytes) holding
//! row `j`'s values `4t..4t + 4` of the block. `Q4_0` keeps its bytes (low nibbles are values
//! 0..16, high ones 16..32), 4 chunks; `Q8_0` stores each value plus 128 as unsigned, 8 chunks.
//! A short last group repeats its final row. `Q5_0` and `IQ4_NL` blocks are an f16 scale and 32
//! integers that fit int8 (−16..16, the table's levels), so they are written as the `Q8_0`
//! blocks of the same values and scale and run the `Q8_0` kernel: the same integer sums, at
//! 34 bytes a block instead of 22 or 18 (llama.cpp's `Q5_0` has no repacked kernel and reads
//! the 5-bit values row by row, about three times slower here).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::simd::SimdLevel;
use crate::backend::HostData;
use crate::dtype::DType;

/// Rows per interleaved group.
pub const GROUP: usize = 8;

/// A weight matrix `[n, k]` in the interleaved layout above.
pub struct Repacked {
    /// The weight's own format.
    source: DType,
    /// The layout's: `Q4_0`, or `Q8_0` for the other formats.
    format: DType,
    bytes: Vec<u8>,
    n: usize,
    blocks: usize,
}

/// Whether weights of `format` are repacked: the symmetric 32-value formats, whose blocks are
/// one f16 scale and integers that fit int8.
fn repacks(format: DType) -> bool {
    matches!(
        format,
        DType::Q4_0 | DType::Q8_0 | DType::Q5_0 | DType::IQ4_NL
    )
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

impl Repacked {
    /// Bytes of one block of one group: eight scales and the eight rows' values.
    fn block_stride(format: DType) -> usize {
        16 + GROUP * (format.block_bytes() - 2)
    }

    /// Interleaves the `n` rows of `k` values in `w` (`source` one that [`repacks`]).
    fn new(source: DType, w: &[u8], n: usize, k: usize) -> Repacked {
        let format = if source == DType::Q4_0 {
            DType::Q4_0
        } else {
            DType::Q8_0
        };
        let size = format.block_bytes();
        let (source_row_bytes, blocks) = (source.row_bytes(k), k / 32);
        let stride = Self::block_stride(format);
        let groups = n.div_ceil(GROUP);
        let mut bytes = vec![0u8; groups * blocks * stride];
        // Read row by row (the source streams in order); one group's output stays in L1.
        let flip = if format == DType::Q8_0 {
            0x8080_8080
        } else {
            0
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
                    dst[2 * j..2 * j + 2].copy_from_slice(&block[..2]);
                    for (t, four) in block[2..].chunks_exact(4).enumerate() {
                        let v = u32::from_le_bytes([four[0], four[1], four[2], four[3]]) ^ flip;
                        let at = 16 + 32 * t + 4 * j;
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

    /// Rows of the matrix.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// `out[i · ldo + (j − 8·g0)] = Σ_c ad_i[c] · d_jc · Σ aq_i · q_j` for activation rows
    /// `i < A` (`aq`, `ad`, `asum` hold them one after the other, `blocks` blocks each, and
    /// `asum[i · blocks + c]` is the sum of activation block `c`) and the rows `j` of groups
    /// `g0..g1`, clipped to the matrix's `n` rows.
    pub fn product<const A: usize>(
        &self,
        (aq, ad, asum): (&[i8], &[f32], &[i32]),
        groups: std::ops::Range<usize>,
        out: &mut [f32],
        ldo: usize,
    ) {
        let blocks = self.blocks;
        assert!(aq.len() >= A * 32 * blocks && ad.len() >= A * blocks && asum.len() >= A * blocks);
        let g1 = groups.end.min(self.n.div_ceil(GROUP));
        let cols = (g1 * GROUP)
            .min(self.n)
            .saturating_sub(groups.start * GROUP);
        assert!(A == 0 || out.len() >= (A - 1) * ldo + cols);
        let stride = Self::block_stride(self.format);
        for g in groups.start..g1 {
            let base = &self.bytes[g * blocks * stride..(g + 1) * blocks * stride];
            let mut sums = [[0f32; GROUP]; A];
            group_sums(
                self.format == DType::Q4_0,
                base,
                blocks,
                (aq, ad, asum),
                &mut sums,
            );
            let first = (g - groups.start) * GROUP;
            let count = (self.n - g * GROUP).min(GROUP);
            for (i, s) in sums.iter().enumerate() {
                out[i * ldo + first..i * ldo + first + count].copy_from_slice(&s[..count]);
            }
        }
    }
}

/// One group's products (see [`x86::group`]); only reached where [`supported`] holds.
fn group_sums<const A: usize>(
    q4: bool,
    base: &[u8],
    blocks: usize,
    acts: (&[i8], &[f32], &[i32]),
    sums: &mut [[f32; GROUP]; A],
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supported(level)` (checked by `RepackCache::get`, the only source of a
    // `Repacked`) means AVX2, FMA, F16C, AVX512-VNNI and AVX512VL; `base` holds `blocks`
    // blocks of the group and the activations cover `blocks` blocks per row (asserted by
    // `product`).
    unsafe {
        if q4 {
            x86::group::<true, A>(base.as_ptr(), blocks, acts, sums)
        } else {
            x86::group::<false, A>(base.as_ptr(), blocks, acts, sums)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (q4, base, blocks, acts, sums);
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
    /// The repacked copy of `weight` (`n` rows of `k` values of `format`, its bytes `w`),
    /// made now if it is not kept yet; `None` where the repacked kernels do not run.
    pub fn get(
        &self,
        level: SimdLevel,
        weight: &Arc<HostData>,
        (format, w): (DType, &[u8]),
        n: usize,
        k: usize,
    ) -> Option<Arc<Repacked>> {
        let fits =
            repacks(format) && k.is_multiple_of(32) && n > 0 && w.len() >= n * format.row_bytes(k);
        if !fits || !supported(level) {
            return None;
        }
        let key = Arc::as_ptr(weight) as usize;
        let mut entries = self.entries.lock().ok()?;
        if let Some(e) = entries.get(&key) {
            let same = e.weight.upgrade().is_some_and(|a| Arc::ptr_eq(&a, weight));
            if same && e.k == k && e.repacked.n == n && e.repacked.source == format {
                return Some(e.repacked.clone());
            }
        }
        entries.retain(|_, e| e.weight.strong_count() > 0);
        let repacked = Arc::new(Repacked::new(format, w, n, k));
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
            let rep = cache.get(level, &weight, (DType::Q4_0, weight.bytes()), n, k);
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
            let rep = Repacked::new(format, &w, n, k);
            let (mut one, mut four) = (vec![0f32; n], vec![0f32; 4 * n]);
            rep.product::<1>((&aq, &ad, &sums), 0..3, &mut one, 0);
            rep.product::<4>((&aq, &ad, &sums), 0..3, &mut four, n);
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
}
