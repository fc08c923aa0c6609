#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets (fuzz/corpus/<target>/seed-*): one small valid
input per shape of input each target parses, which libFuzzer then mutates. Run from the
checkout; the minimized corpora that fuzzing grows from these are committed next to them."""
import json
import struct
from pathlib import Path

from gguf_raw import gguf

root = Path(__file__).resolve().parent.parent
corpus = root / "fuzz" / "corpus"


def put(target, name, data):
    d = corpus / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data if isinstance(data, bytes) else data.encode())


f32 = lambda n: b"".join(struct.pack("<f", (i % 7) / 7 - 0.5) for i in range(n))
q8 = lambda blocks: (struct.pack("<e", 0.01) + bytes(range(32))) * blocks
tokens = ["<unk>", "<s>", "</s>", "a", "b", "ab", "▁", "▁a"]
meta = [
    ("general.architecture", 8, "llama"),
    ("llama.vocab_size", 4, 8),
    ("llama.embedding_length", 4, 8),
    ("llama.feed_forward_length", 4, 16),
    ("llama.block_count", 4, 1),
    ("llama.attention.head_count", 4, 2),
    ("llama.context_length", 4, 64),
    ("llama.rope.freq_base", 6, 10000.0),
    ("tokenizer.ggml.model", 8, "llama"),
    ("tokenizer.ggml.tokens", 9, (8, tokens)),
    ("tokenizer.ggml.scores", 9, (6, [float(-i) for i in range(8)])),
    ("tokenizer.ggml.token_type", 9, (5, [2, 3, 3, 1, 1, 1, 1, 1])),
    ("tokenizer.ggml.bos_token_id", 4, 1),
]
put("gguf", "llama-vocab", gguf(meta, [("token_embd.weight", 0, [8, 8], f32(64)),
                                      ("blk.0.ffn_up.weight", 8, [2, 32], q8(2))]))
gpt2 = meta[:8] + [("tokenizer.ggml.model", 8, "gpt2"),
                   ("tokenizer.ggml.tokens", 9, (8, ["a", "b", "ab", "Ġ", "Ġa", "c", "d", "e"])),
                   ("tokenizer.ggml.merges", 9, (8, ["a b", "Ġ a"]))]
put("gguf", "gpt2-vocab", gguf(gpt2, [("output_norm.weight", 0, [8], f32(8))]))

def safetensors(tensors):
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data

put("safetensors", "file", b"\0" + safetensors([("a", "F32", [2, 2], f32(4)), ("b", "F16", [3], b"\0\x3c" * 3),
                                                 ("c", "BF16", [1], b"\x80\x3f")]))
put("safetensors", "index", b"\1" + json.dumps({"metadata": {"total_size": 16}, "weight_map": {
    "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}).encode())

put("config", "tiny-kjv", (root / "assets/tiny-kjv/config.json").read_bytes())
put("config", "gqa", json.dumps({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
                                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "head_dim": 16, "rms_norm_eps": 1e-5, "eos_token_id": [7, 8],
                                 "bos_token_id": 1, "tie_word_embeddings": True}))

tok = (root / "assets/tiny-kjv/tokenizer.json").read_bytes()
put("tokenizer", "tiny-kjv", tok + b"\0In the beginning God created the heaven and the earth.")
small = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": ["a b"]},
         "added_tokens": [{"id": 4, "content": "<s>", "special": True}],
         "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}}
put("tokenizer", "small-bpe", json.dumps(small).encode() + b"\0ab ba <s>abab")

for name, text in [("verse", "And God said, Let there be light: and there was light."),
                   ("unicode", "héllo wörld ✓ 漢字 🙂\t\n\r"), ("empty", ""),
                   ("long-word", "a" * 300), ("bytes", "\x00\x01\x7f")]:
    put("encode", name, text.encode())

for name, req in [("get", "GET /index.html?v=1 HTTP/1.1\r\nHost: localhost\r\n\r\n"),
                  ("head-pkg", "HEAD /pkg/webtensor_bg.wasm HTTP/1.1\r\n\r\n"),
                  ("post", "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"),
                  ("escape", "GET /pkg/%2e%2e/secret%20file HTTP/1.0\n\n"),
                  ("bare-lf", "GET / HTTP/1.1\nHost: x\n\n")]:
    put("http", name, req.encode())
print("seeds written under", corpus)
