// Row normalisations: RMS norm and layer norm.
//
// One workgroup of 256 threads per row. Threads stride over the row (coalesced loads),
// accumulate in f32, and combine their partial sums with a tree reduction in workgroup
// memory. The row index is wid.y * num_workgroups.x + wid.x so more than 65535 rows fit.
// CPU adapters take `rms_norm_rows` instead (one lane per row, no barrier) where rows fit
// lavapipe's loop budget (kernels/rows.rs).
//
// Bindings: 0 = params, 1 = output, 2 = x [rows, cols], 3 = weight [cols], 4 = bias [cols].

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

const WG: u32 = 256u;

var<workgroup> partial: array<f32, 256>;

// Sums `v` over the workgroup; every thread gets the total.
fn workgroup_sum(lid: u32, v: f32) -> f32 {
    partial[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            partial[lid] = partial[lid] + partial[lid + stride];
        }
        workgroupBarrier();
    }
    let total = partial[0];
    // Everyone has read the total before the array is reused.
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var acc = 0.0;
    for (var j = lid; j < p.cols; j = j + WG) {
        let v = x[base + j];
        acc = acc + v * v;
    }
    let ms = workgroup_sum(lid, acc) / f32(p.cols);
    let inv = 1.0 / sqrt(ms + p.eps);
    for (var j = lid; j < p.cols; j = j + WG) {
        out[base + j] = x[base + j] * inv * weight[j];
    }
}

// RMS norm with one invocation per row, 64 rows per workgroup, no barrier: for CPU adapters
// (the software-adapter shape), which run a workgroup's lanes as SIMD registers and pay for
// each barrier by switching between them. There a 576-wide decode row took about 220 µs
// through the tree above on SwiftShader.
@compute @workgroup_size(64)
fn rms_norm_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * nwg.x + wid.x) * 64u + lid;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var acc = 0.0;
    for (var j = 0u; j < p.cols; j = j + 1u) {
        let v = x[base + j];
        acc = acc + v * v;
    }
    let inv = 1.0 / sqrt(acc / f32(p.cols) + p.eps);
    for (var j = 0u; j < p.cols; j = j + 1u) {
        out[base + j] = x[base + j] * inv * weight[j];
    }
}

@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    let n = f32(p.cols);
    // Statistics of the row shifted by its first element. When the mean is large against the
    // spread (as in real activations), x - shift is exact or nearly so, and the rounding
    // error of the mean is relative to the spread rather than to the mean itself; the output
    // uses (x - shift) - shifted_mean = x - mean.
    let shift = x[base];
    // Two passes (mean, then squared deviations) so the variance does not cancel.
    var acc = 0.0;
    for (var j = lid; j < p.cols; j = j + WG) {
        acc = acc + (x[base + j] - shift);
    }
    let mean = workgroup_sum(lid, acc) / n;
    var acc2 = 0.0;
    for (var j = lid; j < p.cols; j = j + WG) {
        let d = (x[base + j] - shift) - mean;
        acc2 = acc2 + d * d;
    }
    let variance = workgroup_sum(lid, acc2) / n;
    let inv = 1.0 / sqrt(variance + p.eps);
    for (var j = lid; j < p.cols; j = j + WG) {
        out[base + j] = ((x[base + j] - shift) - mean) * inv * weight[j] + bias[j];
    }
}
