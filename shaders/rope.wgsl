// Rotary position embedding.
//
// @prelude(rotary): compiled after shaders/rotary/sin_cos.wgsl, which defines `sin_cos`.
//
// One thread per rotated pair. The angle is one f32 multiply, f32(pos) * inv_freq[i], exactly
// as the reference computes it; inv_freq is a table uploaded by the host (spec.rs
// rope_inv_freq), so both sides use the same bits.
//
// Bindings: 0 = params, 1 = output, 2 = x [rows, heads, head_dim], 3 = positions u32 [rows],
// 4 = inv_freq [head_dim / 2].

struct Params {
    rows: u32,
    heads: u32,
    head_dim: u32,
    // 0: half-split pairs (i, i + head_dim/2); 1: interleaved pairs (2i, 2i + 1).
    interleaved: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;
@group(0) @binding(4) var<storage, read> inv_freq: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let half = p.head_dim / 2u;
    let pairs = p.rows * p.heads * half;
    let t = (wid.y * nwg.x + wid.x) * WG + lid;
    if (t >= pairs) {
        return;
    }
    let i = t % half;
    let head = t / half; // row * heads + h
    let row = head / p.heads;
    let base = head * p.head_dim;
    var i0 = i;
    var i1 = i + half;
    if (p.interleaved != 0u) {
        i0 = 2u * i;
        i1 = 2u * i + 1u;
    }
    let angle = f32(positions[row]) * inv_freq[i];
    let sc = sin_cos(angle);
    let x0 = x[base + i0];
    let x1 = x[base + i1];
    out[base + i0] = x0 * sc.y - x1 * sc.x;
    out[base + i1] = x0 * sc.x + x1 * sc.y;
}
