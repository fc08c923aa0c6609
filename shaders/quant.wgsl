// Quantized data: quantize (f32 -> blocks), dequantize, products with packed weights, and the
// exact integer dot of ternary weights. Byte layouts are GGUF's (see src/quant/mod.rs); every
// packed buffer is read as u32 words and never expanded to f32 in memory.
//
// @prelude(reduce): compiled after one of shaders/reduce/*.wgsl, which defines the entry `mv`.
// @prelude(dot4): and after one of shaders/dot4/*.wgsl, which defines `idot4` (the dot product
// of two words' four signed bytes).
// @prelude(rotary): and after shaders/rotary/sin_cos.wgsl, which defines `sin_cos`.
// @prelude(kquants): and after shaders/kquants/decode.wgsl, which decodes groups of the Q4_K
// Q5_K and Q6_K super-blocks (`kq_q4_k_group` …), Q2_K, Q3_K and IQ4_XS too.
//
// Bindings: 0 = params, 1 = output as u32 words (f32 and i32 results are bit-cast),
// 2 = `q`: the packed data (for `quantize` and `quantize_acts_*`: the f32 input),
// 3 = `x`: the second operand of products (activations, int8 values, quantized activations);
// 4..7 the `mv` kernel's epilogue operands (below); 8, 9 `mv_pairs_texels`' weights as texels.
//
// Exactness: quantize must match GGUF's f32 reference bit for bit, but WGSL's division is only
// accurate to 2.5 ulp and its f16 packing has no specified rounding. So the scale division and
// reciprocal use `div_rn` (an integer long division, correctly rounded) and f16 conversions
// are done on the bits (round to nearest even).

struct Params {
    format: u32,   // FMT_* of shaders/generated/formats.wgsl
    m: u32,        // rows of the input (products: activation rows)
    n: u32,        // products: weight rows (output columns)
    k: u32,        // values per row
    mode: u32,     // qmatmul_float: 0 f32, 1 f16 activations; quantize_acts_*: 0 q8_0 (`_blocks`), 1 per row (`_rows`)
    zero: u32,     // always 0: keeps a product from being fused into a following add, and
                   // the in-place masks values rather than constants (`inplace_masks`)
    epilogue: u32, // products: 1 adds `res` (binding 4, f32 [m, n]), 2 multiplies by silu(res),
                   // 3 (`mv` only) rotates pairs (2i, 2i + 1) of each head of rope_dim values by
                   // rope_pos (binding 6) and the frequencies in `res` ([rope_dim / 2]),
                   // 4 (`mv` only) the paired SwiGLU product (`mv_store_paired`)
    eps: f32,      // `mv` with FMT_NORM_ACTIVATIONS: the RMS norm's eps
    rope_dim: u32, // epilogue 3: elements per head
    store_dim: u32, // `mv` storing into a KV pool (see `out_at`): its row width; 0 stores [m, n]
    pool_rows: u32, // and the pool's rows
    second_at: u32, // the byte where a second weight's rows start in binding 2 (see `row_start`);
                    // 0: one weight
    values_at: u32, // `mv` storing into a key and a value pool bound as one range (see `out_at`):
                    // the value pool's first word; 0: one pool
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> q: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<u32>;
// The second operand of a product's epilogue (`mv` with p.epilogue > 0, `epilogue`): the
// residual it adds, or the gate product whose SiLU it multiplies.
@group(0) @binding(4) var<storage, read> res: array<f32>;
// The RMS norm's weight, f32 [k], of `mv` with FMT_NORM_ACTIVATIONS (see `mv_prepare`).
@group(0) @binding(5) var<storage, read> norm_w: array<vec4<f32>>;
// The positions, u32 [m], of the rotary epilogue (p.epilogue 3).
@group(0) @binding(6) var<storage, read> rope_pos: array<u32>;
// The pool rows, u32 [m · n / store_dim], of a product stored into a KV pool (p.store_dim).
@group(0) @binding(7) var<storage, read> store_slots: array<u32>;
// `mv_pairs_texels` only: the Q4_0 weights as texels (see there) and their scales, one word
// per pair of blocks.
@group(0) @binding(8) var<storage, read> texel_scales: array<u32>;
@group(0) @binding(9) var texels: texture_2d<u32>;

const WG: u32 = 64u;
// Activation rows per workgroup of the product kernels.
const ROWS: u32 = 8u;

var<private> gi: array<i32, 32>;
// Two blocks of the largest format, in words.
const PACKED_WORDS: u32 = 2u * TERNARY_PLANES_BLOCK_BYTES / 4u;
var<private> packed: array<u32, PACKED_WORDS>;
var<workgroup> partial: array<f32, 512>;
var<workgroup> ipartial: array<i32, 512>;
var<workgroup> shared_max: array<f32, 64>;

// ---- byte access to `q` -------------------------------------------------------------------

fn byte_at(o: u32) -> u32 {
    return (q[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

// The 16-bit value at an even byte offset.
fn half_at(o: u32) -> u32 {
    return (q[o >> 2u] >> ((o & 2u) * 8u)) & 0xffffu;
}

// Four bytes at any byte offset, little-endian.
fn word_at(o: u32) -> u32 {
    let i = o >> 2u;
    let s = (o & 3u) * 8u;
    if (s == 0u) {
        return q[i];
    }
    return (q[i] >> s) | (q[i + 1u] << (32u - s));
}

// Byte j of a word as a signed value.
fn sbyte(word: u32, j: u32) -> i32 {
    return (bitcast<i32>(word) << (24u - 8u * j)) >> 24u;
}

// ---- exact arithmetic ---------------------------------------------------------------------

// binary16 bits to f32, exactly (subnormals included).
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        return f16_subnormal(h);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// binary16 bits `h` (the low 16 bits) to f32, for the scales the decode products read: the
// hardware conversion, exact for every normal f16, with subnormals computed exactly, since a
// driver may flush them. SwiftShader's JIT runs both branches of `f16_to_f32` per lane; this
// made its Q8_0 and Q4_0 decode products 6–10% faster. (Quantize and dequantize keep
// `f16_to_f32`, which also keeps NaN payloads.)
fn f16_scale(h: u32) -> f32 {
    return select(unpack2x16float(h).x, f16_subnormal(h), (h & 0x7c00u) == 0u);
}

// The binary16 bits `h` (the low 16 bits) of a subnormal (or zero) as f32: 2^-24 · mantissa,
// which is exact in f32, with the sign.
fn f16_subnormal(h: u32) -> f32 {
    return bitcast<f32>(((h & 0x8000u) * 65536u) | bitcast<u32>(f32(bitcast<i32>(h & 0x3ffu)) * 5.9604645e-8));
}

// f32 to binary16 bits, rounded to nearest even, overflow to infinity.
fn f32_to_f16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u;
    }
    if (a >= 0x477ff000u) {
        return sign | 0x7c00u;
    }
    if (a < 0x38800000u) {
        // Below 2^-14: a subnormal half, round(v · 2^24).
        if (a < 0x33000001u) {
            return sign;
        }
        let e = a >> 23u;
        let mant = (a & 0x7fffffu) | 0x800000u;
        let s = 126u - e;
        var h = mant >> s;
        let rem = mant & ((1u << s) - 1u);
        let half = 1u << (s - 1u);
        if (rem > half || (rem == half && (h & 1u) == 1u)) {
            h = h + 1u;
        }
        return sign | h;
    }
    var h = (((a >> 23u) - 112u) << 10u) | ((a & 0x7fffffu) >> 13u);
    let rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)) {
        h = h + 1u;
    }
    return sign | h;
}

// a / b correctly rounded (to nearest even) for positive normal a and b with a normal
// quotient, by long division of the significands; other inputs use the hardware division.
fn div_rn(a: f32, b: f32) -> f32 {
    let ab = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    let ea = ab >> 23u;
    let eb = bb >> 23u;
    if (ea == 0u || eb == 0u || ea >= 255u || eb >= 255u || (ab >> 31u) != 0u || (bb >> 31u) != 0u) {
        return a / b;
    }
    var r = (ab & 0x7fffffu) | 0x800000u;
    let d = (bb & 0x7fffffu) | 0x800000u;
    var e = i32(ea) - i32(eb) + 127;
    if (r < d) {
        r = r << 1u;
        e = e - 1;
    }
    // 25 quotient bits: 24 significant and one guard bit; the remainder is the sticky part.
    // Doubling by adding, not shifting: CPU adapters' JITs shift vectors lane by lane (see
    // `q4_low_vals`).
    var quo = 0u;
    for (var i = 0u; i < 25u; i = i + 1u) {
        quo = quo + quo;
        if (r >= d) {
            r = r - d;
            quo = quo | 1u;
        }
        r = r + r;
    }
    var mant = quo >> 1u;
    if ((quo & 1u) == 1u && (r != 0u || (mant & 1u) == 1u)) {
        mant = mant + 1u;
        if (mant == 0x1000000u) {
            mant = mant >> 1u;
            e = e + 1;
        }
    }
    if (e < 1 || e > 254) {
        return a / b;
    }
    return bitcast<f32>((u32(e) << 23u) | (mant & 0x7fffffu));
}

// C's roundf: to nearest, halves away from zero.
fn round_away(v: f32) -> f32 {
    let t = trunc(v);
    if (abs(v - t) >= 0.5) {
        return t + sign(v);
    }
    return t;
}

// d = amax / 127 and its reciprocal (both 0 when amax is 0), as GGUF's Q8_0 computes them.
fn q8_scale(amax: f32) -> vec2<f32> {
    if (amax == 0.0) {
        return vec2<f32>(0.0, 0.0);
    }
    let d = div_rn(amax, 127.0);
    return vec2<f32>(d, div_rn(1.0, d));
}

// ---- formats ------------------------------------------------------------------------------

fn block_len() -> u32 {
    switch p.format {
        case FMT_F16: { return F16_BLOCK_LEN; }
        case FMT_Q8_0: { return Q8_0_BLOCK_LEN; }
        case FMT_Q4_0: { return Q4_0_BLOCK_LEN; }
        case FMT_TQ1_0: { return TQ1_0_BLOCK_LEN; }
        case FMT_TQ2_0: { return TQ2_0_BLOCK_LEN; }
        default: { return TERNARY_PLANES_BLOCK_LEN; }
    }
}

fn block_bytes() -> u32 {
    switch p.format {
        case FMT_F16: { return F16_BLOCK_BYTES; }
        case FMT_Q8_0: { return Q8_0_BLOCK_BYTES; }
        case FMT_Q4_0: { return Q4_0_BLOCK_BYTES; }
        case FMT_TQ1_0: { return TQ1_0_BLOCK_BYTES; }
        case FMT_TQ2_0: { return TQ2_0_BLOCK_BYTES; }
        default: { return TERNARY_PLANES_BLOCK_BYTES; }
    }
}

fn row_bytes() -> u32 {
    return p.k / block_len() * block_bytes();
}

// The first byte of weight row `row` of `bytes` bytes in binding 2: rows follow one another,
// but for a product over two weights bound together (p.second_at: the paired SwiGLU product,
// epilogue 4, and a paired KV store, p.values_at), whose n rows are the n / 2 rows of the first
// weights (gate, k), then those of the second (up, v) from byte p.second_at (a multiple of the
// storage offset alignment: each was uploaded to be bound on its own too).
fn row_start(row: u32, bytes: u32) -> u32 {
    let half = p.n / 2u;
    return select(row * bytes, p.second_at + (row - half) * bytes, p.second_at > 0u && row >= half);
}

// Trit of value v (0..256) of the TQ1_0 block at byte `base`.
fn tq1_trit(base: u32, v: u32) -> i32 {
    var at: u32;
    var n: u32;
    if (v < 160u) {
        at = v % 32u;
        n = v / 32u;
    } else if (v < 240u) {
        at = 32u + (v - 160u) % 16u;
        n = (v - 160u) / 16u;
    } else {
        at = 48u + (v - 240u) % 4u;
        n = (v - 240u) / 4u;
    }
    let t = (byte_at(base + at) * pow3(n)) & 0xffu;
    return i32((t * 3u) >> 8u) - 1;
}

// Decodes values 32g..32g+32 of packed row `row` (block formats) into `gi`; returns the scale.
fn decode_group(row: u32, g: u32) -> f32 {
    let rb = row * row_bytes();
    switch p.format {
        case FMT_Q8_0: {
            let base = rb + Q8_0_BLOCK_BYTES * g;
            for (var t = 0u; t < 8u; t = t + 1u) {
                let w = word_at(base + 2u + 4u * t);
                gi[4u * t] = sbyte(w, 0u);
                gi[4u * t + 1u] = sbyte(w, 1u);
                gi[4u * t + 2u] = sbyte(w, 2u);
                gi[4u * t + 3u] = sbyte(w, 3u);
            }
            return f16_to_f32(half_at(base));
        }
        case FMT_Q4_0: {
            let base = rb + Q4_0_BLOCK_BYTES * g;
            for (var t = 0u; t < 4u; t = t + 1u) {
                let w = word_at(base + 2u + 4u * t);
                for (var j = 0u; j < 4u; j = j + 1u) {
                    let b = (w >> (8u * j)) & 0xffu;
                    gi[4u * t + j] = i32(b & 15u) - 8;
                    gi[4u * t + j + 16u] = i32(b >> 4u) - 8;
                }
            }
            return f16_to_f32(half_at(base));
        }
        case FMT_TQ1_0: {
            let base = rb + TQ1_0_BLOCK_BYTES * (g / 8u);
            let first = 32u * (g % 8u);
            for (var i = 0u; i < 32u; i = i + 1u) {
                gi[i] = tq1_trit(base, first + i);
            }
            return f16_to_f32(half_at(base + 52u));
        }
        case FMT_TQ2_0: {
            let base = rb + TQ2_0_BLOCK_BYTES * (g / 8u);
            let sub = g % 8u;
            let shift = 2u * (sub % 4u);
            for (var t = 0u; t < 8u; t = t + 1u) {
                let w = word_at(base + 32u * (sub / 4u) + 4u * t);
                for (var j = 0u; j < 4u; j = j + 1u) {
                    gi[4u * t + j] = i32((w >> (8u * j + shift)) & 3u) - 1;
                }
            }
            return f16_to_f32(half_at(base + 64u));
        }
        default: {
            let wb = (rb + TERNARY_PLANES_BLOCK_BYTES * (g / 8u)) / 4u;
            let plus = q[wb + 1u + g % 8u];
            let minus = q[wb + 9u + g % 8u];
            for (var i = 0u; i < 32u; i = i + 1u) {
                gi[i] = i32((plus >> i) & 1u) - i32((minus >> i) & 1u);
            }
            return bitcast<f32>(q[wb]);
        }
    }
}

// ---- quantize -----------------------------------------------------------------------------

fn put_byte(o: u32, v: u32) {
    packed[o >> 2u] = packed[o >> 2u] | ((v & 0xffu) << ((o & 3u) * 8u));
}

fn put_half(o: u32, v: u32) {
    put_byte(o, v);
    put_byte(o + 1u, v >> 8u);
}

fn input(i: u32) -> f32 {
    return bitcast<f32>(q[i]);
}

// Trit + 1 of input value i under reciprocal scale id.
fn trit1(i: u32, id: f32) -> u32 {
    return u32(i32(round_away(input(i) * id)) + 1);
}

// Encodes the block whose first value is input[v0] at byte `o` of `packed`.
fn encode_block(v0: u32, o: u32) {
    switch p.format {
        case FMT_F16: {
            put_half(o, f32_to_f16(input(v0)));
        }
        case FMT_Q8_0: {
            var amax = 0.0;
            for (var i = 0u; i < 32u; i = i + 1u) {
                amax = max(amax, abs(input(v0 + i)));
            }
            let s = q8_scale(amax);
            put_half(o, f32_to_f16(s.x));
            for (var i = 0u; i < 32u; i = i + 1u) {
                put_byte(o + 2u + i, u32(i32(round_away(input(v0 + i) * s.y))));
            }
        }
        case FMT_Q4_0: {
            var amax = 0.0;
            var mx = 0.0;
            for (var i = 0u; i < 32u; i = i + 1u) {
                let v = input(v0 + i);
                if (amax < abs(v)) {
                    amax = abs(v);
                    mx = v;
                }
            }
            let d = mx * -0.125;
            var id = 0.0;
            if (d != 0.0) {
                id = sign(d) * div_rn(1.0, abs(d));
            }
            put_half(o, f32_to_f16(d));
            for (var j = 0u; j < 16u; j = j + 1u) {
                // Two roundings, as the reference: the product, then the sum.
                let lo = bitcast<f32>(bitcast<u32>(input(v0 + j) * id) ^ p.zero) + 8.5;
                let hi = bitcast<f32>(bitcast<u32>(input(v0 + j + 16u) * id) ^ p.zero) + 8.5;
                let ql = u32(clamp(trunc(lo), 0.0, 15.0));
                let qh = u32(clamp(trunc(hi), 0.0, 15.0));
                put_byte(o + 2u + j, ql | (qh << 4u));
            }
        }
        default: {
            var amax = 0.0;
            for (var i = 0u; i < 256u; i = i + 1u) {
                amax = max(amax, abs(input(v0 + i)));
            }
            var id = 0.0;
            if (amax != 0.0) {
                id = div_rn(1.0, amax);
            }
            encode_ternary(v0, o, amax, id);
        }
    }
}

fn encode_ternary(v0: u32, o: u32, d: f32, id: f32) {
    switch p.format {
        case FMT_TQ1_0: {
            for (var m = 0u; m < 48u; m = m + 1u) {
                var t = 0u;
                for (var n = 0u; n < 5u; n = n + 1u) {
                    var v = 32u * n + m;
                    if (m >= 32u) {
                        v = 160u + 16u * n + (m - 32u);
                    }
                    t = t * 3u + trit1(v0 + v, id);
                }
                put_byte(o + m, (t * 256u + 242u) / 243u);
            }
            for (var j = 0u; j < 4u; j = j + 1u) {
                var t = 0u;
                for (var n = 0u; n < 4u; n = n + 1u) {
                    t = t * 3u + trit1(v0 + 240u + 4u * n + j, id);
                }
                put_byte(o + 48u + j, (t * 3u * 256u + 242u) / 243u);
            }
            put_half(o + 52u, f32_to_f16(d));
        }
        case FMT_TQ2_0: {
            for (var c = 0u; c < 2u; c = c + 1u) {
                for (var m = 0u; m < 32u; m = m + 1u) {
                    var t = 0u;
                    for (var l = 0u; l < 4u; l = l + 1u) {
                        t = t | (trit1(v0 + 128u * c + 32u * l + m, id) << (2u * l));
                    }
                    put_byte(o + 32u * c + m, t);
                }
            }
            put_half(o + 64u, f32_to_f16(d));
        }
        default: {
            // Ternary planes: blocks are word aligned (68 bytes).
            let w0 = o / 4u;
            packed[w0] = bitcast<u32>(d);
            for (var c = 0u; c < 8u; c = c + 1u) {
                var plus = 0u;
                var minus = 0u;
                for (var i = 0u; i < 32u; i = i + 1u) {
                    let t = trit1(v0 + 32u * c + i, id);
                    plus = plus | (select(0u, 1u, t == 2u) << i);
                    minus = minus | (select(0u, 1u, t == 0u) << i);
                }
                packed[w0 + 1u + c] = plus;
                packed[w0 + 9u + c] = minus;
            }
        }
    }
}

// One thread per pair of blocks: a pair is a whole number of u32 words for every format, so
// no two threads write the same word.
@compute @workgroup_size(64)
fn quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let pair = (wid.y * nwg.x + wid.x) * WG + lid;
    let bl = block_len();
    let bb = block_bytes();
    let blocks = p.m * (p.k / bl);
    if (pair * 2u >= blocks) {
        return;
    }
    for (var i = 0u; i < PACKED_WORDS; i = i + 1u) {
        packed[i] = 0u;
    }
    let count = min(2u, blocks - pair * 2u);
    for (var h = 0u; h < count; h = h + 1u) {
        encode_block((pair * 2u + h) * bl, h * bb);
    }
    let first = pair * 2u * bb / 4u;
    let words = (count * bb + 3u) / 4u;
    for (var i = 0u; i < words; i = i + 1u) {
        out[first + i] = packed[i];
    }
}

// ---- dequantize ---------------------------------------------------------------------------

// One thread per 32 values of a row.
@compute @workgroup_size(64)
fn dequantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let t = (wid.y * nwg.x + wid.x) * WG + lid;
    let groups = (p.k + 31u) / 32u;
    if (t >= p.m * groups) {
        return;
    }
    let row = t / groups;
    let g = t % groups;
    let first = row * p.k + 32u * g;
    if (p.format == FMT_F16) {
        let end = min(32u, p.k - 32u * g);
        for (var i = 0u; i < end; i = i + 1u) {
            out[first + i] = bitcast<u32>(f16_to_f32(half_at(2u * (first + i))));
        }
        return;
    }
    if (kq_reads(p.format)) {
        // The super-blocks' groups come decoded, every scale applied (kquants/decode.wgsl).
        let w = kq_group(p.format, row, g);
        let vals = array<vec4<f32>, 8>(w.v0, w.v1, w.v2, w.v3, w.v4, w.v5, w.v6, w.v7);
        for (var i = 0u; i < 32u; i = i + 1u) {
            out[first + i] = bitcast<u32>(vals[i / 4u][i % 4u]);
        }
        return;
    }
    let d = decode_group(row, g);
    for (var i = 0u; i < 32u; i = i + 1u) {
        out[first + i] = bitcast<u32>(f32(gi[i]) * d);
    }
}

// ---- activations to int8 ------------------------------------------------------------------

// The three entries read f32 activations (bound as binding 2 and, as `xv`, binding 3; the
// host binds the norm's weight, or the activations again, as binding 5) and write the int8
// values, four per word (m·k/4 words), then one f32 scale per 32 values (m·k/32 words).

// Mode 0, Q8_0: a scale per 32 values, so each chunk of 32 is independent and one invocation
// rounds one chunk. (A workgroup per row left a decode's single row to one workgroup: 48 µs
// per dispatch on an H200, a sixth of the GPU's decode time.)
@compute @workgroup_size(64)
fn quantize_acts_blocks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let chunks = p.k / 32u;
    let t = (wid.y * nwg.x + wid.x) * WG + lid;
    if (t >= p.m * chunks) {
        return;
    }
    write_act_chunk(t, chunk_max(t));
}

// Mode 1: one scale per row (the row's scale repeated per chunk), from the row's largest
// magnitude: one workgroup per row.
@compute @workgroup_size(64)
fn quantize_acts_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.m) {
        return;
    }
    let k = p.k;
    var local_max = 0.0;
    for (var i = lid; i < k; i = i + WG) {
        local_max = max(local_max, abs(input(row * k + i)));
    }
    shared_max[lid] = local_max;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            shared_max[lid] = max(shared_max[lid], shared_max[lid + s]);
        }
        workgroupBarrier();
    }
    let chunks = k / 32u;
    for (var c = lid; c < chunks; c = c + WG) {
        write_act_chunk(row * chunks + c, shared_max[0]);
    }
}

// Either rounding with the RMS norm of a layer's input folded in, for the normed products
// (`OpSpec::NormLinear` and the like) on CPU adapters, where the `mv` kernel does not round
// (`quantizes_in_kernel` in kernels/quant.rs): x / sqrt(mean(x²) + eps) ⊙ norm_w (binding 5,
// eps in p.eps), multiplied in the order `rms_norm` and `mv_act` use, then rounded as
// `quantize_acts_blocks` (p.mode 0) or `quantize_acts_rows` (1) round. The normed rows never
// exist in memory: a layer's norm, rounding and product take two dispatches, not three, and
// the product's rotary and pool-store epilogues can follow.
//
// A workgroup of NORMED_LANES lanes per row, one SIMD group on a CPU adapter, so that its
// barriers (one, two for mode 1) switch between no groups (a CPU adapter pays for each
// barrier by switching between a workgroup's SIMD groups; see `rms_norm_rows`). Its lanes split
// the mean square and the chunks. A lane's loops run under k iterations, within lavapipe's loop
// budget. The activations are read as vec4s through `xv` (binding 3, bound to them as
// binding 2 is).
const NORMED_LANES: u32 = 4u;
var<workgroup> normed_partial: array<f32, NORMED_LANES>;

// The sum of `v` over the NORMED_LANES lanes, for every lane.
fn normed_lanes_sum(lid: u32, v: f32) -> f32 {
    normed_partial[lid] = v;
    workgroupBarrier();
    let sum = (normed_partial[0] + normed_partial[1]) + (normed_partial[2] + normed_partial[3]);
    workgroupBarrier();
    return sum;
}

@compute @workgroup_size(4)
fn quantize_acts_normed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.m) {
        return;
    }
    let k4 = p.k / 4u;
    var sq = 0.0;
    for (var i = lid; i < k4; i = i + NORMED_LANES) {
        let v = xv[row * k4 + i];
        sq = sq + dot(v, v);
    }
    act_norm = 1.0 / sqrt(normed_lanes_sum(lid, sq) / f32(p.k) + p.eps);
    act_normed = true;
    let chunks = p.k / 32u;
    let t0 = row * chunks;
    var row_max = 0.0;
    if (p.mode == 1u) {
        for (var c = lid; c < chunks; c = c + NORMED_LANES) {
            row_max = max(row_max, chunk_max(t0 + c));
        }
        normed_partial[lid] = row_max;
        workgroupBarrier();
        row_max = max(max(normed_partial[0], normed_partial[1]), max(normed_partial[2], normed_partial[3]));
    }
    for (var c = lid; c < chunks; c = c + NORMED_LANES) {
        // Mode 1 has the row's largest magnitude already; `select` would evaluate both.
        var amax = row_max;
        if (p.mode == 0u) {
            amax = chunk_max(t0 + c);
        }
        write_act_chunk(t0 + c, amax);
    }
}

// Whether the roundings norm their values (`quantize_acts_normed`), and the row scale
// 1 / sqrt(mean square + eps) they norm with.
var<private> act_normed: bool;
var<private> act_norm: f32;

// The index in `norm_w` of chunk `t`'s first four columns.
fn chunk_norm_base(t: u32) -> u32 {
    return 8u * (t % (p.k / 32u));
}

// Values 4w..4w + 4 of chunk `t` (`xv`, bound to the activations) as the roundings take them:
// normed where `act_normed`, with the chunk's `norm_base`.
fn chunk_vec(t: u32, w: u32, norm_base: u32) -> vec4<f32> {
    let v = xv[8u * t + w];
    if (!act_normed) {
        return v;
    }
    return v * act_norm * norm_w[norm_base + w];
}

// The largest magnitude of chunk `t` (values 32t..32t + 32, as `chunk_vec` gives them).
fn chunk_max(t: u32) -> f32 {
    let base = chunk_norm_base(t);
    var amax = 0.0;
    for (var w = 0u; w < 8u; w = w + 1u) {
        let v = abs(chunk_vec(t, w, base));
        amax = max(amax, max(max(v.x, v.y), max(v.z, v.w)));
    }
    return amax;
}

// Rounds chunk `t` (values 32t..32t + 32 of the m·k, k a multiple of 32, as `chunk_vec` gives
// them) with the scale of largest magnitude `amax`, and writes its eight words and its scale.
// The bytes are packed by multiplies, which CPU adapters run as vectors (see `q4_low_vals`).
fn write_act_chunk(t: u32, amax: f32) {
    let base = chunk_norm_base(t);
    let s = q8_scale(amax);
    for (var w = 0u; w < 8u; w = w + 1u) {
        let v = chunk_vec(t, w, base) * s.y;
        let q = vec4<i32>(i32(round_away(v.x)), i32(round_away(v.y)), i32(round_away(v.z)), i32(round_away(v.w)));
        let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
        out[8u * t + w] = b.x | (b.y * 0x100u) | (b.z * 0x10000u) | (b.w * 0x1000000u);
    }
    out[p.m * p.k / 4u + t] = bitcast<u32>(s.x);
}

// ---- products -----------------------------------------------------------------------------

// A product's epilogue (see `finish`) applied to `out` after a product kernel without it
// (`linear_residual` and `swiglu_linear` off the `mv` path), for i < m·n.
@compute @workgroup_size(64)
fn epilogue(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i < p.m * p.n) {
        out[i] = bitcast<u32>(finish(i, bitcast<f32>(out[i])));
    }
}

// Product value `v` at output index `o` after the epilogue p.epilogue: 1 the residual
// connection (rounded as `add`), 2 SwiGLU's silu(gate) · up with `v` the up product (rounded
// as `swiglu`); 0 leaves it.
fn finish(o: u32, v: f32) -> f32 {
    if (p.epilogue == 1u) {
        return res[o] + v;
    }
    if (p.epilogue == 2u) {
        let g = res[o];
        return g / (1.0 + exp(-g)) * v;
    }
    return v;
}

// Activation value i (flat index) as f32: f32 words, or f16 halves unpacked from u32 words.
fn activation(i: u32) -> f32 {
    if (p.mode == 1u) {
        return unpack2x16float(x[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(x[i]);
}

// The workgroup's output column and first activation row, or col = n when out of range.
fn product_tile(wid: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
    let idx = wid.y * nwg.x + wid.x;
    let row_blocks = (p.m + ROWS - 1u) / ROWS;
    if (idx >= p.n * row_blocks) {
        return vec2<u32>(p.n, 0u);
    }
    return vec2<u32>(idx % p.n, (idx / p.n) * ROWS);
}

// Sums each row's partial results over the workgroup and writes out[row, col].
fn finish_rows(lid: u32, col: u32, r0: u32, acc: array<f32, 8>) {
    for (var r = 0u; r < ROWS; r = r + 1u) {
        partial[r * WG + lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            for (var r = 0u; r < ROWS; r = r + 1u) {
                partial[r * WG + lid] = partial[r * WG + lid] + partial[r * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lid < min(ROWS, p.m - r0)) {
        out[(r0 + lid) * p.n + col] = bitcast<u32>(partial[lid * WG]);
    }
}

// Σ over 32 values of int8 x (eight words from word `base` of binding 3) times `gi`.
fn int_dot32(base: u32) -> i32 {
    var s = 0;
    for (var t = 0u; t < 8u; t = t + 1u) {
        let w = x[base + t];
        s = s + sbyte(w, 0u) * gi[4u * t] + sbyte(w, 1u) * gi[4u * t + 1u]
              + sbyte(w, 2u) * gi[4u * t + 2u] + sbyte(w, 3u) * gi[4u * t + 3u];
    }
    return s;
}

// out[row, col] = Σ act(x)[row, :] · w[col, :] with f32 or f16 activations: one workgroup per
// weight row and ROWS activation rows; threads stride over groups of 32 values.
@compute @workgroup_size(64)
fn qmatmul_float(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let tile = product_tile(wid, nwg);
    if (tile.x >= p.n) {
        return;
    }
    let col = tile.x;
    let r0 = tile.y;
    let k = p.k;
    let rows = min(ROWS, p.m - r0);
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    let groups = (k + 31u) / 32u;
    for (var g = lid; g < groups; g = g + WG) {
        if (p.format == FMT_F16) {
            // f16 weights, unpacked from u32 words.
            let end = min(32u, k - 32u * g);
            for (var i = 0u; i < end; i = i + 1u) {
                let e = col * k + 32u * g + i;
                let wv = unpack2x16float(q[e >> 1u])[e & 1u];
                for (var r = 0u; r < rows; r = r + 1u) {
                    acc[r] = acc[r] + wv * activation((r0 + r) * k + 32u * g + i);
                }
            }
            continue;
        }
        let d = decode_group(col, g);
        for (var r = 0u; r < rows; r = r + 1u) {
            let base = (r0 + r) * k + 32u * g;
            var s = 0.0;
            for (var i = 0u; i < 32u; i = i + 1u) {
                s = s + f32(gi[i]) * activation(base + i);
            }
            acc[r] = acc[r] + s * d;
        }
    }
    finish_rows(lid, col, r0, acc);
}

// The same product with int8 activations from `quantize_acts_*` (binding 3): integer dots per
// group of 32, scaled by the activation and weight scales.
@compute @workgroup_size(64)
fn qmatmul_int(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let tile = product_tile(wid, nwg);
    if (tile.x >= p.n) {
        return;
    }
    let col = tile.x;
    let r0 = tile.y;
    let k = p.k;
    let rows = min(ROWS, p.m - r0);
    let groups = k / 32u;
    let scales = p.m * k / 4u;
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var g = lid; g < groups; g = g + WG) {
        let d = decode_group(col, g);
        for (var r = 0u; r < rows; r = r + 1u) {
            let row = r0 + r;
            let s = int_dot32((row * k + 32u * g) / 4u);
            let da = bitcast<f32>(x[scales + row * groups + g]);
            acc[r] = acc[r] + f32(s) * (da * d);
        }
    }
    finish_rows(lid, col, r0, acc);
}

// Exact Σ trit(w[col, :]) · x[row, :] for int8 x (binding 3, four per word), as i32.
@compute @workgroup_size(64)
fn ternary_dot(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let tile = product_tile(wid, nwg);
    if (tile.x >= p.n) {
        return;
    }
    let col = tile.x;
    let r0 = tile.y;
    let k = p.k;
    let rows = min(ROWS, p.m - r0);
    var acc = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    for (var g = lid; g < k / 32u; g = g + WG) {
        decode_group(col, g);
        for (var r = 0u; r < rows; r = r + 1u) {
            acc[r] = acc[r] + int_dot32(((r0 + r) * k + 32u * g) / 4u);
        }
    }
    for (var r = 0u; r < ROWS; r = r + 1u) {
        ipartial[r * WG + lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            for (var r = 0u; r < ROWS; r = r + 1u) {
                ipartial[r * WG + lid] = ipartial[r * WG + lid] + ipartial[r * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lid < rows) {
        out[(r0 + lid) * p.n + col] = bitcast<u32>(ipartial[lid * WG]);
    }
}

// ---- row-dot products: one team of lanes per four weight rows (prelude entry `mv`) --------
//
// f32 or int8 activations, any m, k % 32 == 0. The grid is (row blocks of MV_ROWS weight rows)
// × (chunks of four activation rows): each lane holds 4 weight rows × 4 activation rows of
// outputs in registers, so a weight group is dequantized once per four activation rows (for
// prefill as for decode) and every lane has work even when k is short. The format is the
// pipeline constant MV_FORMAT (the same codes as `p.format`), so each pipeline is compiled for
// one format and the switch in `mv_decode` folds away. A lane takes groups of 32 values (one
// Q4_0/Q8_0 block, an eighth of a ternary block, 16 words of f16): it loads the activations of
// the group once (8 vec4s per activation row) and uses them for all four weight rows of its
// team, each group dequantized in registers as 8 vec4s, four values from each u32 word (a
// Q4_0/Q8_0 block starts on a word or two bytes into one: blocks are 34 and 18 bytes).
//
// Bindings as above; the activations are read through `xv` (binding 3 as vec4<f32>).

// The weight format's code (FMT_*), plus FMT_INT_ACTIVATIONS for int8 activations, plus
// FMT_QUANTIZE_ACTIVATIONS when `mv_prepare` rounds them from f32.
override MV_FORMAT: u32 = FMT_Q4_0;

@group(0) @binding(3) var<storage, read> xv: array<vec4<f32>>;

// The workgroup's first activation row (a multiple of 4), set by `mv_first_row`, which every
// prelude calls before the other `mv_` functions.
var<private> mv_a0: u32;

// Splits the flat workgroup index into (chunk of activation rows, block of MV_ROWS weight
// rows); returns the block's first weight row, or n for a workgroup past the last chunk.
fn mv_first_row(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return block_first_row(wid, nwg, MV_ROWS);
}

// `mv_first_row` for blocks of `block_rows` weight rows: sets `mv_a0`, the chunk's first
// activation row.
fn block_first_row(wid: vec3<u32>, nwg: vec3<u32>, block_rows: u32) -> u32 {
    let idx = wid.y * nwg.x + wid.x;
    let blocks = (p.n + block_rows - 1u) / block_rows;
    mv_a0 = 4u * (idx / blocks);
    if (mv_a0 >= p.m) {
        return p.n;
    }
    return (idx % blocks) * block_rows;
}

// ---- int8 activations rounded inside the product (MV_FORMAT has FMT_QUANTIZE_ACTIVATIONS) --
//
// For decode the separate `quantize_acts_*` dispatch costs as much as the product, so the `mv`
// kernel can take the f32 activations (binding 3) and round its up-to-four rows itself, into
// workgroup memory, before the product: the same arithmetic as `quantize_acts_*` (Q8_0: a scale
// per 32 values; mode 1: one per row), so the result is bit-equal to the two dispatches. Each
// workgroup rounds its own rows; the weight rows are what is split across workgroups, so the
// rounding is repeated per workgroup, which costs about 1/MV_ROWS of the product. The host
// picks this on GPUs only: on CPU adapters the separate dispatch was level natively and far
// faster in Chromium (`quantizes_in_kernel` in kernels/quant.rs).

// The most activation values (rows × k) rounded in the kernel (kernels/quant.rs
// `MVQ_MAX_VALUES`): 8192 int8 values and their 256 scales take 9 KiB of workgroup memory,
// which leaves room for the prelude's reduction within WebGPU's 16 KiB. That is k ≤ 8192 for
// one row (decode), k ≤ 2048 for four.
const MVQ_MAX_VALUES: u32 = 8192u;
var<workgroup> mvq_vals: array<u32, MVQ_MAX_VALUES / 4u>;
var<workgroup> mvq_scales: array<f32, MVQ_MAX_VALUES / 32u>;
var<workgroup> mvq_max: array<f32, 64>;
var<workgroup> mvq_squares: array<f32, 64>;

// With FMT_NORM_ACTIVATIONS each activation row is RMS-normed before it is rounded (the
// layer's input norm folded into the products that read it): x / sqrt(mean(x²) + eps) ⊙ norm_w,
// multiplied in the order `rms_norm` (norm.wgsl) uses. The mean square of row i is the sum of
// `mvq_squares[16i..16i + 16]` over k.

// 1 / sqrt(mean square + eps) of the workgroup's activation row `r`.
fn mv_row_scale(r: u32) -> f32 {
    var sum = 0.0;
    for (var t = 0u; t < 16u; t = t + 1u) {
        sum = sum + mvq_squares[16u * r + t];
    }
    return 1.0 / sqrt(sum / f32(p.k) + p.eps);
}

// Values 4i..4i + 4 of the workgroup's activation row `r` as the product takes them: normed
// with row scale `inv` when the pipeline norms (`inv` is unused otherwise).
fn mv_act(r: u32, i: u32, inv: f32) -> vec4<f32> {
    let v = xv[(mv_a0 + r) * (p.k / 4u) + i];
    if ((MV_FORMAT & FMT_NORM_ACTIVATIONS) != 0u) {
        return v * inv * norm_w[i];
    }
    return v;
}

// Rounds the workgroup's activation rows (mv_a0.., set by `mv_first_row`) into `mvq_vals`
// and `mvq_scales` (row i's scales at i·k/32..). Row i's int8 values take words i·k/4.., word t
// of group g at i·k/4 + t·(k/32) + g: interleaved, so that the lanes of a team, which take
// consecutive groups, read consecutive words (on a GPU, distinct banks of workgroup memory;
// in group order, eight words apart, every fourth lane of 32 read the same bank). CPU
// adapters round by the separate dispatch instead (`quantizes_in_kernel`, kernels/quant.rs).
fn mv_prepare(lid: u32) {
    if ((MV_FORMAT & FMT_QUANTIZE_ACTIVATIONS) == 0u) {
        return;
    }
    let k4 = p.k / 4u;
    let groups = p.k / 32u;
    let rows = select(0u, min(4u, p.m - mv_a0), mv_a0 < p.m);
    if ((MV_FORMAT & FMT_NORM_ACTIVATIONS) != 0u) {
        // 16 threads per row sum its squares.
        let r = lid / 16u;
        var sq = 0.0;
        if (r < rows) {
            for (var i = lid % 16u; i < k4; i = i + 16u) {
                let v = xv[(mv_a0 + r) * k4 + i];
                sq = sq + dot(v, v);
            }
        }
        mvq_squares[lid] = sq;
        workgroupBarrier();
    }
    if (p.mode == 1u) {
        // One scale per row: 16 threads per row find its largest magnitude.
        let r = lid / 16u;
        var mx = 0.0;
        if (r < rows) {
            let inv = mv_row_scale(r);
            for (var i = lid % 16u; i < k4; i = i + 16u) {
                let v = abs(mv_act(r, i, inv));
                mx = max(mx, max(max(v.x, v.y), max(v.z, v.w)));
            }
        }
        mvq_max[lid] = mx;
        workgroupBarrier();
    }
    for (var j = lid; j < rows * groups; j = j + 64u) {
        let r = j / groups;
        let g = j % groups;
        var inv = 1.0;
        if ((MV_FORMAT & FMT_NORM_ACTIVATIONS) != 0u) {
            inv = mv_row_scale(r);
        }
        var amax = 0.0;
        if (p.mode == 1u) {
            for (var t = 0u; t < 16u; t = t + 1u) {
                amax = max(amax, mvq_max[16u * r + t]);
            }
        } else {
            for (var t = 0u; t < 8u; t = t + 1u) {
                let v = abs(mv_act(r, 8u * g + t, inv));
                amax = max(amax, max(max(v.x, v.y), max(v.z, v.w)));
            }
        }
        let s = q8_scale(amax);
        for (var t = 0u; t < 8u; t = t + 1u) {
            let v = mv_act(r, 8u * g + t, inv);
            let q = vec4<i32>(
                i32(round_away(v.x * s.y)), i32(round_away(v.y * s.y)),
                i32(round_away(v.z * s.y)), i32(round_away(v.w * s.y)));
            let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
            mvq_vals[r * k4 + t * groups + g] = b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
        }
        mvq_scales[r * groups + g] = s.x;
    }
    workgroupBarrier();
}

// Everything below keeps its values in named locals and struct fields, never in arrays: a
// CPU adapter (SwiftShader, lavapipe) keeps a local or private array in memory per lane, and
// indexing one in a loop made these kernels several times slower there. Struct fields are
// always named, so the compilers keep them in registers.

// 32 consecutive values of a row (one Q4_0/Q8_0 block, an eighth of a ternary block), four per
// vector, and the scale they are multiplied by (a block's d; for int8 activations the group's
// scale; 1 for f32 activations).
struct Group {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
    v4: vec4<f32>,
    v5: vec4<f32>,
    v6: vec4<f32>,
    v7: vec4<f32>,
    scale: f32,
}

// (x · w) · (x.scale · w.scale): with int8 activations the dot is exact, then scaled by the
// product of the scales, as the reference computes it.
fn group_dot(x: Group, w: Group) -> f32 {
    let s = ((dot(x.v0, w.v0) + dot(x.v1, w.v1)) + (dot(x.v2, w.v2) + dot(x.v3, w.v3)))
        + ((dot(x.v4, w.v4) + dot(x.v5, w.v5)) + (dot(x.v6, w.v6) + dot(x.v7, w.v7)));
    return s * (x.scale * w.scale);
}

// The signed bytes of eight words (32 int8 values) as a group with scale `scale`.
fn q8_group(a: vec4<u32>, b: vec4<u32>, scale: f32) -> Group {
    return Group(q8_vals(a.x), q8_vals(a.y), q8_vals(a.z), q8_vals(a.w),
                 q8_vals(b.x), q8_vals(b.y), q8_vals(b.z), q8_vals(b.w), scale);
}

// The group of the 8 vec4s from vec4 `v0` of the workgroup's activation row `i` (mv_a0 + i,
// which the caller checks is below m). With int8 activations (FMT_INT_ACTIVATIONS: the
// output of `quantize_acts_*`, or of `mv_prepare` with FMT_QUANTIZE_ACTIVATIONS) the values are
// the integers and the scale is the row's scale of the group.
fn mv_load_x(i: u32, v0: u32) -> Group {
    if ((MV_FORMAT & FMT_INT_ACTIVATIONS) != 0u) {
        let w = mv_load_int_words(i, v0);
        return q8_group(w.a, w.b, w.scale);
    }
    let b = (mv_a0 + i) * (p.k / 4u) + v0;
    return Group(xv[b], xv[b + 1u], xv[b + 2u], xv[b + 3u], xv[b + 4u], xv[b + 5u], xv[b + 6u], xv[b + 7u], 1.0);
}

// The int8 activations of `mv_load_x`'s group as eight words of bytes (a: values 0..16, b:
// 16..32) and the group's scale.
fn mv_load_int_words(i: u32, v0: u32) -> BlockWords {
    let k4 = p.k / 4u;
    if ((MV_FORMAT & FMT_QUANTIZE_ACTIVATIONS) != 0u) {
        // Rounded by `mv_prepare`: word t of group v0/8 of row i at i·k/4 + t·(k/32) + v0/8.
        let groups = p.k / 32u;
        let w = i * k4 + v0 / 8u;
        return BlockWords(
            vec4<u32>(mvq_vals[w], mvq_vals[w + groups], mvq_vals[w + 2u * groups],
                      mvq_vals[w + 3u * groups]),
            vec4<u32>(mvq_vals[w + 4u * groups], mvq_vals[w + 5u * groups],
                      mvq_vals[w + 6u * groups], mvq_vals[w + 7u * groups]),
            mvq_scales[i * groups + v0 / 8u]);
    }
    // Eight words of int8 values at word a·k/4 + v0 (v0 = 8·group), and the group's scale.
    let a = mv_a0 + i;
    let w = (a * k4 + v0) / 4u;
    return BlockWords(bitcast<vec4<u32>>(xv[w]), bitcast<vec4<u32>>(xv[w + 1u]), stored_act_scale(a, v0 / 8u));
}

// The scale of group g of activation row a as `quantize_acts_*` stores it (binding 3 seen as
// vec4s): after the m · k/4 words of int8 values, one f32 per group of 32.
fn stored_act_scale(a: u32, g: u32) -> f32 {
    let sw = p.m * (p.k / 4u) + a * (p.k / 32u) + g;
    return xv[sw / 4u][sw % 4u];
}

// 3^n for n ≤ 4, from a vector rather than a local array (which lavapipe keeps in memory).
fn pow3(n: u32) -> u32 {
    return select(vec4<u32>(1u, 3u, 9u, 27u)[min(n, 3u)], 81u, n == 4u);
}

// The four bytes of a word as unsigned values, exactly, without shifts (see `q4_low_vals`):
// byte 3 has its top bit flipped so that it reads as a signed byte, then 128 added back.
fn unsigned_byte_vals(w: u32) -> vec4<f32> {
    let b = vec4<u32>(w ^ INPLACE_MASKS.top_bit) & INPLACE_MASKS.bytes;
    return vec4<f32>(bitcast<vec4<i32>>(b)) * BYTE_UNSCALE + vec4<f32>(0.0, 0.0, 0.0, 128.0);
}

// The four trits at power `p3` of the TQ1_0 bytes of a word, as values −1, 0, 1: the top
// base-3 digit of byte · 3^n mod 256, in f32 (every step exact: the values stay below 2^15).
fn tq1_vals(w: u32, p3: u32) -> vec4<f32> {
    let x = unsigned_byte_vals(w) * f32(bitcast<i32>(p3));
    let t = x - 256.0 * floor(x * 0.00390625);
    return floor(t * 0.01171875) - 1.0;
}

// The 2-bit TQ2_0 trits at bit `shift` of each byte of a word, as values −1, 0, 1: masked in
// place (`unit` = 2^shift) and scaled back. The top bit is flipped so that the last byte's
// field at bit 30 reads signed (t − 2, where the others read t).
fn tq2_vals(w: u32, unit: u32) -> vec4<f32> {
    let m = vec4<u32>(3u, 0x300u, 0x30000u, 0x3000000u) * unit;
    let v = vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w ^ 0x80000000u) & m));
    return v * (BYTE_UNSCALE / f32(bitcast<i32>(unit))) - vec4<f32>(1.0, 1.0, 1.0, select(1.0, -1.0, unit == 64u));
}

// Nibbles of a Q4_0 quant word as values: the low nibbles (values 4t..) or the high ones
// (values 16 + 4t..), minus 8. Masked in place and scaled back by powers of two (exact), not
// shifted: SwiftShader's JIT runs a vector shift by a vector one lane at a time (see the
// in-place products below). The masked values are converted as signed integers: SSE has no
// unsigned conversion, so that JIT spends several instructions per lane on one.
fn q4_low_vals(w: u32) -> vec4<f32> {
    return inplace_low_nibbles(w, INPLACE_MASKS) * BYTE_UNSCALE - 8.0;
}

fn q4_high_vals(w: u32) -> vec4<f32> {
    // Byte 3's high nibble comes out of `inplace_high_nibbles` already less 8.
    return inplace_high_nibbles(w, INPLACE_MASKS) * (BYTE_UNSCALE * 0.0625) - vec4<f32>(8.0, 8.0, 8.0, 0.0);
}

// Signed bytes of a word as values (exact, without shifts as above).
fn q8_vals(w: u32) -> vec4<f32> {
    return inplace_bytes(w, INPLACE_MASKS) * BYTE_UNSCALE;
}

// Four halves from word `i` of `q` on.
fn f16_vals(i: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(q[i]), unpack2x16float(q[i + 1u]));
}

// Values 4t..4t+4 of a ternary-planes group from its "+1" and "−1" bit words.
fn plane_vals(plus: u32, minus: u32, t: u32) -> vec4<f32> {
    let at = vec4<u32>(0u, 1u, 2u, 3u) + 4u * t;
    return vec4<f32>(bitcast<vec4<i32>>((vec4<u32>(plus) >> at) & vec4<u32>(1u)) - bitcast<vec4<i32>>((vec4<u32>(minus) >> at) & vec4<u32>(1u)));
}

// A Q4_0/Q8_0 block (18 and 34 bytes) starts on a word or two bytes into one (`odd`). Its f16
// scale is the first half of its first word `w0`...
fn block_scale(w0: u32, odd: bool) -> f32 {
    return f16_scale(select(w0 & 0xffffu, w0 >> 16u, odd));
}

// ...and its quant word t (bytes 2 + 4t..) comes from the block's words t (`lo`) and t + 1.
fn quant_word(lo: u32, hi: u32, odd: bool) -> u32 {
    return select((lo >> 16u) | (hi * 65536u), hi, odd);
}

// The word of four bytes at an even offset, from the words holding it: `lo` and the next
// (`odd`: the offset is two bytes into `lo`).
fn shifted_word(lo: u32, hi: u32, odd: bool) -> u32 {
    return select(lo, (lo >> 16u) | (hi * 65536u), odd);
}

// Nine consecutive words of `q` from word `b`: all the words a run of 32 bytes starting on an
// even byte can touch.
struct Words9 {
    w0: u32,
    w1: u32,
    w2: u32,
    w3: u32,
    w4: u32,
    w5: u32,
    w6: u32,
    w7: u32,
    w8: u32,
}

fn words9(b: u32) -> Words9 {
    return Words9(q[b], q[b + 1u], q[b + 2u], q[b + 3u], q[b + 4u], q[b + 5u], q[b + 6u], q[b + 7u], q[b + 8u]);
}

// A block's quant words and scale. Q8_0 (and a group of int8 activations): its 32 quants as
// eight words (a: values 0..16, b: 16..32). Q4_0: its 16 bytes of nibble pairs as four words
// in a (low nibbles are values 0..16, high ones 16..32), b unused.
struct BlockWords {
    a: vec4<u32>,
    b: vec4<u32>,
    scale: f32,
}

// Block g of Q8_0 weight row `row`, from the nine words it covers wherever it starts.
fn q8_block(row: u32, g: u32) -> BlockWords {
    let o = row_start(row, (p.k / 32u) * Q8_0_BLOCK_BYTES) + g * Q8_0_BLOCK_BYTES;
    let odd = (o & 2u) != 0u;
    let u = words9(o / 4u);
    return BlockWords(
        vec4<u32>(quant_word(u.w0, u.w1, odd), quant_word(u.w1, u.w2, odd),
                  quant_word(u.w2, u.w3, odd), quant_word(u.w3, u.w4, odd)),
        vec4<u32>(quant_word(u.w4, u.w5, odd), quant_word(u.w5, u.w6, odd),
                  quant_word(u.w6, u.w7, odd), quant_word(u.w7, u.w8, odd)),
        block_scale(u.w0, odd));
}

// Block g of Q4_0 weight row `row`.
fn q4_block(row: u32, g: u32) -> BlockWords {
    return nibble_block(row_start(row, (p.k / 32u) * Q4_0_BLOCK_BYTES) + g * Q4_0_BLOCK_BYTES);
}

// The block of an f16 scale and 16 bytes of nibbles (Q4_0, IQ4_NL) at byte `o`, from the five
// words it covers, each read once.
fn nibble_block(o: u32) -> BlockWords {
    let b = o / 4u;
    let odd = (o & 2u) != 0u;
    let u0 = q[b];
    let u1 = q[b + 1u];
    let u2 = q[b + 2u];
    let u3 = q[b + 3u];
    let u4 = q[b + 4u];
    let a = vec4<u32>(quant_word(u0, u1, odd), quant_word(u1, u2, odd),
                      quant_word(u2, u3, odd), quant_word(u3, u4, odd));
    return BlockWords(a, vec4<u32>(), block_scale(u0, odd));
}

// Values 32g.. of weight row `row`, dequantized (the scale apart).
fn mv_decode(row: u32, g: u32) -> Group {
    switch MV_FORMAT % FMT_INT_ACTIVATIONS {
        case FMT_F16: {
            let b = (row_start(row, 2u * p.k) + 64u * g) / 4u;
            return Group(f16_vals(b), f16_vals(b + 2u), f16_vals(b + 4u), f16_vals(b + 6u),
                         f16_vals(b + 8u), f16_vals(b + 10u), f16_vals(b + 12u), f16_vals(b + 14u), 1.0);
        }
        case FMT_Q8_0: {
            let w = q8_block(row, g);
            return Group(q8_vals(w.a.x), q8_vals(w.a.y), q8_vals(w.a.z), q8_vals(w.a.w),
                         q8_vals(w.b.x), q8_vals(w.b.y), q8_vals(w.b.z), q8_vals(w.b.w), w.scale);
        }
        case FMT_Q4_0: {
            let w = q4_block(row, g);
            return Group(q4_low_vals(w.a.x), q4_low_vals(w.a.y), q4_low_vals(w.a.z), q4_low_vals(w.a.w),
                         q4_high_vals(w.a.x), q4_high_vals(w.a.y), q4_high_vals(w.a.z), q4_high_vals(w.a.w),
                         w.scale);
        }
        case FMT_Q2_K, FMT_Q3_K, FMT_Q4_K, FMT_Q5_K, FMT_Q6_K, FMT_IQ4_XS, FMT_Q4_1, FMT_Q5_0,
             FMT_Q5_1, FMT_IQ4_NL: {
            return kq_group(MV_FORMAT % FMT_INT_ACTIVATIONS, row, g);
        }
        case FMT_TQ2_0: {
            // TQ2_0 blocks of 66 bytes: 64 bytes of 2-bit trits, then the f16 scale. Group g
            // is sub-block g % 8: bytes 32·(sub / 4).. at bit shift 2·(sub % 4).
            let o = row_start(row, (p.k / 256u) * TQ2_0_BLOCK_BYTES) + (g / 8u) * TQ2_0_BLOCK_BYTES;
            let sub = g % 8u;
            let qo = o + 32u * (sub / 4u);
            let b = qo / 4u;
            let odd = (qo & 2u) != 0u;
            let unit = 1u << (2u * (sub % 4u));
            // The nine words holding bytes qo..qo + 32.
            let u = words9(b);
            return Group(tq2_vals(shifted_word(u.w0, u.w1, odd), unit), tq2_vals(shifted_word(u.w1, u.w2, odd), unit),
                         tq2_vals(shifted_word(u.w2, u.w3, odd), unit), tq2_vals(shifted_word(u.w3, u.w4, odd), unit),
                         tq2_vals(shifted_word(u.w4, u.w5, odd), unit), tq2_vals(shifted_word(u.w5, u.w6, odd), unit),
                         tq2_vals(shifted_word(u.w6, u.w7, odd), unit), tq2_vals(shifted_word(u.w7, u.w8, odd), unit),
                         f16_scale(half_at(o + 64u)));
        }
        case FMT_TQ1_0: {
            // TQ1_0 blocks of 54 bytes: bytes 0..32 hold five trits each (values 0..160, the
            // n-th trit of byte i is value 32n + i), bytes 32..48 five each (values 160..240,
            // 160 + 16n + i), bytes 48..52 four each (values 240..256, 240 + 4n + i), then the
            // f16 scale. A trit is the top base-3 digit of byte · 3^n (mod 256), so a word of
            // four bytes gives four values at once; group g is values 32·(g % 8)..
            let o = row_start(row, (p.k / 256u) * TQ1_0_BLOCK_BYTES) + (g / 8u) * TQ1_0_BLOCK_BYTES;
            let sub = g % 8u;
            let d = f16_scale(half_at(o + 52u));
            if (sub < 5u) {
                // Trit `sub` of bytes 0..32: the nine words holding them.
                let b = o / 4u;
                let odd = (o & 2u) != 0u;
                let p3 = pow3(sub);
                let u = words9(b);
                return Group(tq1_vals(shifted_word(u.w0, u.w1, odd), p3), tq1_vals(shifted_word(u.w1, u.w2, odd), p3),
                             tq1_vals(shifted_word(u.w2, u.w3, odd), p3), tq1_vals(shifted_word(u.w3, u.w4, odd), p3),
                             tq1_vals(shifted_word(u.w4, u.w5, odd), p3), tq1_vals(shifted_word(u.w5, u.w6, odd), p3),
                             tq1_vals(shifted_word(u.w6, u.w7, odd), p3), tq1_vals(shifted_word(u.w7, u.w8, odd), p3), d);
            }
            // Bytes 32..52: only the words holding them (the last block may end the buffer).
            let qo = o + 32u;
            let b = qo / 4u;
            let odd = (qo & 2u) != 0u;
            var u5 = 0u;
            if (odd) {
                u5 = q[b + 5u];
            }
            let u1 = q[b + 1u];
            let u2 = q[b + 2u];
            let u3 = q[b + 3u];
            let u4 = q[b + 4u];
            let s0 = shifted_word(q[b], u1, odd);
            let s1 = shifted_word(u1, u2, odd);
            let s2 = shifted_word(u2, u3, odd);
            let s3 = shifted_word(u3, u4, odd);
            // Groups 5 and 6: trits 2(sub − 5) and the next of bytes 32..48. Group 7: trit 4 of
            // bytes 32..48, then the four trits of bytes 48..52.
            let pa = pow3(2u * (sub - 5u));
            if (sub < 7u) {
                let pb = pow3(2u * (sub - 5u) + 1u);
                return Group(tq1_vals(s0, pa), tq1_vals(s1, pa), tq1_vals(s2, pa), tq1_vals(s3, pa),
                             tq1_vals(s0, pb), tq1_vals(s1, pb), tq1_vals(s2, pb), tq1_vals(s3, pb), d);
            }
            let s4 = shifted_word(u4, u5, odd);
            return Group(tq1_vals(s0, pa), tq1_vals(s1, pa), tq1_vals(s2, pa), tq1_vals(s3, pa),
                         tq1_vals(s4, 1u), tq1_vals(s4, 3u), tq1_vals(s4, 9u), tq1_vals(s4, 27u), d);
        }
        default: {
            // Ternary planes, 68-byte blocks of 256 values: the f32 scale, then 8 words of
            // "+1" bits and 8 of "−1" bits; group g is bit word g % 8 of each plane.
            let wb = (row_start(row, (p.k / 256u) * TERNARY_PLANES_BLOCK_BYTES)
                + (g / 8u) * TERNARY_PLANES_BLOCK_BYTES) / 4u;
            let plus = q[wb + 1u + g % 8u];
            let minus = q[wb + 9u + g % 8u];
            return Group(plane_vals(plus, minus, 0u), plane_vals(plus, minus, 1u),
                         plane_vals(plus, minus, 2u), plane_vals(plus, minus, 3u),
                         plane_vals(plus, minus, 4u), plane_vals(plus, minus, 5u),
                         plane_vals(plus, minus, 6u), plane_vals(plus, minus, 7u), bitcast<f32>(q[wb]));
        }
    }
}

// ---- int8 activations against Q8_0 / Q4_0 weights: four bytes per integer dot ------------
//
// With int8 activations a decode product (one activation row) against Q8_0 or Q4_0 weights
// stays in integers: each word of weight bytes meets a word of activation bytes in one
// `idot4`, instead of eight conversions to f32 and four multiply-adds. The sums are exact, as
// the f32 path's are, so both give the same bits. On SwiftShader this made the decode
// matvecs 1.3–1.6 times faster; with several activation rows the f32 path, which converts
// each weight once for all of them, stayed faster there (prefill 10% slower on this path).

// 32 int8 activations as eight words (a: values 0..16, b: 16..32), their scale and, for Q4_0
// weights, their sum.
struct IntGroup {
    a: vec4<u32>,
    b: vec4<u32>,
    scale: f32,
    sum: i32,
}

// Whether `mv` takes the integer path: int8 activations and Q8_0 or Q4_0 weights.
fn mv_int_dot() -> bool {
    let format = MV_FORMAT % FMT_INT_ACTIVATIONS;
    return (MV_FORMAT & FMT_INT_ACTIVATIONS) != 0u && (format == FMT_Q8_0 || format == FMT_Q4_0);
}

// The int8 group from word `v0` (8·group) of the workgroup's activation row `i`, with the
// sum of its values for Q4_0 weights.
fn mv_load_xi(i: u32, v0: u32) -> IntGroup {
    let w = mv_load_int_words(i, v0);
    var sum = 0;
    if (MV_FORMAT % FMT_INT_ACTIVATIONS == FMT_Q4_0) {
        let one = 0x01010101u;
        sum = ((idot4(w.a.x, one) + idot4(w.a.y, one)) + (idot4(w.a.z, one) + idot4(w.a.w, one)))
            + ((idot4(w.b.x, one) + idot4(w.b.y, one)) + (idot4(w.b.z, one) + idot4(w.b.w, one)));
    }
    return IntGroup(w.a, w.b, w.scale, sum);
}

// Group g of weight row `row` as bytes to dot with an IntGroup: Q8_0's quants as they are;
// Q4_0's nibbles as bytes 0..15, whose offset of 8 `idot` takes off through the activations'
// sum.
fn mv_decode_int(row: u32, g: u32) -> BlockWords {
    if (MV_FORMAT % FMT_INT_ACTIVATIONS == FMT_Q8_0) {
        return q8_block(row, g);
    }
    let w = q4_block(row, g);
    let nibbles = vec4<u32>(0x0F0F0F0Fu);
    return BlockWords(w.a & nibbles, (w.a >> vec4<u32>(4u)) & nibbles, w.scale);
}

// (x · w) · (x.scale · w.scale), the dot exact in integers (Q4_0: less 8 · Σx).
fn idot(x: IntGroup, w: BlockWords) -> f32 {
    let s = ((idot4(x.a.x, w.a.x) + idot4(x.a.y, w.a.y)) + (idot4(x.a.z, w.a.z) + idot4(x.a.w, w.a.w)))
        + ((idot4(x.b.x, w.b.x) + idot4(x.b.y, w.b.y)) + (idot4(x.b.z, w.b.z) + idot4(x.b.w, w.b.w)));
    return f32(s - 8 * x.sum) * (x.scale * w.scale);
}

// The dots of weight group `w` with the workgroup's activation groups x0..x3 (the first
// `rows` of them real), one per vector component.
fn rows_dot(x0: Group, x1: Group, x2: Group, x3: Group, w: Group, rows: u32) -> vec4<f32> {
    var r = vec4<f32>(group_dot(x0, w), group_dot(x1, w), 0.0, 0.0);
    if (rows > 2u) {
        r.z = group_dot(x2, w);
    }
    if (rows > 3u) {
        r.w = group_dot(x3, w);
    }
    return r;
}

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

// ---- prefill on GPUs: output tiles, each weight group decoded once per tile ----------------
//
// `mm_tiled` computes a 64 × 64 tile of out = act(x) · wᵀ per workgroup of 16 × 16 threads,
// thread (tx, ty) the 4 × 4 block of activation rows 4·ty.. and weight rows 4·tx... k is walked
// one group of 32 values at a time: 64 threads each decode one weight row's group (`mv_decode`,
// any format `mv` takes) into workgroup memory, every thread stages eight activation values
// (f32, or the int8 values of `quantize_acts_*` times their scale), and each thread then runs
// 32 steps of two vec4 loads from workgroup memory and four vec4 multiply-adds. The row-dot
// kernel `mv` decodes every weight once per four activation rows; here once per 64. The
// activations' rounding is the same as the reference's, but the int8 products are summed in
// f32 (each value times its scale) rather than exactly per group, so the result differs from
// the reference by f32 rounding only. The host picks it on GPUs (the row-team shapes) for
// prefill products without a folded norm, a KV store or the rotary epilogue; `finish` applies
// the residual or SiLU-gate epilogue as it stores.
//
// Grid: one workgroup per (row tile, column tile), flat over x and y (split in `mm_tiled`).

var<workgroup> mmt_x: array<array<vec4<f32>, 16>, 32>; // [kk][activation row / 4]
var<workgroup> mmt_w: array<array<vec4<f32>, 16>, 32>; // [kk][weight row / 4]

// The 4 × 4 accumulators of `mm_tiled`: mmt_acc[i][j] is (activation row 4·ty + i, weight
// row 4·tx + j) of the tile.
var<private> mmt_acc: array<vec4<f32>, 4>;

// Stages the weight rows' group g: thread `lid` < 64 decodes tile row `lid` (rows past n
// repeat the last; their outputs are not stored).
fn mmt_stage_weights(c0: u32, g: u32, lid: u32) {
    if (lid >= 64u) {
        return;
    }
    let w = mv_decode(min(c0 + lid, p.n - 1u), g);
    let q4 = lid / 4u;
    let c = lid % 4u;
    let vals = array<vec4<f32>, 8>(w.v0, w.v1, w.v2, w.v3, w.v4, w.v5, w.v6, w.v7);
    for (var t = 0u; t < 8u; t = t + 1u) {
        let v = vals[t] * w.scale;
        mmt_w[4u * t][q4][c] = v.x;
        mmt_w[4u * t + 1u][q4][c] = v.y;
        mmt_w[4u * t + 2u][q4][c] = v.z;
        mmt_w[4u * t + 3u][q4][c] = v.w;
    }
}

// Stages values 8·part..8·part + 8 of group g of activation row r0 + rl (zeros past m).
fn mmt_stage_acts(r0: u32, g: u32, rl: u32, part: u32) {
    let a = r0 + rl;
    var lo = vec4<f32>();
    var hi = vec4<f32>();
    if (a < p.m) {
        let k4 = p.k / 4u;
        // Word of the int8 values (or vec4 of the f32 ones) this thread starts at.
        let w = a * k4 + 8u * g + 2u * part;
        if ((MV_FORMAT & FMT_INT_ACTIVATIONS) != 0u) {
            // `quantize_acts_*`'s layout: row a's int8 words at a·k/4, then the scales
            // (`stored_act_scale`). k/4 is a multiple of 8, so both words are in one vec4.
            let words = bitcast<vec4<u32>>(xv[w / 4u]);
            let s = stored_act_scale(a, g);
            let o = w % 4u;
            lo = q8_vals(words[o]) * s;
            hi = q8_vals(words[o + 1u]) * s;
        } else {
            lo = xv[w];
            hi = xv[w + 1u];
        }
    }
    let q4 = rl / 4u;
    let c = rl % 4u;
    let vals = array<f32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    for (var t = 0u; t < 8u; t = t + 1u) {
        mmt_x[8u * part + t][q4][c] = vals[t];
    }
}

// One k step of the thread's 4 × 4 block.
fn mmt_step(kk: u32, tx: u32, ty: u32) {
    let av = mmt_x[kk][ty];
    let bv = mmt_w[kk][tx];
    mmt_acc[0] = mmt_acc[0] + av.x * bv;
    mmt_acc[1] = mmt_acc[1] + av.y * bv;
    mmt_acc[2] = mmt_acc[2] + av.z * bv;
    mmt_acc[3] = mmt_acc[3] + av.w * bv;
}

@compute @workgroup_size(16, 16)
fn mm_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) lid3: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let col_tiles = (p.n + 63u) / 64u;
    let idx = wid.y * nwg.x + wid.x;
    let r0 = 64u * (idx / col_tiles);
    let c0 = 64u * (idx % col_tiles);
    if (r0 >= p.m) {
        return;
    }
    let tx = lid3.x;
    let ty = lid3.y;
    for (var g = 0u; g < p.k / 32u; g = g + 1u) {
        mmt_stage_weights(c0, g, lid);
        mmt_stage_acts(r0, g, lid / 4u, lid % 4u);
        workgroupBarrier();
        // Four steps per iteration: lavapipe ends a shader's loops after 65,535 iterations
        // in all, so k / 32 · 9 of them leave room for k up to about 230,000.
        for (var kk = 0u; kk < 32u; kk = kk + 4u) {
            mmt_step(kk, tx, ty);
            mmt_step(kk + 1u, tx, ty);
            mmt_step(kk + 2u, tx, ty);
            mmt_step(kk + 3u, tx, ty);
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        let a = r0 + 4u * ty + i;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let c = c0 + 4u * tx + j;
            if (a < p.m && c < p.n) {
                let o = a * p.n + c;
                out[o] = bitcast<u32>(finish(o, mmt_acc[i][j]));
            }
        }
    }
}
