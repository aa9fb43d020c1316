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
#      with one line where `ip netns` does not work, e.g. not as root).
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
