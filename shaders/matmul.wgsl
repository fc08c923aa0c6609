// Tiled matrix product: out[b] = a[b] · op(rhs[b]) for general m, n, k.
//
// Each workgroup of 16×16 threads computes a 64×64 tile of the output; each thread computes a
// 4×4 block of it (rows ty + 16·i, columns tx + 16·j, so neighbouring threads store
// neighbouring columns). The k axis is walked in steps of 16: both operand tiles are staged in
// workgroup memory (a as [16][64] k-major, rhs as [16][64]), loaded by all 256 threads with
// consecutive threads reading consecutive addresses, and zero-filled outside the matrices, so
// any size works (1, 3, 255, 4097, k = 0).
//
// Loop budget: Mesa's llvmpipe/lavapipe silently ends loops once a shader invocation has run
// 65535 loop iterations in total (all loops together). The 16 steps of a k tile are therefore
// unrolled by hand, so a k tile costs one iteration and k up to about 1M works there.
//
// Grid: x = column tiles, y = row tiles, z = batch; the host splits grids larger than the
// device's workgroups-per-dimension limit into several dispatches with tile offsets.
//
// Bindings: 0 = params, 1 = output [batch, m, n], 2 = a [batch, m, k], 3 = rhs
// ([n, k] when transposed, else [k, n]; one matrix per batch or one shared).

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // 1: rhs is [n, k] (a · rhsᵀ); 0: rhs is [k, n].
    rhs_transposed: u32,
    // Elements between consecutive rhs matrices: n·k, or 0 when one rhs is shared.
    rhs_stride: u32,
    // Added to workgroup_id so one logical grid can be split into several dispatches.
    tile_x0: u32,
    tile_y0: u32,
    batch0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> rhs: array<f32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> a_tile: array<array<f32, 64>, 16>; // [kk][row]
var<workgroup> b_tile: array<array<f32, 64>, 16>; // [kk][col]

// The thread's 4×4 accumulators: acc[i][j] is output (ty + 16·i, tx + 16·j).
var<private> acc: array<vec4<f32>, 4>;

// One k step of the thread's 4×4 block, from the staged tiles.
fn fma_step(kk: u32, tx: u32, ty: u32) {
    let av = vec4<f32>(a_tile[kk][ty], a_tile[kk][ty + 16u], a_tile[kk][ty + 32u], a_tile[kk][ty + 48u]);
    let bv = vec4<f32>(b_tile[kk][tx], b_tile[kk][tx + 16u], b_tile[kk][tx + 32u], b_tile[kk][tx + 48u]);
    acc[0] = acc[0] + av.x * bv;
    acc[1] = acc[1] + av.y * bv;
    acc[2] = acc[2] + av.z * bv;
    acc[3] = acc[3] + av.w * bv;
}

@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let tx = lid3.x;
    let ty = lid3.y;
    let batch = wid.z + p.batch0;
    let row0 = (wid.y + p.tile_y0) * TM;
    let col0 = (wid.x + p.tile_x0) * TN;
    let a_base = batch * p.m * p.k;
    let r_base = batch * p.rhs_stride;

    let k_tiles = (p.k + TK - 1u) / TK;
    for (var kt = 0u; kt < k_tiles; kt = kt + 1u) {
        let k0 = kt * TK;
        // a tile: 64 rows × 16 k; idx → (row = idx / 16, kk = idx % 16), contiguous in kk.
        for (var e = 0u; e < 4u; e = e + 1u) {
            let idx = lid + e * 256u;
            let r = idx / TK;
            let kk = idx % TK;
            let gr = row0 + r;
            let gk = k0 + kk;
            var v = 0.0;
            if (gr < p.m && gk < p.k) {
                v = a[a_base + gr * p.k + gk];
            }
            a_tile[kk][r] = v;
        }
        // rhs tile: 16 k × 64 columns, read along the contiguous axis of its layout.
        for (var e = 0u; e < 4u; e = e + 1u) {
            let idx = lid + e * 256u;
            var kk: u32;
            var c: u32;
            if (p.rhs_transposed != 0u) {
                c = idx / TK;
                kk = idx % TK;
            } else {
                kk = idx / TN;
                c = idx % TN;
            }
            let gc = col0 + c;
            let gk = k0 + kk;
            var v = 0.0;
            if (gc < p.n && gk < p.k) {
                if (p.rhs_transposed != 0u) {
                    v = rhs[r_base + gc * p.k + gk];
                } else {
                    v = rhs[r_base + gk * p.n + gc];
                }
            }
            b_tile[kk][c] = v;
        }
        workgroupBarrier();
        // Unrolled by hand: see the note on loop budgets at the top.
        fma_step(0u, tx, ty);
        fma_step(1u, tx, ty);
        fma_step(2u, tx, ty);
        fma_step(3u, tx, ty);
        fma_step(4u, tx, ty);
        fma_step(5u, tx, ty);
        fma_step(6u, tx, ty);
        fma_step(7u, tx, ty);
        fma_step(8u, tx, ty);
        fma_step(9u, tx, ty);
        fma_step(10u, tx, ty);
        fma_step(11u, tx, ty);
        fma_step(12u, tx, ty);
        fma_step(13u, tx, ty);
        fma_step(14u, tx, ty);
        fma_step(15u, tx, ty);
        workgroupBarrier();
    }

    for (var i = 0u; i < 4u; i = i + 1u) {
        let gr = row0 + ty + 16u * i;
        if (gr < p.m) {
            let row = acc[i];
            for (var j = 0u; j < 4u; j = j + 1u) {
                let gc = col0 + tx + 16u * j;
                if (gc < p.n) {
                    out[(batch * p.m + gr) * p.n + gc] = row[j];
                }
            }
        }
    }
}
