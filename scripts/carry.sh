#!/usr/bin/env bash
# Build here what the GPU machine runs (it has no Rust toolchain, and the
# device tool carries at most 64 MiB of ignored files): stripped release
# binaries, fi_pingpong, the nvcc-built CUDA programs against a fresh
# install of libcpnet, and the GPU test binaries.
#
#   bash scripts/carry.sh [DIR]        # default .bin (add it to .git/info/exclude)
#
# DIR/r       cpnet-run, cpnet-proxyd, cpnet-cycles, cpnet-gpu-check, cpnet-gpu-p2p, cpnet-gpu-bench,
#             cpnet-bench, cpnet-check, cpnet-chaos, allreduce, jacobi, moe,
#             bfs, sssp, fi_pingpong: what scripts/anchors.sh and
#             scripts/graph-gpu.sh take as BIN=DIR/r
# DIR/cuda    apps/cuda/jacobi and tests/cuda/{coll,fill,amo,warp,launch_gap}, with
#             lib/libcpnet.so beside them (rpath $ORIGIN/lib)
# DIR/tests   the GPU test binaries (apps/tests/graph.rs, apps/tests/apps.rs,
#             tests/tests/gpu_multi_pe.rs, tests/tests/gpu_daemon.rs),
#             stripped; they find the programs they run through the paths
#             cargo compiled in (target/release/...), so run them from a
#             copy of the repository at the same path as here, with
#             target/release holding DIR/r's programs, e.g.
#             `CPNET_REQUIRE_GPU=1 DIR/tests/graph bfs_gpu --test-threads 1`.
# Prints the sizes; the device tool refuses more than 64 MiB in all.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${1:-.bin}
. scripts/nvrtc-env.sh
mkdir -p "$dir/r" "$dir/cuda/lib" "$dir/tests"

bins=(cpnet-run cpnet-proxyd cpnet-cycles cpnet-gpu-check cpnet-gpu-p2p cpnet-gpu-bench cpnet-bench cpnet-check cpnet-chaos allreduce jacobi moe bfs sssp)
cargo build --release --workspace >/dev/null
for b in "${bins[@]}"; do strip -o "$dir/r/$b" "target/release/$b"; done
cp "$(command -v fi_pingpong)" "$dir/r/" 2>/dev/null || echo "carry: no fi_pingpong here (apt-get install libfabric-bin)" >&2

# The GPU tests' binaries: the newest build of each test target.
test_bins=$(cargo test --release --no-run -p cpnet-apps --test graph --test apps -p cpnet-tests --test gpu_multi_pe --test gpu_daemon --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')
while read -r name exe; do
  [ -n "$name" ] && strip -o "$dir/tests/$name" "$exe"
done <<<"$test_bins"

# CUDA programs against an installed prefix, as a user builds them.
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
bash scripts/install.sh --prefix "$prefix" >/dev/null
nvcc_bin=$(command -v nvcc || python3 -c 'import glob, importlib.util as u; s = u.find_spec("nvidia"); print(next(iter(sorted(p for r in (s.submodule_search_locations if s else []) for p in glob.glob(r + "/cu*/bin/nvcc"))), ""))')
strip -o "$dir/cuda/lib/libcpnet.so" "$prefix/lib/libcpnet.so"
for src in apps/cuda/jacobi.cu tests/cuda/coll.cu tests/cuda/fill.cu tests/cuda/amo.cu tests/cuda/warp.cu tests/cuda/launch_gap.cu; do
  "$nvcc_bin" -arch=sm_90 -O2 -std=c++17 -I"$prefix/include" "$src" -o "$dir/cuda/$(basename "$src" .cu)" \
    -L"$prefix/lib" -lcpnet -Xlinker -rpath -Xlinker '$ORIGIN/lib'
done
du -shc "$dir/r" "$dir/cuda" "$dir/tests"
