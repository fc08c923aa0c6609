#!/usr/bin/env python3
"""Files written by llama.cpp's own quantizer in its K-quant, IQ4 and legacy (Q4_1, Q5_0, Q5_1,
IQ4_NL) mixes, and what an implementation independent of webtensor says about them, for
native-tests/llama_cpp_agreement.rs.

1. A tiny random Llama (1 layer, hidden 256, FFN 256, 2 heads, 1 key/value head, vocabulary
   32: every row is whole 256-value super-blocks) written as an F32 GGUF with gguf-py
   (target/llama_cpp_kquants/tiny.f32.gguf, not committed: 1.6 MB).
2. `llama-quantize tiny.f32.gguf tiny.<mix>.gguf <MIX>` for each mix in MIXES, committed under
   native-tests/fixtures/llama_cpp_kquants/ (each well under 1 MB). llama.cpp picks each
   tensor's format itself (Q4_K_M: Q4_K, with Q6_K for `output`, `attn_v` and `ffn_down`).
3. For each file, with gguf-py and numpy only (`<file>.json`):
   - every tensor's ggml type and a checksum of gguf-py's dequantized f32 values (the sum over
     values of `bits(v_i) · (i + 1)` modulo 2^64), so the test checks every value bit for bit
     without committing them;
   - the logits of PROMPT under a float64 numpy forward pass of the Llama architecture as
     llama.cpp computes it (RMS norm, rope on adjacent pairs of the stored q/k rows, grouped
     attention, SwiGLU) over gguf-py's dequantized weights, as `<file>.logits.f32`; and
     with the input of every product rounded to the integer activations its weight's format
     takes (webtensor's default, as llama.cpp): for the super-block formats llama.cpp's Q8_K
     (its quantize_row_q8_K_ref, written here in numpy: per 256 values `s = -127 / max` from
     the signed largest value, `q = min(127, round_half_even(x * s))`, `d = 1 / s`, in f32),
     for the 32-value formats Q8_0's rule (per 32 values `d = max|x| / 127`,
     `q = round_half_away(x * (1 / d))` in f32, `d` kept in f32 as webtensor keeps it), as
     `<file>.int.logits.f32`.

llama-quantize: llama.cpp's tools/quantize built on the CPU. Its source is the llama-cpp-python
sdist (vendor/llama.cpp at ggml-org/llama.cpp@0c1e57098); for example, with a CPU-only build:

    cmake -S vendor/llama.cpp -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama-quantize -j2

The committed files were made with tools/quantize/{main,quantize}.cpp compiled alone and linked
against the static libraries scripts/build_llama_cpp_peer.sh leaves in target/peer/build-vulkan
(libllama-common.a, libllama-common-base.a, libllama.a, libggml.a, libggml-vulkan.a,
libggml-cpu.a, libggml-base.a, libcpp-httplib.a; -lvulkan): the quantizers are ggml's scalar
reference code either way. Then, from the repository root:

    python3 scripts/llama_cpp_kquants.py --quantize build/bin/llama-quantize

`--quantize llama-cpp-python` runs the same quantizer in this process instead, through
llama-cpp-python's `llama_model_quantize` (the `llama_cpp` package and library as in step 4
below); at 0c1e57098 it writes the committed Q4_K_M file byte for byte, and it wrote the Q5_K_M
one. Rerunning it rewrites the fixtures; a llama.cpp of another version may choose other
formats for some tensors (the test reads whatever each file holds).

4. With `--llama-cpp-logits`, llama.cpp's own logits of PROMPT on each committed file
   (`<file>.llama_cpp.f32`), through llama-cpp-python on one CPU thread: the sdist's
   `llama_cpp` package on PYTHONPATH and LLAMA_CPP_LIB_PATH naming the folder of a build's
   libllama (for example the sdist's own vendor/llama.cpp built with `-DBUILD_SHARED_LIBS=ON`,
   as scripts/make_gguf_fixtures.py describes). The files carry no vocabulary, which llama.cpp
   requires, so it runs a copy (in target/llama_cpp_kquants/) with `tokenizer.ggml.model =
   "none"` added and every other key and tensor byte as they are. The test holds webtensor's
   logits to llama.cpp's within the distance llama.cpp itself keeps from the float64 forward
   pass (llama.cpp keeps its KV cache in f16 and rounds differently from step 3's numpy).

    PYTHONPATH=$SDIST LLAMA_CPP_LIB_PATH=$SDIST/vendor/llama.cpp/build/bin \
        python3 scripts/llama_cpp_kquants.py --llama-cpp-logits
"""

import argparse
import json
import os
import subprocess

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

WORK = "target/llama_cpp_kquants"
OUT = "native-tests/fixtures/llama_cpp_kquants"
MIXES = ["Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]
# The formats of 32-value blocks, whose products take Q8_0 activations.
BLOCKS_OF_32 = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL}
PROMPT = [1, 5, 9, 31, 3, 3, 17, 22, 0]

VOCAB, HIDDEN, FFN, HEADS, KV_HEADS = 32, 256, 256, 2, 1
HEAD_DIM = HIDDEN // HEADS
EPS, THETA = 1e-5, 10000.0


def write_f32(path):
    """The tiny random model as an F32 GGUF."""
    rng = np.random.default_rng(20261129)
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(1)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_freq_base(THETA)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    def mat(rows, cols, scale):
        return (rng.normal(0, scale, (rows, cols))).astype(np.float32)

    def norm(n):
        return (1.0 + rng.normal(0, 0.1, n)).astype(np.float32)

    kv = KV_HEADS * HEAD_DIM
    w.add_tensor("token_embd.weight", mat(VOCAB, HIDDEN, 1.0))
    w.add_tensor("blk.0.attn_norm.weight", norm(HIDDEN))
    w.add_tensor("blk.0.attn_q.weight", mat(HIDDEN, HIDDEN, 0.06))
    w.add_tensor("blk.0.attn_k.weight", mat(kv, HIDDEN, 0.06))
    w.add_tensor("blk.0.attn_v.weight", mat(kv, HIDDEN, 0.06))
    w.add_tensor("blk.0.attn_output.weight", mat(HIDDEN, HIDDEN, 0.06))
    w.add_tensor("blk.0.ffn_norm.weight", norm(HIDDEN))
    w.add_tensor("blk.0.ffn_gate.weight", mat(FFN, HIDDEN, 0.06))
    w.add_tensor("blk.0.ffn_up.weight", mat(FFN, HIDDEN, 0.06))
    w.add_tensor("blk.0.ffn_down.weight", mat(HIDDEN, FFN, 0.06))
    w.add_tensor("output_norm.weight", norm(HIDDEN))
    w.add_tensor("output.weight", mat(VOCAB, HIDDEN, 0.06))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def weights(path):
    """Every tensor of a GGUF as gguf-py dequantizes it (float32, row-major), and its type."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        values = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        out[t.name] = (values, t.tensor_type)
    return out


def checksum(values):
    """Σ bits(v_i) · (i + 1) mod 2^64 over the f32 values in order."""
    bits = values.reshape(-1).view(np.uint32).astype(np.uint64)
    index = np.arange(1, bits.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int(np.sum(bits * index, dtype=np.uint64))


def rms_norm(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def rope(x, positions):
    """llama.cpp's rope for `llama` files: element 2i of each head pairs with 2i + 1."""
    t, width = x.shape
    x = x.reshape(t, width // HEAD_DIM, HEAD_DIM // 2, 2)
    inv = THETA ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    ang = positions[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0], x[..., 1]
    return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(t, width)


def q8_k(x):
    """Rows of f32 `x` rounded as llama.cpp's quantize_row_q8_K_ref, as float64 `d * q`."""
    x = x.astype(np.float32)
    out = np.zeros(x.shape)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 256):
            block = x[r, b:b + 256]
            top = block[np.argmax(np.abs(block))]
            if top == 0:
                continue
            s = np.float32(-127.0) / top
            q = np.minimum(np.round(block * s), 127)
            out[r, b:b + 256] = np.float64(np.float32(1.0) / s) * q
    return out


def q8_0(x):
    """Rows of f32 `x` rounded as Q8_0 activations, as float64 `d * q`."""
    x = x.astype(np.float32)
    out = np.zeros(x.shape)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 32):
            block = x[r, b:b + 32]
            d = np.float32(np.max(np.abs(block))) / np.float32(127.0)
            if d == 0:
                continue
            t = (block * (np.float32(1.0) / d)).astype(np.float64)
            q = np.sign(t) * np.floor(np.abs(t) + 0.5)
            out[r, b:b + 32] = np.float64(d) * q
    return out


def int_activations(x, qtype):
    """`x` rounded to the integer activations of a product with `qtype` weights (none for
    float weights)."""
    if qtype in BLOCKS_OF_32:
        return q8_0(x)
    if qtype in (T.F32, T.F16, T.BF16):
        return x
    return q8_k(x)


def forward(w, tokens, round_acts=False):
    """The logits of `tokens` in float64; with `round_acts`, every product's input rounded to
    its weight's integer activations first (`int_activations`)."""
    g = {name: v.astype(np.float64) for name, (v, _) in w.items()}

    def lin(x, name):
        return (int_activations(x, w[name][1]) if round_acts else x) @ g[name].T

    t = len(tokens)
    x = g["token_embd.weight"][tokens]
    pos = np.arange(t, dtype=np.float64)
    h = rms_norm(x, g["blk.0.attn_norm.weight"])
    q = rope(lin(h, "blk.0.attn_q.weight"), pos).reshape(t, HEADS, HEAD_DIM)
    k = rope(lin(h, "blk.0.attn_k.weight"), pos).reshape(t, KV_HEADS, HEAD_DIM)
    v = lin(h, "blk.0.attn_v.weight").reshape(t, KV_HEADS, HEAD_DIM)
    group = HEADS // KV_HEADS
    out = np.zeros((t, HEADS, HEAD_DIM))
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for hd in range(HEADS):
        s = q[:, hd] @ k[:, hd // group].T / np.sqrt(HEAD_DIM) + mask
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        out[:, hd] = p @ v[:, hd // group]
    x = x + lin(out.reshape(t, HIDDEN), "blk.0.attn_output.weight")
    h = rms_norm(x, g["blk.0.ffn_norm.weight"])
    gate = lin(h, "blk.0.ffn_gate.weight")
    up = lin(h, "blk.0.ffn_up.weight")
    x = x + lin(gate / (1 + np.exp(-gate)) * up, "blk.0.ffn_down.weight")
    return lin(rms_norm(x, g["output_norm.weight"]), "output.weight")


def without_vocabulary_refusal(path, copy):
    """Copies the GGUF at `path` to `copy` with `tokenizer.ggml.model = "none"` added: the
    same model for llama.cpp, which refuses a file that does not name its vocabulary type."""
    r = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(copy, r.fields["general.architecture"].contents())
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), kind, sub_type=sub)
    w.add_string("tokenizer.ggml.model", "none")
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_llama_cpp_logits(mixes):
    """llama.cpp's logits of PROMPT on each committed mix of `mixes`, as
    `<file>.llama_cpp.f32`."""
    from llama_cpp import Llama
    for name in [f"tiny.{mix.lower()}.gguf" for mix in mixes]:
        copy = os.path.join(WORK, name + ".with-vocab-type.gguf")
        without_vocabulary_refusal(os.path.join(OUT, name), copy)
        llm = Llama(model_path=copy, logits_all=True, n_threads=1, n_ctx=len(PROMPT) + 16,
                    n_batch=len(PROMPT), verbose=False)
        llm.eval(PROMPT)
        logits = np.array(llm.scores[:len(PROMPT), :VOCAB], dtype="<f4")
        logits.tofile(os.path.join(OUT, name + ".llama_cpp.f32"))
        print(name, "llama.cpp logits written")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantize", help="llama.cpp's llama-quantize binary, or llama-cpp-python "
                    "to quantize in this process: rewrite the mixes")
    ap.add_argument("--llama-cpp-logits", action="store_true",
                    help="write llama.cpp's logits of each committed mix (llama-cpp-python)")
    ap.add_argument("--mixes", default=",".join(MIXES),
                    help="the mixes to write, comma-separated (default: all of MIXES)")
    args = ap.parse_args()
    mixes = args.mixes.split(",")
    unknown = [m for m in mixes if m not in MIXES]
    if unknown:
        ap.error(f"unknown mixes {unknown}; known: {MIXES}")
    if not (args.quantize or args.llama_cpp_logits):
        ap.error("nothing to do: give --quantize, --llama-cpp-logits or both")
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(OUT, exist_ok=True)
    if args.quantize:
        write_mixes(args.quantize, mixes)
    if args.llama_cpp_logits:
        write_llama_cpp_logits(mixes)


def quantize_mix(quantize, f32, path, mix):
    """llama.cpp's quantizer writes `mix` of the F32 file `f32` to `path`: the binary
    `quantize`, or with `llama-cpp-python` its `llama_model_quantize` in this process."""
    if quantize != "llama-cpp-python":
        subprocess.run([quantize, f32, path, mix], check=True, capture_output=True)
        return
    import ctypes
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{mix}")
    if llama_cpp.llama_model_quantize(f32.encode(), path.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize failed for {mix}")


def write_mixes(quantize, mixes):
    """Steps 1–3: the F32 model, each mix of `mixes` quantized by llama.cpp, and numpy's view
    of it."""
    f32 = os.path.join(WORK, "tiny.f32.gguf")
    write_f32(f32)
    for mix in mixes:
        path = os.path.join(OUT, f"tiny.{mix.lower()}.gguf")
        quantize_mix(quantize, f32, path, mix)
        w = weights(path)
        forward(w, PROMPT).astype(np.float32).tofile(path + ".logits.f32")
        forward(w, PROMPT, True).astype(np.float32).tofile(path + ".int.logits.f32")
        manifest = {
            "mix": mix,
            "prompt": PROMPT,
            "tensors": {
                name: {"type": T(qtype).name, "checksum": str(checksum(values))}
                for name, (values, qtype) in sorted(w.items())
            },
        }
        with open(path + ".json", "w") as f:
            json.dump(manifest, f, indent=1)
        types = sorted({m["type"] for m in manifest["tensors"].values()})
        print(mix, os.path.getsize(path), "bytes:", ", ".join(types))


if __name__ == "__main__":
    main()
