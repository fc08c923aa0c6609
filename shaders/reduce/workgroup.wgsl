// Row teams reduced through workgroup memory: the portable prelude of the shaders that
// compute one dot product per output row (`matvec.wgsl`, `quant.wgsl`). It is prepended to
// them when the adapter has no subgroups, or when WEBTENSOR_WGPU_SUBGROUPS=off; its twin
// `subgroup.wgsl` defines the same entry point with `subgroupAdd`.
//
// The including shader defines:
//   fn mv_first_row(wid, nwg) -> u32           first output row of the workgroup
//   fn mv_partial(wid, row, lane, lanes) -> vec4<f32>
//       this lane's partial sums for output `row` and up to four activation rows, the lane
//       striding over the row's work by `lanes` (zero when `row` is out of range)
//   fn mv_store(wid, row, sums)                writes the row's totals (checks the range)
//
// Here the 64 threads form 8 teams of 8 lanes, one team per output row; the teams' partial
// sums meet in workgroup memory after one barrier (no tree: lane 0 adds its team's 8 values).

const MV_ROWS: u32 = 8u;

var<workgroup> mv_red: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn mv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(local_invocation_index) lid: u32) {
    let lane = lid % 8u;
    let row = mv_first_row(wid, nwg) + lid / 8u;
    mv_red[lid] = mv_partial(wid, row, lane, 8u);
    workgroupBarrier();
    if (lane == 0u) {
        let s = ((mv_red[lid] + mv_red[lid + 1u]) + (mv_red[lid + 2u] + mv_red[lid + 3u]))
            + ((mv_red[lid + 4u] + mv_red[lid + 5u]) + (mv_red[lid + 6u] + mv_red[lid + 7u]));
        mv_store(wid, row, s);
    }
}
