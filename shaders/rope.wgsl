// Rotary position embedding.
//
// One thread per rotated pair. The angle is one f32 multiply, f32(pos) * inv_freq[i], exactly
// as the reference computes it; inv_freq is a table uploaded by the host (spec.rs
// rope_inv_freq), so both sides use the same bits. sin and cos are computed here rather than
// with WGSL's builtins, which only promise 2^-11 absolute error: a Cody–Waite reduction by
// π/2 (π/2 split into five 4-bit parts and a remainder, so every k·part is exact for
// k < 2^20, i.e. angles up to about 1.6e6) and Taylor polynomials on [-π/4, π/4]. Measured
// with f32 rounding at every step: under 1e-7 absolute error for angles up to 1e6.
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

// (sin a, cos a).
fn sin_cos(a: f32) -> vec2<f32> {
    let k = round(a * 0.6366197723675814);
    var r = a - k * 1.5;
    r = r - k * 0.0703125;
    r = r - k * 0.000457763671875;
    r = r - k * 2.47955322265625e-05;
    r = r - k * 1.1920928955078125e-06;
    r = r - k * 7.549790126404332e-08;
    let u = r * r;
    // Taylor series; truncation error below 2e-9 on |r| <= π/4.
    var s = 2.755731922398589e-06;
    s = s * u - 0.0001984126984126984;
    s = s * u + 0.008333333333333333;
    s = s * u - 0.16666666666666666;
    s = r + r * u * s;
    var c = -2.755731922398589e-07;
    c = c * u + 2.48015873015873e-05;
    c = c * u - 0.001388888888888889;
    c = c * u + 0.041666666666666664;
    c = c * u - 0.5;
    c = c * u + 1.0;
    // Quadrant from k mod 4 (k may be negative; two's complement & 3 is the right residue).
    let q = u32(i32(k)) & 3u;
    var sc = vec2<f32>(s, c);
    if (q == 1u) {
        sc = vec2<f32>(c, -s);
    } else if (q == 2u) {
        sc = vec2<f32>(-s, -c);
    } else if (q == 3u) {
        sc = vec2<f32>(-c, s);
    }
    return sc;
}

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
