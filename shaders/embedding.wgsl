// Embedding gather: out[i, d] = table[ids[i], d], or NaN when ids[i] >= vocab.
//
// The table bound may be a window of rows first..first + rows of a table larger than one
// binding (src/backend/webgpu/kernels/split.rs): then only outputs whose ids fall in it are
// written, and the NaN of an id past the vocabulary by the window with first = 0.
//
// One thread per output element on a two-dimensional grid (linear workgroup index
// wid.y * num_workgroups.x + wid.x, 256 elements each).
//
// Bindings: 0 = params, 1 = output [count, dim], 2 = table [vocab, dim], 3 = ids u32 [count].

struct Params {
    vocab: u32,
    dim: u32,
    count: u32,
    first: u32,
    rows: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
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
    if (id >= p.vocab) {
        if (p.first == 0u) {
            // A quiet NaN, built from a runtime value so it is never a constant expression.
            out[i] = bitcast<f32>(0x7fc00000u | (id & 0u));
        }
    } else if (id >= p.first && id - p.first < p.rows) {
        out[i] = table[(id - p.first) * p.dim + d];
    }
}
