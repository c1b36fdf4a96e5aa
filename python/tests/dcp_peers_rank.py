"""One rank of test_dcp_peers: a DCP save at one world size on some nodes,
a load at another on other nodes, through ckptd's peers' memory.

Run with RANK, WORLD_SIZE, MASTER_ADDR/PORT (gloo) and CKPT_SOCKET set;
$1 = save | load, $2 = job, $3 = step, $4 = a file to wait for (save: the
rank holds its process, and so the job, until the file exists).

save: dcp_roundtrip.state(r, W) (a model + AdamW state, a bfloat16 and a
complex64 tensor, and "rank<i>.own" written by rank i only) and "rows", a
[2000, 1024] float32 ShardedTensor split by rows over the W saving ranks,
through CkptdStorageWriter; prints "saved rank=R", then waits for $4.
load: a zeroed copy of the state the 4 saving ranks saved (W_saved = $5),
with "rows" split over this world size (a resharding load: DCP's read
items are parts of the saved pieces), loaded through CkptdStorageReader;
prints the reader's stats and "load ok rank=R world=W" when every tensor
equals the saved one bit for bit and the piece loads read no more than
the saved pieces they touch, else "load MISMATCH ..." and exits 1.
"""

import os
import sys
import time

import torch

if torch.__version__.startswith("1."):
    import ckpt.torch.torch113_compat  # noqa: F401  DCP on torch 1.13 (opt-in)


ROWS, COLS = 2000, 1024


def rows_of(rank, world):
    """[start, end) of `rank`'s rows when ROWS are split over `world`."""
    per = -(-ROWS // world)
    return min(rank * per, ROWS), min((rank + 1) * per, ROWS)


def full_rows():
    g = torch.Generator().manual_seed(5)
    return torch.randn(ROWS, COLS, generator=g)


def sharded_rows(local, rank, world):
    from torch.distributed._shard.sharded_tensor import (
        Shard, ShardMetadata, init_from_local_shards)
    start, end = rows_of(rank, world)
    meta = ShardMetadata(shard_offsets=[start, 0], shard_sizes=[end - start, COLS],
                         placement="rank:%d/cpu" % rank)
    return init_from_local_shards([Shard(local, meta)], ROWS, COLS)


def touched_bytes(rank, world, saved_world):
    """Bytes of the saved pieces of "rows" that this rank's rows overlap:
    what a load that restores whole saved pieces reads."""
    start, end = rows_of(rank, world)
    out = 0
    for r in range(saved_world):
        s, e = rows_of(r, saved_world)
        if s < end and start < e:
            out += (e - s) * COLS * 4
    return out


def got_more_than_touched(stats, rank, world, saved_world):
    """Whether the piece loads read more than whole saved pieces would:
    every other item is read whole (each under one checksum chunk), the
    rows at most the saved pieces they overlap."""
    start, end = rows_of(rank, world)
    mine = (end - start) * COLS * 4
    return stats["piece_bytes_read"] > stats["piece_bytes"] - mine + touched_bytes(rank, world, saved_world)


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
        start, end = rows_of(rank, world)
        sd["rows"] = sharded_rows(full_rows()[start:end].clone(), rank, world)
        dcp.save_state_dict(sd, storage_writer=CkptdStorageWriter(cid),
                            planner=dcp_roundtrip.own_keys_planner(rank))
        print("saved rank=%d" % rank, flush=True)
        while not os.path.exists(hold):  # the test ends the job
            time.sleep(0.1)
        return 0
    saved_world = int(sys.argv[5])
    want = dcp_roundtrip.state(0, saved_world)
    got = dcp_roundtrip.zeroed(want)
    start, end = rows_of(rank, world)
    local = torch.zeros(end - start, COLS)
    got["rows"] = sharded_rows(local, rank, world)
    reader = CkptdStorageReader(cid)
    dcp.load_state_dict(got, storage_reader=reader)
    del got["rows"]
    diff = dcp_roundtrip.first_difference(want, got)
    stats = reader.last_read_stats
    print("read stats rank=%d world=%d: %s; saved pieces of rows touched: %d bytes"
          % (rank, world, stats, touched_bytes(rank, world, saved_world)), flush=True)
    if not diff and not torch.equal(local, full_rows()[start:end]):
        diff = "rows: values differ"
    if not diff and got_more_than_touched(stats, rank, world, saved_world):
        diff = "piece loads read %d bytes, more than the whole state's pieces" % stats["piece_bytes_read"]
    dist.barrier()
    dist.destroy_process_group()
    if diff:
        print("load MISMATCH rank=%d world=%d: %s" % (rank, world, diff), flush=True)
        return 1
    print("load ok rank=%d world=%d" % (rank, world), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
