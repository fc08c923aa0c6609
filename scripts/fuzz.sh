#!/usr/bin/env bash
# Fuzzes webtensor's input parsers with cargo-fuzz (libFuzzer): the GGUF reader, the
# safetensors header and index, config.json, tokenizer.json with encode, the built-in
# tokenizer's encode on arbitrary text, and the request handling of `webtensor serve`.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 s, every target)
#
# Each target starts from fuzz/corpus/<target>/ (seeds from scripts/fuzz_seeds.py plus what
# earlier runs found) and grows it; crashes land in fuzz/artifacts/<target>/. Afterwards the
# corpus is minimized in place (cargo fuzz cmin). Commit the corpus and any reproducer: the
# stable test `cargo test --test fuzz_replay` replays them all in CI without nightly.
# One process per target (no -jobs, which would log to fuzz-N.log), niced: the machine may be
# shared.
set -euo pipefail
cd "$(dirname "$0")/.."

# The nightly this was run with (rustc 1.97.0-nightly 2026-05-19); override with FUZZ_TOOLCHAIN.
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf safetensors config tokenizer encode http)

if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
  echo "fuzz.sh: the rustup toolchain '$toolchain' is missing; install it with" >&2
  echo "  rustup toolchain install $toolchain" >&2
  exit 2
fi
if ! cargo "+$toolchain" fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: cargo-fuzz is missing; install it with" >&2
  echo "  cargo +$toolchain install cargo-fuzz --locked" >&2
  exit 2
fi
echo "== $(rustup run "$toolchain" rustc --version), $(cargo "+$toolchain" fuzz --version)"

mkdir -p target
[ -d fuzz/corpus/gguf ] || python3 scripts/fuzz_seeds.py
for t in "${targets[@]}"; do
  echo "== fuzzing $t for ${seconds}s"
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  nice -n 10 cargo "+$toolchain" fuzz run "$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 2>&1 | tee "target/fuzz-$t.log" \
    | grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+== ERROR|SUMMARY|Done)" || true
  nice -n 10 cargo "+$toolchain" fuzz cmin "$t" "fuzz/corpus/$t" >/dev/null 2>&1 || true
done
echo "== corpora: $(find fuzz/corpus -type f | wc -l) files; reproducers: $(find fuzz/artifacts -type f 2>/dev/null | wc -l)"
