"""One rank of test_dcp_peers: a DCP save at one world size on some nodes,
a load at another on other nodes, through ckptd's peers' memory.

Run with RANK, WORLD_SIZE, MASTER_ADDR/PORT (gloo) and CKPT_SOCKET set;
$1 = save | load, $2 = job, $3 = step, $4 = a file to wait for (save: the
rank holds its process, and so the job, until the file exists).

save: dcp_roundtrip.state(r, W) (a model + AdamW state, a bfloat16 and a
complex64 tensor, and "rank<i>.own" written by rank i only) through
CkptdStorageWriter; prints "saved rank=R", then waits for $4.
load: a zeroed copy of the state the 4 saving ranks saved (W_saved = $5),
loaded through CkptdStorageReader at this world size; prints "load ok
rank=R world=W" when every tensor equals the saved one bit for bit, else
"load MISMATCH ..." and exits 1.
"""

import os
import sys
import time

import torch

if torch.__version__.startswith("1."):
    import ckpt.torch.torch113_compat  # noqa: F401  DCP on torch 1.13 (opt-in)


def main():
    mode, job, step, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    import torch.distributed as dist
    from ckpt.torch.dcp import CkptdStorageReader, CkptdStorageWriter, dcp_module
    from tests import dcp_roundtrip
    dcp = dcp_module()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cid = "ckptd://%s/%d" % (job, step)
    if mode == "save":
        sd = dcp_roundtrip.state(rank, world)
        dcp.save_state_dict(sd, storage_writer=CkptdStorageWriter(cid),
                            planner=dcp_roundtrip.own_keys_planner(rank))
        print("saved rank=%d" % rank, flush=True)
        while not os.path.exists(hold):  # the test ends the job
            time.sleep(0.1)
        return 0
    saved_world = int(sys.argv[5])
    want = dcp_roundtrip.state(0, saved_world)
    got = dcp_roundtrip.zeroed(want)
    dcp.load_state_dict(got, storage_reader=CkptdStorageReader(cid))
    diff = dcp_roundtrip.first_difference(want, got)
    dist.barrier()
    dist.destroy_process_group()
    if diff:
        print("load MISMATCH rank=%d world=%d: %s" % (rank, world, diff), flush=True)
        return 1
    print("load ok rank=%d world=%d" % (rank, world), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
