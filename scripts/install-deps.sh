#!/usr/bin/env bash
# Installs the Debian 12 packages ckptd builds against (run as root).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      liburing-dev libboost-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
      protobuf-compiler librocksdb-dev libgtest-dev libgmock-dev libxxhash-dev
      libcli11-dev libtomlplusplus-dev libabsl-dev libblas-dev libgloo-dev)
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
