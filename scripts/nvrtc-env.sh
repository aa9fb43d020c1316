#!/usr/bin/env bash
# Source this to put the NVRTC library installed from PyPI
# (nvidia-cuda-nvrtc 13.x) on LD_LIBRARY_PATH. cudarc loads libnvrtc.so.13
# by name at run time, so the directory must be on the loader's path before
# the process starts. A CUDA toolkit's /usr/local/cuda/lib64 works as well.
PY=${PYTHON:-python3}
CPNET_NVRTC_LIB_DIR=$($PY - <<'PYEOF' 2>/dev/null || true
import glob, os, importlib.util
spec = importlib.util.find_spec("nvidia")
for root in (spec.submodule_search_locations if spec else []):
    for d in sorted(glob.glob(os.path.join(root, "cu*", "lib")) + glob.glob(os.path.join(root, "cuda_nvrtc", "lib"))):
        if glob.glob(os.path.join(d, "libnvrtc.so*")):
            print(d); raise SystemExit
PYEOF
)
if [ -z "$CPNET_NVRTC_LIB_DIR" ] && [ -e /usr/local/cuda/lib64/libnvrtc.so ]; then
  CPNET_NVRTC_LIB_DIR=/usr/local/cuda/lib64
fi
export CPNET_NVRTC_LIB_DIR
if [ -n "$CPNET_NVRTC_LIB_DIR" ]; then
  export LD_LIBRARY_PATH="$CPNET_NVRTC_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
