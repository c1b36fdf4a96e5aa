#!/usr/bin/env bash
# The development files as a trainer's build meets them: `cmake --install`
# of BUILD_DIR's libckpt component into a scratch prefix, then outside the
# tree a C program built with `pkg-config --cflags --libs ckpt` and a C++
# program built with CMake's find_package(ckpt) (consumer/), both run.
# Checks that libckpt.so has its SONAME and symlinks, that every symbol it
# exports is versioned and of the public API (ckpt_* or ckpt::), and that
# both programs record the SONAME; and that `pip install` of python/ into a
# virtual environment loads that library. Writes only into a scratch
# directory.
# Usage: dev_install_test.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "FAIL: $*"; exit 1; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
prefix="$scratch/prefix"

cmake --install "$build" --prefix "$prefix" --component libckpt >"$scratch/install.log" ||
  { cat "$scratch/install.log"; fail "cmake --install --component libckpt"; }
[[ -f "$prefix/include/ckpt/ckpt.h" && -f "$prefix/include/ckpt/client.h" ]] || fail "no include/ckpt/ headers"
lib="$(find "$prefix" -name libckpt.so -print -quit)"
[[ -n "$lib" && -L "$lib" ]] || fail "no libckpt.so symlink under $prefix"
libdir="$(dirname "$lib")"
soname="$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
[[ "$soname" == libckpt.so.1 ]] || fail "SONAME of libckpt.so is '$soname', not libckpt.so.1"
[[ -e "$libdir/$soname" ]] || fail "no $soname next to libckpt.so"

# Every defined dynamic symbol is versioned CKPT_1 and part of the API.
syms="$(readelf --dyn-syms -W "$lib" | awk '$1 ~ /^[0-9]+:$/ && $7 != "UND" && $8 ~ /@/ {print $8}')"
[[ -n "$syms" ]] || fail "libckpt.so exports no versioned symbol"
bad="$(readelf --dyn-syms -W "$lib" | awk '$1 ~ /^[0-9]+:$/ && $7 != "UND" && $5 != "LOCAL" && $8 != "" && $8 !~ /@@?CKPT_1$/ {print $8}')"
[[ -z "$bad" ]] || fail "unversioned exports: $(head -5 <<<"$bad")"
foreign="$(grep -v -E '^(ckpt_|_ZN4ckpt|_ZNK4ckpt|CKPT_1)' <<<"$syms" || true)"
[[ -z "$foreign" ]] || fail "exports outside the API: $(head -5 <<<"$foreign")"
grep -q '^ckpt_save@@CKPT_1$' <<<"$syms" || fail "ckpt_save is not exported as ckpt_save@@CKPT_1"
grep -q '^_ZN4ckpt6Client7Connect' <<<"$syms" || fail "ckpt::Client::Connect is not exported"

# C through pkg-config.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags="$(pkg-config --cflags --libs ckpt)" || fail "pkg-config ckpt"
cc -o "$scratch/consumer_c" "$here/consumer/consumer.c" $flags || fail "cc with '$flags'"
readelf -d "$scratch/consumer_c" | grep -q "NEEDED.*\[libckpt.so.1\]" || fail "consumer_c does not need libckpt.so.1"
LD_LIBRARY_PATH="$libdir" "$scratch/consumer_c" || fail "consumer_c"

# C++ through find_package(ckpt).
cmake -S "$here/consumer" -B "$scratch/cxx" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  >"$scratch/cxx.log" 2>&1 || { cat "$scratch/cxx.log"; fail "cmake find_package(ckpt)"; }
cmake --build "$scratch/cxx" >>"$scratch/cxx.log" 2>&1 || { cat "$scratch/cxx.log"; fail "build of consumer_cxx"; }
readelf -d "$scratch/cxx/consumer_cxx" | grep -q "NEEDED.*\[libckpt.so.1\]" || fail "consumer_cxx does not need libckpt.so.1"
"$scratch/cxx/consumer_cxx" || fail "consumer_cxx"
# Python: `pip install` of python/ into a virtual environment (no index:
# Debian's setuptools, seen through --system-site-packages, builds it)
# loads the installed library by its SONAME through the loader.
python=/usr/bin/python3
if "$python" -m pip --version >/dev/null 2>&1 && "$python" -c "import setuptools" 2>/dev/null; then
  # A copy: setuptools writes build/ and *.egg-info next to pyproject.toml.
  mkdir "$scratch/python"
  cp -r "$here/../../python/pyproject.toml" "$here/../../python/ckpt" "$scratch/python/"
  "$python" -m venv --without-pip --system-site-packages "$scratch/venv" || fail "python3 -m venv"
  "$python" -m pip --python "$scratch/venv/bin/python" install -q --no-index --no-build-isolation \
    "$scratch/python" >"$scratch/pip.log" 2>&1 || { cat "$scratch/pip.log"; fail "pip install of python/ into a venv"; }
  got="$(cd / && env -u CKPT_LIB -u PYTHONPATH LD_LIBRARY_PATH="$libdir" "$scratch/venv/bin/python" -c \
    'import ckpt; print(ckpt.__file__, ckpt.lib_path())')" || fail "the venv's ckpt loads no libckpt"
  [[ "$got" == "$scratch/venv/lib/"*"/ckpt/__init__.py $soname" ]] || fail "the venv's ckpt: '$got'"
else
  echo "no pip or setuptools for $python: the venv check is left out"
fi
echo "PASS: headers, SONAME $soname, versioned exports, pkg-config (C), find_package (C++), pip install"
