#!/usr/bin/env python3
"""Writes the GGUF block-format fixtures of native-tests/fixtures/quant/ with gguf-py's
reference quantizers (`pip install gguf numpy`), an implementation independent of webtensor.

Files, all little-endian:
  input.f32        4096 f32 values (16 rows of 256) covering normal data, zeros, tiny and
                   huge magnitudes, rounding ties, negative maxima and ternary-like rows
  <format>.bin     gguf.quants.quantize(input, format) bytes, rows concatenated
  <format>.f32     gguf.quants.dequantize(those bytes) as f32
Rerun after changing the input recipe; the Rust tests compare webtensor against these files.
"""
import os
import numpy as np
from gguf import GGMLQuantizationType as T
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
