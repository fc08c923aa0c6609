// Permute (transpose) into a contiguous copy, rank <= 6, for any 32-bit element type: the
// data is moved as u32 bits, so f32 and u32 tensors share this kernel.
//
// One thread per output element: its linear index is unravelled over the output shape, and
// each output coordinate steps the input by that axis's input stride (spec.rs
// permute_strides). Two-dimensional grid, 256 elements per workgroup.
//
// Bindings: 0 = params, 1 = output, 2 = x.

struct Params {
    len: u32,
    rank: u32,
    _pad0: u32,
    _pad1: u32,
    // Output dimensions, axis d at [d / 4][d % 4]; unused axes are 1.
    shape: array<vec4<u32>, 2>,
    // Input stride of each output axis.
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<u32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn permute(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.len) {
        return;
    }
    var rem = i;
    var src = 0u;
    for (var d = i32(p.rank) - 1; d >= 0; d = d - 1) {
        let du = u32(d);
        let dim = p.shape[du / 4u][du % 4u];
        src = src + (rem % dim) * p.strides[du / 4u][du % 4u];
        rem = rem / dim;
    }
    out[i] = x[src];
}
