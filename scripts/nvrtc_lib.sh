#!/usr/bin/env bash
# Prints the folder holding libnvrtc.so.12 from the `nvidia-cuda-nvrtc-cu12` PyPI package;
# fails when the package is not installed.
set -euo pipefail
python3 - <<'PY'
import os, sys
try:
    import nvidia.cuda_nvrtc as m
except ImportError:
    sys.exit(1)
lib = os.path.join(list(m.__path__)[0], "lib")
if not os.path.exists(os.path.join(lib, "libnvrtc.so.12")):
    sys.exit(1)
print(lib)
PY
