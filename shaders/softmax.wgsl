// Numerically stable softmax over the last axis, with an optional causal mask.
//
// `softmax_short` (rows of at most 256): one thread per row, 64 rows per workgroup, no
// workgroup memory and no barrier (lavapipe runs barriers slowly, and short rows leave most
// of a 256-thread workgroup idle). `softmax`: one workgroup of 256 threads per row: (1) the row max (NaN tracked separately, because
// WGSL's max() with NaN is implementation-defined), (2) the sum of exp(x - max), (3) the
// normalised values. Masked keys (causal) are written as exactly 0.
//
// Bindings: 0 = params, 1 = output, 2 = x [rows, cols].

struct Params {
    rows: u32,
    cols: u32,
    // Queries per attention matrix for the causal mask; 0 = no mask.
    causal_q: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

const WG: u32 = 256u;

// NaN test on the bits: `x != x` compiles to an ordered comparison (false for NaN) on some
// drivers, and WGSL lets implementations assume NaN never occurs in float comparisons.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

var<workgroup> red_f: array<f32, 256>;
var<workgroup> red_u: array<u32, 256>;

fn workgroup_max(lid: u32, v: f32) -> f32 {
    red_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            red_f[lid] = max(red_f[lid], red_f[lid + stride]);
        }
        workgroupBarrier();
    }
    let total = red_f[0];
    workgroupBarrier();
    return total;
}

fn workgroup_sum(lid: u32, v: f32) -> f32 {
    red_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            red_f[lid] = red_f[lid] + red_f[lid + stride];
        }
        workgroupBarrier();
    }
    let total = red_f[0];
    workgroupBarrier();
    return total;
}

fn workgroup_any(lid: u32, v: u32) -> u32 {
    red_u[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            red_u[lid] = red_u[lid] | red_u[lid + stride];
        }
        workgroupBarrier();
    }
    let total = red_u[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(256)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var visible = p.cols;
    if (p.causal_q > 0u) {
        visible = min(row % p.causal_q + p.cols - p.causal_q + 1u, p.cols);
    }

    // The lowest finite f32 is the identity of max here: -inf inputs give exp(-inf) = 0 below,
    // and a row of only -inf gives 0 / 0 = NaN, as in the reference.
    var m = -3.4028234663852886e38;
    var nan = 0u;
    for (var j = lid; j < visible; j = j + WG) {
        let v = x[base + j];
        if (is_nan(v)) {
            nan = 1u;
        } else {
            m = max(m, v);
        }
    }
    let row_max = workgroup_max(lid, m);
    let row_nan = workgroup_any(lid, nan);

    var s = 0.0;
    for (var j = lid; j < visible; j = j + WG) {
        s = s + exp(x[base + j] - row_max);
    }
    let inv = 1.0 / workgroup_sum(lid, s);

    // A quiet NaN, built from a runtime value so it is never a constant expression.
    let qnan = bitcast<f32>(0x7fc00000u | (row & 0u));
    for (var j = lid; j < p.cols; j = j + WG) {
        var y = 0.0;
        if (j < visible) {
            y = select(exp(x[base + j] - row_max) * inv, qnan, row_nan != 0u);
        }
        out[base + j] = y;
    }
}

@compute @workgroup_size(64)
fn softmax_short(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * nwg.x + wid.x) * 64u + lid;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var visible = p.cols;
    if (p.causal_q > 0u) {
        visible = min(row % p.causal_q + p.cols - p.causal_q + 1u, p.cols);
    }
    var m = -3.4028234663852886e38;
    var nan = false;
    for (var j = 0u; j < visible; j = j + 1u) {
        let v = x[base + j];
        if (is_nan(v)) {
            nan = true;
        } else {
            m = max(m, v);
        }
    }
    var s = 0.0;
    for (var j = 0u; j < visible; j = j + 1u) {
        s = s + exp(x[base + j] - m);
    }
    let inv = 1.0 / s;
    let qnan = bitcast<f32>(0x7fc00000u | (row & 0u));
    for (var j = 0u; j < p.cols; j = j + 1u) {
        var y = 0.0;
        if (j < visible) {
            y = select(exp(x[base + j] - m) * inv, qnan, nan);
        }
        out[base + j] = y;
    }
}
