// Matrix-vector products for small m (decode: m = 1..4 rows per batch), and on CPU adapters
// `mv` for any m, four rows of a at a time.
//
// The tiled kernel would waste 60 of its 64 tile rows here, so these kernels spread the k axis
// over threads instead and read each rhs element once for all m rows.
//
// @prelude(reduce): compiled after one of shaders/reduce/*.wgsl, which defines the entry `mv`.
//
// * mv — rhs stored [n, k] (a linear layer's weight), k % 4 == 0: a team of lanes per four
//   output columns reads their rows as vec4s (each vec4 of a loaded once for the four) and
//   the prelude reduces the team (subgroupAdd, or one barrier through workgroup memory).
// * matvec_t_scalar — the same for any k: a workgroup of 64×4 threads computes 4 output
//   columns; the 64 threads of one column stride over its k elements, then a tree reduction
//   in workgroup memory combines their partial sums.
// * matvec_kn / matvec_kn_vec4 — rhs stored [k, n]: each thread owns one column (four with
//   vec4 loads when n % 4 == 0); the 4 thread rows of a workgroup split k into interleaved
//   slices and are summed at the end. Consecutive threads read consecutive columns.
//
// The operands are bound as arrays of vec4 (every webtensor buffer is a multiple of 16 bytes);
// the scalar paths read element e as v[e / 4][e % 4].
//
// Loop budget: Mesa's llvmpipe/lavapipe silently ends loops once a shader invocation has run
// 65535 loop iterations in total, so the up-to-4 rows are unrolled (guarded by m) rather than
// looped over inside the k loop: one iteration per k step, which allows k up to 16M (matvec_t_scalar)
// or 1M (matvec_kn, four k steps per iteration) there.
//
// Grid: x = column groups (plus col_group0 when the host splits the grid), y = batch (plus
// batch0). Bindings: 0 = params, 1 = output [batch, m, n], 2 = a [batch, m, k], 3 = rhs.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // Elements between consecutive rhs matrices: n·k, or 0 when one rhs is shared.
    rhs_stride: u32,
    col_group0: u32,
    batch0: u32,
    // `mv` only: chunks of four rows of a per batch (grid y runs over batch · chunks + chunk,
    // so on CPU adapters a product of any m is a row of four-row matvecs); 1 elsewhere.
    chunks: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> rhs: array<vec4<f32>>;

var<workgroup> red: array<f32, 256>;
var<workgroup> red4: array<vec4<f32>, 256>;

fn a_at(e: u32) -> f32 {
    return a[e >> 2u][e & 3u];
}

fn rhs_at(e: u32) -> f32 {
    return rhs[e >> 2u][e & 3u];
}

// Per-thread partial sums of the up to four rows of a.
var<private> acc: vec4<f32>;

// Sums `v` over the 64 threads of row y of the workgroup; the total is valid in thread x = 0.
// Called by all threads.
fn sum_64(x: u32, y: u32, v: f32) -> f32 {
    red[y * 64u + x] = v;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride = stride / 2u) {
        if (x < stride) {
            red[y * 64u + x] = red[y * 64u + x] + red[y * 64u + x + stride];
        }
        workgroupBarrier();
    }
    let total = red[y * 64u];
    workgroupBarrier();
    return total;
}

// Writes the thread's accumulators for rows 0..m of column `col` (thread x = 0 only), after
// summing them over the 64 threads that share the column.
fn finish_t(x: u32, y: u32, col: u32, batch: u32) {
    for (var mi = 0u; mi < p.m; mi = mi + 1u) {
        let s = sum_64(x, y, acc[mi]);
        if (x == 0u && col < p.n) {
            out[(batch * p.m + mi) * p.n + col] = s;
        }
    }
}

// ---- mv: rhs [n, k] with k % 4 == 0, through the row-team prelude (shaders/reduce/) ----
// Each team of lanes owns four output columns (rows of rhs); its lanes stride over the rows'
// vec4s and the prelude sums the lanes. The workgroup covers MV_ROWS columns; grid x =
// column groups, y = (batch, chunk of four rows of a) as batch · chunks + chunk.

// The batch, first row of a and number of rows (1 to 4) of the workgroup's chunk.
fn mv_chunk(wid: vec3<u32>) -> vec3<u32> {
    let slot = wid.y + p.batch0;
    let r0 = 4u * (slot % p.chunks);
    return vec3<u32>(slot / p.chunks, r0, min(4u, p.m - r0));
}

fn mv_first_row(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.x + p.col_group0) * MV_ROWS;
}

// Nothing to prepare: the f32 operands are read as they are.
fn mv_prepare(lid: u32) {}

// Partial sums of columns col0..col0+4 (rhs rows; those past n repeat the last one and
// `mv_store` drops them) against the up to four rows of a: each a vec4 is loaded once for
// the four columns. The sums live in four vec4 locals, not an array: SwiftShader keeps a
// local array in memory per lane, which made this loop 2.5 times slower there.
fn mv_partial(wid: vec3<u32>, col0: u32, lane: u32, lanes: u32) -> array<vec4<f32>, 4> {
    var s0 = vec4<f32>();
    var s1 = vec4<f32>();
    var s2 = vec4<f32>();
    var s3 = vec4<f32>();
    if (col0 >= p.n) {
        return array<vec4<f32>, 4>(s0, s1, s2, s3);
    }
    let chunk = mv_chunk(wid);
    let batch = chunk.x;
    let k4 = p.k / 4u;
    let last = p.n - 1u;
    let base = batch * p.rhs_stride / 4u;
    let w0 = base + col0 * k4;
    let w1 = base + min(col0 + 1u, last) * k4;
    let w2 = base + min(col0 + 2u, last) * k4;
    let w3 = base + min(col0 + 3u, last) * k4;
    let a0 = (batch * p.m + chunk.y) * k4;
    let m = chunk.z;
    if (m == 1u) {
        // Decode: one activation row, no per-step row checks.
        for (var q = lane; q < k4; q = q + lanes) {
            let x = a[a0 + q];
            s0.x = s0.x + dot(x, rhs[w0 + q]);
            s1.x = s1.x + dot(x, rhs[w1 + q]);
            s2.x = s2.x + dot(x, rhs[w2 + q]);
            s3.x = s3.x + dot(x, rhs[w3 + q]);
        }
        return array<vec4<f32>, 4>(s0, s1, s2, s3);
    }
    for (var q = lane; q < k4; q = q + lanes) {
        let r0 = rhs[w0 + q];
        let r1 = rhs[w1 + q];
        let r2 = rhs[w2 + q];
        let r3 = rhs[w3 + q];
        let x = a[a0 + q];
        s0.x = s0.x + dot(x, r0);
        s1.x = s1.x + dot(x, r1);
        s2.x = s2.x + dot(x, r2);
        s3.x = s3.x + dot(x, r3);
        let y = a[a0 + k4 + q];
        s0.y = s0.y + dot(y, r0);
        s1.y = s1.y + dot(y, r1);
        s2.y = s2.y + dot(y, r2);
        s3.y = s3.y + dot(y, r3);
        if (m > 2u) {
            let z = a[a0 + 2u * k4 + q];
            s0.z = s0.z + dot(z, r0);
            s1.z = s1.z + dot(z, r1);
            s2.z = s2.z + dot(z, r2);
            s3.z = s3.z + dot(z, r3);
        }
        if (m > 3u) {
            let v = a[a0 + 3u * k4 + q];
            s0.w = s0.w + dot(v, r0);
            s1.w = s1.w + dot(v, r1);
            s2.w = s2.w + dot(v, r2);
            s3.w = s3.w + dot(v, r3);
        }
    }
    return array<vec4<f32>, 4>(s0, s1, s2, s3);
}

fn mv_store(wid: vec3<u32>, col0: u32, s: array<vec4<f32>, 4>) {
    let chunk = mv_chunk(wid);
    for (var j = 0u; j < 4u; j = j + 1u) {
        let col = col0 + j;
        if (col < p.n) {
            for (var mi = 0u; mi < chunk.z; mi = mi + 1u) {
                out[(chunk.x * p.m + chunk.y + mi) * p.n + col] = s[j][mi];
            }
        }
    }
}

@compute @workgroup_size(64, 4)
fn matvec_t_scalar(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let x = lid.x;
    let y = lid.y;
    let col = (wid.x + p.col_group0) * 4u + y;
    let batch = wid.y + p.batch0;
    if (col < p.n) {
        let w_base = batch * p.rhs_stride + col * p.k;
        let a0 = batch * p.m * p.k;
        let m = p.m;
        let k = p.k;
        for (var q = x; q < k; q = q + 64u) {
            let w = rhs_at(w_base + q);
            acc.x = acc.x + a_at(a0 + q) * w;
            if (m > 1u) {
                acc.y = acc.y + a_at(a0 + k + q) * w;
            }
            if (m > 2u) {
                acc.z = acc.z + a_at(a0 + 2u * k + q) * w;
            }
            if (m > 3u) {
                acc.w = acc.w + a_at(a0 + 3u * k + q) * w;
            }
        }
    }
    finish_t(x, y, col, batch);
}

// One k step q of matvec_kn for the thread's column (r_base = its first rhs element).
fn kn_step(a0: u32, r_base: u32, q: u32, m: u32, k: u32) {
    if (q < k) {
        let w = rhs_at(r_base + q * p.n);
        acc.x = acc.x + a_at(a0 + q) * w;
        if (m > 1u) {
            acc.y = acc.y + a_at(a0 + k + q) * w;
        }
        if (m > 2u) {
            acc.z = acc.z + a_at(a0 + 2u * k + q) * w;
        }
        if (m > 3u) {
            acc.w = acc.w + a_at(a0 + 3u * k + q) * w;
        }
    }
}

@compute @workgroup_size(64, 4)
fn matvec_kn(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let x = lid.x;
    let y = lid.y;
    let col = (wid.x + p.col_group0) * 64u + x;
    let batch = wid.y + p.batch0;
    if (col < p.n) {
        let r_base = batch * p.rhs_stride + col;
        let a0 = batch * p.m * p.k;
        let m = p.m;
        let k = p.k;
        // Four k steps per iteration (k = q, q + 4, q + 8, q + 12): fewer loop iterations.
        for (var q0 = y; q0 < k; q0 = q0 + 16u) {
            kn_step(a0, r_base, q0, m, k);
            kn_step(a0, r_base, q0 + 4u, m, k);
            kn_step(a0, r_base, q0 + 8u, m, k);
            kn_step(a0, r_base, q0 + 12u, m, k);
        }
    }
    for (var mi = 0u; mi < p.m; mi = mi + 1u) {
        red[y * 64u + x] = acc[mi];
        workgroupBarrier();
        if (y == 0u && col < p.n) {
            let s = (red[x] + red[64u + x]) + (red[128u + x] + red[192u + x]);
            out[(batch * p.m + mi) * p.n + col] = s;
        }
        workgroupBarrier();
    }
}

// Per-thread partial sums of four columns for each of the up to four rows of a.
var<private> acc4: array<vec4<f32>, 4>;

// One k step q of matvec_kn_vec4 for the thread's four columns (r_base in vec4 units).
fn kn4_step(a0: u32, r_base: u32, n4: u32, q: u32, m: u32, k: u32) {
    if (q < k) {
        let w = rhs[r_base + q * n4];
        acc4[0] = acc4[0] + a_at(a0 + q) * w;
        if (m > 1u) {
            acc4[1] = acc4[1] + a_at(a0 + k + q) * w;
        }
        if (m > 2u) {
            acc4[2] = acc4[2] + a_at(a0 + 2u * k + q) * w;
        }
        if (m > 3u) {
            acc4[3] = acc4[3] + a_at(a0 + 3u * k + q) * w;
        }
    }
}

@compute @workgroup_size(64, 4)
fn matvec_kn_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let x = lid.x;
    let y = lid.y;
    // Four consecutive columns per thread.
    let col4 = (wid.x + p.col_group0) * 64u + x;
    let n4 = p.n / 4u;
    let batch = wid.y + p.batch0;
    if (col4 < n4) {
        let r_base = batch * p.rhs_stride / 4u + col4;
        let a0 = batch * p.m * p.k;
        let m = p.m;
        let k = p.k;
        for (var q0 = y; q0 < k; q0 = q0 + 16u) {
            kn4_step(a0, r_base, n4, q0, m, k);
            kn4_step(a0, r_base, n4, q0 + 4u, m, k);
            kn4_step(a0, r_base, n4, q0 + 8u, m, k);
            kn4_step(a0, r_base, n4, q0 + 12u, m, k);
        }
    }
    for (var mi = 0u; mi < p.m; mi = mi + 1u) {
        red4[y * 64u + x] = acc4[mi];
        workgroupBarrier();
        if (y == 0u && col4 < n4) {
            let s = (red4[x] + red4[64u + x]) + (red4[128u + x] + red4[192u + x]);
            let o = (batch * p.m + mi) * p.n + col4 * 4u;
            out[o] = s.x;
            out[o + 1u] = s.y;
            out[o + 2u] = s.z;
            out[o + 3u] = s.w;
        }
        workgroupBarrier();
    }
}
