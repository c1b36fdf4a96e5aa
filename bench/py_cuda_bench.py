#!/usr/bin/env python3
"""py_cuda_bench: ckpt.torch on a CUDA state_dict against
torch.distributed.checkpoint.async_save (its default stager) on the same
state_dict, and both against torch's own device -> pinned copy, in one run.

  ckpt_stall_s      Checkpointer.save_async call -> return
  ckpt_copied_s     call -> wait_copied() (the tensors may change again)
  ckpt_durable_s    call -> wait_durable() (the shard is on disk)
  dcp_stall_s       dcp.async_save call -> return (its stager copies the
                    state to host memory before returning)
  dcp_durable_s     call -> the returned future's result() (files written)
  d2h_pinned_s      the limit: every tensor copied into preallocated pinned
                    host tensors (non_blocking, then one synchronize)
  load_shm_s        in-place Checkpointer.load into the CUDA tensors from
                    shared memory; vs h2d_pinned_s, the pinned -> device copy

Medians over --iters rounds, each round measuring every figure in turn. It
starts its own ckptd (--ckptd, default build/daemon/ckptd of this tree).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import ckpt.torch  # noqa: E402
from tests.ckptd_process import CkptdProcess  # noqa: E402


def make_state(total_bytes, count):
    per = max(1, total_bytes // count // 4)
    g = torch.Generator(device="cuda").manual_seed(1)
    return {"model": {"t%03d" % i: torch.rand((per,), device="cuda", generator=g)
                      for i in range(count)}}


def run(args):
    state = make_state(args.bytes, args.tensors)
    tensors = list(state["model"].values())
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    workdir = tempfile.mkdtemp(prefix="py_cuda_bench.", dir=args.root)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    dist.init_process_group("gloo", rank=0, world_size=1)
    daemon = CkptdProcess(os.path.join(workdir, "d"), binary=args.ckptd,
                          extra_args=("--retain", "1"))
    daemon.start()
    figs = {k: [] for k in ("ckpt_stall_s", "ckpt_copied_s", "ckpt_durable_s",
                            "dcp_stall_s", "dcp_durable_s", "d2h_pinned_s",
                            "load_shm_s", "h2d_pinned_s")}
    r = {"bytes": nbytes, "tensors": args.tensors, "iters": args.iters,
         "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    try:
        c = ckpt.torch.Checkpointer(job="py_cuda_bench", socket=daemon.socket,
                                    rank=0, world_size=1)
        t0 = time.perf_counter()
        c.save(1, state)
        r["first_save_s"] = time.perf_counter() - t0
        c.wait_durable(1)
        step = 1
        for i in range(args.iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for src, dst in zip(tensors, pinned):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            figs["d2h_pinned_s"].append(time.perf_counter() - t0)

            step += 1
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            h = c.save_async(step, state)
            figs["ckpt_stall_s"].append(time.perf_counter() - t0)
            h.wait_copied()
            figs["ckpt_copied_s"].append(time.perf_counter() - t0)
            h.wait()
            c.wait_durable(step)
            figs["ckpt_durable_s"].append(time.perf_counter() - t0)

            path = os.path.join(workdir, "dcp", str(i))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fut = dcp.async_save(state, checkpoint_id=path)
            figs["dcp_stall_s"].append(time.perf_counter() - t0)
            fut.result()
            figs["dcp_durable_s"].append(time.perf_counter() - t0)
            shutil.rmtree(path, ignore_errors=True)

            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for src, dst in zip(pinned, tensors):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            figs["h2d_pinned_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            c.load(step, state)
            torch.cuda.synchronize()
            figs["load_shm_s"].append(time.perf_counter() - t0)
        want = make_state(args.bytes, args.tensors)
        r["load_matches"] = all(torch.equal(state["model"][k], want["model"][k])
                                for k in want["model"])
        c.close()
    finally:
        daemon.stop()
        dist.destroy_process_group()
        shutil.rmtree(workdir, ignore_errors=True)
    for k, v in figs.items():
        r[k] = statistics.median(v)
        r[k.replace("_s", "_all_s")] = v
    r["ckpt_stall_vs_dcp_stall"] = r["dcp_stall_s"] / r["ckpt_stall_s"]
    r["ckpt_durable_vs_dcp_durable"] = r["dcp_durable_s"] / r["ckpt_durable_s"]
    r["ckpt_copied_of_d2h"] = r["d2h_pinned_s"] / r["ckpt_copied_s"]
    r["load_shm_vs_h2d"] = r["load_shm_s"] / r["h2d_pinned_s"]
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bytes", type=int, default=1 << 30)
    p.add_argument("--tensors", type=int, default=64)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--root", default="/var/tmp")
    p.add_argument("--ckptd", default=os.path.join(REPO, "build", "daemon", "ckptd"))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("py_cuda_bench: torch sees no CUDA device")
    if args.bytes < 4 * args.tensors or args.tensors < 1 or args.iters < 1:
        p.error("--bytes must hold 4 bytes per tensor; --tensors, --iters >= 1")
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return
    gib = r["bytes"] / (1 << 30)
    print(f"{gib:.2f} GiB CUDA state_dict, {r['tensors']} tensors, {r['device']}, torch {r['torch']}")
    print(f"  ckpt.torch save_async: stall {r['ckpt_stall_s']:.4f} s, copied {r['ckpt_copied_s']:.4f} s "
          f"(D2H pinned limit {r['d2h_pinned_s']:.4f} s: {r['ckpt_copied_of_d2h']:.2f} of it), "
          f"durable {r['ckpt_durable_s']:.3f} s")
    print(f"  dcp.async_save:        stall {r['dcp_stall_s']:.4f} s, durable {r['dcp_durable_s']:.3f} s")
    print(f"  load from shm {r['load_shm_s']:.4f} s vs H2D pinned {r['h2d_pinned_s']:.4f} s "
          f"({r['load_shm_vs_h2d']:.2f}x), bit-exact: {r['load_matches']}")


if __name__ == "__main__":
    main()
