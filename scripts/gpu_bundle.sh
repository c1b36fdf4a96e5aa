#!/usr/bin/env bash
# Packs what scripts/gpu_checks.sh runs into one archive, for a GPU machine
# that has the NVIDIA driver, CUDA and torch but none of our Debian
# libraries: the stripped binaries of a CUDA build (BUILD_DIR, default
# build) at their places under build/, and every shared library they need
# except glibc, the C++ runtime and CUDA's own (the GPU machine's are used).
#   scripts/gpu_bundle.sh OUT_DIR      -> OUT_DIR/gpu-bundle.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_bundle.sh OUT_DIR}
build=${BUILD_DIR:-build}
bins=(daemon/ckptd coordinator/ckpt-coordinator tools/ckptrun tools/ckptctl
      client/libckpt.so tests/cuda_test worker/worker_optim_test
      bench/ckpt_optim_bench bench/ckpt_cuda_bench)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build" "$stage/lib"
for b in "${bins[@]}"; do
  [[ -e $build/$b ]] || { echo "gpu_bundle: $build/$b is not built" >&2; exit 2; }
  mkdir -p "$stage/build/$(dirname "$b")"
  objcopy --strip-debug "$build/$b" "$stage/build/$b"
  ldd "$build/$b" | awk '/=> \//{print $3}' >>"$stage/libs.txt"
done
sort -u "$stage/libs.txt" | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*|ld-linux*) ;;
    libgcc_s.so*|libstdc++.so*) ;;
    libcuda.so*|libcudart.so*|libcublas*.so*|libnvidia*) ;;
    *) objcopy --strip-debug "$lib" "$stage/lib/$(basename "$lib")" ;;
  esac
done
mkdir -p "$out"
# gzip, not xz: xz took over ten minutes on a busy 2-core machine.
tar -C "$stage" -czf "$out/gpu-bundle.tar.gz" build lib
ls -la "$out/gpu-bundle.tar.gz"
