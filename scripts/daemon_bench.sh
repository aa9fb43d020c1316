#!/usr/bin/env bash
# The proxy daemon's price for CPU PEs (issue 20, docs/results.md "The proxy
# daemon"), in one run on this host, with the release binaries:
#   1. cpnet-bench, in-process proxy and daemon side by side (interleaved,
#      REPS times each): put/get latency, bandwidth, AMO latency, message rate;
#   2. CPU of an idle proxy: the daemon with nothing attached, then the daemon
#      and the in-process proxy with 2 attached PEs that do nothing (PE 1
#      sleeps before a barrier), CPNET_PROXY_IDLE=spin and park, from
#      /proc/<pid>/stat over IDLE_S seconds;
#   3. the wake-up: 8-byte blocking puts after 20 ms idle each
#      (cpnet-bench --wake-gap-ms 20), spin and park, in-process and daemon.
#
#   bash scripts/daemon_bench.sh            # REPS=2 IDLE_S=3 by default
#
# Each section prints the command it ran. Provider: CPNET_PROVIDER (default shm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPS=${REPS:-2}
IDLE_S=${IDLE_S:-3}
export CPNET_PROVIDER=${CPNET_PROVIDER:-shm} RUST_LOG=${RUST_LOG:-warn}
cargo build -q --release -p cpnet -p cpnet-apps -p cpnet-tests --bins
B=target/release
dir=$(mktemp -d /tmp/cpnet-daemon-bench.XXXXXX)
chmod 700 "$dir"
export CPNET_PROXYD_DIR=$dir
"$B/cpnet-proxyd" --dir "$dir" --persistent 2>"$dir.log" &
dpid=$!
trap 'kill $dpid 2>/dev/null; wait $dpid 2>/dev/null; rm -rf "$dir" "$dir.log"' EXIT
until [ -S "$dir/proxyd.sock" ]; do sleep 0.05; done
tck=$(getconf CLK_TCK)
# cpu PID... : summed utime+stime ticks of the processes
ticks() { local t=0 p; for p in "$@"; do [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }

echo "== 1. cpnet-bench, in-process vs daemon ($REPS runs each, interleaved), $CPNET_PROVIDER, $(nproc) cores"
for r in $(seq "$REPS"); do
  for mode in inprocess daemon; do
    echo "-- run $r: CPNET_PROXY=$mode $B/cpnet-run -n 2 -- $B/cpnet-bench --max 65536 --floor-iters 0"
    CPNET_PROXY=$mode "$B/cpnet-run" -n 2 -- "$B/cpnet-bench" --max 65536 --floor-iters 0
  done
done

echo "== 2. CPU of an idle proxy, over $IDLE_S s"
t0=$(ticks $dpid); sleep "$IDLE_S"; t1=$(ticks $dpid)
echo "daemon, nothing attached: $(awk -v d=$((t1 - t0)) -v s="$IDLE_S" -v k="$tck" 'BEGIN{printf "%.1f", 100*d/k/s}') % of a core"
for mode in inprocess daemon; do
  for idle in spin park; do
    CPNET_PROXY=$mode CPNET_PROXY_IDLE=$idle "$B/cpnet-run" -n 2 -- "$B/cpnet-check" stuck-barrier --late 1 --sleep $((IDLE_S + 3)) >/dev/null 2>&1 &
    rpid=$!
    sleep 2
    if [ $mode = daemon ]; then pids=$dpid; else pids=$(pgrep -P $rpid | tr '\n' ' '); fi
    # shellcheck disable=SC2086
    t0=$(ticks $pids); sleep "$IDLE_S"; t1=$(ticks $pids)
    wait $rpid || true
    echo "CPNET_PROXY=$mode CPNET_PROXY_IDLE=$idle, 2 PEs attached and idle ($( [ $mode = daemon ] && echo 'the daemon' || echo 'both PE processes')): $(awk -v d=$((t1 - t0)) -v s="$IDLE_S" -v k="$tck" 'BEGIN{printf "%.1f", 100*d/k/s}') % of a core"
  done
done

echo "== 3. wake-up: 8-byte blocking put after 20 ms idle"
for mode in inprocess daemon; do
  for idle in spin park; do
    echo "-- CPNET_PROXY=$mode CPNET_PROXY_IDLE=$idle $B/cpnet-run -n 2 -- $B/cpnet-bench --wake-gap-ms 20 --wake-iters 100 --wake-only --floor-iters 0"
    CPNET_PROXY=$mode CPNET_PROXY_IDLE=$idle "$B/cpnet-run" -n 2 -- "$B/cpnet-bench" --wake-gap-ms 20 --wake-iters 100 --wake-only --floor-iters 0 | grep wake-up
  done
done
