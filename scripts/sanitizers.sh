#!/usr/bin/env bash
# ThreadSanitizer runs of issue 7 ("the proxy and transport tests clean
# under ThreadSanitizer or miri where they apply"). Not part of CI: needs
# nightly with rust-src (`rustup toolchain install nightly --component
# rust-src`), and std is rebuilt instrumented (-Zbuild-std) into its own
# target dir, target/tsan (a first run builds for a few minutes; the ring
# test alone then runs ~2.5 min on a 2-core machine).
#
#   scripts/sanitizers.sh
#
# Runs, each under TSan:
#   1. cpnet-device's ring tests (producer/consumer threads on real rings);
#   2. cpnet-proxy's lib tests (decoder, libfabric loopback endpoints over
#      shm and tcp;ofi_rxm, staged layout), loopback, backpressure and
#      malformed_commands (PROPTEST_CASES=200);
#   3. cpnet's lib tests (bootstrap, env, watchdog, proxy threads, pe) and
#      its rendezvous integration test (runtime/tests/bootstrap.rs).
# libfabric and CUDA are C libraries TSan does not instrument: their own
# accesses are invisible to it (no reports from inside them, and no races
# through them are found). A report names its stack; this script prints,
# per command, its exit status (TSan makes a run with reports exit 66),
# the test results and the number of "WARNING: ThreadSanitizer" reports.
# Miri (not run here): `cargo +nightly miri test -p cpnet-device --test ring`.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export RUSTFLAGS="-Zsanitizer=thread" CARGO_TARGET_DIR=target/tsan PROPTEST_CASES=${PROPTEST_CASES:-200}
T=(-Zbuild-std --target x86_64-unknown-linux-gnu)
logs=target/tsan/logs
mkdir -p "$logs"
status=0
summary=()
run() {
  local name=$1; shift
  echo "+ $*"
  local t0=$SECONDS
  "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || status=1
  local warnings results
  warnings=$(grep -c "WARNING: ThreadSanitizer" "$logs/$name.log")
  results=$(grep -E "^test result" "$logs/$name.log" | sed -E 's/; 0 measured.*//' | paste -sd'|' -)
  summary+=("$name: exit $rc, $((SECONDS - t0)) s, TSan warnings: $warnings; ${results:-no test results (see $logs/$name.log)}")
  echo "${summary[-1]}"
}
run ring cargo +nightly test "${T[@]}" -p cpnet-device --test ring
run proxy cargo +nightly test "${T[@]}" -p cpnet-proxy --lib --test loopback --test backpressure --test malformed_commands
run cpnet cargo +nightly test "${T[@]}" -p cpnet --lib --test bootstrap
echo
echo "ThreadSanitizer summary (logs in $logs):"
printf '  %s\n' "${summary[@]}"
exit $status
