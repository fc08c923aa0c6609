#!/usr/bin/env python3
"""Runs the CUDA kernels on the CPU (shim.h) and checks their results, without a GPU.

Each `src/backend/cuda/kernels/*.cu` is compiled by g++ as C++ (the common prelude, the file,
and a generated `wt_launch_<kernel>(grid, block, void** args)` per kernel, the calling
convention of cuLaunchKernel), loaded with ctypes and launched with the grids the backend
uses (`src/backend/cuda/launcher.rs`). Results are compared with numpy and, for the block
formats, with gguf-py's reference quantizers byte for byte. This checks the kernels' logic
(indexing, reductions across threads and warps, rounding); the NVRTC test checks that they
compile for real GPUs. Exit status 1 on any mismatch.

Needs g++ (C++20), numpy and gguf (`pip install numpy gguf`). `emulate.py --build DIR` only
builds the libraries (DIR/<source>.so) for the Rust test in src/backend/cuda/emulated.rs.
"""

import ctypes
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "..", "..", "src", "backend", "cuda", "kernels")
BLOCK = 256
FAILURES = []


def build(name, tmp):
    """Compiles formats.cuh + common.cu + decode.cu + name with launch wrappers (the order of
    src/backend/cuda/sources.rs); returns the loaded library."""
    common = "".join(open(os.path.join(KERNELS, f)).read() for f in ("formats.cuh", "common.cu", "decode.cu"))
    body = open(os.path.join(KERNELS, name)).read()
    wrappers = []
    for kname, params in re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', body, re.S):
        types = [" ".join(p.split()[:-1]) for p in params.split(",")]
        args = ", ".join(f"*({t}*)a[{i}]" for i, t in enumerate(types))
        wrappers.append(f'extern "C" void wt_launch_{kname}(unsigned gx, unsigned gy, unsigned gz, '
                        f'unsigned bx, void** a) {{ wt_emulate(gx, gy, gz, bx, [&] {{ {kname}({args}); }}); }}')
    src = os.path.join(tmp, name + ".cpp")
    with open(src, "w") as f:
        f.write(common + "\n" + body + "\n" + "\n".join(wrappers) + "\n")
    lib = os.path.join(tmp, name + ".so")
    subprocess.run(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-pthread",
                    "-w", "-include", os.path.join(HERE, "shim.h"), src, "-o", lib], check=True)
    return ctypes.CDLL(lib)


def ptr(a):
    return ctypes.c_uint64(a.ctypes.data)


def u32(v):
    return ctypes.c_uint32(v)


def f32(v):
    return ctypes.c_float(v)


def u64(v):
    return ctypes.c_uint64(v)


def launch(lib, name, grid, args):
    if isinstance(grid, int):
        grid = (grid, 1, 1)
    arr = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    getattr(lib, "wt_launch_" + name)(*[ctypes.c_uint(g) for g in grid], ctypes.c_uint(BLOCK), arr)


def blocks(n):
    return (n + BLOCK - 1) // BLOCK


def check(what, got, want, tol=1e-5, exact=False):
    got, want = np.asarray(got), np.asarray(want)
    if exact:
        ok = got.shape == want.shape and np.array_equal(got, want)
        err = "differs" if not ok else ""
    else:
        scale = max(1.0, float(np.nanmax(np.abs(want))) if want.size else 1.0)
        nan_ok = np.array_equal(np.isnan(got), np.isnan(want))
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        worst = float(np.nanmax(diff)) if diff.size else 0.0
        ok = nan_ok and worst <= tol * scale
        err = f"max error {worst:.3g} (limit {tol * scale:.3g}), NaN places {'ok' if nan_ok else 'differ'}"
    print(("ok     " if ok else "FAILED ") + what + ("" if ok else ": " + err))
    if not ok:
        FAILURES.append(what)


rng = np.random.default_rng(7)


def uniform(*shape, scale=1.0):
    return (rng.uniform(-scale, scale, size=shape)).astype(np.float32)


def silu(x):
    x = x.astype(np.float64)
    return x / (1 + np.exp(-x))


def elementwise(lib):
    for n in [1, 3, 257, 4097]:
        x = uniform(n, scale=8)
        from math import erf, sqrt, tanh, pi
        want = {0: silu(x),
                1: np.array([0.5 * v * (1 + tanh(sqrt(2 / pi) * (v + 0.044715 * v ** 3))) for v in x.astype(float)]),
                2: np.array([0.5 * v * (1 + erf(v / sqrt(2))) for v in x.astype(float)]),
                3: x.astype(np.float64) * -0.37,
                4: 1 / (1 + np.exp(-x.astype(np.float64))),
                5: -0.37 * np.tanh(x.astype(np.float64) / -0.37)}
        for op, w in want.items():
            out = np.zeros(n, np.float32)
            launch(lib, "unary_f32", blocks(n), [ptr(out), ptr(x), u32(n), u32(op), f32(-0.37)])
            check(f"unary op {op} len {n}", out, w)
        b = uniform(7)
        a = uniform(7 * 37)
        for op, w in {0: a.reshape(37, 7) + b, 1: a.reshape(37, 7) * b,
                      2: silu(a.reshape(37, 7)) * b}.items():
            out = np.zeros(a.size, np.float32)
            launch(lib, "binary_f32", blocks(a.size), [ptr(out), ptr(a), ptr(b), u32(a.size), u32(7), u32(op)])
            check(f"binary op {op} broadcast", out, w.reshape(-1))
    table, ids = uniform(10, 5), np.array([3, 0, 11, 9], np.uint32)
    out = np.zeros(20, np.float32)
    launch(lib, "embedding_f32", blocks(20), [ptr(out), ptr(table), ptr(ids), u32(10), u32(5), u32(4)])
    want = np.array([table[i] if i < 10 else [np.nan] * 5 for i in ids]).reshape(-1)
    check("embedding (an id past the table gives NaN)", out, want)
    x = np.arange(2 * 3 * 4 * 5, dtype=np.uint32).reshape(2, 3, 4, 5)
    perm = (2, 0, 3, 1)
    want = x.transpose(perm)
    strides = [x.strides[p] // 4 for p in perm]
    out = np.zeros(x.size, np.uint32)
    dims = [1, 1] + list(want.shape)
    st = [0, 0] + strides
    launch(lib, "permute_u32", blocks(x.size), [ptr(out), ptr(x), u32(x.size)] + [u32(d) for d in dims] + [u32(s) for s in st])
    check("permute rank 4", out, want.reshape(-1), exact=True)
    a, b = np.arange(12, dtype=np.uint32).reshape(3, 4), np.arange(100, 106, dtype=np.uint32).reshape(3, 2)
    out = np.zeros(18, np.uint32)
    launch(lib, "concat_u32", blocks(18), [ptr(out), ptr(a), ptr(b), u32(3), u32(4), u32(2)])
    check("concat", out, np.concatenate([a, b], 1).reshape(-1), exact=True)
    out = np.zeros(6, np.uint32)
    launch(lib, "narrow_u32", blocks(6), [ptr(out), ptr(a), u32(3), u32(4), u32(1), u32(2)])
    check("narrow", out, a[:, 1:3].reshape(-1), exact=True)
    target = np.zeros((5, 3), np.uint32)
    src = np.arange(9, dtype=np.uint32).reshape(3, 3) + 1
    slots = np.array([4, 7, 1], np.uint32)
    launch(lib, "scatter_rows_u32", blocks(9), [ptr(target), ptr(src), ptr(slots), u32(5), u32(3), u32(3)])
    want = np.zeros((5, 3), np.uint32)
    want[4], want[1] = src[0], src[2]
    check("scatter_rows (a slot past the end writes nothing)", target, want, exact=True)


def norms(lib):
    for rows, cols in [(1, 1), (3, 5), (2, 255), (4, 257), (3, 4097)]:
        x, w, b = uniform(rows, cols, scale=3) + 5, uniform(cols, scale=2), uniform(cols)
        xd = x.astype(np.float64)
        out = np.zeros_like(x)
        launch(lib, "rms_norm_f32", rows, [ptr(out), ptr(x), ptr(w), u32(cols), f32(1e-6)])
        check(f"rms_norm {rows}x{cols}", out, xd / np.sqrt((xd ** 2).mean(1, keepdims=True) + 1e-6) * w)
        out = np.zeros_like(x)
        launch(lib, "layer_norm_f32", rows, [ptr(out), ptr(x), ptr(w), ptr(b), u32(cols), f32(1e-5)])
        mean = xd.mean(1, keepdims=True)
        check(f"layer_norm {rows}x{cols}", out, (xd - mean) / np.sqrt(xd.var(1, keepdims=True) + 1e-5) * w + b)
        out = np.zeros_like(x)
        launch(lib, "softmax_f32", rows, [ptr(out), ptr(x), u32(cols), u32(0)])
        e = np.exp(xd - xd.max(1, keepdims=True))
        check(f"softmax {rows}x{cols}", out, e / e.sum(1, keepdims=True))
        idx = np.zeros(rows, np.uint32)
        x[:, cols // 2] = x.max()  # a tie: the first index wins
        launch(lib, "argmax_f32", rows, [ptr(idx), ptr(x), u32(cols)])
        check(f"argmax {rows}x{cols}", idx, np.argmax(x, 1).astype(np.uint32), exact=True)
    # Causal softmax: 2 groups of q = 3 queries over 5 keys.
    q, keys = 3, 5
    x = uniform(2 * q, keys, scale=4)
    out = np.zeros_like(x)
    launch(lib, "softmax_f32", 2 * q, [ptr(out), ptr(x), u32(keys), u32(q)])
    want = np.zeros((2 * q, keys))
    for r in range(2 * q):
        vis = min(r % q + keys - q + 1, keys)
        e = np.exp(x[r, :vis].astype(float) - x[r, :vis].max())
        want[r, :vis] = e / e.sum()
    check("softmax causal", out, want)
    x = uniform(2, 70)
    x[1, 9] = np.nan
    x[1, 30] = np.nan
    idx = np.zeros(2, np.uint32)
    launch(lib, "argmax_f32", 2, [ptr(idx), ptr(x), u32(70)])
    check("argmax first NaN", idx[1:], np.array([9], np.uint32), exact=True)
    # Rope, both pairings.
    rows, heads, hd = 3, 2, 8
    x, pos = uniform(rows, heads, hd), np.array([0, 5, 17], np.uint32)
    inv = np.array([10000.0 ** (-2 * i / hd) for i in range(hd // 2)], np.float32)
    for layout in (0, 1):
        out = np.zeros_like(x)
        launch(lib, "rope_f32", blocks(rows * heads * hd // 2), [ptr(out), ptr(x), ptr(pos), ptr(inv), u32(rows), u32(heads), u32(hd), u32(layout)])
        want = x.astype(np.float64).copy()
        for r in range(rows):
            for i in range(hd // 2):
                ang = float(np.float32(np.float32(pos[r]) * inv[i]))
                i0, i1 = (2 * i, 2 * i + 1) if layout else (i, i + hd // 2)
                x0, x1 = x[r, :, i0].astype(float), x[r, :, i1].astype(float)
                want[r, :, i0] = x0 * np.cos(ang) - x1 * np.sin(ang)
                want[r, :, i1] = x0 * np.sin(ang) + x1 * np.cos(ang)
        check(f"rope layout {layout}", out, want)


def matmul(lib):
    for batch, m, n, k, trans, shared in [(1, 1, 70, 33, True, True), (2, 1, 9, 100, False, False),
                                         (1, 65, 67, 17, True, True), (3, 5, 130, 40, False, False),
                                         (2, 70, 3, 129, True, True)]:
        a = uniform(batch, m, k)
        rb = 1 if shared else batch
        rhs = uniform(rb, n, k) if trans else uniform(rb, k, n)
        out = np.zeros((batch, m, n), np.float32)
        stride = 0 if shared else n * k
        r = rhs.transpose(0, 2, 1) if trans else rhs
        want = a.astype(np.float64) @ r.astype(np.float64)
        if m == 1:
            launch(lib, "matvec_f32", (blocks(n * 32), batch, 1), [ptr(out), ptr(a), ptr(rhs), u32(n), u32(k), u32(int(trans)), u64(stride)])
        else:
            launch(lib, "matmul_f32", ((n + 63) // 64, (m + 63) // 64, batch), [ptr(out), ptr(a), ptr(rhs), u32(m), u32(n), u32(k), u32(int(trans)), u64(stride)])
        check(f"matmul b{batch} {m}x{n}x{k} transposed={trans} shared={shared}", out, want, tol=1e-5 * np.sqrt(k))


# The kernels' format codes, from the generated prelude (src/backend/kernel_consts.rs).
CODES = dict(re.findall(r"FMT_(\w+) = (\d+)u;", open(os.path.join(KERNELS, "formats.cuh")).read()))
FORMATS = {name: int(CODES[name]) for name in ["F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "TQ1_0", "TQ2_0"]}


def quant(lib):
    import gguf
    from gguf.quants import quantize as gq, dequantize as gdq
    for name, code in FORMATS.items():
        qt = getattr(gguf.GGMLQuantizationType, name)
        blen, bbytes = gguf.GGML_QUANT_SIZES[qt]
        rows, cols = 3, 512
        x = uniform(rows, cols, scale=2)
        x[0, :32] = 0.0  # an all-zero block
        x[1, 5] = 7.5
        want = gq(x, qt)
        out = np.zeros(rows * cols // blen * bbytes, np.uint8)
        launch(lib, "quantize", blocks(rows * cols // blen), [ptr(out), ptr(x), u32(code), u32(rows * cols // blen)])
        check(f"quantize {name} bytes = gguf-py", out, np.ascontiguousarray(want).view(np.uint8).reshape(-1), exact=True)
        deq = np.zeros(rows * cols, np.float32)
        launch(lib, "dequantize", blocks(rows * cols), [ptr(deq), ptr(out), u32(code), u32(rows * cols)])
        check(f"dequantize {name} = gguf-py", deq, gdq(want, qt).reshape(-1), exact=True)
        # qmatmul with f32 activations: act · dequant(w)ᵀ.
        # 10 rows: a warp carries 8 activation rows (WT_QM_ROWS), so this takes two groups.
        m = 10
        act = uniform(m, cols)
        res = np.zeros((m, rows), np.float32)
        launch(lib, "qmatmul", blocks(-(-m // 8) * rows * 32), [ptr(res), ptr(act), ptr(out), u32(code), u32(m), u32(rows), u32(cols)])
        check(f"qmatmul {name} f32 activations", res, act.astype(float) @ gdq(want, qt).astype(float).T, tol=1e-5 * np.sqrt(cols))
    # F16 with an odd k: one value per lane (the two-per-word path needs an even k).
    m, rows, cols = 3, 5, 101
    w16 = uniform(rows, cols).astype(np.float16)
    act = uniform(m, cols)
    res = np.zeros((m, rows), np.float32)
    launch(lib, "qmatmul", blocks(rows * 32), [ptr(res), ptr(act), ptr(w16), u32(FORMATS["F16"]), u32(m), u32(rows), u32(cols)])
    check("qmatmul F16 odd k", res, act.astype(float) @ w16.astype(float).T, tol=1e-5 * np.sqrt(cols))
    # TernaryPlanes (webtensor's own format, not in gguf-py): d = max|x| kept in f32, trits
    # round(x / d); dequantize gives d · trit exactly.
    x = uniform(2, 512, scale=2)
    blk = x.reshape(-1, 256)
    amax = np.abs(blk).max(1, keepdims=True)
    inv = np.float32(1) / amax
    trits = np.clip(np.sign(blk * inv) * np.floor(np.abs(blk * inv) + np.float32(0.5)), -1, 1)
    packed = np.zeros(4 * 68, np.uint8)
    launch(lib, "quantize", blocks(4), [ptr(packed), ptr(x), u32(int(CODES["TERNARY_PLANES"])), u32(4)])
    deq = np.zeros(x.size, np.float32)
    launch(lib, "dequantize", blocks(x.size), [ptr(deq), ptr(packed), u32(int(CODES["TERNARY_PLANES"])), u32(x.size)])
    check("quantize+dequantize TernaryPlanes", deq, (trits * amax).astype(np.float32).reshape(-1), exact=True)
    # Activations rounded to int8 per block of 32 (Q8_0 mode): d · q as gguf's Q8_0.
    a = uniform(2, 64, scale=3)
    act = np.zeros_like(a)
    launch(lib, "qmatmul_act", blocks(4), [ptr(act), ptr(a), u32(2), u32(a.size), u32(32)])
    qt = gguf.GGMLQuantizationType.Q8_0
    q = gq(a, qt).reshape(2, 2, 34)
    d = q[..., :2].copy().view(np.float16).astype(np.float32)
    # The kernel keeps d in f32 (not rounded to f16), so compare the integers d·q / d.
    ints = np.rint(act.reshape(2, 2, 32) / np.where(d == 0, 1, np.abs(a.reshape(2, 2, 32)).max(-1, keepdims=True) / 127))
    check("qmatmul_act Q8_0 integers = gguf-py", ints.astype(np.int8), q[..., 2:].view(np.int8), exact=True)
    # f16 activations widened; int8 activations with one scale per row (I8 mode, block = k).
    h = uniform(3, 40, scale=4).astype(np.float16)
    act = np.zeros(h.size, np.float32)
    launch(lib, "qmatmul_act", blocks(h.size), [ptr(act), ptr(h), u32(1), u32(h.size), u32(1)])
    check("qmatmul_act f16 widened", act, h.astype(np.float32).reshape(-1), exact=True)
    a = uniform(3, 100, scale=3)
    act = np.zeros_like(a)
    launch(lib, "qmatmul_act", blocks(3), [ptr(act), ptr(a), u32(3), u32(a.size), u32(100)])
    d = (np.abs(a).max(1, keepdims=True) / np.float32(127)).astype(np.float32)
    v = a * (np.float32(1) / d)
    q = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))
    check("qmatmul_act int8 per row (d = max|x| / 127)", act, (q * d).astype(np.float32), exact=True)
    # Ternary dot products against the trits gguf-py decodes.
    for name in ("TQ1_0", "TQ2_0"):
        qt = getattr(gguf.GGMLQuantizationType, name)
        n, k, m = 3, 512, 2
        w = gq(uniform(n, k), qt)
        trits = np.sign(gdq(w, qt)).astype(np.int64)
        x = rng.integers(-128, 128, size=(m, k)).astype(np.int8)
        res = np.zeros((m, n), np.int32)
        launch(lib, "ternary_dot", blocks(m * n * 32), [ptr(res), ptr(w), ptr(x), u32(FORMATS[name]), u32(m), u32(n), u32(k)])
        check(f"ternary_dot {name} exact", res, (x.astype(np.int64) @ trits.T).astype(np.int32), exact=True)


# llama.cpp's formats beyond Q8_0 and Q4_0, which decode.cu's group decoder reads, with the byte
# offsets of each block's f16 scales (d, and dmin or m): random blocks get finite ones there
# (any other bytes are valid quants).
GROUP_FORMATS = {"Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "IQ4_NL": [0], "Q2_K": [80, 82],
                 "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0]}
FIXTURES = os.path.join(HERE, "..", "fixtures")


def random_blocks(name, count):
    """`count` random blocks of format `name` with f16 scales in ±0.02, as uint8 [count, bytes]."""
    import gguf
    bbytes = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, name)][1]
    b = rng.integers(0, 256, size=(count, bbytes), dtype=np.uint8)
    for at in GROUP_FORMATS[name]:
        b[:, at:at + 2] = rng.uniform(-0.02, 0.02, size=(count, 1)).astype(np.float16).view(np.uint8)
    return b


def check_bits(what, got, want):
    """Bit for bit (−0 is not 0), any NaN matching any NaN (a GPU's NaN has its own bits)."""
    got, want = np.asarray(got, np.float32).reshape(-1), np.asarray(want, np.float32).reshape(-1)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    check(what, same, np.ones_like(same), exact=True)


def q8_k(x):
    """llama.cpp's Q8_K rounding per 256 values (quantize_q8_k), as the f32 values d · q."""
    b = x.reshape(-1, 256)
    mx = b[np.arange(len(b)), np.argmax(np.abs(b), axis=1)]  # the first of largest magnitude
    iscale = np.where(mx == 0, np.float32(0), np.float32(-127) / np.where(mx == 0, np.float32(1), mx))
    q = np.minimum(127, np.rint((b * iscale[:, None]).astype(np.float32)))
    d = np.where(mx == 0, np.float32(0), np.float32(1) / np.where(iscale == 0, np.float32(1), iscale))
    return (q.astype(np.float32) * d.astype(np.float32)[:, None]).astype(np.float32).reshape(x.shape)


def q8_0(x):
    """Q8_0 rounding per 32 values as quantize_i8 (d = max|x| / 127, halves away from 0), d · q."""
    b = x.reshape(-1, 32)
    d = (np.abs(b).max(1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d == 0, np.float32(1), d), np.float32(0)).astype(np.float32)
    t = (b * inv).astype(np.float32)
    q = np.sign(t) * np.floor(np.abs(t) + np.float32(0.5))
    return (q.astype(np.float32) * d).astype(np.float32).reshape(x.shape)


def dequantize_with(lib, name, raw, values):
    out = np.zeros(values, np.float32)
    launch(lib, "dequantize", blocks(values // 32), [ptr(out), ptr(np.ascontiguousarray(raw)), u32(int(CODES[name])), u32(values)])
    return out


def group_formats(quant_lib, fused_lib):
    """decode.cu's formats: dequantize bit for bit against gguf-py (random blocks, the
    fixtures' blocks with NaN, ±inf, −0 and subnormal scales, and every tensor of these formats
    in the GGUFs llama.cpp wrote in fixtures/llama_cpp_kquants); qmatmul with f32 activations
    and with llama.cpp's rounding for the format (Q8_K for the super-blocks, Q8_0 for the legacy
    ones: qmatmul_act's integers exact), and the fused products with both."""
    import glob
    import gguf
    from gguf.quants import dequantize as gdq
    for name in GROUP_FORMATS:
        qt = getattr(gguf.GGMLQuantizationType, name)
        code, blen = int(CODES[name]), gguf.GGML_QUANT_SIZES[qt][0]
        raw = np.fromfile(os.path.join(FIXTURES, "quant", name.lower() + ".blocks.bin"), np.uint8)
        want = np.fromfile(os.path.join(FIXTURES, "quant", name.lower() + ".blocks.f32"), np.float32)
        check_bits(f"dequantize {name} fixture blocks (NaN, inf, -0, subnormal scales) = gguf-py",
                   dequantize_with(quant_lib, name, raw, want.size), want)
        n, k, m = 3, 512, 10
        w = random_blocks(name, n * k // blen)
        wd = gdq(w, qt).reshape(n, k)
        check_bits(f"dequantize {name} random blocks = gguf-py", dequantize_with(quant_lib, name, w, n * k), wd)
        act = uniform(m, k, scale=2)
        act[0, 5], act[0, 9] = 3.0, -3.0  # a tie of magnitudes: the first sets Q8_K's sign
        act[1, :256] = 0.0  # a block of zeros
        # 10 rows: a warp carries 8 activation rows (WT_QM_ROWS), so this takes two groups.
        res = np.zeros((m, n), np.float32)
        launch(quant_lib, "qmatmul", blocks(-(-m // 8) * n * 32), [ptr(res), ptr(act), ptr(w), u32(code), u32(m), u32(n), u32(k)])
        tol = 1e-5 * np.sqrt(k)
        check(f"qmatmul {name} f32 activations", res, act.astype(float) @ wd.astype(float).T, tol=tol)
        mode, block, rounded = (4, 256, q8_k(act)) if blen == 256 else (2, 32, q8_0(act))
        acts = np.zeros_like(act)
        launch(quant_lib, "qmatmul_act", blocks(act.size // block), [ptr(acts), ptr(act), u32(mode), u32(act.size), u32(block)])
        check(f"qmatmul_act mode {mode} for {name} = numpy's rounding", acts, rounded, exact=True)
        res = np.zeros((m, n), np.float32)
        launch(quant_lib, "qmatmul", blocks(-(-m // 8) * n * 32), [ptr(res), ptr(acts), ptr(w), u32(code), u32(m), u32(n), u32(k)])
        check(f"qmatmul {name} rounded activations", res, rounded.astype(float) @ wd.astype(float).T, tol=tol)
        # The fused products (store epilogue, no norm): int8 activations prepared by the block
        # (fused_linear_i8, mode 4 or 2), f32 ones read in place (fused_linear_f32, flag 8).
        null = u64(0)
        for kernel, kmode, flags, want in (("fused_linear_i8", mode, 0, rounded), ("fused_linear_f32", 0, 8, act)):
            out = np.zeros((m, n), np.float32)
            args = [ptr(out), ptr(act), ptr(w), null, null, null, null, null, null, u32(code), u32(kmode),
                    u32(m), u32(n), u32(k), u32(0), u32(flags), f32(0.0), u32(1), u32(0)]
            launch(fused_lib, kernel, (n * 2 + 7) // 8, args)
            check(f"{kernel} {name} mode {kmode}", out, want.astype(float) @ wd.astype(float).T, tol=tol)
    files = sorted(glob.glob(os.path.join(FIXTURES, "llama_cpp_kquants", "*.gguf")))
    read = 0
    for path in files:
        for t in gguf.GGUFReader(path).tensors:
            if t.tensor_type.name in GROUP_FORMATS:
                want = gdq(t.data, t.tensor_type).reshape(-1)
                got = dequantize_with(quant_lib, t.tensor_type.name, np.ascontiguousarray(t.data).view(np.uint8), want.size)
                check_bits(f"dequantize {os.path.basename(path)} {t.name} ({t.tensor_type.name}) = gguf-py", got, want)
                read += 1
    check(f"llama.cpp-written tensors read from {len(files)} files", np.array([read > 0]), np.array([True]), exact=True)


def scans(lib):
    outer, length, inner = 2, 50, 3
    a = rng.uniform(0.5, 1.0, size=(outer, length, inner)).astype(np.float32)
    b, h0 = uniform(outer, length, inner), uniform(outer, inner)
    out = np.zeros_like(a)
    launch(lib, "scan_f32", blocks(outer * inner), [ptr(out), ptr(a), ptr(b), ptr(h0), u32(0), u32(outer * inner), u32(length), u32(inner)])
    want = np.zeros((outer, length, inner))
    h = h0.astype(float)
    for t in range(length):
        h = a[:, t].astype(float) * h + b[:, t]
        want[:, t] = h
    check("linear_scan", out, want)
    out = np.zeros_like(a)
    launch(lib, "scan_f32", blocks(outer * inner), [ptr(out), ptr(a), ptr(b), ptr(a), u32(1), u32(outer * inner), u32(length), u32(inner)])
    want = np.zeros((outer, length, inner))
    g = np.zeros((outer, inner))
    for t in reversed(range(length)):
        nxt = a[:, t + 1].astype(float) if t + 1 < length else 0.0
        g = b[:, t] + nxt * g
        want[:, t] = g
    check("linear_scan adjoint", out, want)
    out = np.zeros_like(a)
    launch(lib, "scan_f32", blocks(outer * inner), [ptr(out), ptr(a), ptr(a), ptr(a), u32(2), u32(outer * inner), u32(length), u32(inner)])
    check("log_cumprod", out, np.exp(np.cumsum(np.log(a.astype(float)), 1)))
    x = uniform(outer, length, inner, scale=5)
    x[0, 3, 0] = -np.inf
    out = np.zeros_like(x)
    launch(lib, "scan_f32", blocks(outer * inner), [ptr(out), ptr(x), ptr(x), ptr(x), u32(3), u32(outer * inner), u32(length), u32(inner)])
    check("logcumsumexp", out, np.logaddexp.accumulate(x.astype(float), 1))
    out = np.zeros_like(a)
    launch(lib, "scan_grad_a", blocks(a.size), [ptr(out), ptr(b), ptr(a), ptr(h0), u32(a.size), u32(length), u32(inner)])
    prev = np.concatenate([h0[:, None, :], a[:, :-1]], 1)
    check("scan_grad_a", out, b.astype(float) * prev)
    out = np.zeros_like(h0)
    launch(lib, "scan_grad_init", blocks(outer * inner), [ptr(out), ptr(a), ptr(b), u32(outer * inner), u32(length), u32(inner)])
    check("scan_grad_init", out, a[:, 0].astype(float) * b[:, 0])


def sample(lib):
    rows, vocab = 4, 1000
    x = uniform(rows, vocab, scale=4)
    x[2, 17] = np.nan
    u = rng.uniform(0, 1, size=rows).astype(np.float32)

    def reference(row, t, k, p, uu):
        idx = [i for i in range(len(row)) if not np.isnan(row[i])]
        order = sorted(idx, key=lambda i: (-row[i], i))
        mx = row[order[0]]
        if not (t > 0) or mx == np.inf:
            return order[0]
        w = lambda i: np.exp((float(row[i]) - float(mx)) / t)
        thr = row[order[-1]]
        if 0 < k < len(order):
            thr = row[order[k - 1]]
        if p < 1:
            kept = [i for i in order if row[i] >= thr]
            goal = max(p, 0) * sum(w(i) for i in kept)
            s = 0.0
            for i in kept:
                s += w(i)
                if s >= goal:
                    thr = row[i]
                    break
        kept = [i for i in range(len(row)) if row[i] >= thr]
        target = uu * sum(w(i) for i in kept)
        s = 0.0
        for i in kept:
            s += w(i)
            if s > target:
                return i
        return kept[-1]

    for t, k, p in [(0.0, 0, 1.0), (0.8, 0, 1.0), (0.8, 40, 1.0), (1.0, 0, 0.9), (0.7, 50, 0.5), (1.0, 0, 0.0)]:
        out = np.zeros(rows, np.uint32)
        launch(lib, "sample_f32", rows, [ptr(out), ptr(x), ptr(u), u32(vocab), f32(t), u32(k), f32(p)])
        want = np.array([reference(x[r], t, k, p, float(u[r])) for r in range(rows)], np.uint32)
        check(f"sample temperature {t} top_k {k} top_p {p}", out, want, exact=True)


def fused(lib):
    """The fused decode kernels (fused.cu) against numpy: a normed Q4_0 product with int8
    activations rounded per 32 values, its rope epilogue, a store into pool rows, and paged
    attention over scattered pool rows."""
    import gguf
    from gguf.quants import quantize as gq, dequantize as gdq
    eps = np.float32(0.25)

    def normed(x, w):
        x64 = x.astype(np.float64)
        inv = 1.0 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + float(eps))
        return (x64 * inv * w.astype(np.float64)).astype(np.float32)

    def rounded(v):
        # quantize_i8 per 32 values: d = max|v| / 127 and q = round(v · (1 / d)), halves away.
        b = v.reshape(-1, 32)
        d = (np.abs(b).max(1, keepdims=True) / np.float32(127)).astype(np.float32)
        inv = np.where(d != 0, np.float32(1) / np.where(d == 0, 1, d), 0).astype(np.float32)
        t = (b * inv).astype(np.float32).astype(np.float64)
        q = np.clip(np.sign(t) * np.floor(np.abs(t) + 0.5), -128, 127)
        return (q * d.astype(np.float64)).reshape(v.shape)

    qt = gguf.GGMLQuantizationType.Q4_0
    for m, n, k in [(1, 40, 256), (3, 24, 512)]:
        x, nw = uniform(m, k, scale=2), uniform(k, scale=1.5)
        wq = gq(uniform(n, k), qt)
        wd = gdq(wq, qt).astype(np.float64)
        acts = rounded(normed(x, nw))
        want = acts @ wd.T
        out = np.zeros((m, n), np.float32)
        null = u64(0)
        # fused_linear_i8: out, x, w0, w1, norm, residual, positions, inv_freq, slots, fmt,
        # mode (2: Q8_0), m, n, k, epilogue (0: store), flags (2: norm), eps, head_dim,
        # pool_rows. One warp per output row: n warps of 8 per block.
        args = [ptr(out), ptr(x), ptr(wq), null, ptr(nw), null, null, null, null,
                u32(FORMATS["Q4_0"]), u32(2), u32(m), u32(n), u32(k), u32(0), u32(2), f32(eps), u32(1), u32(0)]
        launch(lib, "fused_linear_i8", (n + 7) // 8, args)
        check(f"fused_linear_i8 normed Q4_0 {m}x{n}x{k}", out, want, tol=1e-5 * np.sqrt(k))
        # The same with an interleaved rope (flags 2 | 4, epilogue 3), heads of 8.
        hd = 8
        pos = np.array([5, 1000, 3][:m], np.uint32)
        inv = np.array([10000.0 ** (-2 * i / hd) for i in range(hd // 2)], np.float32)
        y = want.astype(np.float32).astype(np.float64).reshape(m, n // hd, hd)
        rot = y.copy()
        for i in range(hd // 2):
            ang = (pos.astype(np.float32) * inv[i]).astype(np.float64)[:, None]
            rot[:, :, 2 * i] = y[:, :, 2 * i] * np.cos(ang) - y[:, :, 2 * i + 1] * np.sin(ang)
            rot[:, :, 2 * i + 1] = y[:, :, 2 * i] * np.sin(ang) + y[:, :, 2 * i + 1] * np.cos(ang)
        out = np.zeros((m, n), np.float32)
        args[0], args[6], args[7], args[14], args[15], args[17] = ptr(out), ptr(pos), ptr(inv), u32(3), u32(6), u32(hd)
        launch(lib, "fused_linear_i8", (n // 2 + 7) // 8, args)
        check(f"fused_linear_i8 normed Q4_0 + interleaved rope {m}x{n}x{k}", out, rot.reshape(m, n), tol=1e-5 * np.sqrt(k))
        # Stored into pool rows instead (flag 1): head g of row i to pool row slots[g·m + i].
        heads = m * n // hd
        pool_rows = heads + 3
        slots = np.array([(i * 5 + 2) % pool_rows for i in range(heads)], np.uint32)
        pool = uniform(pool_rows, hd)
        want_pool = pool.astype(np.float64).copy()
        for g in range(n // hd):
            for i in range(m):
                want_pool[slots[g * m + i]] = rot[i, g]
        args[0], args[8], args[15], args[18] = ptr(pool), ptr(slots), u32(7), u32(pool_rows)
        launch(lib, "fused_linear_i8", (n // 2 + 7) // 8, args)
        check(f"fused_linear_i8 into pool rows {m}x{n}x{k}", pool, want_pool, tol=1e-5 * np.sqrt(k))
    # Paged attention: 4 heads over 2 key/value heads, 2 new queries of 37 keys, rows scattered.
    heads, kv, hd, t, n = 4, 2, 16, 2, 37
    slots = n + 5
    keys, values = uniform(kv * slots, hd), uniform(kv * slots, hd)
    rows = np.array([[g * slots + (j * 7 + 1) % slots for j in range(n)] for g in range(kv)], np.uint32)
    q = uniform(t, heads * hd, scale=2)
    for window, softcap in ((0, 0.0), (5, 0.0), (0, 0.3), (5, 0.3)):
        want = np.zeros((t, heads, hd))
        for i in range(t):
            end = n - t + i + 1
            start = max(0, end - window) if window else 0
            for h in range(heads):
                g = h // (heads // kv)
                kk = keys[rows[g, start:end]].astype(np.float64)
                vv = values[rows[g, start:end]].astype(np.float64)
                sc = kk @ q[i, h * hd:(h + 1) * hd].astype(np.float64) * 0.25
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                p = np.exp(sc - sc.max())
                want[i, h] = (p / p.sum()) @ vv
        out = np.zeros((t, heads * hd), np.float32)
        args = [ptr(out), ptr(q), ptr(keys), ptr(values), ptr(rows), u32(n), u64(0), u32(t), u32(n),
                u32(heads), u32(kv), u32(hd), u32(kv * slots), f32(0.25), u32(window), f32(softcap)]
        launch(lib, "paged_attention", (heads, t, 1), args)
        check(f"paged_attention window {window} softcap {softcap}", out, want.reshape(t, -1), tol=1e-5 * np.sqrt(n))


SOURCES = ["elementwise.cu", "norm.cu", "matmul.cu", "quant.cu", "scan.cu", "sample.cu", "fused.cu"]


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--build":
        # Only build the libraries, for the Rust test that drives them through the backend's
        # own launch code (src/backend/cuda/launcher.rs, WEBTENSOR_CUDA_EMULATION=DIR).
        os.makedirs(sys.argv[2], exist_ok=True)
        for n in SOURCES:
            build(n, sys.argv[2])
        print(f"built {len(SOURCES)} emulated kernel libraries in {sys.argv[2]}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        libs = {n: build(n, tmp) for n in SOURCES}
        elementwise(libs["elementwise.cu"])
        norms(libs["norm.cu"])
        matmul(libs["matmul.cu"])
        quant(libs["quant.cu"])
        group_formats(libs["quant.cu"], libs["fused.cu"])
        scans(libs["scan.cu"])
        sample(libs["sample.cu"])
        fused(libs["fused.cu"])
    if FAILURES:
        print(f"{len(FAILURES)} CUDA kernel check(s) FAILED on the CPU emulation: {FAILURES}")
        sys.exit(1)
    print("every CUDA kernel check passed on the CPU emulation")


if __name__ == "__main__":
    main()
