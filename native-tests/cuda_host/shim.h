// Runs the CUDA C kernels of src/backend/cuda/kernels on the CPU, for a machine without a GPU.
//
// Each CUDA thread of a block is an OS thread; blocks run one after another, so `__shared__`
// (made `static`) is the block's shared memory. `__syncthreads` is a barrier over the block,
// `__shfl_xor_sync` an exchange through a slot per thread between two barriers over the warp.
// A thread that returns leaves both barriers, as an exited thread does on a GPU. The
// intrinsics that round (`__fmul_rn`, ...) are plain IEEE operations; the file is compiled
// with -ffp-contract=off so nothing is fused that the kernel did not fuse with fmaf.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <barrier>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct wt_dim3 {
    unsigned x, y, z;
};
static thread_local wt_dim3 threadIdx, blockIdx;
static wt_dim3 blockDim, gridDim;

static std::barrier<>* wt_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>>* wt_warp_barriers;
static uint64_t wt_slots[1024];

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

using std::max;
using std::min;

static inline void __syncthreads() { wt_block_barrier->arrive_and_wait(); }

template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int offset) {
    unsigned t = threadIdx.x;
    auto& warp = *(*wt_warp_barriers)[t / 32];
    memcpy(&wt_slots[t], &v, sizeof(T));
    warp.arrive_and_wait();
    T r;
    memcpy(&r, &wt_slots[t ^ (unsigned)offset], sizeof(T));
    warp.arrive_and_wait();
    return r;
}

template <typename To, typename From>
static inline To wt_bits(From v) {
    To r;
    memcpy(&r, &v, sizeof(To));
    return r;
}
static inline float __int_as_float(int v) { return wt_bits<float>(v); }
static inline float __uint_as_float(unsigned v) { return wt_bits<float>(v); }
static inline unsigned __float_as_uint(float v) { return wt_bits<unsigned>(v); }
static inline int __float_as_int(float v) { return wt_bits<int>(v); }
static inline double __longlong_as_double(long long v) { return wt_bits<double>(v); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsub_rn(float a, float b) { return a - b; }

// Runs `kernel` over a (gx, gy, gz) grid of blocks of `bx` threads.
static void wt_emulate(unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       const std::function<void()>& kernel) {
    blockDim = {bx, 1, 1};
    gridDim = {gx, gy, gz};
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                std::barrier<> block(bx);
                std::vector<std::unique_ptr<std::barrier<>>> warps;
                for (unsigned w = 0; w < bx / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
                wt_block_barrier = &block;
                wt_warp_barriers = &warps;
                std::vector<std::thread> threads;
                for (unsigned t = 0; t < bx; ++t) {
                    threads.emplace_back([&, t] {
                        threadIdx = {t, 0, 0};
                        blockIdx = {x, y, z};
                        kernel();
                        (void)warps[t / 32]->arrive_and_drop();
                        (void)block.arrive_and_drop();
                    });
                }
                for (auto& th : threads) th.join();
            }
}
