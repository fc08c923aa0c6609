#!/usr/bin/env python3
"""Writes the fixture the engine tests derive their integer-activation thresholds from.

For each block format (q8_0, q4_0), a small random Llama of the built-in model's family is
written as GGUF with gguf-py (benches/peers.py's writer) into native-tests/fixtures/llama_cpp/,
and llama.cpp (llama-cpp-python) runs it on the engine tests' token sequence. Its logits of
every position go next to the file as JSON. llama.cpp multiplies q8_0/q4_0 weights with q8_0
activations, so how far its logits lie from webtensor's reference forward with f32
activations (measured in the test) is the rounding error llama.cpp itself accepts on that file.

    python3 scripts/llama_cpp_agreement.py

Needs numpy, gguf, safetensors and llama-cpp-python.
"""

import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benches"))
import peers  # noqa: E402

OUT = os.path.join(ROOT, "native-tests", "fixtures", "llama_cpp")
# native-tests/engine.rs's TOKENS.
TOKENS = [1, 5, 9, 60, 3, 3, 17, 42, 0]


def main():
    import llama_cpp

    os.makedirs(OUT, exist_ok=True)
    for qtype in ["q8_0", "q4_0"]:
        path = os.path.join(OUT, f"random-{qtype}.gguf")
        peers.make_gguf(path, dim=128, layers=3, ffn=352, heads=4, kv_heads=2, vocab=512,
                        qtype=qtype)
        llm = llama_cpp.Llama(path, n_threads=1, n_ctx=64, n_batch=64, logits_all=True,
                              verbose=False)
        llm.eval(TOKENS)
        logits = np.array(llm.scores[: len(TOKENS)], dtype=np.float64)
        with open(os.path.join(OUT, f"random-{qtype}.llama_cpp.json"), "w") as f:
            json.dump({"llama_cpp_python": llama_cpp.__version__, "tokens": TOKENS,
                       "logits": [[float(f"{v:.7g}") for v in row] for row in logits]}, f)
        print(f"wrote {path} and its llama.cpp logits", file=sys.stderr)


if __name__ == "__main__":
    main()
