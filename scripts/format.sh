#!/usr/bin/env bash
# Formats every C/C++/CUDA file of the tree with clang-format (.clang-format:
# Google style). --check changes nothing and fails, naming the files, when
# one is not formatted (scripts/test.sh runs it first).
set -euo pipefail
cd "$(dirname "$0")/.."
# Tracked files and new ones not yet added (not the ignored build trees):
# a new file is checked before its first commit, not after it.
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h' '*.cu' '*.c')
if [[ ${1:-} == --check ]]; then
  if ! out=$(clang-format --dry-run --Werror "${files[@]}" 2>&1); then
    echo "format: not clang-formatted (run scripts/format.sh):" >&2
    grep -o '^[^:]*\.\(cc\|h\|cu\|c\):' <<<"$out" | sort -u | sed 's/:$//; s/^/  /' >&2
    exit 1
  fi
else
  clang-format -i "${files[@]}"
fi
