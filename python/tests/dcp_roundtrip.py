"""One rank of the DCP round trip of test_dcp (also run in-process there).

state(): a model + AdamW state_dict as DCP takes it in torch 1.13 (flat:
the model's tensors, the optimizer's per-parameter tensors under
"optim.<i>.<key>", its param_groups as one non-tensor item, which DCP
stores as bytes), plus a bfloat16 and a complex64 tensor (stored natively
and as raw bytes) and one tensor per rank ("rank<r>.own") that only that
rank writes, so every rank reads items of the other's shard.

As a script (RANK, WORLD_SIZE, MASTER_ADDR/PORT, CKPT_SOCKET, $1 = job,
$2 = step): save, zero every tensor, load, compare bit for bit, print
"roundtrip ok rank=R" or exit 1 naming the first difference. Then, in the
same processes (an import of torch costs seconds), layout_roundtrip():
ckpt.torch.Checkpointer saves a ShardedTensor whose rows are split unevenly
over the ranks (and a DTensor where torch has them), loads it into a zeroed
one in place and checks the layout each rank's piece was saved with; it
prints "layout ok rank=R".
"""

import dataclasses
import os
import sys

import torch

if torch.__version__.startswith("1."):
    import ckpt.torch.torch113_compat  # noqa: F401  DCP on torch 1.13 (opt-in)


def state(rank, world):
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 16)).square().mean().backward()
        opt.step()
    sd = dict(model.state_dict())
    osd = opt.state_dict()
    for i, per_param in osd["state"].items():
        for k, v in per_param.items():
            sd["optim.%d.%s" % (i, k)] = v
    sd["optim.param_groups"] = osd["param_groups"]
    sd["extra.bf16"] = torch.randn(5, 3).to(torch.bfloat16)
    sd["extra.c64"] = torch.randn(7, dtype=torch.complex64)
    for r in range(world):
        sd["rank%d.own" % r] = torch.full((4,), float(r + 1)) * torch.arange(4.0)
    return sd


def own_keys_planner(rank):
    """DCP 1.13's default planner writes plain tensors on the coordinator
    only; this one also makes each rank write its "rank<r>." tensors and
    its shards of a ShardedTensor."""
    from ckpt.torch.dcp import dcp_module
    dcp = dcp_module()
    try:
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
        from torch.distributed.checkpoint.planner_helpers import _create_write_items
    except ImportError:
        from torch.distributed._shard.checkpoint.default_planner import DefaultSavePlanner
        from torch.distributed._shard.checkpoint.planner_helpers import _create_write_items

    class OwnKeys(DefaultSavePlanner):
        def create_local_plan(self):
            prefix = "rank%d." % rank
            items = []
            for fqn, obj in self.state_dict.items():
                # A ShardedTensor's local shards: every rank writes its own.
                mine = fqn.startswith(prefix) or type(obj).__name__ == "ShardedTensor"
                other_rank = fqn.startswith("rank") and not mine
                if mine or (self.is_coordinator and not other_rank):
                    items += _create_write_items(fqn, obj)
            # The default plan's other fields (DCP 2.x: planner_data, the
            # flattening mappings create_global_plan needs) are kept.
            self.plan = dataclasses.replace(super().create_local_plan(), items=items)
            return self.plan
    return OwnKeys()


def blank(v):
    """v with every tensor zeroed and every other leaf None, its dicts and
    lists kept (DCP 2.x flattens both sides: the shape must match)."""
    if isinstance(v, torch.Tensor):
        return torch.zeros_like(v)
    if isinstance(v, dict):
        return {k: blank(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(blank(x) for x in v)
    return None


def zeroed(sd):
    return {k: blank(v) for k, v in sd.items()}


def first_difference(want, got):
    for k, v in want.items():
        g = got.get(k)
        if isinstance(v, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.dtype != v.dtype or g.shape != v.shape:
                return "%s: %r" % (k, g)
            a = v.contiguous().reshape(-1).view(torch.uint8)
            b = g.contiguous().reshape(-1).view(torch.uint8)
            if not torch.equal(a, b):
                return "%s: values differ" % k
        elif g != v:
            return "%s: %r != %r" % (k, g, v)
    return None


def layout_roundtrip(rank, world, job, step):
    """None, or the first thing that differs."""
    import ckpt.torch
    from ckpt._client import Layout
    from torch.distributed._shard.sharded_tensor import (
        Shard, ShardMetadata, init_from_local_shards)
    rows = 3 * world + 1
    per = [rows // world + (1 if r < rows % world else 0) for r in range(world)]
    start = sum(per[:rank])

    def sharded(local):
        meta = ShardMetadata(shard_offsets=[start, 0],
                             shard_sizes=[per[rank], 4],
                             placement="rank:%d/cpu" % rank)
        return init_from_local_shards([Shard(local, meta)], rows, 4)

    local = torch.arange(per[rank] * 4.0).reshape(per[rank], 4) + 100 * rank
    state = {"st": sharded(local), "plain": torch.full((2,), float(rank))}
    want = {"state_dict['st']": Layout((rows, 4), (start, 0), b"")}
    dtensor = None
    try:  # torch >= 2.4 (torch.distributed.tensor), else 2.x's _tensor
        from torch.distributed.device_mesh import init_device_mesh
        try:
            from torch.distributed.tensor import Shard as DShard
            from torch.distributed.tensor import distribute_tensor
        except ImportError:
            from torch.distributed._tensor import Shard as DShard
            from torch.distributed._tensor import distribute_tensor
        mesh = init_device_mesh("cpu", (world,))
        full = torch.arange(rows * 3.0).reshape(rows, 3)
        dtensor = lambda t: distribute_tensor(t, mesh, [DShard(0)])  # noqa: E731
        state["dt"] = dtensor(full)
        # torch.chunk's split: ceil(rows / world) rows per rank.
        chunk = -(-rows // world)
        want["state_dict['dt']"] = Layout((rows, 3), (chunk * rank, 0), b"")
    except ImportError:
        print("layout: no DTensor in torch %s; ShardedTensor only"
              % torch.__version__, flush=True)
    c = ckpt.torch.Checkpointer(job=job + "-layout", rank=rank,
                                world_size=world)
    c.save(step, state)
    into = {"st": sharded(torch.zeros_like(local)), "plain": torch.zeros(2)}
    if dtensor is not None:
        into["dt"] = dtensor(torch.zeros(rows, 3))
    back = c.load(step, into)
    c.close()
    if back["st"] is not into["st"]:
        return "load did not return the live ShardedTensor"
    got = into["st"].local_shards()[0].tensor
    if not torch.equal(got, local):
        return "ShardedTensor piece: %s != %s" % (got, local)
    if dtensor is not None and not torch.equal(into["dt"].to_local(),
                                               state["dt"].to_local()):
        return "DTensor piece differs"
    if not torch.equal(into["plain"], state["plain"]):
        return "plain tensor differs"
    if c.loaded_layouts != want:
        return "layouts %r, expected %r" % (c.loaded_layouts, want)
    return None


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    job, step = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    import torch.distributed as dist
    from ckpt.torch.dcp import CkptdStorageReader, CkptdStorageWriter, dcp_module
    dcp = dcp_module()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sd = state(rank, world)
    cid = "ckptd://%s/%d" % (job, step)
    dcp.save_state_dict(sd, storage_writer=CkptdStorageWriter(cid), planner=own_keys_planner(rank))
    got = zeroed(sd)
    ptrs = {k: v.data_ptr() for k, v in got.items() if isinstance(v, torch.Tensor)}
    dcp.load_state_dict(got, storage_reader=CkptdStorageReader(cid))
    diff = first_difference(sd, got)
    moved = [k for k, p in ptrs.items() if got[k].data_ptr() != p]
    layout_diff = layout_roundtrip(rank, world, job, step)
    dist.barrier()
    dist.destroy_process_group()
    if diff or moved:
        print("roundtrip MISMATCH rank=%d: %s moved=%s" % (rank, diff, moved), flush=True)
        return 1
    print("roundtrip ok rank=%d" % rank, flush=True)
    if layout_diff:
        print("layout MISMATCH rank=%d: %s" % (rank, layout_diff), flush=True)
        return 1
    print("layout ok rank=%d" % rank, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
