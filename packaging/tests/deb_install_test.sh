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
# find_package(ckpt) (consumer/), compiled in the root outside any source
# tree, save and restore a step bit-exact through that ckptd; a `pip
# install` of python/ into a virtual environment loads the installed
# libckpt.so.1; and `apt-get purge` removes the state directories. The
# root gets the compilers, cmake, pkg-config, libabsl-dev and python3-venv
# from the mirror as the .deb's dependencies come (apt, cached with them).
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
trap 'rm -rf "$root"' EXIT
tar -C "$root" -xf "$root_tar"
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp "$deb" "$root/tmp/"
# The dependencies apt downloaded last time (it checks them against the lists).
mkdir -p "$cache/archives"
cp "$cache/archives/"*.deb "$root/var/cache/apt/archives/" 2>/dev/null || true
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C "$@"; }
fail() { echo "FAIL: $*"; exit 1; }

in_root apt-get install -y -q --no-install-recommends "/tmp/$(basename "$deb")" >"$root/../$(basename "$root").apt.log" 2>&1 ||
  { cat "$root/../$(basename "$root").apt.log"; rm -f "$root/../$(basename "$root").apt.log"; fail "apt-get install"; }
rm -f "$root/../$(basename "$root").apt.log"
echo "installed in a clean bookworm root after $((SECONDS - start)) s"
cp "$root/var/cache/apt/archives/"*.deb "$cache/archives/" 2>/dev/null || true

got="$(in_root ckptd --version)"
[[ "$got" == "ckptd $version" ]] || fail "ckptd --version said '$got'"
for bin in ckpt-coordinator ckptctl ckptrun; do
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
[[ -f "$root/lib/systemd/system/ckptd.service" && -f "$root/lib/systemd/system/ckpt-coordinator.service" ]] || fail "units"
in_root dpkg-query -W -f='${Conffiles}\n' ckptd | grep -q "/etc/ckptd.toml" || fail "/etc/ckptd.toml is not a conffile"
[[ -f "$root/usr/share/doc/ckptd/help/ckptd.txt" ]] || fail "no --help texts"
# The Python package: importable from Debian's python3 with no environment
# (libckpt.so is loaded on first use; on a GPU build it needs the CUDA runtime).
in_root python3 -c "import ckpt; assert ckpt.__file__.startswith('/usr/lib/python3/dist-packages/')" \
  || fail "python3 -c 'import ckpt' in the installed root"

# The development files, as a trainer's build outside any tree meets them.
dev_start=$SECONDS
dev_tools=(gcc g++ libc6-dev make cmake pkg-config libabsl-dev python3-venv python3-wheel)
# The cached root's lists may name versions the mirror has since replaced:
# one `apt-get update` then.
in_root apt-get install -y -q --no-install-recommends "${dev_tools[@]}" >"$root/tmp/dev-apt.log" 2>&1 ||
  { in_root apt-get update -q >>"$root/tmp/dev-apt.log" 2>&1 &&
    in_root apt-get install -y -q --no-install-recommends "${dev_tools[@]}" >>"$root/tmp/dev-apt.log" 2>&1; } ||
  { cat "$root/tmp/dev-apt.log"; fail "apt-get install of the build tools"; }
cp "$root/var/cache/apt/archives/"*.deb "$cache/archives/" 2>/dev/null || true
here="$(cd "$(dirname "$0")" && pwd)"
cp -r "$here/consumer" "$root/tmp/consumer"
mkdir -p "$root/tmp/ckpt-python"
cp -r "$here/../../python/pyproject.toml" "$here/../../python/ckpt" "$root/tmp/ckpt-python/"
rm -rf "$root/tmp/ckpt-python/ckpt/_build_paths.py" "$root/tmp/ckpt-python/ckpt/__pycache__"
# A CUDA build's libckpt needs the CUDA runtime, which no Debian package
# provides (NVIDIA's repository does) and a GPU node has: the root gets the
# build host's copy, in /usr/local/lib (ld.so.conf).
cudart="$(ldd "$build/client/libckpt.so" | awk '/libcudart/ {print $3}')"
if [[ -n "$cudart" ]]; then
  cp -L "$cudart" "$root/usr/local/lib/" && in_root ldconfig || fail "copying $cudart into the root"
fi
[[ "$(readlink "$root/usr/lib/libckpt.so")" == libckpt.so.1 ]] || fail "/usr/lib/libckpt.so is no link to libckpt.so.1"
in_root sh -c 'cc -o /tmp/consumer_c /tmp/consumer/consumer.c $(pkg-config --cflags --libs ckpt)' ||
  fail "cc with pkg-config ckpt"
in_root sh -c 'cmake -S /tmp/consumer -B /tmp/cxx -DCMAKE_BUILD_TYPE=Release >/tmp/cxx.log 2>&1 &&
  cmake --build /tmp/cxx >>/tmp/cxx.log 2>&1' || { cat "$root/tmp/cxx.log"; fail "find_package(ckpt) build"; }
in_root /tmp/consumer_c | grep -q "libckpt ABI 1" || fail "consumer_c without a daemon"
# pip with no index: setuptools and Debian's wheel (seen through
# --system-site-packages) build the pure package.
in_root sh -c 'cd /tmp && python3 -m venv --system-site-packages /tmp/venv >/tmp/venv.log 2>&1 &&
  /tmp/venv/bin/pip install --no-index --no-build-isolation /tmp/ckpt-python >>/tmp/venv.log 2>&1' ||
  { cat "$root/tmp/venv.log"; fail "pip install of python/ into a venv"; }
got="$(in_root sh -c 'cd / && /tmp/venv/bin/python -c "import ckpt; print(ckpt.__file__, ckpt.lib_path())"')"
[[ "$got" == "/tmp/venv/lib/"*"/ckpt/__init__.py libckpt.so.1" ]] || fail "the venv's ckpt: '$got'"
echo "built a C and a C++ trainer against the package, pip-installed python/, in $((SECONDS - dev_start)) s"

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
