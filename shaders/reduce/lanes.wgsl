// One lane per four output rows, no reduction: the prelude for adapters that run shaders on
// CPU cores (lavapipe, SwiftShader). See `workgroup.wgsl` for what the including shader
// defines.
//
// A CPU adapter runs a subgroup's lanes as the lanes of one SIMD register. SwiftShader's JIT
// loads storage lane by lane (a branch, a scalar load and an insert each) unless the offset is
// a compile-time constant, so a team of lanes splitting k would save no loads; it would add a
// reduction, whose barriers each cost a switch between SIMD groups. Here every lane walks the
// whole of k for its own four rows: nothing is left to reduce, and the lanes do the same
// activation work in step. GPUs want the opposite shape (coalesced weight reads, more
// parallelism than rows/4 threads), which the team preludes give them.
//
// 16 lanes (64 rows) per workgroup: a CPU adapter spreads workgroups over its cores, and with
// 64 lanes a decode layer's 576-row products were three workgroups, one core idle for the
// third (SmolLM's shape on two cores); 16 lanes made the decode products 4-10% faster on
// SwiftShader and lavapipe. The int8 rounding of `mv_prepare`, written for 64 threads, never
// runs in this shape (`quantizes_in_kernel` in kernels/quant.rs).

const MV_ROWS: u32 = 64u;

@compute @workgroup_size(16)
fn mv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
      @builtin(local_invocation_index) lid: u32) {
    let row0 = mv_first_row(wid, nwg) + 4u * lid;
    mv_prepare(lid);
    mv_store(wid, row0, mv_partial(wid, row0, 0u, 1u));
}
