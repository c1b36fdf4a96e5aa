#!/usr/bin/env bash
# Installs what is needed, builds, and runs every test: the normal build,
# then the same tests built with AddressSanitizer + UBSan, and clang's
# thread-safety analysis of the lock contracts.
#
# The sanitizer build compiles in the background (at a lower priority)
# while the normal build's tests run: those spend most of their time
# waiting on heartbeats, timeouts and child processes, which leaves a
# build most of the two cores. CKPT_SKIP_SANITIZERS=1 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# Every C/C++/CUDA file is clang-formatted (Google style); fails naming the files.
scripts/format.sh --check
# Warnings are errors here (CKPT_WERROR): the tree builds with zero.
scripts/build.sh -DCKPT_WERROR=ON
scripts/install-python.sh

sanitizers=$([[ "${CKPT_SKIP_SANITIZERS:-0}" == 1 ]] && echo 0 || echo 1)
asan_pid=
if [[ $sanitizers == 1 ]]; then
  # CUDA, the benchmarks, the Python module and the binaries of slow tests
  # (run once, in the normal build) add nothing to a sanitizer run. -Og:
  # the sanitizers' instrumentation makes -O2 units ~3x slower to compile
  # than plain ones, and -Og takes ~40% of that off (measured on the
  # coordinator's largest unit) while keeping the code fast enough for
  # the tests' timing. GCC's -Og reports uninitialised values it cannot
  # rule out where -O2 can; the normal build above checks that warning.
  mkdir -p build-asan
  # Its own process group, stopped with this script however it ends.
  BUILD_DIR=build-asan setsid nice -n 10 scripts/build.sh -DCKPT_SANITIZE=ON -DCKPT_WITH_CUDA=OFF \
    -DCKPT_WERROR=ON "-DCKPT_SKIP=bench;python" -DCKPT_SLOW_TESTS=OFF \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-Og -g1 -DNDEBUG -Wno-maybe-uninitialized" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-Og -g1 -DNDEBUG -Wno-maybe-uninitialized" \
    >build-asan/build.log 2>&1 &
  asan_pid=$!
  trap 'kill -- -"$asan_pid" 2>/dev/null || true' EXIT
fi

# Two at a time (the multi-node tests one at a time beside the rest: their
# RESOURCE_LOCK in tests/CMakeLists.txt), then the tests labelled "slow"
# (external servers, Python, packaging), also two at a time but for those
# marked RUN_SERIAL (etcd failovers, object-store node losses, the GPT
# recovery), which run alone.
(cd build && ctest --output-on-failure -j2 --timeout 600 -LE slow)
(cd build && ctest --output-on-failure -j2 --timeout 600 -L slow)
# The lock contracts (ABSL_GUARDED_BY, ...) of the daemon and coordinator.
scripts/thread-safety.sh

if [[ $sanitizers == 1 ]]; then
  if ! wait "$asan_pid"; then
    tail -n 80 build-asan/build.log
    echo "test.sh: the sanitizer build failed (build-asan/build.log)" >&2
    exit 1
  fi
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  # The tests labelled "slow" ran once above; the sanitizer build runs the rest.
  (cd build-asan && ctest --output-on-failure -j2 --timeout 900 -LE slow)
fi
