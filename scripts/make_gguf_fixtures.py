#!/usr/bin/env python3
"""GGUF files made by llama.cpp's own converter from the transformers checkpoints of
scripts/make_hf_fixtures.py, and llama.cpp's logits on them.

For each case in CASES: `convert_hf_to_gguf.py --outtype f32` and `--outtype q8_0`, and a Q4_0
file (the converter has no Q4_0 output): the f32 file's tensors that the converter quantizes for
q8_0, quantized to Q4_0 with gguf-py, every metadata key copied. Where llama-cpp-python is
installed, llama.cpp runs the prompt of cases.json on each file (`logits_all=True`, one thread)
and its logits are written next to the file (`<file>.llama_cpp.f32`), so the tests can bound our
error on the quantized files by llama.cpp's own.

Needs: transformers, torch, sentencepiece, gguf (pip), and llama.cpp's source tree (the
llama-cpp-python sdist carries it under vendor/llama.cpp). llama-cpp-python may also be the
sdist's own `llama_cpp` package on PYTHONPATH with LLAMA_CPP_LIB_PATH naming the folder of a
`libllama.so` built from that tree with cmake (target `llama`, BUILD_SHARED_LIBS=ON): the
`olmo2` and `smollm3` logits were written that way, and that build gives the other cases'
committed logits bit for bit. Run from the repository root:

    python3 scripts/make_gguf_fixtures.py --llama-cpp /path/to/vendor/llama.cpp [--cases NAME...]

It runs scripts/make_hf_fixtures.py first (with a tokenizer, which the converter needs).
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

OUT = "native-tests/fixtures/hf"
GGUF_OUT = "native-tests/fixtures/gguf"
WORK = "/tmp/webtensor_gguf_fixtures"

# The cases converted. Left out: `llama_dynamic` (the converter writes no dynamic scaling, so
# llama.cpp runs it unscaled), `mistral` (converted as `llama`, whose GGUF has no sliding
# window), `qwen2_swa` (the converter writes Qwen2's window only for DFlash models), the 4.x
# configs (same weights as their 5.x cases), and to keep the fixtures small `llama` and
# `smollm` (the `llama*` cases cover Llama files, `qwen2` tied embeddings), and
# `phi3_longrope_short`: llama.cpp picks longrope's long or short factors by its context size
# (here rounded up to 256 tokens, past the case's original 64) where transformers picks them by
# each pass's longest position (48), so llama.cpp runs another model there.
CASES = ["llama31", "llama_linear", "llama_yarn", "qwen2", "qwen3", "phi3", "olmo2", "smollm3",
         "gemma2", "gemma3", "phi3_longrope"]


def copy_with_tensors(reader, out_path, tensors):
    """A GGUF with `reader`'s metadata and the given (name, array, type) tensors."""
    import gguf
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out_path, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type":
            writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for name, data, qtype in tensors:
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def q4_0_from(f32_path, q8_path, out_path):
    import gguf
    from gguf import GGMLQuantizationType as Q
    f32 = gguf.GGUFReader(f32_path)
    quantized = {t.name for t in gguf.GGUFReader(q8_path).tensors if t.tensor_type == Q.Q8_0}
    tensors = []
    for t in f32.tensors:
        data = np.array(t.data)
        if t.name in quantized:
            tensors.append((t.name, gguf.quants.quantize(data, Q.Q4_0), Q.Q4_0))
        else:
            tensors.append((t.name, data, t.tensor_type))
    copy_with_tensors(f32, out_path, tensors)


# Cases llama.cpp runs with an f32 KV cache instead of its default f16 one. Gemma 3 has no
# soft-capping, so its logits reach ±68, and the f16 cache's rounding alone moves them by up to
# 4e-2 (from the first position on): the test's 1e-2 check of where llama.cpp runs the same
# model would find none. With the f32 cache its f32 file is within 2.6e-2 (ggml's f16 GELU
# table), and within 1e-2 on 38 of the 48 positions.
F32_CACHE = {"gemma3"}
GGML_TYPE_F32 = 0


def llama_cpp_logits(path, prompt, vocab, f32_cache=False):
    from llama_cpp import Llama
    cache = dict(type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32) if f32_cache else {}
    llm = Llama(model_path=path, logits_all=True, n_threads=1, n_ctx=len(prompt) + 16,
                n_batch=len(prompt), verbose=False, **cache)
    llm.eval(prompt)
    return np.array(llm.scores[:len(prompt), :vocab], dtype="<f4")


# Cases whose converter class reads the vocabulary only as GPT-2 BPE, from a tokenizer.json
# with a pre-tokenizer it recognizes by hash: OLMo 2. The tiny checkpoints carry a SentencePiece
# vocabulary, so for these the converter runs with that class's `set_vocab` replaced by the
# converter's own SentencePiece reader (what its Llama class uses); every tensor and
# hyper-parameter is still written by the converter itself. Case → (module, class).
SENTENCEPIECE_VOCAB = {"olmo2": ("conversion.olmo", "Olmo2Model")}

# Runs the converter's main() in this process after that replacement.
CONVERT_WITH_SENTENCEPIECE = """
import importlib, sys
llama_cpp, module, cls, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
sys.path.insert(0, llama_cpp)
import convert_hf_to_gguf
model = getattr(importlib.import_module(module), cls)
model.set_vocab = lambda self: self._set_vocab_sentencepiece()
sys.argv = ["convert_hf_to_gguf.py", *argv]
convert_hf_to_gguf.main()
"""


def convert(llama_cpp, name, outtype, outfile):
    """llama.cpp's converter on the case's checkpoint (with a tokenizer) in WORK."""
    args = [os.path.join(WORK, name), "--outtype", outtype, "--outfile", outfile]
    if name in SENTENCEPIECE_VOCAB:
        command = [sys.executable, "-c", CONVERT_WITH_SENTENCEPIECE, llama_cpp,
                   *SENTENCEPIECE_VOCAB[name], *args]
    else:
        command = [sys.executable, os.path.join(llama_cpp, "convert_hf_to_gguf.py"), *args]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp's source tree")
    ap.add_argument("--cases", nargs="+", metavar="NAME", choices=CASES,
                    help="convert only these cases (make_hf_fixtures.py writes only them)")
    args = ap.parse_args()
    only = ["--cases", *args.cases] if args.cases else []
    subprocess.run([sys.executable, "scripts/make_hf_fixtures.py", "--keep-tokenizer", WORK,
                    *only], check=True)
    prompt = json.load(open(os.path.join(OUT, "cases.json")))["prompt"]
    os.makedirs(GGUF_OUT, exist_ok=True)
    try:
        import llama_cpp  # noqa: F401
        have_llama_cpp = True
    except ImportError:
        have_llama_cpp = False
        print("llama-cpp-python is not installed: no llama.cpp logits")
    for name in args.cases or CASES:
        files = {}
        for outtype in ("f32", "q8_0"):
            files[outtype] = os.path.join(GGUF_OUT, f"{name}.{outtype}.gguf")
            convert(args.llama_cpp, name, outtype, files[outtype])
        files["q4_0"] = os.path.join(GGUF_OUT, f"{name}.q4_0.gguf")
        q4_0_from(files["f32"], files["q8_0"], files["q4_0"])
        # The logits of the model the conversion describes (Gemma's differ: see
        # make_hf_fixtures.gguf_meaning).
        expected = os.path.join(OUT, name, "logits_gguf.f32")
        if not os.path.exists(expected):
            expected = os.path.join(OUT, name, "logits.f32")
        hf = np.fromfile(expected, "<f4").reshape(len(prompt), -1)
        for outtype, path in files.items():
            line = f"{name} {outtype}: {os.path.getsize(path)} bytes"
            if have_llama_cpp:
                got = llama_cpp_logits(path, prompt, hf.shape[1], name in F32_CACHE)
                got.tofile(path + ".llama_cpp.f32")
                line += f", llama.cpp max|Δ| against transformers {np.abs(got - hf).max():.3e}"
            print(line)


if __name__ == "__main__":
    main()
