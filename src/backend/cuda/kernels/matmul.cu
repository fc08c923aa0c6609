// OpSpec::Matmul: out[b] = a[b] · op(rhs[b]), f32 with f32 accumulation.
// 64×64 output tiles per 256-thread block, each thread a 4×4 micro-tile; K in steps of 16
// through shared memory. Grid: (ceil(n/64), ceil(m/64), batch).

#define MM_TILE 64
#define MM_K 16

// rhs_transposed: rhs is [n, k] (a·bᵀ), else [k, n]. rhs_stride: elements between the rhs
// matrices of consecutive batches (0 when one rhs is shared).
extern "C" __global__ void matmul_f32(float* out, const float* a, const float* rhs, u32 m, u32 n,
                                      u32 k, u32 rhs_transposed, u64 rhs_stride) {
    __shared__ float as[MM_K][MM_TILE + 1];
    __shared__ float bs[MM_K][MM_TILE + 1];
    u64 batch = blockIdx.z;
    const float* A = a + batch * (u64)m * k;
    const float* B = rhs + batch * rhs_stride;
    float* C = out + batch * (u64)m * n;
    u32 row0 = blockIdx.y * MM_TILE, col0 = blockIdx.x * MM_TILE;
    u32 tx = threadIdx.x % 16u, ty = threadIdx.x / 16u;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (u32 k0 = 0; k0 < k; k0 += MM_K) {
        // Each of the 256 threads loads 4 elements of each 64×16 tile.
        for (u32 e = threadIdx.x; e < MM_TILE * MM_K; e += 256u) {
            u32 r = e / MM_K, kk = e % MM_K;
            u32 gr = row0 + r, gk = k0 + kk;
            as[kk][r] = (gr < m && gk < k) ? A[(u64)gr * k + gk] : 0.0f;
            u32 gc = col0 + r;
            float bv = 0.0f;
            if (gc < n && gk < k) {
                bv = rhs_transposed ? B[(u64)gc * k + gk] : B[(u64)gk * n + gc];
            }
            bs[kk][r] = bv;
        }
        __syncthreads();
        for (u32 kk = 0; kk < MM_K; ++kk) {
            float av[4], bv[4];
            for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16u * i];
            for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16u * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        u32 r = row0 + ty + 16u * i;
        if (r >= m) continue;
        for (int j = 0; j < 4; ++j) {
            u32 c = col0 + tx + 16u * j;
            if (c < n) C[(u64)r * n + c] = acc[i][j];
        }
    }
}

// m == 1 (a decode step): one warp per output column, lanes strided over k.
extern "C" __global__ void matvec_f32(float* out, const float* a, const float* rhs, u32 n, u32 k,
                                      u32 rhs_transposed, u64 rhs_stride) {
    u64 batch = blockIdx.y;
    u32 col = blockIdx.x * (blockDim.x / 32u) + threadIdx.x / 32u;
    u32 lane = threadIdx.x & 31u;
    if (col >= n) return;
    const float* A = a + batch * (u64)k;
    const float* B = rhs + batch * rhs_stride;
    float acc = 0.0f;
    for (u32 p = lane; p < k; p += 32u) {
        float w = rhs_transposed ? B[(u64)col * k + p] : B[(u64)p * n + col];
        acc = fmaf(A[p], w, acc);
    }
    acc = wt_warp_sum(acc);
    if (lane == 0u) out[batch * n + col] = acc;
}
