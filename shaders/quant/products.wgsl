// The quantized-data module, part 3 of 5 (see common.wgsl): products with packed weights
// and the row-dot decode products (`mv`).

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
             FMT_Q5_1, FMT_IQ4_NL, FMT_BF16: {
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
