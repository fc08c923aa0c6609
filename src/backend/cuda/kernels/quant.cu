// Block formats (src/quant): OpSpec::Quantize, Dequantize, QMatmul, TernaryDot.
//
// Format codes and block sizes: FMT_* and *_BLOCK_* of formats.cuh (generated from
// src/backend/kernel_consts.rs). Blocks are read and written byte by byte (Q8_0 and Q4_0
// blocks are not word-aligned); the readers (wt_block_int, wt_row_value, ...) are in
// common.cu, which fused.cu uses too, and llama.cpp's formats beyond Q8_0 and Q4_0 are read
// 32 values at a time by the group decoder of decode.cu.
//
// Quantization is bit-exact with GGUF's reference quantizers: every product, sum and quotient
// that the reference rounds separately is an explicit __fmul_rn/__fadd_rn/__fdiv_rn, which
// the compiler never fuses into an FMA, and scales go to f16 by wt_f32_to_f16 (round to
// nearest even, on the bits).

__device__ __forceinline__ void wt_write_f16(u8* p, float v) {
    unsigned short h = wt_f32_to_f16(v);
    p[0] = (u8)(h & 0xffu);
    p[1] = (u8)(h >> 8);
}

// Q4_0's and Q5_0's scale of the 32 values `x`: d = m / divisor (−8 or −16) from the signed
// value of largest magnitude m (the first of equal magnitudes), and id = 1/d (0 where d is 0).
__device__ __forceinline__ void wt_symmetric_scale(const float* x, float divisor, float* d, float* id) {
    float amax = 0.0f, max = 0.0f;
    for (u32 i = 0; i < 32u; ++i) {
        float a = fabsf(x[i]);
        if (amax < a) {
            amax = a;
            max = x[i];
        }
    }
    *d = __fdiv_rn(max, divisor);
    *id = *d != 0.0f ? __fdiv_rn(1.0f, *d) : 0.0f;
}

// The level min(top, trunc(x · id + offset)) (0 for NaN), each rounding apart.
__device__ __forceinline__ int wt_level(float x, float id, float offset, int top) {
    return wt_sat_int(truncf(__fadd_rn(__fmul_rn(x, id), offset)), 0, top);
}

// 32 levels below 32 as Q5_0 and Q5_1 store them: the fifth bits as one little-endian word at
// `qh`, the low four bits in 16 bytes at `qs` (value j low, value j + 16 high).
__device__ __forceinline__ void wt_put_five_bits(const int* q, u8* qh, u8* qs) {
    u32 high = 0;
    for (u32 i = 0; i < 32u; ++i) high |= (u32)((q[i] >> 4) & 1) << i;
    for (u32 b = 0; b < 4u; ++b) qh[b] = (u8)(high >> (8u * b));
    for (u32 j = 0; j < 16u; ++j) qs[j] = (u8)((q[j] & 15) | ((q[j + 16] & 15) << 4));
}

// One thread per block (per value for F16): `blocks` blocks of `x` into `out`, for F16, Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1 and the ternary formats (the launch refuses the others).
extern "C" __global__ void quantize(u8* out, const float* x, u32 fmt, u32 blocks) {
    u64 b = wt_gid();
    if (b >= blocks) return;
    u32 len = wt_block_len(fmt);
    const float* xb = x + b * len;
    u8* o = out + b * wt_block_bytes(fmt);
    if (fmt == FMT_F16) {
        wt_write_f16(o, xb[0]);
        return;
    }
    if (fmt == FMT_Q8_0) {
        float amax = 0.0f;
        for (u32 i = 0; i < 32u; ++i) amax = fmaxf(amax, fabsf(xb[i]));
        float d = __fdiv_rn(amax, 127.0f);
        float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        wt_write_f16(o, d);
        for (u32 i = 0; i < 32u; ++i) {
            o[2 + i] = (u8)(i8)wt_sat_int(roundf(__fmul_rn(xb[i], id)), -128, 127);
        }
        return;
    }
    if (fmt == FMT_Q4_0) {
        float d, id;
        wt_symmetric_scale(xb, -8.0f, &d, &id);
        wt_write_f16(o, d);
        for (u32 j = 0; j < 16u; ++j) {
            int lo = wt_level(xb[j], id, 8.5f, 15);
            int hi = wt_level(xb[j + 16], id, 8.5f, 15);
            o[2 + j] = (u8)(lo | (hi << 4));
        }
        return;
    }
    if (fmt == FMT_Q5_0) {
        float d, id;
        wt_symmetric_scale(xb, -16.0f, &d, &id);
        int q[32];
        for (u32 i = 0; i < 32u; ++i) q[i] = wt_level(xb[i], id, 16.5f, 31);
        wt_write_f16(o, d);
        wt_put_five_bits(q, o + 2, o + 6);
        return;
    }
    if (fmt == FMT_Q4_1 || fmt == FMT_Q5_1) {
        // d = (max − min) / top, each value min(top, trunc((x − min) · (1/d) + 0.5)).
        bool five = fmt == FMT_Q5_1;
        float top = five ? 31.0f : 15.0f;
        float hi = xb[0], lo = xb[0];
        for (u32 i = 1; i < 32u; ++i) {
            hi = fmaxf(hi, xb[i]);
            lo = fminf(lo, xb[i]);
        }
        float d = __fdiv_rn(__fsub_rn(hi, lo), top);
        float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        int q[32];
        for (u32 i = 0; i < 32u; ++i) {
            q[i] = wt_level(__fsub_rn(xb[i], lo), id, 0.5f, (int)top);
        }
        wt_write_f16(o, d);
        wt_write_f16(o + 2, lo);
        if (five) {
            wt_put_five_bits(q, o + 4, o + 8);
        } else {
            for (u32 j = 0; j < 16u; ++j) o[4 + j] = (u8)(q[j] | (q[j + 16] << 4));
        }
        return;
    }
    // Ternary: d = max|x|, trit = round(x · (1/d)), stored as trit + 1 where a format packs it.
    float amax = 0.0f;
    for (u32 i = 0; i < 256u; ++i) amax = fmaxf(amax, fabsf(xb[i]));
    float id = amax != 0.0f ? __fdiv_rn(1.0f, amax) : 0.0f;
#define WT_TRIT(v) wt_sat_int(roundf(__fmul_rn(xb[(v)], id)), -128, 127)
    if (fmt == FMT_TQ2_0) {
        for (u32 c = 0; c < 2u; ++c) {
            for (u32 m = 0; m < 32u; ++m) {
                u32 q = 0;
                for (u32 l = 0; l < 4u; ++l) q |= (u32)(u8)(WT_TRIT(128u * c + 32u * l + m) + 1) << (2u * l);
                o[32u * c + m] = (u8)q;
            }
        }
        wt_write_f16(o + 64, amax);
    } else if (fmt == FMT_TQ1_0) {
        // ⌈q · 256 / 243⌉ of the base-3 number q formed by the trits (first most significant).
        for (u32 m = 0; m < 32u; ++m) {
            u32 q = 0;
            for (u32 n = 0; n < 5u; ++n) q = (q * 3u + (u32)(u8)(WT_TRIT(32u * n + m) + 1)) & 0xffffu;
            o[m] = (u8)((q * 256u + 242u) / 243u);
        }
        for (u32 m = 0; m < 16u; ++m) {
            u32 q = 0;
            for (u32 n = 0; n < 5u; ++n) q = (q * 3u + (u32)(u8)(WT_TRIT(160u + 16u * n + m) + 1)) & 0xffffu;
            o[32u + m] = (u8)((q * 256u + 242u) / 243u);
        }
        for (u32 j = 0; j < 4u; ++j) {
            u32 q = 0;
            for (u32 n = 0; n < 4u; ++n) q = (q * 3u + (u32)(u8)(WT_TRIT(240u + 4u * n + j) + 1)) & 0xffffu;
            q *= 3u;
            o[48u + j] = (u8)((q * 256u + 242u) / 243u);
        }
        wt_write_f16(o + 52, amax);
    } else {
        u32 bits = __float_as_uint(amax);
        for (u32 i = 0; i < 4u; ++i) o[i] = (u8)(bits >> (8u * i));
        for (u32 w = 0; w < 8u; ++w) {
            u32 plus = 0, minus = 0;
            for (u32 i = 0; i < 32u; ++i) {
                int t = WT_TRIT(32u * w + i);
                if (t > 0) plus |= 1u << i;
                else if (t < 0) minus |= 1u << i;
            }
            for (u32 i = 0; i < 4u; ++i) {
                o[4u + 4u * w + i] = (u8)(plus >> (8u * i));
                o[36u + 4u * w + i] = (u8)(minus >> (8u * i));
            }
        }
    }
#undef WT_TRIT
}

// `len` values of `fmt` data (whole rows) to f32: one thread per group of 32 values for the
// formats the group decoder reads (decode.cu), else one thread per value.
extern "C" __global__ void dequantize(float* out, const u8* x, u32 fmt, u32 len) {
    u64 i = wt_gid();
    if (wt_decodes_groups(fmt)) {
        if (i >= len / 32u) return;
        float v[32];
        wt_decode_group(fmt, x, i, v);
        _Pragma("unroll") for (u32 t = 0; t < 32u; ++t) out[32u * i + t] = v[t];
        return;
    }
    if (i >= len) return;
    u32 blen = wt_block_len(fmt);
    const u8* p = x + (i / blen) * wt_block_bytes(fmt);
    out[i] = fmt == FMT_F16 ? wt_read_f16(x + 2u * i)
                       : __fmul_rn((float)wt_block_int(fmt, p, (u32)(i % blen)), wt_block_scale(fmt, p));
}

// The activations a QMatmul uses, as f32 [m, k]. mode 1: f16 input widened (one thread per
// value). mode 2/3: f32 input rounded to int8 per block of `block` values (32 for Q8_0, k
// for the per-row I8 mode) with d = max|x| / 127, giving d · q (one thread per block). mode
// 4: llama.cpp's Q8_K rounding per 256 values (`block`), giving d · q (one thread per block).
extern "C" __global__ void qmatmul_act(float* act, const u8* a, u32 mode, u32 len, u32 block) {
    u64 t = wt_gid();
    if (mode == 1u) {
        if (t < len) act[t] = wt_read_f16(a + 2u * t);
        return;
    }
    if (t * block >= len) return;
    const float* x = (const float*)a + t * block;
    if (mode == 4u) {
        float amax = 0.0f, max = 0.0f;
        for (u32 i = 0; i < block; ++i) wt_signed_max_step(x[i], &amax, &max);
        float is = wt_q8_k_iscale(max);
        float d = wt_q8_k_scale(max, is);
        for (u32 i = 0; i < block; ++i) act[t * block + i] = (float)wt_round_q8_k(x[i], is) * d;
        return;
    }
    float amax = 0.0f;
    for (u32 i = 0; i < block; ++i) amax = fmaxf(amax, fabsf(x[i]));
    float d = __fdiv_rn(amax, 127.0f);
    float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    for (u32 i = 0; i < block; ++i) {
        int q = wt_sat_int(roundf(__fmul_rn(x[i], id)), -128, 127);
        act[t * block + i] = (float)q * d;
    }
}

// Activation rows one warp of `qmatmul` multiplies at once: each weight row is read from
// memory once per this many rows (once in decode), not once per row.
#define WT_QM_ROWS 8u

// acc[r] += act[r, col + t] · v for the rows a warp carries (`rows` of them, stride k).
#define WT_QM_FMA(t, v)                                                                  \
    _Pragma("unroll") for (u32 r = 0; r < WT_QM_ROWS; ++r) {                             \
        if (r < rows) acc[r] = fmaf(a[(u64)r * k + (t)], (v), acc[r]);                   \
    }

// out[i, j] = Σ_p act[i, p] · w[j, p], w of `fmt` [n, k] read packed; each value is d · q in
// f32 (as dequantize gives it) times the activation, summed in f32.
//
// One warp per weight row j and group of WT_QM_ROWS activation rows; consecutive warps take
// consecutive weight rows. Q8_0 and Q4_0 (what GGUF decoders stream) are read a block per
// 8 lanes, four blocks per warp step: each lane loads one or two 2-byte words of its block
// (blocks are 18 or 34 bytes, so 2-byte aligned) and the matching 2 or 4 activations, so a
// warp's loads are contiguous. F16 with an even k takes two values per lane per step (one
// 4-byte word); the group-decoded formats (decode.cu) a group of 32 values per lane; other
// formats one value.
extern "C" __global__ void qmatmul(float* out, const float* act, const u8* w, u32 fmt, u32 m,
                                   u32 n, u32 k) {
    u64 warp = (u64)blockIdx.x * (blockDim.x / 32u) + threadIdx.x / 32u;
    u32 lane = threadIdx.x & 31u;
    u64 groups = (m + WT_QM_ROWS - 1u) / WT_QM_ROWS;
    if (warp >= (u64)n * groups) return;
    u64 j = warp % n;
    u32 i0 = (u32)(warp / n) * WT_QM_ROWS;
    u32 rows = min(WT_QM_ROWS, m - i0);
    u32 bbytes = wt_block_bytes(fmt);
    const u8* wrow = w + j * (u64)(k / wt_block_len(fmt)) * bbytes;
    float acc[WT_QM_ROWS];
    _Pragma("unroll") for (u32 r = 0; r < WT_QM_ROWS; ++r) acc[r] = 0.0f;
    if (fmt == FMT_Q4_0 || fmt == FMT_Q8_0) {
        u32 sub = lane & 7u;
        for (u32 b = lane >> 3; b < k / 32u; b += 4u) {
            const unsigned short* h = (const unsigned short*)(wrow + (u64)b * bbytes);
            float d = wt_f16_to_f32(h[0]);
            const float* a = act + (u64)i0 * k + 32u * b;
            if (fmt == FMT_Q4_0) {
                // Bytes 2·sub and 2·sub + 1: low nibbles are values 2·sub, 2·sub + 1, high
                // nibbles values 2·sub + 16, 2·sub + 17.
                u32 q = h[1u + sub];
                float v0 = __fmul_rn((float)((int)(q & 15u) - 8), d);
                float v1 = __fmul_rn((float)((int)((q >> 8) & 15u) - 8), d);
                float v2 = __fmul_rn((float)((int)((q >> 4) & 15u) - 8), d);
                float v3 = __fmul_rn((float)((int)(q >> 12) - 8), d);
                WT_QM_FMA(2u * sub, v0)
                WT_QM_FMA(2u * sub + 1u, v1)
                WT_QM_FMA(2u * sub + 16u, v2)
                WT_QM_FMA(2u * sub + 17u, v3)
            } else {
                // Bytes 4·sub .. 4·sub + 3: values 4·sub .. 4·sub + 3.
                u32 q = (u32)h[1u + 2u * sub] | ((u32)h[2u + 2u * sub] << 16);
                _Pragma("unroll") for (u32 t = 0; t < 4u; ++t) {
                    float v = __fmul_rn((float)(int)(i8)(q >> (8u * t)), d);
                    WT_QM_FMA(4u * sub + t, v)
                }
            }
        }
    } else if (fmt == FMT_F16 && (k & 1u) == 0u) {
        // Two values per 4-byte word (rows of 2k bytes are 4-byte aligned when k is even).
        const u32* words = (const u32*)wrow;
        for (u32 q = lane; q < k / 2u; q += 32u) {
            u32 pair = words[q];
            float v0 = wt_f16_to_f32((unsigned short)(pair & 0xffffu));
            float v1 = wt_f16_to_f32((unsigned short)(pair >> 16));
            const float* a = act + (u64)i0 * k + 2u * q;
            WT_QM_FMA(0u, v0)
            WT_QM_FMA(1u, v1)
        }
    } else if (wt_decodes_groups(fmt)) {
        // A group of 32 values per lane, decoded once for all the rows the warp carries.
        for (u32 g = lane; g < k / 32u; g += 32u) {
            float v[32];
            wt_decode_group(fmt, wrow, g, v);
            const float* a = act + (u64)i0 * k + 32u * g;
            _Pragma("unroll") for (u32 t = 0; t < 32u; ++t) {
                WT_QM_FMA(t, v[t])
            }
        }
    } else {
        const float* a = act + (u64)i0 * k;
        for (u32 p = lane; p < k; p += 32u) {
            float v = wt_row_value(fmt, wrow, p);
            WT_QM_FMA(p, v)
        }
    }
    _Pragma("unroll") for (u32 r = 0; r < WT_QM_ROWS; ++r) {
        float total = wt_warp_sum(acc[r]);
        if (lane == 0u && r < rows) out[(u64)(i0 + r) * n + j] = total;
    }
}
#undef WT_QM_FMA

// out[i, j] = Σ_p trit(w[j, p]) · x[i, p] exactly (i32, wrapping like the reference's cast).
extern "C" __global__ void ternary_dot(int* out, const u8* w, const i8* x, u32 fmt, u32 m, u32 n,
                                       u32 k) {
    u64 o = (u64)blockIdx.x * (blockDim.x / 32u) + threadIdx.x / 32u;
    u32 lane = threadIdx.x & 31u;
    if (o >= (u64)m * n) return;
    u64 i = o / n, j = o % n;
    const u8* wrow = w + j * (u64)(k / 256u) * wt_block_bytes(fmt);
    const i8* xrow = x + i * k;
    u32 acc = 0u;
    for (u32 p = lane; p < k; p += 32u) {
        const u8* blk = wrow + (u64)(p / 256u) * wt_block_bytes(fmt);
        acc += (u32)(wt_block_int(fmt, blk, p % 256u) * (int)xrow[p]);
    }
    for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    if (lane == 0u) out[o] = (int)acc;
}
