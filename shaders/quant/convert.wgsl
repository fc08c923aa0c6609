// The quantized-data module, part 2 of 5 (see common.wgsl): quantize, dequantize and
// activations rounded to int8.

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
            let s = symmetric_scale(v0, -0.125);
            put_half(o, f32_to_f16(s.x));
            for (var j = 0u; j < 16u; j = j + 1u) {
                let ql = level_of(input(v0 + j) * s.y, 8.5, 15.0);
                let qh = level_of(input(v0 + j + 16u) * s.y, 8.5, 15.0);
                put_byte(o + 2u + j, ql | (qh << 4u));
            }
        }
        case FMT_Q5_0: {
            let s = symmetric_scale(v0, -0.0625);
            put_half(o, f32_to_f16(s.x));
            var levels: array<u32, 32>;
            for (var i = 0u; i < 32u; i = i + 1u) {
                levels[i] = level_of(input(v0 + i) * s.y, 16.5, 31.0);
            }
            put_five_bits(&levels, o + 2u, o + 6u);
        }
        case FMT_Q4_1, FMT_Q5_1: {
            // d = (max − min) / top, each value trunc((x − min) · (1/d) + 0.5), top 15 or 31.
            let five = p.format == FMT_Q5_1;
            let top = select(15.0, 31.0, five);
            var hi = input(v0);
            var lo = hi;
            for (var i = 1u; i < 32u; i = i + 1u) {
                hi = max(hi, input(v0 + i));
                lo = min(lo, input(v0 + i));
            }
            let d = div_rn(hi - lo, top);
            var id = 0.0;
            if (d != 0.0) {
                id = div_rn(1.0, d);
            }
            put_half(o, f32_to_f16(d));
            put_half(o + 2u, f32_to_f16(lo));
            var levels: array<u32, 32>;
            for (var i = 0u; i < 32u; i = i + 1u) {
                levels[i] = level_of((input(v0 + i) - lo) * id, 0.5, top);
            }
            if (five) {
                put_five_bits(&levels, o + 4u, o + 8u);
            } else {
                for (var j = 0u; j < 16u; j = j + 1u) {
                    put_byte(o + 4u + j, levels[j] | (levels[j + 16u] << 4u));
                }
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

// Q4_0's and Q5_0's scale of the 32 values from input[v0]: d = m · step (step −1/8 or −1/16,
// exact as the reference's division by −8 or −16) from the signed value of largest magnitude m
// (the first of equal magnitudes), and 1/d correctly rounded (0 where d is 0), as (d, 1/d).
fn symmetric_scale(v0: u32, step: f32) -> vec2<f32> {
    var amax = 0.0;
    var mx = 0.0;
    for (var i = 0u; i < 32u; i = i + 1u) {
        let v = input(v0 + i);
        if (amax < abs(v)) {
            amax = abs(v);
            mx = v;
        }
    }
    let d = mx * step;
    var id = 0.0;
    if (d != 0.0) {
        id = sign(d) * div_rn(1.0, abs(d));
    }
    return vec2<f32>(d, id);
}

// The level trunc(scaled + offset) clamped to [0, top], the two roundings kept apart as the
// reference keeps them (the product `scaled` is never fused into the add).
fn level_of(scaled: f32, offset: f32, top: f32) -> u32 {
    let sum = bitcast<f32>(bitcast<u32>(scaled) ^ p.zero) + offset;
    return u32(clamp(trunc(sum), 0.0, top));
}

// 32 five-bit levels as Q5_0 and Q5_1 store them: the fifth bits as one little-endian word at
// byte `qh`, the low four bits in 16 bytes at `qs` (value j low, value j + 16 high).
fn put_five_bits(levels: ptr<function, array<u32, 32>>, qh: u32, qs: u32) {
    var high = 0u;
    for (var i = 0u; i < 32u; i = i + 1u) {
        high = high | (((*levels)[i] >> 4u) << i);
    }
    put_byte(qh, high);
    put_byte(qh + 1u, high >> 8u);
    put_byte(qh + 2u, high >> 16u);
    put_byte(qh + 3u, high >> 24u);
    for (var j = 0u; j < 16u; j = j + 1u) {
        put_byte(qs + j, ((*levels)[j] & 15u) | (((*levels)[j + 16u] & 15u) << 4u));
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

// Q8_K, llama.cpp's activations for the K-quants (`quantize_q8_k` of src/quant/mod.rs): a scale
// per super-block of 256 values from its signed value of largest magnitude `mx` (the first of
// equal magnitudes): iscale = −127 / mx, q = min(127, round_half_even(x · iscale)), d = 1 / iscale,
// both divisions correctly rounded (`div_rn` of the magnitudes). One workgroup per super-block,
// a vec4 per lane: the lanes find `mx` in a tree of contiguous ranges (each step keeps the
// earlier range's value unless the later one's is strictly larger, so the first of equal
// magnitudes wins, as in a scan). (One invocation per super-block left a decode row of 2048
// values to 8 invocations, each reading its 256 values one after another: 42 µs per dispatch
// on an H200, 41% of a TinyLlama-shape Q4_K_M decode step's GPU time.) d is written once per
// chunk of 32, the layout the other roundings write, which the products read.
@compute @workgroup_size(64)
fn quantize_acts_super(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let t = wid.y * nwg.x + wid.x;
    if (t >= p.m * (p.k / 256u)) {
        return;
    }
    let x = xv[64u * t + lid];
    shared_max[lid] = signed_max(signed_max(signed_max(signed_max(0.0, x.x), x.y), x.z), x.w);
    workgroupBarrier();
    for (var s = 1u; s < WG; s = s << 1u) {
        if (lid % (2u * s) == 0u) {
            shared_max[lid] = signed_max(shared_max[lid], shared_max[lid + s]);
        }
        workgroupBarrier();
    }
    let mx = shared_max[0];
    var iscale = 0.0;
    var d = 0.0;
    if (mx != 0.0) {
        let mag = div_rn(127.0, abs(mx));
        let sign = select(1.0, -1.0, mx > 0.0);
        iscale = sign * mag;
        d = sign * div_rn(1.0, mag);
    }
    let q = min(vec4<i32>(round(x * iscale)), vec4<i32>(127));
    let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
    out[64u * t + lid] = b.x | (b.y * 0x100u) | (b.z * 0x10000u) | (b.w * 0x1000000u);
    if (lid < 8u) {
        out[p.m * p.k / 4u + 8u * t + lid] = bitcast<u32>(d);
    }
}

// `mx`, or `v` where its magnitude is larger: the running signed maximum of `quantize_acts_super`.
fn signed_max(mx: f32, v: f32) -> f32 {
    return select(mx, v, abs(v) > abs(mx));
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
