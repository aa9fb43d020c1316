#!/usr/bin/env bash
# A real two-host job on one machine (issue 19 item 5).
#
# Two network namespaces stand for two hosts: each has only its loopback and
# its end of a veth pair (10.213.X.1/24 and 10.213.X.2/24), so the veth is
# the only way between them. One PE starts in each, with the environment a
# launcher on two hosts gives (rank, size, local rank 0 of 1: Open MPI's
# variables for the first program, Slurm's for the third; PMI's for the
# second, without MPI_LOCALRANKID/MPI_LOCALNRANKS, as MPICH's Hydra may start
# them: the runtime then assumes one host and only CPNET_PROVIDER keeps it
# off shm) and CPNET_BOOTSTRAP_ADDR=10.213.X.1:29500 (PE 0 serves the
# rendezvous), over CPNET_PROVIDER='tcp;ofi_rxm' with the transport map on
# (CPNET_TRANSPORT_MAP=1). It runs, across the two namespaces:
#   cpnet-check ops
#   cpnet-check ops with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
#     LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT=29499: the
#     rendezvous on the next port) under the Slurm ones `srun torchrun` leaves
#   allreduce -b 8 -e 1M -f 8 -wgs 2            (checks every element)
#   jacobi -nx 256 -ny 256 -niter 200 -wgs 2 -verify
# each under `timeout 300`, and fails unless both PEs exit 0, the allreduce
# reports 0 wrong elements, Jacobi's verification says OK, each PE's
# transport map says `rma via tcp;ofi_rxm` between addresses of the veth's
# subnet, and the veth's byte counters grew both ways.
#
# Then a peer the fabric cannot reach (issue 19, bad input): host B's
# firewall (nftables) drops the fabric's TCP ports (pinned to 41000-41999
# with FI_TCP_PORT_LOW_RANGE/HIGH_RANGE) but not the rendezvous's, and
# `cpnet-check ops` runs with CPNET_REACH_TIMEOUT=5: both PEs must exit
# non-zero (not by `timeout`) within 60 s, and one of them must say that it
# cannot reach the other over tcp;ofi_rxm. Without `nft` this part prints a
# SKIP line.
#
# Output: every PE line prefixed [hostA] or [hostB]; one `twohost:` line per
# program with its time and the bytes that crossed the veth.
#
# Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and `ip`; where a namespace
# cannot be created it prints one SKIP line and exits 0. Uses the release
# binaries in target/release, first bringing them up to date with
# `cargo build --release --workspace` (a no-op when they are);
# TWOHOST_PROFILE=debug uses target/debug instead (scripts/test.sh does,
# right after `cargo test` built those). The namespaces and the veth (names
# carry this shell's pid, so runs in parallel do not clash) are deleted on
# any exit.
#
# GPU PEs (TWOHOST_GPU=1, on a machine with two GPUs): instead of the CPU
# programs, one PE per namespace on its own GPU (CUDA_VISIBLE_DEVICES),
# with the direct paths off (CPNET_GPU_IPC=0 CPNET_GPU_P2P=0: the namespaces
# share one kernel and its GPUs, so CUDA IPC would otherwise join them) and
# no CPNET_PROVIDER, so the runtime picks what GPU PEs take between hosts
# (libfabric's native TCP endpoint, `net` in 1.17; docs/runtime.md):
#   cpnet-gpu-check ops
#   allreduce -variant intra-kernel -b 8 -e 1M -f 8 -wgs 4
#   jacobi -variant intra-kernel -nx 1024 -ny 1024 -niter 200 -verify
# and each PE's map must say `staged active messages via net` between the
# veth's addresses. TWOHOST_BIN=DIR runs prebuilt binaries from DIR without
# building (the GPU machine has no Rust).
#
# Usage: bash scripts/twohost.sh
#        TWOHOST_PROFILE=debug bash scripts/twohost.sh
#        TWOHOST_GPU=1 TWOHOST_BIN=.bin/r bash scripts/twohost.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "twohost: $*"; }

PROFILE=${TWOHOST_PROFILE:-release}
case $PROFILE in
  release | debug) ;;
  *) say "TWOHOST_PROFILE=$PROFILE: expected release or debug"; exit 2 ;;
esac
BIN=${TWOHOST_BIN:-target/$PROFILE}
GPU=${TWOHOST_GPU:-0}
if [ "$GPU" = 1 ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "${gpus:-0}" -lt 2 ]; then
    say "SKIP: TWOHOST_GPU=1 needs two GPUs (nvidia-smi lists ${gpus:-0})"
    exit 0
  fi
  # The runtime's choice between hosts, no CPNET_PROVIDER; the network path.
  PE_ENV=(CPNET_GPU_IPC=0 CPNET_GPU_P2P=0 NO_COLOR=1)
  MAP_PATH="staged active messages via net"
  PROVIDER_TEXT="the runtime's choice for GPU PEs (net)"
else
  PE_ENV=("CPNET_PROVIDER=tcp;ofi_rxm" "FI_OFI_RXM_BUFFER_SIZE=${FI_OFI_RXM_BUFFER_SIZE:-65536}")
  MAP_PATH="rma via tcp;ofi_rxm"
  PROVIDER_TEXT="tcp;ofi_rxm"
fi

if ! command -v ip >/dev/null 2>&1; then
  say "SKIP: no \`ip\` command (iproute2), so no network namespaces"
  exit 0
fi

id=$$
NS_A="cpnet-a-$id"
NS_B="cpnet-b-$id"
VETH_A="cpa$id" # interface names: at most 15 characters
VETH_B="cpb$id"
NET="10.213.$((id % 256))"
ADDR_A="$NET.1"
ADDR_B="$NET.2"
PORT=29500
TMP=""
CREATED=() # the namespaces this run made (only those are deleted)

cleanup() {
  local ns pid
  for ns in "${CREATED[@]}"; do
    # What still runs in our namespaces was started by this script.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns del "$ns" 2>/dev/null || true # takes its end of the veth along
  done
  [ -n "$TMP" ] && rm -rf "$TMP"
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The probe: create a namespace, run in it, make the veth pair.
if ! err=$(ip netns add "$NS_A" 2>&1); then
  say "SKIP: cannot create a network namespace (needs root or CAP_NET_ADMIN): ${err:-ip netns add failed}"
  exit 0
fi
CREATED+=("$NS_A")
if ! err=$(ip netns exec "$NS_A" true 2>&1); then
  say "SKIP: cannot enter a network namespace: ${err:-ip netns exec failed}"
  exit 0
fi
ip netns add "$NS_B"
CREATED+=("$NS_B")
if ! err=$(ip link add "$VETH_A" netns "$NS_A" type veth peer name "$VETH_B" netns "$NS_B" 2>&1); then
  say "SKIP: cannot create a veth pair between namespaces: $err"
  exit 0
fi
ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VETH_A"
ip -n "$NS_B" addr add "$ADDR_B/24" dev "$VETH_B"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "$VETH_A" up
ip -n "$NS_B" link set "$VETH_B" up
say "hosts: $NS_A ($VETH_A $ADDR_A/24) and $NS_B ($VETH_B $ADDR_B/24), rendezvous $ADDR_A:$PORT, provider $PROVIDER_TEXT"

if [ -z "${TWOHOST_BIN:-}" ]; then
  if [ "$PROFILE" = release ]; then cargo build -q --release --workspace; else cargo build -q --workspace; fi
fi
TMP=$(mktemp -d)

# Bytes the veth sent and received, seen from host A: "tx rx".
veth_bytes() {
  ip netns exec "$NS_A" sh -c \
    "cat /sys/class/net/$VETH_A/statistics/tx_bytes /sys/class/net/$VETH_A/statistics/rx_bytes" | tr '\n' ' '
}

# The launcher environment of rank $2 of 2 (one rank per host) in style $1,
# with the rendezvous: CPNET_BOOTSTRAP_ADDR, or for torchrun its
# MASTER_ADDR:MASTER_PORT (the runtime takes the next port), under the Slurm
# variables `srun torchrun` leaves to every worker (one task per node: both
# would be PE 0 of 1 if the runtime read them).
launcher_env() {
  local style=$1 rank=$2 boot="CPNET_BOOTSTRAP_ADDR=$ADDR_A:$PORT"
  case $style in
    ompi) echo "$boot OMPI_COMM_WORLD_RANK=$rank OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1" ;;
    pmi) echo "$boot PMI_RANK=$rank PMI_SIZE=2" ;; # no MPI_LOCAL*: one host assumed
    slurm) echo "$boot SLURM_PROCID=$rank SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=1" ;;
    torchrun) echo "RANK=$rank WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=$rank MASTER_ADDR=$ADDR_A MASTER_PORT=$((PORT - 1)) SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0" ;;
  esac
}

# run_pe NAME NS RANK STYLE PROGRAM ARGS...: one PE, output prefixed with
# [NAME] and kept in $TMP/NAME.out, exit status in $TMP/NAME.rc.
run_pe() {
  local name=$1 ns=$2 rank=$3 style=$4
  shift 4
  {
    local rc=0
    # shellcheck disable=SC2046 # the launcher variables split into words
    ip netns exec "$ns" env -u CPNET_PE -u CPNET_N_PES -u CPNET_LOCAL_PE -u CPNET_LOCAL_SIZE \
      -u CPNET_FABRIC_NODE -u FI_PROVIDER -u CPNET_BOOTSTRAP_ADDR -u CPNET_PROVIDER \
      $(launcher_env "$style" "$rank") \
      "${PE_ENV[@]}" CPNET_TRANSPORT_MAP=1 CUDA_VISIBLE_DEVICES="$rank" \
      timeout 300 "$@" </dev/null 2>&1 || rc=$?
    echo "$rc" >"$TMP/$name.rc"
  } | tee "$TMP/$name.out" | sed -u "s/^/[$name] /"
}

fail() {
  say "FAILED: $*"
  exit 1
}

# check_map NAME ME PEER: the PE's transport map line to its peer says
# $MAP_PATH (rma over tcp;ofi_rxm; for GPU PEs staged active messages over
# net) between two addresses of the veth's subnet.
check_map() {
  local name=$1 me=$2 peer=$3 line
  line=$(grep -F "cpnet: transport map: PE $me -> PE $peer: " "$TMP/$name.out" || true)
  [ -n "$line" ] || fail "$name printed no transport map line for PE $me -> PE $peer"
  case $line in
    *": $MAP_PATH ["*"fi_sockaddr_in://$NET."*" -> fi_sockaddr_in://$NET."*) ;;
    *) fail "$name: expected $MAP_PATH between addresses of $NET.0/24, got: $line" ;;
  esac
  grep -qF "cpnet: transport map: PE $me -> PE $me: self via none [" "$TMP/$name.out" ||
    fail "$name printed no transport map line for PE $me -> PE $me"
}

# job TITLE STYLE PROGRAM ARGS...: the program as PE 0 on host A and PE 1 on
# host B; both must exit 0 and their maps must show the veth.
job() {
  local title=$1 style=$2
  shift 2
  local before after t0 t1 tx rx
  rm -f "$TMP"/host?.rc "$TMP"/host?.out
  before=$(veth_bytes)
  t0=$(date +%s.%N)
  # Both in the background: a signal to this script is handled at once
  # (during `wait`), not after the programs end.
  run_pe hostA "$NS_A" 0 "$style" "$@" &
  local pid_a=$!
  run_pe hostB "$NS_B" 1 "$style" "$@" &
  local pid_b=$!
  wait "$pid_a" || true
  wait "$pid_b" || true
  t1=$(date +%s.%N)
  after=$(veth_bytes)
  local rc_a rc_b
  rc_a=$(cat "$TMP/hostA.rc" 2>/dev/null || echo "unknown")
  rc_b=$(cat "$TMP/hostB.rc" 2>/dev/null || echo "unknown")
  [ "$rc_a" = 0 ] && [ "$rc_b" = 0 ] ||
    fail "$title: PE 0 (host A) exited with status $rc_a, PE 1 (host B) with status $rc_b (124: timed out)"
  check_map hostA 0 1
  check_map hostB 1 0
  read -r tx rx <<<"$(awk -v b="$before" -v a="$after" 'BEGIN { split(b, x, " "); split(a, y, " "); print y[1] - x[1], y[2] - x[2] }')"
  [ "$tx" -gt 0 ] && [ "$rx" -gt 0 ] || fail "$title: nothing crossed the veth (sent $tx, received $rx bytes)"
  say "$title: OK in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s ($style launcher variables; veth A->B $tx bytes, B->A $rx bytes)"
}

if [ "$GPU" = 1 ]; then
  job "cpnet-gpu-check ops (GPU PEs)" ompi "$BIN/cpnet-gpu-check" ops
  grep -q "^PE 0: OK" "$TMP/hostA.out" && grep -q "^PE 1: OK" "$TMP/hostB.out" ||
    fail "cpnet-gpu-check ops: a PE did not report OK"
  # Launcher variables that say one PE per host (not PMI's, which leave
  # the runtime assuming one host: without CPNET_PROVIDER it then picks shm,
  # which the namespaces, sharing one kernel, do not stop).
  job "allreduce -variant intra-kernel -b 8 -e 1M -f 8 -wgs 4" torchrun "$BIN/allreduce" -variant intra-kernel -b 8 -e 1M -f 8 -wgs 4
  grep -Eq "^# Out of bounds values +: 0 OK" "$TMP/hostA.out" ||
    fail "allreduce (GPU): #wrong is not 0 (see the lines above)"
  job "jacobi -variant intra-kernel -nx 1024 -ny 1024 -niter 200 -verify" slurm "$BIN/jacobi" -variant intra-kernel -nx 1024 -ny 1024 -niter 200 -verify
  grep -q "^Verification: .*: OK$" "$TMP/hostA.out" ||
    fail "jacobi (GPU): no OK verification from PE 0"
  say "PASSED: GPU PEs' cpnet-gpu-check ops, allreduce and jacobi -verify between two network namespaces over $PROVIDER_TEXT"
  exit 0
fi

job "cpnet-check ops" ompi "$BIN/cpnet-check" ops
grep -q "^PE 0: OK" "$TMP/hostA.out" && grep -q "^PE 1: OK" "$TMP/hostB.out" ||
  fail "cpnet-check ops: a PE did not report OK"

job "cpnet-check ops under torchrun's variables" torchrun "$BIN/cpnet-check" ops
grep -q "^PE 0: OK" "$TMP/hostA.out" && grep -q "^PE 1: OK" "$TMP/hostB.out" ||
  fail "cpnet-check ops (torchrun): a PE did not report OK"

job "allreduce -b 8 -e 1M -f 8 -wgs 2" pmi "$BIN/allreduce" -b 8 -e 1M -f 8 -wgs 2
grep -Eq "^# Out of bounds values +: 0 OK" "$TMP/hostA.out" ||
  fail "allreduce: #wrong is not 0 (see the lines above)"

job "jacobi -nx 256 -ny 256 -niter 200 -wgs 2 -verify" slurm "$BIN/jacobi" -nx 256 -ny 256 -niter 200 -wgs 2 -verify
grep -q "^Verification: .*: OK$" "$TMP/hostA.out" ||
  fail "jacobi: no OK verification from PE 0"

# A peer the fabric cannot reach: see the header.
unreachable() {
  local title="unreachable peer (fabric ports blocked, CPNET_REACH_TIMEOUT=5)"
  if ! command -v nft >/dev/null 2>&1; then
    say "$title: SKIP: no \`nft\` command (nftables) for the firewall"
    return 0
  fi
  if ! err=$(ip netns exec "$NS_B" nft add table inet cpnet 2>&1); then
    say "$title: SKIP: cannot set up a firewall in the namespace: $err"
    return 0
  fi
  ip netns exec "$NS_B" nft add chain inet cpnet in '{ type filter hook input priority 0; }'
  ip netns exec "$NS_B" nft add rule inet cpnet in tcp dport 41000-41999 drop
  ip netns exec "$NS_B" nft add rule inet cpnet in tcp sport 41000-41999 drop
  rm -f "$TMP"/host?.rc "$TMP"/host?.out
  local t0 t1 rc_a rc_b
  t0=$(date +%s.%N)
  local pe_env=(env FI_TCP_PORT_LOW_RANGE=41000 FI_TCP_PORT_HIGH_RANGE=41999 CPNET_REACH_TIMEOUT=5 CPNET_ABORT_GRACE=2)
  run_pe hostA "$NS_A" 0 ompi "${pe_env[@]}" "$BIN/cpnet-check" ops &
  local pid_a=$!
  run_pe hostB "$NS_B" 1 ompi "${pe_env[@]}" "$BIN/cpnet-check" ops &
  local pid_b=$!
  wait "$pid_a" || true
  wait "$pid_b" || true
  t1=$(date +%s.%N)
  ip netns exec "$NS_B" nft delete table inet cpnet
  rc_a=$(cat "$TMP/hostA.rc" 2>/dev/null || echo "unknown")
  rc_b=$(cat "$TMP/hostB.rc" 2>/dev/null || echo "unknown")
  local took
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  for rc in "$rc_a" "$rc_b"; do
    case $rc in
      0) fail "$title: a PE exited 0 although its peer was unreachable" ;;
      124 | 137 | unknown) fail "$title: a PE hung (status $rc) instead of reporting the unreachable peer" ;;
    esac
  done
  awk -v t="$took" 'BEGIN { exit !(t < 60) }' || fail "$title: took $took s (expected < 60 s)"
  grep -qF "PE 0 cannot reach PE 1 over tcp;ofi_rxm" "$TMP/hostA.out" ||
    grep -qF "PE 1 cannot reach PE 0 over tcp;ofi_rxm" "$TMP/hostB.out" ||
    fail "$title: no PE said which peer it cannot reach"
  say "$title: OK in $took s (statuses $rc_a and $rc_b, the peer named)"
}
unreachable

say "PASSED: cpnet-check ops, allreduce and jacobi -verify between two network namespaces over tcp;ofi_rxm, and an unreachable peer reported"
