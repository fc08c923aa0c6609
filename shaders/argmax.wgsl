// Argmax over the last axis: the index of the largest value, the first one on ties, and the
// first NaN when the row has one (WGSL comparisons with NaN are false, and max() with NaN is
// implementation-defined, so NaN is tested on the bits).
//
// * argmax       — one workgroup of 256 threads per row; each thread scans a strided slice
//                  (its candidates come in increasing index order), then a tree reduction
//                  merges (value, index, is-NaN) triples.
// * argmax_short — one thread per row, for short rows (the host picks it for cols <= 32).
//
// Rows are indexed over a two-dimensional grid (wid.y * num_workgroups.x + wid.x) so more
// than 65535 rows fit. Bindings: 0 = params, 1 = output u32 [rows], 2 = x [rows, cols].

struct Params {
    rows: u32,
    cols: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

const WG: u32 = 256u;

// NaN test on the bits: `x != x` compiles to an ordered comparison (false for NaN) on some
// drivers, and WGSL lets implementations assume NaN never occurs in float comparisons.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}
// Index of a thread that saw no element.
const NONE: u32 = 0xffffffffu;

var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;
var<workgroup> best_nan: array<u32, 256>;

// Whether candidate (v2, i2, nan2) beats (v1, i1, nan1) under "first NaN, else first max".
fn beats(v1: f32, i1: u32, nan1: bool, v2: f32, i2: u32, nan2: bool) -> bool {
    if (i2 == NONE) {
        return false;
    }
    if (i1 == NONE) {
        return true;
    }
    if (nan1 || nan2) {
        return nan2 && (!nan1 || i2 < i1);
    }
    return v2 > v1 || (v2 == v1 && i2 < i1);
}

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var bv = 0.0;
    var bi = NONE;
    var bn = false;
    for (var j = lid; j < p.cols; j = j + WG) {
        let v = x[base + j];
        let nan_v = is_nan(v);
        if (beats(bv, bi, bn, v, j, nan_v)) {
            bv = v;
            bi = j;
            bn = nan_v;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    best_nan[lid] = select(0u, 1u, bn);
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            let o = lid + stride;
            if (beats(best_v[lid], best_i[lid], best_nan[lid] != 0u,
                      best_v[o], best_i[o], best_nan[o] != 0u)) {
                best_v[lid] = best_v[o];
                best_i[lid] = best_i[o];
                best_nan[lid] = best_nan[o];
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[row] = best_i[0];
    }
}

@compute @workgroup_size(256)
fn argmax_short(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * nwg.x + wid.x) * WG + lid;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var best = 0u;
    var bv = x[base];
    if (!is_nan(bv)) {
        for (var j = 1u; j < p.cols; j = j + 1u) {
            let v = x[base + j];
            if (is_nan(v)) {
                best = j;
                break;
            }
            if (v > bv) {
                bv = v;
                best = j;
            }
        }
    }
    out[row] = best;
}
