#!/usr/bin/env bash
# The .deb in a clean Debian 12: builds ckptd_<version>_amd64.deb with
# `cpack -G DEB` in BUILD_DIR, unpacks a fresh minbase bookworm root
# (mmdebstrap; cached under BUILD_DIR/bookworm-root-cache after the first
# run), `apt-get install ./ckptd_*.deb` in a chroot (apt resolves the
# shared-library Depends), then checks there: `ckptd --version` prints the
# version, `ckptctl --help` works, the ckptd user/group and the state
# directories exist with their owners, /etc/ckptd.toml is a conffile, the
# installed ckptd serves `ckptctl status` with the installed config; a C
# program built with `pkg-config ckpt` and a C++ program built with CMake's
# find_package(ckpt) (consumer/) save and restore a step bit-exact through
# that ckptd; a `pip install` of python/ into a virtual environment loads
# the installed libckpt.so.1; and `apt-get purge` removes the state
# directories.
#
# The trainers and the virtual environment are built on this host, outside
# any source tree, against the package's own files (`dpkg-deb -x`: its
# headers, ckpt.pc, CMake package and libckpt.so), and only run in the
# root: the root then holds nothing but the package and what its Depends
# bring, and needs no compiler, cmake or pip from the mirror (those took
# ~250 s of a clean CI run). Every header the trainers' builds read must
# come from the package, the C/C++ toolchain's own headers or libabsl-dev
# (the package's suggested build dependency): the same headers a clean
# machine with those has.
# Usage: deb_install_test.sh BUILD_DIR VERSION. Exit 77 (skipped) when not
# root, without mmdebstrap, or when no Debian mirror can be reached.
set -euo pipefail
build="$(cd "$1" && pwd)" version="$2"
mirror="${CKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
skip() { echo "SKIP: $*"; exit 77; }
[[ "$(id -u)" == 0 ]] || skip "needs root (mmdebstrap, chroot)"
command -v mmdebstrap >/dev/null || skip "no mmdebstrap"
start=$SECONDS

(cd "$build" && cpack -G DEB >/dev/null)
deb="$build/ckptd_${version}_amd64.deb"
[[ -f "$deb" ]] || { echo "FAIL: cpack made no $deb"; exit 1; }
echo "built $(basename "$deb") in $((SECONDS - start)) s"

here="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "FAIL: $*"; exit 1; }
# Outside any source tree and outside the root.
scratch="$(mktemp -d)"
root=""
trap 'rm -rf "$scratch" ${root:+"$root"}' EXIT

# The development files, as a trainer's build outside any tree meets them:
# the package's files unpacked, found through them alone (PKG_CONFIG_LIBDIR
# and CMAKE_PREFIX_PATH name nothing else of ckpt). No build RPATH: the
# programs find libckpt.so.1 in the root as an installed trainer does.
dev_start=$SECONDS
pkg="$scratch/pkg"
dpkg-deb -x "$deb" "$pkg" || fail "dpkg-deb -x $deb"
[[ "$(readlink "$pkg/usr/lib/libckpt.so")" == libckpt.so.1 ]] || fail "/usr/lib/libckpt.so is no link to libckpt.so.1"
flags="$(PKG_CONFIG_LIBDIR="$pkg/usr/lib/pkgconfig" pkg-config --cflags --libs ckpt)" || fail "pkg-config ckpt"
for f in $flags; do
  case "$f" in
    -lckpt) ;;
    -I* | -L*) [[ "$(realpath -m "${f:2}")" == "$pkg/usr/"* ]] || fail "pkg-config ckpt names $f, outside the package" ;;
    *) fail "pkg-config ckpt said '$flags'" ;;
  esac
done
[[ " $flags " == *" -lckpt "* ]] || fail "pkg-config ckpt said '$flags'"
cc -o "$scratch/consumer_c" "$here/consumer/consumer.c" $flags -MD -MF "$scratch/consumer_c.d" ||
  fail "cc with pkg-config ckpt"
cmake -S "$here/consumer" -B "$scratch/cxx" -DCMAKE_PREFIX_PATH="$pkg/usr" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_SKIP_BUILD_RPATH=ON >"$scratch/cxx.log" 2>&1 && cmake --build "$scratch/cxx" >>"$scratch/cxx.log" 2>&1 ||
  { cat "$scratch/cxx.log"; fail "find_package(ckpt) build"; }
ckpt_dir="$(sed -n 's/^ckpt_DIR:PATH=//p' "$scratch/cxx/CMakeCache.txt")"
[[ "$ckpt_dir" == "$pkg/usr/lib/cmake/ckpt" ]] || fail "find_package(ckpt) found '$ckpt_dir', not the package's"
for prog in "$scratch/consumer_c" "$scratch/cxx/consumer_cxx"; do
  readelf -d "$prog" | grep -q "NEEDED.*\[libckpt.so.1\]" || fail "$(basename "$prog") does not need libckpt.so.1"
done
# Every header they read: the package's, or of the packages a clean machine
# needs to build them (the toolchain's libc, kernel and C++ headers, and
# libabsl-dev). A header of any other package fails, naming it.
mapfile -t headers < <(cat "$scratch/consumer_c.d" $(find "$scratch/cxx" -name '*.o.d') | tr ' ' '\n' |
  grep '^/' | grep -v ':$' | grep -v "^$here/consumer/" | xargs -r realpath -s | sort -u | grep -v "^$pkg/")
[[ ${#headers[@]} -gt 0 ]] || fail "the trainers' builds read no header outside the package"
owners="$(dpkg -S "${headers[@]}" 2>&1)" || fail "headers of no package: $(grep -i 'no path' <<<"$owners")"
allowed='^(libc6-dev|linux-libc-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|libabsl-dev)(:[a-z0-9]+)?$'
others="$(grep -v '^diversion' <<<"$owners" | while IFS= read -r line; do
  for o in $(tr ',' ' ' <<<"${line%%: /*}"); do [[ $o =~ $allowed ]] || echo "$o: ${line#*: }"; done
done)"
[[ -z "$others" ]] || fail "the trainers' builds read headers of other packages: $(head -5 <<<"$others")"
echo "built a C and a C++ trainer against the package's files (${#headers[@]} headers of the toolchain and" \
  "libabsl-dev besides) in $((SECONDS - dev_start)) s"

# A minbase root with fresh apt lists, kept as a tarball: later runs only
# unpack it. mmdebstrap rather than debootstrap: it builds the same root in
# half the time (38 s against 77 s here), which every clean CI run pays.
cache="$build/bookworm-root-cache"
mkdir -p "$cache"
root_tar="$cache/bookworm-minbase-root.tar"
if [[ ! -f "$root_tar" ]]; then
  mmdebstrap --variant=minbase --format=tar --skip=cleanup/apt/lists bookworm "$root_tar.tmp" "$mirror" \
    >"$cache/mmdebstrap.log" 2>&1 ||
    { rm -f "$root_tar.tmp"; skip "mmdebstrap cannot build a root from $mirror (see $cache/mmdebstrap.log)"; }
  mv "$root_tar.tmp" "$root_tar"
  echo "cached a minbase bookworm root in $((SECONDS - start)) s"
fi

root="$(mktemp -d "$build/deb-root.XXXXXX")"
tar -C "$root" -xf "$root_tar"
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp "$deb" "$root/tmp/"
# The dependencies apt downloaded last time (it checks them against the lists).
mkdir -p "$cache/archives"
cp "$cache/archives/"*.deb "$root/var/cache/apt/archives/" 2>/dev/null || true
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C "$@"; }

in_root apt-get install -y -q --no-install-recommends "/tmp/$(basename "$deb")" >"$root/../$(basename "$root").apt.log" 2>&1 ||
  { cat "$root/../$(basename "$root").apt.log"; rm -f "$root/../$(basename "$root").apt.log"; fail "apt-get install"; }
rm -f "$root/../$(basename "$root").apt.log"
echo "installed in a clean bookworm root after $((SECONDS - start)) s"
cp "$root/var/cache/apt/archives/"*.deb "$cache/archives/" 2>/dev/null || true

got="$(in_root ckptd --version)"
[[ "$got" == "ckptd $version" ]] || fail "ckptd --version said '$got'"
for bin in ckpt-coordinator ckpt-relay ckptctl ckptrun; do
  [[ "$(in_root "$bin" --version)" == "$bin $version" ]] || fail "$bin --version"
done
# Captured whole first: `grep -q` stops reading at its match, and a help
# text longer than one stdio buffer then dies of SIGPIPE (pipefail).
help=$(in_root ckptctl --help) || fail "ckptctl --help"
grep -q "inspect and manage ckptd checkpoints" <<<"$help" || fail "ckptctl --help"
help=$(in_root ckptd --help) || fail "ckptd --help"
grep -q -- "--socket" <<<"$help" || fail "ckptd --help"
in_root getent group ckptd >/dev/null || fail "no ckptd group"
in_root getent passwd ckptd | grep -q ":/usr/sbin/nologin$" || fail "no ckptd system user"
[[ "$(stat -c %U:%a "$root/var/lib/ckptd")" == root:755 ]] || fail "/var/lib/ckptd: $(stat -c %U:%a "$root/var/lib/ckptd")"
[[ "$(in_root stat -c %U:%G:%a /var/lib/ckpt-coordinator)" == ckptd:ckptd:750 ]] || fail "/var/lib/ckpt-coordinator"
for unit in ckptd ckpt-coordinator ckpt-relay; do
  [[ -f "$root/lib/systemd/system/$unit.service" ]] || fail "no $unit.service"
done
in_root dpkg-query -W -f='${Conffiles}\n' ckptd | grep -q "/etc/default/ckpt-relay" || fail "/etc/default/ckpt-relay is not a conffile"
in_root dpkg-query -W -f='${Conffiles}\n' ckptd | grep -q "/etc/ckptd.toml" || fail "/etc/ckptd.toml is not a conffile"
[[ -f "$root/usr/share/doc/ckptd/help/ckptd.txt" ]] || fail "no --help texts"
# The Python package: importable from Debian's python3 with no environment
# (libckpt.so is loaded on first use; on a GPU build it needs the CUDA runtime).
in_root python3 -c "import ckpt; assert ckpt.__file__.startswith('/usr/lib/python3/dist-packages/')" \
  || fail "python3 -c 'import ckpt' in the installed root"

# The trainers built above, in the root (no toolchain there), loading the
# package's libckpt.so.1.
mkdir -p "$root/tmp/cxx"
cp "$scratch/consumer_c" "$root/tmp/consumer_c"
cp "$scratch/cxx/consumer_cxx" "$root/tmp/cxx/consumer_cxx"
# A CUDA build's libckpt needs the CUDA runtime, which no Debian package
# provides (NVIDIA's repository does) and a GPU node has: the root gets the
# build host's copy, in /usr/local/lib (ld.so.conf).
cudart="$(ldd "$build/client/libckpt.so" | awk '/libcudart/ {print $3}')"
if [[ -n "$cudart" ]]; then
  cp -L "$cudart" "$root/usr/local/lib/" && in_root ldconfig || fail "copying $cudart into the root"
fi
installed="$(in_root readlink -f /usr/lib/libckpt.so.1)"
for prog in /tmp/consumer_c /tmp/cxx/consumer_cxx; do
  loaded="$(in_root ldd "$prog" | awk '$1 == "libckpt.so.1" {print $3}')"
  [[ -n "$loaded" && "$(in_root readlink -f "$loaded")" == "$installed" ]] ||
    fail "$prog loads '$loaded', not the package's /usr/lib/libckpt.so.1"
done
in_root /tmp/consumer_c | grep -q "libckpt ABI 1" || fail "consumer_c without a daemon"
# A `pip install` of python/ into a virtual environment at the root's
# /tmp/venv, made by this host's python3 (the same Debian 12 interpreter as
# the root's: the venv's python is a link to /usr/bin/python3) with no index:
# setuptools and Debian's wheel, seen through --system-site-packages, build
# the pure package. Run in the root, it loads the installed libckpt.so.1.
mkdir -p "$scratch/ckpt-python"
cp -r "$here/../../python/pyproject.toml" "$here/../../python/ckpt" "$scratch/ckpt-python/"
rm -rf "$scratch/ckpt-python/ckpt/_build_paths.py" "$scratch/ckpt-python/ckpt/__pycache__"
/usr/bin/python3 -m venv --without-pip --system-site-packages "$root/tmp/venv" >"$scratch/venv.log" 2>&1 &&
  (cd "$scratch" && /usr/bin/python3 -m pip --python "$root/tmp/venv/bin/python" install --no-index \
    --no-build-isolation "$scratch/ckpt-python" >>"$scratch/venv.log" 2>&1) ||
  { cat "$scratch/venv.log"; fail "pip install of python/ into a venv (needs python3-pip, python3-setuptools, python3-venv, python3-wheel)"; }
got="$(in_root sh -c 'cd / && /tmp/venv/bin/python -c "import ckpt; print(ckpt.__file__, ckpt.lib_path())"')"
[[ "$got" == "/tmp/venv/lib/"*"/ckpt/__init__.py libckpt.so.1" ]] || fail "the venv's ckpt: '$got'"
echo "the trainers and a pip-installed python/ load the installed libckpt.so.1"

# The installed ckptd serves with the installed configuration: started as
# the unit would start it (in a private mount namespace with its own
# /dev/shm and /proc, gone when it exits), asked for its status by ckptctl,
# stopped with SIGTERM.
unshare --mount --propagation private sh -c '
  mount -t tmpfs tmpfs "$1/dev/shm" && mount -t proc proc "$1/proc" &&
  chroot "$1" env -i PATH=/usr/bin:/bin sh -c "
    mkdir -p /run/ckptd
    ckptd --socket /run/ckptd/ckptd.sock --root /var/lib/ckptd --config /etc/ckptd.toml 2>/tmp/ckptd.log &
    pid=\$!
    ok=1
    for i in \$(seq 100); do
      if ckptctl --socket /run/ckptd/ckptd.sock status >/tmp/status.out 2>&1; then ok=0; break; fi
      sleep 0.1
    done
    if [ \$ok = 0 ]; then
      /tmp/consumer_c /run/ckptd/ckptd.sock trainer-c >/tmp/consumers.out 2>&1 &&
        /tmp/cxx/consumer_cxx /run/ckptd/ckptd.sock trainer-cxx >>/tmp/consumers.out 2>&1 || ok=2
    fi
    kill -TERM \$pid; wait \$pid || ok=1
    exit \$ok"' sh "$root" || { cat "$root/tmp/ckptd.log" "$root/tmp/status.out" "$root/tmp/consumers.out" 2>/dev/null;
  fail "the installed ckptd did not serve ckptctl status and both trainers"; }
cat "$root/tmp/consumers.out"
echo "the installed ckptd served 'ckptctl status', the C and C++ trainers' round trips, and stopped on SIGTERM"

in_root apt-get purge -y -q ckptd >/dev/null 2>&1 || fail "apt-get purge"
[[ ! -e "$root/var/lib/ckptd" && ! -e "$root/var/lib/ckpt-coordinator" && ! -e "$root/etc/ckptd.toml" ]] ||
  fail "purge left state or configuration behind"
echo "PASS: install, --version, --help, account, directories, purge in $((SECONDS - start)) s"
