// OpSpec::Sample: one token per row of logits, as SampleParams defines it. One block per row.
//
// The kept set is always {x_i ≥ threshold}. Top-k's threshold (the k-th largest value) and
// top-p's (the largest value whose kept weights from it upwards reach top_p of the total) are
// found by bisection over the order-preserving integer keys of the f32 values, each step one
// block-wide count or weight sum, so nothing is sorted. Weights and sums are f64 like the
// reference; sums run in another order, so results may differ only where a sum is within
// rounding of a cut.

// Order-preserving map of f32 (not NaN) to u32, and back.
__device__ __forceinline__ u32 wt_key(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float wt_unkey(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Sum of doubles over the block; every thread gets the total. `scratch`: 32 doubles.
__device__ double wt_block_sum_d(double v, double* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

// Smallest index whose value is `v` (first occurrence), over the block.
__device__ u32 wt_block_first(const float* x, u32 n, float v, u32* scratch_u) {
    u32 best = 0xffffffffu;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        if (x[i] == v && i < best) best = i;
    }
    for (int o = 16; o > 0; o >>= 1) best = min(best, __shfl_xor_sync(0xffffffffu, best, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch_u[threadIdx.x >> 5] = best;
    __syncthreads();
    u32 t = (threadIdx.x & 31) < (blockDim.x >> 5) ? scratch_u[threadIdx.x & 31] : 0xffffffffu;
    for (int o = 16; o > 0; o >>= 1) t = min(t, __shfl_xor_sync(0xffffffffu, t, o));
    return t;
}

#define SAMPLE_THREADS 256

extern "C" __global__ void sample_f32(u32* out, const float* logits, const float* uniform,
                                      u32 vocab, float temperature, u32 top_k, float top_p) {
    __shared__ double sd[32];
    __shared__ u32 su[32];
    __shared__ double chunk_sum[SAMPLE_THREADS];
    __shared__ u32 chunk_last[SAMPLE_THREADS];
    const float* x = logits + (u64)blockIdx.x * vocab;
    const float inf = __int_as_float(0x7f800000);

    // Largest and smallest non-NaN values, and how many there are.
    float mx = -inf, mn = inf;
    double n_local = 0.0;
    for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (!wt_isnan(v)) {
            mx = fmaxf(mx, v);
            mn = fminf(mn, v);
            n_local += 1.0;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    }
    __shared__ float smx[32], smn[32];
    if ((threadIdx.x & 31) == 0) {
        smx[threadIdx.x >> 5] = mx;
        smn[threadIdx.x >> 5] = mn;
    }
    double n = wt_block_sum_d(n_local, sd);  // (synchronises the writes above)
    mx = -inf;
    mn = inf;
    for (u32 w = 0; w < (blockDim.x >> 5); ++w) {
        mx = fmaxf(mx, smx[w]);
        mn = fminf(mn, smn[w]);
    }
    if (n == 0.0) {
        if (threadIdx.x == 0) out[blockIdx.x] = 0u;
        return;
    }
    u32 first = wt_block_first(x, vocab, mx, su);
    bool greedy = !(temperature > 0.0f && temperature <= 3.4028234663852886e38f);
    if (greedy || mx == inf) {
        if (threadIdx.x == 0) out[blockIdx.x] = first;
        return;
    }
    double t = (double)temperature;
#define WEIGHT(v) exp(((double)(v) - (double)mx) / t)

    float threshold = mn;
    if (top_k > 0u && (double)top_k < n) {
        // The largest key K with at least top_k values ≥ K is the k-th largest value's.
        u32 lo = wt_key(mn), hi = wt_key(mx);
        while (lo < hi) {
            u32 mid = lo + (u32)(((u64)hi - lo + 1u) / 2u);
            float tv = wt_unkey(mid);
            double c = 0.0;
            for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) c += x[i] >= tv ? 1.0 : 0.0;
            if (wt_block_sum_d(c, sd) >= (double)top_k) lo = mid; else hi = mid - 1u;
        }
        threshold = wt_unkey(lo);
    }
    if (top_p < 1.0f) {
        double total = 0.0;
        for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
            if (x[i] >= threshold) total += WEIGHT(x[i]);
        }
        total = wt_block_sum_d(total, sd);
        double goal = (double)fmaxf(top_p, 0.0f) * total;
        // The largest value whose kept weights from it upwards reach the goal.
        u32 lo = wt_key(threshold), hi = wt_key(mx);
        while (lo < hi) {
            u32 mid = lo + (u32)(((u64)hi - lo + 1u) / 2u);
            float tv = wt_unkey(mid);
            double s = 0.0;
            for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
                if (x[i] >= tv && x[i] >= threshold) s += WEIGHT(x[i]);
            }
            if (wt_block_sum_d(s, sd) >= goal) lo = mid; else hi = mid - 1u;
        }
        threshold = wt_unkey(lo);
    }

    // Draw in index order: each thread sums one contiguous chunk, thread 0 finds the chunk
    // where the running sum passes u · W, then walks it.
    u32 chunk = (vocab + blockDim.x - 1u) / blockDim.x;
    u32 begin = threadIdx.x * chunk, end = min(begin + chunk, vocab);
    double s = 0.0;
    u32 last = 0xffffffffu;
    for (u32 i = begin; i < end; ++i) {
        if (x[i] >= threshold) {
            s += WEIGHT(x[i]);
            last = i;
        }
    }
    chunk_sum[threadIdx.x] = s;
    chunk_last[threadIdx.x] = last;
    double total = wt_block_sum_d(s, sd);
    if (threadIdx.x != 0) return;
    double target = (double)uniform[blockIdx.x] * total;
    double run = 0.0;
    u32 pick = 0xffffffffu;
    for (u32 c = 0; c < blockDim.x && pick == 0xffffffffu; ++c) {
        if (run + chunk_sum[c] > target) {
            u32 b = c * chunk, e = min(b + chunk, vocab);
            for (u32 i = b; i < e; ++i) {
                if (x[i] >= threshold) {
                    run += WEIGHT(x[i]);
                    if (run > target) {
                        pick = i;
                        break;
                    }
                }
            }
            if (pick == 0xffffffffu) pick = chunk_last[c];
        } else {
            run += chunk_sum[c];
        }
    }
    if (pick == 0xffffffffu) {
        // Rounding left no index past u · W: the last kept one.
        for (u32 c = blockDim.x; c > 0; --c) {
            if (chunk_last[c - 1] != 0xffffffffu) {
                pick = chunk_last[c - 1];
                break;
            }
        }
    }
    out[blockIdx.x] = pick == 0xffffffffu ? first : pick;
#undef WEIGHT
}
