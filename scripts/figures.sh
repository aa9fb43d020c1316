#!/usr/bin/env bash
# The evaluation figures (docs/figures.md).
#
#   bash scripts/figures.sh cpu    # CPU-only data (no GPU needed) into docs/data/cpu,
#                                  # then its figures into docs/figs/cpu (~1 minute)
#   bash scripts/figures.sh gpu    # on a GPU machine with >= 2 GPUs: the GPU data into
#                                  # docs/data, then every figure into docs/figs (~4 minutes)
#   bash scripts/figures.sh plot   # only re-draw docs/data -> docs/figs
#
# `gpu` runs prebuilt binaries from BIN (default target/release; the GPU
# machine has no Rust, so build here and carry them): cpnet-gpu-bench --suite
# (fig4-service.csv, proxy-cost.csv, p2p-ipc.csv), cpnet-gpu-p2p over the
# staged path (p2p-staged.csv), the Jacobi sweep 256^2..16384^2 x 1000
# iterations on 2 PEs, intra-kernel, inter-kernel and (to 1024^2) cpu
# (fig9.csv), the allreduce variants on 2 PEs and 64 MiB on 2..NGPUS PEs
# (fig10.csv), NCCL through scripts/nccl_allreduce.py when python3 has torch,
# and, when MGPM names a directory holding NVIDIA multi-gpu-programming-models
# Jacobi builds (MGPM/{nccl,nccl_overlap,nvshmem}/jacobi; not part of this
# repository), their times as fig9 anchors. NGPUS (default: nvidia-smi's
# count) caps the PE counts; MACHINE names the machine in the titles.
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
  cpu | plot | gpu) ;;
  *)
    echo "usage: bash scripts/figures.sh cpu|gpu|plot" >&2
    exit 2
    ;;
esac

# nccl-tests rows of allreduce on stdin -> fig10.csv rows of variant $1 on
# $2 PEs (out-of-place columns: size $1, time $6 in us, busbw $8 in GB/s).
to_fig10() {
  awk -v v="$1" -v pes="$2" '!/^#/ && NF >= 9 { printf "%s,%s,%s,%s,%s\n", v, pes, $1, $6, $8 }'
}

if [ "$mode" = plot ]; then
  cargo build --release -p cpnet-plots
  target/release/cpnet-plot --data docs/data --out docs/figs ${MACHINE:+--machine "$MACHINE"}
  exit 0
fi

if [ "$mode" = gpu ]; then
  B=${BIN:-target/release}
  data=docs/data
  mkdir -p "$data" docs/figs
  ngpus=${NGPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
  [ "$ngpus" -ge 2 ] || { echo "figures.sh gpu: needs 2 or more GPUs (found $ngpus)" >&2; exit 1; }
  rm -f "$data/fig4-service.csv" "$data/proxy-cost.csv" "$data/fig9.csv" "$data/fig10.csv"
  echo "== cpnet-gpu-bench --suite (Fig. 4a, 4b, 8a, 8b, proxy cost)"
  "$B/cpnet-run" -n 2 -- "$B/cpnet-gpu-bench" --suite --csv-file "$data/fig4-service.csv" \
    --cost-csv "$data/proxy-cost.csv" --p2p-csv "$data/p2p-ipc.csv"
  echo "== cpnet-gpu-p2p over the staged path (Fig. 8a)"
  CPNET_GPU_IPC=0 "$B/cpnet-run" -n 2 -- "$B/cpnet-gpu-p2p" --max 4M --csv "$data/p2p-staged.csv"
  echo "variant,nx,ny,pes,niter,elements_per_pe,seconds" >"$data/fig9.csv"
  # "S1xS2: 1 GPU: a s, N GPUs: b s, ..." -> the N-PE time b.
  jacobi_row() { # variant S pes niter command...
    local v=$1 s=$2 n=$3 it=$4
    shift 4
    local t
    t=$("$@" | sed -n 's/.*GPUs\{0,1\}: *\([0-9.]*\) s, speedup.*/\1/p' | tail -1)
    [ -n "$t" ] || { echo "figures.sh: no time from: $*" >&2; return 1; }
    echo "$v,$s,$s,$n,$it,$((s * s / n)),$t" | tee -a "$data/fig9.csv"
  }
  echo "== Jacobi sweep, 2 PEs, 1000 iterations (Fig. 9)"
  for s in 256 512 1024 2048 4096 8192 16384; do
    for v in intra-kernel inter-kernel; do
      jacobi_row $v $s 2 1000 "$B/cpnet-run" -n 2 -- "$B/jacobi" -variant $v -nx $s -ny $s -niter 1000
    done
  done
  for s in 256 512 1024; do
    jacobi_row cpu $s 2 1000 "$B/cpnet-run" -n 2 -- "$B/jacobi" -variant cpu -nx $s -ny $s -niter 1000
  done
  if [ -n "${MGPM:-}" ]; then
    echo "== NVIDIA multi-gpu-programming-models anchors from $MGPM (Fig. 9)"
    for s in 1024 4096 16384; do
      for a in nccl:nccl nccl_overlap:nccl-overlap nvshmem:nvshmem; do
        extra=""
        [ "${a%%:*}" = nvshmem ] && extra="-use_block_comm -neighborhood_sync -norm_overlap"
        jacobi_row "${a##*:}" $s 2 1000 mpirun --allow-run-as-root --bind-to none -np 2 -x LD_LIBRARY_PATH \
          -x NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" -x NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}" \
          ${NVSHMEM_BOOTSTRAP_PLUGIN_DIR:+-x NVSHMEM_BOOTSTRAP_PLUGIN_DIR} \
          "$MGPM/${a%%:*}/jacobi" -nx $s -ny $s -niter 1000 $extra || true
      done
    done
  fi
  echo "variant,pes,bytes,time_us,busbw_GBps" >"$data/fig10.csv"
  echo "== allreduce, 2 PEs (Fig. 10)"
  out=$(mktemp)
  for v in intra-kernel inter-kernel; do
    "$B/cpnet-run" -n 2 -- "$B/allreduce" -variant $v -b 8 -e 256M -f 4 >"$out"
    cat "$out"
    to_fig10 $v 2 <"$out" >>"$data/fig10.csv"
  done
  "$B/cpnet-run" -n 2 -- "$B/allreduce" -variant cpu -b 8 -e 64M -f 4 >"$out"
  cat "$out"
  to_fig10 cpu 2 <"$out" >>"$data/fig10.csv"
  rm -f "$out"
  echo "== allreduce, 64 MiB on 2..$ngpus PEs (Fig. 10, strong scaling)"
  for n in $(seq 2 "$ngpus"); do
    "$B/cpnet-run" -n "$n" -- "$B/allreduce" -variant intra-kernel -b 64M -e 64M | to_fig10 intra-kernel "$n" >>"$data/fig10.csv"
  done
  if python3 -c "import torch" 2>/dev/null; then
    echo "== NCCL through torch.distributed (Fig. 10 reference)"
    python3 -m torch.distributed.run --nproc_per_node=2 scripts/nccl_allreduce.py 2>/dev/null | grep '^nccl,' >>"$data/fig10.csv"
    for n in $(seq 3 "$ngpus"); do
      python3 -m torch.distributed.run --nproc_per_node="$n" scripts/nccl_allreduce.py 67108864 2>/dev/null | grep '^nccl,' >>"$data/fig10.csv"
    done
  fi
  # GPU machines often lack fonts: the CSVs are the result, draw them
  # anywhere with `bash scripts/figures.sh plot`.
  "$B/cpnet-plot" --data "$data" --out docs/figs ${MACHINE:+--machine "$MACHINE"} ||
    echo "figures.sh: could not draw here; copy docs/data back and run: bash scripts/figures.sh plot" >&2
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

echo "variant,pes,bytes,time_us,busbw_GBps" >"$data/fig10.csv"
echo "== allreduce, CPU work-groups, 2 PEs, 8 B..64 MiB"
out=$(target/release/cpnet-run -n 2 -- target/release/allreduce -variant cpu -b 8 -e 64M -f 2)
echo "$out"
echo "$out" | to_fig10 cpu 2 >>"$data/fig10.csv"
echo "== allreduce, CPU work-groups, 4 PEs, 64 MiB"
out=$(target/release/cpnet-run -n 4 -- target/release/allreduce -variant cpu -b 64M -e 64M)
echo "$out"
echo "$out" | to_fig10 cpu 4 >>"$data/fig10.csv"

cores=$(nproc 2>/dev/null || echo "?")
target/release/cpnet-plot --data "$data" --out "$figs" --machine "${MACHINE:-CPU only, $cores cores}"
