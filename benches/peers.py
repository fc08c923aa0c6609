#!/usr/bin/env python3
"""Times peers side by side with webtensor on this machine; writes JSON for the report.

* numpy: f32 matmul (a·b and a·bᵀ), rms_norm, causal softmax and silu at exactly the shapes of
  the rows of a `webtensor bench --report` run (read from its report.json, so they cannot
  drift from webtensor's cases).
* llama.cpp (when llama-cpp-python is installed): end-to-end greedy decode tokens/s on a GGUF
  model, next to `webtensor bench --model` on the same file in the same run. `--make-gguf`
  writes the built-in model (assets/tiny-kjv) as an f32 GGUF with gguf-py, or, with
  `--dim/--layers/--ffn`, a larger model of random weights with the same tokenizer.

    webtensor bench --report out
    python3 benches/peers.py --report out/report.json --make-gguf out/model.gguf -o out/peers.json
    webtensor bench --merge out/report.json --peers out/peers.json --report out

Needs numpy (gguf and safetensors for --make-gguf; llama-cpp-python for the llama.cpp row).
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def median_us(fn, runs=5, min_secs=0.02):
    """Median microseconds per call over `runs` samples of at least `min_secs` each."""
    fn()
    iters = 1
    while True:
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        if time.perf_counter() - t >= min_secs or iters >= 1 << 16:
            break
        iters *= 2
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t) / iters * 1e6)
    return statistics.median(samples)


def shapes(text):
    """'[1, 1024] [2816, 1024]' -> [[1, 1024], [2816, 1024]]."""
    return [[int(v) for v in s.split(",") if v.strip()] for s in re.findall(r"\[([^\]]*)\]", text)]


def numpy_case(op, case, shape):
    """A numpy callable doing the work of one webtensor row, or None for ops not compared."""
    rng = np.random.default_rng(0)
    dims = shapes(shape)
    f32 = lambda s: rng.uniform(-1, 1, size=s).astype(np.float32)
    if op == "silu":
        x = f32(dims[0])
        return lambda: x / (np.float32(1) + np.exp(-x))
    if op == "rms_norm":
        x, w = f32(dims[0]), f32(dims[1])
        eps = np.float32(1e-6)
        return lambda: x * (np.float32(1) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * w
    if op == "softmax":
        # Causal: query i of q sees keys j <= i + keys - q (webtensor's softmax_causal).
        x = f32(dims[0])
        q, keys = x.shape[-2], x.shape[-1]
        visible = np.arange(keys)[None, :] <= (np.arange(q)[:, None] + keys - q)

        def softmax():
            s = np.where(visible, x, -np.inf)
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

        return softmax
    if op == "matmul":
        a, b = f32(dims[0]), f32(dims[1])
        return (lambda: a @ b.T) if "ᵀ" in case else (lambda: a @ b)
    return None


def numpy_peers(report):
    rows, seen = [], set()
    for r in report["rows"]:
        key = (r["op"], r["case"], r["shape"])
        if key in seen or not r.get("checked"):
            continue
        seen.add(key)
        fn = numpy_case(*key)
        if fn is None:
            continue
        us = median_us(fn)
        print(f"numpy {key[0]} {key[1]} {key[2]}: {us:.1f} µs", file=sys.stderr)
        rows.append({"peer": f"numpy {np.__version__}", "op": key[0], "case": key[1],
                     "shape": key[2], "median_us": us})
    return rows


# Mixes written by llama.cpp's own quantizer (llama-cpp-python's `llama_model_quantize`) from
# the f32 file: the files users download. A matrix whose rows are not a multiple of 256 gets
# llama.cpp's fallback type (SmolLM-135M's 576-wide rows: Q5_0 in Q4_K_M, Q8_0 in Q6_K).
LLAMA_CPP_MIXES = ["q4_k_m", "q5_k_m", "q6_k"]
# Q4_K_M's layout filled with random blocks, written without llama.cpp (see random_kquant_blocks).
RANDOM_BLOCK_MIX = "q4_k_m-random-blocks"


def more_bits(layer, layers):
    """Whether llama.cpp's Q4_K_M gives this layer's attn_v and ffn_down Q6_K (its
    use_more_bits: the first eighth, the last eighth, and every third layer between)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def random_kquant_blocks(rng, rows, cols, qtype):
    """Random Q4_K or Q6_K blocks for a rows x cols matrix, with fixed finite scales: a speed
    fixture of Q4_K_M's size and layout (weights of a few hundredths, like the random f32
    models'), written where llama.cpp's quantizer is absent (a GPU machine without it)."""
    import gguf
    size = {gguf.GGMLQuantizationType.Q4_K: 144, gguf.GGMLQuantizationType.Q6_K: 210}[qtype]
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        # d and dmin (f16) lead the block: 6-bit scales x 4-bit values x 2e-5.
        blocks[..., 0:4] = np.frombuffer(np.array([2e-5, 2e-5], np.float16).tobytes(), np.uint8)
    else:
        # d (f16) ends the block: int8 scales x (6-bit values - 32) x 1e-5.
        blocks[..., 208:210] = np.frombuffer(np.array([1e-5], np.float16).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def make_gguf(path, dim=None, layers=None, ffn=None, heads=None, kv_heads=None, vocab=None,
              qtype="f32"):
    """Writes assets/tiny-kjv, or a random model of a given shape (hidden size, layers, ffn,
    heads, kv heads, vocabulary), as a GGUF whose matrices are f32, q8_0 or q4_0 (quantized by
    gguf-py; norms stay f32, as llama.cpp's converter keeps them), one of LLAMA_CPP_MIXES
    (the f32 file quantized by llama.cpp), or RANDOM_BLOCK_MIX (a random model's shape only)."""
    if qtype in LLAMA_CPP_MIXES:
        import ctypes
        import llama_cpp
        f32 = path + ".f32.tmp"
        make_gguf(f32, dim, layers, ffn, heads, kv_heads, vocab)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}")
        status = llama_cpp.llama_model_quantize(f32.encode(), path.encode(), ctypes.byref(params))
        os.remove(f32)
        if status != 0:
            raise SystemExit(f"llama_model_quantize failed for {qtype}")
        print(f"wrote {path} ({qtype} by llama.cpp)", file=sys.stderr)
        return
    import gguf
    from safetensors.numpy import load_file

    folder = os.path.join(ROOT, "assets", "tiny-kjv")
    config = json.load(open(os.path.join(folder, "config.json")))
    tok = json.load(open(os.path.join(folder, "tokenizer.json")))
    weights = {k: v.astype(np.float32) for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}
    name = "tiny-kjv"
    if dim:
        rng = np.random.default_rng(1)
        heads = heads or dim // config["head_dim"]
        head_dim = dim // heads
        config.update(hidden_size=dim, num_hidden_layers=layers, intermediate_size=ffn,
                      num_attention_heads=heads, num_key_value_heads=kv_heads or max(1, heads // 2),
                      head_dim=head_dim, vocab_size=vocab or config["vocab_size"],
                      max_position_embeddings=2048)
        kv = config["num_key_value_heads"] * head_dim
        vocab = config["vocab_size"]
        if qtype == RANDOM_BLOCK_MIX:
            # Only the shapes are read: the blocks are drawn in add().
            r = lambda *s: np.zeros(s, np.float32)
        else:
            r = lambda *s: (rng.standard_normal(s) * 0.02).astype(np.float32)
        weights = {"model.embed_tokens.weight": r(vocab, dim), "model.norm.weight": np.ones(dim, np.float32)}
        for i in range(layers):
            p = f"model.layers.{i}."
            weights.update({
                p + "input_layernorm.weight": np.ones(dim, np.float32),
                p + "post_attention_layernorm.weight": np.ones(dim, np.float32),
                p + "self_attn.q_proj.weight": r(dim, dim), p + "self_attn.k_proj.weight": r(kv, dim),
                p + "self_attn.v_proj.weight": r(kv, dim), p + "self_attn.o_proj.weight": r(dim, dim),
                p + "mlp.gate_proj.weight": r(ffn, dim), p + "mlp.up_proj.weight": r(ffn, dim),
                p + "mlp.down_proj.weight": r(dim, ffn),
            })
        name = f"random-{dim}x{layers}-{qtype}"
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    def permute(w, n_head):
        # Hugging Face's half-split rotary rows -> GGUF's interleaved pairs (as llama.cpp's
        # convert script does).
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(config["head_dim"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config["rope_theta"])
    qtypes = {"f32": (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
              "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
              "q4_0": (gguf.LlamaFileType.MOSTLY_Q4_0, gguf.GGMLQuantizationType.Q4_0),
              "bf16": (gguf.LlamaFileType.MOSTLY_BF16, gguf.GGMLQuantizationType.BF16),
              RANDOM_BLOCK_MIX: (gguf.LlamaFileType.MOSTLY_Q4_K_M, gguf.GGMLQuantizationType.Q4_K)}
    file_type, matrix_type = qtypes[qtype]
    w.add_file_type(file_type)
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    # A larger random model's extra ids get placeholder tokens (no merges reach them).
    vocab += [(f"<extra_{i}>", i) for i in range(len(vocab), config["vocab_size"])]
    special = {t["id"] for t in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for _, i in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    w.add_add_bos_token(False)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    block_rng = np.random.default_rng(2)

    def add(name, t):
        if t.ndim == 2 and qtype == RANDOM_BLOCK_MIX:
            layer = int(name.split(".")[1]) if name.startswith("blk.") else None
            wide = name == "token_embd.weight" or (
                name.endswith(("attn_v.weight", "ffn_down.weight"))
                and more_bits(layer, config["num_hidden_layers"]))
            block_type = gguf.GGMLQuantizationType.Q6_K if wide else matrix_type
            w.add_tensor(name, random_kquant_blocks(block_rng, *t.shape, block_type), raw_dtype=block_type)
        elif t.ndim == 2 and matrix_type != gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, gguf.quants.quantize(t, matrix_type), raw_dtype=matrix_type)
        else:
            w.add_tensor(name, t)

    add("token_embd.weight", weights["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", weights["model.norm.weight"])
    for i in range(config["num_hidden_layers"]):
        for hf, gg in names.items():
            t = weights[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                t = permute(t, heads)
            elif gg == "attn_k":
                t = permute(t, kv_heads)
            add(f"blk.{i}.{gg}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {path} ({name})", file=sys.stderr)


def llama_cpp_peer(gguf_path, webtensor, backends, prompt_tokens, decode_tokens, threads):
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python is not installed: no llama.cpp row", file=sys.stderr)
        return []
    n_ctx = prompt_tokens + decode_tokens + 8
    # logits_all: llama-cpp-python only fills `scores` (read for greedy decode) with it.
    llm = llama_cpp.Llama(gguf_path, n_threads=threads, n_ctx=n_ctx, n_batch=n_ctx,
                          logits_all=True, verbose=False)
    vocab = llm.n_vocab()
    prompt = [(i * 7919 + 1) % vocab for i in range(prompt_tokens)]
    # Same model on both sides: llama.cpp's last-position logits against `webtensor eval`.
    check = prompt[:8]
    out = subprocess.run([webtensor, "eval", "--model", gguf_path, "--backend", "cpu", "--tokens",
                          ",".join(map(str, check))], check=True, capture_output=True, text=True)
    want = np.array(json.loads(out.stdout)[-1])
    llm.eval(check)
    got = np.array(llm.scores[llm.n_tokens - 1])
    error = float(np.abs(got - want).max())
    scale = max(1.0, float(np.abs(want).max()))
    print(f"llama.cpp vs webtensor logits: max error {error:.2e} (scale {scale:.1f})", file=sys.stderr)
    if error > 1e-2 * scale:
        sys.exit(f"llama.cpp and webtensor disagree on {gguf_path} (max logit error {error}): not the same model")
    samples = []
    for _ in range(3):
        llm.reset()
        llm.eval(prompt)
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t = time.perf_counter()
        for _ in range(decode_tokens):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        samples.append(decode_tokens / (time.perf_counter() - t))
    peer_tps = statistics.median(samples)
    version = f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, {threads} threads)"
    print(f"{version}: {peer_tps:.1f} decode tokens/s", file=sys.stderr)
    out = subprocess.run(
        [webtensor, "bench", "--model", gguf_path, "--json", "--prompt-tokens", str(prompt_tokens),
         "--decode-tokens", str(decode_tokens)] + sum((["--backend", b] for b in backends), []),
        check=True, capture_output=True, text=True)
    rows = []
    for r in json.loads(out.stdout):
        if not r.get("checked") or r.get("decode_tokens_per_s") is None:
            continue
        print(f"webtensor {r['backend']}: {r['decode_tokens_per_s']:.1f} decode tokens/s", file=sys.stderr)
        rows.append({"peer": version, "op": "decode", "case": os.path.basename(gguf_path),
                     "tokens_per_s": peer_tps, "webtensor_tokens_per_s": r["decode_tokens_per_s"],
                     "webtensor_backend": r["backend"], "max_logit_error": error})
    return rows


def llama_cpp_sample(gguf_path, prompt_tokens, decode_tokens, threads):
    """One timed llama.cpp sample for `webtensor bench --model PATH --peers`: the prompt of
    webtensor's bench (ids (i·7919 + 1) mod vocab) in one pass, then greedy decode one token
    at a time. Prints one JSON object (tokens/s and the peak RSS, or an error) on stdout."""
    try:
        import llama_cpp
    except ImportError as e:
        print(json.dumps({"error": f"llama-cpp-python is not installed ({e})"}))
        return
    n_ctx = prompt_tokens + decode_tokens + 8
    llm = llama_cpp.Llama(gguf_path, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                          n_batch=n_ctx, logits_all=True, verbose=False)
    vocab = llm.n_vocab()
    prompt = [(i * 7919 + 1) % vocab for i in range(prompt_tokens)]
    llm.eval(prompt[:1])  # warm-up
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    prefill = prompt_tokens / (time.perf_counter() - t)
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t = time.perf_counter()
    for _ in range(decode_tokens):
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    decode = decode_tokens / (time.perf_counter() - t)
    print(json.dumps({"peer": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})",
                      "threads": threads, "prompt_tokens_per_s": prefill,
                      "decode_tokens_per_s": decode, "peak_rss_bytes": peak_rss()}))


def peak_rss():
    """The process's peak resident bytes (VmHWM: interpreter, numpy and llama.cpp included),
    or None where /proc/self/status does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", help="report.json of `webtensor bench --report` (shapes for numpy)")
    ap.add_argument("--gguf", help="a GGUF model for the llama.cpp decode comparison")
    ap.add_argument("--make-gguf", metavar="PATH", help="write the built-in model as GGUF here and use it")
    ap.add_argument("--dim", type=int, help="with --make-gguf: a random model of this hidden size")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--heads", type=int, help="with --dim: attention heads (default dim / 32)")
    ap.add_argument("--kv-heads", type=int, help="with --dim: key/value heads (default heads / 2)")
    ap.add_argument("--vocab", type=int, help="with --dim: vocabulary size (default 512)")
    ap.add_argument("--type", default="f32", choices=["f32", "q8_0", "q4_0", "bf16", RANDOM_BLOCK_MIX] + LLAMA_CPP_MIXES,
                    help="with --make-gguf: the matrices' format (the llama.cpp mixes need "
                         "llama-cpp-python)")
    ap.add_argument("--make-only", action="store_true", help="write the GGUF and stop")
    ap.add_argument("--llama-cpp-sample", action="store_true",
                    help="with --gguf: time llama.cpp once and print JSON (used by "
                         "`webtensor bench --model PATH --peers`)")
    ap.add_argument("--webtensor", default=os.path.join(ROOT, "target", "release", "webtensor"))
    ap.add_argument("--backend", action="append", default=[], help="webtensor backends for decode")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("-o", "--out", help="peers JSON to write")
    args = ap.parse_args()
    if args.llama_cpp_sample:
        return llama_cpp_sample(args.gguf, args.prompt_tokens, args.decode_tokens, args.threads)
    if not args.out and not args.make_only:
        ap.error("-o/--out is required")

    peers = []
    if args.report:
        peers += numpy_peers(json.load(open(args.report)))
    gguf_path = args.gguf
    if args.make_gguf:
        make_gguf(args.make_gguf, args.dim, args.layers, args.ffn or (args.dim or 0) * 11 // 4,
                  args.heads, args.kv_heads, args.vocab, args.type)
        if args.make_only:
            return
        gguf_path = args.make_gguf
    if gguf_path:
        peers += llama_cpp_peer(gguf_path, args.webtensor, args.backend or ["cpu"],
                                args.prompt_tokens, args.decode_tokens, args.threads)
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "peers": peers}, f, indent=1)
    print(f"wrote {args.out} ({len(peers)} peer rows)", file=sys.stderr)


if __name__ == "__main__":
    main()
