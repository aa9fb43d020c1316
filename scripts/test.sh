#!/usr/bin/env bash
# The test command of README.md (and exactly what .ci/run runs): installs
# what is missing, then runs every test that needs no GPU:
#   1. the whole workspace's tests (unit, multi-threaded, integration; the
#      device headers compiled with NVRTC for sm_90, which MUST run here:
#      CPNET_REQUIRE_NVRTC=1 turns a missing libnvrtc into a failure; the
#      proxy daemon's isolation and fault tests, tests/tests/daemon.rs,
#      run one as root and skip it with a line otherwise: another uid);
#   2. the loom model of the queue protocol (`--cfg loom`);
#   3. scripts/test-c.sh: libcpnet and shmem.h as a C user gets them
#      (scripts/install.sh into a temporary prefix; C programs built with
#      oshcc and run with oshrun -np 2 and 4; bad input; apps/c);
#   4. scripts/twohost.sh: a two-host job between two network namespaces
#      over tcp;ofi_rxm, with the debug binaries step 1 built (it skips
#      with one line where `ip netns` does not work, e.g. not as root);
#   5. the scripts that run only on a GPU machine (anchors.sh,
#      graph-gpu.sh, daemon-gpu.sh, carry.sh, the NCCL anchors): every
#      shell script and Python script parses, and the three batch scripts
#      refuse a machine without GPUs with their message.
# GPU tests skip with a message on a machine without a GPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup.sh
export CPNET_REQUIRE_NVRTC=1
cargo test --workspace --locked
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test --locked -p cpnet-device --no-default-features --test loom --release
bash scripts/test-c.sh
TWOHOST_PROFILE=debug bash scripts/twohost.sh
for f in scripts/*.sh scripts/lib/*.sh; do bash -n "$f"; done
python3 -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' scripts/*.py
if ! command -v nvidia-smi >/dev/null || [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 2 ]; then
  gpu_out=$(mktemp -d)
  for s in anchors graph-gpu; do
    out=$(BIN=target/debug bash "scripts/$s.sh" "$gpu_out/$s" 2>&1) && { echo "$s.sh ran without 2 GPUs"; exit 1; }
    grep -q "needs 2 GPUs" <<<"$out" || { echo "$s.sh: unexpected refusal: $out"; exit 1; }
  done
  rm -rf "$gpu_out"
  echo "test: anchors.sh and graph-gpu.sh refuse a machine without 2 GPUs, naming it"
fi
if ! command -v nvidia-smi >/dev/null || [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 1 ]; then
  out=$(BIN=target/debug bash scripts/daemon-gpu.sh "$(mktemp -d)/daemon-gpu" 2>&1) && { echo "daemon-gpu.sh ran without a GPU"; exit 1; }
  grep -q "daemon-gpu.sh: no GPU" <<<"$out" || { echo "daemon-gpu.sh: unexpected refusal: $out"; exit 1; }
  echo "test: daemon-gpu.sh refuses a machine without a GPU, naming it"
fi
