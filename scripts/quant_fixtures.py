#!/usr/bin/env python3
"""Writes the GGUF block-format fixtures of native-tests/fixtures/quant/ with gguf-py's
reference quantizers (`pip install gguf numpy`), an implementation independent of webtensor.

Files, all little-endian:
  input.f32        4096 f32 values (16 rows of 256) covering normal data, zeros, tiny and
                   huge magnitudes, rounding ties, negative maxima and ternary-like rows
  <format>.bin     gguf.quants.quantize(input, format) bytes, rows concatenated (q8_0, q4_0,
                   tq1_0, tq2_0, q4_1, q5_0, q5_1)
  <format>.f32     gguf.quants.dequantize(those bytes) as f32
  <format>.blocks.bin, <format>.blocks.f32
                   random blocks of each llama.cpp format webtensor reads (q4_1 ... iq4_xs)
                   and their dequantized values; see the end of this script
Rerun after changing the input recipe; the Rust tests compare webtensor against these files.
"""
import os
import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES
from gguf.quants import quantize, dequantize

rng = np.random.default_rng(20261122)
rows = []
rows.append(rng.normal(0, 1, 256))                                   # ordinary weights
rows.append(np.zeros(256))                                           # an all-zero row
rows.append(rng.normal(0, 1, 256) * 1e-30)                           # tiny
rows.append(rng.normal(0, 1, 256) * 1e30)                            # huge
rows.append(np.tile(np.arange(-127, 129, dtype=np.float64), 1)[:256] + 0.5)  # .5 ties
row = rng.normal(0, 0.1, 256); row[::32] = -3.0; rows.append(row)    # negative maxima
rows.append(rng.integers(-1, 2, 256) * 0.75 + rng.normal(0, 0.01, 256))  # ternary-like
row = rng.normal(0, 1, 256); row[7] = -0.0; row[100:140] = 0.0; rows.append(row)
for scale in [1e-3, 1e-2, 0.5, 3.0, 17.0, 250.0, 1e3, 6.5e4]:
    rows.append(rng.normal(0, scale, 256))
x = np.concatenate(rows).astype(np.float32).reshape(16, 256)

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "native-tests", "fixtures", "quant")
os.makedirs(out, exist_ok=True)
x.tofile(os.path.join(out, "input.f32"))
for name, qt in [("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("tq1_0", T.TQ1_0), ("tq2_0", T.TQ2_0)]:
    q = quantize(x, qt)
    q.tofile(os.path.join(out, f"{name}.bin"))
    dequantize(q, qt).astype(np.float32).tofile(os.path.join(out, f"{name}.f32"))
    print(name, q.shape, q.nbytes, "bytes")

# The llama.cpp formats (issue 41). Those gguf-py quantizes, from the same input:
for name, qt in [("q4_1", T.Q4_1), ("q5_0", T.Q5_0), ("q5_1", T.Q5_1)]:
    q = quantize(x, qt)
    q.tofile(os.path.join(out, f"{name}.bin"))
    dequantize(q, qt).astype(np.float32).tofile(os.path.join(out, f"{name}.f32"))
    print(name, q.shape, q.nbytes, "bytes")

# Every llama.cpp format webtensor reads, from random bytes (gguf-py has no quantizer for most):
#   <format>.blocks.bin  random blocks (32 of the 32-value formats, 8 of the 256-value ones) whose
#                        f16 scales are set to ordinary values of many magnitudes, except that
#                        block 1's first scale is +inf, block 2's NaN, block 3's -0.0, block 4's
#                        the smallest subnormal and block 5's last scale (the minimum, where the
#                        format has one) -inf
#   <format>.blocks.f32  gguf.quants.dequantize of those bytes
# The f16 fields lie at these byte offsets of each block (gguf-py's and ggml's layouts).
SCALES = {
    "q4_1": (T.Q4_1, [0, 2]),
    "q5_0": (T.Q5_0, [0]),
    "q5_1": (T.Q5_1, [0, 2]),
    "q2_k": (T.Q2_K, [80, 82]),
    "q3_k": (T.Q3_K, [108]),
    "q4_k": (T.Q4_K, [0, 2]),
    "q5_k": (T.Q5_K, [0, 2]),
    "q6_k": (T.Q6_K, [208]),
    "iq4_nl": (T.IQ4_NL, [0]),
    "iq4_xs": (T.IQ4_XS, [0]),
}
blocks_rng = np.random.default_rng(20261129)
for name, (qt, offsets) in SCALES.items():
    block_len, block_bytes = GGML_QUANT_SIZES[qt]
    n = 32 if block_len == 32 else 8
    b = blocks_rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    for off in offsets:
        mags = 10.0 ** blocks_rng.integers(-5, 2, n)
        s = (blocks_rng.normal(0, 1, n) * mags).astype(np.float16)
        b[:, off:off + 2] = s.reshape(n, 1).view(np.uint8)
    special = [(1, offsets[0], np.inf), (2, offsets[0], np.nan), (3, offsets[0], -0.0),
               (4, offsets[0], 6e-8), (5, offsets[-1], -np.inf)]
    for blk, off, v in special:
        b[blk, off:off + 2] = np.array([v], dtype=np.float16).view(np.uint8)
    flat = b.reshape(1, n * block_bytes)
    flat.tofile(os.path.join(out, f"{name}.blocks.bin"))
    dequantize(flat, qt).astype(np.float32).tofile(os.path.join(out, f"{name}.blocks.f32"))
    print(name, "blocks", flat.nbytes, "bytes")
