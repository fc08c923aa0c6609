#!/usr/bin/env bash
# Builds web/pkg: the webtensor-web crate for wasm32-unknown-unknown (release, wasm simd128),
# then wasm-bindgen's ES module glue and TypeScript definitions (web/pkg/webtensor.js,
# webtensor.d.ts, webtensor_bg.wasm), and the npm package's package.json (web/npm/package.json
# with the crate's version) and README, so `npm pack web/pkg` gives the package. Installs the rustup target and wasm-bindgen-cli at the
# exact version of the wasm-bindgen crate in Cargo.lock when they are missing.
# `web/build.sh --tools` only installs those tools (scripts/setup.sh uses it).
set -euo pipefail
cd "$(dirname "$0")/.."

rustup target list --installed | grep -q '^wasm32-unknown-unknown$' || rustup target add wasm32-unknown-unknown

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if [ -z "$version" ]; then
  echo "build.sh: no wasm-bindgen in Cargo.lock" >&2
  exit 1
fi
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$version" ]; then
  echo "build.sh: installing wasm-bindgen-cli $version"
  # Only the wasm-bindgen binary, without the test runner's TLS stack: a much shorter build.
  cargo install wasm-bindgen-cli --version "$version" --no-default-features --bin wasm-bindgen
fi

[ "${1:-}" = "--tools" ] && exit 0

# simd128 is in every browser with WebGPU; a separate target dir keeps these flags from
# invalidating the native build.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+simd128" \
  cargo build -p webtensor-web --target wasm32-unknown-unknown --release --target-dir target/wasm-web
wasm-bindgen --target web --out-dir web/pkg --out-name webtensor \
  target/wasm-web/wasm32-unknown-unknown/release/webtensor_web.wasm
# The npm package around the module: web/npm's package.json with webtensor-web's version.
crate_version=$(awk -F'"' '/^version = / { print $2; exit }' web/Cargo.toml)
sed "s/\"0.0.0-set-by-build\"/\"$crate_version\"/" web/npm/package.json > web/pkg/package.json
cp web/npm/README.md web/pkg/README.md
echo "build.sh: built web/pkg ($(du -h web/pkg/webtensor_bg.wasm | cut -f1) of wasm)"
