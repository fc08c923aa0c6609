// The group decoder, prepended (after common.cu) to every kernel source: llama.cpp's formats
// beyond Q8_0 and Q4_0 read 32 values at a time, every scale and minimum applied, for
// `dequantize` and the products of quant.cu and fused.cu (one decoder, no copy per kernel).
// The super-block formats Q2_K … Q6_K and IQ4_XS (256 values, eight groups a block; layouts of
// src/quant/kquants.rs) and the legacy 32-value Q4_1, Q5_0, Q5_1 and IQ4_NL (a group a block;
// src/quant/legacy.rs); and BF16, 32 values of two bytes (the host keeps its rows whole
// groups). Blocks are read byte by byte (most are not word-aligned).
//
// A group is read as 32 integers with a scale and a minimum per 16 values (a Q2_K, Q3_K or
// Q6_K group spans two sub-blocks of 16); value t is scale · q − min with the product and the
// difference each rounded to f32 (__fmul_rn, __fsub_rn: never fused into an FMA), the
// reference's and gguf-py's arithmetic, so dequantization is bit-exact with them. Q4_1 and
// Q5_1's `d · q + m` is `d · q − (−m)` exactly; the formats without a minimum subtract 0, which
// leaves every f32 as it is.

// Whether `fmt` is one of the formats decoded here.
__device__ __forceinline__ bool wt_decodes_groups(u32 fmt) {
    switch (fmt) {
        case FMT_Q2_K:
        case FMT_Q3_K:
        case FMT_Q4_K:
        case FMT_Q5_K:
        case FMT_Q6_K:
        case FMT_IQ4_XS:
        case FMT_Q4_1:
        case FMT_Q5_0:
        case FMT_Q5_1:
        case FMT_IQ4_NL:
        case FMT_BF16: return true;
        default: return false;
    }
}

// A group as integers: value t is scale[t / 16] · q[t] − min[t / 16].
struct WtGroupInts {
    int q[32];
    float scale[2];
    float min[2];
};

// Level n (0..16) of IQ4_NL and IQ4_XS (IQ4_NL_LEVELS of src/quant/legacy.rs: −127, −104, −83,
// −65, −49, −35, −22, −10, 1, 13, 25, 38, 53, 69, 89, 113), kept as signed bytes four to a word
// (level n is byte n % 4 of word n / 4), as shaders/kquants/decode.wgsl keeps them.
__device__ __forceinline__ int wt_iq4_level(u32 n) {
    const u32 levels[4] = {0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u};
    return (int)(i8)(u8)(levels[(n & 15u) >> 2] >> (8u * (n & 3u)));
}

// Nibble t of 32 packed in the 16 bytes `qs`: value t < 16 is the low nibble of byte t, value
// t ≥ 16 the high nibble of byte t − 16 (Q4_0's layout, which the legacy formats share).
__device__ __forceinline__ u32 wt_nibble(const u8* qs, u32 t) {
    return t < 16u ? qs[t] & 15u : (u32)qs[t - 16u] >> 4;
}

// One scale and minimum for the whole group (a 32-value sub-block or legacy block).
__device__ __forceinline__ void wt_group_scale(WtGroupInts* g, float scale, float min) {
    g->scale[0] = g->scale[1] = scale;
    g->min[0] = g->min[1] = min;
}

// Sub-block j's scale d · sc and minimum dmin · mn of the Q4_K or Q5_K super-block at `p`: d
// and dmin first, then the 6-bit scales and minimums packed in 12 bytes (`scales_mins_k4`).
__device__ void wt_k4_scale_min(const u8* p, u32 j, WtGroupInts* g) {
    const u8* s = p + 4;
    u32 sc, mn;
    if (j < 4u) {
        sc = s[j] & 63u;
        mn = s[j + 4u] & 63u;
    } else {
        sc = (s[j + 4u] & 15u) | (((u32)s[j - 4u] >> 6) << 4);
        mn = ((u32)s[j + 4u] >> 4) | (((u32)s[j] >> 6) << 4);
    }
    wt_group_scale(g, __fmul_rn(wt_read_f16(p), (float)sc), __fmul_rn(wt_read_f16(p + 2), (float)mn));
}

// Scale i (of 16) of the Q3_K super-block at `p` as d · (s − 32): s's low four bits are nibble
// i / 8 of scale byte i % 8, its top two bits 2(i / 4).. of scale byte 8 + i % 4 (the 12
// scale bytes follow hmask and qs, the f16 d follows them).
__device__ __forceinline__ float wt_q3_k_scale(const u8* p, u32 i) {
    u32 low = ((u32)p[96u + i % 8u] >> (4u * (i / 8u))) & 15u;
    u32 high = ((u32)p[104u + i % 4u] >> (2u * (i / 4u))) & 3u;
    return __fmul_rn(wt_read_f16(p + 108), (float)((int)(low | (high << 4)) - 32));
}

// Group j (values 32j..32j + 32) of the block of `fmt` at `p` as integers, scales and minimums.
__device__ void wt_group_ints(u32 fmt, const u8* p, u32 j, WtGroupInts* g) {
    switch (fmt) {
        case FMT_Q2_K: {
            // scales[16] (scale low nibble, minimum high nibble, per 16 values), qs[64], d,
            // dmin. Group j is bits 2(j % 4).. of qs bytes 32(j / 4)...
            float d = wt_read_f16(p + 80), dmin = wt_read_f16(p + 82);
            for (u32 h = 0; h < 2u; ++h) {
                u32 s = p[2u * j + h];
                g->scale[h] = __fmul_rn(d, (float)(s & 15u));
                g->min[h] = __fmul_rn(dmin, (float)(s >> 4));
            }
            for (u32 t = 0; t < 32u; ++t) g->q[t] = ((u32)p[16u + 32u * (j / 4u) + t] >> (2u * (j % 4u))) & 3u;
            return;
        }
        case FMT_Q3_K: {
            // hmask[32], qs[64], scales[12], d: Q2_K's two bits, less 4 where bit j of
            // hmask byte t is clear.
            for (u32 h = 0; h < 2u; ++h) {
                g->scale[h] = wt_q3_k_scale(p, 2u * j + h);
                g->min[h] = 0.0f;
            }
            for (u32 t = 0; t < 32u; ++t) {
                int low = (int)(((u32)p[32u + 32u * (j / 4u) + t] >> (2u * (j % 4u))) & 3u);
                g->q[t] = low - 4 * (int)((((u32)p[t] >> j) & 1u) ^ 1u);
            }
            return;
        }
        case FMT_Q4_K: {
            // d, dmin, scales[12], qs[128]: nibble half j % 2 of qs bytes 32(j / 2)...
            wt_k4_scale_min(p, j, g);
            for (u32 t = 0; t < 32u; ++t) g->q[t] = ((u32)p[16u + 32u * (j / 2u) + t] >> (4u * (j % 2u))) & 15u;
            return;
        }
        case FMT_Q5_K: {
            // d, dmin, scales[12], qh[32], qs[128]: Q4_K's nibble plus 16 · bit j of qh byte t.
            wt_k4_scale_min(p, j, g);
            for (u32 t = 0; t < 32u; ++t) {
                u32 low = ((u32)p[48u + 32u * (j / 2u) + t] >> (4u * (j % 2u))) & 15u;
                g->q[t] = (int)(low | ((((u32)p[16u + t] >> j) & 1u) << 4));
            }
            return;
        }
        case FMT_Q6_K: {
            // ql[128], qh[64], scales[16] (int8, per 16 values), d. Group j is half c = j / 4,
            // part l = j % 4: nibble half l / 2 of ql bytes 64c + 32(l % 2).., bits 2l.. of qh
            // bytes 32c.. as the top two bits, minus 32.
            float d = wt_read_f16(p + 208);
            u32 c = j / 4u, l = j % 4u;
            for (u32 h = 0; h < 2u; ++h) {
                g->scale[h] = __fmul_rn(d, (float)(int)(i8)p[192u + 2u * j + h]);
                g->min[h] = 0.0f;
            }
            for (u32 t = 0; t < 32u; ++t) {
                u32 low = ((u32)p[64u * c + 32u * (l % 2u) + t] >> (4u * (l / 2u))) & 15u;
                u32 high = ((u32)p[128u + 32u * c + t] >> (2u * l)) & 3u;
                g->q[t] = (int)(low | (high << 4)) - 32;
            }
            return;
        }
        case FMT_IQ4_XS: {
            // d, scales_h (u16), scales_l[4], qs[128]: sub-block j's levels are the nibbles of
            // qs bytes 16j.., its scale d · (s − 32) with s's low four bits nibble j % 2 of
            // scales_l byte j / 2 and its top two bits 2j.. of scales_h.
            u32 low = ((u32)p[4u + j / 2u] >> (4u * (j % 2u))) & 15u;
            u32 high = (((u32)p[2] | ((u32)p[3] << 8)) >> (2u * j)) & 3u;
            wt_group_scale(g, __fmul_rn(wt_read_f16(p), (float)((int)(low | (high << 4)) - 32)), 0.0f);
            for (u32 t = 0; t < 32u; ++t) g->q[t] = wt_iq4_level(wt_nibble(p + 8u + 16u * j, t));
            return;
        }
        case FMT_Q4_1: {
            // d, m, 16 bytes of nibbles: d · q + m.
            wt_group_scale(g, wt_read_f16(p), -wt_read_f16(p + 2));
            for (u32 t = 0; t < 32u; ++t) g->q[t] = (int)wt_nibble(p + 4, t);
            return;
        }
        case FMT_Q5_1: {
            // d, m, qh (bit t is value t's fifth bit), 16 bytes of nibbles: d · q + m.
            wt_group_scale(g, wt_read_f16(p), -wt_read_f16(p + 2));
            u32 qh = wt_read_u32(p + 4);
            for (u32 t = 0; t < 32u; ++t) g->q[t] = (int)(wt_nibble(p + 8, t) | (((qh >> t) & 1u) << 4));
            return;
        }
        case FMT_Q5_0: {
            // d, qh, 16 bytes of nibbles: d · (q − 16).
            wt_group_scale(g, wt_read_f16(p), 0.0f);
            u32 qh = wt_read_u32(p + 2);
            for (u32 t = 0; t < 32u; ++t) g->q[t] = (int)(wt_nibble(p + 6, t) | (((qh >> t) & 1u) << 4)) - 16;
            return;
        }
        default: {
            // IQ4_NL: d, 16 bytes of level indices: d · level.
            wt_group_scale(g, wt_read_f16(p), 0.0f);
            for (u32 t = 0; t < 32u; ++t) g->q[t] = wt_iq4_level(wt_nibble(p + 2, t));
            return;
        }
    }
}

// Group g (values 32g..32g + 32) of the data of `fmt` (one wt_decodes_groups names) starting
// at `row` into `v`, as dequantize defines the values. `row` is the first block of a row, or of
// a whole tensor (its rows are whole blocks).
__device__ void wt_decode_group(u32 fmt, const u8* row, u64 g, float* v) {
    if (fmt == FMT_BF16) {
        // A bfloat16 is the high half of its f32; the group is 64 bytes from byte 64g.
        const u8* p = row + 64u * g;
        _Pragma("unroll") for (u32 t = 0; t < 32u; ++t) {
            v[t] = __uint_as_float(((u32)p[2u * t] | ((u32)p[2u * t + 1u] << 8)) << 16);
        }
        return;
    }
    u32 per = wt_block_len(fmt) / 32u;
    WtGroupInts gi;
    wt_group_ints(fmt, row + (g / per) * wt_block_bytes(fmt), (u32)(g % per), &gi);
    _Pragma("unroll") for (u32 t = 0; t < 32u; ++t) {
        v[t] = __fsub_rn(__fmul_rn(gi.scale[t / 16u], (float)gi.q[t]), gi.min[t / 16u]);
    }
}
