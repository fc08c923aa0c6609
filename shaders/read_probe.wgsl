// The read-bandwidth probe of `webtensor bench`: streams a buffer through the kernel shape the
// adapter's decode products use and writes one word per invocation (an XOR of everything it
// read, so that no compiler can drop the loads). The bench times it as the "read" ceiling next
// to the copy ceiling: a buffer copy is the driver's own memcpy on software adapters, which no
// shader can match there, while this is what a shader of ours can stream at best.
//
// Each invocation reads 4 · p.per_lane vec4s (16 bytes each) of `x`, which holds exactly
// invocations · 4 · p.per_lane of them (the host sizes the grid so):
// * read_runs — one lane streams four contiguous runs of its own (the `lanes` shape of the
//   software adapters, where a lane walks whole weight rows; four runs keep four loads in
//   flight, as four weight rows do);
// * read_coalesced — consecutive lanes read consecutive vec4s (the teams' shape on GPUs).
//
// Bindings: 0 = params, 1 = output (one u32 per invocation), 2 = x.

struct Params {
    per_lane: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<u32>>;

fn fold(v: vec4<u32>) -> u32 {
    return (v.x ^ v.y) ^ (v.z ^ v.w);
}

@compute @workgroup_size(64)
fn read_runs(@builtin(global_invocation_id) gid: vec3<u32>) {
    let run = p.per_lane;
    let b = gid.x * 4u * run;
    var s = vec4<u32>();
    for (var i = 0u; i < run; i = i + 1u) {
        s = s ^ (x[b + i] ^ x[b + run + i]) ^ (x[b + 2u * run + i] ^ x[b + 3u * run + i]);
    }
    out[gid.x] = fold(s);
}

@compute @workgroup_size(64)
fn read_coalesced(@builtin(global_invocation_id) gid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let total = nwg.x * 64u;
    var s = vec4<u32>();
    for (var i = 0u; i < 4u * p.per_lane; i = i + 1u) {
        s = s ^ x[gid.x + i * total];
    }
    out[gid.x] = fold(s);
}
