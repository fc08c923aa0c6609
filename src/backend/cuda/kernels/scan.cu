// Scans along the middle axis of an [outer, len, inner] view: OpSpec::Scan (linear, its
// adjoint, log_cumprod, logcumsumexp), ScanGradA, ScanGradInit.
// One thread per channel (outer · inner of them) walks its steps in order in f64, so the
// result is the sequential definition itself rather than a reassociated parallel scan.

// Flat index of step t of channel c.
__device__ __forceinline__ u64 wt_at(u64 c, u64 t, u32 len, u32 inner) {
    return ((c / inner) * len + t) * inner + (c % inner);
}

// op: 0 linear (a, b, h0), 1 linear adjoint (a, grad), 2 log_cumprod (a), 3 logcumsumexp (x).
extern "C" __global__ void scan_f32(float* out, const float* x0, const float* x1,
                                    const float* x2, u32 op, u32 channels, u32 len, u32 inner) {
    u64 c = wt_gid();
    if (c >= channels) return;
    if (op == 0u) {
        double h = (double)x2[c];
        for (u32 t = 0; t < len; ++t) {
            u64 i = wt_at(c, t, len, inner);
            h = (double)x0[i] * h + (double)x1[i];
            out[i] = (float)h;
        }
    } else if (op == 1u) {
        double g = 0.0;
        for (u32 s = len; s > 0; --s) {
            u32 t = s - 1u;
            double next = t + 1u < len ? (double)x0[wt_at(c, t + 1u, len, inner)] : 0.0;
            u64 i = wt_at(c, t, len, inner);
            g = (double)x1[i] + next * g;
            out[i] = (float)g;
        }
    } else if (op == 2u) {
        double sum = 0.0;
        for (u32 t = 0; t < len; ++t) {
            u64 i = wt_at(c, t, len, inner);
            sum += log((double)x0[i]);
            out[i] = (float)exp(sum);
        }
    } else {
        // The running sum is s · e^m.
        const double neg_inf = -__longlong_as_double(0x7ff0000000000000ll);
        double m = neg_inf, s = 0.0;
        for (u32 t = 0; t < len; ++t) {
            u64 i = wt_at(c, t, len, inner);
            double v = (double)x0[i];
            if (v > m) {
                s = s * exp(m - v) + 1.0;
                m = v;
            } else if (v != neg_inf || v != v) {
                // (−∞ adds nothing; NaN poisons the sum.)
                s += exp(v - m);
            }
            out[i] = (float)(m + log(s));
        }
    }
}

// ScanGradA: out_t = g_t · h_{t−1} (h_{−1} = h0), one thread per element.
extern "C" __global__ void scan_grad_a(float* out, const float* g, const float* h,
                                       const float* h0, u32 total, u32 len, u32 inner) {
    u64 i = wt_gid();
    if (i >= total) return;
    u64 t = (i / inner) % len;
    u64 c = (i / ((u64)inner * len)) * inner + i % inner;
    double prev = t == 0 ? (double)h0[c] : (double)h[i - inner];
    out[i] = (float)((double)g[i] * prev);
}

// ScanGradInit: out_c = a_0 · g_0 per channel.
extern "C" __global__ void scan_grad_init(float* out, const float* a, const float* g,
                                          u32 channels, u32 len, u32 inner) {
    u64 c = wt_gid();
    if (c >= channels) return;
    u64 i = wt_at(c, 0, len, inner);
    out[c] = (float)((double)a[i] * (double)g[i]);
}
