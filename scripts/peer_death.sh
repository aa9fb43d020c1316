#!/usr/bin/env bash
# Peer-death campaign of issue 7 (docs/reliability.md): SIGKILL a random PE
# at a random moment of a running allreduce or Jacobi, TRIALS times each,
# and check with cpnet-chaos that every other PE exits non-zero by itself,
# naming the dead PE, within 30 s, with no process left behind.
#
#   bash scripts/peer_death.sh cpu [TRIALS]   # CPU work-groups, 4 PEs, shm and tcp;ofi_rxm
#   BIN=.bin bash scripts/peer_death.sh gpu [TRIALS] [APP]
#                                             # GPU PEs (intra-kernel), one per GPU,
#                                             # NGPUS PEs (default 2); APP allreduce|jacobi|both
#
# cpu builds the release binaries here; gpu takes prebuilt ones from $BIN
# (cpnet-run, cpnet-chaos, allreduce, jacobi). Each run ends with the line
# "cpnet-chaos: K of N trials passed ..."; the exit status is non-zero if
# any trial failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${1:-}
trials=${2:-100}
status=0

campaign() { # provider pes kill_max program args...
  local provider=$1 pes=$2 kmax=$3
  shift 3
  echo "== $trials trials, $pes PEs, CPNET_PROVIDER=$provider: $*"
  local log
  log=$(mktemp)
  CPNET_PROVIDER=$provider RUST_LOG=warn "$B/cpnet-chaos" --trials "$trials" --pes "$pes" \
    --kill-min 0.05 --kill-max "$kmax" --seed "$RANDOM" --launcher "$B/cpnet-run" -- "$@" >"$log" 2>&1 || status=1
  # Passed trials in one count; failed ones (with their output) in full.
  echo "$(grep -c ': ok$' "$log") trials ok; slowest and failed:"
  grep -v ': ok$' "$log"
  rm -f "$log"
}

case $mode in
  cpu)
    cargo build --release -q -p cpnet -p cpnet-tests -p cpnet-apps \
      --bin cpnet-run --bin cpnet-chaos --bin allreduce --bin jacobi
    B=target/release
    for p in shm "tcp;ofi_rxm"; do
      campaign "$p" 4 3 "$B/allreduce" -variant cpu -b 8 -e 8M -f 4 -iters 100
      campaign "$p" 4 3 "$B/jacobi" -variant cpu -nx 1024 -ny 1024 -niter 1000000 -skip_single
    done
    ;;
  gpu)
    B=${BIN:?set BIN to the directory of prebuilt binaries}
    n=${NGPUS:-2}
    app=${3:-both}
    export CPNET_HEAP_SIZE=${CPNET_HEAP_SIZE:-1G}
    if [ "$app" != jacobi ]; then
      campaign shm "$n" 6 "$B/allreduce" -variant intra-kernel -b 8 -e 64M -f 4 -iters 5000 -wgs 16
    fi
    if [ "$app" != allreduce ]; then
      campaign shm "$n" 6 "$B/jacobi" -variant intra-kernel -nx 8192 -ny 8192 -niter 1000000 -skip_single
    fi
    ;;
  *)
    echo "usage: bash scripts/peer_death.sh cpu|gpu [TRIALS] [APP]" >&2
    exit 2
    ;;
esac
exit $status
