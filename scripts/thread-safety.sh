#!/usr/bin/env bash
# Checks the lock contracts written as ABSL_GUARDED_BY / ABSL_*_LOCKS_REQUIRED
# with clang's -Wthread-safety: a syntax-only pass (nothing is generated) over
# the daemon's and the coordinator's units, with the flags the build gave
# them. Run after scripts/build.sh (BUILD_DIR, default build/); fails naming
# each broken contract.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(cd "${BUILD_DIR:-build}" && pwd)
root=$(pwd)
cmds=$(mktemp)
trap 'rm -f "$cmds"' EXIT
# The build's own compile lines (unity batches under the build directory, and
# the files compiled alone from the source tree: the option parsers and
# ckptd's main), compiler and outputs swapped for clang's syntax-only
# analysis, without gcc's PCH (each file includes what it uses). Generated
# protobuf units have no locks of ours.
ninja -C "$dir" -t commands |
  grep -E " -c ($dir|$root)/(daemon|coordinator)/" | grep -v '\.pb\.cc$' | sort -u |
  sed -E -e 's#^(ccache )?[^ ]*(c\+\+|g\+\+)[^ ]* #clang++ -fsyntax-only #' \
    -e 's# -(o|MF|MT|include) [^ ]+##g' -e ':a' -e 's# -(MD|Winvalid-pch|Werror|Wall|Wextra|Wno-[a-z-]+) # #' -e 'ta' \
    -e 's#$# -Wno-everything -Wthread-safety -Werror#' -e 's#^#cd '"$dir"' \&\& #' >"$cmds"
n=$(wc -l <"$cmds")
[[ $n -gt 0 ]] || { echo "thread-safety: no units found in $dir (build first)" >&2; exit 1; }
tr '\n' '\0' <"$cmds" | xargs -0 -P"$(nproc)" -I{} bash -c '{}'
echo "thread-safety: $n units of daemon/ and coordinator/ checked"
