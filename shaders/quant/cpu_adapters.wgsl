// The quantized-data module, part 4 of 5 (see common.wgsl): the decode shapes of software
// (CPU) adapters such as SwiftShader and lavapipe: in-place, paired and texel reads.

// ---- Q4_0 and Q8_0 × int8 decode on CPU adapters: weights multiplied where they lie ---------
//
// SwiftShader's JIT (Subzero) runs a vector shift by a non-literal amount, an integer division
// and WGSL's packed `dot4I8Packed` one lane at a time (extract, scalar op, insert): the
// `idot` path above spends most of its instructions there. This path has none of them in its
// loop. A nibble or byte is masked where it lies in its word (v · 2^s for a bit offset s),
// converted to f32 as it is, and multiplied by its activation pre-scaled by 2^-s: each product
// is an exact integer, as are the sums of a block's 32 (below 2^24), so the result is
// bit-equal to `idot`'s.
//
// The loop takes two blocks at a time (Q4_0: 36 bytes, nine words; Q8_0: 68 bytes, 17), so
// when a row's blocks are an even count every pair starts on a word and its layout is fixed:
// word 0 holds block 0's f16 scale and its quant bytes 0 and 1, the next words its bytes 2..,
// four each, until a word holds its last two bytes and block 1's scale; then block 1's quant
// bytes, four per word. The entry `mv_pairs_lanes` takes this path on the lanes shape (one lane
// walks all of k) for a decode row against Q4_0 and Q8_0 weights with int8 activations when
// k / 32 is even; `mv` takes `idot` for the others.

// Each byte of a word, masked where it lies.
const BYTE_MASKS: vec4<u32> = vec4<u32>(0xffu, 0xff00u, 0xff0000u, 0xff000000u);

// The masks and flips of the in-place readings below.
struct InPlaceMasks {
    bytes: vec4<u32>,      // BYTE_MASKS
    byte_bias: u32,        // flips bytes 0..2's top bits (`inplace_biased_bytes`)
    low_nibbles: vec4<u32>,
    high_nibbles: vec4<u32>,
    top_bit: u32,          // flips byte 3's top bit (`inplace_high_nibbles`)
}

const INPLACE_MASKS: InPlaceMasks = InPlaceMasks(
    BYTE_MASKS, 0x00808080u,
    vec4<u32>(0xfu, 0xf00u, 0xf0000u, 0xf000000u), vec4<u32>(0xf0u, 0xf000u, 0xf00000u, 0xf0000000u),
    0x80000000u);

// INPLACE_MASKS as values rather than constants, for the pair loop (`mv_pairs`).
// SwiftShader's JIT (Subzero) materialises a vector constant at every use, a 64-bit address
// move and a load each, nine times per Q4_0 weight word; masks computed once from the run-time
// `p.zero` (always 0) stay in registers across the loop instead. The Q4_0 and Q8_0 × int8
// decode products [1, 1024] · [2816, 1024]ᵀ ran about 10% faster natively on SwiftShader
// that way (docs/wgpu-decode-profile.md).
fn inplace_masks() -> InPlaceMasks {
    let z = vec4<u32>(p.zero);
    let m = INPLACE_MASKS;
    return InPlaceMasks(m.bytes | z, m.byte_bias | z.x, m.low_nibbles | z, m.high_nibbles | z, m.top_bit | z.x);
}

// The four signed bytes of word `w` in place, bytes 0..2 biased by 128 so that their masks
// read them unsigned: (v_p + 128) · 2^(8p) for p < 3, and byte 3 read signed, v_3 · 2^24. A Q8_0
// pair's `offset` takes the bias off.
fn inplace_biased_bytes(w: u32, m: InPlaceMasks) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w ^ m.byte_bias) & m.bytes));
}

// The four signed bytes of word `a` in place: byte p as v_p · 2^(8p), exactly.
fn inplace_bytes(a: u32, m: InPlaceMasks) -> vec4<f32> {
    return inplace_biased_bytes(a, m) - vec4<f32>(128.0, 32768.0, 8388608.0, 0.0);
}

// 2^-8p for byte p: takes `inplace_bytes` back to the byte values, and pre-scales an
// activation for a weight at byte p.
const BYTE_UNSCALE: vec4<f32> = vec4<f32>(1.0, 0.00390625, 0.0000152587890625, 0.000000059604644775390625);

// The low nibbles of word `w` in place: n_p · 2^(8p).
fn inplace_low_nibbles(w: u32, m: InPlaceMasks) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) & m.low_nibbles));
}

// The high nibbles of word `w` in place: n_p · 2^(8p + 4) for bytes 0..2, and for byte 3
// (n_3 − 8) · 2^28: its top bit flipped and read signed, which saves a correction per word; the
// pair's `offset` leaves the activations it meets out of the −8 offset.
fn inplace_high_nibbles(w: u32, m: InPlaceMasks) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w ^ m.top_bit) & m.high_nibbles));
}

// The f16 scale in the high half of word `w` (as `f16_scale(w >> 16)`), without the shift.
fn f16_scale_high(w: u32) -> f32 {
    // A subnormal's mantissa read in place is m · 2^16; 2^-40 takes it to m · 2^-24.
    let subnormal = bitcast<f32>((w & 0x80000000u) | bitcast<u32>(f32(bitcast<i32>(w & 0x03ff0000u)) * 9.094947017729282e-13));
    return select(unpack2x16float(w).y, subnormal, (w & 0x7c000000u) == 0u);
}

// Activations for block 0's word t from values 4t − 2 .. 4t + 2 (in place in `a`, the word of
// values 4t − 4.., and `b`, the next): bytes 0..3 of the weight word meet values 4t − 2, 4t − 1
// (a.z, a.w) and 4t, 4t + 1 (b.x, b.y).
fn straddling_acts(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    let u = BYTE_UNSCALE;
    return vec4<f32>(a.z * u.z, a.w * u.w * u.y, b.x * u.z, b.y * u.y * u.w);
}

// Activations for block 0's first word (its bytes 2, 3 meet values 0, 1 in place in `a`) and
// its last (bytes 0, 1 meet the last two values of `a`).
fn first_word_acts(a: vec4<f32>) -> vec4<f32> {
    let u = BYTE_UNSCALE;
    return vec4<f32>(0.0, 0.0, a.x * u.z, a.y * u.y * u.w);
}

fn last_word_acts(a: vec4<f32>) -> vec4<f32> {
    let u = BYTE_UNSCALE;
    return vec4<f32>(a.z * u.z, a.w * u.w * u.y, 0.0, 0.0);
}

// The int8 activations of a pair of groups (words x0, x1: values 0..16, 16..32 of block 0;
// x2, x3: of block 1) in place, with their scales.
struct PairInput {
    a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
    a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>,
    c0: vec4<f32>, c1: vec4<f32>, c2: vec4<f32>, c3: vec4<f32>,
    c4: vec4<f32>, c5: vec4<f32>, c6: vec4<f32>, c7: vec4<f32>,
    scale0: f32, scale1: f32,
}

// The pair whose int8 values are the vec4s `act`..`act + 3` of `xv` and whose two scales are
// the first or the `second_half` of the vec4 `scale_vec`.
fn pair_input(act: u32, scale_vec: u32, second_half: bool, m: InPlaceMasks) -> PairInput {
    let x0 = bitcast<vec4<u32>>(xv[act]);
    let x1 = bitcast<vec4<u32>>(xv[act + 1u]);
    let x2 = bitcast<vec4<u32>>(xv[act + 2u]);
    let x3 = bitcast<vec4<u32>>(xv[act + 3u]);
    let sc = xv[scale_vec];
    return PairInput(
        inplace_bytes(x0.x, m), inplace_bytes(x0.y, m), inplace_bytes(x0.z, m), inplace_bytes(x0.w, m),
        inplace_bytes(x1.x, m), inplace_bytes(x1.y, m), inplace_bytes(x1.z, m), inplace_bytes(x1.w, m),
        inplace_bytes(x2.x, m), inplace_bytes(x2.y, m), inplace_bytes(x2.z, m), inplace_bytes(x2.w, m),
        inplace_bytes(x3.x, m), inplace_bytes(x3.y, m), inplace_bytes(x3.z, m), inplace_bytes(x3.w, m),
        select(sc.x, sc.z, second_half), select(sc.y, sc.w, second_half));
}

// The sums of block 0's and block 1's activation values (unscaled).
fn pair_sums(x: PairInput) -> vec2<f32> {
    return vec2<f32>(
        dot(((x.a0 + x.a1) + (x.a2 + x.a3)) + ((x.a4 + x.a5) + (x.a6 + x.a7)), BYTE_UNSCALE),
        dot(((x.c0 + x.c1) + (x.c2 + x.c3)) + ((x.c4 + x.c5) + (x.c6 + x.c7)), BYTE_UNSCALE));
}

// ---- Q4_0 pairs: word 0 = [d0, bytes 0, 1], words 1..3 = bytes 2..14, word 4 = [bytes 14,
// 15, d1], words 5..8 = block 1's bytes. Quant byte j holds values j (low nibble) and j + 16.

// A Q4_0 pair's activations, pre-scaled for the weight word they meet: `low_t`/`high_t` for
// the low/high nibbles of word t of block 0 (0 where the word holds a scale), `low1_t`/
// `high1_t` for word 5 + t (block 1). `offset0/1` is the −8 offset: 8 · the sum of the
// activations it applies to.
struct Q4Pair {
    low_0: vec4<f32>, low_1: vec4<f32>, low_2: vec4<f32>, low_3: vec4<f32>, low_4: vec4<f32>,
    high_0: vec4<f32>, high_1: vec4<f32>, high_2: vec4<f32>, high_3: vec4<f32>, high_4: vec4<f32>,
    low1_0: vec4<f32>, low1_1: vec4<f32>, low1_2: vec4<f32>, low1_3: vec4<f32>,
    high1_0: vec4<f32>, high1_1: vec4<f32>, high1_2: vec4<f32>, high1_3: vec4<f32>,
    offset0: f32, offset1: f32,
    scale0: f32, scale1: f32,
}

fn q4_pair(x: PairInput) -> Q4Pair {
    let u = BYTE_UNSCALE;
    // The high nibbles at byte 3 are already n − 8 (`inplace_high_nibbles`): they meet values
    // 17, 21, 25, 29 of block 0 (byte 1 of a4..a7) and 19, 23, 27, 31 of block 1 (byte 3 of
    // c4..c7), which the offset leaves out.
    let sums = pair_sums(x)
        - vec2<f32>((x.a4.y + x.a5.y) + (x.a6.y + x.a7.y), (x.c4.w + x.c5.w) + (x.c6.w + x.c7.w)) * vec2<f32>(u.y, u.w);
    // Block 1: value j (in place at byte j % 4) meets byte j % 4: 2^-16(j % 4) in all.
    let uu = u * u;
    let h = 0.0625;
    return Q4Pair(
        first_word_acts(x.a0), straddling_acts(x.a0, x.a1), straddling_acts(x.a1, x.a2),
        straddling_acts(x.a2, x.a3), last_word_acts(x.a3),
        first_word_acts(x.a4) * h, straddling_acts(x.a4, x.a5) * h, straddling_acts(x.a5, x.a6) * h,
        straddling_acts(x.a6, x.a7) * h, last_word_acts(x.a7) * h,
        x.c0 * uu, x.c1 * uu, x.c2 * uu, x.c3 * uu,
        x.c4 * uu * h, x.c5 * uu * h, x.c6 * uu * h, x.c7 * uu * h,
        8.0 * sums.x, 8.0 * sums.y, x.scale0, x.scale1);
}

// Q4_0 weight word `w`'s eight nibbles in place against the activations `low` and `high`
// pre-scaled for them.
fn q4_word_dot(w: u32, low: vec4<f32>, high: vec4<f32>, m: InPlaceMasks) -> f32 {
    return dot(inplace_low_nibbles(w, m), low) + dot(inplace_high_nibbles(w, m), high);
}

// The pair's two block dots of the Q4_0 weight row whose pair starts at word `b`, each scaled
// as `idot` scales it.
fn q4_pair_row(a: Q4Pair, b: u32, m: InPlaceMasks) -> f32 {
    let w0 = q[b];
    let w4 = q[b + 4u];
    let dot0 = ((q4_word_dot(w0, a.low_0, a.high_0, m) + q4_word_dot(q[b + 1u], a.low_1, a.high_1, m))
        + (q4_word_dot(q[b + 2u], a.low_2, a.high_2, m) + q4_word_dot(q[b + 3u], a.low_3, a.high_3, m)))
        + q4_word_dot(w4, a.low_4, a.high_4, m);
    let dot1 = (q4_word_dot(q[b + 5u], a.low1_0, a.high1_0, m) + q4_word_dot(q[b + 6u], a.low1_1, a.high1_1, m))
        + (q4_word_dot(q[b + 7u], a.low1_2, a.high1_2, m) + q4_word_dot(q[b + 8u], a.low1_3, a.high1_3, m));
    return (dot0 - a.offset0) * (a.scale0 * f16_scale(w0)) + (dot1 - a.offset1) * (a.scale1 * f16_scale_high(w4));
}

// ---- Q8_0 pairs: word 0 = [d0, bytes 0, 1], words 1..7 = bytes 2..30, word 8 = [bytes 30,
// 31, d1], words 9..16 = block 1's bytes.

// A Q8_0 pair's activations, pre-scaled for the weight word they meet: `w_t` for word t of
// block 0, `v_t` for word 9 + t (block 1). `offset0/1` takes off the bias of 128 that
// `inplace_biased_bytes` leaves on bytes 0..2: 128 · the sum of the activations they meet.
struct Q8Pair {
    w_0: vec4<f32>, w_1: vec4<f32>, w_2: vec4<f32>, w_3: vec4<f32>, w_4: vec4<f32>,
    w_5: vec4<f32>, w_6: vec4<f32>, w_7: vec4<f32>, w_8: vec4<f32>,
    v_0: vec4<f32>, v_1: vec4<f32>, v_2: vec4<f32>, v_3: vec4<f32>,
    v_4: vec4<f32>, v_5: vec4<f32>, v_6: vec4<f32>, v_7: vec4<f32>,
    offset0: f32, offset1: f32,
    scale0: f32, scale1: f32,
}

fn q8_pair(x: PairInput) -> Q8Pair {
    let u = BYTE_UNSCALE;
    // Byte 3 of a weight word is read signed: it meets the values at byte 1 of a0..a7 (block
    // 0: 1, 5, .., 29) and byte 3 of c0..c7 (block 1), which the offset leaves out.
    let sums = pair_sums(x) - vec2<f32>(
        ((x.a0.y + x.a1.y) + (x.a2.y + x.a3.y)) + ((x.a4.y + x.a5.y) + (x.a6.y + x.a7.y)),
        ((x.c0.w + x.c1.w) + (x.c2.w + x.c3.w)) + ((x.c4.w + x.c5.w) + (x.c6.w + x.c7.w))) * vec2<f32>(u.y, u.w);
    let uu = u * u;
    return Q8Pair(
        first_word_acts(x.a0), straddling_acts(x.a0, x.a1), straddling_acts(x.a1, x.a2),
        straddling_acts(x.a2, x.a3), straddling_acts(x.a3, x.a4), straddling_acts(x.a4, x.a5),
        straddling_acts(x.a5, x.a6), straddling_acts(x.a6, x.a7), last_word_acts(x.a7),
        x.c0 * uu, x.c1 * uu, x.c2 * uu, x.c3 * uu, x.c4 * uu, x.c5 * uu, x.c6 * uu, x.c7 * uu,
        128.0 * sums.x, 128.0 * sums.y, x.scale0, x.scale1);
}

// The pair's two block dots of the Q8_0 weight row whose pair starts at word `b`, each scaled
// as `idot` scales it.
fn q8_pair_row(a: Q8Pair, b: u32, m: InPlaceMasks) -> f32 {
    let w0 = q[b];
    let w8 = q[b + 8u];
    let dot0 = ((dot(inplace_biased_bytes(w0, m), a.w_0) + dot(inplace_biased_bytes(q[b + 1u], m), a.w_1))
        + (dot(inplace_biased_bytes(q[b + 2u], m), a.w_2) + dot(inplace_biased_bytes(q[b + 3u], m), a.w_3)))
        + ((dot(inplace_biased_bytes(q[b + 4u], m), a.w_4) + dot(inplace_biased_bytes(q[b + 5u], m), a.w_5))
        + (dot(inplace_biased_bytes(q[b + 6u], m), a.w_6) + dot(inplace_biased_bytes(q[b + 7u], m), a.w_7)))
        + dot(inplace_biased_bytes(w8, m), a.w_8);
    let dot1 = ((dot(inplace_biased_bytes(q[b + 9u], m), a.v_0) + dot(inplace_biased_bytes(q[b + 10u], m), a.v_1))
        + (dot(inplace_biased_bytes(q[b + 11u], m), a.v_2) + dot(inplace_biased_bytes(q[b + 12u], m), a.v_3)))
        + ((dot(inplace_biased_bytes(q[b + 13u], m), a.v_4) + dot(inplace_biased_bytes(q[b + 14u], m), a.v_5))
        + (dot(inplace_biased_bytes(q[b + 15u], m), a.v_6) + dot(inplace_biased_bytes(q[b + 16u], m), a.v_7)));
    return (dot0 - a.offset0) * (a.scale0 * f16_scale(w0)) + (dot1 - a.offset1) * (a.scale1 * f16_scale_high(w8));
}

// Decode sums of eight weight rows: `lo` of rows row0..row0 + 4, `hi` of the next four.
struct EightRows {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// The decode sums of weight rows `lo` (x: the first, ..) and, for Q4_0, `hi` by the pair path
// (Q8_0 leaves `hi`'s sums 0). Counters step through the words so that the loop divides
// nothing: a row's pairs (9 or 17 words each), the activation row's int8 words (16 per pair,
// four vec4s) and its scales (two per pair). Eight Q4_0 rows share each pair's activations,
// which a CPU adapter reads by gathers and unpacks once per lane: with four the Q4_0 × int8
// decode product [1, 1024] · [2816, 1024]ᵀ took 1,656 µs on SwiftShader, with eight 1,434,
// and lavapipe was level. Q8_0 rows, 17 words a pair, take four at a time: eight took its
// product from 2,039 to 1,788 µs on SwiftShader but from 660 to 1,000 on lavapipe.
fn mv_pairs(lo: vec4<u32>, hi: vec4<u32>) -> EightRows {
    let groups = p.k / 32u;
    let q4 = MV_FORMAT % FMT_INT_ACTIVATIONS == FMT_Q4_0;
    let pair_words = select(17u, 9u, q4);
    var b = lo * ((groups / 2u) * pair_words);
    var c = hi * ((groups / 2u) * pair_words);
    var act = mv_a0 * (p.k / 16u);
    // Scale words: after the m · k/4 words of int8 values, one per group (`stored_act_scale`);
    // the first is even, so a pair's two are in one vec4, in its first or second half.
    let first_scale = p.m * (p.k / 4u) + mv_a0 * groups;
    var scale_vec = first_scale / 4u;
    var second_half = (first_scale % 4u) == 2u;
    var acc = EightRows();
    let m = inplace_masks();
    for (var i = 0u; i < groups; i = i + 2u) {
        let x = pair_input(act, scale_vec, second_half, m);
        if (q4) {
            let a = q4_pair(x);
            acc.lo = acc.lo + vec4<f32>(q4_pair_row(a, b.x, m), q4_pair_row(a, b.y, m), q4_pair_row(a, b.z, m), q4_pair_row(a, b.w, m));
            acc.hi = acc.hi + vec4<f32>(q4_pair_row(a, c.x, m), q4_pair_row(a, c.y, m), q4_pair_row(a, c.z, m), q4_pair_row(a, c.w, m));
        } else {
            let a = q8_pair(x);
            acc.lo = acc.lo + vec4<f32>(q8_pair_row(a, b.x, m), q8_pair_row(a, b.y, m), q8_pair_row(a, b.z, m), q8_pair_row(a, b.w, m));
        }
        b = b + vec4<u32>(pair_words);
        c = c + vec4<u32>(pair_words);
        act = act + 4u;
        scale_vec = scale_vec + select(0u, 1u, second_half);
        second_half = !second_half;
    }
    return acc;
}

// `mv_store`'s sums of four weight rows from their decode sums `d`.
fn decode_sums(d: vec4<f32>) -> array<vec4<f32>, 4> {
    return array<vec4<f32>, 4>(vec4<f32>(d.x, 0.0, 0.0, 0.0), vec4<f32>(d.y, 0.0, 0.0, 0.0),
                               vec4<f32>(d.z, 0.0, 0.0, 0.0), vec4<f32>(d.w, 0.0, 0.0, 0.0));
}

// The decode product on CPU adapters (the lanes shape) of Q4_0 or Q8_0 weights with int8
// activations, one activation row and an even count of blocks per row, the host's choice
// (`takes_pairs` in kernels/quant.rs): the pair path as an entry of its own, 8 lanes of eight
// weight rows, the 64 rows per workgroup (`MV_ROWS`) that `lanes.wgsl` gives `mv` and the host
// dispatches by (the entry is compiled with the other shapes' preludes too, unused, so its
// size is a literal: MV_ROWS / 8 would be 0 on a GPU team of 4 rows). SwiftShader runs every
// block of a shader that is not in a loop, whichever way its branch goes (a loop it skips when
// no lane enters it), so inside `mv` each workgroup paid for the straight-line code of the
// paths it did not take; a pipeline of its own made the Q4_0 and Q8_0 × int8 decode products
// [1, 1024] · [2816, 1024]ᵀ about 13% faster there (docs/wgpu-decode-profile.md).
@compute @workgroup_size(8)
fn mv_pairs_lanes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let row0 = mv_first_row(wid, nwg) + 8u * lid;
    if (row0 < p.n) {
        // Rows past n repeat the last row; `mv_store` drops them.
        let last = vec4<u32>(p.n - 1u);
        let lo = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), last);
        let hi = min(vec4<u32>(row0) + vec4<u32>(4u, 5u, 6u, 7u), last);
        var d = mv_pairs(lo, hi);
        if (MV_FORMAT % FMT_INT_ACTIVATIONS == FMT_Q8_0) {
            d.hi = mv_pairs(hi, hi).lo;
        }
        mv_store(wid, row0, decode_sums(d.lo));
        mv_store(wid, row0 + 4u, decode_sums(d.hi));
    }
}

// ---- Q4_0 weights as texels (CPU adapters) ----------------------------------------------
//
// A CPU adapter loads a storage word at a run-time offset lane by lane (SwiftShader: per lane
// an extract, a bounds branch, a scalar load and an insert), but a texel fetch goes through
// its sampling routine: 16 bytes per lane, no branch. So on the lanes shape the backend keeps
// a second copy of each uploaded Q4_0 tensor (`texels.rs`): block b's 16 quant bytes are the
// rgba32uint texel b of a texture 2^TEXELS_WIDTH_LOG2 wide, and word p of
// `texel_scales` holds the f16 scales of blocks 2p (low half) and 2p + 1. A pair of blocks is
// then two fetches and one scale word where `q4_pair_row` loads nine words. Both blocks' bytes
// start on a word, so both take their activations as block 1 does there. The same sums as
// `mv_pairs_lanes`, bit for bit; its Q4_0 × int8 decode product [1, 1024] · [2816, 1024]ᵀ ran
// about 30% faster this way on SwiftShader and on lavapipe (docs/wgpu-decode-profile.md).

// log2 of the texels per row of the weight texture (`TEXELS_WIDTH` in texels.rs): the
// coordinates are a mask and a shift, since a CPU adapter divides lane by lane.
const TEXELS_WIDTH_LOG2: u32 = 12u;

fn weight_texel(b: u32) -> vec4<u32> {
    let x = b & ((1u << TEXELS_WIDTH_LOG2) - 1u);
    return textureLoad(texels, vec2<u32>(x, b >> TEXELS_WIDTH_LOG2), 0);
}

// A pair's activations pre-scaled for the texel words they meet: `low_t`/`high_t` for the low
// and high nibbles of word t of block 0's texel, `low1_t`/`high1_t` of block 1's; offsets and
// scales as in `Q4Pair`.
struct Q4TexelPair {
    low_0: vec4<f32>, low_1: vec4<f32>, low_2: vec4<f32>, low_3: vec4<f32>,
    high_0: vec4<f32>, high_1: vec4<f32>, high_2: vec4<f32>, high_3: vec4<f32>,
    low1_0: vec4<f32>, low1_1: vec4<f32>, low1_2: vec4<f32>, low1_3: vec4<f32>,
    high1_0: vec4<f32>, high1_1: vec4<f32>, high1_2: vec4<f32>, high1_3: vec4<f32>,
    offset0: f32, offset1: f32,
    scale0: f32, scale1: f32,
}

fn q4_texel_pair(x: PairInput) -> Q4TexelPair {
    let u = BYTE_UNSCALE;
    // The high nibbles at byte 3 are already n − 8 (`inplace_high_nibbles`): they meet values
    // 19, 23, 27, 31 of each block (byte 3 of a4..a7, c4..c7), which the offset leaves out.
    let sums = pair_sums(x)
        - vec2<f32>((x.a4.w + x.a5.w) + (x.a6.w + x.a7.w), (x.c4.w + x.c5.w) + (x.c6.w + x.c7.w)) * u.w;
    let uu = u * u;
    let h = 0.0625;
    return Q4TexelPair(
        x.a0 * uu, x.a1 * uu, x.a2 * uu, x.a3 * uu,
        x.a4 * uu * h, x.a5 * uu * h, x.a6 * uu * h, x.a7 * uu * h,
        x.c0 * uu, x.c1 * uu, x.c2 * uu, x.c3 * uu,
        x.c4 * uu * h, x.c5 * uu * h, x.c6 * uu * h, x.c7 * uu * h,
        8.0 * sums.x, 8.0 * sums.y, x.scale0, x.scale1);
}

// The pair's two block dots of the weight row whose pair starts at texel `b` (scale word `s`),
// each scaled as `idot` scales it.
fn q4_texel_row(a: Q4TexelPair, b: u32, s: u32, m: InPlaceMasks) -> f32 {
    let w0 = weight_texel(b);
    let w1 = weight_texel(b + 1u);
    let d = texel_scales[s];
    let dot0 = (q4_word_dot(w0.x, a.low_0, a.high_0, m) + q4_word_dot(w0.y, a.low_1, a.high_1, m))
        + (q4_word_dot(w0.z, a.low_2, a.high_2, m) + q4_word_dot(w0.w, a.low_3, a.high_3, m));
    let dot1 = (q4_word_dot(w1.x, a.low1_0, a.high1_0, m) + q4_word_dot(w1.y, a.low1_1, a.high1_1, m))
        + (q4_word_dot(w1.z, a.low1_2, a.high1_2, m) + q4_word_dot(w1.w, a.low1_3, a.high1_3, m));
    return (dot0 - a.offset0) * (a.scale0 * f16_scale(d & 0xffffu)) + (dot1 - a.offset1) * (a.scale1 * f16_scale_high(d));
}

// Weight rows per workgroup of the texel products `mv_pairs_texels` and `mv_texels`
// (`TEXEL_ROWS` in kernels/quant.rs): 8 lanes of 16 rows each.
const TEXEL_ROWS: u32 = 128u;

// A lane's 16 weight rows, four to a vector (rows past n repeat the last; `mv_store` drops
// them).
struct TexelRows {
    row0: u32,
    w0: vec4<u32>,
    w1: vec4<u32>,
    w2: vec4<u32>,
    w3: vec4<u32>,
}

// Lane `lid`'s rows of the workgroup's block of TEXEL_ROWS (`block_first_row`, which sets
// `mv_a0`); row0 is n or more for a lane with none.
fn texel_rows(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> TexelRows {
    let row0 = block_first_row(wid, nwg, TEXEL_ROWS) + 16u * lid;
    let last = vec4<u32>(max(p.n, 1u) - 1u);
    let w0 = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), last);
    return TexelRows(row0, w0, min(w0 + vec4<u32>(4u), last), min(w0 + vec4<u32>(8u), last),
                     min(w0 + vec4<u32>(12u), last));
}

// Sums of four weight rows, one per component (decode) or one vector per row with a component
// per activation row of the chunk (prefill).
struct Quad {
    r0: vec4<f32>,
    r1: vec4<f32>,
    r2: vec4<f32>,
    r3: vec4<f32>,
}

// Stores a quad of rows from `row0` (`mv_store` drops rows past n).
fn quad_store(wid: vec3<u32>, row0: u32, q: Quad) {
    mv_store(wid, row0, array<vec4<f32>, 4>(q.r0, q.r1, q.r2, q.r3));
}

// The pair's dots with four weight rows `w` whose pairs start at texel `w · groups + i`
// (scale word `w · groups / 2 + i / 2`).
fn q4_texel_quad(a: Q4TexelPair, w: vec4<u32>, groups: u32, i: u32, m: InPlaceMasks) -> vec4<f32> {
    let b = w * groups + vec4<u32>(i);
    let s = w * (groups / 2u) + vec4<u32>(i >> 1u);
    return vec4<f32>(q4_texel_row(a, b.x, s.x, m), q4_texel_row(a, b.y, s.y, m),
                     q4_texel_row(a, b.z, s.z, m), q4_texel_row(a, b.w, s.w, m));
}

// `mv_pairs_lanes` for Q4_0 weights the backend holds as texels, bound whole (the choice is
// `qmatmul`'s in kernels/quant.rs), with 16 rows per lane where `mv_pairs_lanes` has eight:
// the pair's activations, loaded and scaled once per lane, then serve twice the rows. That
// took the product [1, 1024] · [2816, 1024]ᵀ from 970-1,070 to 840-900 µs on SwiftShader and
// the page's decode from 10.5-10.8 to 12.1-12.3 tok/s; lavapipe's decode did not move
// (docs/wgpu-decode-profile.md).
@compute @workgroup_size(8)
fn mv_pairs_texels(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let r = texel_rows(wid, nwg, lid);
    if (r.row0 >= p.n) {
        return;
    }
    let groups = p.k / 32u;
    var act = mv_a0 * (p.k / 16u);
    let first_scale = p.m * (p.k / 4u) + mv_a0 * groups;
    var scale_vec = first_scale / 4u;
    var second_half = (first_scale % 4u) == 2u;
    var q = Quad();
    let m = inplace_masks();
    for (var i = 0u; i < groups; i = i + 2u) {
        let a = q4_texel_pair(pair_input(act, scale_vec, second_half, m));
        q = Quad(q.r0 + q4_texel_quad(a, r.w0, groups, i, m), q.r1 + q4_texel_quad(a, r.w1, groups, i, m),
                 q.r2 + q4_texel_quad(a, r.w2, groups, i, m), q.r3 + q4_texel_quad(a, r.w3, groups, i, m));
        act = act + 4u;
        scale_vec = scale_vec + select(0u, 1u, second_half);
        second_half = !second_half;
    }
    mv_store(wid, r.row0, decode_sums(q.r0));
    mv_store(wid, r.row0 + 4u, decode_sums(q.r1));
    mv_store(wid, r.row0 + 8u, decode_sums(q.r2));
    mv_store(wid, r.row0 + 12u, decode_sums(q.r3));
}

// Block g of Q4_0 weight row `row` from its texel copy, dequantized (the scale apart): what
// `mv_decode` gives for Q4_0 from one fetch and one scale word instead of five words.
fn q4_texel_group(row: u32, g: u32) -> Group {
    let b = row * (p.k / 32u) + g;
    let w = weight_texel(b);
    let d = texel_scales[b >> 1u];
    return Group(q4_low_vals(w.x), q4_low_vals(w.y), q4_low_vals(w.z), q4_low_vals(w.w),
                 q4_high_vals(w.x), q4_high_vals(w.y), q4_high_vals(w.z), q4_high_vals(w.w),
                 select(f16_scale(d & 0xffffu), f16_scale_high(d), (b & 1u) != 0u));
}

// `q` plus the dots of group g of weight rows `w` (texels) with the chunk's groups `x`.
fn quad_step(q: Quad, x: RowGroups, w: vec4<u32>, g: u32, rows: u32) -> Quad {
    return Quad(q.r0 + rows_dot(x.x0, x.x1, x.x2, x.x3, q4_texel_group(w.x, g), rows),
                q.r1 + rows_dot(x.x0, x.x1, x.x2, x.x3, q4_texel_group(w.y, g), rows),
                q.r2 + rows_dot(x.x0, x.x1, x.x2, x.x3, q4_texel_group(w.z, g), rows),
                q.r3 + rows_dot(x.x0, x.x1, x.x2, x.x3, q4_texel_group(w.w, g), rows));
}

// `mv` for Q4_0 weights the backend holds as texels and chunks of up to four int8 activation
// rows: prefill on CPU adapters (the choice is `qmatmul`'s in kernels/quant.rs). The grid is
// (blocks of TEXEL_ROWS weight rows) × (chunks), and each lane walks the whole of k for 16
// rows where lanes.wgsl gives `mv` four: SwiftShader gathers each activation load lane by
// lane, so a load that serves more rows costs less per row. With the weights fetched and 16
// rows a lane, the product [32, 1024] · [2816, 1024]ᵀ took 21-22 ms on SwiftShader against
// 40-44 ms for `mv`, and the SmolLM-shape prompt ran 1.7 times faster there and 1.3 times on
// lavapipe (docs/wgpu-decode-profile.md).
@compute @workgroup_size(8)
fn mv_texels(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let r = texel_rows(wid, nwg, lid);
    if (r.row0 >= p.n) {
        return;
    }
    let rows = min(4u, p.m - mv_a0);
    var q0 = Quad();
    var q1 = Quad();
    var q2 = Quad();
    var q3 = Quad();
    for (var g = 0u; g < p.k / 32u; g = g + 1u) {
        let x = mv_load_rows(g, rows);
        q0 = quad_step(q0, x, r.w0, g, rows);
        q1 = quad_step(q1, x, r.w1, g, rows);
        q2 = quad_step(q2, x, r.w2, g, rows);
        q3 = quad_step(q3, x, r.w3, g, rows);
    }
    quad_store(wid, r.row0, q0);
    quad_store(wid, r.row0 + 4u, q1);
    quad_store(wid, r.row0 + 8u, q2);
    quad_store(wid, r.row0 + 12u, q3);
}

// Partial sums of the weight rows of the team whose first output row is `first` (rows
// first..first + 4, rows past n repeating the last, which `mv_store` drops; see `team_rows`)
// against the workgroup's up to four activation rows.
fn mv_partial(wid: vec3<u32>, first: u32, lane: u32, lanes: u32) -> array<vec4<f32>, 4> {
    var acc0 = vec4<f32>();
    var acc1 = vec4<f32>();
    var acc2 = vec4<f32>();
    var acc3 = vec4<f32>();
    if (first >= p.n) {
        return array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    }
    let team = team_rows(first);
    let row0 = team.x;
    let row1 = team.y;
    let row2 = team.z;
    let row3 = team.w;
    let groups = p.k / 32u;
    // At least one: `mv_first_row` gives n (handled above) when mv_a0 is past m.
    let rows = min(4u, p.m - mv_a0);
    if (rows == 1u) {
        // Decode: one activation row, in integers where `mv_int_dot` (a pipeline constant,
        // so each pipeline keeps one of the two bodies).
        for (var g = lane; g < groups; g = g + lanes) {
            if (mv_int_dot()) {
                let x = mv_load_xi(0u, 8u * g);
                acc0.x = acc0.x + idot(x, mv_decode_int(row0, g));
                acc1.x = acc1.x + idot(x, mv_decode_int(row1, g));
                acc2.x = acc2.x + idot(x, mv_decode_int(row2, g));
                acc3.x = acc3.x + idot(x, mv_decode_int(row3, g));
            } else {
                let x = mv_load_x(0u, 8u * g);
                acc0.x = acc0.x + group_dot(x, mv_decode(row0, g));
                acc1.x = acc1.x + group_dot(x, mv_decode(row1, g));
                acc2.x = acc2.x + group_dot(x, mv_decode(row2, g));
                acc3.x = acc3.x + group_dot(x, mv_decode(row3, g));
            }
        }
        return array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    }
    for (var g = lane; g < groups; g = g + lanes) {
        let x = mv_load_rows(g, rows);
        acc0 = acc0 + rows_dot(x.x0, x.x1, x.x2, x.x3, mv_decode(row0, g), rows);
        acc1 = acc1 + rows_dot(x.x0, x.x1, x.x2, x.x3, mv_decode(row1, g), rows);
        acc2 = acc2 + rows_dot(x.x0, x.x1, x.x2, x.x3, mv_decode(row2, g), rows);
        acc3 = acc3 + rows_dot(x.x0, x.x1, x.x2, x.x3, mv_decode(row3, g), rows);
    }
    return array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
}

// The weight rows of the team whose first output row is `row0` (below n): rows row0..row0 + 4
// (the last repeated past n); for the paired SwiGLU product (epilogue 4, n even, the n / 2 gate
// rows then the n / 2 up rows) gate rows r and r + 1 and up rows r and r + 1, r = row0 / 2, so
// a team's four sums make outputs r and r + 1 (`mv_store_paired`).
fn team_rows(row0: u32) -> vec4<u32> {
    if (p.epilogue == 4u) {
        let r = row0 / 2u;
        let half = p.n / 2u;
        return vec4<u32>(r, r + 1u, half + r, half + r + 1u);
    }
    return min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n - 1u));
}

// Group g of the workgroup's activation rows (the first `rows` read, the others zero).
struct RowGroups {
    x0: Group,
    x1: Group,
    x2: Group,
    x3: Group,
}

fn mv_load_rows(g: u32, rows: u32) -> RowGroups {
    var x = RowGroups(mv_load_x(0u, 8u * g), Group(), Group(), Group());
    if (rows > 1u) {
        x.x1 = mv_load_x(1u, 8u * g);
    }
    if (rows > 2u) {
        x.x2 = mv_load_x(2u, 8u * g);
    }
    if (rows > 3u) {
        x.x3 = mv_load_x(3u, 8u * g);
    }
    return x;
}

fn mv_store(wid: vec3<u32>, row0: u32, s: array<vec4<f32>, 4>) {
    // A paired KV store rotates its key rows only, the first n / 2 (whole teams: n / 2 is a
    // multiple of 4).
    if (p.epilogue == 3u && (p.values_at == 0u || row0 < p.n / 2u)) {
        mv_store_rotated(row0, s);
        return;
    }
    if (p.epilogue == 4u) {
        mv_store_paired(row0, s);
        return;
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let row = row0 + j;
        if (row < p.n) {
            for (var i = 0u; i < min(4u, p.m - mv_a0); i = i + 1u) {
                let o = (mv_a0 + i) * p.n + row;
                let w = out_at(i, row);
                if (w != NO_WORD) {
                    out[w] = bitcast<u32>(finish(o, s[j][i]));
                }
            }
        }
    }
}

// The paired SwiGLU product's store: the team's sums are gate rows r and r + 1 (s[0], s[1])
// and up rows r and r + 1 (s[2], s[3]), r = row0 / 2 (`team_rows`); the output, [m, n / 2],
// gets silu(gate) · up at columns r and r + 1, rounded as `finish` rounds epilogue 2 (the
// SwiGLU of a gate product stored, then read back, as f32).
fn mv_store_paired(row0: u32, s: array<vec4<f32>, 4>) {
    let half = p.n / 2u;
    let r = row0 / 2u;
    for (var j = 0u; j < 2u; j = j + 1u) {
        if (r + j < half) {
            for (var i = 0u; i < min(4u, p.m - mv_a0); i = i + 1u) {
                let g = s[j][i];
                out[(mv_a0 + i) * half + r + j] = bitcast<u32>(g / (1.0 + exp(-g)) * s[j + 2u][i]);
            }
        }
    }
}

// No output word: a pool slot past the pool.
const NO_WORD: u32 = 0xffffffffu;

// The output word of the product's value at the workgroup's activation row `i` and output
// column `col`: row-major [m, n], or with p.store_dim the KV pool's row of its head in
// heads-first order, `store_slots[head · m + row]` (OpSpec::NormLinearInto). A paired store
// (p.values_at) puts the first n / 2 columns (the keys) into the pool at word 0 and the others
// (the values, at the same slots) into the one at word p.values_at.
fn out_at(i: u32, col: u32) -> u32 {
    let r = mv_a0 + i;
    if (p.store_dim == 0u) {
        return r * p.n + col;
    }
    let half = p.n / 2u;
    let second = p.values_at > 0u && col >= half;
    let c = select(col, col - half, second);
    let slot = store_slots[(c / p.store_dim) * p.m + r];
    if (slot >= p.pool_rows) {
        return NO_WORD;
    }
    return select(0u, p.values_at, second) + slot * p.store_dim + c % p.store_dim;
}

// `mv_store` with the rotary epilogue: rows row0..row0 + 4 (row0 a multiple of 4, the head size
// even, so rows 2i and 2i + 1 of a head are the pairs (j, j + 1) here) turned by the angle of
// their pair at each activation row's position, as `rope` (rope.wgsl) turns them.
fn mv_store_rotated(row0: u32, s: array<vec4<f32>, 4>) {
    for (var j = 0u; j < 4u; j = j + 2u) {
        let row = row0 + j;
        if (row < p.n) {
            let freq = res[(row % p.rope_dim) / 2u];
            for (var i = 0u; i < min(4u, p.m - mv_a0); i = i + 1u) {
                let sc = sin_cos(f32(rope_pos[mv_a0 + i]) * freq);
                let x0 = s[j][i];
                let x1 = s[j + 1u][i];
                let w0 = out_at(i, row);
                let w1 = out_at(i, row + 1u);
                if (w0 != NO_WORD) {
                    out[w0] = bitcast<u32>(x0 * sc.y - x1 * sc.x);
                }
                if (w1 != NO_WORD) {
                    out[w1] = bitcast<u32>(x0 * sc.x + x1 * sc.y);
                }
            }
        }
    }
}
