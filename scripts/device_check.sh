#!/usr/bin/env bash
# The checks and timings for a lent NVIDIA GPU machine (issue 12), as one script for one call:
# that machine has no Rust toolchain and reaches no registry, so everything is built here first.
#
# Here, from the repository root (x86-64 Linux; .git/info/exclude ignores .dev/, .gl/, .whl/):
#   scripts/device_check.sh --stage   # builds with the cuda feature, strips the binaries into .dev/
#                                     # (xz-compressed; this script unpacks them there)
#   # .gl/: the Vulkan loader's .deb (libvulkan1; that machine has the NVIDIA driver, no loader)
#   # .whl/: gguf-py's wheel (gguf==0.19.0; numpy, pyyaml, requests, tqdm are there already)
#   # optionally .dev/webtensor-before: an earlier build, timed against this one
#   # optionally .peer/: llama.cpp's llama-bench (scripts/build_llama_cpp_peer.sh vulkan cuda)
# There (carry .dev, .gl, .whl and .peer): scripts/device_check.sh
#   [--ab | --peer | --formats | --agreement | --kquant-speed | --bf16 | --bf16-speed]
#
# Every step has its own time limit and the script goes on after a failure, so one call returns
# as much as it can. Logs and reports go to $OUT (the device tool brings that folder back), else
# target/device-out.
set -u
cd "$(dirname "$0")/.."

if [ "${1:-}" = --stage ]; then
  set -e
  mkdir -p .dev
  cargo test --release --features cuda --no-run --message-format=json \
    --test conformance --test cuda_kernels --test wgpu_split --test engine \
    --test llama_cpp_agreement |
    python3 -c 'import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable")
    if exe and m.get("profile", {}).get("test"):
        shutil.copy(exe, os.path.join(".dev", m["target"]["name"]))'
  cargo build --release --features cuda --bin webtensor
  cp target/release/webtensor .dev/webtensor
  # Stripped and xz-compressed (unpacked there, below): the tree that travels, with .dev, .gl,
  # .whl and .peer, must stay under 64 MiB.
  for f in .dev/*; do
    if [ "${f%.xz}" = "$f" ]; then
      strip "$f"
      xz -9 -T2 -f "$f"
    fi
  done
  du -sh .dev
  {
    git ls-files -z --cached --others --exclude-standard
    find .dev .gl .whl .peer -type f -print0 2>/dev/null
  } | du -cb --files0-from=- | tail -1 |
    awk '{ printf "travels: %.1f MiB of 64 (the tree, .dev, .gl, .whl, .peer)\n", $1 / 1048576 }'
  exit 0
fi

# xz-compressed files (.dev's binaries, .peer's) unpack with Python's lzma: xz may be missing there.
unpack_xz() {
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2" &&
    chmod +x "$2"
}
for f in .dev/*.xz; do
  [ -f "$f" ] && unpack_xz "$f" "${f%.xz}"
done

OUT="${OUT:-target/device-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1

# One device call runs at most 10 minutes: past DEADLINE seconds from the start
# (DEVICE_CHECK_SECONDS, default 540) no step starts, and a step's limit is cut to the time
# left, so the call returns with what it has; the steps come in order of worth.
DEADLINE=${DEVICE_CHECK_SECONDS:-540}

# step LIMIT_SECONDS COMMAND...: runs one check, printing its exit status and duration.
step() {
  local limit=$1
  shift
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "== skipped, ${left}s left: $*"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $* (limit ${limit}s)"
  local start=$SECONDS
  timeout "$limit" "$@"
  echo "== rc=$? after $((SECONDS - start)) s"
}

# The Vulkan loader, the NVIDIA ICD, NVRTC (any version: cudarc also tries libnvrtc.so), gguf-py.
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
nvrtc=$(find /usr/local/ /opt/ /usr/lib/ -xdev \( -name 'libnvrtc.so.1[23]' -o -name 'libnvrtc.so.1[23].*' \) 2>/dev/null | head -1)
mkdir -p /tmp/nvrtc
[ -n "$nvrtc" ] && ln -sf "$nvrtc" /tmp/nvrtc/libnvrtc.so
export LD_LIBRARY_PATH="/tmp/nvrtc:${nvrtc%/*}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site WGPU_BACKEND=vulkan WEBTENSOR_REQUIRE_WGPU=1 WEBTENSOR_REQUIRE_CUDA=1
echo "NVRTC: ${nvrtc:-none found}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv

# The TinyLlama-1.1B-shape model (random weights), written while the conformance runs: Q4_0,
# or with --formats Q4_K_M's layout of random blocks (that machine has no llama.cpp quantizer).
model_type=q4_0
case "${1:-}" in
  --formats | --kquant-speed) model_type=q4_k_m-random-blocks ;;
  --bf16 | --bf16-speed) model_type=bf16 ;;
esac
model=/tmp/tinyllama-$model_type.gguf
python3 benches/peers.py --make-gguf "$model" --dim 2048 --layers 22 --heads 32 --kv-heads 4 \
  --ffn 5632 --vocab 32000 --type $model_type --make-only >"$OUT/make-model.txt" 2>&1 &
maker=$!

ldconfig -p | grep -c libvulkan.so.1 | sed 's/^/vulkan loaders: /'
ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d 2>/dev/null

model_waited=
wait_for_model() {
  [ -n "$model_waited" ] && return 0
  echo "== waiting for the model"
  wait "$maker"
  echo "== model: rc=$? $(ls -la "$model" 2>&1)"
  model_waited=1
}

# llama.cpp's llama-bench on the same GGUF, taking turns with our bench --model on wgpu and cuda,
# three rounds. .peer/ holds it xz-compressed (scripts/build_llama_cpp_peer.sh): llama-bench
# (Vulkan) and, where built, llama-bench-cuda with its libcudart; they are unpacked into
# /tmp/peer. Each llama-bench call is pp512, pp$PEER_PROMPT_TOKENS and tg128, 3 repetitions, all
# layers on the GPU. Our side prompts with $PEER_PROMPT_TOKENS tokens (default 16: bench --model
# first checks the prompt's logits against the scalar reference, which costs seconds per token
# of a 1.1B model) and decodes 128. Every run's JSON goes into $OUT/peer.json, the table to the log.
PEER_PROMPT_TOKENS=${PEER_PROMPT_TOKENS:-16}
PEER_RUNS=/tmp/peer-runs
peer_compare() {
  if [ ! -f .peer/llama-bench.xz ]; then
    echo "== no .peer/llama-bench.xz (scripts/build_llama_cpp_peer.sh): peer comparison skipped"
    return 0
  fi
  local peer=/tmp/peer cublas="" f i rc
  mkdir -p $peer
  for f in .peer/*.xz; do
    unpack_xz "$f" "$peer/$(basename "$f" .xz)"
  done
  cat .peer/VERSION.txt
  wait_for_model
  rm -rf "$PEER_RUNS"
  mkdir -p "$PEER_RUNS"
  # cuBLAS 13 is the machine's own (the CUDA toolkit's or PyTorch's wheels); libcudart is in .peer.
  if [ -x $peer/llama-bench-cuda ]; then
    cublas=$(find /usr/local/ /opt/ /usr/lib/ -xdev -name 'libcublas.so.13*' 2>/dev/null | head -1)
    echo "cuBLAS for llama.cpp CUDA: ${cublas:-none found}"
  fi
  local pp=512
  [ "$PEER_PROMPT_TOKENS" = 512 ] || pp=512,$PEER_PROMPT_TOKENS
  local bench=(-m "$model" -p "$pp" -n 128 -ngl 99 -r 3 -o json)
  local ours=(bench --model "$model" --prompt-tokens "$PEER_PROMPT_TOKENS" --decode-tokens 128
    --runs 1 --json) backends=(--backend wgpu --backend cuda)
  for i in $(seq "${PEER_ROUNDS:-3}"); do
    peer_run "$i" llama.cpp-vulkan 150 $peer/llama-bench "${bench[@]}"
    peer_run "$i" webtensor 240 .dev/webtensor "${ours[@]}" "${backends[@]}"
    # One backend's failure fails the whole bench: keep wgpu's figures at least.
    rc=$(cut -d' ' -f1 "$PEER_RUNS/webtensor-$i.rc")
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ ${#backends[@]} = 4 ]; then
      backends=(--backend wgpu)
      echo "== wgpu alone from here"
      peer_run "$i" webtensor 240 .dev/webtensor "${ours[@]}" "${backends[@]}"
    fi
    if [ -n "$cublas" ]; then
      peer_run "$i" llama.cpp-cuda 90 env LD_LIBRARY_PATH="$peer:${cublas%/*}:$LD_LIBRARY_PATH" \
        $peer/llama-bench-cuda "${bench[@]}"
    fi
  done
  python3 scripts/peer_table.py "$PEER_RUNS" "$OUT/peer.json"
}

# peer_run ROUND WHO LIMIT COMMAND...: one timed run; its stdout (JSON) kept in $PEER_RUNS, the
# lines of its stderr that name the device or an error copied to the log.
peer_run() {
  local round=$1 who=$2 limit=$3
  shift 3
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "== skipped, ${left}s left: round $round, $who"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== round $round: $who (limit ${limit}s)"
  local start=$SECONDS rc
  local base=$PEER_RUNS/$who-$round
  timeout "$limit" "$@" >"$base.json" 2>"$base.err"
  rc=$?
  echo "$rc $((SECONDS - start))" >"$base.rc"
  grep -aiE 'ggml_vulkan: [0-9]|ggml_cuda_init|Device [0-9]|error|fail|warn' "$base.err" |
    sort -u | head -20
  [ $rc = 0 ] || tail -5 "$base.err"
  echo "== rc=$rc after $((SECONDS - start)) s"
}

# Where wgpu's decode time goes, per kernel (GPU timestamps), with int8 and f32 activations;
# then, where .dev/webtensor-before holds an earlier build, its decode and this one's take
# turns, three times each (each run a step, so the deadline holds).
profile_and_compare() {
  for acts in int f32; do
    WEBTENSOR_WGPU_PROFILE=1 step 120 .dev/webtensor bench --model "$model" --backend wgpu \
      --prompt-tokens 4 --decode-tokens 32 --runs 1 --activations $acts
  done
  [ -x .dev/webtensor-before ] || return 0
  for i in 1 2 3; do
    for build in before after; do
      bin=.dev/webtensor
      [ $build = before ] && bin=.dev/webtensor-before
      echo "== $build $i"
      step 120 sh -c "$bin bench --model $model --backend cuda --backend wgpu --prompt-tokens 4 \
        --decode-tokens 64 --runs 1 2>/dev/null | grep -E '^(cuda|wgpu) '"
    done
  done
}

# --formats: llama.cpp's other GGUF formats (issue 41) on both backends: the conformance rows,
# the engine on llama.cpp-written files against cpu, numpy and llama.cpp (--nocapture: each
# mix's distances; cuda's again without CUDA graphs), then decode of a Q4_K_M-layout model
# against llama.cpp's, in turns, as many rounds (up to three) as the deadline leaves, and where
# wgpu's decode time goes on it.
if [ "${1:-}" = --formats ]; then
  step 100 .dev/conformance --test-threads 8 wgpu::
  step 100 .dev/conformance --test-threads 8 cuda::
  step 50 .dev/cuda_kernels
  step 150 .dev/llama_cpp_agreement --test-threads 4 --nocapture
  WEBTENSOR_CUDA_GRAPHS=off step 60 .dev/llama_cpp_agreement cuda_ --nocapture
  PEER_PROMPT_TOKENS=4 peer_compare
  WEBTENSOR_WGPU_PROFILE=1 step 60 .dev/webtensor bench --model "$model" --backend wgpu \
    --prompt-tokens 4 --decode-tokens 32 --runs 1
  exit 0
fi

# --agreement: the engine on llama.cpp-written files (llama_cpp_agreement.rs) on both backends
# as found, then on wgpu with each adapter feature turned off in turn: which one a difference
# from cpu follows.
if [ "${1:-}" = --agreement ]; then
  step 60 .dev/llama_cpp_agreement --test-threads 4 --nocapture
  for feature in F16 SUBGROUPS INT_DOT ROW_TEAMS TILED_PREFILL; do
    (
      export "WEBTENSOR_WGPU_$feature=off"
      step 40 .dev/llama_cpp_agreement wgpu_runs --nocapture
    )
  done
  exit 0
fi

# --kquant-speed: the K-quant products' conformance on wgpu, then on a Q4_K_M-layout model where
# wgpu's decode time goes and .dev/webtensor-before's decode against this build's, in turns.
if [ "${1:-}" = --kquant-speed ]; then
  step 60 .dev/conformance --test-threads 8 wgpu::kquant wgpu::llama_cpp_formats wgpu::norm
  wait_for_model
  profile_and_compare
  exit 0
fi

# --bf16: BF16 weights kept as bf16 on the GPUs (issue 41): the conformance on both backends
# (bf16_products among the rows; the kernels it touched too), NVRTC, the engine on a bf16
# checkpoint, llama.cpp's files again; then as --bf16-speed: decode of a bf16 TinyLlama-shape
# model on wgpu and cuda, three runs each in turns (with .dev/webtensor-before, a build that
# widened bf16 to f32 on the GPUs, taking turns too; the rows give peak RSS), and where wgpu's
# decode time goes on it. BF16_ROUNDS sets the rounds (default 3).
if [ "${1:-}" = --bf16 ]; then
  step 100 .dev/conformance --test-threads 8 wgpu::
  step 100 .dev/conformance --test-threads 8 cuda::
  step 50 .dev/cuda_kernels
  step 60 .dev/engine bf16 --nocapture
  step 60 .dev/llama_cpp_agreement --test-threads 4
fi
if [ "${1:-}" = --bf16 ] || [ "${1:-}" = --bf16-speed ]; then
  wait_for_model
  builds=(webtensor)
  [ -x .dev/webtensor-before ] && builds=(webtensor-before webtensor)
  for i in $(seq "${BF16_ROUNDS:-3}"); do
    for bin in "${builds[@]}"; do
      for backend in wgpu cuda; do
        echo "== $bin, run $i"
        step 90 sh -c ".dev/$bin bench --model $model --backend $backend --prompt-tokens 4 \
          --decode-tokens 64 --runs 1 2>/dev/null | grep -E '^$backend '"
      done
    done
  done
  WEBTENSOR_WGPU_PROFILE=1 step 60 .dev/webtensor bench --model "$model" --backend wgpu \
    --prompt-tokens 4 --decode-tokens 32 --runs 1
  exit 0
fi

# --peer: only the comparison with llama.cpp.
if [ "${1:-}" = --peer ]; then
  peer_compare
  exit 0
fi

# --ab: only the conformance on both backends, llama.cpp, the profile and the before/after
# comparison.
if [ "${1:-}" = --ab ]; then
  step 150 .dev/conformance --test-threads 8 wgpu::
  step 150 .dev/conformance --test-threads 8 cuda::
  wait_for_model
  peer_compare
  profile_and_compare
  exit 0
fi

# In order of worth, since a lease is short: correctness, then the model, then the ops.
# The conformance matrix on the Vulkan adapter (as found, then with shader-f16, subgroups, the
# integer dot product and row teams each turned off) and on CUDA.
step 150 .dev/conformance --test-threads 8 wgpu::
step 150 .dev/conformance --test-threads 8 cuda::
step 60 .dev/cuda_kernels
# Decode against single steps on wgpu (replayed steps) and cuda (replayed as CUDA graphs, and
# on a device with the option cuda.graphs = false run as ops, in the same run), and what cuda
# reports about its graphs and fused kernels.
step 150 .dev/engine --test-threads 4 decode::
.dev/webtensor info | grep -A16 '^cuda'
# The most valuable timing next: our decode against llama.cpp's on the same card.
peer_compare

wait_for_model
# Every backend on the model, with the host's CPU time per token and per dispatch. 16 prompt
# tokens: the reference's logits for the check are scalar and cost seconds per token.
step 240 sh -c ".dev/webtensor bench --model $model --prompt-tokens 16 --runs 3 --json >$OUT/model.json"
python3 - "$OUT/model.json" <<'PY'
import json, sys
f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"
print("backend  prompt tok/s (samples)     decode tok/s (samples)     GB/s  %copy  disp/tok  replay  host ms/tok  µs/disp  check")
for r in json.load(open(sys.argv[1])):
    p = " ".join(f"{x:.1f}" for x in r["prompt_samples"])
    d = " ".join(f"{x:.1f}" for x in r["decode_samples"])
    frac = None if r["frac_copy"] is None else 100 * r["frac_copy"]
    print(f'{r["backend"]:8} {p:26} {d:26} {f(r["decode_weight_gb_per_s"]):>6} {f(frac):>5} '
          f'{f(r["dispatches_per_token"]):>8}  {str(r["decode_replayed"]):6} {f(r["host_ms_per_token"], 3):>11} '
          f'{f(r["host_us_per_dispatch"], 2):>8}  {r["checked"]} {r["max_abs_error"]:.1e}')
PY
# CUDA graphs on the TinyLlama-shape model: the same ids with and without them (greedy and
# sampled), then decode tok/s each way, alternating three times (`replay` yes and no).
for s in "--temperature 0" "--temperature 0.8 --top-p 0.9 --seed 3"; do
  for g in on off; do
    WEBTENSOR_CUDA_GRAPHS=$g RUST_LOG=webtensor=debug step 60 sh -c ".dev/webtensor generate \
      --model $model --backend cuda --prompt 'In the beginning' --max-tokens 96 $s \
      >$OUT/ids-$g.txt 2>$OUT/ids-$g.err"
  done
  if cmp -s "$OUT/ids-on.txt" "$OUT/ids-off.txt"; then echo "== graphs on/off ($s): same ids"
  else echo "== graphs on/off ($s): DIFFERENT"; diff "$OUT/ids-on.txt" "$OUT/ids-off.txt" | head -5; fi
  grep -h "not replayed\|tokens/s" "$OUT/ids-on.err" "$OUT/ids-off.err"
done
for i in 1 2 3; do
  for g in on off; do
    echo "== cuda graphs $g, run $i"
    WEBTENSOR_CUDA_GRAPHS=$g step 60 sh -c ".dev/webtensor bench --model $model --backend cuda \
      --prompt-tokens 4 --decode-tokens 128 --runs 1 2>/dev/null | grep -E '^cuda '"
  done
done
profile_and_compare
[ -x .dev/wgpu_split ] && step 60 .dev/wgpu_split
WEBTENSOR_WGPU_F16=off step 120 .dev/conformance --test-threads 8 wgpu::
WEBTENSOR_WGPU_SUBGROUPS=off step 120 .dev/conformance --test-threads 8 wgpu::
WEBTENSOR_WGPU_INT_DOT=off step 120 .dev/conformance --test-threads 8 wgpu::
WEBTENSOR_WGPU_ROW_TEAMS=off step 90 .dev/conformance --test-threads 8 wgpu::qmatmul wgpu::matmul
step 150 .dev/webtensor bench --backend wgpu --backend cuda --size medium --op matmul --op qmatmul \
  --report "$OUT/medium"
# The quantized prefill in tiles (mm_tiled) against the row-dot kernel it replaced there.
WEBTENSOR_WGPU_TILED_PREFILL=off step 90 .dev/webtensor bench --backend wgpu --size medium --op qmatmul
step 120 .dev/webtensor bench --backend wgpu --backend cuda --report "$OUT/ops"
