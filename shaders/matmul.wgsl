// Tiled matrix product: out[b] = a[b] · op(rhs[b]) for general m, n, k.
//
// Each workgroup of 16×16 threads computes a 64×64 tile of the output; thread (tx, ty)
// computes the 4×4 block of rows 4·ty.. and columns 4·tx... The k axis is walked in steps of
// 16: both operand tiles are staged in workgroup memory as vec4s (a as [16 k][16] vec4s of 4
// consecutive rows, rhs as [16 k][16] vec4s of 4 consecutive columns), so one k step of a
// thread is two vec4 loads from workgroup memory and four vec4 FMAs. Each thread stages one
// vec4 of each tile, reading along the operand's contiguous axis (consecutive threads read
// consecutive addresses), zero-filled outside the matrices, so any size works (1, 3, 255,
// 4097, k = 0).
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

var<workgroup> a_tile: array<array<vec4<f32>, 16>, 16>; // [kk][row / 4]
var<workgroup> b_tile: array<array<vec4<f32>, 16>, 16>; // [kk][col / 4]

// The thread's 4×4 accumulators: acc[i][j] is output (4·ty + i, 4·tx + j).
var<private> acc: array<vec4<f32>, 4>;

// One k step of the thread's 4×4 block, from the staged tiles.
fn fma_step(kk: u32, tx: u32, ty: u32) {
    let av = a_tile[kk][ty];
    let bv = b_tile[kk][tx];
    acc[0] = acc[0] + av.x * bv;
    acc[1] = acc[1] + av.y * bv;
    acc[2] = acc[2] + av.z * bv;
    acc[3] = acc[3] + av.w * bv;
}

// a[batch][r][kk], or 0 outside the matrix.
fn a_at(a_base: u32, r: u32, kk: u32) -> f32 {
    if (r < p.m && kk < p.k) {
        return a[a_base + r * p.k + kk];
    }
    return 0.0;
}

// op(rhs)[kk][c] of the batch's matrix, or 0 outside it.
fn rhs_at(r_base: u32, kk: u32, c: u32) -> f32 {
    if (c < p.n && kk < p.k) {
        if (p.rhs_transposed != 0u) {
            return rhs[r_base + c * p.k + kk];
        }
        return rhs[r_base + kk * p.n + c];
    }
    return 0.0;
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
    // The vec4 this thread stages: for a (and a transposed rhs) k step lid % 16 of rows
    // 4·(lid / 16)..; for a [k, n] rhs columns 4·(lid % 16).. of k step lid / 16.
    let kk_a = lid % TK;
    let q_a = lid / TK;
    let kk_b = select(lid / 16u, lid % TK, p.rhs_transposed != 0u);
    let q_b = select(lid % 16u, lid / TK, p.rhs_transposed != 0u);

    let k_tiles = (p.k + TK - 1u) / TK;
    for (var kt = 0u; kt < k_tiles; kt = kt + 1u) {
        let k0 = kt * TK;
        let r = row0 + 4u * q_a;
        let ka = k0 + kk_a;
        a_tile[kk_a][q_a] = vec4<f32>(a_at(a_base, r, ka), a_at(a_base, r + 1u, ka),
                                      a_at(a_base, r + 2u, ka), a_at(a_base, r + 3u, ka));
        let c = col0 + 4u * q_b;
        let kb = k0 + kk_b;
        b_tile[kk_b][q_b] = vec4<f32>(rhs_at(r_base, kb, c), rhs_at(r_base, kb, c + 1u),
                                      rhs_at(r_base, kb, c + 2u), rhs_at(r_base, kb, c + 3u));
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
        let gr = row0 + 4u * ty + i;
        if (gr < p.m) {
            let row = acc[i];
            for (var j = 0u; j < 4u; j = j + 1u) {
                let gc = col0 + 4u * tx + j;
                if (gc < p.n) {
                    out[(batch * p.m + gr) * p.n + gc] = row[j];
                }
            }
        }
    }
}
