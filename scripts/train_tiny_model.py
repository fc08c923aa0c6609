#!/usr/bin/env python3
"""Trains webtensor's built-in default model: a tiny Llama-architecture model on the King
James Bible (public domain), written as a Hugging Face model folder.

    apt-get install bible-kjv        # the text (Debian's bible-kjv-text), via `bible`
    pip install jax numpy regex      # CPU JAX is enough: the model has ~0.8M parameters
    python3 scripts/train_tiny_model.py [--steps 2000] [--out assets/tiny-kjv]

Output folder: config.json (LlamaConfig), model.safetensors (f16), tokenizer.json (a
byte-level BPE learned here, Hugging Face format), tokenizer_check.json (sample texts and
their ids from this script's encoder, for the Rust tokenizer's tests), README.md.
The architecture is exactly what webtensor's engine runs: RMSNorm, rotary embeddings in the
Hugging Face half-split layout, grouped-query attention, SwiGLU, tied embeddings.
"""
import argparse
import collections
import json
import math
import os
import struct
import subprocess
import time

import numpy as np
import regex

# ---- text -----------------------------------------------------------------------------------

def kjv_text():
    raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    verses = []
    for line in raw.splitlines():
        ref, _, verse = line.partition(" ")
        if verse.strip():
            verses.append(verse.strip())
    return verses

# ---- byte-level BPE (GPT-2 conventions, so tokenizer.json is the standard format) ------------

SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))

BYTE_CHAR = bytes_to_unicode()
SPECIALS = ["<s>", "</s>"]

def words_of(text):
    return ["".join(BYTE_CHAR[b] for b in w.encode("utf-8")) for w in SPLIT.findall(text)]

def learn_bpe(verses, vocab_size):
    counts = collections.Counter()
    for v in verses:
        counts.update(words_of(v + "\n"))
    words = {tuple(w): c for w, c in counts.items()}
    merges = []
    n_merges = vocab_size - len(SPECIALS) - 256
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        merged = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        words = merged
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[BYTE_CHAR[b]] = len(vocab)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    return vocab, merges

def encode(text, vocab, ranks, cache):
    ids = []
    for w in words_of(text):
        if w not in cache:
            parts = list(w)
            while len(parts) > 1:
                best = min(range(len(parts) - 1),
                           key=lambda i: ranks.get((parts[i], parts[i + 1]), math.inf))
                if (parts[best], parts[best + 1]) not in ranks:
                    break
                parts[best:best + 2] = [parts[best] + parts[best + 1]]
            cache[w] = [vocab[p] for p in parts]
        ids.extend(cache[w])
    return ids

def tokenizer_json(vocab, merges):
    return {
        "version": "1.0",
        "added_tokens": [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True} for s in SPECIALS],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }

# ---- model ----------------------------------------------------------------------------------

def config_json(vocab_size, args):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab_size, "hidden_size": args.dim,
        "intermediate_size": args.ffn, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "head_dim": args.dim // args.heads, "max_position_embeddings": args.context,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_theta": 10000.0,
        "attention_bias": False, "tie_word_embeddings": True,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float16",
    }

def init_params(key, cfg):
    import jax
    d, f, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    keys = iter(jax.random.split(key, 8 * cfg["num_hidden_layers"] + 2))
    normal = lambda shape, std: std * jax.random.normal(next(keys), shape)
    p = {"model.embed_tokens.weight": normal((cfg["vocab_size"], d), 0.02),
         "model.norm.weight": np.ones(d, np.float32)}
    out_std = 0.02 / math.sqrt(2 * cfg["num_hidden_layers"])
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        p[pre + "input_layernorm.weight"] = np.ones(d, np.float32)
        p[pre + "post_attention_layernorm.weight"] = np.ones(d, np.float32)
        p[pre + "self_attn.q_proj.weight"] = normal((h * hd, d), 0.02)
        p[pre + "self_attn.k_proj.weight"] = normal((kv * hd, d), 0.02)
        p[pre + "self_attn.v_proj.weight"] = normal((kv * hd, d), 0.02)
        p[pre + "self_attn.o_proj.weight"] = normal((d, h * hd), out_std)
        p[pre + "mlp.gate_proj.weight"] = normal((f, d), 0.02)
        p[pre + "mlp.up_proj.weight"] = normal((f, d), 0.02)
        p[pre + "mlp.down_proj.weight"] = normal((d, f), out_std)
    return p

def forward(p, ids, cfg):
    import jax.numpy as jnp
    d, hd = cfg["hidden_size"], cfg["head_dim"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps = cfg["rms_norm_eps"]
    b, t = ids.shape

    def rms(x, w):
        return x * (1.0 / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + eps)) * w

    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
    ang = np.arange(t, dtype=np.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang), jnp.sin(ang)

    def rope(x):  # x [b, t, heads, hd], half-split pairs (i, i + hd/2)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], -1)

    mask = np.tril(np.ones((t, t), bool))
    x = p["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        hn = rms(x, p[pre + "input_layernorm.weight"])
        q = rope((hn @ p[pre + "self_attn.q_proj.weight"].T).reshape(b, t, h, hd))
        k = rope((hn @ p[pre + "self_attn.k_proj.weight"].T).reshape(b, t, kv, hd))
        v = (hn @ p[pre + "self_attn.v_proj.weight"].T).reshape(b, t, kv, hd)
        k = jnp.repeat(k, h // kv, axis=2)
        v = jnp.repeat(v, h // kv, axis=2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        s = jnp.where(mask, s, -1e30)
        a = jnp.einsum("bhqk,bkhd->bqhd", jax_softmax(s), v).reshape(b, t, h * hd)
        x = x + a @ p[pre + "self_attn.o_proj.weight"].T
        hn = rms(x, p[pre + "post_attention_layernorm.weight"])
        g = hn @ p[pre + "mlp.gate_proj.weight"].T
        u = hn @ p[pre + "mlp.up_proj.weight"].T
        x = x + (g / (1 + jnp.exp(-g)) * u) @ p[pre + "mlp.down_proj.weight"].T
    x = rms(x, p["model.norm.weight"])
    return x @ p["model.embed_tokens.weight"].T

def jax_softmax(s):
    import jax
    return jax.nn.softmax(s, axis=-1)

def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = np.asarray(tensors[name], dtype=np.float16)
        raw = data.tobytes()
        header[name] = {"dtype": "F16", "shape": list(data.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)

CHECK_TEXTS = [
    "In the beginning God created the heaven and the earth.\n",
    "And Jesus answered and said unto them, Verily I say unto you,",
    "  Numbers 3:16 and 1,000 'quoted' words... done\n\nnext",
    "naïve café — Zürich ünd 東京",
]

def write_tokenizer_check(out_dir):
    """Encodes CHECK_TEXTS with this script's BPE and tokenizer.json's vocab and merges, so the
    Rust tokenizer can be checked against an independent implementation."""
    with open(os.path.join(out_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    merges = [tuple(m.split(" ")) for m in tok["model"]["merges"]]
    ranks = {m: i for i, m in enumerate(merges)}
    cases = [{"text": t, "ids": encode(t, vocab, ranks, {})} for t in CHECK_TEXTS]
    with open(os.path.join(out_dir, "tokenizer_check.json"), "w") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-check-only", action="store_true",
                    help="only (re)write tokenizer_check.json from an existing tokenizer.json")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "assets", "tiny-kjv"))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=352)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    if args.tokenizer_check_only:
        write_tokenizer_check(args.out)
        return

    import jax
    import jax.numpy as jnp

    verses = kjv_text()
    t0 = time.time()
    vocab, merges = learn_bpe(verses, args.vocab)
    ranks = {m: i for i, m in enumerate(merges)}
    cache = {}
    stream = []
    starts = []
    for v in verses:
        starts.append(len(stream))
        stream.extend(encode(v + "\n", vocab, ranks, cache))
    stream = np.array(stream, np.int32)
    starts = np.array([s for s in starts if s + args.seq < len(stream)], np.int64)
    print(f"{len(verses)} verses, {len(stream)} tokens, vocab {len(vocab)} "
          f"({time.time() - t0:.0f} s)", flush=True)

    cfg = config_json(len(vocab), args)
    params = {k: jnp.asarray(v, jnp.float32) for k, v in init_params(jax.random.PRNGKey(0), cfg).items()}
    bos = vocab["<s>"]

    def loss_fn(p, batch):
        logits = forward(p, batch[:, :-1], cfg)
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(logp, batch[:, 1:, None], -1))

    @jax.jit
    def step(p, m, v, batch, lr, t):
        loss, g = jax.value_and_grad(loss_fn)(p, batch)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.99 * v + 0.01 * g * g, v, g)
        p = jax.tree.map(lambda p, m, v: p - lr * (m / (1 - 0.9 ** t)) /
                         (jnp.sqrt(v / (1 - 0.99 ** t)) + 1e-8), p, m, v)
        return p, m, v, loss

    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    rng = np.random.default_rng(0)
    t0 = time.time()
    for it in range(1, args.steps + 1):
        s = rng.choice(starts, args.batch)
        rows = np.stack([np.concatenate([[bos], stream[i:i + args.seq]]) for i in s])
        warm = min(1.0, it / 100)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * it / args.steps)))
        params, m, v, loss = step(params, m, v, jnp.asarray(rows), lr, it)
        if it % 50 == 0 or it == 1:
            print(f"step {it} loss {float(loss):.3f} ({time.time() - t0:.0f} s)", flush=True)

    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"),
                      {k: np.asarray(v) for k, v in params.items()})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(vocab, merges), f, ensure_ascii=False)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(f"""# tiny-kjv: webtensor's built-in default model

A {sum(int(np.prod(x.shape)) for x in params.values()):,}-parameter Llama-architecture model
trained by `scripts/train_tiny_model.py` ({args.steps} steps, final training loss
{float(loss):.3f}) on the King James Version of the Bible, whose text is in the public domain
(taken from Debian's `bible-kjv-text` package). Byte-level BPE tokenizer with {len(vocab)}
tokens learned from the same text. Weights are f16 safetensors; the folder is a Hugging Face
model folder (config.json, model.safetensors, tokenizer.json).

It writes KJV-flavoured English, not sense: it exists so `webtensor generate` works on a fresh
machine with no download, and as a small real model for tests.
""")
    write_tokenizer_check(args.out)
    print("wrote", args.out)

if __name__ == "__main__":
    main()
