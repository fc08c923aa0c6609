#!/usr/bin/env bash
# Runs webtensor's checks: formatting, clippy, and every test (the conformance matrix on cpu
# and on wgpu, where wgpu must find an adapter: Mesa's lavapipe on machines without a GPU),
# then the cpu rows of the matrix once per forced SIMD path, then the browser: web/pkg built and
# tested in headless Chromium with WebGPU through SwiftShader (a missing adapter fails), the npm
# package in a throwaway Vite app, and the .d.ts checked by tsc.
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

# The matrix's cpu rows again on each SIMD path this machine has (unsupported ones fall back).
for level in scalar avx2 avx512; do
  echo "== cpu conformance with WEBTENSOR_CPU_SIMD=$level"
  WEBTENSOR_CPU_SIMD=$level cargo test --test conformance cpu::
done

# The wgpu f16 path for adapters without shader-f16 (lavapipe has it, so force the fallback).
echo "== wgpu f16 products with WEBTENSOR_WGPU_F16=off (unpack2x16float path)"
WEBTENSOR_WGPU_F16=off cargo test --test conformance -- wgpu::qmatmul wgpu::kquant_products wgpu::legacy_products

# The int8-activation decode products with `idot4` written out, for platforms without WGSL's
# dot4I8Packed (every native one has it).
echo "== wgpu int8-activation products with WEBTENSOR_WGPU_INT_DOT=off (portable idot4)"
WEBTENSOR_WGPU_INT_DOT=off cargo test --test conformance -- wgpu::qmatmul wgpu::linear_residual wgpu::swiglu_linear

# On CPU adapters (the lanes shape) a Q4_0 decode product reads the texel copy the backend
# keeps of uploaded Q4_0 tensors (`mv_pairs_texels`); without one (a tensor made on the device,
# or too large for a texture) it reads the storage words (`mv_pairs_lanes`), as here.
echo "== wgpu Q4_0 decode products from storage words (WEBTENSOR_WGPU_WEIGHT_TEXELS=off)"
WEBTENSOR_WGPU_WEIGHT_TEXELS=off cargo test --test conformance -- wgpu::qmatmul wgpu::linear_residual wgpu::swiglu_linear wgpu::norm_

# The decode matvecs' GPU shape (row teams) on lavapipe, whose default is one lane per rows:
# reduced with subgroupAdd, then with workgroup memory; with it the GPU kernels of the RMS
# norm and of attention (a workgroup per row, per query and head) instead of the lanes' ones.
# Only with row teams does the decode product round its int8 activations itself, with the
# norm and the rope folded in (the `wgpu::norm_` rows; the lanes shape norms them in its own
# rounding dispatch, `quantize_acts_normed`). With row teams, prefill products with
# packed weights run the tiled `mm_tiled` (with the fused ops' epilogues), or with
# WEBTENSOR_WGPU_TILED_PREFILL=off the row-dot kernel; and weights beyond one binding, bound
# in row ranges, through the tiles.
echo "== wgpu row teams (WEBTENSOR_WGPU_ROW_TEAMS=on), with and without subgroups and tiles"
WEBTENSOR_WGPU_ROW_TEAMS=on cargo test --test conformance -- wgpu::qmatmul wgpu::kquant_products wgpu::legacy_products wgpu::matmul wgpu::linear_residual wgpu::swiglu_linear wgpu::norm_ wgpu::rms_norm wgpu::paged_attention
WEBTENSOR_WGPU_ROW_TEAMS=on WEBTENSOR_WGPU_SUBGROUPS=off cargo test --test conformance -- wgpu::qmatmul wgpu::kquant_products wgpu::legacy_products wgpu::matmul
WEBTENSOR_WGPU_ROW_TEAMS=on WEBTENSOR_WGPU_TILED_PREFILL=off cargo test --test conformance -- wgpu::qmatmul wgpu::kquant_products wgpu::legacy_products wgpu::linear_residual
WEBTENSOR_WGPU_ROW_TEAMS=on cargo test --test wgpu_split
# The engine on the GPU shapes: a layer's gate and up weights uploaded together and multiplied
# in one dispatch, decode steps recorded once and replayed, against the reference and single
# steps, attention split over the keys of a wide cache (past 256 columns; the lanes shape
# splits past 64, in the plain run above).
WEBTENSOR_WGPU_ROW_TEAMS=on cargo test --test engine
# llama.cpp's mixes (Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, IQ4_XS, Q4_1, Q5_0, Q5_1, IQ4_NL) on the
# row-team shapes: prefill
# tiles, decode teams.
WEBTENSOR_WGPU_ROW_TEAMS=on cargo test --test llama_cpp_agreement wgpu_runs_every_llama_cpp_mix
# Subgroup teams take four rows per subgroup: lavapipe's subgroups of 8 give 32 rows per
# workgroup, SwiftShader's (Chromium's Vulkan ICD) subgroups of 4 give 64, as a GPU's of 32 give 8.
swiftshader=/usr/lib/chromium/vk_swiftshader_icd.json
[ -f "$swiftshader" ] || { echo "no SwiftShader ICD at $swiftshader: run scripts/setup.sh" >&2; exit 1; }
echo "== wgpu row teams on SwiftShader (subgroups of 4)"
VK_ICD_FILENAMES="$swiftshader" WEBTENSOR_WGPU_ROW_TEAMS=on \
  cargo test --test conformance -- wgpu::qmatmul wgpu::kquant_products wgpu::legacy_products wgpu::matmul wgpu::linear_residual wgpu::swiglu_linear
# Attention's lanes kernel on the adapter headless Chromium uses (SIMD groups of 4, not
# lavapipe's 8), with its heads per lane a pipeline constant.
echo "== wgpu attention on SwiftShader (the lanes shape)"
VK_ICD_FILENAMES="$swiftshader" cargo test --test conformance -- wgpu::paged_attention

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

# The SIMD paths this machine cannot run must at least compile: wasm32 simd128 and aarch64 NEON.
echo "== compile check: wasm32 with simd128"
RUSTFLAGS="-C target-feature=+simd128" cargo check -p webtensor --lib --target wasm32-unknown-unknown --target-dir target/wasm-simd128
echo "== clippy: the web crate (and the library under it) for wasm32"
RUSTFLAGS="-C target-feature=+simd128" cargo clippy -p webtensor-web --target wasm32-unknown-unknown --target-dir target/wasm-simd128 -- -D warnings
echo "== compile check: aarch64 (NEON)"
cargo check -p webtensor --lib --target aarch64-unknown-linux-gnu

# The browser: build web/pkg, then the Playwright tests (web/tests) against `webtensor serve`.
echo "== browser: web/build.sh and the tests in headless Chromium (artifacts in target/browser-artifacts)"
./web/build.sh
cargo build --bin webtensor
(cd web/tests && npm test)
