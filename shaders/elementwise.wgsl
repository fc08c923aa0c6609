// Elementwise ops: unary activations, scale, and binary ops with a repeating right operand.
//
// Binding convention of every webtensor shader: 0 = per-op parameters (uniform, dynamic
// offset), 1 = the output, 2.. = the inputs in OpSpec order.
//
// The grid is two-dimensional so that more than 65535 workgroups fit: the linear workgroup
// index is wid.y * num_workgroups.x + wid.x, and each workgroup covers 256 elements.

struct Params {
    len: u32,
    // Elements of the right operand (binary ops); b[i % rhs_len].
    rhs_len: u32,
    // The factor of `scale`.
    factor: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;

const WG: u32 = 256u;

// NaN test on the bits: `x != x` compiles to an ordered comparison (false for NaN) on some
// drivers, and WGSL lets implementations assume NaN never occurs in float comparisons.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn linear_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid;
}

// x / (1 + e^(-x)); for very negative x the denominator overflows to inf and the result is -0.
fn silu_f(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

// tanh from one exponential of a non-positive argument (never overflows). The argument is
// clamped to ±10 first (tanh(10) rounds to 1 in f32) because some drivers return NaN for
// the builtin tanh of large values.
fn tanh_f(z: f32) -> f32 {
    let c = clamp(z, -10.0, 10.0);
    let t = exp(-2.0 * abs(c));
    let r = (1.0 - t) / (1.0 + t);
    return select(r, -r, c < 0.0);
}

// Horner evaluation helpers for the erf pieces.
fn erf_small(a: f32) -> f32 {
    // erf(a) = a * P(a²) on [0, 1); least-squares Chebyshev fit, error 1.3e-9 before rounding.
    let u = a * a;
    var r = 7.875874871388078e-05;
    r = r * u - 0.000801686430349946;
    r = r * u + 0.005189087241888046;
    r = r * u - 0.02685421146452427;
    r = r * u + 0.11283594369888306;
    r = r * u - 0.3761262595653534;
    r = r * u + 1.1283791065216064;
    return a * r;
}

fn erf_mid(a: f32) -> f32 {
    // erf(a) on [1, 2.5) as a polynomial in t = a - 1.75; fit error 3.2e-9.
    let t = a - 1.75;
    var r = -0.00034371743095107377;
    r = r * t + 0.0008625054033473134;
    r = r * t + 0.0006756556686013937;
    r = r * t - 0.0060370382852852345;
    r = r * t + 0.008976282551884651;
    r = r * t + 0.006618595216423273;
    r = r * t - 0.04810353368520737;
    r = r * t + 0.0901578813791275;
    r = r * t - 0.09235620498657227;
    r = r * t + 0.052774980664253235;
    r = r * t + 0.9866716861724854;
    return r;
}

fn erf_high(a: f32) -> f32 {
    // erf(a) on [2.5, 4) as a polynomial in t = a - 3.25; fit error 6.4e-9.
    let t = a - 3.25;
    var r = -8.257184526883066e-05;
    r = r * t + 0.00019934722513426095;
    r = r * t - 0.00026340625481680036;
    r = r * t + 0.0003018923453055322;
    r = r * t - 0.00028657051734626293;
    r = r * t + 0.000197636938537471;
    r = r * t - 9.486456110607833e-05;
    r = r * t + 2.9112456104485318e-05;
    r = r * t + 0.9999957084655762;
    return r;
}

// erf in f32 with at most 1.4e-7 absolute error (measured with f32 rounding at every step):
// three polynomial pieces, and 1 beyond 4 (erfc(4) = 1.5e-8). WGSL has no erf builtin.
fn erf_f(x: f32) -> f32 {
    let a = abs(x);
    var r: f32;
    if (a < 1.0) {
        r = erf_small(a);
    } else if (a < 2.5) {
        r = erf_mid(a);
    } else if (a < 4.0) {
        r = erf_high(a);
    } else {
        r = 1.0;
    }
    // NaN fails every comparison above and lands in the last branch; keep it NaN.
    r = select(r, x, is_nan(x));
    return select(r, -r, x < 0.0);
}

@compute @workgroup_size(256)
fn silu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i < p.len) {
        out[i] = silu_f(a[i]);
    }
}

@compute @workgroup_size(256)
fn gelu_tanh(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i < p.len) {
        let x = a[i];
        let z = 0.7978845608028654 * (x + 0.044715 * x * x * x);
        out[i] = 0.5 * x * (1.0 + tanh_f(z));
    }
}

@compute @workgroup_size(256)
fn gelu_erf(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i < p.len) {
        let x = a[i];
        out[i] = 0.5 * x * (1.0 + erf_f(x * 0.7071067811865476));
    }
}

@compute @workgroup_size(256)
fn sigmoid(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i < p.len) {
        out[i] = 1.0 / (1.0 + exp(-a[i]));
    }
}

@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i < p.len) {
        out[i] = a[i] * p.factor;
    }
}

// `factor · tanh(x / factor)`; the argument is clamped to ±10 (where tanh is ±1 in f32) so
// that no implementation's exp-based tanh meets inf / inf, and a NaN, which clamp would turn
// into a bound, stays NaN.
@compute @workgroup_size(256)
fn softcap(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i < p.len) {
        let x = a[i];
        let capped = p.factor * tanh(clamp(x / p.factor, -10.0, 10.0));
        out[i] = select(capped, x, is_nan(x));
    }
}

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i < p.len) {
        out[i] = a[i] + b[i % p.rhs_len];
    }
}

@compute @workgroup_size(256)
fn mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i < p.len) {
        out[i] = a[i] * b[i % p.rhs_len];
    }
}

@compute @workgroup_size(256)
fn swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wid, nwg, lid);
    if (i < p.len) {
        out[i] = silu_f(a[i]) * b[i % p.rhs_len];
    }
}
