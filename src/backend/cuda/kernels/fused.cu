// The fused decode ops: OpSpec::NormLinear, NormLinearInto, SwigluLinear, LinearResidual
// (the products, `fused_linear_*`) and PagedAttention (`paged_attention`).
//
// A product's activations are prepared once per block: RMS-normed (in f64 as the reference
// norms, so the normed values are the reference's f32 values) and, for the integer modes,
// rounded to int8 with a scale per 32 values (Q8_0), per 256 values (llama.cpp's Q8_K, kept
// once per 32 values) or per row (I8). The block keeps them in
// shared memory where they fit (m · k at most WT_FUSED_F32_ACTS f32 values or
// WT_FUSED_INT_ACTS int8 values: a decode step's rows); larger ones are prepared by
// `fused_prepare` into a scratch buffer the product reads (`WT_FUSED_PREPARED`). Then each
// warp computes one output unit (a weight row; a rope pair's two rows; gate's and up's row
// of one column) for up to WT_FUSED_ROWS activation rows, as `qmatmul` does, and applies
// the epilogue. Integer activations against Q4_0 and Q8_0 weights multiply in integers, 32
// values per block scale pair; llama.cpp's other formats are decoded 32 values at a time
// (decode.cu) and the ternary ones value by value.

// Activation modes, as `qmatmul_act`'s: f32, int8 per block of 32 values, int8 per row,
// llama.cpp's Q8_K per 256 values (its scale repeated for each 32 values).
#define WT_ACT_F32 0u
#define WT_ACT_Q8_0 2u
#define WT_ACT_I8 3u
#define WT_ACT_Q8_K 4u

// Epilogues: store y; add the residual; silu(gate) · up; rotate pairs (rope) and store.
#define WT_EPI_STORE 0u
#define WT_EPI_RESIDUAL 1u
#define WT_EPI_SWIGLU 2u
#define WT_EPI_ROPE 3u

// Flags: store into KV pool rows through `slots`; RMS-norm the activations first; rope pairs
// are (2i, 2i + 1) rather than (i, i + head_dim / 2); `x` holds prepared activations.
#define WT_FUSED_INTO 1u
#define WT_FUSED_NORM 2u
#define WT_FUSED_INTERLEAVED 4u
#define WT_FUSED_PREPARED 8u

// The weight format code of f32 weights (not a packed format; FMT_* are 1 and up).
#define WT_FMT_F32 0u

// Activation rows one warp carries (as WT_QM_ROWS in quant.cu).
#define WT_FUSED_ROWS 8u
// The most activation values a block prepares in shared memory: 32 KiB of f32, 16 KiB of
// int8 (and their scales).
#define WT_FUSED_F32_ACTS 8192u
#define WT_FUSED_INT_ACTS 16384u

// Sum over a block of doubles (blockDim.x a multiple of 32); every thread gets the total.
__device__ double wt_block_sum_f64(double v, double* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int warps = blockDim.x >> 5;
    double t = lane < warps ? scratch[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

// Largest |v| over a warp, NaN ignored (Rust's f32::max, as quantize_i8 folds it).
__device__ __forceinline__ float wt_warp_absmax(float v) {
    float m = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

// Largest of `m` (each ≥ 0) over a block, NaN ignored; every thread gets it.
__device__ float wt_block_absmax(float m, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __syncthreads();
    if (lane == 0) scratch[warp] = m;
    __syncthreads();
    int warps = blockDim.x >> 5;
    float t = lane < warps ? scratch[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
    return t;
}

// The signed value of largest magnitude over a warp, the first in index order on ties (as
// quantize_q8_k scans), from each lane's largest magnitude `amax`, its signed value `max` and
// its index `first` (0xffffffff where the lane has none); every lane gets it.
__device__ float wt_warp_signed_max(float amax, float max, u32 first) {
    for (int o = 16; o > 0; o >>= 1) {
        float a = __shfl_xor_sync(0xffffffffu, amax, o);
        float m = __shfl_xor_sync(0xffffffffu, max, o);
        u32 f = __shfl_xor_sync(0xffffffffu, first, o);
        if (a > amax || (a == amax && f < first)) {
            amax = a;
            max = m;
            first = f;
        }
    }
    return max;
}

// Value c of an activation row `x`, normed (the reference's f32 value: x · inv · w rounded
// once from f64) where `norm` says.
__device__ __forceinline__ float wt_act_value(const float* x, const float* w, double inv, u32 c,
                                              bool norm) {
    return norm ? (float)((double)x[c] * inv * (double)w[c]) : x[c];
}

// The int8 value quantize_i8 gives v with the scale's inverse `id`.
__device__ __forceinline__ i8 wt_round_i8(float v, float id) {
    return (i8)wt_sat_int(roundf(__fmul_rn(v, id)), -128, 127);
}

// Prepares activation row `x` (k values) with the whole block: f32 values into `af` (mode
// f32), or int8 values into `aq` and one scale per 32 values into `ad`. The block's threads
// must all call it.
__device__ void wt_prepare_row(const float* x, const float* norm_w, u32 k, float eps, bool norm,
                               u32 mode, float* af, i8* aq, float* ad) {
    __shared__ double dscratch[32];
    __shared__ float fscratch[32];
    double inv = 1.0;
    if (norm) {
        double ss = 0.0;
        for (u32 c = threadIdx.x; c < k; c += blockDim.x) {
            double v = (double)x[c];
            ss += v * v;
        }
        ss = wt_block_sum_f64(ss, dscratch);
        inv = 1.0 / sqrt(ss / (double)k + (double)eps);
    }
    if (mode == WT_ACT_F32) {
        for (u32 c = threadIdx.x; c < k; c += blockDim.x) af[c] = wt_act_value(x, norm_w, inv, c, norm);
        return;
    }
    u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (mode == WT_ACT_Q8_0) {
        // A warp per 32 values: their largest magnitude is the block's scale · 127.
        for (u32 b = warp; b < k / 32u; b += warps) {
            u32 c = 32u * b + lane;
            float v = wt_act_value(x, norm_w, inv, c, norm);
            float d = __fdiv_rn(wt_warp_absmax(v), 127.0f);
            float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
            aq[c] = wt_round_i8(v, id);
            if (lane == 0u) ad[b] = d;
        }
        return;
    }
    if (mode == WT_ACT_Q8_K) {
        // A warp per 256 values, lane l taking values 32i + l: their signed largest gives the
        // block's scale, written once for each of its 32-value groups.
        for (u32 b = warp; b < k / 256u; b += warps) {
            float v[8];
            float amax = 0.0f, max = 0.0f;
            u32 first = 0xffffffffu;
            _Pragma("unroll") for (u32 i = 0; i < 8u; ++i) {
                v[i] = wt_act_value(x, norm_w, inv, 256u * b + 32u * i + lane, norm);
                if (fabsf(v[i]) > amax) first = 32u * i + lane;
                wt_signed_max_step(v[i], &amax, &max);
            }
            max = wt_warp_signed_max(amax, max, first);
            float is = wt_q8_k_iscale(max);
            _Pragma("unroll") for (u32 i = 0; i < 8u; ++i) aq[256u * b + 32u * i + lane] = wt_round_q8_k(v[i], is);
            if (lane < 8u) ad[8u * b + lane] = wt_q8_k_scale(max, is);
        }
        return;
    }
    // I8: one scale for the row.
    float amax = 0.0f;
    for (u32 c = threadIdx.x; c < k; c += blockDim.x) {
        amax = fmaxf(amax, fabsf(wt_act_value(x, norm_w, inv, c, norm)));
    }
    float d = __fdiv_rn(wt_block_absmax(amax, fscratch), 127.0f);
    float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    for (u32 c = threadIdx.x; c < k; c += blockDim.x) {
        aq[c] = wt_round_i8(wt_act_value(x, norm_w, inv, c, norm), id);
    }
    for (u32 b = threadIdx.x; b < k / 32u; b += blockDim.x) ad[b] = d;
}

// One block per activation row: the prepared rows into `out` for a product with
// WT_FUSED_PREPARED: f32 [m, k] (mode f32), or int8 [m, k] then f32 scales [m, k / 32].
extern "C" __global__ void fused_prepare(u8* out, const float* x, const float* norm_w, u32 m,
                                         u32 k, u32 mode, u32 norm, float eps) {
    u64 row = blockIdx.x;
    if (row >= m) return;
    float* af = (float*)out + row * k;
    i8* aq = (i8*)out + row * k;
    float* ad = (float*)(out + (u64)m * k) + row * (k / 32u);
    wt_prepare_row(x + row * k, norm_w, k, eps, norm != 0u, mode, af, aq, ad);
}

// Bytes of one weight row of `fmt` with k values.
__device__ __forceinline__ u64 wt_fused_row_bytes(u32 fmt, u32 k) {
    if (fmt == WT_FMT_F32) return 4ull * k;
    return (u64)(k / wt_block_len(fmt)) * wt_block_bytes(fmt);
}

// acc[r] += a[i0 + r, t] · (v) for the rows the warp carries (f32 activations).
#define WT_FUSED_FMA(t, v)                                                                 \
    _Pragma("unroll") for (u32 r = 0; r < WT_FUSED_ROWS; ++r) {                            \
        if (r < rows) acc[r] = fmaf(af[(u64)(i0 + r) * k + (t)], (v), acc[r]);             \
    }

// acc[r] += Σ_p act[i0 + r, p] · w[p] over weight row `w` of `fmt`, this lane's share (the
// warp's lanes are summed afterwards). INT: the activations are int8 `aq` with scales `ad`
// (one per 32 values); else f32 `af`.
template <bool INT>
__device__ __forceinline__ void wt_fused_dot(u32 fmt, const u8* w, const float* af, const i8* aq,
                                             const float* ad, u32 i0, u32 rows, u32 k, float* acc) {
    u32 lane = threadIdx.x & 31u;
    if (fmt == FMT_Q4_0 || fmt == FMT_Q8_0) {
        // A block per 8 lanes, four blocks per step: each lane takes 4 values of its block.
        u32 sub = lane & 7u, bbytes = fmt == FMT_Q4_0 ? Q4_0_BLOCK_BYTES : Q8_0_BLOCK_BYTES;
        for (u32 b = lane >> 3; b < k / 32u; b += 4u) {
            const unsigned short* h = (const unsigned short*)(w + (u64)b * bbytes);
            float d = wt_f16_to_f32(h[0]);
            // The 4 values' integers and their places in the block.
            int q0, q1, q2, q3;
            u32 p0, p1, p2, p3;
            if (fmt == FMT_Q4_0) {
                // Bytes 2·sub and 2·sub + 1: low nibbles are values 2·sub and 2·sub + 1,
                // high nibbles values 2·sub + 16 and 2·sub + 17.
                u32 q = h[1u + sub];
                q0 = (int)(q & 15u) - 8;
                q1 = (int)((q >> 8) & 15u) - 8;
                q2 = (int)((q >> 4) & 15u) - 8;
                q3 = (int)(q >> 12) - 8;
                p0 = 2u * sub;
                p1 = p0 + 1u;
                p2 = p0 + 16u;
                p3 = p0 + 17u;
            } else {
                u32 q = (u32)h[1u + 2u * sub] | ((u32)h[2u + 2u * sub] << 16);
                q0 = (int)(i8)(q & 0xffu);
                q1 = (int)(i8)((q >> 8) & 0xffu);
                q2 = (int)(i8)((q >> 16) & 0xffu);
                q3 = (int)(i8)(q >> 24);
                p0 = 4u * sub;
                p1 = p0 + 1u;
                p2 = p0 + 2u;
                p3 = p0 + 3u;
            }
            u32 base = 32u * b;
            if (INT) {
                _Pragma("unroll") for (u32 r = 0; r < WT_FUSED_ROWS; ++r) {
                    if (r < rows) {
                        const i8* a = aq + (u64)(i0 + r) * k + base;
                        int s = q0 * (int)a[p0] + q1 * (int)a[p1] + q2 * (int)a[p2] + q3 * (int)a[p3];
                        float scale = __fmul_rn(d, ad[(u64)(i0 + r) * (k / 32u) + b]);
                        acc[r] = fmaf((float)s, scale, acc[r]);
                    }
                }
            } else {
                float v0 = __fmul_rn((float)q0, d), v1 = __fmul_rn((float)q1, d);
                float v2 = __fmul_rn((float)q2, d), v3 = __fmul_rn((float)q3, d);
                WT_FUSED_FMA(base + p0, v0)
                WT_FUSED_FMA(base + p1, v1)
                WT_FUSED_FMA(base + p2, v2)
                WT_FUSED_FMA(base + p3, v3)
            }
        }
        return;
    }
    if (wt_decodes_groups(fmt)) {
        // A group of 32 values per lane (decode.cu), decoded once for all the rows the warp
        // carries; int8 activations are d · q (d their 32 values' scale).
        for (u32 g = lane; g < k / 32u; g += 32u) {
            float v[32];
            wt_decode_group(fmt, w, g, v);
            _Pragma("unroll") for (u32 r = 0; r < WT_FUSED_ROWS; ++r) {
                if (r >= rows) continue;
                u64 at = (u64)(i0 + r) * k + 32u * g;
                float d = INT ? ad[at / 32u] : 0.0f;
                _Pragma("unroll") for (u32 t = 0; t < 32u; ++t) {
                    float a = INT ? (float)aq[at + t] * d : af[at + t];
                    acc[r] = fmaf(a, v[t], acc[r]);
                }
            }
        }
        return;
    }
    if (INT) {
        // Other block formats: value by value, each activation d · q.
        for (u32 p = lane; p < k; p += 32u) {
            float v = wt_row_value(fmt, w, p);
            _Pragma("unroll") for (u32 r = 0; r < WT_FUSED_ROWS; ++r) {
                if (r < rows) {
                    u64 at = (u64)(i0 + r) * k + p;
                    float a = (float)aq[at] * ad[at / 32u];
                    acc[r] = fmaf(a, v, acc[r]);
                }
            }
        }
        return;
    }
    if (fmt == WT_FMT_F32) {
        const float* wf = (const float*)w;
        for (u32 p = lane; p < k; p += 32u) {
            float v = wf[p];
            WT_FUSED_FMA(p, v)
        }
    } else if (fmt == FMT_F16 && (k & 1u) == 0u) {
        // Two values per 4-byte word (rows of 2k bytes are 4-byte aligned when k is even).
        const u32* words = (const u32*)w;
        for (u32 q = lane; q < k / 2u; q += 32u) {
            u32 pair = words[q];
            float v0 = wt_f16_to_f32((unsigned short)(pair & 0xffffu));
            float v1 = wt_f16_to_f32((unsigned short)(pair >> 16));
            WT_FUSED_FMA(2u * q, v0)
            WT_FUSED_FMA(2u * q + 1u, v1)
        }
    } else {
        for (u32 p = lane; p < k; p += 32u) {
            float v = wt_row_value(fmt, w, p);
            WT_FUSED_FMA(p, v)
        }
    }
}
#undef WT_FUSED_FMA

// Stores value v of output column j of activation row i: into out [m, n], or with
// WT_FUSED_INTO into pool row slots[g · m + i] (g = j / head_dim) at j % head_dim, where
// that slot is a row of the pool.
__device__ __forceinline__ void wt_fused_store(float* out, const u32* slots, u32 flags, u32 m,
                                               u32 n, u32 i, u32 j, u32 head_dim, u32 pool_rows,
                                               float v) {
    if (flags & WT_FUSED_INTO) {
        u32 slot = slots[(u64)(j / head_dim) * m + i];
        if (slot < pool_rows) out[(u64)slot * head_dim + j % head_dim] = v;
    } else {
        out[(u64)i * n + j] = v;
    }
}

// The product of one fused op (see the top of this file). Units: n weight rows (store,
// residual), n columns of gate and up (swiglu), n / 2 rope pairs (rope). Inputs not used by
// the epilogue and flags may be null.
template <bool INT>
__device__ void wt_fused_linear(float* out, const float* x, const u8* w0, const u8* w1,
                                const float* norm_w, const float* residual, const u32* positions,
                                const float* inv_freq, const u32* slots, u32 fmt, u32 mode, u32 m,
                                u32 n, u32 k, u32 epilogue, u32 flags, float eps, u32 head_dim,
                                u32 pool_rows, float* sf, i8* sq, float* sd) {
    const float* af;
    const i8* aq;
    const float* ad;
    if (flags & WT_FUSED_PREPARED) {
        af = x;
        aq = (const i8*)x;
        ad = (const float*)((const u8*)x + (u64)m * k);
    } else {
        for (u32 i = 0; i < m; ++i) {
            wt_prepare_row(x + (u64)i * k, norm_w, k, eps, (flags & WT_FUSED_NORM) != 0u, mode,
                           sf + (u64)i * k, sq + (u64)i * k, sd + (u64)i * (k / 32u));
        }
        __syncthreads();
        af = sf;
        aq = sq;
        ad = sd;
    }
    u32 lane = threadIdx.x & 31u;
    u64 warp = (u64)blockIdx.x * (blockDim.x / 32u) + threadIdx.x / 32u;
    u32 half = head_dim / 2u;
    u32 units = epilogue == WT_EPI_ROPE ? n / 2u : n;
    u64 groups = (m + WT_FUSED_ROWS - 1u) / WT_FUSED_ROWS;
    if (units == 0u || warp >= (u64)units * groups) return;
    u32 unit = (u32)(warp % units);
    u32 i0 = (u32)(warp / units) * WT_FUSED_ROWS;
    u32 rows = min(WT_FUSED_ROWS, m - i0);
    // The output columns j0 (weight w0) and, for two-row units, j1 (weight w1).
    u32 j0 = unit, j1 = unit, pair = 0u;
    const u8* wb = w1;
    if (epilogue == WT_EPI_ROPE) {
        u32 head = unit / half;
        pair = unit % half;
        bool interleaved = (flags & WT_FUSED_INTERLEAVED) != 0u;
        j0 = head * head_dim + (interleaved ? 2u * pair : pair);
        j1 = head * head_dim + (interleaved ? 2u * pair + 1u : pair + half);
        wb = w0;
    }
    bool two = epilogue == WT_EPI_ROPE || epilogue == WT_EPI_SWIGLU;
    u64 row_bytes = wt_fused_row_bytes(fmt, k);
    float acc0[WT_FUSED_ROWS], acc1[WT_FUSED_ROWS];
    _Pragma("unroll") for (u32 r = 0; r < WT_FUSED_ROWS; ++r) {
        acc0[r] = 0.0f;
        acc1[r] = 0.0f;
    }
    wt_fused_dot<INT>(fmt, w0 + j0 * row_bytes, af, aq, ad, i0, rows, k, acc0);
    if (two) wt_fused_dot<INT>(fmt, wb + j1 * row_bytes, af, aq, ad, i0, rows, k, acc1);
    _Pragma("unroll") for (u32 r = 0; r < WT_FUSED_ROWS; ++r) {
        float y0 = wt_warp_sum(acc0[r]);
        float y1 = two ? wt_warp_sum(acc1[r]) : 0.0f;
        if (lane != r || r >= rows) continue;
        u32 i = i0 + r;
        if (epilogue == WT_EPI_ROPE) {
            // As rope_f32: the angle one f32 product, sin, cos and the rotation in f64.
            float angle = __fmul_rn((float)positions[i], inv_freq[pair]);
            double s, c;
            sincos((double)angle, &s, &c);
            double x0 = (double)y0, x1 = (double)y1;
            wt_fused_store(out, slots, flags, m, n, i, j0, head_dim, pool_rows, (float)(x0 * c - x1 * s));
            wt_fused_store(out, slots, flags, m, n, i, j1, head_dim, pool_rows, (float)(x0 * s + x1 * c));
            continue;
        }
        float v = y0;
        if (epilogue == WT_EPI_RESIDUAL) v = residual[(u64)i * n + j0] + y0;
        if (epilogue == WT_EPI_SWIGLU) v = y0 / (1.0f + expf(-y0)) * y1;
        wt_fused_store(out, slots, flags, m, n, i, j0, head_dim, pool_rows, v);
    }
}

// The product with f32 activations (normed or not).
extern "C" __global__ void fused_linear_f32(float* out, const float* x, const u8* w0, const u8* w1,
                                            const float* norm_w, const float* residual,
                                            const u32* positions, const float* inv_freq,
                                            const u32* slots, u32 fmt, u32 mode, u32 m, u32 n,
                                            u32 k, u32 epilogue, u32 flags, float eps,
                                            u32 head_dim, u32 pool_rows) {
    __shared__ float sf[WT_FUSED_F32_ACTS];
    wt_fused_linear<false>(out, x, w0, w1, norm_w, residual, positions, inv_freq, slots, fmt, mode,
                           m, n, k, epilogue, flags, eps, head_dim, pool_rows, sf, 0, 0);
}

// The product with int8 activations (Q8_0 or I8 mode) against block-format weights.
extern "C" __global__ void fused_linear_i8(float* out, const float* x, const u8* w0, const u8* w1,
                                           const float* norm_w, const float* residual,
                                           const u32* positions, const float* inv_freq,
                                           const u32* slots, u32 fmt, u32 mode, u32 m, u32 n,
                                           u32 k, u32 epilogue, u32 flags, float eps,
                                           u32 head_dim, u32 pool_rows) {
    __shared__ i8 sq[WT_FUSED_INT_ACTS];
    __shared__ float sd[WT_FUSED_INT_ACTS / 32u];
    wt_fused_linear<true>(out, x, w0, w1, norm_w, residual, positions, inv_freq, slots, fmt, mode,
                          m, n, k, epilogue, flags, eps, head_dim, pool_rows, 0, sq, sd);
}

// The widest head `paged_attention` takes, and the keys it scores at once (one per thread).
#define WT_ATT_MAX_HEAD_DIM 512u
#define WT_ATT_CHUNK 256u

// One block per (head h, query i): attention of query i of head h over the keys it sees,
// read in place from the pools through the row table (`rows`, [kv_heads, stride]; a row past
// the pool reads as NaN). The key count is `n`, or *n_at where n_at is not null (a replayed
// step reads it from memory written before each launch; kept ≤ stride). Keys are taken
// WT_ATT_CHUNK at a time, a thread per key scoring it, with an online softmax; the weighted
// values are summed by groups of head_dim threads, each group every G-th key, then added.
// blockDim.x must be WT_ATT_CHUNK and head_dim at most WT_ATT_MAX_HEAD_DIM.
extern "C" __global__ void paged_attention(float* out, const float* q, const float* keys,
                                           const float* values, const u32* rows, u32 n,
                                           const u32* n_at, u32 t, u32 stride, u32 heads,
                                           u32 kv_heads, u32 head_dim, u32 pool_rows, float scale,
                                           u32 window, float softcap) {
    __shared__ float sq[WT_ATT_MAX_HEAD_DIM];
    __shared__ float sp[WT_ATT_CHUNK];
    __shared__ u32 sr[WT_ATT_CHUNK];
    __shared__ float part[WT_ATT_CHUNK];
    __shared__ float scratch[32];
    u32 h = blockIdx.x, i = blockIdx.y, tid = threadIdx.x;
    if (n_at) n = *n_at;
    n = min(n, stride);
    u32 hd = head_dim;
    u32 g = h / (heads / kv_heads);
    u64 at = ((u64)i * heads + h) * hd;
    for (u32 d = tid; d < hd; d += blockDim.x) sq[d] = q[at + d];
    // Query i is position n − t + i: it sees keys [start, end).
    u32 end = n + i + 1u > t ? n + i + 1u - t : 0u;
    u32 start = window != 0u && end > window ? end - window : 0u;
    const u32* table = rows + (u64)g * stride;
    // The value sums: with hd ≤ blockDim.x, `groups` groups of hd threads (thread tid is
    // dimension tid % hd of group tid / hd); wider heads take dimensions tid and tid + 256.
    u32 groups = hd <= blockDim.x ? blockDim.x / hd : 1u;
    u32 group = hd <= blockDim.x ? tid / hd : 0u;
    u32 dim = hd <= blockDim.x ? tid % hd : tid;
    float acc0 = 0.0f, acc1 = 0.0f;
    float m_run = -__int_as_float(0x7f800000), l_run = 0.0f;
    for (u32 c0 = start; c0 < end; c0 += WT_ATT_CHUNK) {
        u32 len = min(WT_ATT_CHUNK, end - c0);
        __syncthreads();  // the last chunk's sp and sr are read by every thread
        float s = -__int_as_float(0x7f800000);
        if (tid < len) {
            u32 row = table[c0 + tid];
            sr[tid] = row;
            if (row < pool_rows) {
                const float* key = keys + (u64)row * hd;
                float dot = 0.0f;
                for (u32 d = 0; d < hd; ++d) dot = fmaf(sq[d], key[d], dot);
                s = dot * scale;
                // Soft-capped scores (Gemma 2): softcap · tanh(s / softcap); 0 for none.
                if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
            } else {
                s = WT_NAN;
            }
        }
        float m_new = fmaxf(m_run, wt_block_max(s, scratch));
        float factor = m_run == -__int_as_float(0x7f800000) ? 0.0f : expf(m_run - m_new);
        float p = tid < len ? expf(s - m_new) : 0.0f;
        sp[tid] = p;
        l_run = l_run * factor + wt_block_sum(p, scratch);
        m_run = m_new;
        __syncthreads();
        acc0 *= factor;
        acc1 *= factor;
        if (group < groups && dim < hd) {
            for (u32 jj = group; jj < len; jj += groups) {
                u32 row = sr[jj];
                float v = row < pool_rows ? values[(u64)row * hd + dim] : WT_NAN;
                acc0 = fmaf(sp[jj], v, acc0);
                if (hd > blockDim.x && dim + blockDim.x < hd) {
                    float v1 = row < pool_rows ? values[(u64)row * hd + dim + blockDim.x] : WT_NAN;
                    acc1 = fmaf(sp[jj], v1, acc1);
                }
            }
        }
    }
    if (end <= start) {
        // No key to see (t > n, which the op layer refuses): NaN rather than stale memory.
        for (u32 d = tid; d < hd; d += blockDim.x) out[at + d] = WT_NAN;
        return;
    }
    if (hd > blockDim.x) {
        out[at + dim] = acc0 / l_run;
        if (dim + blockDim.x < hd) out[at + dim + blockDim.x] = acc1 / l_run;
        return;
    }
    part[tid] = acc0;
    __syncthreads();
    if (group == 0u) {
        float o = 0.0f;
        for (u32 gi = 0; gi < groups; ++gi) o += part[gi * hd + dim];
        out[at + dim] = o / l_run;
    }
}
