#!/usr/bin/env bash
# scripts/install-python.sh's .pth makes `import ckpt, ckpt.torch` work in a
# Python started with no site directories of its own and no environment
# (no PYTHONPATH, no CKPT_LIB): libckpt.so comes from the build tree
# (ckpt/_build_paths.py). Writes only into a scratch directory.
# Usage: install_test.sh PYTHON
set -euo pipefail
python=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
PTH_DIRS="$scratch" "$repo/scripts/install-python.sh"
grep -qx "$repo/python" "$scratch/ckpt.pth"
cd /
out=$(env -u PYTHONPATH -u CKPT_LIB "$python" -S -c '
import site, sys
site.addsitedir(sys.argv[1])
import ckpt
print(ckpt.lib_path())
try:
    import ckpt.torch
    print("torch", ckpt.torch.storable_dtypes() and "ok")
except ImportError as e:
    print("no torch:", e)
' "$scratch")
echo "$out"
grep -q "libckpt.so" <<<"$out"
