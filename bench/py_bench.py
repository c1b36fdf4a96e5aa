#!/usr/bin/env python3
"""py_bench: ckpt.torch against plain torch on one state_dict, in one run.

The state is --bytes of float32 in --tensors tensors. Every figure comes with
the limit it is compared to, measured in the same run on the same tensors:

  save_stall_s   Checkpointer.save (blocking: copied into shared memory and
                 committed); vs copy_s, a plain torch copy of the same
                 tensors into preallocated host buffers with the same thread
                 count (--threads; copy_1t_s: with one thread), and vs
                 torch_save_fsync_s (torch.save to a file on --root, then
                 fsync).
  load_shm_s     in-place Checkpointer.load of a step still in shared
                 memory; vs copy_s.
  load_disk_s    in-place load in a fresh process after ckptd restarted with
                 its shared memory gone (page cache dropped when possible);
                 vs torch_load_s, torch.load of the torch.save file in a
                 fresh process.

Timed figures are the best of --iters rounds; each round measures the
copies, a save and a load one after the other, so a change in the load of a
shared machine hits ours and the limit alike. The first save (it creates
the arena) and the first into the second slot are reported apart: the
rounds measure the steady state of a training job.
--json prints one JSON object instead of the table. Run it with a Python
that has torch (Debian: /usr/bin/python3); it starts its own ckptd
(--ckptd, default build/daemon/ckptd of this tree).
"""

import argparse
import json
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402

import ckpt.torch  # noqa: E402
from tests.ckptd_process import CkptdProcess  # noqa: E402

JOB = "py_bench"


def make_state(total_bytes, count):
    per = max(1, total_bytes // count // 4)
    return {"model": {"t%03d" % i: torch.full((per,), float(i + 1))
                      for i in range(count)}}


def host_buffers(state):
    return {"model": {k: torch.empty_like(v).fill_(0.5)  # prefaulted
                      for k, v in state["model"].items()}}


def best(fn, iters):
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def torch_copy(state, buffers):
    for k, v in state["model"].items():
        buffers["model"][k].copy_(v)


def drop_page_cache():
    """True if the kernel's page cache was dropped (needs root)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def raw_direct_read(path, chunk=4 << 20, depth=8):
    """The disk's limit: (seconds, bytes) of reading `path` with O_DIRECT in
    `chunk`-byte reads, `depth` in flight (threads: preadv releases the
    GIL), like ckpt_bench's raw read (io_uring, 8 x 4 MiB). The page cache
    is not involved."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    chunks = (size + chunk - 1) // chunk
    done = []

    def worker(first):
        buf = mmap.mmap(-1, chunk)
        n = 0
        for c in range(first, chunks, depth):
            n += os.preadv(fd, [buf], c * chunk)
        buf.close()
        done.append(n)
    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(depth)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0, sum(done)
    finally:
        os.close(fd)


def fresh_process(code, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError("fresh process failed:\n" + out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


LOAD_DISK = """
import json, time, torch, ckpt.torch
torch.set_num_threads({threads})
per, count = {per}, {count}
target = {{"model": {{"t%03d" % i: torch.empty(per).fill_(0.5)
                     for i in range(count)}}}}
c = ckpt.torch.Checkpointer(job={job!r}, socket={socket!r}, rank=0,
                            world_size=1, copy_threads={threads})
t0 = time.perf_counter()
c.load({step}, target)
dt = time.perf_counter() - t0
assert float(target["model"]["t000"][0]) == 1.0
print(json.dumps({{"s": dt}}))
"""

TORCH_LOAD = """
import json, time, torch
torch.set_num_threads({threads})
t0 = time.perf_counter()
sd = torch.load({path!r})
dt = time.perf_counter() - t0
assert float(sd["model"]["t000"][0]) == 1.0
print(json.dumps({{"s": dt}}))
"""


def measure_dcp(state, args, workdir):
    """The DCP comparison: dcp_save_stall_s (ckpt.torch.dcp's writer) and
    dcp_fs_save_stall_s (DCP's own FileSystemWriter) on the same state.
    bench/py_dcp_bench.py measures them."""
    import py_dcp_bench
    return py_dcp_bench.measure(state, args, workdir, best)


def run(args):
    torch.set_num_threads(args.threads)
    state = make_state(args.bytes, args.tensors)
    nbytes = sum(t.numel() * t.element_size() for t in state["model"].values())
    buffers = host_buffers(state)
    r = {"bytes": nbytes, "tensors": args.tensors, "threads": args.threads,
         "iters": args.iters}

    workdir = tempfile.mkdtemp(prefix="py_bench.", dir=args.root)
    daemon = CkptdProcess(workdir, binary=args.ckptd)
    daemon.start()
    try:
        c = ckpt.torch.Checkpointer(job=JOB, socket=daemon.socket, rank=0,
                                    world_size=1, copy_threads=args.threads)
        t0 = time.perf_counter()
        c.save(1, state)  # sizes and creates the arena
        r["first_save_s"] = time.perf_counter() - t0
        c.wait_durable(1)
        t0 = time.perf_counter()
        c.save(2, state)  # the first save into the second slot
        r["second_save_s"] = time.perf_counter() - t0
        c.wait_durable(2)
        step = [2]

        def save():
            step[0] += 1
            c.save(step[0], state)

        def copy_1t():
            # A second reference: torch's copy on one thread. On a small,
            # shared machine its multi-threaded copy can be the slower one
            # (OpenMP threads wait on each other); both ratios are reported.
            torch.set_num_threads(1)
            try:
                torch_copy(state, buffers)
            finally:
                torch.set_num_threads(args.threads)

        # One round per iteration, the limits next to ours, so a change in
        # the machine's load hits both; then the best of each.
        runs = {"copy": [], "copy_1t": [], "save_stall": [], "load_shm": []}
        for _ in range(args.iters):
            runs["copy"].append(best(lambda: torch_copy(state, buffers), 1)[0])
            runs["copy_1t"].append(best(copy_1t, 1)[0])
            runs["save_stall"].append(best(save, 1)[0])
            c.wait_durable(step[0])  # the next save finds a free slot
            runs["load_shm"].append(
                best(lambda: c.load(step[0], buffers), 1)[0])
            assert float(buffers["model"]["t000"][0]) == 1.0
        for name, times in runs.items():
            r[name + "_s"], r[name + "_all_s"] = min(times), times
        r["save_stats"] = c.last_save_stats()

        path = os.path.join(workdir, "state.pt")

        def torch_save():
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        r["torch_save_fsync_s"], _ = best(torch_save, 1)
        r.update(measure_dcp(state, args, workdir))

        c.close()
        buffers = None  # the fresh process needs the memory
        if daemon.stop() != 0:
            raise RuntimeError("ckptd failed:\n" + daemon.log_tail())
        daemon.drop_shm()
        r["page_cache_dropped"] = drop_page_cache()
        daemon.start()
        per = nbytes // args.tensors // 4
        r["load_disk_s"] = fresh_process(LOAD_DISK.format(
            threads=args.threads, per=per, count=args.tensors, job=JOB,
            socket=daemon.socket, step=step[0]))["s"]
        drop_page_cache()
        r["torch_load_s"] = fresh_process(TORCH_LOAD.format(
            threads=args.threads, path=path))["s"]
        drop_page_cache()
        r["raw_read_s"], r["raw_read_bytes"] = raw_direct_read(path)
    finally:
        daemon.stop()
        daemon.drop_shm()
        subprocess.run(["rm", "-rf", workdir], check=False)

    r["save_stall_vs_copy"] = r["save_stall_s"] / r["copy_s"]
    r["torch_save_fsync_vs_save_stall"] = \
        r["torch_save_fsync_s"] / r["save_stall_s"]
    r["load_shm_vs_copy"] = r["load_shm_s"] / r["copy_s"]
    r["save_stall_vs_copy_1t"] = r["save_stall_s"] / r["copy_1t_s"]
    r["load_shm_vs_copy_1t"] = r["load_shm_s"] / r["copy_1t_s"]
    r["torch_load_vs_load_disk"] = r["torch_load_s"] / r["load_disk_s"]
    # Our disk load's rate as a fraction of the raw read's rate.
    r["load_disk_vs_raw_read"] = (r["bytes"] / r["load_disk_s"]) / \
        (r["raw_read_bytes"] / r["raw_read_s"])
    if "dcp_save_stall_s" in r and "dcp_fs_save_stall_s" in r:
        r["dcp_fs_vs_dcp_save_stall"] = \
            r["dcp_fs_save_stall_s"] / r["dcp_save_stall_s"]
    return r


def table(r):
    gib = r["bytes"] / 2**30
    rows = [
        ("save stall (ckpt.torch)", r["save_stall_s"],
         "%.2fx copy (target <= 1.15)" % r["save_stall_vs_copy"]),
        ("torch copy into host buffers", r["copy_s"],
         "the limit (%d threads, as ours)" % r["threads"]),
        ("torch copy, 1 thread", r["copy_1t_s"],
         "save %.2fx, load from shm %.2fx this"
         % (r["save_stall_vs_copy_1t"], r["load_shm_vs_copy_1t"])),
        ("torch.save + fsync", r["torch_save_fsync_s"],
         "%.1fx our stall (target >= 10)"
         % r["torch_save_fsync_vs_save_stall"]),
        ("load in place, shared memory", r["load_shm_s"],
         "%.2fx copy (target <= 1.2)" % r["load_shm_vs_copy"]),
        ("load in place, disk, fresh process", r["load_disk_s"],
         "page cache %s" % ("dropped" if r["page_cache_dropped"]
                            else "NOT dropped")),
        ("torch.load, fresh process", r["torch_load_s"],
         "%.1fx our disk load (target >= 3)" % r["torch_load_vs_load_disk"]),
        ("raw O_DIRECT read, torch.save file", r["raw_read_s"],
         "the disk's limit: our disk load runs at %.2f of it"
         % r["load_disk_vs_raw_read"]),
        ("first save (creates the arena)", r["first_save_s"], ""),
        ("first save into the second slot", r["second_save_s"], ""),
    ]
    if "dcp_save_stall_s" in r:
        rows.append(("DCP save stall, ckpt plugin", r["dcp_save_stall_s"],
                     "FileSystemWriter takes %.1fx"
                     % r["dcp_fs_vs_dcp_save_stall"]))
        rows.append(("DCP save until durable, ckpt plugin",
                     r["dcp_save_durable_s"], "FileSystemWriter takes %.1fx"
                     % r["dcp_fs_vs_dcp_save_durable"]))
    if "dcp_fs_save_stall_s" in r:
        rows.append(("DCP save stall, FileSystemWriter (fsync)",
                     r["dcp_fs_save_stall_s"], ""))
    out = ["py_bench: %.2f GiB in %d float32 tensors, %d threads, best of %d"
           % (gib, r["tensors"], r["threads"], r["iters"]), ""]
    out.append("%-38s %9s %9s  %s" % ("", "seconds", "GiB/s", "vs"))
    for name, s, note in rows:
        out.append("%-38s %9.3f %9.2f  %s" % (name, s, gib / s, note))
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bytes", type=int, default=1 << 30)
    p.add_argument("--tensors", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="copy threads, ours and torch's (default: CPUs)")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--root", default="/var/tmp",
                   help="directory on the disk to measure")
    p.add_argument("--ckptd", default=os.path.join(REPO, "build", "daemon",
                                                   "ckptd"))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.bytes < args.tensors * 4 or args.tensors < 1 or args.iters < 1:
        p.error("--bytes must hold 4 bytes per tensor; --tensors, --iters "
                ">= 1")
    r = run(args)
    print(json.dumps(r) if args.json else table(r))


if __name__ == "__main__":
    main()
