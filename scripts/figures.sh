#!/usr/bin/env bash
# The evaluation figures (docs/figures.md).
#
#   bash scripts/figures.sh cpu    # CPU-only data (no GPU needed) into docs/data/cpu,
#                                  # then its figures into docs/figs/cpu (~1 minute)
#   bash scripts/figures.sh plot   # only re-draw docs/data -> docs/figs
#
# `cpu` builds release binaries, measures the queue service time and command
# rate with CPU work-groups (cpnet-service-bench: fig4-service.csv, and the
# proxy threads' CPU time: proxy-cost.csv) and the CPU allreduce on 2 PEs
# (sizes 8 B..64 MiB) and on 4 PEs (64 MiB) (fig10.csv), replacing the CSVs
# of earlier runs, then draws them. Variables: ITERS (blocking no-ops per
# work-group, default 20000), REPS (runs per point, default 3), MACHINE (the
# text in the figure titles).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=${1:-}
case "$mode" in
  cpu | plot) ;;
  *)
    echo "usage: bash scripts/figures.sh cpu|plot" >&2
    exit 2
    ;;
esac

if [ "$mode" = plot ]; then
  cargo build --release -p cpnet-plots
  target/release/cpnet-plot --data docs/data --out docs/figs ${MACHINE:+--machine "$MACHINE"}
  exit 0
fi

cargo build --release -p cpnet-plots -p cpnet-apps -p cpnet --bin cpnet-plot --bin cpnet-service-bench --bin allreduce --bin cpnet-run

data=docs/data/cpu
figs=docs/figs/cpu
mkdir -p "$data"
rm -f "$data/fig4-service.csv" "$data/proxy-cost.csv" "$data/fig10.csv"

echo "== queue service time, command rate and proxy CPU time (CPU work-groups, 1 PE)"
target/release/cpnet-service-bench --threads 1,2,4 --wgs 1,2,4,8,16 \
  --iters "${ITERS:-20000}" --reps "${REPS:-3}" --idle-secs 1 \
  --csv "$data/fig4-service.csv" --cost-csv "$data/proxy-cost.csv"

# nccl-tests rows of allreduce -> fig10.csv rows (out-of-place columns:
# size $1, time $6 in us, busbw $8 in GB/s).
to_fig10() {
  awk -v pes="$1" '!/^#/ && NF >= 9 { printf "cpu,%s,%s,%s,%s\n", pes, $1, $6, $8 }'
}
echo "variant,pes,bytes,time_us,busbw_GBps" >"$data/fig10.csv"
echo "== allreduce, CPU work-groups, 2 PEs, 8 B..64 MiB"
out=$(target/release/cpnet-run -n 2 -- target/release/allreduce -variant cpu -b 8 -e 64M -f 2)
echo "$out"
echo "$out" | to_fig10 2 >>"$data/fig10.csv"
echo "== allreduce, CPU work-groups, 4 PEs, 64 MiB"
out=$(target/release/cpnet-run -n 4 -- target/release/allreduce -variant cpu -b 64M -e 64M)
echo "$out"
echo "$out" | to_fig10 4 >>"$data/fig10.csv"

cores=$(nproc 2>/dev/null || echo "?")
target/release/cpnet-plot --data "$data" --out "$figs" --machine "${MACHINE:-CPU only, $cores cores}"
