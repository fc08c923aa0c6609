// Row teams reduced with `subgroupAdd`: the prelude chosen when the adapter has subgroups
// (see `workgroup.wgsl` for what the including shader defines). Each subgroup is a team: it
// takes the workgroup's output rows four at a time (all its lanes striding over the rows)
// and sums its lanes with subgroupAdd: no workgroup memory and no barrier.
//
// A subgroup wider than the workgroup (128 lanes on some mobile GPUs) holds all 64 threads,
// so the stride is min(subgroup_size, 64).
//
// No `enable subgroups;`: naga (wgpu 30) rejects that directive and takes the builtins as a
// native feature instead; the browser path never compiles this prelude (wgpu offers no
// subgroups on WebGPU yet).

// Output rows per workgroup: the backend writes four per subgroup of the adapter's size here
// (src/backend/webgpu/pipelines.rs, `reduce_prelude`), so that every subgroup has rows.
const MV_ROWS: u32 = 32u;

@compute @workgroup_size(64)
fn mv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) size: u32,
      @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) groups: u32,
      @builtin(local_invocation_index) lid: u32) {
    let first = mv_first_row(wid, nwg);
    mv_prepare(lid);
    let lanes = min(size, 64u);
    for (var t = 4u * sg; t < MV_ROWS; t = t + 4u * groups) {
        let part = mv_partial(wid, first + t, lane, lanes);
        var s: array<vec4<f32>, 4>;
        for (var j = 0u; j < 4u; j = j + 1u) {
            s[j] = subgroupAdd(part[j]);
        }
        if (lane == 0u) {
            mv_store(wid, first + t, s);
        }
    }
}
