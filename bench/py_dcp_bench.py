"""The DCP figures of bench/py_bench.py: ckpt.torch.dcp vs DCP's FileSystemWriter.

measure(state, args, workdir, best) saves the same tensors (py_bench's
state["model"], flat, as DCP wants them) with torch.distributed.checkpoint's
save_state_dict (no process group) three ways, each timed by py_bench's
best(fn, args.iters):

  dcp_save_stall_s      CkptdStorageWriter(wait_durable=False): returns once
                        every tensor is in ckptd's shared memory and the step
                        committed; the daemon persists it in the background
                        (the training stall).
  dcp_save_durable_s    CkptdStorageWriter() (wait_durable=True): returns
                        once the shard is durable on disk.
  dcp_fs_save_stall_s   FileSystemWriter(sync_files=True) into a fresh
                        directory under workdir: DCP's own writer, which
                        returns once its files are written and fsynced.

It talks to the ckptd py_bench started (socket workdir/ckptd.sock); two
untimed saves first create the job's arena and touch both its slots. Returns the figures as a dict,
plus the ratios dcp_fs_vs_dcp_save_stall and dcp_fs_vs_dcp_save_durable.
"""

import os
import shutil
import time

JOB = "py_bench_dcp"


def measure(state, args, workdir, best, socket=None):
    import torch
    if torch.__version__.startswith("1."):
        import ckpt.torch.torch113_compat  # noqa: F401  DCP on torch 1.13
    from ckpt.torch.dcp import CkptdStorageWriter, dcp_module
    dcp = dcp_module()
    socket = socket or os.path.join(workdir, "ckptd.sock")
    sd = dict(state["model"])
    step = [0]

    def ours(durable):
        step[0] += 1
        w = CkptdStorageWriter("ckptd://%s/%d" % (JOB, step[0]), socket=socket, wait_durable=durable)
        dcp.save_state_dict(sd, storage_writer=w, no_dist=True)
        return w

    # Untimed: the first save creates the arena, the second first touches its
    # other slot; the rounds then measure the steady state (as py_bench).
    ours(True)
    ours(True)
    stalls = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        w = ours(False)
        stalls.append(time.perf_counter() - t0)
        w.wait_durable()  # untimed: the next save finds a free slot
    durable, durable_all = best(lambda: ours(True), args.iters)

    fs_dir = os.path.join(workdir, "dcp_fs")
    n = [0]

    def fs():
        n[0] += 1
        path = os.path.join(fs_dir, str(n[0]))
        os.makedirs(path)
        dcp.save_state_dict(sd, storage_writer=dcp.FileSystemWriter(path), no_dist=True)

    try:
        fs_s, fs_all = best(fs, args.iters)
    finally:
        shutil.rmtree(fs_dir, ignore_errors=True)
    r = {"dcp_save_stall_s": min(stalls), "dcp_save_stall_all_s": stalls,
         "dcp_save_durable_s": durable, "dcp_save_durable_all_s": durable_all,
         "dcp_fs_save_stall_s": fs_s, "dcp_fs_save_stall_all_s": fs_all}
    r["dcp_fs_vs_dcp_save_stall"] = fs_s / r["dcp_save_stall_s"]
    r["dcp_fs_vs_dcp_save_durable"] = fs_s / durable
    return r
