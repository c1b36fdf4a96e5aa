"""Started as root, drops to uid/gid 65534 (after loading torch and
libckpt.so, so no file of the tree needs to be readable by nobody), then
tries a job it does not own: every call must raise ckpt.PermissionDenied.
Prints one JSON object: call -> [exception name, message].
Usage: uid_probe.py SOCKET JOB"""

import json
import os
import sys

import torch

import ckpt
import ckpt.torch


def attempt(fn):
    try:
        fn()
        return ["no exception", ""]
    except ckpt.Error as e:
        return [type(e).__name__, str(e)[:300]]


def main():
    socket, job = sys.argv[1], sys.argv[2]
    ckpt.lib_path()  # loads libckpt.so while still root
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    results = {}
    state = {}

    def connect():
        state["c"] = ckpt.torch.Checkpointer(job=job, socket=socket, rank=0,
                                             world_size=1)
    results["connect"] = attempt(connect)
    c = state.get("c")
    if c is not None:
        results["latest_step"] = attempt(c.latest_step)
        results["load"] = attempt(lambda: c.load(1, {"t": torch.empty(4)}))
        results["save"] = attempt(lambda: c.save(2, {"t": torch.ones(4)}))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
