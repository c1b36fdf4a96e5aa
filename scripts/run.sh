#!/usr/bin/env bash
# The main job: installs what is needed, builds, then runs ckpt_bench, which
# starts a ckptd, saves and restores a multi-GiB state through libckpt and
# prints what happened and how fast, next to the machine's limits measured
# in the same run. Then ckptctl verifies every checkpoint it left behind.
# BYTES (default 2 GiB) and TENSORS (default 64) size the state.
# Last, scripts/demo.sh: a 4-rank training job on a simulated 3-node cluster
# survives a killed trainer and a killed node and ends bit-identical to an
# undisturbed run; then scripts/demo_torch.sh, the same with a PyTorch job.
set -euo pipefail
cd "$(dirname "$0")/.."
# What building needs first; torch, etcd and the test servers (most of
# apt's time on a fresh machine) after the benchmark, for the demos.
scripts/install-deps.sh --build
# Only what this job runs, the benchmark's first (the first figures come
# sooner; ckpt_bench prints each as it measures it), then ckptctl and the
# demo's binaries; the test binaries are scripts/test.sh's.
TARGETS="ckpt_bench ckptd" scripts/build.sh
work=$(mktemp -d /var/tmp/ckptd-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
build/bench/ckpt_bench --bytes "${BYTES:-2147483648}" --tensors "${TENSORS:-64}" \
  --root "$work" --keep
TARGETS="ckptctl" scripts/build.sh
root=$(find "$work" -mindepth 2 -maxdepth 2 -type d -name ckptd | head -n1)
echo
echo "== ckptctl verify --root $root"
build/tools/ckptctl verify --root "$root"
rm -rf "$work"  # the demo needs no multi-GiB leftovers
scripts/install-deps.sh
TARGETS="ckpt-coordinator ckptrun ckpt-worker ckpt_python" scripts/build.sh
# `import ckpt, ckpt.torch` for Debian's python3 and the one on PATH.
scripts/install-python.sh
echo
echo "== scripts/demo.sh"
scripts/demo.sh
echo
echo "== scripts/demo_torch.sh (the same cluster and failures, a PyTorch job: examples/train_gpt.py)"
scripts/demo_torch.sh
