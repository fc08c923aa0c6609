// The K-quant super-blocks (llama.cpp's Q4_K, Q5_K and Q6_K, 256 values each) decoded in registers,
// one group of 32 values at a time, for the `mv` and `mm_tiled` products of `quant.wgsl` (a
// prelude of it: it reads that file's `q`, `p`, `row_start`, `Group` and value helpers).
// Layouts are those of src/quant/kquants.rs. Each group comes back as its f32 values, every
// scale and minimum applied (the group's scale is 1): a Q4_K group is one sub-block with one
// scale and minimum (Q5_K too), but a Q6_K group spans two sub-blocks of 16 with a scale each,
// and Q4_K's `(d·sc)·q − dmin·mn` is not a multiple of one scale anyway.

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
