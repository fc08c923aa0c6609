// Row teams reduced through workgroup memory: the portable prelude of the shaders that
// compute dot products of weight rows (`matvec.wgsl`, `shaders/quant/`). It is prepended to them
// when the adapter has no subgroups, when WEBTENSOR_WGPU_SUBGROUPS=off, or when the runtime
// self-check demoted subgroups; its twin `subgroup.wgsl` defines the same entry with
// `subgroupAdd`.
//
// The including shader defines:
//   fn mv_first_row(wid, nwg) -> u32           first output row of the workgroup
//   fn mv_prepare(lid)                         work the whole workgroup does first (after
//       mv_first_row, from uniform control flow: it may hold barriers), such as rounding
//       the activations into workgroup memory
//   fn mv_partial(wid, row0, lane, lanes) -> array<vec4<f32>, 4>
//       this lane's partial sums for output rows row0..row0+4 (one vec4 each: up to four
//       activation rows), the lane striding over the rows' work by `lanes`; a team loads
//       the activations once for its four rows (zero when row0 is out of range)
//   fn mv_store(wid, row0, sums)               writes the rows' totals (checks the range)
//
// Here the 64 threads form 8 teams of 8 lanes, four output rows per team (MV_ROWS = 32 per
// workgroup); the lanes' partial sums meet in workgroup memory after one barrier (no tree:
// lane 0 adds its team's 8 values).

const MV_ROWS: u32 = 32u;

var<workgroup> mv_red: array<array<vec4<f32>, 4>, 64>;

@compute @workgroup_size(64)
fn mv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(local_invocation_index) lid: u32) {
    let lane = lid % 8u;
    let row0 = mv_first_row(wid, nwg) + 4u * (lid / 8u);
    mv_prepare(lid);
    mv_red[lid] = mv_partial(wid, row0, lane, 8u);
    workgroupBarrier();
    if (lane == 0u) {
        var s: array<vec4<f32>, 4>;
        for (var j = 0u; j < 4u; j = j + 1u) {
            s[j] = ((mv_red[lid][j] + mv_red[lid + 1u][j]) + (mv_red[lid + 2u][j] + mv_red[lid + 3u][j]))
                + ((mv_red[lid + 4u][j] + mv_red[lid + 5u][j]) + (mv_red[lid + 6u][j] + mv_red[lid + 7u][j]));
        }
        mv_store(wid, row0, s);
    }
}
