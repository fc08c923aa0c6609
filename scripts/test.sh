#!/usr/bin/env bash
# Runs webtensor's checks: formatting, clippy, and every test (the conformance matrix on cpu
# and on wgpu, where wgpu must find an adapter: Mesa's lavapipe on machines without a GPU; the
# kernel variants, each on a device started with its options), then the row-team kernels on
# SwiftShader, then the browser: web/pkg built and tested in headless Chromium with WebGPU
# through SwiftShader (a missing adapter fails), the npm package in a throwaway Vite app, and
# the .d.ts checked by tsc.
set -euo pipefail
cd "$(dirname "$0")/.."

# Prefer Vulkan (lavapipe on CPU-only machines) over Mesa's GL adapter.
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"
# A missing wgpu adapter is a test failure here, not a skip.
export WEBTENSOR_REQUIRE_WGPU=1
# Missing real vocabularies (scripts/fetch_vocabs.sh, run by setup.sh) fail the tokenizer tests.
export WEBTENSOR_REQUIRE_VOCABS=1
# A missing `openai` Python client (setup.sh installs it) fails the API server's test.
export WEBTENSOR_REQUIRE_OPENAI=1

cargo fmt --all -- --check
# The library, the LLM engine (llm/) and the command line (cli/): the workspace's default members.
cargo clippy --all-targets -- -D warnings
# A program that depends on the library alone compiles none of the engine's or the CLI's crates.
./scripts/check_core_deps.sh
# The module graphs keep their layers: the library's largest import circle is the wgpu
# backend's own files; the engine's is its file readers (files, gguf, safetensors, weights).
python3 scripts/import_circles.py --max 9
python3 scripts/import_circles.py llm --max 4
cargo test

# Subgroup teams take four rows per subgroup: lavapipe's subgroups of 8 give 32 rows per
# workgroup, SwiftShader's (Chromium's Vulkan ICD) subgroups of 4 give 64, as a GPU's of 32 give 8.
# The adapter is chosen per process (VK_ICD_FILENAMES), so this is the one extra pass: the
# row-team products (`wgpu_row_teams::`, a device started with the option wgpu.row_teams = on)
# and attention's lanes kernel, with its heads per lane a pipeline constant, on the adapter
# headless Chromium uses. Every other kernel variant (the cpu SIMD paths, the wgpu fallbacks
# and row-team shapes on lavapipe) runs in the plain `cargo test` above, each on a device
# started with its options (native-tests/conformance.rs, wgpu_split.rs, engine.rs,
# llama_cpp_agreement.rs).
swiftshader=/usr/lib/chromium/vk_swiftshader_icd.json
[ -f "$swiftshader" ] || { echo "no SwiftShader ICD at $swiftshader: run scripts/setup.sh" >&2; exit 1; }
echo "== wgpu row teams and attention on SwiftShader (subgroups of 4)"
VK_ICD_FILENAMES="$swiftshader" cargo test --test conformance -- \
  wgpu_row_teams::qmatmul wgpu_row_teams::kquant_products wgpu_row_teams::legacy_products \
  wgpu_row_teams::matmul wgpu_row_teams::linear_residual wgpu_row_teams::swiglu_linear \
  wgpu::paged_attention

# The host's side of a GPU decode on wgpu's noop device (cargo feature wgpu-noop), which runs no
# kernel: bench --model's host cost per token and per dispatch, and the replayed step.
echo "== wgpu noop device (feature wgpu-noop): the host's cost of a decode step"
cargo test --features wgpu-noop --test cli bench_model_on_the_noop_device

# The optional `cuda` backend: it must build and pass clippy without a CUDA toolkit or GPU,
# every kernel source must compile with the real NVRTC (from PyPI, see setup.sh), and its
# conformance rows run where a CUDA device exists (here they print why they skip).
echo "== cuda feature: clippy, NVRTC compile of every kernel, conformance rows"
cargo clippy --all-targets --features cuda -- -D warnings
nvrtc_lib="$(scripts/nvrtc_lib.sh)" || { echo "NVRTC (nvidia-cuda-nvrtc-cu12) is missing: run scripts/setup.sh" >&2; exit 1; }
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --features cuda --test cuda_kernels
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --features cuda --test conformance cuda:: -- --nocapture
# The same kernels run on the CPU (g++ and an emulation of threads, barriers and warp shuffles),
# their results checked against numpy and gguf-py's quantizers.
echo "== CUDA kernels on the CPU emulation"
python3 native-tests/cuda_host/emulate.py
# ...and driven by the backend's own launch code (launcher.rs), every op against the reference;
# the same run checks every launch's argument list against its kernel's parameters in the
# `.cu` sources (backend::cuda::signatures, which needs no emulation build).
python3 native-tests/cuda_host/emulate.py --build target/cuda-emulation
WEBTENSOR_CUDA_EMULATION="$PWD/target/cuda-emulation" cargo test --features cuda --lib backend::cuda::

# The SIMD paths this machine cannot run natively: aarch64 NEON's cpu kernel tests run under
# qemu user mode (each vector kernel against the scalar path bit for bit; about 6 minutes cold on
# a loaded 2-core machine, under a minute incremental), wasm32 simd128 must compile here (the
# browser stage below runs it).
echo "== cpu kernel tests on aarch64 (NEON) under qemu"
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
  cargo test -p webtensor --lib --target aarch64-unknown-linux-gnu backend::cpu
echo "== compile check: wasm32 with simd128"
RUSTFLAGS="-C target-feature=+simd128" cargo check -p webtensor --lib --target wasm32-unknown-unknown --target-dir target/wasm-simd128
echo "== clippy: the web crate (and the library under it) for wasm32"
RUSTFLAGS="-C target-feature=+simd128" cargo clippy -p webtensor-web --target wasm32-unknown-unknown --target-dir target/wasm-simd128 -- -D warnings

# The browser: build web/pkg, then the Playwright tests (web/tests) against `webtensor serve`.
echo "== browser: web/build.sh and the tests in headless Chromium (artifacts in target/browser-artifacts)"
./web/build.sh
cargo build --bin webtensor
(cd web/tests && npm test)
