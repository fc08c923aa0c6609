// Shared prelude, prepended to every kernel source before NVRTC compiles it (NVRTC gets no
// include paths: everything here is self-contained, no CUDA headers needed).
//
// Sizes arrive as 32-bit unsigned ints (the backend refuses larger tensors); indices that can
// pass 2^32 when multiplied are widened to 64 bits first.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;
typedef signed char i8;

#define WT_NAN __int_as_float(0x7fc00000)

// Global index of this thread in a 1-D grid.
__device__ __forceinline__ u64 wt_gid() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ bool wt_isnan(float x) {
    return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u;
}

// IEEE binary16 bits -> f32 (exact).
__device__ float wt_f16_to_f32(unsigned short h) {
    u32 sign = ((u32)h & 0x8000u) << 16;
    u32 exp = ((u32)h >> 10) & 0x1fu;
    u32 man = (u32)h & 0x3ffu;
    if (exp == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (man << 13));
    }
    if (exp == 0u) {
        // Zero or subnormal: man · 2^-24, exact in f32.
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// f32 -> IEEE binary16 bits, rounded to nearest even (as the `half` crate does).
__device__ unsigned short wt_f32_to_f16(float value) {
    u32 x = __float_as_uint(value);
    u32 sign = x & 0x80000000u;
    u32 exp = x & 0x7f800000u;
    u32 man = x & 0x007fffffu;
    u32 hsign = sign >> 16;
    if (exp == 0x7f800000u) {
        u32 nan_bit = man == 0u ? 0u : 0x0200u;
        return (unsigned short)(hsign | 0x7c00u | nan_bit | (man >> 13));
    }
    int half_exp = (int)(exp >> 23) - 127 + 15;
    if (half_exp >= 0x1f) {
        return (unsigned short)(hsign | 0x7c00u);
    }
    if (half_exp <= 0) {
        if (14 - half_exp > 24) {
            return (unsigned short)hsign;
        }
        u32 m = man | 0x00800000u;
        u32 half_man = m >> (14 - half_exp);
        u32 round_bit = 1u << (13 - half_exp);
        if ((m & round_bit) != 0u && (m & (3u * round_bit - 1u)) != 0u) {
            half_man += 1u;
        }
        return (unsigned short)(hsign | half_man);
    }
    u32 bits = hsign | ((u32)half_exp << 10) | (man >> 13);
    u32 round_bit = 0x00001000u;
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) {
        bits += 1u;
    }
    return (unsigned short)bits;
}

// Reads the little-endian f16 at `p` (any alignment).
__device__ __forceinline__ float wt_read_f16(const u8* p) {
    return wt_f16_to_f32((unsigned short)(p[0] | (p[1] << 8)));
}

// Sum over a warp (every lane gets the total).
__device__ __forceinline__ float wt_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over a block of `blockDim.x` threads (a multiple of 32, at most 1024); every thread gets
// the total. `scratch` holds 32 floats of shared memory.
__device__ float wt_block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = wt_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int warps = blockDim.x >> 5;
    float t = lane < warps ? scratch[lane] : 0.0f;
    return wt_warp_sum(t);
}

// Maximum that propagates NaN (fmaxf would drop it).
__device__ __forceinline__ float wt_max_nan(float a, float b) {
    if (wt_isnan(a) || wt_isnan(b)) return WT_NAN;
    return a > b ? a : b;
}

// Maximum over a block, NaN-propagating; every thread gets the result.
__device__ float wt_block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = wt_max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int warps = blockDim.x >> 5;
    float t = lane < warps ? scratch[lane] : -__int_as_float(0x7f800000);
    for (int o = 16; o > 0; o >>= 1) t = wt_max_nan(t, __shfl_xor_sync(0xffffffffu, t, o));
    return t;
}

// Rust's saturating `f32 as i32` (NaN -> 0), so rounded values cast as the reference casts them.
__device__ __forceinline__ int wt_sat_int(float v, int lo, int hi) {
    if (wt_isnan(v)) return 0;
    if (v <= (float)lo) return lo;
    if (v >= (float)hi) return hi;
    return (int)v;
}

// ---- llama.cpp's Q8_K activation rounding (quantize_q8_k of src/quant), per 256 values: from
// the signed value of largest magnitude `max` (the first on ties; 0 when every value is 0 or
// NaN), iscale = −127 / max, each q = min(127, round_half_even(x · iscale)), d = 1 / iscale, all
// in f32; a block of zeros has d = 0. Used by quant.cu's qmatmul_act and fused.cu.

// One step of the scan for `max` in index order: v replaces it where its magnitude is larger
// (a NaN never is).
__device__ __forceinline__ void wt_signed_max_step(float v, float* amax, float* max) {
    if (fabsf(v) > *amax) {
        *amax = fabsf(v);
        *max = v;
    }
}

// iscale of a block whose signed largest value is `max` (0 for a block of zeros).
__device__ __forceinline__ float wt_q8_k_iscale(float max) {
    return max == 0.0f ? 0.0f : __fdiv_rn(-127.0f, max);
}

// d of a block whose signed largest value is `max`, from its iscale `is`.
__device__ __forceinline__ float wt_q8_k_scale(float max, float is) {
    return max == 0.0f ? 0.0f : __fdiv_rn(1.0f, is);
}

// The int8 value of v with the block's iscale `is` (Rust's saturating casts: NaN gives 0).
__device__ __forceinline__ i8 wt_round_q8_k(float v, float is) {
    return (i8)wt_sat_int(rintf(__fmul_rn(v, is)), -128, 127);
}

// ---- Block formats (src/quant): readers shared by quant.cu and fused.cu ----

__device__ __forceinline__ u32 wt_block_len(u32 fmt) {
    switch (fmt) {
        case FMT_F16: return F16_BLOCK_LEN;
        case FMT_BF16: return BF16_BLOCK_LEN;
        case FMT_Q8_0: return Q8_0_BLOCK_LEN;
        case FMT_Q4_0: return Q4_0_BLOCK_LEN;
        case FMT_TQ1_0: return TQ1_0_BLOCK_LEN;
        case FMT_TQ2_0: return TQ2_0_BLOCK_LEN;
        case FMT_Q2_K: return Q2_K_BLOCK_LEN;
        case FMT_Q3_K: return Q3_K_BLOCK_LEN;
        case FMT_Q4_K: return Q4_K_BLOCK_LEN;
        case FMT_Q5_K: return Q5_K_BLOCK_LEN;
        case FMT_Q6_K: return Q6_K_BLOCK_LEN;
        case FMT_IQ4_XS: return IQ4_XS_BLOCK_LEN;
        case FMT_Q4_1: return Q4_1_BLOCK_LEN;
        case FMT_Q5_0: return Q5_0_BLOCK_LEN;
        case FMT_Q5_1: return Q5_1_BLOCK_LEN;
        case FMT_IQ4_NL: return IQ4_NL_BLOCK_LEN;
        default: return TERNARY_PLANES_BLOCK_LEN;
    }
}

__device__ __forceinline__ u32 wt_block_bytes(u32 fmt) {
    switch (fmt) {
        case FMT_F16: return F16_BLOCK_BYTES;
        case FMT_BF16: return BF16_BLOCK_BYTES;
        case FMT_Q8_0: return Q8_0_BLOCK_BYTES;
        case FMT_Q4_0: return Q4_0_BLOCK_BYTES;
        case FMT_TQ1_0: return TQ1_0_BLOCK_BYTES;
        case FMT_TQ2_0: return TQ2_0_BLOCK_BYTES;
        case FMT_Q2_K: return Q2_K_BLOCK_BYTES;
        case FMT_Q3_K: return Q3_K_BLOCK_BYTES;
        case FMT_Q4_K: return Q4_K_BLOCK_BYTES;
        case FMT_Q5_K: return Q5_K_BLOCK_BYTES;
        case FMT_Q6_K: return Q6_K_BLOCK_BYTES;
        case FMT_IQ4_XS: return IQ4_XS_BLOCK_BYTES;
        case FMT_Q4_1: return Q4_1_BLOCK_BYTES;
        case FMT_Q5_0: return Q5_0_BLOCK_BYTES;
        case FMT_Q5_1: return Q5_1_BLOCK_BYTES;
        case FMT_IQ4_NL: return IQ4_NL_BLOCK_BYTES;
        default: return TERNARY_PLANES_BLOCK_BYTES;
    }
}

__device__ __forceinline__ u32 wt_read_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Trit n (0 = most significant) of a TQ1_0 byte: ((byte · 3^n) mod 256) · 3 >> 8, minus 1.
__device__ __forceinline__ int wt_tq1_trit(u8 byte, u32 n) {
    const u32 pow3[5] = {1u, 3u, 9u, 27u, 81u};
    u32 q = ((u32)byte * pow3[n]) & 0xffu;
    return (int)((q * 3u) >> 8) - 1;
}

// The integer value `v` (0 ≤ v < block length) of the block at `p`; the value is d · q.
__device__ int wt_block_int(u32 fmt, const u8* p, u32 v) {
    switch (fmt) {
        case FMT_Q8_0: return (int)(i8)p[2 + v];
        case FMT_Q4_0: {
            u8 b = p[2 + (v & 15u)];
            return v < 16u ? (int)(b & 15u) - 8 : (int)(b >> 4) - 8;
        }
        case FMT_TQ1_0:
            if (v < 160u) return wt_tq1_trit(p[v % 32u], v / 32u);
            if (v < 240u) return wt_tq1_trit(p[32u + (v - 160u) % 16u], (v - 160u) / 16u);
            return wt_tq1_trit(p[48u + (v - 240u) % 4u], (v - 240u) / 4u);
        case FMT_TQ2_0: {
            u32 c = v / 128u, l = (v % 128u) / 32u, m = v % 32u;
            return (int)((p[32u * c + m] >> (2u * l)) & 3u) - 1;
        }
        default: {
            u32 bit = 1u << (v % 32u);
            int plus = (wt_read_u32(p + 4u + 4u * (v / 32u)) & bit) != 0u;
            int minus = (wt_read_u32(p + 36u + 4u * (v / 32u)) & bit) != 0u;
            return plus - minus;
        }
    }
}

// The scale d of the block at `p` (not for F16).
__device__ float wt_block_scale(u32 fmt, const u8* p) {
    switch (fmt) {
        case FMT_Q8_0:
        case FMT_Q4_0: return wt_read_f16(p);
        case FMT_TQ1_0: return wt_read_f16(p + 52);
        case FMT_TQ2_0: return wt_read_f16(p + 64);
        default: return __uint_as_float(wt_read_u32(p));
    }
}

// Value `v` of a row of `fmt` data starting at `row`, as dequantize defines it (d · q in f32).
__device__ __forceinline__ float wt_row_value(u32 fmt, const u8* row, u32 v) {
    if (fmt == FMT_F16) return wt_read_f16(row + 2u * v);
    u32 len = wt_block_len(fmt);
    const u8* p = row + (u64)(v / len) * wt_block_bytes(fmt);
    return __fmul_rn((float)wt_block_int(fmt, p, v % len), wt_block_scale(fmt, p));
}
