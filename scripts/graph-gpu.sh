#!/usr/bin/env bash
# The GPU graph tables of issue 23 (BFS, and SSSP's two variants), in one
# batch on a GPU machine with 2 GPUs
# (ONE_GPU=1: the 2-PE rows as two PEs on one GPU under MPS; they then
# measure the exchange's cost, not scaling).
#
#   BIN=.bin/r bash scripts/graph-gpu.sh [OUT_DIR]     # default: graph-gpu-<date>/
#
# 1. Correctness, every search validated by the five Graph500 rules
#    (-verify): SCALE 16 on 1 and 2 PEs with -variant intra-kernel
#    top-down and -direction hybrid, inter-kernel top-down on 2 PEs, and
#    both intra-kernel directions over the network path
#    (CPNET_GPU_IPC=0 CPNET_GPU_P2P=0); sssp -verify (Dijkstra) at SCALE 14
#    with -variant inter-kernel on 1 and 2 PEs and the network path, and
#    both variants' times at SCALE 18 (fixed and adaptive delta).
# 2. The sweep: for each SCALE in SCALES (default "22 23 24"), NBFS
#    searches (default 16) on 1 and 2 PEs with intra-kernel top-down and
#    hybrid and inter-kernel top-down, without -verify (kernel 1 and the
#    validation take most of a run's time at these sizes).
# Then a table: per SCALE and variant, the harmonic-mean TEPS and median
# time on 1 and 2 PEs and their ratio (the issue's target: >= 1.6x).
# Each step has its own limit (STEP_S, default 240 s) and no step starts
# after BUDGET_S (default 560 s: one call of the GPU machine; the whole
# default run took about 330 s on two H200s, SCALE 24's kernel 1 some 24 s
# a run). Runs prebuilt binaries from BIN (default
# target/release): cpnet-run, bfs and sssp.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

B=${BIN:-target/release}
out=${1:-graph-gpu-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
log="$out/graph-gpu.log"
step_s=${STEP_S:-240}
budget_s=${BUDGET_S:-560}
scales=${SCALES:-22 23 24}
nbfs=${NBFS:-16}
t0=$(date +%s)
. "$(dirname "${BASH_SOURCE[0]}")/lib/step.sh"

gpu_machine graph-gpu.sh "$B" cpnet-run bfs sssp
NET=(CPNET_GPU_IPC=0 CPNET_GPU_P2P=0)
export B
bfs() { # PES ARGS...
  local n=$1
  shift
  "$B/cpnet-run" -n "$n" -- "$B/bfs" "$@"
}
TD=(-variant intra-kernel -direction top-down)
HY=(-variant intra-kernel -direction hybrid)
IK=(-variant inter-kernel -direction top-down)
sssp() { # PES ARGS...
  local n=$1
  shift
  "$B/cpnet-run" -n "$n" -- "$B/sssp" "$@"
}

{
  echo "# scripts/graph-gpu.sh on $(hostname), $(date -u +%FT%TZ), BIN=$B, git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), SCALES=$scales NBFS=$nbfs"
  nvidia-smi -L
  echo "# proxy: CPNET_PROXY=${CPNET_PROXY:-unset} (unset: GPU PEs take their GPU's daemon under MPS, i.e. with ONE_GPU=1; in-process otherwise)"
  for n in 1 2; do
    step "verify scale 16, $n PE, intra-kernel top-down" -- bfs $n "${TD[@]}" -scale 16 -nbfs 8 -verify
    step "verify scale 16, $n PE, intra-kernel hybrid" -- bfs $n "${HY[@]}" -scale 16 -nbfs 8 -verify
  done
  step "verify scale 16, 2 PE, inter-kernel top-down" -- bfs 2 "${IK[@]}" -scale 16 -nbfs 8 -verify
  step "verify scale 16, 2 PE, intra-kernel top-down, network path" "${NET[@]}" -- bfs 2 "${TD[@]}" -scale 16 -nbfs 8 -verify
  step "verify scale 16, 2 PE, intra-kernel hybrid, network path" "${NET[@]}" -- bfs 2 "${HY[@]}" -scale 16 -nbfs 8 -verify
  for n in 1 2; do
    step "verify sssp scale 14, $n PE, inter-kernel" -- sssp $n -variant inter-kernel -scale 14 -nsssp 4 -verify
  done
  step "verify sssp scale 14, 2 PE, inter-kernel, network path" "${NET[@]}" -- sssp 2 -variant inter-kernel -scale 14 -nsssp 4 -verify
  for v in intra-kernel inter-kernel; do
    for c in fixed adaptive; do
      step "sssp scale 18, 2 PE, $v, $c" -- sssp 2 -variant $v -scale 18 -nsssp 8 -controller $c
    done
  done
  for s in $scales; do
    for n in 1 2; do
      step "sweep scale $s, $n PE, intra-kernel top-down" -- bfs $n "${TD[@]}" -scale "$s" -nbfs "$nbfs"
      step "sweep scale $s, $n PE, intra-kernel hybrid" -- bfs $n "${HY[@]}" -scale "$s" -nbfs "$nbfs"
      step "sweep scale $s, $n PE, inter-kernel top-down" -- bfs $n "${IK[@]}" -scale "$s" -nbfs "$nbfs"
    done
  done
  echo "### done in $(($(date +%s) - t0)) s"
} 2>&1 | tee "$log"

# The BFS table: each sweep step's harmonic-mean TEPS and median time.
awk '
  /^### sweep scale / && !/rc=/ { split($0, w, /[ ,(]+/); scale = w[4]; pes = w[5]; v = w[7] " " w[8]; next }
  /^bfs_harmonic_mean_TEPS:/ { teps[scale, v, pes] = $2; seen[scale, v] = 1; order[++k] = scale SUBSEP v }
  /^bfs_median_time:/ { med[scale, v, pes] = $2 }
  END {
    printf "\n%-6s %-24s %14s %14s %12s %12s %7s\n", "SCALE", "variant", "TEPS 1 PE", "TEPS 2 PEs", "median 1", "median 2", "ratio"
    for (i = 1; i <= k; i++) {
      if (done[order[i]]++) continue
      split(order[i], kv, SUBSEP); s = kv[1]; v = kv[2]
      t1 = teps[s, v, 1]; t2 = teps[s, v, 2]
      printf "%-6s %-24s %14s %14s %12s %12s %7s\n", s, v, t1, t2, med[s, v, 1], med[s, v, 2], (t1 > 0 && t2 > 0) ? sprintf("%.2fx", t2 / t1) : "-"
    }
  }' "$log" | tee -a "$log"
echo "graph-gpu.sh: the log is $log"
