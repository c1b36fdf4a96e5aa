#!/usr/bin/env bash
# Installs what is needed, builds, and runs every test: the normal build,
# then the same tests built with AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# Every C/C++/CUDA file is clang-formatted (Google style); fails naming the files.
scripts/format.sh --check
# Warnings are errors here (CKPT_WERROR): the tree builds with zero.
scripts/build.sh -DCKPT_WERROR=ON
scripts/install-python.sh
# Two at a time (the multi-node tests one at a time beside the rest: their
# RESOURCE_LOCK in tests/CMakeLists.txt), then the tests labelled "slow"
# (external servers, Python, packaging), also two at a time but for those
# marked RUN_SERIAL (etcd failovers, object-store node losses, the GPT
# recovery), which run alone.
(cd build && ctest --output-on-failure -j2 --timeout 600 -LE slow)
(cd build && ctest --output-on-failure -j2 --timeout 600 -L slow)
if [[ "${CKPT_SKIP_SANITIZERS:-0}" != 1 ]]; then
  # CUDA, the benchmarks, the Python module and the binaries of slow tests
  # (run once above, not here) add nothing to a sanitizer run.
  BUILD_DIR=build-asan scripts/build.sh -DCKPT_SANITIZE=ON -DCKPT_WITH_CUDA=OFF -DCKPT_WERROR=ON \
    "-DCKPT_SKIP=bench;python" -DCKPT_SLOW_TESTS=OFF
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  # The tests labelled "slow" ran once above; the sanitizer build runs the rest.
  (cd build-asan && ctest --output-on-failure -j2 --timeout 900 -LE slow)
fi
