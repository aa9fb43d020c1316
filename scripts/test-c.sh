#!/usr/bin/env bash
# The C tests of libcpnet and shmem.h (run by scripts/test.sh): everything
# is built against the INSTALLED library and headers, as a C user builds.
#
#   1. scripts/install.sh --prefix <temp> --debug;
#   2. tests/c/*.c (one program per routine family, checking values) built
#      with oshcc (C11, -Wall -Wextra -Werror), run with oshrun -np 2 and 4
#      (shm), rma and coll also over tcp;ofi_rxm;
#      rma.c also linked statically against libcpnet.a; shmem.h also
#      compiled as C99 (no _Generic) and as C++;
#   3. tests/c/errors.c: each bad input ends the job with a non-zero status
#      and a message naming the routine (checked against the expected text);
#   4. apps/c built by its Makefile against the installed library and run;
#   5. apps/cuda (nvshmem.h, CUDA C++) built with nvcc by its Makefile
#      against the installed library: nvcc on PATH, else the one
#      scripts/setup.sh installs from PyPI (nvidia-cuda-nvcc); without a GPU
#      it must refuse to start with a clear message, with one it runs on 2
#      PEs and checks every point.
#
# CPNET_TEST_C_PREFIX=DIR installs there instead of a temporary directory
# (kept afterwards).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

prefix=${CPNET_TEST_C_PREFIX:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/cpnet-test-c.XXXXXX")
trap 'rm -rf "$work"' EXIT
[ -n "$prefix" ] || prefix="$work/prefix"
bash scripts/install.sh --prefix "$prefix" --debug >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
export PATH="$prefix/bin:$PATH"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# A wait that hangs fails the test in 60 s rather than CI's limit.
export CPNET_WAIT_TIMEOUT=${CPNET_WAIT_TIMEOUT:-60}

fail=0
start=$(date +%s)
say() { printf 'test-c: %s\n' "$*"; }

# 2. the routine families
for src in tests/c/*.c; do
  name=$(basename "$src" .c)
  oshcc -std=c11 -O1 -g -Wall -Wextra -Werror -pthread "$src" -o "$work/$name"
done
for name in rma amo sync coll ctx mem; do
  for np in 2 4; do
    if timeout 120 oshrun -np "$np" "$work/$name" >"$work/$name.$np.out" 2>&1 &&
       [ "$(grep -c "^$name: PE .* ok$" "$work/$name.$np.out")" = "$np" ]; then
      say "ok   $name -np $np"
    else
      say "FAIL $name -np $np:"; cat "$work/$name.$np.out"; fail=1
    fi
  done
done
# the other provider: tcp;ofi_rxm (what multi-host jobs use)
for name in rma coll; do
  if CPNET_PROVIDER='tcp;ofi_rxm' timeout 120 oshrun -np 2 "$work/$name" >"$work/$name.tcp.out" 2>&1 &&
     [ "$(grep -c "^$name: PE .* ok$" "$work/$name.tcp.out")" = 2 ]; then
    say "ok   $name -np 2 over tcp;ofi_rxm"
  else
    say "FAIL $name -np 2 over tcp;ofi_rxm:"; cat "$work/$name.tcp.out"; fail=1
  fi
done
cc -std=c11 -O1 tests/c/rma.c $(pkg-config --cflags cpnet) "$prefix/lib/libcpnet.a" \
  $(pkg-config --static --libs-only-l cpnet | sed 's/-lcpnet//') -o "$work/rma-static"
if ldd "$work/rma-static" | grep -q libcpnet; then say "FAIL rma-static links libcpnet.so"; fail=1; fi
if timeout 120 oshrun -np 2 "$work/rma-static" >"$work/static.out" 2>&1; then say "ok   rma linked with libcpnet.a -np 2"; else
  say "FAIL rma linked with libcpnet.a:"; cat "$work/static.out"; fail=1; fi
printf '#include <shmem.h>\nint main(void) { shmem_init(); shmem_int_p((int *)shmem_malloc(4), 1, 0); shmem_finalize(); return 0; }\n' >"$work/c99.c"
oshcc -std=c99 -Wall -Wextra -Werror -pedantic -c "$work/c99.c" -o "$work/c99.o" && say "ok   shmem.h as C99 -pedantic"
printf '#include <shmem.h>\nint main() { shmem_init(); int *x = (int *)shmem_malloc(4); shmem_int_p(x, 1, 0); shmem_finalize(); return 0; }\n' >"$work/cxx.cc"
if command -v c++ >/dev/null; then OSHCC_CC=c++ oshcc -Wall -Wextra -Werror "$work/cxx.cc" -o "$work/cxx" && say "ok   shmem.h as C++"; fi

# 3. bad input: case, PEs, expected status, text the message must have
check_error() {
  local case=$1 np=$2 status=$3 text=$4 rc=0
  CPNET_WAIT_TIMEOUT=2 timeout 60 oshrun -np "$np" "$work/errors" "$case" >"$work/err.out" 2>&1 || rc=$?
  if [[ "$rc" =~ ^($status)$ ]] && grep -qF -- "$text" "$work/err.out"; then
    say "ok   bad input '$case': status $rc, \"$text\""
  else
    say "FAIL bad input '$case': status $rc (expected $status), message must contain \"$text\":"; cat "$work/err.out"; fail=1
  fi
}
check_error before-init 2 1 "shmem_my_pe: called before shmem_init"
check_error put-before-init 1 1 "shmem_int_p: called before shmem_init"
check_error bad-pe 2 1 "shmem_long_put: PE 5 is not a valid PE number: the PEs are 0 to 1"
check_error negative-pe 4 1 "shmem_long_g: PE -1 is not a valid PE number"
check_error amo-bad-pe 2 1 "shmem_long_atomic_add: PE 2 is not a valid PE number"
check_error outside-heap 2 1 "shmem_long_put: dest 0x"
check_error outside-heap 2 1 "is not in the symmetric heap"
check_error global-dest 2 1 "shmem_long_p: dest 0x"
check_error size-too-big 2 1 "shmem_getmem: source 0x"
check_error size-too-big 2 1 "bytes does not fit in the symmetric heap"
check_error misaligned-amo 2 1 "shmem_long_atomic_add: dest 0x"
check_error bad-free 2 1 "shmem_free: 0x"
check_error bad-cmp 2 1 "shmem_long_wait_until: comparison 99"
check_error bad-team 2 1 "shmem_team_sync: 0x28 is not a valid team"
check_error bad-ctx 2 1 "shmem_ctx_quiet: 0x1234 is not a live context"
check_error wait-timeout 2 1 "shmem_long_wait_until: timed out after 2s (CPNET_WAIT_TIMEOUT) waiting for ivars[0]"
# The launcher exits with the first failed PE's status: PE 0's 7, or the
# other PE's 1 when it ended first on learning of the exit; PE 0's own
# status is always 7.
check_error global-exit 2 "1|7" "PE 0 exited with status 7"

# 4. the example, built by its Makefile against the installed library only
rm -rf "$work/apps-c" && cp -r apps/c "$work/apps-c" && rm -f "$work/apps-c/ring"
if make -s -C "$work/apps-c" CPNET_PREFIX="$prefix" >"$work/make.out" 2>&1 &&
   for np in 2 4; do make -s -C "$work/apps-c" CPNET_PREFIX="$prefix" NP=$np run || exit 1; done >"$work/ring.out" 2>&1; then
  grep '^ring:' "$work/ring.out" | sed 's/^/test-c:      /'
  say "ok   apps/c/ring -np 2 and 4"
else
  say "FAIL apps/c:"; cat "$work/make.out" "$work/ring.out" 2>/dev/null; fail=1
fi

# 5. the CUDA example (nvshmem.h), built with nvcc against the installed library only
nvcc_bin=$(command -v nvcc || true)
if [ -z "$nvcc_bin" ]; then
  nvcc_bin=$(${PYTHON:-python3} -c 'import glob, importlib.util as u; s = u.find_spec("nvidia"); print(next(iter(sorted(p for r in (s.submodule_search_locations if s else []) for p in glob.glob(r + "/cu*/bin/nvcc"))), ""))' 2>/dev/null || true)
fi
if [ -z "$nvcc_bin" ]; then
  say "skip apps/cuda: no nvcc (scripts/setup.sh installs it from PyPI: nvidia-cuda-nvcc)"
else
  rm -rf "$work/apps-cuda" && cp -r apps/cuda "$work/apps-cuda" && rm -f "$work/apps-cuda/jacobi"
  if make -s -C "$work/apps-cuda" PREFIX="$prefix" NVCC="$nvcc_bin" >"$work/nvcc.out" 2>&1 &&
     "$nvcc_bin" -arch=sm_90 -O2 -std=c++17 -I"$prefix/include" tests/cuda/coll.cu -o "$work/coll" \
       -L"$prefix/lib" -lcpnet -Xlinker -rpath -Xlinker "$prefix/lib" >>"$work/nvcc.out" 2>&1 &&
     "$nvcc_bin" -arch=sm_90 -O2 -std=c++17 -I"$prefix/include" tests/cuda/fill.cu -o "$work/fill" \
       -L"$prefix/lib" -lcpnet -Xlinker -rpath -Xlinker "$prefix/lib" >>"$work/nvcc.out" 2>&1 &&
     "$nvcc_bin" -arch=sm_90 -O2 -std=c++17 -I"$prefix/include" tests/cuda/amo.cu -o "$work/amo" \
       -L"$prefix/lib" -lcpnet -Xlinker -rpath -Xlinker "$prefix/lib" >>"$work/nvcc.out" 2>&1 &&
     "$nvcc_bin" -arch=sm_90 -O2 -std=c++17 -I"$prefix/include" tests/cuda/warp.cu -o "$work/warp" \
       -L"$prefix/lib" -lcpnet -Xlinker -rpath -Xlinker "$prefix/lib" >>"$work/nvcc.out" 2>&1 &&
     "$nvcc_bin" -arch=sm_90 -O2 -std=c++17 tests/cuda/launch_gap.cu -o "$work/launch_gap" >>"$work/nvcc.out" 2>&1; then
    say "ok   tests/cuda/coll.cu (nvshmem.h team collectives), fill.cu, amo.cu (thread-scope AMOs), warp.cu (warp-scope RMA) and launch_gap.cu (a benchmark) built with nvcc"
    say "ok   apps/cuda/jacobi built with $("$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p') against the installed nvshmem.h, no -rdc"
    rc=0
    timeout 120 cpnet-run -n 2 -- "$work/apps-cuda/jacobi" -nx 256 -ny 258 -iters 100 >"$work/jacobi.out" 2>&1 || rc=$?
    if grep -q "jacobi: 2 PEs, 0 wrong points in all: OK" "$work/jacobi.out" && [ "$rc" = 0 ]; then
      say "ok   apps/cuda/jacobi -n 2 on the GPU, every point checked"
      if timeout 120 cpnet-run -n 2 -- "$work/coll" >"$work/coll.out" 2>&1 &&
         [ "$(grep -c ' 0 wrong: ok$' "$work/coll.out")" = 2 ]; then
        say "ok   tests/cuda/coll -n 2 on the GPU (peer stores), every element checked"
      else
        say "FAIL tests/cuda/coll:"; cat "$work/coll.out"; fail=1
      fi
      # The network path (as to a PE on another host): every put and signal
      # through the queue, the proxy and the landing agent on the target.
      if CPNET_GPU_IPC=0 CPNET_GPU_P2P=0 timeout 120 cpnet-run -n 2 -- "$work/coll" >"$work/coll-net.out" 2>&1 &&
         [ "$(grep -c ' 0 wrong: ok$' "$work/coll-net.out")" = 2 ] &&
         CPNET_GPU_IPC=0 CPNET_GPU_P2P=0 timeout 120 cpnet-run -n 2 -- "$work/apps-cuda/jacobi" -nx 256 -ny 258 -iters 100 >"$work/jacobi-net.out" 2>&1 &&
         grep -q "jacobi: 2 PEs, 0 wrong points in all: OK" "$work/jacobi-net.out"; then
        say "ok   tests/cuda/coll and apps/cuda/jacobi -n 2 on the network path (CPNET_GPU_IPC=0 CPNET_GPU_P2P=0)"
      else
        say "FAIL tests/cuda/coll or apps/cuda/jacobi on the network path:"; cat "$work/coll-net.out" "$work/jacobi-net.out" 2>/dev/null; fail=1
      fi
      # The largest collective launch the query allows, waiting on the
      # network: the landing agents must still find room beside it.
      if timeout 120 cpnet-run -n 2 -- "$work/fill" >"$work/fill.out" 2>&1 &&
         CPNET_GPU_IPC=0 CPNET_GPU_P2P=0 timeout 120 cpnet-run -n 2 -- "$work/fill" >>"$work/fill.out" 2>&1 &&
         [ "$(grep -c ' 0 wrong: ok$' "$work/fill.out")" = 4 ]; then
        say "ok   tests/cuda/fill -n 2, peer stores and network path: $(grep -m1 -o '[0-9]* blocks' "$work/fill.out") per PE, the grid one larger refused"
      else
        say "FAIL tests/cuda/fill:"; cat "$work/fill.out"; fail=1
      fi
      # Thread-scope AMOs under contention and warp-scope RMA (peer stores:
      # the default on one host).
      if timeout 120 cpnet-run -n 2 -- "$work/amo" >"$work/amo.out" 2>&1 &&
         timeout 120 cpnet-run -n 3 -- "$work/amo" >>"$work/amo.out" 2>&1 &&
         [ "$(grep -c ' 0 wrong: ok$' "$work/amo.out")" = 5 ]; then
        say "ok   tests/cuda/amo -n 2 and -n 3 (peer stores): every AMO's result and final word checked"
      else
        say "FAIL tests/cuda/amo:"; cat "$work/amo.out"; fail=1
      fi
      if timeout 120 cpnet-run -n 2 -- "$work/warp" >"$work/warp.out" 2>&1 &&
         [ "$(grep -c ' 0 wrong: ok$' "$work/warp.out")" = 2 ]; then
        say "ok   tests/cuda/warp -n 2 (peer stores): warp puts, put-with-signal and gets checked"
      else
        say "FAIL tests/cuda/warp:"; cat "$work/warp.out"; fail=1
      fi
    elif [ "$rc" = 1 ] && grep -q "nvshmem_init: init failed: no GPU" "$work/jacobi.out"; then
      say "ok   apps/cuda/jacobi without a GPU: \"$(grep -m1 'no GPU' "$work/jacobi.out")\""
    else
      say "FAIL apps/cuda/jacobi (status $rc):"; cat "$work/jacobi.out"; fail=1
    fi
  else
    say "FAIL apps/cuda (nvcc):"; cat "$work/nvcc.out"; fail=1
  fi
fi

say "done in $(( $(date +%s) - start )) s: $([ $fail = 0 ] && echo 'all passed' || echo 'FAILURES above')"
cd "$root"
exit $fail
