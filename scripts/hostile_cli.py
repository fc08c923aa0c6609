#!/usr/bin/env python3
"""Runs the release CLI on a few hostile inputs of every class of issue 14 (sizes that
overflow, whole-context caches, huge tokenizer ids, duplicates, shard paths leaving the folder,
truncated values, quadratic prompts, chat templates and tokenizer patterns without end) under an 8 GB address-space limit, and fails if any run
panics, aborts or is killed: each must end with exit 0 or a one-line error.

    cargo build --release && python3 scripts/hostile_cli.py [path/to/webtensor]

The inputs are written to a temporary folder; the classes themselves are tested one by one,
with their messages, in native-tests/hostile.rs. This is the end-to-end check across them."""
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from gguf_raw import gguf, string as s

root = Path(__file__).resolve().parent.parent
exe = sys.argv[1] if len(sys.argv) > 1 else str(root / "target/release/webtensor")
LIMIT = 8 << 30


V, H, F = 8, 8, 16
f32 = lambda n: struct.pack(f"<{n}f", *[((i * 7) % 11) / 11 - 0.5 for i in range(n)])
TOKENS = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab"]


def meta(**over):
    m = {
        "general.architecture": (8, "llama"), "llama.vocab_size": (4, V),
        "llama.embedding_length": (4, H), "llama.feed_forward_length": (4, F),
        "llama.block_count": (4, 1), "llama.attention.head_count": (4, 2),
        "llama.attention.head_count_kv": (4, 2), "llama.context_length": (4, 64),
        "tokenizer.ggml.model": (8, "llama"), "tokenizer.ggml.tokens": (9, (8, TOKENS)),
        "tokenizer.ggml.scores": (9, (6, [float(-i) for i in range(V)])),
        "tokenizer.ggml.token_type": (9, (5, [2, 3, 3, 1, 1, 1, 1, 1])),
        "tokenizer.ggml.bos_token_id": (4, 1), "tokenizer.ggml.eos_token_id": (4, 2),
    }
    m.update(over)
    return [(k, t, v) for k, (t, v) in m.items()]


def tensors(layers=1):
    t = [("token_embd.weight", 0, [V, H], f32(V * H), None)]
    for i in range(layers):
        for n, shape in [("attn_norm", [H]), ("attn_q", [H, H]), ("attn_k", [H, H]), ("attn_v", [H, H]),
                         ("attn_output", [H, H]), ("ffn_norm", [H]), ("ffn_gate", [F, H]),
                         ("ffn_up", [F, H]), ("ffn_down", [H, F])]:
            n_el = 1
            for d in shape:
                n_el *= d
            t.append((f"blk.{i}.{n}.weight", 0, shape, f32(n_el), None))
    t.append(("output_norm.weight", 0, [H], f32(H), None))
    return t


def safetensors(entries, data):
    h = json.dumps(entries).encode()
    return struct.pack("<Q", len(h)) + h + data


def cases(tmp):
    """(class, name, files {relative path: bytes}, CLI arguments with {m} for the model)."""
    gen = ["generate", "--model", "{m}", "--backend", "cpu", "--max-tokens", "4", "--prompt", "a b"]
    evl = ["eval", "--model", "{m}", "--backend", "cpu", "--tokens", "1,2,3"]
    ok = gguf(meta(), tensors())
    yield "baseline", "valid tiny model", {"m.gguf": ok}, gen
    # 1. sizes from files
    yield "sizes", "block_count 2^60", {"m.gguf": gguf(meta(**{"llama.block_count": (10, 1 << 60)}), tensors())}, gen
    yield "sizes", "rope.dimension_count 2^63", {"m.gguf": gguf(meta(**{"llama.rope.dimension_count": (10, 1 << 63)}), tensors())}, gen
    yield "sizes", "embedding_length 2^62", {"m.gguf": gguf(meta(**{"llama.embedding_length": (10, 1 << 62)}), tensors())}, gen
    yield "sizes", "head_count 0", {"m.gguf": gguf(meta(**{"llama.attention.head_count": (4, 0)}), tensors())}, gen
    t = tensors()
    t[0] = ("token_embd.weight", 8, [(1 << 32) - 1, 1 << 32], b"\0" * 34, None)
    yield "sizes", "Q8_0 of shape [2^32-1, 2^32]", {"m.gguf": gguf(meta(), t)}, gen
    t = tensors()
    t[0] = ("token_embd.weight", 0, [1 << 62, 4], b"", None)
    yield "sizes", "F32 of shape [2^62, 4]", {"m.gguf": gguf(meta(), t)}, gen
    t = tensors()
    t[1] = ("blk.0.attn_norm.weight", 0, [H], f32(H), 1 << 62)
    yield "sizes", "tensor offset 2^62", {"m.gguf": gguf(meta(), t)}, gen
    yield "sizes", "2^40 tensors declared", {"m.gguf": b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0)}, gen
    yield "sizes", "2^40 metadata keys declared", {"m.gguf": b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 40)}, gen
    yield "sizes", "string of length 2^63", {"m.gguf": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 63)}, gen
    yield "sizes", "array of 2^60 u64", {"m.gguf": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + s("k") + struct.pack("<IIQ", 9, 10, 1 << 60)}, gen
    yield "sizes", "nested arrays 10^5 deep", {"m.gguf": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + s("k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 100000}, gen
    kjv_config = (root / "assets/tiny-kjv/config.json").read_bytes()
    yield "sizes", "safetensors F32 [2^62] at [0,0]", {
        "hf/model.safetensors": safetensors({"w": {"dtype": "F32", "shape": [1 << 62], "data_offsets": [0, 0]}}, b""),
        "hf/config.json": kjv_config}, [a.replace("{m}", "{m}/hf") for a in gen]
    yield "sizes", "safetensors header length 2^63", {
        "hf/model.safetensors": struct.pack("<Q", 1 << 63) + b"{}", "hf/config.json": kjv_config}, [a.replace("{m}", "{m}/hf") for a in gen]
    yield "sizes", "config num_hidden_layers 2^60", {
        "hf/model.safetensors": (root / "assets/tiny-kjv/model.safetensors").read_bytes(),
        "hf/config.json": kjv_config.replace(b'"num_hidden_layers": 4', b'"num_hidden_layers": 1152921504606846976')}, \
        [a.replace("{m}", "{m}/hf") for a in gen]
    # 2. caches for the whole context
    yield "kv cache", "context 2^31, eval 3 tokens", {"m.gguf": gguf(meta(**{"llama.context_length": (10, 1 << 31)}), tensors())}, evl
    yield "kv cache", "context 2^40, generate", {"m.gguf": gguf(meta(**{"llama.context_length": (10, 1 << 40)}), tensors())}, gen
    # 3. tokenizer ids; metadata memory
    kjv = root / "assets/tiny-kjv"
    hf = {"hf/config.json": (kjv / "config.json").read_bytes(),
          "hf/model.safetensors": (kjv / "model.safetensors").read_bytes()}
    on_hf = [a.replace("{m}", "{m}/hf") for a in gen]
    for big in [1 << 40, (1 << 64) - 1, 1 << 25, -1]:
        tok = {"model": {"type": "BPE", "vocab": {"a": 0, "b": big}, "merges": []}, "decoder": {"type": "ByteLevel"}}
        yield "tokenizer ids", f"tokenizer.json id {big}", {**hf, "hf/tokenizer.json": json.dumps(tok).encode()}, on_hf
    tok = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a x"]}}
    yield "tokenizer", "merge naming a missing piece", {**hf, "hf/tokenizer.json": json.dumps(tok).encode()}, on_hf
    yield "tokenizer", "tokenizer.json not JSON", {**hf, "hf/tokenizer.json": b"{\"model\": "}, on_hf
    many = [("k", 9, (8, ["x"] * (1 << 20)))]
    yield "metadata memory", "1 Mi one-char strings", {"m.gguf": gguf(meta() + many, tensors())}, gen
    yield "tokenizer ids", "GGUF added token id 2^40 as bos", {"m.gguf": gguf(meta(**{"tokenizer.ggml.bos_token_id": (10, 1 << 40)}), tensors())}, gen
    yield "tokenizer ids", "GGUF scores shorter than tokens", {"m.gguf": gguf(meta(**{"tokenizer.ggml.scores": (9, (6, [0.0]))}), tensors())}, gen
    # 4. duplicates
    yield "duplicates", "repeated metadata key", {"m.gguf": gguf(meta() + [("llama.embedding_length", 4, 16)], tensors())}, gen
    yield "duplicates", "repeated tensor name", {"m.gguf": gguf(meta(), tensors() + [tensors()[-1]])}, gen
    # 5. shard paths
    for shard in ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors", "", "."]:
        idx = {"weight_map": {"model.embed_tokens.weight": shard}}
        yield "shard escape", f"shard {shard!r}", {"hf/model.safetensors.index.json": json.dumps(idx).encode(),
                                                    "hf/config.json": hf["hf/config.json"],
                                                    "outside.safetensors": hf["hf/model.safetensors"]}, \
            on_hf
    # 6. hidden errors, truncated values
    yield "truncation", "bos_token_id 2^32+1", {"m.gguf": gguf(meta(**{"tokenizer.ggml.bos_token_id": (10, (1 << 32) + 1)}), tensors())}, gen
    t = tensors()
    t[1] = ("blk.0.attn_norm.weight", 8, [H], f32(H), None)
    yield "type vs bytes", "f32 bytes declared Q8_0", {"m.gguf": gguf(meta(), t)}, gen
    yield "hidden error", "broken vocabulary", {"m.gguf": gguf(meta(**{"tokenizer.ggml.token_type": (9, (5, [1]))}), tensors())}, gen
    yield "CLI", "--max-tokens 2^64-1", {"m.gguf": ok}, gen[:-4] + ["--max-tokens", str((1 << 64) - 1), "--prompt", "a"]
    yield "CLI", "--resident-layers 2^64-1", {"m.gguf": ok}, gen + ["--resident-layers", str((1 << 64) - 1)]
    yield "CLI", "eval token 2^32+5", {"m.gguf": ok}, evl[:-1] + [str((1 << 32) + 5)]
    yield "CLI", "eval token 4 billion", {"m.gguf": ok}, evl[:-1] + ["4000000000"]
    yield "CLI", "top-k 2^64-1, top-p NaN, temperature inf", {"m.gguf": ok}, gen + ["--top-k", str((1 << 64) - 1), "--top-p", "NaN", "--temperature", "inf"]
    # 7. quadratic work
    yield "quadratic", "100 KiB one-word prompt", {"m.gguf": ok}, gen[:-1] + ["a" * (100 << 10)]
    yield "quadratic", "100 KiB prompt on the built-in model", {}, ["generate", "--backend", "cpu", "--max-tokens", "2", "--prompt", "ab" * (50 << 10)]
    # 8. chat templates and tokenizer patterns from the files: loops and growth without end
    chat = gen + ["--chat"]
    double = "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
    spin = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}"
    for name, template in [("doubling a string 40 times", double), ("10,000 x 10,000 loops", spin)]:
        yield "templates", f"GGUF chat template {name}", {"m.gguf": gguf(meta(**{"tokenizer.chat_template": (8, template)}), tensors())}, chat
        yield "templates", f"--chat-template {name}", {"m.gguf": ok, "t.jinja": template.encode()}, chat + ["--chat-template", "{d}/t.jinja"]
    tok = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "decoder": {"type": "ByteLevel"},
           "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "((a|a)*)(?!a)b"}, "behavior": "Isolated"}}
    yield "tokenizer", "Split pattern backtracking without end", {**hf, "hf/tokenizer.json": json.dumps(tok).encode()}, \
        on_hf[:-1] + ["a" * 64]
    # Arbitrary junk
    yield "junk", "empty file", {"m.gguf": b""}, gen
    yield "junk", "truncated valid file", {"m.gguf": ok[: len(ok) // 2]}, gen
    yield "junk", "folder with nothing", {"hf/x": b""}, [a.replace("{m}", "{m}/hf") for a in gen]


def main():
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, (cls, name, files, args) in enumerate(cases(tmp)):
            case = Path(tmp) / str(n)
            for rel, data in files.items():
                p = case / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
            model = case / "m.gguf" if (case / "m.gguf").exists() else case
            argv = [exe] + [a.replace("{m}", str(model) if a == "{m}" else str(case)).replace("{d}", str(case)) for a in args]
            try:
                r = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=120,
                                   preexec_fn=limit, env={**os.environ, "RUST_BACKTRACE": "0"})
                code, err = r.returncode, r.stderr
            except subprocess.TimeoutExpired:
                code, err = "timeout", ""
            bad = code not in (0, 1, 2) or "panicked" in err or "memory allocation" in err
            failures += bad
            line = next((l for l in err.splitlines() if "error" in l.lower()), err.strip().splitlines()[-1] if err.strip() else "")
            print(f"{'FAIL' if bad else 'ok  '} [{cls}] {name}: exit {code}: {line[:220]}")
            if bad:
                print(err[-2000:])
    print(f"{failures} failures")
    sys.exit(1 if failures else 0)


main()
