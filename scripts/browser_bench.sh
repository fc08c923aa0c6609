#!/usr/bin/env bash
# The Chromium speed comparison (issues 12, 13): webtensor's wasm cpu backend and wllama
# (llama.cpp in wasm) at the same thread counts, and webtensor on WebGPU, generating from one
# GGUF in one headless, cross-origin isolated Chromium page, alternating runs, printed as a
# Markdown table of min / median / max tokens/s (web/bench/chromium.mjs).
# A benchmark, not a test: scripts/test.sh does not run it; run it on a quiet machine.
#
#   scripts/browser_bench.sh                 # SmolLM-135M-shape Q4_0, cpu:1,wllama:1,cpu:2,wllama:2, 3 runs of 8 tokens
#   BENCH_RUNS=5 BENCH_TOKENS=32 scripts/browser_bench.sh
#   BENCH_PATHS=wgpu,cpu:1,wllama-cpu:1 scripts/browser_bench.sh      # paths, N threads after :
#   BENCH_MODEL=other.gguf BENCH_JSON=target/browser-bench.json scripts/browser_bench.sh
#   BENCH_PATHS=wgpu BENCH_CHROMIUM_FLAGS=--enable-dawn-features=disable_robustness scripts/browser_bench.sh
#                                            # a diagnosis: the wgpu path without Dawn's bounds checks
#
# Makes what is missing: the model (random weights, SmolLM-135M's shape, with gguf-py through
# benches/peers.py), web/pkg (web/build.sh), the webtensor binary that serves the page, and the
# npm packages (playwright-core for the harness, @wllama/wllama at the version in
# web/bench/package-lock.json).
set -euo pipefail
cd "$(dirname "$0")/.."

export BENCH_MODEL="${BENCH_MODEL:-target/models/smollm-q4_0.gguf}"
if [ ! -f "$BENCH_MODEL" ]; then
  [ "$BENCH_MODEL" = target/models/smollm-q4_0.gguf ] || { echo "browser_bench: no model at $BENCH_MODEL" >&2; exit 1; }
  mkdir -p target/models
  python3 benches/peers.py --make-gguf "$BENCH_MODEL" --dim 576 --layers 30 --heads 9 \
    --kv-heads 3 --ffn 1536 --vocab 49152 --type q4_0 --make-only
fi
web/build.sh  # incremental: the bench measures this checkout's code
# The release binary serves the page (the harness's default is the debug one).
export WEBTENSOR_BIN="${WEBTENSOR_BIN:-target/release/webtensor}"
[ -x "$WEBTENSOR_BIN" ] || cargo build --release --bin webtensor
export WEBTENSOR_BIN="$(realpath "$WEBTENSOR_BIN")"
[ -d web/tests/node_modules/playwright-core ] || npm ci --prefix web/tests --no-audit --no-fund
[ -d web/bench/node_modules/@wllama/wllama ] || npm ci --prefix web/bench --no-audit --no-fund
exec node web/bench/chromium.mjs
