#!/usr/bin/env bash
# Installs what cpnet needs on a fresh Debian 12 / Ubuntu 24.04 machine
# (no GPU needed): libfabric (>= 1.17) and its tools, libclang for bindgen,
# pkg-config, a TrueType font for cpnet-plot's figures (fonts-dejavu-core),
# iproute2 and nftables (`ip netns` and a firewall, for scripts/twohost.sh), make
# (apps/c's Makefile), python3-networkx (its example edge list is the graph
# loaders' real test graph), and NVRTC and nvcc 13.x from PyPI so
# the device headers and the CUDA C++ example compile without a CUDA toolkit. Safe to run
# again. Source it (`. scripts/setup.sh`) to also get CPNET_NVRTC_LIB_DIR and
# LD_LIBRARY_PATH in your shell.
set -euo pipefail

need_apt=0
for p in libfabric-dev libfabric-bin libclang-dev clang pkg-config fonts-dejavu-core iproute2 nftables make; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt=1
done
if [ "$need_apt" = 1 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libfabric-dev libfabric-bin libclang-dev clang pkg-config fonts-dejavu-core iproute2 nftables make >/dev/null
fi

# A real graph for the graph loaders' tests (apps/src/graph/load.rs): the
# Hartford drug-user network that Debian's python3-networkx ships as an edge
# list (one package, no recommends).
if ! dpkg -s python3-networkx >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  [ "$need_apt" = 1 ] || $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-networkx >/dev/null
fi

PY=${PYTHON:-python3}
if ! $PY -c 'import importlib.util,sys; sys.exit(0 if importlib.util.find_spec("nvidia.cu13") else 1)' 2>/dev/null; then
  $PY -m pip install -q 'nvidia-cuda-nvrtc>=13,<14' 2>&1 | grep -v "Running pip as the 'root' user" || true
fi
# nvcc and the CUDA runtime's headers and static library, so that the CUDA
# C++ example (apps/cuda, nvshmem.h) compiles without a CUDA toolkit.
if ! compgen -G "$($PY -c 'import importlib.util as u; s = u.find_spec("nvidia"); print(list(s.submodule_search_locations)[0] if s else "/nonexistent")')/cu13/bin/nvcc" >/dev/null; then
  $PY -m pip install -q 'nvidia-cuda-nvcc>=13,<14' 'nvidia-cuda-runtime>=13,<14' 2>&1 | grep -v "Running pip as the 'root' user" || true
fi
. "$(dirname "${BASH_SOURCE[0]}")/nvrtc-env.sh"
echo "cpnet setup: libfabric $(pkg-config --modversion libfabric), NVRTC in ${CPNET_NVRTC_LIB_DIR:-<not found>}"
