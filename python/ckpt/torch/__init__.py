"""ckpt.torch: save and restore PyTorch state through ckptd.

Two lines in a training script::

    ckpt = ckpt.torch.Checkpointer()              # CKPT_JOB, RANK, ... (torchrun)
    ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})

and after a restart, in place (no extra memory, same storage)::

    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    extra = ckpt.load(None, state)                # None = the latest step

A state_dict may nest dict/OrderedDict, list and tuple around tensors of any
dtype the installed torch has (bfloat16, complex, float8, ...) and int,
float (inf/nan too), bool, str and None. Non-tensor values are stored as a
small UTF-8 JSON tensor (never pickle); anything else is refused with an
exception naming its key path. Tensors are the shard's tensors, named by
their key path (``model/layers.0.weight``; see _tree.py for the encoding).

CUDA tensors are copied by libckpt itself. The copy is ordered after the
kernels that produced them: an event is recorded on torch's current stream
of each device and waited for before the copy starts. ``wait_copied()``
returning means the GPU (and the host) may overwrite the tensors.

Thread-safety: a Checkpointer may be shared by threads (saves are
serialised by libckpt); a SaveHandle belongs to one thread. The GIL is
released while C copies (ctypes.CDLL).
"""

import os

import torch

from .. import _client, _stacks, errors
from .._peers import peers_watched  # noqa: F401 (ckpt.peers_watched, here too)
from . import _tensors, _tree

# A hang's evidence: the Python stacks on SIGUSR2 when ckptrun asks
# ($CKPT_STACKS_FILE, see ckpt/_stacks.py).
_stacks.register()

__all__ = ["Checkpointer", "SaveHandle", "Piece", "storable_dtypes",
           "peers_watched", "resilient", "Context", "RestartRequested"]

storable_dtypes = _tensors.storable_dtypes
Piece = _tensors.Piece

_HEADER = b"%ckpt/header"       # int64[2]: format version, skeleton bytes
_SKELETON = b"%ckpt/skeleton"   # uint8[n]: the skeleton, UTF-8 JSON
_HEADER_VERSION = 1
_MAX_SKELETON = 1 << 31


def _check_step(step):
    if isinstance(step, bool) or not isinstance(step, int):
        raise errors.InvalidArgument(
            "step: an int, not %s" % type(step).__name__)
    if not 0 <= step < 2**63:
        raise errors.InvalidArgument("step: %d is not in [0, 2^63)" % step)
    return step


class SaveHandle:
    """The progress of one save_async: wait_copied(), then wait()."""

    def __init__(self, step, handle):
        self.step = step
        self._handle = handle

    def wait_copied(self):
        """Returns once every tensor has been read: the trainer (and, for
        CUDA tensors, the GPU) may overwrite them. Raises the copy's error."""
        self._handle.wait_copied()

    def wait(self):
        """Returns once the daemon holds the step (it becomes durable
        later: Checkpointer.wait_durable). Raises the save's error."""
        self._handle.wait()

    @property
    def done(self):
        return self._handle.done


class Checkpointer:
    """One rank's connection to the node's ckptd.

    job, socket, rank, world_size default to $CKPT_JOB, $CKPT_SOCKET,
    $RANK, $WORLD_SIZE (what torchrun and ckptrun set), as libckpt decides
    for every front end (ckpt_resolve_rank); an error names the missing or
    malformed variable. A process with neither rank/world_size given nor
    $RANK/$WORLD_SIZE set (a script not started by a launcher) is rank 0
    of 1. local_rank is $LOCAL_RANK (None when unset). options:
    slot_bytes, slot_headroom, num_slots, block_when_busy, copy_threads,
    busy_timeout_s (see ckpt/client.h).

    rewind: the default of save()'s rewind. A save of a step below this
    rank's newest deletes the newer steps; ckptd refuses it
    (errors.FailedPrecondition naming them) unless this process restored
    (load()) a step <= it first, the normal recovery path, or rewind is
    True.
    """

    def __init__(self, job=None, socket=None, rank=None, world_size=None,
                 *, rewind=False, **options):
        if not isinstance(rewind, bool):
            raise errors.InvalidArgument(
                "rewind: a bool, not %s" % type(rewind).__name__)
        self.rewind = rewind
        # libckpt decides the launcher rule (ckpt_resolve_rank) for every
        # front end; the client is then given the resolved values.
        rank, world_size, self.local_rank = _client.resolve_rank(
            rank, world_size)
        self._client = _client.Client(job, socket, rank, world_size, **options)
        self.job = job if job is not None else os.environ.get("CKPT_JOB")
        self.rank, self.world_size = rank, world_size
        self.loaded_step = None  # the step the last load() restored
        # Key path -> _client.Layout of every tensor the last load()
        # restored that was saved as a piece of a global tensor.
        self.loaded_layouts = {}

    # -- save -------------------------------------------------------------

    def _pack(self, step, state_dict):
        _check_step(step)
        flat = _tree.flatten(state_dict)
        skeleton = bytearray(flat.skeleton_bytes())
        header = torch.tensor([_HEADER_VERSION, len(skeleton)],
                              dtype=torch.int64)
        skeleton_t = torch.frombuffer(skeleton, dtype=torch.uint8)
        keep = [header, skeleton_t]
        descs = [_tensors.desc(_HEADER, header),
                 _tensors.desc(_SKELETON, skeleton_t)]
        layouts = [None, None] if flat.layouts else None
        for name, _path, t in flat.tensors:
            if not t.is_contiguous():
                t = t.contiguous()  # a copy the save reads instead
            keep.append(t)
            descs.append(_tensors.desc(name.encode("ascii"), t))
            if layouts is not None:
                layouts.append(flat.layouts.get(name))
        _tensors.wait_for_producers(keep)
        return _client.Packed(descs, layouts), keep

    def save(self, step, state_dict, *, block=True, rewind=None):
        """Saves state_dict as `step`.

        A save of this rank's newest step replaces it; a lower step drops
        the newer ones and is refused (errors.FailedPrecondition, nothing
        changes) unless this process restored a step <= it first or
        rewind (None: the Checkpointer's) is True.

        block=True returns once the daemon holds the step. block=False
        returns once the tensors have been copied (they may change again)
        and gives the SaveHandle whose wait() reports the commit."""
        if block:
            rewind = self._rewind(rewind)
            packed, keep = self._pack(step, state_dict)
            self._client.save(step, packed, rewind)
            del keep
            return None
        handle = self.save_async(step, state_dict, rewind=rewind)
        handle.wait_copied()
        return handle

    def save_async(self, step, state_dict, *, rewind=None):
        """Starts a save and returns its SaveHandle at once. CONTRACT: the
        tensors must not change until handle.wait_copied() returns. rewind:
        as save()'s."""
        rewind = self._rewind(rewind)
        packed, keep = self._pack(step, state_dict)
        return SaveHandle(step, self._client.save_async(step, packed, keep,
                                                        rewind))

    def _rewind(self, rewind):
        if rewind is None:
            return self.rewind
        if not isinstance(rewind, bool):
            raise errors.InvalidArgument(
                "rewind: a bool, not %s" % type(rewind).__name__)
        return rewind

    # -- queries ----------------------------------------------------------

    def latest_step(self):
        """The newest step restorable on every rank, or None if none."""
        try:
            return self._client.latest_step()
        except errors.NotFound:
            return None

    def restore_step(self):
        """The step to resume from: $CKPT_RESTORE_STEP when set (ckptrun
        sets it to the step its recovery plan chose), else latest_step();
        None when there is nothing to resume."""
        text = os.environ.get("CKPT_RESTORE_STEP", "")
        if not text:
            return self.latest_step()
        if not text.isdigit() or len(text) > 19 or int(text) >= 2**63:
            raise errors.InvalidArgument(
                "$CKPT_RESTORE_STEP: %.40r is not a step (an int in "
                "[0, 2^63))" % text)
        return int(text)

    def wait_durable(self, step, timeout=600.0):
        """Blocks until this rank's shard of `step` is durable on disk;
        DeadlineExceeded after timeout seconds."""
        _check_step(step)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not 0 <= timeout < 2**32 / 1000:
            raise errors.InvalidArgument(
                "timeout: %.40r is not a number of seconds in [0, 2^32 ms)"
                % (timeout,))
        self._client.wait_durable(step, int(timeout * 1000))

    def progress(self, step, compute_s=None):
        """Progress beacon: call once per training step (after this rank's
        own work of it). A store into shared memory, no system call.
        compute_s: the seconds this rank spent in its own compute (forward,
        backward; not waits for other ranks), so that a straggler can be
        told from the ranks that wait for it."""
        _check_step(step)
        if compute_s is None:
            compute_s = -1.0
        elif isinstance(compute_s, bool) or \
                not isinstance(compute_s, (int, float)) or \
                not 0 <= compute_s < 3600:
            raise errors.InvalidArgument(
                "compute_s: %.40r is not a number of seconds in [0, 3600)"
                % (compute_s,))
        self._client.progress(step, float(compute_s))

    def expect_pause(self, seconds, reason):
        """The next `seconds` may show no progress (evaluation, a long
        save): the hang deadline of the current step is extended once, and
        `reason` is kept with a hang event."""
        if isinstance(seconds, bool) or \
                not isinstance(seconds, (int, float)) or \
                not 0 <= seconds <= 86400:
            raise errors.InvalidArgument(
                "seconds: %.40r is not a number of seconds in [0, 86400]"
                % (seconds,))
        if not isinstance(reason, str):
            raise errors.InvalidArgument(
                "reason: %.40r is not a str" % (reason,))
        self._client.expect_pause(float(seconds), reason)

    def last_save_stats(self):
        """What the last save took: wait_slot_s, copy_s, rpc_s, total_s,
        bytes (libckpt's SaveStats)."""
        return self._client.last_save_stats()

    # -- load -------------------------------------------------------------

    def _skeleton(self, step):
        header = torch.zeros(2, dtype=torch.int64)
        try:
            self._client.restore(
                step, _client.Packed([_tensors.desc(_HEADER, header)]))
        except errors.NotFound as e:
            if "not in the checkpoint" not in e.message:
                raise  # the step itself is missing: the daemon names it
            raise errors.NotFound(
                "step %d has no ckpt.torch skeleton (saved by another "
                "client?): %s" % (step, e.message)) from None
        version, size = int(header[0]), int(header[1])
        what = "step %d: skeleton" % step
        if version != _HEADER_VERSION:
            raise errors.FailedPrecondition(
                "%s: format version %d, this package reads %d"
                % (what, version, _HEADER_VERSION))
        if not 0 < size < _MAX_SKELETON:
            raise errors.DataLoss("%s: size %d out of range" % (what, size))
        data = torch.empty(size, dtype=torch.uint8)
        self._client.restore(
            step, _client.Packed([_tensors.desc(_SKELETON, data)]))
        return _tree.parse_skeleton(data.numpy().tobytes(), what)

    def _refuse_a_saved_rank(self):
        """An elastic job's launcher names, in $CKPT_RESTORE_RANK, the
        saved rank a resized rank restores; this Checkpointer reads only
        its own rank's shard, so another one is refused, never ignored."""
        text = os.environ.get("CKPT_RESTORE_RANK", "")
        world = os.environ.get("CKPT_RESTORE_WORLD_SIZE", "")
        if not text or (text == str(self.rank) and world == str(self.world_size)):
            return
        raise errors.FailedPrecondition(
            "$CKPT_RESTORE_RANK: %.20r (saved at world size %.20r): this job was "
            "resized (elastic continuation) and ckpt.torch restores only this "
            "rank's own shard (rank %d of %d); run elastic jobs without "
            "--min-world-size for PyTorch trainers" % (text, world, self.rank, self.world_size))

    def load(self, step=None, state_dict=None, *, strict=True):
        """Restores `step` (None: the latest) into state_dict's tensors in
        place (same storage, bit-exact) and returns the saved structure:
        non-tensor values as saved, tensors as the live ones.

        Every tensor of state_dict must be in the step with the same dtype
        and shape (else NotFound / InvalidArgument naming its key path).
        strict=True also requires every saved tensor to be in state_dict;
        strict=False returns the ones it lacks as new CPU tensors. With
        state_dict None every tensor comes back new (on the CPU).

        With step None a step whose copies fail verification is reported
        and the previous good step is loaded in this same call; the
        tensors end holding exactly one step's bytes and `loaded_step`
        says which step that was."""
        self._refuse_a_saved_rank()
        if step is not None:
            _check_step(step)
            out = self._load_step(step, state_dict, strict)
            self.loaded_step = step
            return out
        tried, last = [], None
        while True:
            try:
                step = self._client.latest_step()
            except errors.NotFound:
                if not tried:
                    raise
                break
            if last is not None and step >= last:
                break  # offered again: the daemon found its copy good
            try:
                out = self._load_step(step, state_dict, strict)
            except errors.DataLoss as e:
                tried.append(e.message)
                last = step
                continue
            self.loaded_step = step
            return out
        raise errors.DataLoss("load of the latest step: no step verifies; "
                              + "; ".join(tried))

    def _load_step(self, step, state_dict, strict):
        skeleton = self._skeleton(step)
        saved = skeleton["tensors"]
        live = {}
        strict_here = state_dict is not None and strict
        live_layouts, live_objects = {}, {}
        if state_dict is not None:
            flat = _tree.flatten(state_dict, lenient=True)
            live = {name: (path, t) for name, path, t in flat.tensors}
            live_layouts, live_objects = flat.layouts, flat.objects
        targets, copy_back, descs, layouts, dsts = [], [], [], [], []
        saved_names = set()
        for i, entry in enumerate(saved):
            name, path = entry["name"], entry["path"]
            dtype = _tensors.BY_NAME[entry["dtype"]]
            shape = torch.Size(entry["shape"])
            saved_names.add(name)
            if name not in live:
                if strict_here:
                    raise errors.NotFound(
                        "%s: in step %d but not in the given state_dict "
                        "(load(..., strict=False) returns it as a new "
                        "tensor)" % (path, step))
                t = torch.empty(shape, dtype=dtype)
            else:
                path, t = live[name]
                if t.dtype != dtype:
                    raise errors.InvalidArgument(
                        "%s: dtype %s given, step %d has %s"
                        % (path, _tensors.NAME.get(t.dtype, t.dtype), step,
                           entry["dtype"]))
                if t.shape != shape:
                    raise errors.InvalidArgument(
                        "%s: shape %s given, step %d has %s"
                        % (path, list(t.shape), step, list(shape)))
            targets.append(live_objects.get(name, t))
            layouts.append(live_layouts.get(name))
            dst = t
            if not t.is_contiguous():
                dst = torch.empty(shape, dtype=dtype, device=t.device)
                copy_back.append((t, dst))
            descs.append(_tensors.desc(name.encode("ascii"), dst))
            dsts.append(dst)
        for name, (path, _t) in live.items():
            if name not in saved_names:
                raise errors.NotFound(
                    "%s: not in step %d (the checkpoint has no tensor at "
                    "this key path)" % (path, step))
        _tensors.wait_for_producers(dsts)
        reported = self._client.restore(step, _client.Packed(descs, layouts),
                                        report=True)
        self.loaded_layouts = {
            entry["path"]: layout
            for entry, layout in zip(saved, reported) if layout is not None}
        with torch.no_grad():
            for t, dst in copy_back:
                t.copy_(dst)
        return _tree.unflatten(skeleton, targets.__getitem__,
                               "step %d: skeleton" % step)

    # -- lifetime ---------------------------------------------------------

    def close(self):
        """Finishes every queued save, then disconnects (idempotent)."""
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# In-process restart (ckpt/torch/_resilient.py); last, as it subclasses
# Checkpointer.
from ._resilient import Context, RestartRequested, resilient  # noqa: E402
