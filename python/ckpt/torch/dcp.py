"""ckpt.torch.dcp: ckptd as a storage of torch.distributed.checkpoint (DCP).

DCP users keep their code and swap the storage::

    import ckpt.torch.torch113_compat  # torch 1.13 on Python >= 3.11 only: opt-in
    from ckpt.torch.dcp import CkptdStorageWriter, CkptdStorageReader, dcp_module
    dcp = dcp_module()  # torch.distributed.checkpoint; on 1.13 torch.distributed._shard.checkpoint
    dcp.save_state_dict(sd, storage_writer=CkptdStorageWriter("ckptd://myjob/100"))
    dcp.load_state_dict(sd, storage_reader=CkptdStorageReader("ckptd://myjob/100"))
    # torch 2.x: dcp.save(sd, checkpoint_id="ckptd://myjob/100", storage_writer=CkptdStorageWriter())
    #            dcp.async_save(...) stages through the writer (an AsyncStager)

A checkpoint id is ``ckptd://<job>/<step>`` (the reader also takes
``ckptd://<job>/latest``). Every rank's write items (tensors, and DCP's
BytesIO items as uint8 tensors) become ONE ckptd save of that rank: its
tensors go into the node's shared memory and the daemon persists them. The
coordinator's shard also holds DCP's ``Metadata`` as JSON (_dcp_json: never
pickle), with a ``StorageLocation`` (rank, tensor name) per storage item; it
is written in finish(), after every other rank reported its shard, so a step
without its metadata is never readable as complete. With
``wait_durable=True`` (the default) write_data and finish return only once
the rank's shard is durable on disk, so save_state_dict returns once the
whole step is durable; ckptd lists a step as restorable only when every rank
has its shard. Each tensor item is saved as a piece of its global tensor
(ckptd's layout: "dcp:<key>", DCP's global size, the chunk's offsets), so
read_data serves every read item of such a piece as a region of the
global tensor, all in one restore into another layout: only the chunks a
region touches are read and verified, straight into the planner's tensor
when it is contiguous (else through a temporary of the region). Items
ckptd has no layout for (raw-byte dtypes, BytesIO, 0-d or empty tensors)
and steps saved before are restored whole from the shard that holds them.
Data comes from the node's shared memory, a peer's, or disk.

The job's ranks are ckptd ranks: $RANK (or torch.distributed's rank) of
$WORLD_SIZE, as for ckpt.torch.Checkpointer; the socket is $CKPT_SOCKET
unless given. Reading another rank's items (replicated tensors saved once)
reads that rank's shard through this node's daemon. Not thread-safe: one
writer/reader per save/load, as DCP uses them.
"""

import dataclasses
import io
import os
import re

import torch

from .. import _client, errors


def _shim_hint(e):
    """ImportError for torch 1.13's DCP failing on Python >= 3.11: the
    compatibility hook is opt-in (doc/python-dcp.md)."""
    return ImportError(
        "torch %s's DCP does not import on this Python (%s): import "
        "ckpt.torch.torch113_compat before ckpt.torch.dcp to patch it "
        "(doc/python-dcp.md)" % (torch.__version__, str(e)[:120]))


try:  # torch >= 2.0
    from torch.distributed.checkpoint import StorageReader, StorageWriter
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
except ImportError:  # torch 1.13
    try:
        from torch.distributed._shard.checkpoint import StorageReader, StorageWriter
        from torch.distributed._shard.checkpoint.planner import LoadItemType, WriteItemType
        from torch.distributed._shard.checkpoint.storage import WriteResult
    except ValueError as e:  # a mutable dataclass default (Python >= 3.11)
        raise _shim_hint(e) from None
# After DCP itself: _dcp_json reads DCP's classes when imported.
from . import _dcp_json, _dcp_shards, _tensors  # noqa: E402

try:
    from torch.distributed.checkpoint.metadata import StorageMeta
except ImportError:
    StorageMeta = None
try:
    from torch.distributed.checkpoint.staging import AsyncStager
except ImportError:
    AsyncStager = None

__all__ = ["CkptdStorageWriter", "CkptdStorageReader", "parse_checkpoint_id", "dcp_module", "SCHEME"]


def dcp_module():
    """The installed torch's DCP package: torch.distributed.checkpoint
    (torch >= 2.0) or torch.distributed._shard.checkpoint (1.13)."""
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:
        import torch.distributed._shard.checkpoint as dcp
    return dcp


SCHEME = "ckptd://"
_STEP_MAX = (1 << 62)
_ID_RE = re.compile(r"^ckptd://(?P<job>[^\x00]+)/(?P<step>[^/]+)$")


_JOB_MAX_BYTES = 127  # util/validate.h's kMaxJobNameBytes
_JOB_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _job_name_problem(job):
    """What ckptd's ValidateJobName would refuse in ``job``, or None: the
    name becomes a directory and a shared-memory name on the node, so a
    bad one is named here rather than at the first save."""
    if len(job.encode()) > _JOB_MAX_BYTES:
        return "%d bytes, at most %d allowed" % (len(job.encode()), _JOB_MAX_BYTES)
    if ".." in job:
        return "'..' is not allowed"
    if job[0] in ".-":
        return "may not start with '.' or '-'"
    for b in job.encode():  # bytes, as the daemon names them
        if chr(b) not in _JOB_CHARS:
            return "character 0x%02x is not allowed (use [A-Za-z0-9._-])" % b
    return None


def parse_checkpoint_id(checkpoint_id, allow_latest=False):
    """``ckptd://<job>/<step>`` -> (job, step); step None for "latest"
    (where allowed). ValueError names what is wrong."""
    if isinstance(checkpoint_id, os.PathLike):
        checkpoint_id = os.fspath(checkpoint_id)
    if not isinstance(checkpoint_id, str):
        raise ValueError("checkpoint_id: a str, not %s" % type(checkpoint_id).__name__)
    shown = checkpoint_id[:64] + ("..." if len(checkpoint_id) > 64 else "")
    m = _ID_RE.match(checkpoint_id)
    if m is None:
        raise ValueError("checkpoint_id %r: not %s<job>/<step>" % (shown, SCHEME))
    job, step = m.group("job"), m.group("step")
    why = _job_name_problem(job)
    if why:
        raise ValueError("checkpoint_id %r: job %r: %s" % (shown, job[:32], why))
    if step == "latest" and allow_latest:
        return job, None
    if not step.isdigit() or len(step) > 19 or int(step) >= _STEP_MAX:
        raise ValueError("checkpoint_id %r: step %r is not an integer in [0, 2^62)" % (shown, step[:24]))
    return job, int(step)


def _valid_id(checkpoint_id):
    try:
        parse_checkpoint_id(checkpoint_id, allow_latest=True)
        return True
    except ValueError:
        return False


def _dist_rank_world(rank, world_size):
    import torch.distributed as dist
    if rank is None and dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
    if world_size is None and dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
    return rank, world_size


class _Target:
    """Job, step and ckptd connection of a writer or reader."""

    def __init__(self, checkpoint_id, job, step, socket, rank, world_size, allow_latest):
        self._allow_latest = allow_latest
        self.job, self.step = job, step
        self.socket, self.rank, self.world_size = socket, rank, world_size
        self.checkpoint_id = None
        if checkpoint_id is not None:
            self.reset(checkpoint_id)

    def reset(self, checkpoint_id):
        if checkpoint_id is None:
            return
        self.job, self.step = parse_checkpoint_id(checkpoint_id, self._allow_latest)
        self.checkpoint_id = os.fspath(checkpoint_id)

    def shards(self):
        if self.job is None:
            raise ValueError("checkpoint_id: none given (ckptd://<job>/<step>)")
        rank, world = _dist_rank_world(self.rank, self.world_size)
        return _dcp_shards.Shards(self.job, self.socket, rank, world)


class CkptdStorageWriter(StorageWriter):
    """DCP StorageWriter into ckptd (see the module docstring).

    checkpoint_id: ``ckptd://<job>/<step>`` (or set by DCP 2.x's reset());
    socket/rank/world_size: default $CKPT_SOCKET and the process group's
    (else $RANK/$WORLD_SIZE); wait_durable: return only once durable;
    durable_timeout_s: how long to wait for it."""

    _synchronize_after_execute = False  # AsyncStager: stage() blocks
    # Tensors saved as pieces of their global tensors (the reader's byte
    # range loads); False writes the format of before (tests: the reader's
    # whole-item path).
    _piece_layouts = True

    def __init__(self, checkpoint_id=None, *, socket=None, rank=None, world_size=None,
                 wait_durable=True, durable_timeout_s=600.0):
        self._t = _Target(checkpoint_id, None, None, socket, rank, world_size, False)
        self._wait_durable = bool(wait_durable)
        self._durable_timeout_s = float(durable_timeout_s)
        self._is_coordinator = False
        self._held = None  # the coordinator's items, saved in finish()

    # --- torch 2.x names ---------------------------------------------------
    def reset(self, checkpoint_id=None):
        self._held = None
        self._t.reset(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _valid_id(checkpoint_id) and parse_checkpoint_id(checkpoint_id, True)[1] is not None

    def storage_meta(self):
        if StorageMeta is None:
            return None
        return StorageMeta(checkpoint_id=self._t.checkpoint_id)

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.init(is_coordinator)

    # --- torch 1.13 names (and 2.x's shared ones) --------------------------
    def init(self, is_coordinator):
        if self._t.step is None:
            raise ValueError("checkpoint_id: none given (ckptd://<job>/<step>)")
        self._is_coordinator = bool(is_coordinator)
        self._held = None
        self._shards = self._t.shards()

    def prepare_local_plan(self, plan):
        return dataclasses.replace(plan, storage_data={"rank": self._shards.rank})

    def prepare_global_plan(self, plans):
        out = []
        for plan in plans:
            data = dict(plan.storage_data or {})
            data["coordinator"] = self._shards.rank
            out.append(dataclasses.replace(plan, storage_data=data))
        return out

    def write_data(self, plan, planner):
        data = plan.storage_data or {}
        coordinator = data.get("coordinator", self._shards.rank)
        items, results = [], []
        for i, item in enumerate(plan.items):
            # Unique per rank: a whole item never meets another rank's
            # item of the same name in the step's layout index.
            name = "dcp/%d/%d" % (self._shards.rank, i)
            value = planner.resolve_data(item)
            layout = None
            if item.type == WriteItemType.BYTE_IO:
                buf = value.getvalue() if isinstance(value, io.BytesIO) else bytes(value)
                tensor = torch.frombuffer(bytearray(buf), dtype=torch.uint8) if buf else \
                    torch.empty(0, dtype=torch.uint8)
                loc = _dcp_json.StorageLocation(self._shards.rank, name, "bytes", "uint8", (len(buf),))
            else:
                tensor, kind = _dcp_shards.storable(value.detach(), "write item %r" % item.index.fqn[:80])
                place = _dcp_shards.piece_place(item, value, kind) if self._piece_layouts else None
                loc = _dcp_json.StorageLocation(self._shards.rank, name, kind,
                                                _tensors.dtype_name(value.dtype), tuple(value.shape),
                                                *(place or ("", (), ())))
                if place is not None:
                    layout = _client.Layout(place[1], place[2], place[0].encode("ascii"))
            items.append((name, tensor, layout))
            results.append(WriteResult(index=item.index, size_in_bytes=tensor.numel() * tensor.element_size(),
                                       storage_data=loc))
        if self._is_coordinator:
            self._held = (items, coordinator)  # saved with the metadata in finish()
        else:
            self._save(items, coordinator, None)
        fut = torch.futures.Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results):
        if self._held is None:
            raise RuntimeError("finish: no write_data on the coordinator before it")
        items, coordinator = self._held
        self._held = None
        metadata.storage_data = {r.index: r.storage_data for rank_results in results for r in rank_results}
        blob = _dcp_json.encode(metadata)
        self._save(items, coordinator, blob)

    def wait_durable(self, timeout_s=600.0):
        """Blocks until this rank's shard of the last step written is
        durable (for a writer made with wait_durable=False)."""
        self._shards.wait_durable(self._t.step, timeout_s)

    def _save(self, items, coordinator, metadata_blob):
        self._shards.save(self._t.step, items, coordinator, metadata_blob)
        if self._wait_durable:
            self._shards.wait_durable(self._t.step, self._durable_timeout_s)

    # --- AsyncStager (torch 2.x dcp.async_save) ----------------------------
    @property
    def should_synchronize_after_execute(self):
        return self._synchronize_after_execute

    def stage(self, state_dict):
        """A training-safe copy of state_dict: every tensor copied off the
        device into host memory (complete when this returns; the background
        save then writes it to ckptd and completes once durable)."""
        return _dcp_shards.host_copy(state_dict)

    def synchronize_staging(self):
        pass

    def close(self):
        pass


class CkptdStorageReader(StorageReader):
    """DCP StorageReader from ckptd. checkpoint_id: ``ckptd://<job>/<step>``
    or ``ckptd://<job>/latest`` (the newest step complete on every rank)."""

    def __init__(self, checkpoint_id=None, *, socket=None, rank=None, world_size=None):
        self._t = _Target(checkpoint_id, None, None, socket, rank, world_size, True)
        self._metadata = None
        self._step = None
        self._read_by_reset = False
        # What the last read_data read: items served as pieces (byte-range
        # restores) and whole, and per kind the bytes asked for and the
        # saved bytes read (libckpt's restore stats; 0 without them).
        self.last_read_stats = None

    def reset(self, checkpoint_id=None):
        self._metadata = None
        self._step = None
        self._read_by_reset = False
        self._t.reset(checkpoint_id)
        if checkpoint_id is not None:
            # DCP 2.x swallows read_metadata()'s error (and then fails with
            # "metadata is None"); reset() is where dcp.load(checkpoint_id=)
            # still lets it through, naming the step. The next
            # read_metadata() of this load takes what was read here.
            self.read_metadata()
            self._read_by_reset = True

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _valid_id(checkpoint_id)

    def read_metadata(self, *args, **kwargs):
        if self._read_by_reset:
            self._read_by_reset = False
            return self._metadata
        shards = self._t.shards()
        self._shards = shards
        if self._t.step is not None:
            self._metadata = shards.read_metadata(self._t.step)
            self._step = self._t.step
            return self._metadata
        self._tried = []
        while True:  # latest: a step whose metadata fails falls back
            step = self._older_latest()
            try:
                self._metadata = shards.read_metadata(step)
            except errors.DataLoss as e:
                self._tried.append(e.message)
                self._step = step
                continue
            self._step = step
            return self._metadata

    def _older_latest(self):
        """The newest step now, which must be older than the one that just
        failed (self._step after a failure); DataLoss naming what was tried
        once none is left."""
        try:
            step = self._shards.latest_step()
        except errors.NotFound:
            if not self._tried:
                raise
            step = None
        if self._tried and (step is None or step >= self._step):
            raise errors.DataLoss("ckptd://%s/latest: no step verifies; %s"
                                  % (self._t.job[:64], "; ".join(self._tried)))
        return step

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.init(metadata, is_coordinator)

    def init(self, metadata, is_coordinator):
        if self._step is None:  # DCP calls read_metadata() first; a caller may not
            self.read_metadata()
        if isinstance(getattr(metadata, "storage_data", None), dict):
            self._metadata = metadata

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        locations = self._metadata.storage_data
        if not isinstance(locations, dict):
            raise errors.DataLoss("dcp metadata of step %d: no storage locations" % self._step)
        pieces, by_rank = [], {}
        for item in plan.items:
            loc = locations.get(item.storage_index)
            if not isinstance(loc, _dcp_json.StorageLocation):
                raise KeyError("step %d: no stored item for %r" % (self._step, item.storage_index.fqn[:80]))
            if item.type != LoadItemType.BYTE_IO and _dcp_shards.is_piece(loc):
                pieces.append((item, loc))
            else:
                by_rank.setdefault(loc.rank, []).append((item, loc))
        while True:
            self.last_read_stats = {"piece_items": len(pieces), "piece_bytes": 0, "piece_bytes_read": 0,
                                    "whole_items": len(plan.items) - len(pieces), "whole_bytes": 0,
                                    "whole_bytes_read": 0}
            try:
                if pieces:
                    self._read_pieces(pieces, planner)
                for rank in sorted(by_rank):
                    self._read_rank(rank, by_rank[rank], planner)
                break
            except errors.DataLoss as e:
                if self._t.step is not None:
                    raise
                self._fall_back_for_data(e)
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _fall_back_for_data(self, error):
        """A "latest" load whose data failed verification after DCP planned
        it: the previous good step is read instead when it has the same
        layout (the plan stays valid), so every tensor ends holding one
        step's bytes; else DataLoss names both steps."""
        self._tried = getattr(self, "_tried", [])
        self._tried.append(error.message)
        step = self._older_latest()
        metadata = self._shards.read_metadata(step)
        if metadata.state_dict_metadata != self._metadata.state_dict_metadata \
                or metadata.storage_data != self._metadata.storage_data:
            raise errors.DataLoss(
                "ckptd://%s/latest: step %d failed verification (%s) and the "
                "previous good step %d has another layout; load it by its "
                "step" % (self._t.job[:64], self._step, error.message, step))
        self._step, self._metadata = step, metadata

    def _count(self, kind, stats):
        if stats:
            self.last_read_stats[kind + "_bytes"] += stats["bytes"]
            self.last_read_stats[kind + "_bytes_read"] += stats["bytes_read"]

    def _named(self, e, keys):
        """e (a ckpt error of a restore) with the step, and the DCP key of
        each tensor its message names (keys: tensor name -> description)."""
        named = [keys[n] for n in sorted(set(re.findall(r"dcp/[0-9a-z/]+", e.message))) if n in keys]
        return type(e)("ckptd://%s/%d: %s%s" % (self._t.job[:64], self._step, e.message,
                                                " (%s)" % "; ".join(named) if named else ""), e.code)

    def _read_pieces(self, pairs, planner):
        """Every item saved as a piece of its global tensor: ONE restore
        into another layout (doc/resharding.md) of each item's region
        (global name and shape, offsets, lengths), straight into the
        planner's tensor when it is a contiguous CPU or CUDA tensor (the
        destination or a narrow view of it) of the saved dtype; else into a
        temporary of the region's size, then copy_ into the destination.
        Only the chunks of the saved pieces a region touches are read, from
        whichever saved ranks hold them; a region no saved piece holds is
        refused before any byte moves."""
        dests, layouts, keys, after = {}, {}, {}, []
        for item, loc in pairs:
            fqn = item.storage_index.fqn
            what = "step %d: %r (tensor %s)" % (self._step, fqn[:80], loc.global_name[:80])
            offsets, lengths, gshape = _dcp_shards.read_region(item, loc, what)
            target = planner.resolve_tensor(item).detach()
            if tuple(target.shape) != lengths:
                raise ValueError("%s: read item lengths %s, destination %s"
                                 % (what, list(lengths), list(target.shape)))
            if target.numel() == 0:
                after.append(lambda item=item, target=target: planner.commit_tensor(item, target))
                continue
            name = "dcp/read/%d" % len(dests)
            if _dcp_shards.fillable_directly(target, loc):
                dest = target
                after.append(lambda item=item, target=target: planner.commit_tensor(item, target))
            else:
                dest = _dcp_shards.empty_region(lengths, loc, target.device)

                def copy(item=item, target=target, dest=dest):
                    target.copy_(dest)
                    planner.commit_tensor(item, target)
                after.append(copy)
            dests[name] = dest
            layouts[name] = _client.Layout(gshape, offsets, loc.global_name.encode("ascii"))
            keys[name] = "%s = DCP key %r offsets %s lengths %s" % (name, fqn[:80], list(offsets), list(lengths))
            keys.setdefault(loc.name, "%s = DCP key %r" % (loc.name, fqn[:80]))  # a saved piece's name
        if dests:
            try:
                stats = self._shards.restore_pieces(self._step, dests, layouts)
            except errors.Error as e:
                raise self._named(e, keys) from None
            self._count("piece", stats)
        for fn in after:
            fn()

    def _read_rank(self, rank, pairs, planner):
        """One restore from `rank`'s shard for every item it holds."""
        dests = {}  # name -> tensor restored into
        after = []
        for item, loc in pairs:
            what = "%r (tensor %s of rank %d)" % (item.storage_index.fqn[:80], loc.name, rank)
            if item.type == LoadItemType.BYTE_IO:
                if loc.kind != "bytes":
                    raise errors.DataLoss("step %d: %s is stored as %s, not bytes" % (self._step, what, loc.kind))
                buf = dests.setdefault(loc.name, _dcp_shards.empty_like_stored(loc))
                after.append(lambda item=item, buf=buf: planner.load_bytes(item, io.BytesIO(buf.numpy().tobytes())))
                continue
            if loc.kind == "bytes":
                raise errors.DataLoss("step %d: %s is stored as bytes, not a tensor" % (self._step, what))
            target = planner.resolve_tensor(item).detach()
            whole = all(o == 0 for o in item.storage_offsets) and tuple(item.lengths) == tuple(loc.shape)
            if (whole and loc.name not in dests and _dcp_shards.fillable_in_place(target, loc)):
                dests[loc.name] = _dcp_shards.as_stored(target, loc)
                after.append(lambda item=item, target=target: planner.commit_tensor(item, target))
                continue
            src = dests.setdefault(loc.name, _dcp_shards.empty_like_stored(loc))

            def copy(item=item, target=target, src=src, loc=loc, what=what):
                full = _dcp_shards.stored_view(src, loc)
                part = _dcp_shards.narrow(full, item.storage_offsets, item.lengths)
                if tuple(part.shape) != tuple(target.shape):
                    raise ValueError("step %d: %s: stored slice %s, destination %s"
                                     % (self._step, what, tuple(part.shape), tuple(target.shape)))
                target.copy_(part)
                planner.commit_tensor(item, target)
            after.append(copy)
        try:
            stats = self._shards.restore(self._step, rank, dests)
        except errors.Error as e:
            keys = {}
            for item, loc in pairs:
                keys.setdefault(loc.name, "%s = DCP key %r" % (loc.name, item.storage_index.fqn[:80]))
            raise self._named(e, keys) from None
        self._count("whole", stats)
        for fn in after:
            fn()
