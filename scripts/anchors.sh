#!/usr/bin/env bash
# The network path beside its floor and its anchor, in one batch (issue 19,
# item 6; issue 22's NCCL comparisons): on a GPU machine with 2 GPUs (or,
# with ONE_GPU=1, two PEs on one GPU under MPS, where NCCL cannot run).
#
#   bash scripts/anchors.sh [OUT_DIR]      # default: anchors-<date>/
#
# Runs prebuilt binaries from BIN (default target/release; the GPU machine
# has no Rust: build here, carry them): cpnet-run, cpnet-gpu-p2p, allreduce,
# jacobi, cpnet-gpu-check, moe, cpnet-bench, and FI_PINGPONG (default: the
# fi_pingpong on PATH, else $BIN/fi_pingpong; Debian's libfabric-bin has it).
# NCCL through PyTorch (scripts/nccl_allreduce.py, scripts/nccl_alltoall.py)
# when python3 imports torch. Every step has its own time limit (STEP_S,
# default 60 s) and the whole batch stops starting steps after BUDGET_S
# (default 540 s), so a hang costs one step, not the batch.
#
# What runs, each section headed by `### name`:
#   floor:  fi_pingpong -e rdm over shm, tcp;ofi_rxm and net (one-way = usec/xfer)
#   cpnet:  put-with-signal ping-pong (8 B-32 KiB), staged bandwidth,
#           allreduce 8 B-64 MiB, Jacobi 4096^2 speedup over 1 GPU (64 and
#           128 WGs), device collectives (coll-bench, a2a-bench), moe; each over the
#           network path (CPNET_GPU_IPC=0 CPNET_GPU_P2P=0) with shm and
#           over TCP sockets with the provider GPU PEs take between hosts
#           (GPU_TCP, default net: libfabric 1.17's native TCP endpoint,
#           docs/runtime.md; GPU_TCP='tcp;ofi_rxm' for rxm), and with peer
#           stores where that is the comparison
#   anchor: NCCL allreduce held to host memory (shm's anchor) and to sockets
#           (tcp's), NCCL over NVLink (peer stores' anchor), NCCL
#           all_to_all_single (moe's)
# The figures go to docs/results.md by hand, with this command beside them.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

B=${BIN:-target/release}
out=${1:-anchors-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
log="$out/anchors.log"
step_s=${STEP_S:-60}
budget_s=${BUDGET_S:-540}
t0=$(date +%s)
export t0
pp=${FI_PINGPONG:-$(command -v fi_pingpong || echo "$B/fi_pingpong")}

. "$(dirname "${BASH_SOURCE[0]}")/lib/step.sh"
gpu_machine anchors.sh "$B" cpnet-run cpnet-gpu-p2p allreduce jacobi cpnet-gpu-check moe cpnet-bench
have_torch=0
python3 -c "import torch" 2>/dev/null && [ "${ONE_GPU:-0}" != 1 ] && have_torch=1

pingpong() { # PROVIDER: fi_pingpong's server and client on this host
  "$pp" -p "$1" -e rdm -I 3000 &
  sleep 0.5
  "$pp" -p "$1" -e rdm -I 3000 localhost
  wait
}
export pp
NET=(CPNET_GPU_IPC=0 CPNET_GPU_P2P=0)
gpu_tcp=${GPU_TCP:-net}
TCP=(CPNET_GPU_IPC=0 CPNET_GPU_P2P=0 "CPNET_PROVIDER=$gpu_tcp")
run=("$B/cpnet-run" -n 2 --)
sizes=8,64,512,4096,32768,262144,2097152,16777216,67108864
nccl() { # SCRIPT ARGS...: scripts/nccl_*.py through torch.distributed.run, its rows only
  python3 -m torch.distributed.run --nproc_per_node=2 "$@" 2>&1 | grep '^nccl'
}

{
  echo "# scripts/anchors.sh on $(hostname), $(date -u +%FT%TZ), BIN=$B, git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi -L
  echo "# proxy: CPNET_PROXY=${CPNET_PROXY:-unset} (unset: GPU PEs take their GPU's daemon under MPS, i.e. with ONE_GPU=1; in-process otherwise)"
  if [ -x "$pp" ]; then
    step "floor: fi_pingpong shm" -- pingpong shm
    step "floor: fi_pingpong tcp;ofi_rxm" -- pingpong 'tcp;ofi_rxm'
    step "floor: fi_pingpong net" -- pingpong net
  else
    echo "### floor: no fi_pingpong ($pp); FI_PINGPONG names one"
  fi
  step "put_signal ping-pong, network path, shm" "${NET[@]}" -- "${run[@]}" "$B/cpnet-gpu-p2p" --pingpong --min 8 --max 32K --iters 500
  step "put_signal ping-pong, network path, tcp ($gpu_tcp)" "${TCP[@]}" -- "${run[@]}" "$B/cpnet-gpu-p2p" --pingpong --min 8 --max 32K --iters 300
  step "put_signal ping-pong, peer stores" -- "${run[@]}" "$B/cpnet-gpu-p2p" --pingpong --min 8 --max 4K --iters 1000
  step "staged bandwidth, shm" "${NET[@]}" -- "${run[@]}" "$B/cpnet-gpu-p2p" --min 256K --max 16M --iters 100 --wgs 4
  # 64 work-groups (the issue's), then the default: as many 1024-thread
  # band blocks as fit beside the norm block (127 on an H200).
  for wgs in 64 default; do
    w=(); [ "$wgs" = default ] || w=(-wgs "$wgs")
    step "Jacobi 4096^2, $wgs WGs, network path, shm" "${NET[@]}" -- "${run[@]}" "$B/jacobi" -variant intra-kernel -nx 4096 -ny 4096 -niter 1000 "${w[@]}"
    step "Jacobi 4096^2, $wgs WGs, network path, tcp ($gpu_tcp)" "${TCP[@]}" -- "${run[@]}" "$B/jacobi" -variant intra-kernel -nx 4096 -ny 4096 -niter 1000 "${w[@]}"
  done
  step "Jacobi 4096^2, default WGs, peer stores" -- "${run[@]}" "$B/jacobi" -variant intra-kernel -nx 4096 -ny 4096 -niter 1000
  step "allreduce, network path, shm" "${NET[@]}" -- "${run[@]}" "$B/allreduce" -variant intra-kernel -b 8 -e 64M -f 8 -wgs 16
  step "allreduce, network path, shm, 64 MiB" "${NET[@]}" -- "${run[@]}" "$B/allreduce" -variant intra-kernel -b 64M -e 64M -wgs 16
  step "allreduce, network path, tcp ($gpu_tcp)" "${TCP[@]}" -- "${run[@]}" "$B/allreduce" -variant intra-kernel -b 8 -e 64M -f 8 -wgs 16
  step "allreduce, network path, tcp ($gpu_tcp), 64 MiB" "${TCP[@]}" -- "${run[@]}" "$B/allreduce" -variant intra-kernel -b 64M -e 64M -wgs 16
  if [ "$have_torch" = 1 ]; then
    step "anchor: NCCL allreduce, host memory" NCCL_P2P_DISABLE=1 -- nccl scripts/nccl_allreduce.py $sizes
    step "anchor: NCCL allreduce, sockets" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo -- nccl scripts/nccl_allreduce.py $sizes
    step "anchor: NCCL allreduce, NVLink" -- nccl scripts/nccl_allreduce.py 8,64,512,4096,8192,32768
  else
    echo "### anchor: NCCL skipped (no torch, or ONE_GPU=1: NCCL refuses two ranks on one GPU)"
  fi
  step "device collectives, peer stores" -- "${run[@]}" "$B/cpnet-gpu-check" --threads 128 coll-bench --iters 1000
  step "device collectives, network path, shm" "${NET[@]}" -- "${run[@]}" "$B/cpnet-gpu-check" --threads 128 coll-bench --iters 1000
  step "device alltoall, peer stores" CPNET_HEAP_SIZE=320M -- "${run[@]}" "$B/cpnet-gpu-check" --threads 256 a2a-bench --max 64M
  step "device alltoall, network path, shm" CPNET_HEAP_SIZE=96M "${NET[@]}" -- "${run[@]}" "$B/cpnet-gpu-check" --threads 256 a2a-bench --max 16M --iters 50
  for wgs in 32 64 128; do
    step "moe, peer stores, $wgs blocks" -- "${run[@]}" "$B/moe" -variant intra-kernel -verify -wgs $wgs
  done
  step "moe, network path, shm" "${NET[@]}" -- "${run[@]}" "$B/moe" -variant intra-kernel -verify -iters 10
  if [ "$have_torch" = 1 ]; then
    # moe's dispatch bytes per pair at T=128, k=8, H=7168 bf16 on 2 PEs: 7340032.
    step "anchor: NCCL all_to_all_single, NVLink" -- nccl scripts/nccl_alltoall.py 1024,16384,262144,1048576,4194304,7340032,16777216,67108864
    step "anchor: NCCL all_to_all_single, host memory" NCCL_P2P_DISABLE=1 -- nccl scripts/nccl_alltoall.py 7340032
  fi
  if [ "$have_torch" = 1 ]; then
    # torchrun as the launcher (runtime/src/env: RANK... with GROUP_RANK,
    # the rendezvous at MASTER_ADDR:MASTER_PORT+1).
    step "launch: cpnet-check ops under torchrun" -- python3 -m torch.distributed.run --nproc_per_node=2 --no-python "$B/cpnet-check" ops
  fi
  step "CPU PEs, shm" CPNET_PROVIDER=shm -- "${run[@]}" "$B/cpnet-bench"
  step "CPU PEs, tcp" "CPNET_PROVIDER=tcp;ofi_rxm" -- "${run[@]}" "$B/cpnet-bench"
  echo "### done in $(($(date +%s) - t0)) s"
} 2>&1 | tee "$log"
echo "anchors.sh: the log is $log"
