// Causal grouped-query attention over a paged KV pool read in place (OpSpec::PagedAttention):
// scores, softmax and the weighted sum of values with no gathered copy of the sequence's keys
// and values.
//
// Bindings: 0 = params, 1 = out f32, 2 = q f32 [t, heads · head_dim], 3 = keys f32
// [pool_rows, head_dim], 4 = values (same shape), 5 = rows u32 [kv_heads, stride] (the pool
// row of each key of each key/value head, in sequence order; the first n columns are read).
//
// Split over keys (flash decoding): with `chunks` > 1 each query's keys are cut into that many
// runs of consecutive keys, sized from n in the kernel (so a replayed step whose n grows keeps
// its grid, which the recorder sized by the table's columns), and `out` is a partials buffer
// [t · heads, chunks, head_dim + 2]: per (query, head) and chunk the running maximum of the
// scores, the sum of their exponentials after it (−1 when a pool row past the pool was read),
// and the unnormalized weighted sum of the values. `attention_combine` then merges a query's
// chunks into the output [t, heads · head_dim], reading the partials through binding 2. With
// `chunks` = 1 the kernels write the output themselves. A chunk with no keys (fewer keys than
// chunks) leaves the maximum at LOWEST and the sum at 0, which the combine weighs by 0.
//
// A pool row past the pool makes the query's output NaN, as the reference's gather does.
//
// `paged_attention` is the GPU shape (a workgroup per query, head and chunk); CPU adapters
// (the lanes shape) run `paged_attention_lanes`, which has no barrier.

struct Params {
    t: u32,          // new queries: the last t positions of the sequence
    n: u32,          // keys of the sequence, the new ones included
    heads: u32,      // query heads
    kv_heads: u32,   // key/value heads (divides heads)
    head_dim: u32,   // elements per head
    pool_rows: u32,  // rows of each pool tensor
    scale: f32,      // multiplies every score q · k
    window: u32,     // sliding window in keys; 0 for full causal attention
    stride: u32,     // columns of the row table (≥ n)
    chunks: u32,     // runs of keys each query is split into (1: no split)
    keys_from: u32,  // the word of binding 3 where the keys start, and of binding 4 where the
    values_from: u32, // values do: 0, but where both pools are views of one buffer, bound as
                      // one range to both, their places in it
    softcap: f32,    // scores become softcap · tanh(score / softcap); 0 for no capping
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> keys: array<f32>;
@group(0) @binding(4) var<storage, read> values: array<f32>;
@group(0) @binding(5) var<storage, read> rows: array<u32>;

const WG: u32 = 64u;
// Output dimensions a workgroup accumulates per pass: two per thread.
const SLICE: u32 = 2u * WG;
// Below every score a model produces: the running maximum before the first key (the most
// negative f32 itself is refused by Tint, which checks the literal before rounding).
const LOWEST: f32 = -1.0e38;

// The chunk's scores, then their exponentials; the chunk's pool rows.
var<workgroup> weights: array<f32, WG>;
var<workgroup> slots: array<u32, WG>;

// The keys query i attends that fall in its chunk `chunk`, as (first, end): query i is
// position n − t + i and sees keys start..end (the last `window` of them with a window),
// split into `chunks` runs of equal length (the last shorter, trailing ones empty).
fn chunk_keys(i: u32, chunk: u32) -> vec2<u32> {
    let end = p.n - p.t + i + 1u;
    var start = 0u;
    if (p.window > 0u && end > p.window) {
        start = end - p.window;
    }
    let per = (end - start + p.chunks - 1u) / p.chunks;
    let first = min(start + chunk * per, end);
    return vec2<u32>(first, min(first + per, end));
}

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// A scaled score soft-capped where `p.softcap` asks (Gemma 2). The argument is clamped to ±10,
// where tanh is ±1 in f32, so no exp-based tanh meets inf / inf; a NaN stays NaN.
fn capped(s: f32) -> f32 {
    if (p.softcap == 0.0) {
        return s;
    }
    let c = p.softcap * tanh(clamp(s / p.softcap, -10.0, 10.0));
    return select(c, s, is_nan(s));
}

// scale · (q · key) for query vector at `qbase` and pool row `row`; NaN past the pool.
fn score(qbase: u32, row: u32) -> f32 {
    if (row >= p.pool_rows) {
        // A quiet NaN, built from a runtime value so it is never a constant expression.
        return bitcast<f32>(0x7fc00000u | (row & 0u));
    }
    let hd = p.head_dim;
    let kbase = p.keys_from + row * hd;
    var s0 = 0.0;
    var s1 = 0.0;
    var d = 0u;
    for (; d + 4u <= hd; d = d + 4u) {
        s0 = s0 + q[qbase + d] * keys[kbase + d] + q[qbase + d + 1u] * keys[kbase + d + 1u];
        s1 = s1 + q[qbase + d + 2u] * keys[kbase + d + 2u]
            + q[qbase + d + 3u] * keys[kbase + d + 3u];
    }
    for (; d < hd; d = d + 1u) {
        s0 = s0 + q[qbase + d] * keys[kbase + d];
    }
    return capped((s0 + s1) * p.scale);
}

@compute @workgroup_size(64)
fn paged_attention(@builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    // (query, head) · chunks + chunk: the partial's index.
    let part = wid.y * nwg.x + wid.x;
    if (part >= p.t * p.heads * p.chunks) {
        return;
    }
    let idx = part / p.chunks;
    let i = idx / p.heads;
    let h = idx % p.heads;
    let g = h / (p.heads / p.kv_heads);
    let span = chunk_keys(i, part % p.chunks);
    let hd = p.head_dim;
    let qbase = idx * hd;
    let table = g * p.stride;
    let split = p.chunks > 1u;
    for (var d0 = 0u; d0 < hd; d0 = d0 + SLICE) {
        // Whether the slice has a second dimension per thread (uniform).
        let two = hd - d0 > WG;
        var run_max = LOWEST;
        var total = 0.0;
        var poisoned = false;
        var acc0 = 0.0;
        var acc1 = 0.0;
        for (var c = span.x; c < span.y; c = c + WG) {
            let count = min(WG, span.y - c);
            var s = LOWEST;
            if (lid < count) {
                let row = rows[table + c + lid];
                slots[lid] = row;
                s = score(qbase, row);
            }
            weights[lid] = s;
            workgroupBarrier();
            var chunk_max = run_max;
            for (var u = 0u; u < count; u = u + 1u) {
                chunk_max = max(chunk_max, weights[u]);
            }
            workgroupBarrier();
            weights[lid] = exp(s - chunk_max);
            workgroupBarrier();
            let rescale = exp(run_max - chunk_max);
            run_max = chunk_max;
            var chunk_sum = 0.0;
            acc0 = acc0 * rescale;
            acc1 = acc1 * rescale;
            for (var u = 0u; u < count; u = u + 1u) {
                let w = weights[u];
                let row = slots[u];
                poisoned = poisoned || row >= p.pool_rows;
                chunk_sum = chunk_sum + w;
                let at = p.values_from + row * hd + d0 + lid;
                acc0 = acc0 + w * values[at];
                if (two) {
                    acc1 = acc1 + w * values[at + WG];
                }
            }
            total = total * rescale + chunk_sum;
            // The next chunk overwrites weights and slots.
            workgroupBarrier();
        }
        let nan = bitcast<f32>(0x7fc00000u | (hd & 0u));
        // The output, normalized; or the chunk's partial, whose first two words the first
        // thread writes once.
        var o = qbase + d0 + lid;
        var inv = select(1.0 / total, nan, poisoned);
        if (split) {
            let base = part * (hd + 2u);
            o = base + 2u + d0 + lid;
            inv = 1.0;
            if (d0 == 0u && lid == 0u) {
                out[base] = run_max;
                out[base + 1u] = select(total, -1.0, poisoned);
            }
        }
        if (d0 + lid < hd) {
            out[o] = acc0 * inv;
        }
        if (d0 + lid + WG < hd) {
            out[o + WG] = acc1 * inv;
        }
    }
}

// ---- one lane per (query, heads of a group, chunk), no barrier (the software-adapter shape) --
//
// CPU adapters run a workgroup's lanes as SIMD registers and pay for each barrier by switching
// between them, and load storage one lane and one word at a time (a gather with a branch per
// lane on SwiftShader), which is most of what attention costs there. So here each lane walks
// its chunk's keys alone with the online softmax for LANE_HEADS heads of one key/value group
// at once, holding LANE_DIMS dimensions of each head's query and weighted sum in registers
// (`Dims`: sixteen vec4s, a struct rather than an array, which these adapters keep in memory):
// per key it loads the row, the key's words and the value's words once for all of its heads.
// LANE_HEADS is a pipeline constant (1 to 4, chosen per group size by the host), so the code
// of the heads a lane does not take folds away; a group of more heads takes several lanes,
// the last of which may hold fewer. A head wider than LANE_DIMS takes a lane per LANE_DIMS
// dimensions, each computing the whole score (the dimensions outside its slice from storage).

const LANE_DIMS: u32 = 64u;

// Heads of one key/value group per lane (1 to 4).
override LANE_HEADS: u32 = 1u;

// LANE_DIMS consecutive dimensions of one head.
struct Dims {
    v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>,
    v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>,
    v8: vec4<f32>, v9: vec4<f32>, v10: vec4<f32>, v11: vec4<f32>,
    v12: vec4<f32>, v13: vec4<f32>, v14: vec4<f32>, v15: vec4<f32>,
}

// Which of dimensions d..d + 4 fall in a head of hd.
fn inside4(d: u32, hd: u32) -> vec4<bool> {
    return vec4<u32>(d, d + 1u, d + 2u, d + 3u) < vec4<u32>(hd);
}

// Four query values at `at`, dimension d of the head; 0 past the head or when not `used`.
fn query4(at: u32, d: u32, hd: u32, used: bool) -> vec4<f32> {
    let v = vec4<f32>(q[at], q[at + 1u], q[at + 2u], q[at + 3u]);
    return select(vec4<f32>(), v, inside4(d, hd) & vec4<bool>(used));
}

// A head's query dimensions d0.. from `at` (its dimension d0), zeros where not `used`.
fn query_dims(at: u32, d0: u32, hd: u32, used: bool) -> Dims {
    return Dims(
        query4(at, d0, hd, used), query4(at + 4u, d0 + 4u, hd, used),
        query4(at + 8u, d0 + 8u, hd, used), query4(at + 12u, d0 + 12u, hd, used),
        query4(at + 16u, d0 + 16u, hd, used), query4(at + 20u, d0 + 20u, hd, used),
        query4(at + 24u, d0 + 24u, hd, used), query4(at + 28u, d0 + 28u, hd, used),
        query4(at + 32u, d0 + 32u, hd, used), query4(at + 36u, d0 + 36u, hd, used),
        query4(at + 40u, d0 + 40u, hd, used), query4(at + 44u, d0 + 44u, hd, used),
        query4(at + 48u, d0 + 48u, hd, used), query4(at + 52u, d0 + 52u, hd, used),
        query4(at + 56u, d0 + 56u, hd, used), query4(at + 60u, d0 + 60u, hd, used));
}

// Four key words at `at`, dimension d; 0 past the head (a neighbour's words, which must not
// reach the score even when they are not finite).
fn key4(at: u32, d: u32, hd: u32) -> vec4<f32> {
    let k = vec4<f32>(keys[at], keys[at + 1u], keys[at + 2u], keys[at + 3u]);
    return select(vec4<f32>(), k, inside4(d, hd));
}

fn key_dims(at: u32, d0: u32, hd: u32) -> Dims {
    return Dims(
        key4(at, d0, hd), key4(at + 4u, d0 + 4u, hd),
        key4(at + 8u, d0 + 8u, hd), key4(at + 12u, d0 + 12u, hd),
        key4(at + 16u, d0 + 16u, hd), key4(at + 20u, d0 + 20u, hd),
        key4(at + 24u, d0 + 24u, hd), key4(at + 28u, d0 + 28u, hd),
        key4(at + 32u, d0 + 32u, hd), key4(at + 36u, d0 + 36u, hd),
        key4(at + 40u, d0 + 40u, hd), key4(at + 44u, d0 + 44u, hd),
        key4(at + 48u, d0 + 48u, hd), key4(at + 52u, d0 + 52u, hd),
        key4(at + 56u, d0 + 56u, hd), key4(at + 60u, d0 + 60u, hd));
}

// Four values at `at` (past the head they are a neighbour's, never stored).
fn value4(at: u32) -> vec4<f32> {
    return vec4<f32>(values[at], values[at + 1u], values[at + 2u], values[at + 3u]);
}

fn value_dims(at: u32) -> Dims {
    return Dims(
        value4(at), value4(at + 4u), value4(at + 8u), value4(at + 12u),
        value4(at + 16u), value4(at + 20u), value4(at + 24u), value4(at + 28u),
        value4(at + 32u), value4(at + 36u), value4(at + 40u), value4(at + 44u),
        value4(at + 48u), value4(at + 52u), value4(at + 56u), value4(at + 60u));
}

fn dot_dims(a: Dims, b: Dims) -> f32 {
    let s0 = dot(a.v0, b.v0) + dot(a.v1, b.v1) + dot(a.v2, b.v2) + dot(a.v3, b.v3);
    let s1 = dot(a.v4, b.v4) + dot(a.v5, b.v5) + dot(a.v6, b.v6) + dot(a.v7, b.v7);
    let s2 = dot(a.v8, b.v8) + dot(a.v9, b.v9) + dot(a.v10, b.v10) + dot(a.v11, b.v11);
    let s3 = dot(a.v12, b.v12) + dot(a.v13, b.v13) + dot(a.v14, b.v14) + dot(a.v15, b.v15);
    return (s0 + s1) + (s2 + s3);
}

// acc · r + w · v.
fn scale_add(acc: Dims, r: f32, w: f32, v: Dims) -> Dims {
    return Dims(
        acc.v0 * r + w * v.v0, acc.v1 * r + w * v.v1, acc.v2 * r + w * v.v2,
        acc.v3 * r + w * v.v3, acc.v4 * r + w * v.v4, acc.v5 * r + w * v.v5,
        acc.v6 * r + w * v.v6, acc.v7 * r + w * v.v7, acc.v8 * r + w * v.v8,
        acc.v9 * r + w * v.v9, acc.v10 * r + w * v.v10, acc.v11 * r + w * v.v11,
        acc.v12 * r + w * v.v12, acc.v13 * r + w * v.v13, acc.v14 * r + w * v.v14,
        acc.v15 * r + w * v.v15);
}

// Stores the components of `v` that fall in the head (dimension d of hd) at out[o..].
fn store4(o: u32, d: u32, hd: u32, v: vec4<f32>) {
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (d + j < hd) {
            out[o + j] = v[j];
        }
    }
}

// A lane's result for one of its heads: with `chunks` = 1 the output row of head `qh`
// (query · heads + head), normalized; else the partial of its chunk `chunk`.
fn finish_head(qh: u32, chunk: u32, d0: u32, run_max: f32, total: f32, poisoned: bool, a: Dims) {
    let hd = p.head_dim;
    let nan = bitcast<f32>(0x7fc00000u | (hd & 0u));
    var o = qh * hd + d0;
    var inv = select(1.0 / total, nan, poisoned);
    if (p.chunks > 1u) {
        let base = (qh * p.chunks + chunk) * (hd + 2u);
        o = base + 2u + d0;
        inv = 1.0;
        if (d0 == 0u) {
            out[base] = run_max;
            out[base + 1u] = select(total, -1.0, poisoned);
        }
    }
    store4(o, d0, hd, a.v0 * inv);
    store4(o + 4u, d0 + 4u, hd, a.v1 * inv);
    store4(o + 8u, d0 + 8u, hd, a.v2 * inv);
    store4(o + 12u, d0 + 12u, hd, a.v3 * inv);
    store4(o + 16u, d0 + 16u, hd, a.v4 * inv);
    store4(o + 20u, d0 + 20u, hd, a.v5 * inv);
    store4(o + 24u, d0 + 24u, hd, a.v6 * inv);
    store4(o + 28u, d0 + 28u, hd, a.v7 * inv);
    store4(o + 32u, d0 + 32u, hd, a.v8 * inv);
    store4(o + 36u, d0 + 36u, hd, a.v9 * inv);
    store4(o + 40u, d0 + 40u, hd, a.v10 * inv);
    store4(o + 44u, d0 + 44u, hd, a.v11 * inv);
    store4(o + 48u, d0 + 48u, hd, a.v12 * inv);
    store4(o + 52u, d0 + 52u, hd, a.v13 * inv);
    store4(o + 56u, d0 + 56u, hd, a.v14 * inv);
    store4(o + 60u, d0 + 60u, hd, a.v15 * inv);
}

// Lanes per workgroup (kernels/fused.rs ATTENTION_LANES_WG).
const LANES_WG: u32 = 8u;

@compute @workgroup_size(8)
fn paged_attention_lanes(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let hd = p.head_dim;
    let slices = (hd + LANE_DIMS - 1u) / LANE_DIMS;
    let group = p.heads / p.kv_heads;
    let blocks = (group + LANE_HEADS - 1u) / LANE_HEADS;
    let idx = (wid.y * nwg.x + wid.x) * LANES_WG + lid;
    if (idx >= p.t * p.kv_heads * blocks * p.chunks * slices) {
        return;
    }
    // Consecutive lanes take the chunks of one block of heads (similar key counts).
    let d0 = (idx % slices) * LANE_DIMS;
    let part = idx / slices;
    let chunk = part % p.chunks;
    let lane_heads = part / p.chunks;
    let block = lane_heads % blocks;
    let qg = lane_heads / blocks;
    let g = qg % p.kv_heads;
    let i = qg / p.kv_heads;
    // The lane's first head (query i's), and how many of its LANE_HEADS slots are heads.
    let first = block * LANE_HEADS;
    let count = min(LANE_HEADS, group - first);
    let qh = i * p.heads + g * group + first;
    let span = chunk_keys(i, chunk);
    let table = g * p.stride;
    let qa = qh * hd;
    let qb = qa + hd;
    let qc = qb + hd;
    let qd = qc + hd;
    let xa = query_dims(qa + d0, d0, hd, true);
    var xb: Dims;
    var xc: Dims;
    var xd: Dims;
    if (LANE_HEADS > 1u) {
        xb = query_dims(qb + d0, d0, hd, count > 1u);
    }
    if (LANE_HEADS > 2u) {
        xc = query_dims(qc + d0, d0, hd, count > 2u);
    }
    if (LANE_HEADS > 3u) {
        xd = query_dims(qd + d0, d0, hd, count > 3u);
    }
    let rest = d0 + LANE_DIMS;
    // Per head slot (x, y, z, w): the running maximum, the sum, the weighted values.
    var run_max = vec4<f32>(LOWEST);
    var total = vec4<f32>();
    var poisoned = false;
    var aa: Dims;
    var ab: Dims;
    var ac: Dims;
    var ad: Dims;
    for (var c = span.x; c < span.y; c = c + 1u) {
        let row = rows[table + c];
        // A row past the pool reads clamped words; the output is NaN whatever they give.
        poisoned = poisoned || row >= p.pool_rows;
        let kb = p.keys_from + row * hd;
        let k = key_dims(kb + d0, d0, hd);
        var s = vec4<f32>(dot_dims(xa, k), 0.0, 0.0, 0.0);
        if (LANE_HEADS > 1u) {
            s.y = dot_dims(xb, k);
        }
        if (LANE_HEADS > 2u) {
            s.z = dot_dims(xc, k);
        }
        if (LANE_HEADS > 3u) {
            s.w = dot_dims(xd, k);
        }
        // The dimensions outside this lane's slice (heads wider than LANE_DIMS; no lane of a
        // narrower head enters these loops).
        for (var d = 0u; d < d0; d = d + 1u) {
            let kd = keys[kb + d];
            s = s + kd * vec4<f32>(q[qa + d], q[qb + d], q[qc + d], q[qd + d]);
        }
        for (var d = rest; d < hd; d = d + 1u) {
            let kd = keys[kb + d];
            s = s + kd * vec4<f32>(q[qa + d], q[qb + d], q[qc + d], q[qd + d]);
        }
        s = s * p.scale;
        s = vec4<f32>(capped(s.x), capped(s.y), capped(s.z), capped(s.w));
        let m = max(run_max, s);
        let r = exp(run_max - m);
        let w = exp(s - m);
        run_max = m;
        total = total * r + w;
        let v = value_dims(p.values_from + row * hd + d0);
        aa = scale_add(aa, r.x, w.x, v);
        if (LANE_HEADS > 1u) {
            ab = scale_add(ab, r.y, w.y, v);
        }
        if (LANE_HEADS > 2u) {
            ac = scale_add(ac, r.z, w.z, v);
        }
        if (LANE_HEADS > 3u) {
            ad = scale_add(ad, r.w, w.w, v);
        }
    }
    finish_head(qh, chunk, d0, run_max.x, total.x, poisoned, aa);
    if (LANE_HEADS > 1u && count > 1u) {
        finish_head(qh + 1u, chunk, d0, run_max.y, total.y, poisoned, ab);
    }
    if (LANE_HEADS > 2u && count > 2u) {
        finish_head(qh + 2u, chunk, d0, run_max.z, total.z, poisoned, ac);
    }
    if (LANE_HEADS > 3u && count > 3u) {
        finish_head(qh + 3u, chunk, d0, run_max.w, total.w, poisoned, ad);
    }
}

// ---- the merge of a split's chunks (both shapes) -----------------------------------------
//
// One invocation per (query, head) and four output dimensions, no barrier: the chunks'
// maxima give the largest, each chunk's sum and values are scaled from its own maximum to
// that one and added, and the sum divides. The partials come through binding 2 (`q`).

@compute @workgroup_size(64)
fn attention_combine(@builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let hd = p.head_dim;
    let quads = (hd + 3u) / 4u;
    let idx = (wid.y * nwg.x + wid.x) * WG + lid;
    if (idx >= p.t * p.heads * quads) {
        return;
    }
    let qh = idx / quads;
    let d = (idx % quads) * 4u;
    let width = hd + 2u;
    let base = qh * p.chunks * width;
    var top = LOWEST;
    for (var c = 0u; c < p.chunks; c = c + 1u) {
        top = max(top, q[base + c * width]);
    }
    var total = 0.0;
    var poisoned = false;
    var acc = vec4<f32>();
    for (var c = 0u; c < p.chunks; c = c + 1u) {
        let b = base + c * width;
        let sum = q[b + 1u];
        poisoned = poisoned || sum < 0.0;
        let e = exp(q[b] - top);
        total = total + sum * e;
        let at = b + 2u + d;
        acc = acc + e * vec4<f32>(q[at], q[at + 1u], q[at + 2u], q[at + 3u]);
    }
    let nan = bitcast<f32>(0x7fc00000u | (hd & 0u));
    store4(qh * hd + d, d, hd, acc * select(1.0 / total, nan, poisoned));
}

