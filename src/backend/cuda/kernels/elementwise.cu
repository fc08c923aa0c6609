// Elementwise ops and data movement: OpSpec::Unary, Binary, Embedding, Permute, Concat,
// Narrow. One thread per output element; f32 and u32 data move as 32-bit words.

__device__ __forceinline__ float wt_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

// op: 0 silu, 1 gelu (tanh), 2 gelu (erf), 3 scale by `factor`, 4 sigmoid, 5 soft-capping at
// `factor` (factor · tanh(x / factor)).
extern "C" __global__ void unary_f32(float* out, const float* x, u32 len, u32 op, float factor) {
    u64 i = wt_gid();
    if (i >= len) return;
    float v = x[i];
    float y;
    switch (op) {
        case 0: y = v * wt_sigmoid(v); break;
        case 1: {
            float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
            y = 0.5f * v * (1.0f + tanhf(inner));
            break;
        }
        case 2: y = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f)); break;
        case 4: y = wt_sigmoid(v); break;
        case 5: y = factor * tanhf(v / factor); break;
        default: y = v * factor; break;
    }
    out[i] = y;
}

// op: 0 add, 1 mul, 2 swiglu (silu(a)·b); b repeats every `rhs_len` elements.
extern "C" __global__ void binary_f32(float* out, const float* a, const float* b, u32 len,
                                      u32 rhs_len, u32 op) {
    u64 i = wt_gid();
    if (i >= len) return;
    float x = a[i], y = b[i % rhs_len];
    float r;
    switch (op) {
        case 0: r = x + y; break;
        case 1: r = x * y; break;
        default: r = x * wt_sigmoid(x) * y; break;
    }
    out[i] = r;
}

// out[i, :] = table[ids[i], :], or NaN for an id past the table.
extern "C" __global__ void embedding_f32(float* out, const float* table, const u32* ids,
                                         u32 vocab, u32 dim, u32 count) {
    u64 i = wt_gid();
    if (i >= (u64)dim * count) return;
    u64 row = i / dim, col = i % dim;
    u32 id = ids[row];
    out[i] = id < vocab ? table[(u64)id * dim + col] : WT_NAN;
}

// A permuted copy of 32-bit words: rank-6 output dims `d0..d5` (leading ones 1) and the
// input stride of each output axis `s0..s5`.
extern "C" __global__ void permute_u32(u32* out, const u32* x, u32 len, u32 d0, u32 d1, u32 d2,
                                       u32 d3, u32 d4, u32 d5, u32 s0, u32 s1, u32 s2, u32 s3,
                                       u32 s4, u32 s5) {
    u64 i = wt_gid();
    if (i >= len) return;
    u32 dims[6] = {d0, d1, d2, d3, d4, d5};
    u32 strides[6] = {s0, s1, s2, s3, s4, s5};
    u64 rem = i, src = 0;
    for (int d = 5; d >= 0; --d) {
        src += (rem % dims[d]) * (u64)strides[d];
        rem /= dims[d];
    }
    out[i] = x[src];
}

// Rows of `a` (width a_cols) each followed by the same row of `b` (width b_cols).
extern "C" __global__ void concat_u32(u32* out, const u32* a, const u32* b, u32 rows, u32 a_cols,
                                      u32 b_cols) {
    u64 i = wt_gid();
    u64 width = (u64)a_cols + b_cols;
    if (i >= rows * width) return;
    u64 r = i / width, c = i % width;
    out[i] = c < a_cols ? a[r * a_cols + c] : b[r * b_cols + (c - a_cols)];
}

// Columns start..start+len of each row of width `cols`.
extern "C" __global__ void narrow_u32(u32* out, const u32* x, u32 rows, u32 cols, u32 start,
                                      u32 len) {
    u64 i = wt_gid();
    if (i >= (u64)rows * len) return;
    u64 r = i / len, c = i % len;
    out[i] = x[r * cols + start + c];
}

// In place: row slots[i] of `target` [rows, cols] becomes row i of `src` [count, cols]; a slot
// past the target writes nothing. One thread per source element.
extern "C" __global__ void scatter_rows_u32(u32* target, const u32* src, const u32* slots,
                                            u32 rows, u32 cols, u32 count) {
    u64 i = wt_gid();
    if (i >= (u64)count * cols) return;
    u64 r = i / cols, c = i % cols;
    u32 slot = slots[r];
    if (slot < rows) target[(u64)slot * cols + c] = src[i];
}
