// Scans along the middle axis of an [outer, len, inner] view, as a three-phase parallel scan:
//
//   scan_reduce  one workgroup per (channel, chunk of 512 steps): the chunk's total by a
//                work-efficient tree (the up-sweep of a Blelloch scan) -> temp
//   scan_carry   one workgroup per channel: an exclusive scan of the chunk totals (each
//                thread folds a run of them, the workgroup scans the 512 run totals), starting
//                from the initial state -> temp now holds each chunk's carry-in
//   scan_apply   one workgroup per (channel, chunk): a Blelloch scan of the chunk from its
//                carry, and the output transform
//
// Scans of at most SERIAL_MAX steps (decode steps, short prompts) use `scan_serial` instead:
// one thread per channel.
//
// Every scan is an associative combine of vec2 states: an affine map x -> s.x * x + s.y for
// the linear scans and the log-space product (ln a summed as the map x -> x + ln a), and
// (max, sum) with value max + ln(sum) for log-sum-exp.
//
// Bindings: 0 = params, 1 = output (phases 1-2: the temp states, 2 floats per chunk),
// 2..4 = inputs: reduce (a|x, b|grad|x), carry (h0|any), apply (a|x, b|grad|x, temp).

struct Params {
    op: u32,       // 0 linear, 1 linear adjoint (reverse), 2 log cumprod, 3 logcumsumexp
    outer: u32,
    len: u32,
    inner: u32,
    chunks: u32,   // ceil(len / CHUNK)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> in0: array<f32>;
@group(0) @binding(3) var<storage, read> in1: array<f32>;
@group(0) @binding(4) var<storage, read> in2: array<f32>;

const WG: u32 = 256u;
const CHUNK: u32 = 512u;

var<workgroup> sx: array<f32, 512>;
var<workgroup> sy: array<f32, 512>;

// -inf from its bits at run time: Chrome's WGSL compiler (Tint) rejects a constant
// expression whose value is not a finite f32, so the bits go through a variable.
fn neg_inf() -> f32 {
    var bits = 0xff800000u;
    return bitcast<f32>(bits);
}

fn is_neg_inf(v: f32) -> bool {
    return bitcast<u32>(v) == 0xff800000u;
}

fn identity() -> vec2<f32> {
    if (p.op == 3u) {
        return vec2<f32>(neg_inf(), 0.0);
    }
    return vec2<f32>(1.0, 0.0);
}

// NaN by its bits (lavapipe compiles `x != x` to false).
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// `first` then `second`.
fn combine(first: vec2<f32>, second: vec2<f32>) -> vec2<f32> {
    if (p.op == 3u) {
        if (is_nan(first.x) || is_nan(second.x)) {
            return vec2<f32>(first.x + second.x, first.x + second.x);
        }
        if (is_neg_inf(first.x)) {
            return second;
        }
        if (is_neg_inf(second.x)) {
            return first;
        }
        // Scale only the smaller term: equal maxima (both +inf or both -inf included) add
        // their sums, where inf - inf would give NaN.
        if (first.x == second.x) {
            return vec2<f32>(first.x, first.y + second.y);
        }
        if (first.x > second.x) {
            return vec2<f32>(first.x, first.y + second.y * exp(second.x - first.x));
        }
        return vec2<f32>(second.x, first.y * exp(first.x - second.x) + second.y);
    }
    return vec2<f32>(first.x * second.x, second.x * first.y + second.y);
}

// Flat index of scan-order step `s` of channel `c` (the adjoint runs backwards).
fn index(c: u32, s: u32) -> u32 {
    var t = s;
    if (p.op == 1u) {
        t = p.len - 1u - s;
    }
    return ((c / p.inner) * p.len + t) * p.inner + c % p.inner;
}

// ln a, with the cases WGSL leaves undefined made explicit: NaN -> NaN, 0 -> -inf,
// negative -> NaN.
// Positive normal numbers take ln_normal: log_cumprod sums thousands of logarithms, and WGSL
// promises `log` only to an absolute 2^-21 near 1. Where a driver's error has one sign
// (NVIDIA's, about 3e-8 per term), it grows with the length of the scan.
fn ln(a: f32) -> f32 {
    if (is_nan(a)) {
        return a;
    }
    if (a == 0.0) {
        return neg_inf();
    }
    if (a < 0.0) {
        return bitcast<f32>(0x7fc00000u | (bitcast<u32>(a) & 0u));
    }
    let bits = bitcast<u32>(a);
    if (bits >= 0x00800000u && bits < 0x7f800000u) {
        return ln_normal(a);
    }
    return log(a);
}

// ln a for a positive normal a, to a few ulp on any driver: a = m·2^e with m in [√½, √2),
// ln m = 2·atanh(u) with u = (m − 1)/(m + 1), |u| < 0.172, by its series to u^11 (truncation
// below 1e-10), and e·ln 2 split so that e·LN2_HI is exact.
fn ln_normal(a: f32) -> f32 {
    let parts = frexp(a);
    var m = parts.fract;
    var e = f32(parts.exp);
    if (m < 0.70710678) {
        m = m * 2.0;
        e = e - 1.0;
    }
    let u = (m - 1.0) / (m + 1.0);
    let u2 = u * u;
    let series = 1.0 + u2 * (1.0 / 3.0 + u2 * (1.0 / 5.0 + u2 * (1.0 / 7.0 + u2 * (1.0 / 9.0
        + u2 * (1.0 / 11.0)))));
    const LN2_HI = 0.693145751953125;
    const LN2_LO = 1.4286068203094173e-6;
    return e * LN2_HI + (2.0 * u * series + e * LN2_LO);
}

fn element(c: u32, s: u32) -> vec2<f32> {
    if (s >= p.len) {
        return identity();
    }
    let at = index(c, s);
    switch p.op {
        case 0u: {
            return vec2<f32>(in0[at], in1[at]);
        }
        case 1u: {
            var a_next = 0.0;
            if (s > 0u) {
                a_next = in0[index(c, s - 1u)];
            }
            return vec2<f32>(a_next, in1[at]);
        }
        case 2u: {
            return vec2<f32>(1.0, ln(in0[at]));
        }
        default: {
            return vec2<f32>(in0[at], 1.0);
        }
    }
}

fn output(s: vec2<f32>) -> f32 {
    switch p.op {
        case 2u: {
            // WGSL leaves exp(NaN) undefined (SwiftShader gives inf): a negative factor's NaN
            // must come out as NaN.
            if (is_nan(s.y)) {
                return s.y;
            }
            return exp(s.y);
        }
        case 3u: {
            if (is_neg_inf(s.x)) {
                return neg_inf();
            }
            return s.x + log(s.y);
        }
        default: {
            return s.y;
        }
    }
}

fn shared_get(i: u32) -> vec2<f32> {
    return vec2<f32>(sx[i], sy[i]);
}

fn shared_set(i: u32, v: vec2<f32>) {
    sx[i] = v.x;
    sy[i] = v.y;
}

// Blelloch up-sweep over the 512 shared states; afterwards slot 511 holds the total.
fn up_sweep(lid: u32) {
    var offset = 1u;
    for (var d = CHUNK / 2u; d > 0u; d = d >> 1u) {
        workgroupBarrier();
        if (lid < d) {
            let left = offset * (2u * lid + 1u) - 1u;
            let right = offset * (2u * lid + 2u) - 1u;
            shared_set(right, combine(shared_get(left), shared_get(right)));
        }
        offset = offset << 1u;
    }
    workgroupBarrier();
}

// Blelloch down-sweep after `up_sweep`: slot i ends holding the combination of slots < i.
fn down_sweep(lid: u32) {
    if (lid == 0u) {
        shared_set(CHUNK - 1u, identity());
    }
    var offset = CHUNK;
    for (var d = 1u; d < CHUNK; d = d << 1u) {
        offset = offset >> 1u;
        workgroupBarrier();
        if (lid < d) {
            let left = offset * (2u * lid + 1u) - 1u;
            let right = offset * (2u * lid + 2u) - 1u;
            let left_total = shared_get(left);
            let before = shared_get(right);
            shared_set(left, before);
            shared_set(right, combine(before, left_total));
        }
    }
    workgroupBarrier();
}

// (channel, chunk) of this workgroup, or channel = channels when out of range.
fn chunk_of(wid: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
    let idx = wid.y * nwg.x + wid.x;
    let channels = p.outer * p.inner;
    if (idx >= channels * p.chunks) {
        return vec2<u32>(channels, 0u);
    }
    return vec2<u32>(idx / p.chunks, idx % p.chunks);
}

@compute @workgroup_size(256)
fn scan_reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let ck = chunk_of(wid, nwg);
    if (ck.x >= p.outer * p.inner) {
        return;
    }
    let first = ck.y * CHUNK;
    shared_set(2u * lid, element(ck.x, first + 2u * lid));
    shared_set(2u * lid + 1u, element(ck.x, first + 2u * lid + 1u));
    up_sweep(lid);
    if (lid == 0u) {
        let total = shared_get(CHUNK - 1u);
        let slot = 2u * (ck.x * p.chunks + ck.y);
        out[slot] = total.x;
        out[slot + 1u] = total.y;
    }
}

@compute @workgroup_size(256)
fn scan_carry(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let c = wid.y * nwg.x + wid.x;
    if (c >= p.outer * p.inner) {
        return;
    }
    // Each of the 512 slots folds a run of chunk totals.
    let run = (p.chunks + CHUNK - 1u) / CHUNK;
    for (var h = 0u; h < 2u; h = h + 1u) {
        let slot = 2u * lid + h;
        var acc = identity();
        for (var k = slot * run; k < min((slot + 1u) * run, p.chunks); k = k + 1u) {
            let at = 2u * (c * p.chunks + k);
            acc = combine(acc, vec2<f32>(out[at], out[at + 1u]));
        }
        shared_set(slot, acc);
    }
    up_sweep(lid);
    down_sweep(lid);
    var start = identity();
    if (p.op == 0u) {
        start = vec2<f32>(0.0, in0[c]);
    }
    for (var h = 0u; h < 2u; h = h + 1u) {
        let slot = 2u * lid + h;
        var carry = combine(start, shared_get(slot));
        for (var k = slot * run; k < min((slot + 1u) * run, p.chunks); k = k + 1u) {
            let at = 2u * (c * p.chunks + k);
            let total = vec2<f32>(out[at], out[at + 1u]);
            out[at] = carry.x;
            out[at + 1u] = carry.y;
            carry = combine(carry, total);
        }
    }
}

@compute @workgroup_size(256)
fn scan_apply(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let ck = chunk_of(wid, nwg);
    if (ck.x >= p.outer * p.inner) {
        return;
    }
    let first = ck.y * CHUNK;
    let e0 = element(ck.x, first + 2u * lid);
    let e1 = element(ck.x, first + 2u * lid + 1u);
    shared_set(2u * lid, e0);
    shared_set(2u * lid + 1u, e1);
    up_sweep(lid);
    down_sweep(lid);
    let slot = 2u * (ck.x * p.chunks + ck.y);
    let carry = vec2<f32>(in2[slot], in2[slot + 1u]);
    let before = combine(carry, shared_get(2u * lid));
    let s0 = first + 2u * lid;
    let v0 = combine(before, e0);
    if (s0 < p.len) {
        out[index(ck.x, s0)] = output(v0);
    }
    if (s0 + 1u < p.len) {
        out[index(ck.x, s0 + 1u)] = output(combine(v0, e1));
    }
}

// Short scans (a few dozen steps, e.g. one decode step): one thread per channel runs the steps
// in order, since a workgroup per 512-step chunk would be almost all padding.
// Inputs: a|x, b|grad|x, h0|x.
@compute @workgroup_size(256)
fn scan_serial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let c = (wid.y * nwg.x + wid.x) * WG + lid;
    if (c >= p.outer * p.inner) {
        return;
    }
    var carry = identity();
    if (p.op == 0u) {
        carry = vec2<f32>(0.0, in2[c]);
    }
    for (var s = 0u; s < p.len; s = s + 1u) {
        carry = combine(carry, element(c, s));
        out[index(c, s)] = output(carry);
    }
}

// grad_a[t] = g[t] * h[t - 1], h[-1] = h0. Inputs: g, h, h0. One thread per element.
@compute @workgroup_size(256)
fn scan_grad_a(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.outer * p.len * p.inner) {
        return;
    }
    let row = i / p.inner;
    let t = row % p.len;
    var prev = 0.0;
    if (t == 0u) {
        prev = in2[(row / p.len) * p.inner + i % p.inner];
    } else {
        prev = in1[i - p.inner];
    }
    out[i] = in0[i] * prev;
}

// grad_h0 = a[0] * g[0] per channel. Inputs: a, g.
@compute @workgroup_size(256)
fn scan_grad_init(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let c = (wid.y * nwg.x + wid.x) * WG + lid;
    if (c >= p.outer * p.inner) {
        return;
    }
    let at = (c / p.inner) * p.len * p.inner + c % p.inner;
    out[c] = in0[at] * in1[at];
}
