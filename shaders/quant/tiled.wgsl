// The quantized-data module, part 5 of 5 (see common.wgsl): prefill tiles on GPUs.

// ---- prefill on GPUs: output tiles, each weight group decoded once per tile ----------------
//
// `mm_tiled` computes a 64 × 64 tile of out = act(x) · wᵀ per workgroup of 16 × 16 threads,
// thread (tx, ty) the 4 × 4 block of activation rows 4·ty.. and weight rows 4·tx... k is walked
// one group of 32 values at a time: 64 threads each decode one weight row's group (`mv_decode`,
// any format `mv` takes) into workgroup memory, every thread stages eight activation values
// (f32, or the int8 values of `quantize_acts_*` times their scale), and each thread then runs
// 32 steps of two vec4 loads from workgroup memory and four vec4 multiply-adds. The row-dot
// kernel `mv` decodes every weight once per four activation rows; here once per 64. The
// activations' rounding is the same as the reference's, but the int8 products are summed in
// f32 (each value times its scale) rather than exactly per group, so the result differs from
// the reference by f32 rounding only. The host picks it on GPUs (the row-team shapes) for
// prefill products without a folded norm, a KV store or the rotary epilogue; `finish` applies
// the residual or SiLU-gate epilogue as it stores.
//
// Grid: one workgroup per (row tile, column tile), flat over x and y (split in `mm_tiled`).

var<workgroup> mmt_x: array<array<vec4<f32>, 16>, 32>; // [kk][activation row / 4]
var<workgroup> mmt_w: array<array<vec4<f32>, 16>, 32>; // [kk][weight row / 4]

// The 4 × 4 accumulators of `mm_tiled`: mmt_acc[i][j] is (activation row 4·ty + i, weight
// row 4·tx + j) of the tile.
var<private> mmt_acc: array<vec4<f32>, 4>;

// Stages the weight rows' group g: thread `lid` < 64 decodes tile row `lid` (rows past n
// repeat the last; their outputs are not stored).
fn mmt_stage_weights(c0: u32, g: u32, lid: u32) {
    if (lid >= 64u) {
        return;
    }
    let w = mv_decode(min(c0 + lid, p.n - 1u), g);
    let q4 = lid / 4u;
    let c = lid % 4u;
    let vals = array<vec4<f32>, 8>(w.v0, w.v1, w.v2, w.v3, w.v4, w.v5, w.v6, w.v7);
    for (var t = 0u; t < 8u; t = t + 1u) {
        let v = vals[t] * w.scale;
        mmt_w[4u * t][q4][c] = v.x;
        mmt_w[4u * t + 1u][q4][c] = v.y;
        mmt_w[4u * t + 2u][q4][c] = v.z;
        mmt_w[4u * t + 3u][q4][c] = v.w;
    }
}

// Stages values 8·part..8·part + 8 of group g of activation row r0 + rl (zeros past m).
fn mmt_stage_acts(r0: u32, g: u32, rl: u32, part: u32) {
    let a = r0 + rl;
    var lo = vec4<f32>();
    var hi = vec4<f32>();
    if (a < p.m) {
        let k4 = p.k / 4u;
        // Word of the int8 values (or vec4 of the f32 ones) this thread starts at.
        let w = a * k4 + 8u * g + 2u * part;
        if ((MV_FORMAT & FMT_INT_ACTIVATIONS) != 0u) {
            // `quantize_acts_*`'s layout: row a's int8 words at a·k/4, then the scales
            // (`stored_act_scale`). k/4 is a multiple of 8, so both words are in one vec4.
            let words = bitcast<vec4<u32>>(xv[w / 4u]);
            let s = stored_act_scale(a, g);
            let o = w % 4u;
            lo = q8_vals(words[o]) * s;
            hi = q8_vals(words[o + 1u]) * s;
        } else {
            lo = xv[w];
            hi = xv[w + 1u];
        }
    }
    let q4 = rl / 4u;
    let c = rl % 4u;
    let vals = array<f32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    for (var t = 0u; t < 8u; t = t + 1u) {
        mmt_x[8u * part + t][q4][c] = vals[t];
    }
}

// One k step of the thread's 4 × 4 block.
fn mmt_step(kk: u32, tx: u32, ty: u32) {
    let av = mmt_x[kk][ty];
    let bv = mmt_w[kk][tx];
    mmt_acc[0] = mmt_acc[0] + av.x * bv;
    mmt_acc[1] = mmt_acc[1] + av.y * bv;
    mmt_acc[2] = mmt_acc[2] + av.z * bv;
    mmt_acc[3] = mmt_acc[3] + av.w * bv;
}

@compute @workgroup_size(16, 16)
fn mm_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) lid3: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let col_tiles = (p.n + 63u) / 64u;
    let idx = wid.y * nwg.x + wid.x;
    let r0 = 64u * (idx / col_tiles);
    let c0 = 64u * (idx % col_tiles);
    if (r0 >= p.m) {
        return;
    }
    let tx = lid3.x;
    let ty = lid3.y;
    for (var g = 0u; g < p.k / 32u; g = g + 1u) {
        mmt_stage_weights(c0, g, lid);
        mmt_stage_acts(r0, g, lid / 4u, lid % 4u);
        workgroupBarrier();
        // Four steps per iteration: lavapipe ends a shader's loops after 65,535 iterations
        // in all, so k / 32 · 9 of them leave room for k up to about 230,000.
        for (var kk = 0u; kk < 32u; kk = kk + 4u) {
            mmt_step(kk, tx, ty);
            mmt_step(kk + 1u, tx, ty);
            mmt_step(kk + 2u, tx, ty);
            mmt_step(kk + 3u, tx, ty);
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        let a = r0 + 4u * ty + i;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let c = c0 + 4u * tx + j;
            if (a < p.m && c < p.n) {
                let o = a * p.n + c;
                out[o] = bitcast<u32>(finish(o, mmt_acc[i][j]));
            }
        }
    }
}
