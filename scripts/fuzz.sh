#!/usr/bin/env bash
# libFuzzer run of the proxy's command path (issue 7, malformed commands):
# target decode_execute of proxy/fuzz feeds arbitrary bytes as 64-byte slots
# through a real ring and a real proxy Service (loopback transport, heap with
# guard regions), under AddressSanitizer; every slot must be executed as the
# reference model says or rejected with one of its faults' codes.
# Not part of CI (needs nightly and cargo-fuzz).
#
#   scripts/fuzz.sh [SECONDS] [libFuzzer options...]     (default 600 s)
#
# The corpus grows in proxy/fuzz/corpus/decode_execute, crashes land in
# proxy/fuzz/artifacts/decode_execute (both ignored by git). The number of
# inputs run is libFuzzer's "Done N runs" / stat::number_of_executed_units.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../proxy"
secs=${1:-600}
[ $# -gt 0 ] && shift
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
exec cargo +nightly fuzz run decode_execute -- -max_total_time="$secs" -print_final_stats=1 "$@"
