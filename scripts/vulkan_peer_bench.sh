#!/usr/bin/env bash
# llama.cpp's Vulkan backend against our wgpu backend on this machine's Vulkan device (Mesa's
# lavapipe where there is no GPU), on one GGUF, in turns: llama-bench, then
# `webtensor bench --model`, three rounds; then min/median/max and the ratio
# (scripts/peer_table.py). For a quiet machine: it refuses to time when the 1-minute load is
# above 0.5, unless --force (whose figures are then not worth reporting).
#
#   scripts/build_llama_cpp_peer.sh && cargo build --release
#   python3 benches/peers.py --make-gguf target/models/smollm-q4_0.gguf --dim 576 --layers 30 \
#     --heads 9 --kv-heads 3 --ffn 1536 --vocab 49152 --type q4_0 --make-only
#   scripts/vulkan_peer_bench.sh [--force] [MODEL.gguf [PROMPT_TOKENS [DECODE_TOKENS]]]
#
# Environment: WEBTENSOR (default target/release/webtensor), LLAMA_BENCH (default
# target/peer/bin/llama-bench), VK_ICD_FILENAMES (default lavapipe's when it is installed),
# GGML_VK_VISIBLE_DEVICES (default 0), ROUNDS (3).
# Both programs see the same Vulkan driver. Output: target/peer-bench/ (each run's JSON and
# stderr, and peer.json).
set -u
cd "$(dirname "$0")/.." || exit

force=0
if [ "${1:-}" = --force ]; then
  force=1
  shift
fi
model=${1:-target/models/smollm-q4_0.gguf}
prompt=${2:-16}
decode=${3:-32}
rounds=${ROUNDS:-3}
webtensor=${WEBTENSOR:-target/release/webtensor}
llama_bench=${LLAMA_BENCH:-target/peer/bin/llama-bench}
lvp=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
if [ -z "${VK_ICD_FILENAMES:-}" ] && [ -f "$lvp" ]; then
  export VK_ICD_FILENAMES=$lvp
fi
# ggml passes over CPU-type Vulkan devices such as lavapipe unless they are named.
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
export WGPU_BACKEND=vulkan

for f in "$model" "$webtensor" "$llama_bench"; do
  if [ ! -e "$f" ]; then
    echo "missing: $f (see the header of $0)" >&2
    exit 2
  fi
done

load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
  echo "warning: the 1-minute load is $load (above 0.5): other work would skew the timings." >&2
  if [ $force = 0 ]; then
    echo "Not timing. Run it on a quiet machine, or with --force for a smoke test." >&2
    exit 1
  fi
  echo "--force: timing anyway; do not report these figures." >&2
fi

runs=target/peer-bench
rm -rf "$runs"
mkdir -p "$runs"
echo "model $model, prompt $prompt tokens, decode $decode, $rounds rounds, Vulkan ICD ${VK_ICD_FILENAMES:-default}"

# one ROUND WHO COMMAND...: a run, its stdout (JSON) and stderr kept in $runs.
one() {
  local round=$1 who=$2 start=$SECONDS rc
  shift 2
  echo "== round $round: $who"
  "$@" >"$runs/$who-$round.json" 2>"$runs/$who-$round.err"
  rc=$?
  echo "$rc $((SECONDS - start))" >"$runs/$who-$round.rc"
  if [ $rc != 0 ]; then
    echo "   exit status $rc:"
    tail -5 "$runs/$who-$round.err"
  fi
}

for i in $(seq "$rounds"); do
  one "$i" llama.cpp-vulkan "$llama_bench" -m "$model" -p "$prompt" -n "$decode" -ngl 99 -r 3 -o json
  one "$i" webtensor "$webtensor" bench --model "$model" --backend wgpu --prompt-tokens "$prompt" \
    --decode-tokens "$decode" --runs 1 --json
done
grep -ahE '^ggml_vulkan: [0-9]' "$runs"/llama.cpp-vulkan-1.err
python3 scripts/peer_table.py "$runs" "$runs/peer.json"
