#!/usr/bin/env bash
# Builds <BUILD_DIR>/ckptd_<version>_amd64.deb: the packaged binaries and
# their --help texts, then `cpack -G DEB` (which runs dpkg-shlibdeps for the
# Depends: line). Usage: scripts/package-deb.sh [BUILD_DIR] (default build/;
# a directory without build.ninja is configured as a Release build without
# tests).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DCKPT_SKIP=bench
fi
cmake --build "$build" -j2 --target ckptd ckpt-coordinator ckptctl ckptrun ckpt-worker ckpt_help_texts
(cd "$build" && cpack -G DEB)
ls "$build"/ckptd_*.deb
