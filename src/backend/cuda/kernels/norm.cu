// Row reductions: OpSpec::RmsNorm, LayerNorm, Softmax (causal), Argmax; and Rope.
// One block per row; blockDim.x is a multiple of 32.

extern "C" __global__ void rms_norm_f32(float* out, const float* x, const float* w, u32 cols,
                                        float eps) {
    __shared__ float scratch[32];
    u64 base = (u64)blockIdx.x * cols;
    float ss = 0.0f;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[base + c];
        ss += v * v;
    }
    ss = wt_block_sum(ss, scratch);
    float inv = 1.0f / sqrtf(ss / (float)cols + eps);
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        out[base + c] = x[base + c] * inv * w[c];
    }
}

// Two passes (mean, then the variance around it) so the variance never cancels.
extern "C" __global__ void layer_norm_f32(float* out, const float* x, const float* w,
                                          const float* b, u32 cols, float eps) {
    __shared__ float scratch[32];
    u64 base = (u64)blockIdx.x * cols;
    float s = 0.0f;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) s += x[base + c];
    float mean = wt_block_sum(s, scratch) / (float)cols;
    float v = 0.0f;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        float d = x[base + c] - mean;
        v += d * d;
    }
    float var = wt_block_sum(v, scratch) / (float)cols;
    float inv = 1.0f / sqrtf(var + eps);
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        out[base + c] = (x[base + c] - mean) * inv * w[c] + b[c];
    }
}

// `causal_q` 0: plain softmax. Otherwise row r sees keys j <= r % q + cols - q and the masked
// entries are exactly 0.
extern "C" __global__ void softmax_f32(float* out, const float* x, u32 cols, u32 causal_q) {
    __shared__ float scratch[32];
    u64 base = (u64)blockIdx.x * cols;
    u32 visible = cols;
    if (causal_q != 0u) {
        u32 limit = blockIdx.x % causal_q + cols - causal_q + 1u;
        visible = limit < cols ? limit : cols;
    }
    float m = -__int_as_float(0x7f800000);
    for (u32 c = threadIdx.x; c < visible; c += blockDim.x) m = wt_max_nan(m, x[base + c]);
    m = wt_block_max(m, scratch);
    float s = 0.0f;
    for (u32 c = threadIdx.x; c < visible; c += blockDim.x) s += expf(x[base + c] - m);
    s = wt_block_sum(s, scratch);
    float inv = 1.0f / s;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        out[base + c] = c < visible ? expf(x[base + c] - m) * inv : 0.0f;
    }
}

// Whether candidate (v, i) beats (bv, bi) under argmax's rules: the first NaN wins, else the
// larger value, else the lower index.
__device__ __forceinline__ bool wt_argmax_better(float v, u32 i, float bv, u32 bi) {
    bool vn = wt_isnan(v), bn = wt_isnan(bv);
    if (vn || bn) return vn && (!bn || i < bi);
    if (v != bv) return v > bv;
    return i < bi;
}

extern "C" __global__ void argmax_f32(u32* out, const float* x, u32 cols) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    u64 base = (u64)blockIdx.x * cols;
    float bv = -__int_as_float(0x7f800000);
    u32 bi = 0xffffffffu;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[base + c];
        if (bi == 0xffffffffu || wt_argmax_better(v, c, bv, bi)) {
            bv = v;
            bi = c;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != 0xffffffffu && (bi == 0xffffffffu || wt_argmax_better(ov, oi, bv, bi))) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 warps = blockDim.x >> 5;
        for (u32 w = 1; w < warps; ++w) {
            if (si[w] != 0xffffffffu && (bi == 0xffffffffu || wt_argmax_better(sv[w], si[w], bv, bi))) {
                bv = sv[w];
                bi = si[w];
            }
        }
        out[blockIdx.x] = bi == 0xffffffffu ? 0u : bi;
    }
}

// One thread per (row, head, pair). The angle is one f32 product of the position and the
// shared frequency table; sin, cos and the rotation are evaluated in f64 like the reference.
// `interleaved` 0: pair (i, i + head_dim/2); 1: pair (2i, 2i + 1).
extern "C" __global__ void rope_f32(float* out, const float* x, const u32* positions,
                                    const float* inv_freq, u32 rows, u32 heads, u32 head_dim,
                                    u32 interleaved) {
    u32 half = head_dim / 2u;
    u64 t = wt_gid();
    if (t >= (u64)rows * heads * half) return;
    u32 i = (u32)(t % half);
    u64 rh = t / half;
    u64 row = rh / heads;
    u64 base = rh * head_dim;
    u32 i0 = interleaved ? 2u * i : i;
    u32 i1 = interleaved ? 2u * i + 1u : i + half;
    float angle = __fmul_rn((float)positions[row], inv_freq[i]);
    double s, c;
    sincos((double)angle, &s, &c);
    double x0 = (double)x[base + i0], x1 = (double)x[base + i1];
    out[base + i0] = (float)(x0 * c - x1 * s);
    out[base + i1] = (float)(x0 * s + x1 * c);
}
