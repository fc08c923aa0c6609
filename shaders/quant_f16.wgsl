// Products with f16 weights on adapters that have SHADER_F16: the weight is bound as
// array<f16> and f16 activations are read as vec2<f16> from u32 words, with f32 accumulation.
// the quant module's `qmatmul_float` is the same computation for adapters without f16 (it unpacks
// halves with unpack2x16float); the backend picks one by the adapter's capability.
//
// Bindings: 0 = params, 1 = output f32 [m, n], 2 = w f16 [n, k], 3 = x (f32 words or f16 pairs).

enable f16;

struct Params {
    format: u32,
    m: u32,
    n: u32,
    k: u32,
    mode: u32,
    zero: u32,
    epilogue: u32,
    eps: f32,
    rope_dim: u32,
    store_dim: u32,
    pool_rows: u32,
    second_at: u32, // unused here (`shaders/quant/`: products over two weights)
    values_at: u32, // unused here (`shaders/quant/`: a paired KV store)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f16>;
@group(0) @binding(3) var<storage, read> x: array<u32>;

const WG: u32 = 64u;
const ROWS: u32 = 8u;

var<workgroup> partial: array<f32, 512>;

// f16 activations: the same binding seen as halves (only `qmatmul_f16_f16a` reads it; an
// entry point may use one of the two views).
@group(0) @binding(3) var<storage, read> x16: array<f16>;

// The workgroup's output column and first activation row; col = n when out of range.
fn tile_of(wid: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
    let idx = wid.y * nwg.x + wid.x;
    let row_blocks = (p.m + ROWS - 1u) / ROWS;
    if (idx >= p.n * row_blocks) {
        return vec2<u32>(p.n, 0u);
    }
    return vec2<u32>(idx % p.n, (idx / p.n) * ROWS);
}

// Sums each row's partials over the workgroup and writes the outputs.
fn finish(lid: u32, col: u32, r0: u32, acc: array<f32, 8>) {
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
        out[(r0 + lid) * p.n + col] = partial[lid * WG];
    }
}

// f16 weights, f32 activations. One workgroup per (weight row, ROWS activation rows).
@compute @workgroup_size(64)
fn qmatmul_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let tile = tile_of(wid, nwg);
    if (tile.x >= p.n) {
        return;
    }
    let rows = min(ROWS, p.m - tile.y);
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var i = lid; i < p.k; i = i + WG) {
        let wv = f32(w[tile.x * p.k + i]);
        for (var r = 0u; r < rows; r = r + 1u) {
            acc[r] = acc[r] + wv * bitcast<f32>(x[(tile.y + r) * p.k + i]);
        }
    }
    finish(lid, tile.x, tile.y, acc);
}

// f16 weights, f16 activations.
@compute @workgroup_size(64)
fn qmatmul_f16_f16a(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let tile = tile_of(wid, nwg);
    if (tile.x >= p.n) {
        return;
    }
    let rows = min(ROWS, p.m - tile.y);
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var i = lid; i < p.k; i = i + WG) {
        let wv = f32(w[tile.x * p.k + i]);
        for (var r = 0u; r < rows; r = r + 1u) {
            acc[r] = acc[r] + wv * f32(x16[(tile.y + r) * p.k + i]);
        }
    }
    finish(lid, tile.x, tile.y, acc);
}
