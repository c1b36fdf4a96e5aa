#!/usr/bin/env bash
# Installs the Debian 12 packages ckptd builds against and its tests and
# demos run with (run as root). `--build` installs only what configuring the
# tree and building ckptd and the benchmarks needs (scripts/run.sh: the
# benchmark's first figures come before torch, etcd, etcd's protos for
# ckpt-coordinator and the test servers are downloaded).
set -euo pipefail
case "${1:-}" in
  "" | --build) ;;
  *) echo "usage: scripts/install-deps.sh [--build]: unknown argument '$1'" >&2; exit 2 ;;
esac
# What CMake's configure requires, and the compilers.
pkgs=(build-essential cmake ninja-build pkg-config
      # the linker (cmake/Linker.cmake): links ~3x faster than GNU ld here
      lld
      liburing-dev libboost-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
      protobuf-compiler librocksdb-dev libgtest-dev libgmock-dev libxxhash-dev
      libcli11-dev libtomlplusplus-dev libabsl-dev libblas-dev libgloo-dev
      # POSIX ACLs on arena segments (shm/segment_access.cc)
      libacl1-dev
      # object tier (libcurl SigV4)
      libcurl4-openssl-dev
      # operations: metrics, systemd notify
      prometheus-cpp-dev libsystemd-dev)
if [[ "${1:-}" != --build ]]; then
  pkgs+=(# ckpt-coordinator's HA on etcd: etcd's own .proto files (with 132
         # Go source packages, ~400 MB: ckptd and the benchmarks build
         # without them)
         golang-etcd-server-dev
         clang-format
         # scripts/thread-safety.sh: clang's -Wthread-safety over the lock contracts
         clang
         # scripts/test.sh: setsid for the background sanitizer build
         util-linux
         # a hung trainer's native stacks (eu-stack; ckptrun falls back to gdb)
         elfutils
         # Python package and its tests (Debian's python3 + torch 1.13)
         python3 python3-cffi python3-torch python3-yaml
         # the dev-files and .deb tests' pip install of python/ into a venv
         python3-pip python3-setuptools python3-venv python3-wheel
         # the object tier's interop tests
         awscli python3-boto3
         # coordinator HA tests: a real etcd and etcdctl
         etcd-server etcd-client
         # operations tests: real Prometheus, .deb install test, TLS
         # certificates (systemd: systemd-analyze for the unit checks)
         prometheus mmdebstrap openssl systemd)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[[ "${1:-}" == --build ]] && exit 0

# The object-storage tests' S3 server (s3rver, pinned in tests/s3/package-lock.json),
# installed into the project (tests/s3/node_modules, git-ignored). Needs Node + npm:
# Debian's nodejs + npm when the machine has no npm (a Node.js from elsewhere,
# e.g. NodeSource's, brings its own npm and is kept).
if ! command -v npm >/dev/null; then
  echo "installing: nodejs npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nodejs npm >/dev/null
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
npm ci --prefix "$repo/tests/s3" --no-audit --no-fund >/dev/null
