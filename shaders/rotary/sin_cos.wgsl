// sin and cos of a rotary angle, for `rope` (rope.wgsl) and the rotary epilogue of the decode
// products (shaders/quant/): one function, so both rotate by the same bits.
//
// Computed here rather than with WGSL's builtins, which only promise 2^-11 absolute error: a
// Cody–Waite reduction by π/2 (π/2 split into five 4-bit parts and a remainder, so every
// k·part is exact for k < 2^20, i.e. angles up to about 1.6e6) and Taylor polynomials on
// [-π/4, π/4]. Measured with f32 rounding at every step: under 1e-7 absolute error for angles
// up to 1e6.

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
