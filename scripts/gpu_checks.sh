#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, in one run (doc/gpu.md): the CUDA
# tests (C++ and Python), compute-sanitizer memcheck and racecheck on the
# client's CUDA copies and the CUDA Adam, ckpt_cuda_bench (save/restore vs
# cudaMemcpy, the training-step overlap), ckpt_optim_bench --cuda (CUDA Adam,
# hybrid step), bench/py_cuda_bench.py (vs dcp.async_save) and
# scripts/demo_torch.sh on CUDA tensors. Each step's output goes to
# OUT_DIR/<step>.log and a summary line to OUT_DIR/summary.txt; a failed
# step does not stop the others; the exit status is 1 if any failed.
#   scripts/gpu_checks.sh OUT_DIR [BUNDLE]
# BUNDLE (from scripts/gpu_bundle.sh) is unpacked over the tree first, on a
# machine without our Debian libraries. STEPS selects steps by name
# (default: all). PYTHON: an interpreter with torch (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_checks.sh OUT_DIR [BUNDLE]}
mkdir -p "$out"
py=${PYTHON:-python3}
if [[ -n ${2:-} ]]; then
  "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(".")' "$2" || exit 2
  # CUDA's libraries (cuBLAS for the bench) from the toolkit, else torch's wheels.
  wheels=$("$py" -c 'import glob, site
print(":".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/**/lib", recursive=True)))' 2>/dev/null)
  export LD_LIBRARY_PATH="$PWD/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}${wheels:+:$wheels}"
  # The test binaries name the daemon by the build tree's absolute path;
  # CKPTD_BINARY (tests/harness.cc) points them at the bundle's.
  export CKPTD_BINARY="$PWD/build/daemon/ckptd"
fi
b=build
summary=$out/summary.txt
: >"$summary"
failed=0
deadline=${DEADLINE_S:-100000}  # no step starts, nor runs, past it
run() {  # run NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  [[ -z ${STEPS:-} || " $STEPS " == *" $name "* ]] || return 0
  ((limit > deadline - SECONDS)) && limit=$((deadline - SECONDS))
  if ((limit < 5)); then
    echo "$name: skipped (deadline)" | tee -a "$summary"
    failed=1
    return 0
  fi
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  ((rc == 0)) || failed=1
  echo "$name: rc=$rc $((SECONDS - t0))s" | tee -a "$summary"
}

run env 30 bash -c "nvidia-smi; df -h /dev/shm /var/tmp .; free -g; nproc;
  $py -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))';
  for f in $b/*/*; do [[ -x \$f && -f \$f ]] && ldd \$f | grep 'not found' | sed \"s|^|\$f: |\"; done; true"
# ckptd's node health checks on a GPU machine: the cuda check enumerates the
# devices and times a pinned H2D/D2H copy through the dlopen'd runtime; it
# must pass, not skip.
health_check() {
  local d rc
  d=$(mktemp -d /var/tmp/ckpt-health.XXXXXX)
  "$b/daemon/ckptd" --health-check --json --root "$d" --capacity 8 \
    --health-shm-mib-per-rank 1024 >"$out/health.json"
  rc=$?
  rm -rf "$d"
  cat "$out/health.json"
  ((rc == 0)) || return $rc
  grep -q '"name":"cuda","passed":true,"skipped":false' "$out/health.json" ||
    { echo "the cuda check did not run and pass"; return 7; }
}
export -f health_check
export b out
run health 60 bash -c health_check
run cuda_test 240 $b/tests/cuda_test
run cuda_adam 60 $b/worker/worker_optim_test --gtest_filter='*Cuda*'
# A root in memory when /dev/shm has room for it besides the arenas.
bench_root=/var/tmp
(($(df --output=avail -BG /dev/shm | tail -1 | tr -dc 0-9) >= 100)) && bench_root=/dev/shm
run cuda_bench 200 bash -c "$b/bench/ckpt_cuda_bench --json --root $bench_root ${CUDA_BENCH_ARGS:-} >$out/cuda_bench.json"
run optim_bench 120 bash -c "$b/bench/ckpt_optim_bench --cuda --skip-step-bench --json >$out/optim_bench.json"
pyenv=(env CKPT_LIB="$PWD/$b/client/libckpt.so" CKPTD_BINARY="$PWD/$b/daemon/ckptd"
       PYTHONPATH="$PWD/python" PYTHONDONTWRITEBYTECODE=1)
run python_tests 240 bash -c "cd python && ${pyenv[*]} $py -m unittest -v tests.test_checkpointer tests.test_dcp"
run py_cuda_bench 180 bash -c "${pyenv[*]} $py bench/py_cuda_bench.py --json >$out/py_cuda_bench.json"
run demo_torch 300 env CKPT_LIB="$PWD/$b/client/libckpt.so" DEVICE=cuda PYTHON="$(command -v "$py")" STEPS=${DEMO_STEPS:-40} scripts/demo_torch.sh
san=(compute-sanitizer --target-processes application-only --error-exitcode 9)
run memcheck_client 240 "${san[@]}" --tool memcheck $b/tests/cuda_test \
  --gtest_filter='*RoundTrip*:*Checksums*'
run racecheck_client 240 "${san[@]}" --tool racecheck $b/tests/cuda_test \
  --gtest_filter='*RoundTrip*'
run memcheck_adam 120 "${san[@]}" --tool memcheck $b/worker/worker_optim_test --gtest_filter='*Cuda*'
run racecheck_adam 120 "${san[@]}" --tool racecheck $b/worker/worker_optim_test --gtest_filter='*Cuda*'
exit $failed
