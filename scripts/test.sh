#!/usr/bin/env bash
# Installs what is needed, builds, and runs every test once, and clang's
# thread-safety analysis of the lock contracts.
#
# Each test runs in one of two builds: the tests of whole jobs (a
# coordinator, several ckptd and their trainers: label system) and the
# slow ones (external servers, Python, packaging, benchmarks' smoke runs)
# in the normal build; the tests of components and of a single ckptd,
# which exercise most of the code, in a build with AddressSanitizer + UBSan.
# A few run in both, where the optimised code is the point (util_test's
# real SIGBUS, the optimizer's bit-exact kernels at -O3).
#
# The sanitizer build compiles in the background (at a lower priority)
# while the normal build's tests run: those spend most of their time
# waiting on heartbeats, timeouts and child processes, which leaves a
# build most of the two cores. CKPT_SKIP_SANITIZERS=1 leaves it out, and
# the normal build then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=$([[ "${CKPT_SKIP_SANITIZERS:-0}" == 1 ]] && echo 0 || echo 1)
scripts/install-deps.sh
# Every C/C++/CUDA file is clang-formatted (Google style); fails naming the files.
scripts/format.sh --check
# Warnings are errors here (CKPT_WERROR): the tree builds with zero.
# At -O1: these binaries serve the tests (whole jobs, Python, packaging,
# the benchmarks' smoke runs), whose time goes to waiting on heartbeats,
# disks and children, and -O1 compiles the libraries ~27% faster than
# -O2 (coordinator's largest unit: 27 against 38 CPU-s). The default
# build, which the benchmarks' figures come from, stays at -O2; the
# optimiser's kernels keep their own -O3.
scripts/build.sh -DCKPT_WERROR=ON -DCKPT_SYSTEM_TESTS=ON -DCKPT_SLOW_TESTS=ON \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DCKPT_UNIT_TESTS=$([[ $sanitizers == 1 ]] && echo OFF || echo ON)
scripts/install-python.sh
# The lock contracts (ABSL_GUARDED_BY, ...) of the daemon and coordinator:
# clang's pass (~1 CPU minute) at the lowest priority from here on, so it
# takes only what the normal suite and the sanitizer build leave idle (their
# waits on children and serial link steps) instead of adding a tail after
# the sanitizer suite, where it used to run (41 s after it, in CI).
nice -n 19 scripts/thread-safety.sh >build/thread-safety.log 2>&1 &
tsa_pid=$!
check_thread_safety() {
  local rc=0
  wait "$tsa_pid" || rc=$?
  cat build/thread-safety.log
  ((rc == 0)) || echo "test.sh: clang's thread-safety analysis failed (above)" >&2
  return $rc
}

asan_pid=
if [[ $sanitizers == 1 ]]; then
  # CUDA, the benchmarks, the Python module and the binaries of slow tests
  # (run once, in the normal build) add nothing to a sanitizer run. -Og:
  # the sanitizers' instrumentation makes -O2 units ~3x slower to compile
  # than plain ones, and -Og takes ~40% of that off (measured on the
  # coordinator's largest unit) while keeping the code fast enough for
  # the tests' timing. GCC's -Og reports uninitialised values it cannot
  # rule out where -O2 can; the normal build above checks that warning.
  # One process per gtest suite, not per test (cmake/GTestSuites.cmake):
  # an instrumented binary spends ~0.4 s of CPU starting, and most suites
  # have several tests. The generated protobuf code, compiled without the
  # sanitizers there anyway, is the normal build's (CKPT_PROTO_PREBUILT,
  # cmake/ProtoLibrary.cmake): ~14% of this build's CPU.
  mkdir -p build-asan
  # Its own process group, stopped with this script however it ends.
  BUILD_DIR=build-asan setsid nice -n 10 scripts/build.sh -DCKPT_SANITIZE=ON -DCKPT_WITH_CUDA=OFF \
    -DCKPT_WERROR=ON "-DCKPT_SKIP=bench;python" -DCKPT_UNIT_TESTS=ON -DCKPT_SYSTEM_TESTS=OFF -DCKPT_SLOW_TESTS=OFF \
    -DCKPT_TEST_PER_SUITE=ON -DCKPT_PROTO_PREBUILT="$PWD/build" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-Og -g1 -DNDEBUG -Wno-maybe-uninitialized" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-Og -g1 -DNDEBUG -Wno-maybe-uninitialized" \
    >build-asan/build.log 2>&1 &
  asan_pid=$!
  trap 'kill -- -"$asan_pid" 2>/dev/null || true' EXIT
fi

# Two at a time: the multi-node tests one at a time beside the rest (their
# RESOURCE_LOCK in tests/CMakeLists.txt), those marked RUN_SERIAL (etcd
# failovers, object-store node losses, the GPT recovery) alone.
(cd build && ctest --output-on-failure -j2 --timeout 600)

if [[ $sanitizers == 0 ]]; then
  check_thread_safety
  exit
fi
if ! wait "$asan_pid"; then
  tail -n 80 build-asan/build.log
  echo "test.sh: the sanitizer build failed (build-asan/build.log)" >&2
  exit 1
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
# Three at a time on two cores: a sanitizer test keeps its core busy ~70%
# of its time (user+sys against the CI run's wall time, for the tests of
# health_test and ckptrun_test), the rest waiting on its ckptd and its
# children, so a third fills what two leave idle. (Its build has no slow
# or system test; the labels only make sure.)
asan_rc=0
(cd build-asan && ctest --output-on-failure -j3 --timeout 900 -LE 'slow|system') || asan_rc=$?
tsa_rc=0
check_thread_safety || tsa_rc=$?
((asan_rc == 0)) || echo "test.sh: the sanitizer suite failed" >&2
((asan_rc == 0 && tsa_rc == 0))
