# shellcheck shell=bash
# One timed step of a GPU-machine batch (scripts/anchors.sh, scripts/bfs-gpu.sh):
# sourced, not run. Needs t0 (the batch's start, date +%s), step_s (a step's
# limit, s) and budget_s (the batch's, s) set by the caller.
#
#   step NAME [VAR=VALUE...] -- CMD [ARGS...]
#
# prints "### NAME (t=...)", runs CMD with the variables under `timeout`
# (the smaller of step_s and what is left of budget_s), drops Jacobi's norm
# lines, and prints "### rc=N NAME"; past the budget it prints that it
# skipped. CMD may be a function of the calling script (run in a bash of
# its own, with the variables exported to it).
step() {
  local name=$1
  shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local used=$(($(date +%s) - t0))
  if [ $((budget_s - used)) -lt 10 ]; then
    echo "### $name: skipped (budget of ${budget_s} s spent)"
    return
  fi
  local lim=$step_s
  [ "$lim" -gt $((budget_s - used)) ] && lim=$((budget_s - used))
  echo "### $name (t=${used}s${envs[*]:+, ${envs[*]}})"
  if declare -F "$1" >/dev/null; then
    local fn=$1
    shift
    env "${envs[@]}" timeout -k 5 "$lim" bash -c "$(declare -f "$fn"); $fn \"\$@\"" _ "$@" 2>&1
  else
    env "${envs[@]}" timeout -k 5 "$lim" "$@" 2>&1
  fi | grep -v '^ *[0-9]*, [0-9.]*$'
  echo "### rc=${PIPESTATUS[0]} $name"
}

# gpu_machine SCRIPT BIN PROGRAM...: ready a GPU machine for a batch, or exit 2
# naming what is missing: every PROGRAM in BIN; two GPUs, or with ONE_GPU=1
# one, with MPS started (and stopped when the script exits) so that two PEs
# share it. Sets the NVLink-multicast guard (../shared/DEVICE.md: multicast
# can put a host's GPUs out of service) and CUDA's libraries on the path.
gpu_machine() {
  local script=$1 bin=$2
  shift 2
  export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  [ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  local b
  for b in "$@"; do
    [ -x "$bin/$b" ] || { echo "$script: $bin/$b is missing (BIN=$bin)" >&2; exit 2; }
  done
  local ngpus
  ngpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  if [ "${ONE_GPU:-0}" = 1 ]; then
    [ "$ngpus" -ge 1 ] || { echo "$script: no GPU" >&2; exit 2; }
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
    mkdir -p /tmp/mps /tmp/mpslog && nvidia-cuda-mps-control -d 2>/dev/null
    trap 'echo quit | nvidia-cuda-mps-control 2>/dev/null' EXIT
  else
    [ "$ngpus" -ge 2 ] || { echo "$script: needs 2 GPUs (found $ngpus); ONE_GPU=1 for two PEs on one GPU under MPS" >&2; exit 2; }
  fi
}
