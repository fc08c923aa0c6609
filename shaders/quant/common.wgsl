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
//
// This module is compiled from shaders/quant/*.wgsl as one file, in this order: common,
// convert, products, cpu_adapters, tiled (`Shader::Quant`).

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
        case FMT_BF16: { return BF16_BLOCK_LEN; }
        case FMT_Q8_0: { return Q8_0_BLOCK_LEN; }
        case FMT_Q4_0: { return Q4_0_BLOCK_LEN; }
        case FMT_Q4_1: { return Q4_1_BLOCK_LEN; }
        case FMT_Q5_0: { return Q5_0_BLOCK_LEN; }
        case FMT_Q5_1: { return Q5_1_BLOCK_LEN; }
        case FMT_TQ1_0: { return TQ1_0_BLOCK_LEN; }
        case FMT_TQ2_0: { return TQ2_0_BLOCK_LEN; }
        default: { return TERNARY_PLANES_BLOCK_LEN; }
    }
}

fn block_bytes() -> u32 {
    switch p.format {
        case FMT_F16: { return F16_BLOCK_BYTES; }
        case FMT_BF16: { return BF16_BLOCK_BYTES; }
        case FMT_Q8_0: { return Q8_0_BLOCK_BYTES; }
        case FMT_Q4_0: { return Q4_0_BLOCK_BYTES; }
        case FMT_Q4_1: { return Q4_1_BLOCK_BYTES; }
        case FMT_Q5_0: { return Q5_0_BLOCK_BYTES; }
        case FMT_Q5_1: { return Q5_1_BLOCK_BYTES; }
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
