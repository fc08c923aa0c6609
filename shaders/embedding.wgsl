// Embedding gather: out[i, d] = table[ids[i], d], or NaN when ids[i] >= vocab.
//
// One thread per output element on a two-dimensional grid (linear workgroup index
// wid.y * num_workgroups.x + wid.x, 256 elements each).
//
// Bindings: 0 = params, 1 = output [count, dim], 2 = table [vocab, dim], 3 = ids u32 [count].

struct Params {
    vocab: u32,
    dim: u32,
    count: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> table: array<f32>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn embedding(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.count * p.dim) {
        return;
    }
    let row = i / p.dim;
    let d = i % p.dim;
    let id = ids[row];
    // A quiet NaN, built from a runtime value so it is never a constant expression.
    var v = bitcast<f32>(0x7fc00000u | (id & 0u));
    if (id < p.vocab) {
        v = table[id * p.dim + d];
    }
    out[i] = v;
}
