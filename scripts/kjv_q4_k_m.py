#!/usr/bin/env python3
"""The built-in model (assets/tiny-kjv) as a Q4_K_M GGUF written by llama.cpp's own quantizer,
with its vocabulary, and llama.cpp's logits and greedy continuation on it: the file the demo
page's GGUF test loads (web/tests/demo-gguf.test.mjs) and native-tests/llama_cpp_agreement.rs
holds the engine to.

K-quants need every row to be whole 256-value super-blocks, and tiny-kjv is 128 wide (FFN
352), so llama.cpp would give it fallback formats. This script widens it without changing what
it computes, then quantizes:

1. tiny-kjv as an F32 GGUF (benches/peers.py's `make_gguf`, the file `--make-gguf` writes).
2. Widened to hidden 256, 8 query heads of 32 (2 key/value heads, as before) and FFN 512:
   - embedding columns 128… are zero, so the residual stream is the old one followed by zeros;
   - RMS norms: the mean of squares over 256 values is half the old one, so eps is halved and
     every norm weight divided by √2, which gives each norm the old output (zeros after it);
   - the four new query heads are zero and sit 2 and 2 after the old ones ([h0 h1 0 0 h2 h3 0
     0]), so each old head keeps its key/value head (group 4 instead of 2); their outputs meet
     zero columns of attn_output; head_dim stays 32, so rope and the 1/√32 scale are unchanged;
   - the 160 new FFN units have zero gate, up and down weights: SwiGLU of 0 is 0.
   llama.cpp runs both F32 files, and their logits of PROMPT must agree (within `WIDEN_TOL`,
   f32 rounding of the √2 factors), or the script stops: the widening is checked by an
   implementation other than webtensor's.
3. `llama_model_quantize` (llama-cpp-python, llama.cpp's quantizer) writes Q4_K_M: Q4_K, with
   Q6_K for the tied embedding/output and layers 2 and 3's `attn_v` and `ffn_down`; the script
   checks with gguf-py that both formats are there.
4. llama.cpp's logits of PROMPT on the Q4_K_M file (one pass, f32 KV cache, one thread) as
   `<file>.llama_cpp.f32`, and `<file>.llama_cpp.json`: the prompt's text and ids (llama.cpp's
   tokenizer), the GREEDY ids greedy decoding draws after it and their text, the file's tensor formats and step 2's
   measured difference.

Only the Q4_K_M file and step 4's outputs are committed (native-tests/fixtures/kjv_q4_k_m/);
the F32 files stay in target/kjv_q4_k_m/. From the repository root, with the llama-cpp-python
sdist built as scripts/make_gguf_fixtures.py describes ($SDIST):

    PYTHONPATH=$SDIST LLAMA_CPP_LIB_PATH=$SDIST/vendor/llama.cpp/build/bin \
        python3 scripts/kjv_q4_k_m.py

The committed file was written by llama-cpp-python 0.3.36 (vendor/llama.cpp at
ggml-org/llama.cpp@0c1e57098); another llama.cpp may pick other formats for some tensors.
"""

import json
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benches"))
from peers import make_gguf  # noqa: E402
from llama_cpp_kquants import quantize_mix  # noqa: E402

WORK = "target/kjv_q4_k_m"
OUT = "native-tests/fixtures/kjv_q4_k_m"
NAME = "tiny-kjv-256.q4_k_m.gguf"
PROMPT = "And God said"
GREEDY = 24
WIDEN_TOL = 2e-3
HIDDEN, FFN, HEADS, HEAD_DIM = 256, 512, 8, 32
# Where each old query head goes among the HEADS new ones (the others are zero).
HEAD_SLOTS = [0, 1, 4, 5]


def pad(t, rows, cols):
    """`t` (rows × cols at most) in the top-left corner of a zero rows × cols matrix."""
    out = np.zeros((rows, cols), np.float32)
    out[:t.shape[0], :t.shape[1]] = t
    return out


def spread_heads(t, axis):
    """`t`'s four query heads along `axis` moved to HEAD_SLOTS of HEADS, zeros elsewhere."""
    t = np.moveaxis(t, axis, 0)
    out = np.zeros((HEADS * HEAD_DIM,) + t.shape[1:], np.float32)
    for old, new in enumerate(HEAD_SLOTS):
        out[new * HEAD_DIM:(new + 1) * HEAD_DIM] = t[old * HEAD_DIM:(old + 1) * HEAD_DIM]
    return np.moveaxis(out, 0, axis)


def widen_tensor(name, t):
    """One tensor of tiny-kjv as the widened model holds it (step 2)."""
    kind = name.split(".")[-2]
    if kind.endswith("norm"):
        return pad(t[None, :], 1, HIDDEN)[0] / np.float32(np.sqrt(2.0))
    if kind == "attn_q":
        return pad(spread_heads(t, 0), HEADS * HEAD_DIM, HIDDEN)
    if kind == "attn_output":
        return pad(spread_heads(t, 1), HIDDEN, HEADS * HEAD_DIM)
    if kind in ("ffn_gate", "ffn_up"):
        return pad(t, FFN, HIDDEN)
    if kind == "ffn_down":
        return pad(t, HIDDEN, FFN)
    return pad(t, t.shape[0], HIDDEN)  # token_embd, attn_k, attn_v: wider rows


def widen(src, dst):
    """Writes the widened model of the F32 GGUF `src` to `dst` (step 2)."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, "llama")
    changed = {
        "llama.embedding_length": HIDDEN,
        "llama.feed_forward_length": FFN,
        "llama.attention.head_count": HEADS,
        "llama.attention.layer_norm_rms_epsilon":
            r.fields["llama.attention.layer_norm_rms_epsilon"].contents() / 2,
        "general.name": "tiny-kjv-256",
    }
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, changed.get(name, field.contents()), kind, sub_type=sub)
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w.add_tensor(t.name, widen_tensor(t.name, np.array(t.data).reshape(shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def open_llama(path):
    """llama.cpp on `path`: every position's logits kept, an f32 KV cache, one thread."""
    from llama_cpp import Llama
    return Llama(model_path=path, logits_all=True, n_threads=1, n_ctx=128, n_batch=64,
                 type_k=0, type_v=0, verbose=False)


def prompt_logits(llm, ids):
    """llama.cpp's logits (positions × vocabulary) of `ids` in one pass."""
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype="<f4")


def greedy(llm, ids, steps):
    """`steps` greedy ids after `ids`, one decode step each."""
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(steps):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


def formats(path):
    """Each tensor's ggml type name in the GGUF at `path`."""
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def main():
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(OUT, exist_ok=True)
    narrow, wide = os.path.join(WORK, "tiny-kjv.f32.gguf"), os.path.join(WORK, "tiny-kjv-256.f32.gguf")
    make_gguf(narrow)
    widen(narrow, wide)
    narrow_llm = open_llama(narrow)
    ids = narrow_llm.tokenize(PROMPT.encode(), add_bos=False, special=False)
    diff = float(np.max(np.abs(prompt_logits(narrow_llm, ids) - prompt_logits(open_llama(wide), ids))))
    print(f"widened F32 against tiny-kjv on llama.cpp: largest logit difference {diff:.3e}")
    if diff > WIDEN_TOL:
        raise SystemExit(f"the widening changed the model: {diff:.3e} > {WIDEN_TOL}")

    path = os.path.join(OUT, NAME)
    quantize_mix("llama-cpp-python", wide, path, "Q4_K_M")
    types = formats(path)
    if not {"Q4_K", "Q6_K"} <= set(types.values()):
        raise SystemExit(f"{path} lacks Q4_K or Q6_K tensors: {sorted(set(types.values()))}")

    llm = open_llama(path)
    prompt_logits(llm, ids).tofile(path + ".llama_cpp.f32")
    continuation = greedy(llm, ids, GREEDY)
    record = {
        "prompt": PROMPT,
        "prompt_ids": ids,
        "greedy_ids": continuation,
        "greedy_text": llm.detokenize(continuation).decode("utf-8", "replace"),
        "widening_logit_difference": diff,
        "tensors": dict(sorted(types.items())),
    }
    with open(path + ".llama_cpp.json", "w") as f:
        json.dump(record, f, indent=1)
    counts = {k: list(types.values()).count(k) for k in sorted(set(types.values()))}
    print(f"{path}: {os.path.getsize(path)} bytes, {counts}; greedy: {record['greedy_text']!r}")


if __name__ == "__main__":
    main()
