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
