#!/usr/bin/env bash
# The library's promise to a Rust program that only runs ops: a crate depending on `webtensor`
# with `default-features = false` builds, and its dependency tree holds none of the engine's or
# the command line's crates (the LLM engine is `llm/`, the command line and server `cli/`).
# Makes such a crate under target/, prints its `cargo tree`, and fails on any of them; with
# `--build` it also builds and runs it (minutes: its dependencies are built for it alone, so
# scripts/test.sh leaves that out; the library alone is compiled there for wasm32 and aarch64).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
dir="$repo/target/core-dependent"
mkdir -p "$dir/src"
cat >"$dir/Cargo.toml" <<TOML
[package]
name = "core-dependent"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
webtensor = { path = "$repo", default-features = false }

[workspace]

# The repository's dev profile, so the dependencies built there are reused.
[profile.dev.package."*"]
opt-level = 2
TOML
cat >"$dir/src/main.rs" <<'RS'
use webtensor::{ops, Device, Tensor};

fn main() -> webtensor::Result<()> {
    let dev = Device::cpu();
    let x = Tensor::from_slice(&dev, &[1.0f32, -2.0, 3.0], [3])?;
    println!("{:?}", ops::silu(&x)?.to_vec::<f32>()?);
    Ok(())
}
RS
tree="$(cd "$dir" && cargo tree -e normal --prefix none)"
echo "$tree" | sort -u | sed 's/^/  /'
banned="$(echo "$tree" | awk '{print $1}' | grep -xE 'clap|indicatif|env_logger|plotters|minijinja|minijinja-contrib|fancy-regex|hyper|tokio|webtensor-llm|webtensor-cli' | sort -u || true)"
if [ -n "$banned" ]; then
  echo "a default-features = false dependent of webtensor pulls in: $banned" >&2
  exit 1
fi
echo "== core dependent: its tree has none of the engine's or the CLI's crates"
if [ "${1:-}" = "--build" ]; then
  (cd "$dir" && CARGO_TARGET_DIR="$repo/target" cargo run --quiet)
  echo "== core dependent: builds and runs"
fi
