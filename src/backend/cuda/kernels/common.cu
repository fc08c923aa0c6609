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
