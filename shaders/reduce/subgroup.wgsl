// Row teams reduced with `subgroupAdd`: the prelude chosen when the adapter has subgroups
// (see `workgroup.wgsl` for what the including shader defines). Each subgroup takes the
// workgroup's output rows in turn (one row at a time, all its lanes striding over the row)
// and sums its lanes with one subgroupAdd: no workgroup memory and no barrier.
//
// A subgroup wider than the workgroup (128 lanes on some mobile GPUs) holds all 64 threads,
// so the stride is min(subgroup_size, 64).
//
// No `enable subgroups;`: naga (wgpu 30) rejects that directive and takes the builtins as a
// native feature instead; the browser path never compiles this prelude (wgpu offers no
// subgroups on WebGPU yet).

const MV_ROWS: u32 = 8u;

@compute @workgroup_size(64)
fn mv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) size: u32,
      @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) groups: u32) {
    let row0 = mv_first_row(wid, nwg);
    let lanes = min(size, 64u);
    for (var t = sg; t < MV_ROWS; t = t + groups) {
        let s = subgroupAdd(mv_partial(wid, row0 + t, lane, lanes));
        if (lane == 0u) {
            mv_store(wid, row0 + t, s);
        }
    }
}
