#!/usr/bin/env bash
# GPU PEs through their GPU's proxy daemon beside in-process proxies, in one
# batch (issue 20; docs/results.md "GPU PEs through the daemon"): on a GPU
# machine with 2 GPUs (or, with ONE_GPU=1, one), MPS started here (the
# daemon needs it: its landing agents are kernels of another process).
#
#   BIN=.bin/r TESTS=.bin/tests bash scripts/daemon-gpu.sh [OUT_DIR]   # default: daemon-gpu-<date>/
#
# Runs prebuilt binaries from BIN (default target/release): cpnet-run,
# cpnet-proxyd, cpnet-gpu-p2p, allreduce, jacobi, cpnet-gpu-bench,
# cpnet-cycles, cpnet-gpu-check; and, where TESTS has it, the GPU test
# binary gpu_daemon (tests/tests/gpu_daemon.rs; it finds its programs in
# target/release: run from a checkout at the path it was built in).
#
# What runs, each section headed by `### name`, every step with its own
# limit (STEP_S, default 90 s), no step started after BUDGET_S (default 560 s):
#   side by side, network path (CPNET_GPU_IPC=0 CPNET_GPU_P2P=0), shm,
#   CPNET_PROXY=inprocess and =daemon interleaved, REPS rounds (default 2):
#     put_signal ping-pong 8 B-4 KiB, allreduce 8 B-16 MiB, Jacobi 4096^2
#     speedup, and (one PE) the command rate at 1-1024 work-groups;
#   4 PEs on GPU 0 in both modes: allreduce (checked) and Jacobi -verify;
#   attach/detach: one persistent daemon of GPU 0, 4 PEs of cpnet-cycles --gpu
#     attaching to it at once, CYCLES attaches in all (default 400; the
#     issue's 1000 take ~6 min of their own: CYCLES=1000 STEP_S=560 with
#     REPS=0 and no TESTS), in five steps, the daemon's fds, threads,
#     resident set, memfd mappings and GPU memory printed after each;
#   without MPS at the end: CPNET_PROXY=daemon refused, the default in-process.
# The figures go to docs/results.md by hand, with this command beside them.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

B=${BIN:-target/release}
T=${TESTS:-}
out=${1:-daemon-gpu-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
log="$out/daemon-gpu.log"
step_s=${STEP_S:-90}
budget_s=${BUDGET_S:-560}
reps=${REPS:-2}
cycles=${CYCLES:-400}
t0=$(date +%s)
export t0
. "$(dirname "${BASH_SOURCE[0]}")/lib/step.sh"
ONE_GPU=1 gpu_machine daemon-gpu.sh "$B" cpnet-run cpnet-proxyd cpnet-gpu-p2p allreduce jacobi cpnet-gpu-bench cpnet-cycles cpnet-gpu-check
export CPNET_PROXYD_DIR=${CPNET_PROXYD_DIR:-/tmp/cpnet-daemon-gpu-$$}
NET=(CPNET_GPU_IPC=0 CPNET_GPU_P2P=0)
run=("$B/cpnet-run" -n 2 --)
ngpus=$(nvidia-smi -L | wc -l)

# attaches TOTAL BIN: TOTAL attach/detach pairs on one persistent daemon of
# GPU 0 by 4 PEs at once (5 steps of TOTAL / 20 cycles each), probed.
attaches() {
  local total=$1 b=$2 dir uuid dpid n=0 per k
  dir=$(mktemp -d /tmp/cpnet-attach-XXXXXX)
  uuid=$(nvidia-smi -L | head -1 | sed 's/.*UUID: \(GPU-[^)]*\)).*/\1/')
  "$b/cpnet-proxyd" --dir "$dir" --gpu "$uuid" --persistent > "$dir/daemon.log" 2>&1 &
  dpid=$!
  sleep 2
  probe() {
    echo "attaches $n: daemon fds $(ls /proc/$dpid/fd | wc -l), threads $(ls /proc/$dpid/task | wc -l)," \
      "resident $(awk '/VmRSS/ {print $2}' /proc/$dpid/status) KiB, memfd mappings $(grep -c memfd /proc/$dpid/maps)," \
      "GPU 0 memory in use $(nvidia-smi --query-gpu=memory.used --format=csv,noheader -i 0)"
  }
  probe
  per=$((total / 20))
  for k in 1 2 3 4 5; do
    CPNET_PROXYD_DIR=$dir CUDA_VISIBLE_DEVICES=0 CPNET_PROXY=daemon "$b/cpnet-run" -n 4 -- "$b/cpnet-cycles" --gpu --cycles "$per" 2>&1 | grep -v ": cycle "
    n=$((n + 4 * per))
    sleep 1
    probe
  done
  echo "daemon log: $(grep -ci 'warn\|error' "$dir/daemon.log") warnings or errors"
  kill "$dpid"
  wait "$dpid" 2>/dev/null
  rm -rf "$dir"
}

{
  echo "# scripts/daemon-gpu.sh on $(hostname), $(date -u +%FT%TZ), BIN=$B, git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $ngpus GPU(s), MPS on"
  nvidia-smi -L
  for r in $(seq "$reps"); do
    for mode in inprocess daemon; do
      step "put_signal ping-pong, $mode, round $r" "${NET[@]}" CPNET_PROXY=$mode -- "${run[@]}" "$B/cpnet-gpu-p2p" --pingpong --min 8 --max 4K --iters 500
      step "allreduce, $mode, round $r" "${NET[@]}" CPNET_PROXY=$mode -- "${run[@]}" "$B/allreduce" -variant intra-kernel -b 8 -e 16M -f 8 -wgs 16
      step "Jacobi 4096^2, $mode, round $r" "${NET[@]}" CPNET_PROXY=$mode -- "${run[@]}" "$B/jacobi" -variant intra-kernel -nx 4096 -ny 4096 -niter 1000 -wgs 64
      step "command rate, 1 PE, $mode, round $r" CPNET_PROXY=$mode -- "$B/cpnet-run" -n 1 -- "$B/cpnet-gpu-bench" --wgs 1,132,264,1024 --threads 1 --iters 1000
    done
  done
  for mode in inprocess daemon; do
    step "4 PEs on GPU 0: allreduce, $mode" CUDA_VISIBLE_DEVICES=0 "${NET[@]}" CPNET_PROXY=$mode -- "$B/cpnet-run" -n 4 -- "$B/allreduce" -variant intra-kernel -b 8 -e 1M -f 8 -wgs 8
    step "4 PEs on GPU 0: Jacobi 2048^2 -verify, $mode" CUDA_VISIBLE_DEVICES=0 "${NET[@]}" CPNET_PROXY=$mode -- "$B/cpnet-run" -n 4 -- "$B/jacobi" -variant intra-kernel -nx 2048 -ny 2048 -niter 200 -wgs 16 -verify
  done
  step_s=560 step "attach/detach: $cycles attaches of 4 PEs on one persistent daemon of GPU 0" -- attaches "$cycles" "$B"
  if [ -n "$T" ] && [ -x "$T/gpu_daemon" ]; then
    # Its four tests take 2-3 minutes (the matrix alone 75 s on two H200s).
    step_s=300 step "tests/tests/gpu_daemon.rs" CPNET_REQUIRE_GPU=1 -- "$T/gpu_daemon" --test-threads 1 --nocapture
  fi
  echo quit | nvidia-cuda-mps-control 2>/dev/null
  sleep 2
  step "without MPS: CPNET_PROXY=daemon (refused)" CPNET_PROXY=daemon -- "${run[@]}" "$B/cpnet-gpu-check" ops
  step "without MPS: the default (in-process)" -- "${run[@]}" "$B/cpnet-gpu-check" ops
  echo "### done in $(($(date +%s) - t0)) s"
} 2>&1 | tee "$log"
