// Concatenation along an axis, seen as rows: out[r] = a[r] ++ b[r], as 32-bit words; and its
// inverse, narrow: out[r] = a[r][start .. start + width].
//
// One thread per output element on a two-dimensional grid (linear workgroup index
// wid.y * num_workgroups.x + wid.x, 256 elements each).
//
// Bindings: 0 = params, 1 = output [rows, a_cols + b_cols], 2 = a [rows, a_cols],
// 3 = b [rows, b_cols].

// concat: (len, a_cols, b_cols, -); narrow: (len, cols, start, width).
struct Params {
    len: u32,
    a_cols: u32,
    b_cols: u32,
    width: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn concat(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.len) {
        return;
    }
    let width = p.a_cols + p.b_cols;
    let row = i / width;
    let col = i % width;
    if (col < p.a_cols) {
        out[i] = a[row * p.a_cols + col];
    } else {
        out[i] = b[row * p.b_cols + col - p.a_cols];
    }
}

@compute @workgroup_size(256)
fn narrow(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.len) {
        return;
    }
    let row = i / p.width;
    out[i] = a[row * p.a_cols + p.b_cols + i % p.width];
}

// scatter_rows, in place: params (len = count · cols, cols, rows of the target, -);
// bindings 1 = the target [rows, cols] (read-write), 2 = src [count, cols], 3 = slots u32
// [count]. Row slots[r] of the target becomes row r of src; a slot >= rows writes nothing.
@compute @workgroup_size(256)
fn scatter_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.len) {
        return;
    }
    let cols = p.a_cols;
    let slot = b[i / cols];
    if (slot < p.b_cols) {
        out[slot * cols + i % cols] = a[i];
    }
}
