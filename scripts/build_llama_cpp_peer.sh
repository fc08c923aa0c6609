#!/usr/bin/env bash
# Builds llama.cpp's llama-bench as the peer that scripts/device_check.sh and
# scripts/vulkan_peer_bench.sh time next to `webtensor bench --model` (issue 40, part 6).
#
#   scripts/build_llama_cpp_peer.sh              # the Vulkan build: .peer/llama-bench
#   scripts/build_llama_cpp_peer.sh vulkan cuda  # and the CUDA build: .peer/llama-bench-cuda
#   scripts/build_llama_cpp_peer.sh cuda         # the CUDA build alone
#
# Debian 12 (x86-64) with apt, PyPI and crates.io reachable; run as root (apt-get). Every step is
# skipped when its output is already there, so a second run only stages and prints sizes.
#
# - llama.cpp's source: the llama-cpp-python sdist on PyPI (vendor/llama.cpp).
# - Vulkan: Debian 12's glslc (shaderc 2023.2) lacks GL_EXT_integer_dot_product and the
#   cooperative-matrix extensions, and its Vulkan headers (1.3.239) lack
#   VK_KHR_cooperative_matrix, so ggml would build without its int8 dot-product and
#   cooperative-matrix shaders. glslc is built from the shaderc sources that the shaderc-sys
#   crate bundles, and the headers come from Debian 13's libvulkan-dev and spirv-headers .debs,
#   unpacked under target/peer (nothing is installed from Debian 13).
# - CUDA: nvcc, headers and libraries of CUDA 13.0 from NVIDIA's PyPI wheels (the H200 machine's
#   driver is CUDA 13.0), for sm_90 only. The binary links libcudart.so.13 and libcublas.so.13:
#   libcudart travels in .peer, cuBLAS (hundreds of MB) is the device machine's own.
#   libcuda.so is the driver's; the link uses a stub generated from the symbols ggml-cuda needs.
#
# Both builds are static (BUILD_SHARED_LIBS=OFF), without OpenMP, TLS or CURL, for an AVX2 x86-64
# baseline (GGML_NATIVE=OFF: the device machine's CPU is another one). The tests and CI never
# use the peer.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

LLAMA_CPP_PYTHON=0.3.36 # vendors llama.cpp at ggml-org/llama.cpp@0c1e57098 (its CHANGELOG)
LLAMA_CPP_COMMIT=0c1e57098
SHADERC_SYS=0.10.1 # shaderc v2025.3 with glslang 15.3 and its SPIRV-Tools and SPIRV-Headers
DEBIAN_VULKAN=1.4.309.0-1
CUDA_WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14)
JOBS=${JOBS:-2}

vulkan=0 cuda=0
for a in "${@:-vulkan}"; do
  case $a in
  vulkan) vulkan=1 ;;
  cuda) cuda=1 ;;
  *) echo "usage: $0 [vulkan] [cuda]" >&2 && exit 2 ;;
  esac
done

work=$root/target/peer
bin=$work/bin  # the stripped binaries, to run here
out=$root/.peer # what the device machine gets: the same, xz-compressed (51 MB -> 7.5 MB)
mkdir -p "$work" "$bin" "$out"
nice_=(nice -n 19)
log() { echo "== $*"; }
# put SRC DST: a stripped copy, unless DST is already newer than SRC.
put() {
  if [ ! -f "$2" ] || [ "$1" -nt "$2" ]; then
    install -m 755 "$1" "$2"
    strip "$2"
  fi
}

# Build tools from Debian 12.
need=()
for p in cmake ninja-build g++ libvulkan-dev unzip xz-utils; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

# 1. The source.
src=$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
if [ ! -f "$src/CMakeLists.txt" ]; then
  log "llama-cpp-python $LLAMA_CPP_PYTHON sdist"
  (cd "$work" && pip download -q --no-binary :all: --no-deps -d . "llama-cpp-python==$LLAMA_CPP_PYTHON" &&
    tar xzf "llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz")
fi
grep -q "llama.cpp@$LLAMA_CPP_COMMIT" "$work/llama_cpp_python-$LLAMA_CPP_PYTHON/CHANGELOG.md" ||
  echo "warning: the sdist's CHANGELOG does not name llama.cpp@$LLAMA_CPP_COMMIT"

common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_OPENMP=OFF
  -DGGML_CCACHE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_COMMIT="$LLAMA_CPP_COMMIT")

# 2. glslc from shaderc-sys's bundled sources (fetched by cargo into its registry cache).
glslc=$work/build-glslc/shaderc/glslc/glslc
if [ $vulkan = 1 ] && [ ! -x "$glslc" ]; then
  shaderc=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d \
    -name "shaderc-sys-$SHADERC_SYS" 2>/dev/null | head -1)
  if [ -z "$shaderc" ]; then
    log "shaderc-sys $SHADERC_SYS from crates.io"
    fetch=$work/shaderc-fetch
    mkdir -p "$fetch/src"
    printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nshaderc-sys = "=%s"\n' \
      "$SHADERC_SYS" >"$fetch/Cargo.toml"
    echo 'fn main() {}' >"$fetch/src/main.rs"
    (cd "$fetch" && cargo fetch -q)
    shaderc=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d \
      -name "shaderc-sys-$SHADERC_SYS" | head -1)
  fi
  log "glslc from $shaderc/build"
  "${nice_[@]}" cmake -S "$shaderc/build" -B "$work/build-glslc" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSHADERC_SKIP_TESTS=ON -DSHADERC_SKIP_EXAMPLES=ON -DSPIRV_SKIP_EXECUTABLES=ON \
    -DSPIRV_SKIP_TESTS=ON -DENABLE_GLSLANG_BINARIES=OFF -DENABLE_SPVREMAPPER=OFF \
    -DSPIRV_WERROR=OFF >"$work/configure-glslc.log"
  "${nice_[@]}" ninja -C "$work/build-glslc" -j "$JOBS" glslc_exe >"$work/build-glslc.log"
fi
[ $vulkan = 0 ] || "$glslc" --version >/dev/null

# 3. Vulkan and SPIR-V headers from Debian 13's packages, unpacked (not installed).
sdk=$work/sdk
if [ $vulkan = 1 ] && [ ! -f "$sdk/usr/include/vulkan/vulkan.hpp" ]; then
  log "Debian 13's libvulkan-dev and spirv-headers $DEBIAN_VULKAN"
  apt=$work/apt-trixie
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$work/debs"
  echo "deb http://deb.debian.org/debian trixie main" >"$apt/sources.list"
  o=(-oDir::Etc::SourceList="$apt/sources.list" -oDir::Etc::SourceParts=/dev/null
    -oDir::State::Lists="$apt/lists" -oDir::Cache="$apt/cache" -oAPT::Architecture=amd64)
  apt-get "${o[@]}" update -qq
  (cd "$work/debs" && apt-get "${o[@]}" download -qq "libvulkan-dev=$DEBIAN_VULKAN" \
    "spirv-headers=1.6.1+$DEBIAN_VULKAN")
  for f in "$work"/debs/*.deb; do dpkg -x "$f" "$sdk"; done
fi

# 4. The Vulkan build.
if [ $vulkan = 1 ] && [ ! -x "$work/build-vulkan/bin/llama-bench" ]; then
  log "llama-bench, Vulkan"
  "${nice_[@]}" cmake -S "$src" -B "$work/build-vulkan" "${common[@]}" -DGGML_VULKAN=ON \
    -DVulkan_INCLUDE_DIR="$sdk/usr/include" -DVulkan_GLSLC_EXECUTABLE="$glslc" \
    -DSPIRV-Headers_DIR="$sdk/usr/share/cmake/SPIRV-Headers" >"$work/configure-vulkan.log"
  grep -E "supported by glslc" "$work/configure-vulkan.log" || true
  "${nice_[@]}" ninja -C "$work/build-vulkan" -j "$JOBS" llama-bench >"$work/build-vulkan.log"
fi
if [ $vulkan = 1 ]; then
  put "$work/build-vulkan/bin/llama-bench" "$bin/llama-bench"
fi

# 5. The CUDA build.
if [ $cuda = 1 ]; then
  cudaroot=$work/cuda
  if [ ! -x "$cudaroot/bin/nvcc" ]; then
    log "CUDA 13.0 from PyPI wheels"
    mkdir -p "$work/cuda-wheels" "$work/cuda-x"
    (cd "$work/cuda-wheels" && pip download -q --no-deps --only-binary=:all: -d . "${CUDA_WHEELS[@]}")
    for w in "$work"/cuda-wheels/*.whl; do unzip -qo "$w" 'nvidia/*' -d "$work/cuda-x"; done
    rm -rf "$cudaroot"
    mv "$work/cuda-x/nvidia/cu13" "$cudaroot"
    # The layout CMake and nvcc.profile expect of a toolkit.
    mkdir -p "$cudaroot/targets/x86_64-linux" "$cudaroot/lib/stubs"
    ln -sfn ../../include "$cudaroot/targets/x86_64-linux/include"
    ln -sfn ../../lib "$cudaroot/targets/x86_64-linux/lib"
    ln -sfn lib "$cudaroot/lib64"
    for l in cudart cublas cublasLt; do ln -sfn "lib$l.so.13" "$cudaroot/lib/lib$l.so"; done
    # A placeholder libcuda.so for configuring; replaced below by one that defines what
    # ggml-cuda calls.
    echo '' | gcc -shared -x c - -Wl,-soname,libcuda.so.1 -o "$cudaroot/lib/stubs/libcuda.so"
  fi
  if [ ! -x "$work/build-cuda/bin/llama-bench" ]; then
    log "llama-bench, CUDA (sm_90)"
    PATH=$cudaroot/bin:$PATH "${nice_[@]}" cmake -S "$src" -B "$work/build-cuda" "${common[@]}" \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DCMAKE_CUDA_COMPILER="$cudaroot/bin/nvcc" \
      -DCUDAToolkit_ROOT="$cudaroot" -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_FA_QUANTS=f16-f16 \
      >"$work/configure-cuda.log"
    PATH=$cudaroot/bin:$PATH "${nice_[@]}" ninja -C "$work/build-cuda" -j "$JOBS" ggml-cuda \
      >"$work/build-cuda.log"
    # The driver API symbols ggml-cuda uses, as a stub libcuda.so.1 to link against.
    nm -u "$work"/build-cuda/ggml/src/ggml-cuda/libggml-cuda.a | awk '{print $2}' |
      grep -E '^cu[A-Z]' | sort -u | sed 's/$/(void) {}/; s/^/void /' >"$work/libcuda-stub.c"
    gcc -shared -fPIC "$work/libcuda-stub.c" -Wl,-soname,libcuda.so.1 \
      -o "$cudaroot/lib/stubs/libcuda.so"
    PATH=$cudaroot/bin:$PATH "${nice_[@]}" ninja -C "$work/build-cuda" -j "$JOBS" llama-bench \
      >>"$work/build-cuda.log"
  fi
  put "$work/build-cuda/bin/llama-bench" "$bin/llama-bench-cuda"
  put "$(readlink -f "$cudaroot/lib/libcudart.so.13")" "$bin/libcudart.so.13"
fi

# 6. Stage for the device machine: xz keeps the carried tree small; device_check.sh unpacks.
for f in "$bin"/*; do
  x=$out/${f##*/}.xz
  if [ ! -f "$x" ] || [ "$f" -nt "$x" ]; then
    log "xz ${f##*/}"
    "${nice_[@]}" xz -9 -T2 -c "$f" >"$x.tmp" && mv "$x.tmp" "$x"
  fi
done
{
  echo "llama.cpp $LLAMA_CPP_COMMIT (llama-cpp-python $LLAMA_CPP_PYTHON sdist, vendor/llama.cpp)"
  if [ -x "$bin/llama-bench" ]; then
    echo "llama-bench: Vulkan; glslc of shaderc-sys $SHADERC_SYS (shaderc v2025.3, glslang 15.3);" \
      "Vulkan headers of Debian libvulkan-dev $DEBIAN_VULKAN"
  fi
  if [ -x "$bin/llama-bench-cuda" ]; then
    echo "llama-bench-cuda: CUDA, sm_90; ${CUDA_WHEELS[*]}"
  fi
  echo "flags: ${common[*]}"
} >"$out/VERSION.txt"

for b in "$bin"/llama-bench*; do
  echo "-- ${b#"$root"/}: needs $(ldd "$b" | awk '/=>/ {print $1}' | tr '\n' ' ')"
done
du -h "$bin"/* "$out"/*
du -sh "$out"
