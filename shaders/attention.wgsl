// Causal grouped-query attention over a paged KV pool read in place (OpSpec::PagedAttention):
// one workgroup per (query, head) computes scores, softmax and the weighted sum of values in
// one dispatch, with no gathered copy of the sequence's keys and values.
//
// Bindings: 0 = params, 1 = out f32 [t, heads · head_dim], 2 = q f32 [t, heads · head_dim],
// 3 = keys f32 [pool_rows, head_dim], 4 = values (same shape), 5 = rows u32
// [kv_heads, stride] (the pool row of each key of each key/value head, in sequence order; the
// first n columns are read).
//
// The keys are taken 64 at a time (one per thread: its score), with an online softmax: each
// chunk's maximum rescales the running sum and the accumulated values, so any sequence length
// works in one pass and nothing grows with it. Each thread then owns output dimensions lid and
// lid + 64 of the head (named registers: CPU adapters keep arrays in memory per lane); a head
// wider than 128 is done in 128-wide slices, each recomputing the scores, which costs little
// next to the values it reads. A lane past the head's last dimension reads a neighbouring
// value it never stores (an index past the buffer is clamped by WebGPU's bounds checks).
//
// A pool row past the pool makes the query's output NaN, as the reference's gather does.
//
// `paged_attention` is the GPU shape; CPU adapters (the lanes shape) run
// `paged_attention_lanes` at the end of this file, which has no barrier.

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

// scale · (q · key) for query vector at `qbase` and pool row `row`; NaN past the pool.
fn score(qbase: u32, row: u32) -> f32 {
    if (row >= p.pool_rows) {
        // A quiet NaN, built from a runtime value so it is never a constant expression.
        return bitcast<f32>(0x7fc00000u | (row & 0u));
    }
    let hd = p.head_dim;
    let kbase = row * hd;
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
    return (s0 + s1) * p.scale;
}

@compute @workgroup_size(64)
fn paged_attention(@builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let idx = wid.y * nwg.x + wid.x;
    if (idx >= p.t * p.heads) {
        return;
    }
    let i = idx / p.heads;
    let h = idx % p.heads;
    let g = h / (p.heads / p.kv_heads);
    // Query i is position n − t + i: it sees keys start..end.
    let end = p.n - p.t + i + 1u;
    var start = 0u;
    if (p.window > 0u && end > p.window) {
        start = end - p.window;
    }
    let hd = p.head_dim;
    let qbase = idx * hd;
    let table = g * p.stride;
    for (var d0 = 0u; d0 < hd; d0 = d0 + SLICE) {
        // Whether the slice has a second dimension per thread (uniform).
        let two = hd - d0 > WG;
        var run_max = LOWEST;
        var total = 0.0;
        var poisoned = false;
        var acc0 = 0.0;
        var acc1 = 0.0;
        for (var c = start; c < end; c = c + WG) {
            let count = min(WG, end - c);
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
                let at = row * hd + d0 + lid;
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
        let inv = select(1.0 / total, nan, poisoned);
        let o = qbase + d0 + lid;
        if (d0 + lid < hd) {
            out[o] = acc0 * inv;
        }
        if (d0 + lid + WG < hd) {
            out[o + WG] = acc1 * inv;
        }
    }
}

// ---- one lane per slice of a head, no barrier (the software-adapter shape) --------------
//
// CPU adapters run a workgroup's lanes as SIMD registers and pay for each barrier by switching
// between them: the kernel above took about 460 µs per decode layer on SwiftShader for a
// dozen keys. Here each lane owns LANE_SLICE output dimensions of one (query, head) in eight
// vec4 registers and walks the keys alone, one at a time, with the same online softmax. The
// head's lanes each recompute its scores (head_dim / LANE_SLICE times), which for head_dim
// 64 costs two score dots per key where the value slice costs half of one.

const LANE_SLICE: u32 = 32u;

// Four values of pool row data from `at` (past the head they are a neighbour's, never stored).
fn value4(at: u32) -> vec4<f32> {
    return vec4<f32>(values[at], values[at + 1u], values[at + 2u], values[at + 3u]);
}

// Stores the components of `v` that fall in the head (dimension d of hd) at out[o..].
fn store4(o: u32, d: u32, hd: u32, v: vec4<f32>) {
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (d + j < hd) {
            out[o + j] = v[j];
        }
    }
}

@compute @workgroup_size(16)
fn paged_attention_lanes(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let hd = p.head_dim;
    let slices = (hd + LANE_SLICE - 1u) / LANE_SLICE;
    let idx = (wid.y * nwg.x + wid.x) * 16u + lid;
    if (idx >= p.t * p.heads * slices) {
        return;
    }
    let qh = idx / slices;
    let d0 = (idx % slices) * LANE_SLICE;
    let i = qh / p.heads;
    let g = (qh % p.heads) / (p.heads / p.kv_heads);
    let end = p.n - p.t + i + 1u;
    var start = 0u;
    if (p.window > 0u && end > p.window) {
        start = end - p.window;
    }
    let qbase = qh * hd;
    let table = g * p.stride;
    var run_max = LOWEST;
    var total = 0.0;
    var poisoned = false;
    var a0 = vec4<f32>();
    var a1 = vec4<f32>();
    var a2 = vec4<f32>();
    var a3 = vec4<f32>();
    var a4 = vec4<f32>();
    var a5 = vec4<f32>();
    var a6 = vec4<f32>();
    var a7 = vec4<f32>();
    for (var c = start; c < end; c = c + 1u) {
        let row = rows[table + c];
        poisoned = poisoned || row >= p.pool_rows;
        let s = score(qbase, row);
        let m = max(run_max, s);
        let rescale = exp(run_max - m);
        let w = exp(s - m);
        run_max = m;
        total = total * rescale + w;
        let at = row * hd + d0;
        a0 = a0 * rescale + w * value4(at);
        a1 = a1 * rescale + w * value4(at + 4u);
        a2 = a2 * rescale + w * value4(at + 8u);
        a3 = a3 * rescale + w * value4(at + 12u);
        a4 = a4 * rescale + w * value4(at + 16u);
        a5 = a5 * rescale + w * value4(at + 20u);
        a6 = a6 * rescale + w * value4(at + 24u);
        a7 = a7 * rescale + w * value4(at + 28u);
    }
    let nan = bitcast<f32>(0x7fc00000u | (hd & 0u));
    let inv = select(1.0 / total, nan, poisoned);
    let o = qbase + d0;
    store4(o, d0, hd, a0 * inv);
    store4(o + 4u, d0 + 4u, hd, a1 * inv);
    store4(o + 8u, d0 + 8u, hd, a2 * inv);
    store4(o + 12u, d0 + 12u, hd, a3 * inv);
    store4(o + 16u, d0 + 16u, hd, a4 * inv);
    store4(o + 20u, d0 + 20u, hd, a5 * inv);
    store4(o + 24u, d0 + 24u, hd, a6 * inv);
    store4(o + 28u, d0 + 28u, hd, a7 * inv);
}
