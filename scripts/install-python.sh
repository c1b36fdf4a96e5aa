#!/usr/bin/env bash
# Makes `import ckpt, ckpt.torch` work with no environment variables, for
# Debian's /usr/bin/python3 (which has python3-torch) and for the python3
# first on PATH when that is another interpreter (e.g. pyenv):
#  - a ckpt.pth naming this tree's python/ in each one's site directory
#    (Debian: /usr/local/lib/python3.X/dist-packages; other: its purelib);
#  - for another interpreter of the same X.Y as Debian's, a second .pth
#    naming /usr/lib/python3/dist-packages, appended after its own paths,
#    so `import ckpt.torch` finds Debian's torch there too.
# The package finds libckpt.so through ckpt/_build_paths.py, which the
# build writes (python/CMakeLists.txt). Idempotent; run by scripts/run.sh
# and scripts/test.sh after the build. PTH_DIRS (space-separated) replaces
# the site directories, for a dry run into a scratch directory.
set -euo pipefail
cd "$(dirname "$0")/.."
pkg="$PWD/python"
debian=/usr/bin/python3

write() {  # write DIR FILE LINE
  mkdir -p "$1"
  printf '%s\n' "$3" > "$1/$2.tmp"
  mv -f "$1/$2.tmp" "$1/$2"
  echo "install-python: $1/$2 -> $3"
}

if [[ -n "${PTH_DIRS:-}" ]]; then
  for d in $PTH_DIRS; do write "$d" ckpt.pth "$pkg"; done
  exit 0
fi

debian_ver=""
if [[ -x $debian ]]; then
  debian_ver=$($debian -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  site=$($debian -c 'import site; print(next(p for p in site.getsitepackages() if p.startswith("/usr/local/")))')
  write "$site" ckpt.pth "$pkg"
fi

other=$(command -v python3 || true)
if [[ -n $other && $(readlink -f "$other") != $(readlink -f $debian) ]]; then
  # pyenv's shim runs the real interpreter: ask it where it lives.
  real=$("$other" -c 'import sys; print(sys.executable)')
  if [[ $(readlink -f "$real") != $(readlink -f $debian) ]]; then
    purelib=$("$other" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    write "$purelib" ckpt.pth "$pkg"
    ver=$("$other" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ $ver == "$debian_ver" && -d /usr/lib/python3/dist-packages ]]; then
      write "$purelib" ckpt-debian-dist-packages.pth /usr/lib/python3/dist-packages
    fi
  fi
fi
