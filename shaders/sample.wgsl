// Drawing one token per row of logits with temperature, top-k and top-p, exactly as
// SampleParams (src/backend/spec.rs) defines it, without sorting.
//
// One workgroup of 256 threads per row. Every rule of the definition keeps the entries whose
// value is at least a threshold, so the kernel searches the threshold instead of sorting:
// values are mapped to order-preserving u32 keys, and a binary search over keys finds the
// largest key K whose kept count (top-k) or kept weight (top-p) still reaches the goal. That
// takes at most 32 passes over the row per rule, each ending in a workgroup reduction. The
// draw sums the kept weights per contiguous chunk of the row (one chunk per thread), and
// thread 0 walks the chunk where u · W falls, so tokens are visited in index order.
//
// Greedy rows (temperature 0) take two other entries instead, which spread the row over many
// workgroups: `greedy_chunks` finds the largest key and its first index in each thread's
// share of each chunk of GREEDY_CHUNK logits, `greedy_pick` the best of a row's shares. A single 256-thread workgroup
// scanning 49,152 logits twice, with three tree reductions, took 2% of a decode step on
// SwiftShader (one core, 64 SIMD groups switched at every barrier), and it leaves all but one
// of a GPU's compute units idle.
//
// Rows are indexed over a two-dimensional grid (wid.y * num_workgroups.x + wid.x).
// Bindings: 0 = params, 1 = output u32 [rows] (`greedy_chunks`: u32 pairs [rows, chunks,
// GREEDY_WG, 2], key then index), 2 = logits f32 [rows, vocab], 3 = uniform f32 [rows],
// 4 = `greedy_pick`'s input: those pairs.

struct Params {
    rows: u32,
    vocab: u32,
    temperature: f32,
    top_k: u32,
    top_p: f32,
    chunks: u32,   // the greedy entries' chunks per row: ceil(vocab / GREEDY_CHUNK)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> uniform_in: array<f32>;
@group(0) @binding(4) var<storage, read> chunk_best: array<u32>;

const WG: u32 = 256u;
// No key: NaN entries, and threads that saw no entry. Every non-NaN value has a larger key.
const NO_KEY: u32 = 0u;
const KEY_NEG_INF: u32 = 0x007fffffu;
const KEY_POS_INF: u32 = 0xff800000u;

var<workgroup> red_u: array<u32, 256>;
var<workgroup> red_f: array<f32, 256>;
var<workgroup> bcast_u: u32;
var<workgroup> bcast_f: f32;

// NaN test on the bits (see argmax.wgsl).
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// An order-preserving key: a < b as floats iff key(a) < key(b); -0 counts as +0; NaN has none.
fn key_of(v: f32) -> u32 {
    var b = bitcast<u32>(v);
    if (is_nan(v)) {
        return NO_KEY;
    }
    if (b == 0x80000000u) {
        b = 0u;
    }
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// Workgroup reductions; every thread gets the result (a uniform value).
const SUM: u32 = 0u;
const MAX: u32 = 1u;
const MIN: u32 = 2u;

fn combine(a: u32, b: u32, op: u32) -> u32 {
    switch op {
        case MAX: {
            return max(a, b);
        }
        case MIN: {
            return min(a, b);
        }
        default: {
            return a + b;
        }
    }
}

fn reduce_u(v: u32, lid: u32, op: u32) -> u32 {
    red_u[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red_u[lid] = combine(red_u[lid], red_u[lid + s], op);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        bcast_u = red_u[0];
    }
    return workgroupUniformLoad(&bcast_u);
}

fn sum_f(v: f32, lid: u32) -> f32 {
    red_f[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red_f[lid] = red_f[lid] + red_f[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        bcast_f = red_f[0];
    }
    return workgroupUniformLoad(&bcast_f);
}

// The weight exp((v - max) / temperature) of a kept value.
fn weight(v: f32, max_v: f32) -> f32 {
    return exp((v - max_v) / p.temperature);
}

// Entries of the row with key >= k: their number.
fn count_from(base: u32, k: u32, lid: u32) -> u32 {
    var c = 0u;
    for (var j = lid; j < p.vocab; j = j + WG) {
        c = c + select(0u, 1u, key_of(x[base + j]) >= k);
    }
    return reduce_u(c, lid, SUM);
}

// Entries of the row with key >= k: the sum of their weights.
fn weight_from(base: u32, k: u32, max_v: f32, lid: u32) -> f32 {
    var s = 0.0;
    for (var j = lid; j < p.vocab; j = j + WG) {
        let v = x[base + j];
        if (key_of(v) >= k) {
            s = s + weight(v, max_v);
        }
    }
    return sum_f(s, lid);
}

@compute @workgroup_size(256)
fn sample(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.vocab;

    // The largest key, the count of non-NaN entries.
    var best = NO_KEY;
    var count = 0u;
    for (var j = lid; j < p.vocab; j = j + WG) {
        let k = key_of(x[base + j]);
        best = max(best, k);
        count = count + select(0u, 1u, k != NO_KEY);
    }
    let max_key = reduce_u(best, lid, MAX);
    let valid = reduce_u(count, lid, SUM);
    // The first index holding it.
    var first = 0xffffffffu;
    for (var j = lid; j < p.vocab; j = j + WG) {
        if (key_of(x[base + j]) == max_key) {
            first = min(first, j);
        }
    }
    first = reduce_u(first, lid, MIN);
    if (max_key == NO_KEY || max_key == KEY_POS_INF) {
        if (lid == 0u) {
            out[row] = select(first, 0u, max_key == NO_KEY);
        }
        return;
    }
    let max_v = x[base + first];

    // Kept entries: key >= threshold.
    var threshold = KEY_NEG_INF;
    if (p.top_k > 0u && p.top_k < valid) {
        var lo = threshold;
        var hi = max_key;
        while (lo < hi) {
            let mid = lo + (hi - lo + 1u) / 2u;
            if (count_from(base, mid, lid) >= p.top_k) {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
        threshold = lo;
    }
    if (p.top_p < 1.0) {
        let goal = max(p.top_p, 0.0) * weight_from(base, threshold, max_v, lid);
        var lo = threshold;
        var hi = max_key;
        while (lo < hi) {
            let mid = lo + (hi - lo + 1u) / 2u;
            if (weight_from(base, mid, max_v, lid) >= goal) {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
        threshold = lo;
    }

    // The draw: each thread sums the kept weights of its contiguous chunk.
    let chunk = (p.vocab + WG - 1u) / WG;
    let start = min(lid * chunk, p.vocab);
    let end = min(start + chunk, p.vocab);
    var part = 0.0;
    var last = 0u;
    for (var j = start; j < end; j = j + 1u) {
        let v = x[base + j];
        if (key_of(v) >= threshold) {
            part = part + weight(v, max_v);
            last = j + 1u;
        }
    }
    red_f[lid] = part;
    let last_kept = reduce_u(last, lid, MAX);
    if (lid == 0u) {
        var total = 0.0;
        for (var c = 0u; c < WG; c = c + 1u) {
            total = total + red_f[c];
        }
        let goal_sum = uniform_in[row] * total;
        var acc = 0.0;
        var c = 0u;
        while (c + 1u < WG && acc + red_f[c] <= goal_sum) {
            acc = acc + red_f[c];
            c = c + 1u;
        }
        var picked = last_kept - 1u;
        for (var j = min(c * chunk, p.vocab); j < p.vocab; j = j + 1u) {
            let v = x[base + j];
            if (key_of(v) >= threshold) {
                acc = acc + weight(v, max_v);
                if (acc > goal_sum) {
                    picked = j;
                    break;
                }
            }
        }
        out[row] = picked;
    }
}

// ---- Greedy rows: the first index of the largest key, or 0 when the row has no key (all
// NaN), as `sample` answers for such rows.

// Threads per workgroup of the greedy entries, and logits per chunk (one workgroup each):
// 32 per thread. Keep GREEDY_CHUNK equal to `GREEDY_CHUNK` in kernels/sample.rs.
const GREEDY_WG: u32 = 64u;
const GREEDY_CHUNK: u32 = 2048u;
// The index of a thread that saw no key.
const NO_INDEX: u32 = 0xffffffffu;

var<workgroup> best_key: array<u32, GREEDY_WG>;
var<workgroup> best_index: array<u32, GREEDY_WG>;

// Whether (key b, index j) beats (key a, index i): a larger key, or the same key earlier.
fn greedy_beats(a: u32, i: u32, b: u32, j: u32) -> bool {
    return b > a || (b == a && j < i);
}

// One workgroup per (row, chunk); each thread writes the largest key of its strided share of
// the chunk and the first index holding it. No reduction here: on a CPU adapter each of a
// workgroup's barriers switches between all its SIMD groups, which made a per-chunk reduction
// cost more than the scan (SwiftShader: 1,107 µs for 49,152 logits in 24 chunks).
@compute @workgroup_size(64)
fn greedy_chunks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let idx = wid.y * nwg.x + wid.x;
    let row = idx / p.chunks;
    if (row >= p.rows) {
        return;
    }
    let start = (idx % p.chunks) * GREEDY_CHUNK;
    let end = min(start + GREEDY_CHUNK, p.vocab);
    let base = row * p.vocab;
    // The thread's indices rise, so a strictly larger key keeps the first of equal ones.
    var key = NO_KEY;
    var index = NO_INDEX;
    for (var j = start + lid; j < end; j = j + GREEDY_WG) {
        let k = key_of(x[base + j]);
        if (k > key) {
            key = k;
            index = j;
        }
    }
    let o = 2u * (idx * GREEDY_WG + lid);
    out[o] = key;
    out[o + 1u] = index;
}

// One workgroup per row: the best of the row's pairs from `greedy_chunks` (`chunk_best`).
@compute @workgroup_size(64)
fn greedy_pick(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    var key = NO_KEY;
    var index = NO_INDEX;
    let pairs = p.chunks * GREEDY_WG;
    for (var c = lid; c < pairs; c = c + GREEDY_WG) {
        let o = 2u * (row * pairs + c);
        if (greedy_beats(key, index, chunk_best[o], chunk_best[o + 1u])) {
            key = chunk_best[o];
            index = chunk_best[o + 1u];
        }
    }
    best_key[lid] = key;
    best_index[lid] = index;
    workgroupBarrier();
    for (var s = GREEDY_WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s && greedy_beats(best_key[lid], best_index[lid], best_key[lid + s], best_index[lid + s])) {
            best_key[lid] = best_key[lid + s];
            best_index[lid] = best_index[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[row] = select(best_index[0], 0u, best_key[0] == NO_KEY);
    }
}
