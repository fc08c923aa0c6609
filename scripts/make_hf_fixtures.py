#!/usr/bin/env python3
"""Tiny random checkpoints written by transformers itself, with transformers' own logits.

One checkpoint per architecture and rope type webtensor supports, saved as the installed
transformers (5.x) writes them, plus configs in the 4.x style (top-level `rope_theta`,
`rope_scaling`) over the weights of a 5.x case. For each case transformers runs a prompt of
PROMPT_LEN token ids in float32 with eager attention; the logits are the expected values of
native-tests/real_models.rs.

Dimensions are chosen so rope scaling and the sliding windows matter within the prompt (small
`original_max_position_embeddings`, windows shorter than the prompt, a `dynamic` case whose
prompt exceeds `max_position_embeddings`) and the files stay small.

Writes native-tests/fixtures/hf/<case>/{config.json, model.safetensors, logits.f32} (and for
the cases of GREEDY `greedy.json`, transformers' greedy continuation of the prompt) and
native-tests/fixtures/hf/cases.json. Run from the repository root:

    python3 scripts/make_hf_fixtures.py

`--cases NAME...` writes only those cases and keeps the others (the `olmo2` and `smollm3` cases
were added that way, by the transformers version their manifest entries name).

`--keep-tokenizer DIR` also writes each case with a tiny SentencePiece tokenizer into DIR (what
llama.cpp's converter needs; see scripts/make_gguf_fixtures.py).
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch
import transformers
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM,
                          Olmo2Config, Olmo2ForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, SmolLM3Config,
                          SmolLM3ForCausalLM)

OUT = "native-tests/fixtures/hf"
PROMPT_LEN = 48
VOCAB = 128
DIMS = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}

# Short and long factors for a head width of 16 (eight pairs).
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.1 * i for i in range(8)],
            "long_factor": [1.0 + 1.5 * i for i in range(8)]}

# name: (config class, model class, config arguments)
CASES = {
    "llama": (LlamaConfig, LlamaForCausalLM,
              dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "llama3": (LlamaConfig, LlamaForCausalLM,
               dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "llama31": (LlamaConfig, LlamaForCausalLM,
                dict(rope_parameters=LLAMA3_ROPE, max_position_embeddings=512)),
    "llama_linear": (LlamaConfig, LlamaForCausalLM,
                     dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                           "factor": 4.0})),
    "llama_dynamic": (LlamaConfig, LlamaForCausalLM,
                      dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                            "factor": 2.0}, max_position_embeddings=32)),
    "llama_yarn": (LlamaConfig, LlamaForCausalLM,
                   dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                         "factor": 4.0, "original_max_position_embeddings": 16},
                        max_position_embeddings=64)),
    "smollm": (LlamaConfig, LlamaForCausalLM,
               dict(rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                    tie_word_embeddings=True)),
    "mistral": (MistralConfig, MistralForCausalLM,
                dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                     sliding_window=12)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM,
              dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                   tie_word_embeddings=True)),
    "qwen2_swa": (Qwen2Config, Qwen2ForCausalLM,
                  dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                       use_sliding_window=True, sliding_window=10, max_window_layers=1)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM,
              dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                   head_dim=16, num_attention_heads=4, num_key_value_heads=2)),
    "phi3": (Phi3Config, Phi3ForCausalLM,
             dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                  sliding_window=20, pad_token_id=0, eos_token_id=2)),
    # Phi-3.5's `longrope`: per-pair short and long factors, the long ones for a pass longer
    # than `original_max_position_embeddings` (16 here, so the 48-token prompt runs them), and
    # the attention factor from max/original; the `_short` case's original length (64) is
    # beyond the prompt, so it runs the short ones.
    "phi3_longrope": (Phi3Config, Phi3ForCausalLM,
                      dict(rope_parameters=LONGROPE, max_position_embeddings=64,
                           original_max_position_embeddings=16, pad_token_id=0, eos_token_id=2)),
    "phi3_longrope_short": (Phi3Config, Phi3ForCausalLM,
                            dict(rope_parameters=LONGROPE, max_position_embeddings=256,
                                 original_max_position_embeddings=64, pad_token_id=0,
                                 eos_token_id=2)),
    # Norms after each block, q/k norms over the whole projection.
    "olmo2": (Olmo2Config, Olmo2ForCausalLM,
              dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    # Four layers, so that transformers' default `no_rope_layers` (every fourth layer without
    # rope, as llama.cpp runs every `smollm3` GGUF) has a layer without rope.
    "smollm3": (SmolLM3Config, SmolLM3ForCausalLM,
                dict(rope_parameters={"rope_type": "default", "rope_theta": 2000000.0},
                     num_hidden_layers=4, pad_token_id=0)),
    # Gemma 2: GeGLU, (1 + w) norms before and after each block, embeddings scaled by
    # √hidden, tied embeddings, and transformers' default layer pattern (sliding, full, ...)
    # with a window shorter than the prompt; soft-capping small enough to bind, and a
    # `query_pre_attn_scalar` other than head_dim.
    "gemma2": (Gemma2Config, Gemma2ForCausalLM,
               dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                    head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                    num_hidden_layers=4, query_pre_attn_scalar=24, sliding_window=12,
                    attn_logit_softcapping=3.0, final_logit_softcapping=10.0,
                    tie_word_embeddings=True, pad_token_id=0)),
    # Gemma 3: Gemma 2 with per-head q/k norms and no soft-capping; six layers in transformers'
    # default pattern (five sliding, then one full) with a window shorter than the prompt;
    # the sliding layers rotate by their own base (10 000, which llama.cpp assumes) and the
    # full one by 1e6 with linear scaling; a `query_pre_attn_scalar` other than head_dim.
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM,
               dict(rope_parameters={
                   "full_attention": {"rope_type": "linear", "factor": 8.0,
                                      "rope_theta": 1000000.0},
                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                    head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                    num_hidden_layers=6, query_pre_attn_scalar=24, sliding_window=12,
                    tie_word_embeddings=True, pad_token_id=0)),
}

# The cases whose rope scaling or sliding window must move the logits.
SCALED = {"llama31", "llama_linear", "llama_dynamic", "llama_yarn", "mistral", "qwen2_swa", "phi3",
          "phi3_longrope", "phi3_longrope_short",
          "smollm3", "gemma2", "gemma3"}

# Configs as transformers 4.x wrote them, over the weights of a 5.x case: name → (weights of,
# function of the saved config dict).


def v4_llama31(c):
    rope = dict(c.pop("rope_parameters"))
    c["rope_theta"] = rope.pop("rope_theta")
    c["rope_scaling"] = rope
    return c


def v4_llama(c):
    c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
    c["rope_scaling"] = None
    return c


def v4_linear(c):
    rope = dict(c.pop("rope_parameters"))
    c["rope_theta"] = rope.pop("rope_theta")
    c["rope_scaling"] = {"type": "linear", "factor": rope["factor"]}
    return c


V4_CASES = {
    "llama31_v4": ("llama31", v4_llama31),
    "llama_v4": ("llama", v4_llama),
    "llama_linear_v4": ("llama_linear", v4_linear),
}


def randomize(model, seed):
    """Weights of a size that makes every part of the forward pass matter to the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                scale = 3.0 if name == "lm_head.weight" else 1.0
                p.copy_(scale * torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def logits_of(folder, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([ids])).logits[0]
    return out.numpy().astype("<f4")


# The cases whose greedy continuation of the prompt is written too (`greedy.json`): what the
# engine's decode steps (recorded and replayed on a GPU) must draw.
GREEDY = {"olmo2", "smollm3", "gemma2", "gemma3"}
GREEDY_STEPS = 8


def gguf_meaning(folder, ids):
    """transformers' logits of the model a GGUF conversion of `folder` describes. llama.cpp's
    converter does not write Gemma's `query_pre_attn_scalar`, and llama.cpp scales attention
    by 1/√head_dim instead (hidden/heads for the 27B models): these are transformers' logits
    with `query_pre_attn_scalar` = head_dim (`logits_gguf.f32`)."""
    probe = folder + ".gguf"
    shutil.copytree(folder, probe)
    config = json.load(open(os.path.join(folder, "config.json")))
    config["query_pre_attn_scalar"] = config["head_dim"]
    with open(os.path.join(probe, "config.json"), "w") as f:
        json.dump(config, f)
    logits = logits_of(probe, ids)
    shutil.rmtree(probe)
    return logits


# Cases whose logits token by token through transformers' cache are written too
# (`logits_incremental.f32`): for `longrope` they differ from one pass over the prompt, since each
# pass picks the short or long factors by its own longest position, and the keys cached before
# the switch keep the short factors' rotation.
INCREMENTAL = {"phi3_longrope"}


def incremental_logits(folder, ids):
    """transformers' logits of `ids` fed one token at a time through its KV cache."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    rows, cache = [], None
    with torch.no_grad():
        for i in ids:
            out = model(torch.tensor([[i]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0, -1].numpy())
    return np.stack(rows).astype("<f4")


# Cases whose GGUF conversion means another model than the checkpoint (see gguf_meaning).
GGUF_MEANING = {"gemma2", "gemma3"}


def greedy_continuation(folder, ids):
    """transformers' greedy next ids after `ids`, each from a full forward pass, and the
    smallest gap between the best and second-best logit on the way (a near tie would make the
    expected ids depend on rounding)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    seq, gaps = list(ids), []
    with torch.no_grad():
        for _ in range(GREEDY_STEPS):
            last = model(torch.tensor([seq])).logits[0, -1]
            top = torch.topk(last, 2).values
            gaps.append(float(top[0] - top[1]))
            seq.append(int(last.argmax()))
    assert min(gaps) > 1e-2, f"{folder}: a near tie in the greedy continuation ({min(gaps)})"
    return {"ids": seq[len(ids):], "min_gap": min(gaps)}


def plain(config):
    """The same config without rope scaling, sliding windows and layers without rope."""
    c = dict(config)
    if "no_rope_layers" in c:
        c["no_rope_layers"] = [1] * len(c["no_rope_layers"])
    if "full_attention" in c["rope_parameters"]:
        # Gemma 3: one unscaled base for both layer types.
        base = {"rope_type": "default", "rope_theta": 10000.0}
        c["rope_parameters"] = {"full_attention": base, "sliding_attention": base}
    else:
        c["rope_parameters"] = {"rope_type": "default",
                                "rope_theta": c["rope_parameters"]["rope_theta"]}
    for key in ("sliding_window", "use_sliding_window", "layer_types"):
        c.pop(key, None)
    return c


def check_sensitive(folder, ids, logits):
    """Fails unless the case's rope scaling, window or layers without rope change the logits
    noticeably (else the fixture could not catch an engine that ignores them)."""
    config = json.load(open(os.path.join(folder, "config.json")))
    if os.path.basename(folder) not in SCALED:
        return None
    probe = folder + ".plain"
    shutil.copytree(folder, probe)
    with open(os.path.join(probe, "config.json"), "w") as f:
        json.dump(plain(config), f)
    delta = float(np.abs(logits_of(probe, ids) - logits).max())
    shutil.rmtree(probe)
    assert delta > 0.05, f"{folder}: scaling/window changes the logits by only {delta}"
    return delta


def tiny_sentencepiece(folder):
    """A tiny SentencePiece vocabulary (tokenizer.model), what llama.cpp's converter reads."""
    import sentencepiece as spm
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(open(transformers.models.llama.modeling_llama.__file__).read())
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(folder, "tokenizer"), vocab_size=VOCAB,
        model_type="bpe", hard_vocab_limit=False, character_coverage=1.0,
        bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2,
        # llama.cpp's loader looks this token up in every Phi-3 vocabulary.
        user_defined_symbols=["<|endoftext|>"])
    os.remove(corpus)
    os.remove(os.path.join(folder, "tokenizer.vocab"))


# Rope tables at real models' sizes: (name, config arguments, the pass length, for dynamic).
ROPE_TABLES = [
    ("llama31_8b", dict(hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                         "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}), None),
    ("llama32_1b", dict(hidden_size=2048, num_attention_heads=32, max_position_embeddings=131072,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                         "factor": 32.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}), None),
    ("yarn_qwen25", dict(hidden_size=3584, num_attention_heads=28, max_position_embeddings=131072,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0,
                                          "factor": 4.0,
                                          "original_max_position_embeddings": 32768}), None),
    ("yarn_mscale", dict(hidden_size=2048, num_attention_heads=16, max_position_embeddings=163840,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                          "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                                          "beta_fast": 32, "beta_slow": 1,
                                          "original_max_position_embeddings": 4096}), None),
    ("linear_8", dict(hidden_size=4096, num_attention_heads=32, max_position_embeddings=16384,
                      rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                       "factor": 8.0}), None),
    ("dynamic_6000", dict(hidden_size=4096, num_attention_heads=32, max_position_embeddings=4096,
                          rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                           "factor": 2.0}), 6000),
]


def rope_tables():
    """transformers' own frequency tables and attention factors at real models' sizes."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    out = []
    for name, args, seq_len in ROPE_TABLES:
        config = LlamaConfig(**args)
        rope_type = args["rope_parameters"]["rope_type"]
        inv, factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
        out.append({"name": name, "config": config.to_dict(), "seq_len": seq_len or 1,
                    "inv_freq": inv.tolist(), "attention_factor": factor})
    with open(os.path.join(OUT, "rope_tables.json"), "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep-tokenizer", metavar="DIR",
                    help="also write every case with a tokenizer.model into DIR")
    ap.add_argument("--cases", nargs="+", metavar="NAME", choices=list(CASES),
                    help="write only these cases, keeping the other fixtures as they are (each "
                         "case written records the transformers version that wrote it)")
    args = ap.parse_args()
    ids = np.random.default_rng(0).integers(3, VOCAB, PROMPT_LEN).tolist()
    only = args.cases
    if only:
        manifest = json.load(open(os.path.join(OUT, "cases.json")))
        assert manifest["prompt"] == ids
        manifest["cases"] = [c for c in manifest["cases"] if c["name"] not in only]
    else:
        manifest = {"transformers": transformers.__version__, "prompt": ids, "cases": []}
        shutil.rmtree(OUT, ignore_errors=True)
    for seed, (name, (config_cls, model_cls, extra)) in enumerate(CASES.items()):
        if only and name not in only:
            continue
        folder = os.path.join(OUT, name)
        shutil.rmtree(folder, ignore_errors=True)
        config = config_cls(**{**DIMS, **extra})
        torch.manual_seed(seed)
        model = model_cls(config)
        randomize(model, seed)
        model.save_pretrained(folder)
        os.remove(os.path.join(folder, "generation_config.json"))
        logits = logits_of(folder, ids)
        logits.tofile(os.path.join(folder, "logits.f32"))
        if name in GGUF_MEANING:
            gguf_meaning(folder, ids).tofile(os.path.join(folder, "logits_gguf.f32"))
        if name in INCREMENTAL:
            incremental_logits(folder, ids).tofile(os.path.join(folder, "logits_incremental.f32"))
        if name in GREEDY:
            with open(os.path.join(folder, "greedy.json"), "w") as f:
                json.dump(greedy_continuation(folder, ids), f)
        entry = {"name": name, "weights": name}
        if only:
            entry["transformers"] = transformers.__version__
        manifest["cases"].append(entry)
        delta = check_sensitive(folder, ids, logits)
        print(f"{name}: logits |max| {np.abs(logits).max():.2f}, without its rope scaling "
              f"or window they move by {delta}")
    for name, (base, rewrite) in () if only else V4_CASES.items():
        folder = os.path.join(OUT, name)
        os.makedirs(folder)
        config = json.load(open(os.path.join(OUT, base, "config.json")))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(rewrite(config), f, indent=2)
        # transformers reads the 4.x config over the same weights: it must agree with itself.
        shutil.copy(os.path.join(OUT, base, "model.safetensors"), folder)
        logits = logits_of(folder, ids)
        os.remove(os.path.join(folder, "model.safetensors"))
        base_logits = np.fromfile(os.path.join(OUT, base, "logits.f32"), "<f4")
        assert np.abs(logits.ravel() - base_logits).max() < 1e-5, name
        logits.tofile(os.path.join(folder, "logits.f32"))
        manifest["cases"].append({"name": name, "weights": base})
        print(f"{name}: 4.x config over {base}'s weights")
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    if not only:
        rope_tables()
    if args.keep_tokenizer:
        shutil.rmtree(args.keep_tokenizer, ignore_errors=True)
        os.makedirs(args.keep_tokenizer)
        tiny_sentencepiece(args.keep_tokenizer)
        for name in only or CASES:
            dst = os.path.join(args.keep_tokenizer, name)
            shutil.copytree(os.path.join(OUT, name), dst)
            for expected in ("logits.f32", "logits_gguf.f32", "greedy.json"):
                if os.path.exists(os.path.join(dst, expected)):
                    os.remove(os.path.join(dst, expected))
            shutil.copy(os.path.join(args.keep_tokenizer, "tokenizer.model"), dst)
            with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
                json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": False}, f)


if __name__ == "__main__":
    main()
