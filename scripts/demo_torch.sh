#!/usr/bin/env bash
# The end-to-end demo with a PyTorch job: scripts/demo.sh's 3-node cluster
# (coordinator; nodes a and b with 2 ranks each; spare c) running
# examples/train_gpt.py, a small GPT trained data-parallel over gloo and
# checkpointed with ckpt.torch (save_async overlapped with the next step).
# One trainer is SIGKILLed, then node b dies whole; the job resumes from
# shared memory / the shared root and must end bit-identical to an
# undisturbed run (exit 1 otherwise). train_gpt.py runs under
# ckpt.torch.resilient: the surviving ranks restart in their process (the
# report says per failure "survivors kept their process: K of N" beside
# the kill -> first step time) and only the killed ones start anew. STEPS (default 60), KEEP, BUILD_DIR as
# for scripts/demo.sh; DEVICE=cuda trains on CUDA tensors (every rank on
# cuda:$LOCAL_RANK), PYTHON another interpreter with torch (default
# Debian's /usr/bin/python3 with python3-torch), WARM (default 1) the
# warm processes per node.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import torch' 2>/dev/null ||
  { echo "demo_torch: $python has no torch (scripts/install-deps.sh)" >&2; exit 2; }
# The package from this tree even before scripts/install-python.sh ran.
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
# A rank started anew would wait seconds for `import torch`: one warm
# process per node (ckptrun --warm) takes it instead (WARM=0: none; WARM=2
# gives spare c one for each rank of a lost node).
STEPS=${STEPS:-60} WARM=${WARM:-1} TRAINER=torch exec scripts/demo.sh
