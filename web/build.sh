#!/usr/bin/env bash
# Builds web/pkg: the webtensor-web crate for wasm32-unknown-unknown (release, wasm simd128),
# then wasm-bindgen's ES module glue and TypeScript definitions (web/pkg/webtensor.js,
# webtensor.d.ts, webtensor_bg.wasm), and the npm package's package.json (web/npm/package.json
# with the crate's version) and README, so `npm pack web/pkg` gives the package.
# A second, threaded build goes to web/pkg/threads/: cpu only (no WebGPU), wasm atomics and a
# rayon pool over Web Workers (wasm-bindgen-rayon), for cross-origin isolated pages. It needs
# the nightly toolchain's `-Z build-std` (std rebuilt with atomics) and its rust-src component.
# web/pkg/load.js (from web/js/load.js, also copied into threads/) picks one of the two.
# Installs the rustup target, rust-src for nightly and wasm-bindgen-cli at the exact version of
# the wasm-bindgen crate in Cargo.lock when they are missing.
# `web/build.sh --tools` only installs those tools (scripts/setup.sh uses it).
set -euo pipefail
cd "$(dirname "$0")/.."

rustup target list --installed | grep -q '^wasm32-unknown-unknown$' || rustup target add wasm32-unknown-unknown
# The threaded build's toolchain: nightly (for -Z build-std) with the standard library's source.
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
rustup component list --toolchain nightly --installed | grep -q '^rust-src' ||
  rustup component add rust-src --toolchain nightly

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
# The threaded build. +atomics,+bulk-memory compile for shared memory, which needs std rebuilt
# with them (build-std, nightly); a 4 GiB maximum like the one-thread build's (a shared memory
# must declare one). Its own target dir: the flags and toolchain differ from both other builds.
# The final link also makes the memory shared and imported (each worker instantiates the module
# on the same memory) and exports the thread-local storage setup wasm-bindgen calls per thread;
# rustc stopped implying these with +atomics (rust-lang/rust#147225). Passed through
# `cargo rustc` they reach that link alone, so changing them rebuilds nothing else.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+atomics,+bulk-memory,+simd128 -C link-arg=--max-memory=4294967296" \
  cargo +nightly rustc -p webtensor-web --lib --target wasm32-unknown-unknown --release \
  --target-dir target/wasm-threads -Z build-std=panic_abort,std -- \
  -C link-arg=--shared-memory -C link-arg=--import-memory -C link-arg=--export=__wasm_init_tls \
  -C link-arg=--export=__tls_size -C link-arg=--export=__tls_align -C link-arg=--export=__tls_base
rm -rf web/pkg/threads
wasm-bindgen --target web --out-dir web/pkg/threads --out-name webtensor \
  target/wasm-threads/wasm32-unknown-unknown/release/webtensor_web.wasm
cp web/js/load.js web/pkg/load.js
cp web/js/load.js web/pkg/threads/load.js
# The npm package around the module: web/npm's package.json with webtensor-web's version.
crate_version=$(awk -F'"' '/^version = / { print $2; exit }' web/Cargo.toml)
sed "s/\"0.0.0-set-by-build\"/\"$crate_version\"/" web/npm/package.json > web/pkg/package.json
cp web/npm/README.md web/pkg/README.md
echo "build.sh: built web/pkg ($(du -h web/pkg/webtensor_bg.wasm | cut -f1) of wasm, threads/ $(du -h web/pkg/threads/webtensor_bg.wasm | cut -f1))"
