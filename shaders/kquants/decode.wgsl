// llama.cpp's formats beyond Q8_0 and Q4_0 decoded in registers, one group of 32 values at a
// time, for the `mv` and `mm_tiled` products and the `dequantize` kernel of `shaders/quant/` (a
// prelude of it: it reads that file's `q`, `p`, `row_start`, `Group` and value helpers): the
// super-block formats (Q2_K … Q6_K and IQ4_XS, 256 values each; layouts of
// src/quant/kquants.rs) and the legacy 32-value ones (Q4_1, Q5_0, Q5_1 and IQ4_NL; layouts of
// src/quant/legacy.rs), and BF16 (the top halves of f32s, 32 to a group). Each group comes
// back as its f32 values, every scale and minimum
// applied (the group's scale is 1): a Q4_K group is one sub-block with one scale and minimum
// (Q5_K and IQ4_XS too), but a Q2_K, Q3_K or Q6_K group spans two sub-blocks of 16 with a scale
// each, and `(d·sc)·q − dmin·mn` (Q4_K) or `d·q + m` (Q4_1) is not a multiple of one scale anyway.

// Whether `format` is one of the formats decoded here.
fn kq_reads(format: u32) -> bool {
    return format == FMT_Q2_K || format == FMT_Q3_K || format == FMT_Q4_K || format == FMT_Q5_K
        || format == FMT_Q6_K || format == FMT_IQ4_XS || format == FMT_Q4_1 || format == FMT_Q5_0
        || format == FMT_Q5_1 || format == FMT_IQ4_NL || format == FMT_BF16;
}

// Group g (values 32g..) of weight row `row` of the format `format` (one `kq_reads` takes),
// every scale and minimum applied.
fn kq_group(format: u32, row: u32, g: u32) -> Group {
    switch format {
        case FMT_Q2_K: {
            return kq_q2_k_group(row, g);
        }
        case FMT_Q3_K: {
            return kq_q3_k_group(row, g);
        }
        case FMT_Q4_K: {
            return kq_q4_k_group(row, g);
        }
        case FMT_Q5_K: {
            return kq_q5_k_group(row, g);
        }
        case FMT_Q6_K: {
            return kq_q6_k_group(row, g);
        }
        case FMT_Q4_1: {
            return kq_q4_1_group(row, g);
        }
        case FMT_Q5_0: {
            return kq_q5_0_group(row, g);
        }
        case FMT_Q5_1: {
            return kq_q5_1_group(row, g);
        }
        case FMT_IQ4_NL: {
            return kq_iq4_nl_group(row, g);
        }
        case FMT_BF16: {
            return kq_bf16_group(row, g);
        }
        default: {
            return kq_iq4_xs_group(row, g);
        }
    }
}

// Byte `i` of the bytes from word `w` of `q` on.
fn kq_byte(w: u32, i: u32) -> u32 {
    return (q[w + i / 4u] >> (8u * (i % 4u))) & 0xffu;
}

// Group g (values 32g..) of Q4_K weight row `row`. A super-block is word-aligned: d and dmin
// (word 0), 12 bytes of packed 6-bit scales and mins (words 1..4), 128 bytes of nibbles (words
// 4..36). Sub-block j = g % 8 is nibble half j % 2 of bytes 32·(j / 2).. of the nibbles.
fn kq_q4_k_group(row: u32, g: u32) -> Group {
    let wb = (row_start(row, (p.k / 256u) * Q4_K_BLOCK_BYTES) + (g / 8u) * Q4_K_BLOCK_BYTES) / 4u;
    let j = g % 8u;
    let am = kq_scale_min(wb, j);
    let a = am.x;
    let m = am.y;
    let qb = wb + 4u + 8u * (j / 2u);
    if ((j & 1u) == 0u) {
        return Group(kq_low(q[qb], a, m), kq_low(q[qb + 1u], a, m), kq_low(q[qb + 2u], a, m),
                     kq_low(q[qb + 3u], a, m), kq_low(q[qb + 4u], a, m), kq_low(q[qb + 5u], a, m),
                     kq_low(q[qb + 6u], a, m), kq_low(q[qb + 7u], a, m), 1.0);
    }
    return Group(kq_high(q[qb], a, m), kq_high(q[qb + 1u], a, m), kq_high(q[qb + 2u], a, m),
                 kq_high(q[qb + 3u], a, m), kq_high(q[qb + 4u], a, m), kq_high(q[qb + 5u], a, m),
                 kq_high(q[qb + 6u], a, m), kq_high(q[qb + 7u], a, m), 1.0);
}

// Sub-block j's scale `d·sc` and minimum `dmin·mn` of the Q4_K or Q5_K super-block at word
// `wb`: d and dmin in word 0, the 6-bit scales and mins packed in the 12 bytes after it
// (`scale_min_k4` of src/quant/kquants.rs).
fn kq_scale_min(wb: u32, j: u32) -> vec2<f32> {
    var sc: u32;
    var mn: u32;
    if (j < 4u) {
        sc = kq_byte(wb + 1u, j) & 63u;
        mn = kq_byte(wb + 1u, j + 4u) & 63u;
    } else {
        let b = kq_byte(wb + 1u, j + 4u);
        sc = (b & 15u) | ((kq_byte(wb + 1u, j - 4u) >> 6u) << 4u);
        mn = (b >> 4u) | ((kq_byte(wb + 1u, j) >> 6u) << 4u);
    }
    return vec2<f32>(f16_scale(q[wb] & 0xffffu) * f32(sc), f16_scale(q[wb] >> 16u) * f32(mn));
}

// Group g of Q5_K weight row `row`: Q4_K's super-block with the 32 bytes `qh` of fifth bits
// between the scales and the nibbles (words 4..12; the nibbles words 12..44). Value m of
// sub-block j = g % 8 is Q4_K's nibble plus 16 times bit j of `qh` byte m.
fn kq_q5_k_group(row: u32, g: u32) -> Group {
    let wb = (row_start(row, (p.k / 256u) * Q5_K_BLOCK_BYTES) + (g / 8u) * Q5_K_BLOCK_BYTES) / 4u;
    let j = g % 8u;
    let am = kq_scale_min(wb, j);
    let qb = wb + 12u + 8u * (j / 2u);
    let s = 4u * (j & 1u);
    return Group(kq_q5(q[qb], q[wb + 4u], s, j, am), kq_q5(q[qb + 1u], q[wb + 5u], s, j, am),
                 kq_q5(q[qb + 2u], q[wb + 6u], s, j, am), kq_q5(q[qb + 3u], q[wb + 7u], s, j, am),
                 kq_q5(q[qb + 4u], q[wb + 8u], s, j, am), kq_q5(q[qb + 5u], q[wb + 9u], s, j, am),
                 kq_q5(q[qb + 6u], q[wb + 10u], s, j, am), kq_q5(q[qb + 7u], q[wb + 11u], s, j, am),
                 1.0);
}

// Four Q5_K values `a·q − m` (`am`): the nibbles at bit `s` of the `qs` word `w` joined with
// bit `j` of each byte of the `qh` word `hw` as their fifth bit.
fn kq_q5(w: u32, hw: u32, s: u32, j: u32, am: vec2<f32>) -> vec4<f32> {
    let v = ((w >> s) & 0x0f0f0f0fu) | (((hw >> j) & 0x01010101u) << 4u);
    return am.x * unsigned_byte_vals(v) - am.y;
}

// The low nibbles of a word as Q4_K values `a·q − m` (`q4_low_vals` is q − 8, exactly).
fn kq_low(w: u32, a: f32, m: f32) -> vec4<f32> {
    return a * (q4_low_vals(w) + 8.0) - m;
}

// The high nibbles of a word as Q4_K values.
fn kq_high(w: u32, a: f32, m: f32) -> vec4<f32> {
    return a * (q4_high_vals(w) + 8.0) - m;
}

// Group g of Q6_K weight row `row`. A super-block starts on an even byte: 128 bytes of low
// nibbles `ql`, 64 of 2-bit high parts `qh`, 16 int8 scales, the f16 d. Group j = g % 8 is half
// n = j / 4 of the block, part t = j % 4 of it: nibble half t / 2 of `ql` bytes
// 64n + 32·(t % 2).., bits 2t.. of `qh` bytes 32n.., minus 32, scales 8n + 2t (values 0..16)
// and the next (16..32).
fn kq_q6_k_group(row: u32, g: u32) -> Group {
    let o = row_start(row, (p.k / 256u) * Q6_K_BLOCK_BYTES) + (g / 8u) * Q6_K_BLOCK_BYTES;
    let j = g % 8u;
    let n = j / 4u;
    let t = j % 4u;
    let lo_at = o + 64u * n + 32u * (t % 2u);
    let hi_at = o + 128u + 32u * n;
    let l = words9(lo_at / 4u);
    let lodd = (lo_at & 2u) != 0u;
    let h = words9(hi_at / 4u);
    let hodd = (hi_at & 2u) != 0u;
    let scales = half_at(o + 192u + 8u * n + 2u * t);
    let d = f16_scale(half_at(o + 208u));
    let s0 = d * f32(sbyte(scales, 0u));
    let s1 = d * f32(sbyte(scales, 1u));
    let ls = 4u * (t / 2u);
    let hs = 2u * t;
    return Group(
        s0 * kq_q6(shifted_word(l.w0, l.w1, lodd), shifted_word(h.w0, h.w1, hodd), ls, hs),
        s0 * kq_q6(shifted_word(l.w1, l.w2, lodd), shifted_word(h.w1, h.w2, hodd), ls, hs),
        s0 * kq_q6(shifted_word(l.w2, l.w3, lodd), shifted_word(h.w2, h.w3, hodd), ls, hs),
        s0 * kq_q6(shifted_word(l.w3, l.w4, lodd), shifted_word(h.w3, h.w4, hodd), ls, hs),
        s1 * kq_q6(shifted_word(l.w4, l.w5, lodd), shifted_word(h.w4, h.w5, hodd), ls, hs),
        s1 * kq_q6(shifted_word(l.w5, l.w6, lodd), shifted_word(h.w5, h.w6, hodd), ls, hs),
        s1 * kq_q6(shifted_word(l.w6, l.w7, lodd), shifted_word(h.w6, h.w7, hodd), ls, hs),
        s1 * kq_q6(shifted_word(l.w7, l.w8, lodd), shifted_word(h.w7, h.w8, hodd), ls, hs),
        1.0);
}

// Four Q6_K quants as values −32..32: the nibbles at bit `ls` of the `ql` word `lw` joined with
// the 2-bit fields at bit `hs` of the `qh` word `hw`, byte by byte.
fn kq_q6(lw: u32, hw: u32, ls: u32, hs: u32) -> vec4<f32> {
    let v = ((lw >> ls) & 0x0f0f0f0fu) | (((hw >> hs) & 0x03030303u) << 4u);
    return unsigned_byte_vals(v) - 32.0;
}

// Group g of Q2_K weight row `row`. A super-block is word-aligned: 16 bytes of scales (low
// nibble the scale, high nibble the min, one byte per 16 values; words 0..4), 64 bytes of
// 2-bit quants (words 4..20), d and dmin (word 20). Group j = g % 8 is part c = j / 4 of the
// quants, bits 2l.. (l = j % 4) of `qs` bytes 32c..; its two halves take scales 2j and 2j + 1.
fn kq_q2_k_group(row: u32, g: u32) -> Group {
    let wb = (row_start(row, (p.k / 256u) * Q2_K_BLOCK_BYTES) + (g / 8u) * Q2_K_BLOCK_BYTES) / 4u;
    let j = g % 8u;
    let d = f16_scale(q[wb + 20u] & 0xffffu);
    let dmin = f16_scale(q[wb + 20u] >> 16u);
    let s0 = kq_byte(wb, 2u * j);
    let s1 = kq_byte(wb, 2u * j + 1u);
    let am0 = vec2<f32>(d * f32(s0 & 15u), dmin * f32(s0 >> 4u));
    let am1 = vec2<f32>(d * f32(s1 & 15u), dmin * f32(s1 >> 4u));
    let qb = wb + 4u + 8u * (j / 4u);
    let s = 2u * (j % 4u);
    return Group(kq_q2(q[qb], s, am0), kq_q2(q[qb + 1u], s, am0), kq_q2(q[qb + 2u], s, am0),
                 kq_q2(q[qb + 3u], s, am0), kq_q2(q[qb + 4u], s, am1), kq_q2(q[qb + 5u], s, am1),
                 kq_q2(q[qb + 6u], s, am1), kq_q2(q[qb + 7u], s, am1), 1.0);
}

// Four Q2_K values `a·q − m` (`am`): the 2-bit fields at bit `s` of each byte of `w`.
fn kq_q2(w: u32, s: u32, am: vec2<f32>) -> vec4<f32> {
    return am.x * unsigned_byte_vals((w >> s) & 0x03030303u) - am.y;
}

// Group g of Q3_K weight row `row`. A super-block (110 bytes) starts on an even byte: 32
// bytes `hmask`, 64 bytes of 2-bit quants `qs`, 12 bytes of packed 6-bit scales, the f16 d.
// Group j = g % 8 is part c = j / 4, l = j % 4: bits 2l.. of `qs` bytes 32c.. less 4 where bit
// 4c + l of the `hmask` byte is clear; its halves take scales 2j and 2j + 1, each `d·(s − 32)`
// with s's low four bits nibble i / 8 of scale byte i % 8 and its top two bits 2(i / 4).. of
// scale byte 8 + i % 4.
fn kq_q3_k_group(row: u32, g: u32) -> Group {
    let o = row_start(row, (p.k / 256u) * Q3_K_BLOCK_BYTES) + (g / 8u) * Q3_K_BLOCK_BYTES;
    let j = g % 8u;
    let lo_at = o + 32u + 32u * (j / 4u);
    let l = words9(lo_at / 4u);
    let lodd = (lo_at & 2u) != 0u;
    let h = words9(o / 4u);
    let hodd = (o & 2u) != 0u;
    let d = f16_scale(half_at(o + 108u));
    let s0 = d * f32(kq_q3_scale(o, 2u * j));
    let s1 = d * f32(kq_q3_scale(o, 2u * j + 1u));
    let ls = 2u * (j % 4u);
    let hs = j;
    return Group(
        s0 * kq_q3(shifted_word(l.w0, l.w1, lodd), shifted_word(h.w0, h.w1, hodd), ls, hs),
        s0 * kq_q3(shifted_word(l.w1, l.w2, lodd), shifted_word(h.w1, h.w2, hodd), ls, hs),
        s0 * kq_q3(shifted_word(l.w2, l.w3, lodd), shifted_word(h.w2, h.w3, hodd), ls, hs),
        s0 * kq_q3(shifted_word(l.w3, l.w4, lodd), shifted_word(h.w3, h.w4, hodd), ls, hs),
        s1 * kq_q3(shifted_word(l.w4, l.w5, lodd), shifted_word(h.w4, h.w5, hodd), ls, hs),
        s1 * kq_q3(shifted_word(l.w5, l.w6, lodd), shifted_word(h.w5, h.w6, hodd), ls, hs),
        s1 * kq_q3(shifted_word(l.w6, l.w7, lodd), shifted_word(h.w6, h.w7, hodd), ls, hs),
        s1 * kq_q3(shifted_word(l.w7, l.w8, lodd), shifted_word(h.w7, h.w8, hodd), ls, hs),
        1.0);
}

// Scale i (of 16) of the Q3_K super-block at byte `o`, as its signed 6-bit value − 32.
fn kq_q3_scale(o: u32, i: u32) -> i32 {
    let low = (byte_at(o + 96u + i % 8u) >> (4u * (i / 8u))) & 15u;
    let high = (byte_at(o + 104u + i % 4u) >> (2u * (i / 4u))) & 3u;
    return i32(low | (high << 4u)) - 32;
}

// Four Q3_K quants as values −4..3: the 2-bit fields at bit `ls` of the `qs` word `lw`, less 4
// where bit `hs` of the `hmask` word's byte is clear (hmask bit j = 4c + l: c and l of the
// group's part, here j itself since j = 4c + l).
fn kq_q3(lw: u32, hw: u32, ls: u32, hs: u32) -> vec4<f32> {
    let low = unsigned_byte_vals((lw >> ls) & 0x03030303u);
    let high = unsigned_byte_vals((hw >> hs) & 0x01010101u);
    return low + 4.0 * high - 4.0;
}

// The 16 levels of IQ4_NL and IQ4_XS as signed bytes, four to a word (level n is byte n % 4
// of word n / 4): −127, −104, −83, −65, −49, −35, −22, −10, 1, 13, 25, 38, 53, 69, 89, 113.
const IQ4_LEVELS: vec4<u32> = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);

// Group g of IQ4_XS weight row `row`. A super-block is word-aligned: d and the top bits of
// the scales `scales_h` (word 0), the low nibbles of the scales `scales_l` (word 1), 128 bytes
// of 4-bit level indices (words 2..34). Group j = g % 8 is sub-block j: `qs` bytes 16j.., low
// nibbles values 0..16 and high nibbles 16..32, all scaled by `d·(s − 32)` with s's low four
// bits nibble j % 2 of `scales_l` byte j / 2 and its top two bits 2j.. of `scales_h`.
fn kq_iq4_xs_group(row: u32, g: u32) -> Group {
    let wb = (row_start(row, (p.k / 256u) * IQ4_XS_BLOCK_BYTES) + (g / 8u) * IQ4_XS_BLOCK_BYTES) / 4u;
    let j = g % 8u;
    let low = (kq_byte(wb + 1u, j / 2u) >> (4u * (j % 2u))) & 15u;
    let high = (q[wb] >> (16u + 2u * j)) & 3u;
    let s = f16_scale(q[wb] & 0xffffu) * f32(i32(low | (high << 4u)) - 32);
    let qb = wb + 2u + 4u * j;
    return Group(s * iq4_levels(q[qb]), s * iq4_levels(q[qb + 1u]),
                 s * iq4_levels(q[qb + 2u]), s * iq4_levels(q[qb + 3u]),
                 s * iq4_levels(q[qb] >> 4u), s * iq4_levels(q[qb + 1u] >> 4u),
                 s * iq4_levels(q[qb + 2u] >> 4u), s * iq4_levels(q[qb + 3u] >> 4u), 1.0);
}

// The levels of the low nibbles of each byte of `w`.
fn iq4_levels(w: u32) -> vec4<f32> {
    return vec4<f32>(iq4_level(w & 15u), iq4_level((w >> 8u) & 15u), iq4_level((w >> 16u) & 15u),
                     iq4_level((w >> 24u) & 15u));
}

// Level n (0..16) of IQ4_LEVELS.
fn iq4_level(n: u32) -> f32 {
    let levels = IQ4_LEVELS;
    return f32(bitcast<i32>(levels[n >> 2u] << (24u - 8u * (n & 3u))) >> 24u);
}

// ---- the legacy 32-value formats: one block per group -------------------------------------

// Block g of Q4_1 weight row `row`. A block (20 bytes) is word-aligned: d and m (word 0), then
// 16 bytes of nibbles (words 1..5), low nibbles values 0..16, high ones 16..32; value
// `d·q + m`.
fn kq_q4_1_group(row: u32, g: u32) -> Group {
    let wb = (row_start(row, (p.k / 32u) * Q4_1_BLOCK_BYTES) + g * Q4_1_BLOCK_BYTES) / 4u;
    let d = f16_scale(q[wb] & 0xffffu);
    // `kq_low`/`kq_high` subtract their minimum.
    let m = -f16_scale(q[wb] >> 16u);
    return Group(kq_low(q[wb + 1u], d, m), kq_low(q[wb + 2u], d, m), kq_low(q[wb + 3u], d, m),
                 kq_low(q[wb + 4u], d, m), kq_high(q[wb + 1u], d, m), kq_high(q[wb + 2u], d, m),
                 kq_high(q[wb + 3u], d, m), kq_high(q[wb + 4u], d, m), 1.0);
}

// Block g of Q5_1 weight row `row`. A block (24 bytes) is word-aligned: d and m (word 0), the
// fifth bits `qh` (word 1: bit i is value i's), 16 bytes of nibbles (words 2..6) as in Q4_1;
// value `d·q + m`.
fn kq_q5_1_group(row: u32, g: u32) -> Group {
    let wb = (row_start(row, (p.k / 32u) * Q5_1_BLOCK_BYTES) + g * Q5_1_BLOCK_BYTES) / 4u;
    let d = f16_scale(q[wb] & 0xffffu);
    let m = f16_scale(q[wb] >> 16u);
    let h = q[wb + 1u];
    return Group(d * kq_five(q[wb + 2u], h, 0u) + m, d * kq_five(q[wb + 3u], h, 1u) + m,
                 d * kq_five(q[wb + 4u], h, 2u) + m, d * kq_five(q[wb + 5u], h, 3u) + m,
                 d * kq_five(q[wb + 2u], h, 4u) + m, d * kq_five(q[wb + 3u], h, 5u) + m,
                 d * kq_five(q[wb + 4u], h, 6u) + m, d * kq_five(q[wb + 5u], h, 7u) + m, 1.0);
}

// Block g of Q5_0 weight row `row`. A block (22 bytes) starts on an even byte: d, the fifth
// bits `qh` (bytes 2..6), 16 bytes of nibbles (bytes 6..22) as in Q5_1; value `d·(q − 16)`.
// Its six words hold exactly its bytes (two bytes before it or after it).
fn kq_q5_0_group(row: u32, g: u32) -> Group {
    let o = row_start(row, (p.k / 32u) * Q5_0_BLOCK_BYTES) + g * Q5_0_BLOCK_BYTES;
    let b = o / 4u;
    let odd = (o & 2u) != 0u;
    let u = array<u32, 6>(q[b], q[b + 1u], q[b + 2u], q[b + 3u], q[b + 4u], q[b + 5u]);
    let d = block_scale(u[0], odd);
    let h = quant_word(u[0], u[1], odd);
    let w0 = quant_word(u[1], u[2], odd);
    let w1 = quant_word(u[2], u[3], odd);
    let w2 = quant_word(u[3], u[4], odd);
    let w3 = quant_word(u[4], u[5], odd);
    return Group(d * (kq_five(w0, h, 0u) - 16.0), d * (kq_five(w1, h, 1u) - 16.0),
                 d * (kq_five(w2, h, 2u) - 16.0), d * (kq_five(w3, h, 3u) - 16.0),
                 d * (kq_five(w0, h, 4u) - 16.0), d * (kq_five(w1, h, 5u) - 16.0),
                 d * (kq_five(w2, h, 6u) - 16.0), d * (kq_five(w3, h, 7u) - 16.0), 1.0);
}

// Values 4t..4t + 4 (t < 8) of a Q5_0/Q5_1 block as 5-bit values 0..32: the low (t < 4) or
// high nibbles of the nibble word `w` (the block's word t % 4) with bits 4t.. of `qh` as their
// fifth bits. The four bits are spread to one per byte by a multiply: bit j of `x` lands at
// bit 8j of `x·(1 + 2^7 + 2^14 + 2^21)`, and the four copies of `x` do not overlap.
fn kq_five(w: u32, qh: u32, t: u32) -> vec4<f32> {
    let x = (qh >> (4u * t)) & 15u;
    let high = ((x * 0x00204081u) & 0x01010101u) << 4u;
    return unsigned_byte_vals(((w >> (4u * (t / 4u))) & 0x0f0f0f0fu) | high);
}

// Block g of IQ4_NL weight row `row`. A block (18 bytes, as Q4_0's) starts on an even byte:
// d, then 16 bytes of 4-bit level indices, low nibbles values 0..16, high ones 16..32; value
// `d·level`.
fn kq_iq4_nl_group(row: u32, g: u32) -> Group {
    let o = row_start(row, (p.k / 32u) * IQ4_NL_BLOCK_BYTES) + g * IQ4_NL_BLOCK_BYTES;
    let w = nibble_block(o);
    let s = w.scale;
    return Group(s * iq4_levels(w.a.x), s * iq4_levels(w.a.y), s * iq4_levels(w.a.z),
                 s * iq4_levels(w.a.w), s * iq4_levels(w.a.x >> 4u), s * iq4_levels(w.a.y >> 4u),
                 s * iq4_levels(w.a.z >> 4u), s * iq4_levels(w.a.w >> 4u), 1.0);
}

// ---- BF16: 32 values of two bytes, no scale ------------------------------------------------

// Group g of BF16 weight row `row` (2k bytes, so word-aligned when k is a multiple of 32, which
// the host checks): words 16g.., two values each, the first in the low half. A bfloat16 is the
// high half of the f32 it stands for.
fn kq_bf16_group(row: u32, g: u32) -> Group {
    let b = (row_start(row, 2u * p.k) + 64u * g) / 4u;
    return Group(bf16_vals(b), bf16_vals(b + 2u), bf16_vals(b + 4u), bf16_vals(b + 6u),
                 bf16_vals(b + 8u), bf16_vals(b + 10u), bf16_vals(b + 12u), bf16_vals(b + 14u),
                 1.0);
}

// The four bfloat16 values in words b and b + 1.
fn bf16_vals(b: u32) -> vec4<f32> {
    let w0 = q[b];
    let w1 = q[b + 1u];
    return vec4<f32>(bitcast<f32>(w0 << 16u), bitcast<f32>(w0 & 0xffff0000u),
                     bitcast<f32>(w1 << 16u), bitcast<f32>(w1 & 0xffff0000u));
}
