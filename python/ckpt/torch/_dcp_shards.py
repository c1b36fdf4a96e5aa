"""The ckptd side of ckpt.torch.dcp: one shard per rank and step.

Shards wraps a ckpt._client.Client per ckptd rank of the job (this rank's
for saving, any rank's for reading the items it holds) and the layout of a
DCP shard: the items as "dcp/<i>", a header "dcp/rank" (int64[5]: format 1,
rank, coordinator rank, world size, metadata bytes or -1) and, in the
coordinator's shard, "dcp/metadata" (uint8: _dcp_json of DCP's Metadata).
Each save or restore is one call of the C API with every tensor of it;
the clients are kept for the process (one per job, socket and rank).
The helpers here say how a DCP item is stored: as itself when ckptd knows
its dtype, else as its raw bytes (kind "raw"); _tensors describes and
orders the copies. A Shards is not
thread-safe; the client cache is.
"""

import math
import threading

import torch

from .. import _client, errors
from . import _dcp_json, _tensors

_FORMAT = 1
_clients = {}  # (job, socket, rank, world size) -> _client.Client
_clients_lock = threading.Lock()
_MAX_METADATA = 1 << 31

def _dtype_of(name, what):
    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise errors.DataLoss("%s: dtype %r is not one of this torch" % (what, str(name)[:40]))
    return value


def storable(t, what):
    """(tensor to store, kind): t itself (contiguous, "tensor") or, for a
    dtype ckptd lacks, its bytes as flat uint8 ("raw")."""
    if t.is_quantized or t.is_sparse or t.layout != torch.strided:
        raise ValueError("%s: a %s tensor cannot be stored" % (what, t.layout if not t.is_quantized else "quantized"))
    t = t.contiguous()
    if t.dtype in _tensors.NATIVE:
        return t, "tensor"
    return t.reshape(-1).view(torch.uint8), "raw"


def _nbytes(loc):
    return math.prod(loc.shape) * torch.empty((), dtype=_dtype_of(loc.dtype, loc.name)).element_size()


def empty_like_stored(loc):
    if loc.kind == "tensor":
        return torch.empty(loc.shape, dtype=_dtype_of(loc.dtype, loc.name))
    if loc.kind == "raw":
        return torch.empty(_nbytes(loc), dtype=torch.uint8)
    return torch.empty(loc.shape, dtype=torch.uint8)  # bytes


def stored_view(buf, loc):
    """The item's tensor over the buffer it was restored into."""
    if loc.kind == "raw":
        return buf.view(_dtype_of(loc.dtype, loc.name)).reshape(loc.shape)
    return buf


def fillable_in_place(target, loc):
    return (target.device.type == "cpu" and target.is_contiguous() and
            _tensors.dtype_name(target.dtype) == loc.dtype and tuple(target.shape) == tuple(loc.shape) and
            loc.kind in ("tensor", "raw") and target.numel() > 0)


def as_stored(target, loc):
    """`target` as the tensor it is stored as (a view: restores in place)."""
    return target.reshape(-1).view(torch.uint8) if loc.kind == "raw" else target


def narrow(t, offsets, lengths):
    for dim, (start, length) in enumerate(zip(offsets, lengths)):
        t = t.narrow(dim, int(start), int(length))
    return t


def host_copy(state_dict):
    """A copy of state_dict with every tensor copied into host memory."""
    if isinstance(state_dict, torch.Tensor):
        return state_dict.detach().to("cpu", copy=True)
    if isinstance(state_dict, dict):
        return type(state_dict)((k, host_copy(v)) for k, v in state_dict.items()) \
            if type(state_dict) is not dict else {k: host_copy(v) for k, v in state_dict.items()}
    if isinstance(state_dict, list):
        return [host_copy(v) for v in state_dict]
    if isinstance(state_dict, tuple) and not hasattr(state_dict, "_fields"):
        return tuple(host_copy(v) for v in state_dict)
    return state_dict


class Shards:
    """The DCP shards of one job through this node's ckptd."""

    def __init__(self, job, socket, rank, world_size):
        self.job, self.socket = job, socket
        # The launcher rule is libckpt's, as for Checkpointer.
        self.rank, self.world_size, _ = _client.resolve_rank(rank, world_size)

    def _client(self, rank):
        # Shared by every writer and reader of the process: a client keeps
        # its arena mapped (warm), so a step's save copies at memory speed
        # instead of faulting in a fresh mapping each time.
        key = (self.job, self.socket, rank, max(self.world_size, rank + 1))
        with _clients_lock:
            c = _clients.get(key)
            if c is None:
                c = _client.Client(job=key[0], socket=key[1], rank=key[2], world_size=key[3])
                _clients[key] = c
        return c

    def _call(self, rank, fn):
        """fn(client of `rank`); once more with a new client if the cached
        one lost its daemon (UNAVAILABLE: ckptd restarted since)."""
        try:
            return fn(self._client(rank))
        except errors.Unavailable:
            key = (self.job, self.socket, rank, max(self.world_size, rank + 1))
            with _clients_lock:
                _clients.pop(key, None)
            return fn(self._client(rank))

    def save(self, step, items, coordinator, metadata_blob):
        """One save of this rank: the items, the header, the metadata."""
        header = torch.tensor([_FORMAT, self.rank, coordinator, self.world_size,
                               -1 if metadata_blob is None else len(metadata_blob)], dtype=torch.int64)
        tensors = list(items) + [("dcp/rank", header)]
        if metadata_blob is not None:
            tensors.append(("dcp/metadata", torch.frombuffer(bytearray(metadata_blob), dtype=torch.uint8)))
        descs = [_tensors.desc(n.encode("ascii"), t, "step %d: tensor %s" % (step, n)) for n, t in tensors]
        _tensors.wait_for_producers([t for _, t in tensors])
        packed = _client.Packed(descs)
        self._call(self.rank, lambda c: c.save(step, packed))
        del tensors  # alive until the copy is done: save() returned

    def wait_durable(self, step, timeout_s):
        self._call(self.rank, lambda c: c.wait_durable(step, int(timeout_s * 1000)))

    def latest_step(self):
        try:
            step = self._call(self.rank, lambda c: c.latest_step())
        except errors.NotFound as e:
            raise errors.NotFound("ckptd://%s/latest: the job has no complete step (%s)"
                                  % (self.job[:64], e.message)) from None
        return step

    def restore(self, step, rank, dests):
        if not dests:
            return
        descs = [_tensors.desc(n.encode("ascii"), t, "step %d rank %d: tensor %s" % (step, rank, n))
                 for n, t in dests.items()]
        _tensors.wait_for_producers(list(dests.values()))
        packed = _client.Packed(descs)
        self._call(rank, lambda c: c.restore(step, packed))

    def _header(self, step, rank):
        h = torch.zeros(5, dtype=torch.int64)
        try:
            self.restore(step, rank, {"dcp/rank": h})
        except errors.NotFound as e:
            raise errors.NotFound("ckptd://%s/%d: no DCP checkpoint (rank %d: %s)"
                                  % (self.job[:64], step, rank, e.message)) from None
        fmt, r, coord, world, size = (int(v) for v in h)
        if fmt != _FORMAT or r != rank or not 0 <= coord < max(world, 1) or \
                not -1 <= size < _MAX_METADATA:
            raise errors.DataLoss("ckptd://%s/%d rank %d: bad dcp/rank header %s"
                                  % (self.job[:64], step, rank, h.tolist()))
        return coord, size

    def read_metadata(self, step):
        coord, _ = self._header(step, 0)
        size = self._header(step, coord)[1] if coord != 0 else _
        if size < 0:
            raise errors.DataLoss("ckptd://%s/%d: rank %d holds no DCP metadata" % (self.job[:64], step, coord))
        blob = torch.empty(size, dtype=torch.uint8)
        self.restore(step, coord, {"dcp/metadata": blob})
        try:
            return _dcp_json.decode(blob.numpy().tobytes())
        except ValueError as e:
            raise errors.DataLoss("ckptd://%s/%d: %s" % (self.job[:64], step, e)) from None
