"""The ckptd side of ckpt.torch.dcp: one shard per rank and step.

Shards wraps a ckpt._client.Client per ckptd rank of the job (this rank's
for saving and for piece loads, any rank's for reading the whole items it
holds) and the layout of a DCP shard: the items as "dcp/<rank>/<i>", a
header "dcp/rank" (int64[5]: format 1, rank, coordinator rank, world
size, metadata bytes or -1) and, in the coordinator's shard,
"dcp/metadata" (uint8: _dcp_json of DCP's Metadata). Each save or restore
is one call of the C API with every tensor of it; the clients are kept
for the process (one per job, socket and rank). The helpers here say how
a DCP item is stored: as itself when ckptd knows its dtype, else as its
raw bytes (kind "raw"), and, for a tensor stored as itself, as a piece of
its global tensor (piece_place: the layout a load reads any region of);
_tensors describes and orders the copies. A Shards is not thread-safe;
the client cache is.
"""

import hashlib
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


_GLOBAL_PREFIX = "dcp:"
_MAX_NAME = 159  # ckpt/tensor.h's kMaxTensorNameBytes
_MAX_DIMS = 8    # ckpt::kMaxTensorDims


def global_name(fqn):
    """ckptd's name of the global tensor of DCP key `fqn`: "dcp:<fqn>", or,
    for a key that is no valid tensor name (not printable ASCII, too long),
    "dcp#" and its SHA-256. The same on every rank of a save."""
    name = _GLOBAL_PREFIX + fqn
    if len(name) <= _MAX_NAME and all(0x20 <= ord(c) <= 0x7e for c in name):
        return name
    return "dcp#" + hashlib.sha256(fqn.encode("utf-8", "surrogatepass")).hexdigest()


def piece_place(item, value, kind):
    """(global name, global shape, offsets) of a DCP write item saved as a
    piece of its global tensor, or None where it is saved whole: a dtype
    stored as raw bytes (ckptd has no layout for it), a 0-d or empty
    tensor, more than 8 dims, or a write item without a chunk."""
    if kind != "tensor" or not 1 <= value.dim() <= _MAX_DIMS or value.numel() == 0:
        return None
    data = getattr(item, "tensor_data", None)
    chunk = getattr(data, "chunk", None)
    if chunk is None or getattr(data, "size", None) is None:
        return None
    shape = tuple(int(d) for d in value.shape)
    size = tuple(int(d) for d in data.size)
    offsets = tuple(int(o) for o in chunk.offsets)
    if tuple(int(d) for d in chunk.sizes) != shape or len(size) != len(shape) or \
            len(offsets) != len(shape) or \
            any(o < 0 or o + n > g for o, n, g in zip(offsets, shape, size)):
        return None
    return global_name(item.index.fqn), size, offsets


def is_piece(loc):
    return loc.kind == "tensor" and bool(loc.global_name)


def _ints(v, n, what, field):
    if not isinstance(v, (tuple, list)) or len(v) != n or \
            not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise errors.DataLoss("%s: %s %s is not a list of %snon-negative ints"
                              % (what, field, str(v)[:60], "%d " % n if n >= 0 else ""))
    return tuple(v)


def read_region(item, loc, what):
    """(global offsets, lengths, global shape) of a DCP read item of a
    piece: the piece's offsets plus the item's offsets in it. DataLoss
    names a location that does not describe a piece; ValueError a read
    item whose region lies outside the global tensor."""
    name = loc.global_name
    if not isinstance(name, str) or len(name) > _MAX_NAME or not all(0x20 <= ord(c) <= 0x7e for c in name):
        raise errors.DataLoss("%s: global_name %r is not a tensor name" % (what, str(name)[:60]))
    n = len(loc.shape) if isinstance(loc.shape, (tuple, list)) else -1
    shape = _ints(loc.shape, n, what, "shape")
    gshape = _ints(loc.global_shape, n, what, "global_shape")
    offsets = _ints(loc.offsets, n, what, "offsets")
    if n == 0 or any(o + d > g for o, d, g in zip(offsets, shape, gshape)):
        raise errors.DataLoss("%s: piece offsets %s shape %s exceed global_shape %s"
                              % (what, list(offsets), list(shape), list(gshape)))
    within = tuple(int(o) for o in item.storage_offsets)
    lengths = tuple(int(x) for x in item.lengths)
    if len(within) != n or len(lengths) != n:
        raise ValueError("%s: read item of %d/%d dims, the piece has %d" % (what, len(within), len(lengths), n))
    region = tuple(o + w for o, w in zip(offsets, within))
    if any(r + x > g or w < 0 or x < 0 for r, x, g, w in zip(region, lengths, gshape, within)):
        raise ValueError("%s: read item offsets %s lengths %s lie outside global_shape %s"
                         % (what, list(region), list(lengths), list(gshape)))
    return region, lengths, gshape


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


def fillable_directly(target, loc):
    """A piece's region can be restored straight into `target`: a
    contiguous CPU or CUDA tensor of the saved dtype (a narrow view along
    the first dims of a destination is one)."""
    return (target.device.type in ("cpu", "cuda") and target.is_contiguous() and
            _tensors.dtype_name(target.dtype) == loc.dtype and target.numel() > 0)


def empty_region(lengths, loc, device):
    """A temporary for a region of a piece, on `device` when libckpt copies
    there (CPU, CUDA), else on the CPU."""
    device = device if device.type in ("cpu", "cuda") else torch.device("cpu")
    return torch.empty(lengths, dtype=_dtype_of(loc.dtype, loc.name), device=device)


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


def _stats(client):
    """The client's last restore's stats, None from a libckpt without them."""
    try:
        return client.last_restore_stats()
    except errors.FailedPrecondition:
        return None


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
        """One save of this rank: the items (name, tensor, Layout or None),
        the header, the metadata."""
        header = torch.tensor([_FORMAT, self.rank, coordinator, self.world_size,
                               -1 if metadata_blob is None else len(metadata_blob)], dtype=torch.int64)
        tensors = list(items) + [("dcp/rank", header, None)]
        if metadata_blob is not None:
            tensors.append(("dcp/metadata", torch.frombuffer(bytearray(metadata_blob), dtype=torch.uint8), None))
        descs = [_tensors.desc(n.encode("ascii"), t, "step %d: tensor %s" % (step, n)) for n, t, _ in tensors]
        _tensors.wait_for_producers([t for _, t, _ in tensors])
        packed = _client.Packed(descs, [layout for _, _, layout in tensors])
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
        """The tensors `dests` (name -> tensor) whole from `rank`'s shard;
        what the restore read (Client.last_restore_stats), or None."""
        if not dests:
            return None
        descs = [_tensors.desc(n.encode("ascii"), t, "step %d rank %d: tensor %s" % (step, rank, n))
                 for n, t in dests.items()]
        _tensors.wait_for_producers(list(dests.values()))
        packed = _client.Packed(descs)
        return self._call(rank, lambda c: (c.restore(step, packed), _stats(c))[1])

    def restore_pieces(self, step, dests, layouts):
        """Regions of global tensors: dests (name -> contiguous tensor) at
        layouts (name -> _client.Layout) in ONE restore into another
        layout through this rank's client (doc/resharding.md): only the
        saved pieces' chunks the regions touch are read, from whichever
        saved ranks hold them. Returns what it read."""
        names = list(dests)
        descs = [_tensors.desc(n.encode("ascii"), dests[n], "step %d: tensor %s" % (step, n)) for n in names]
        _tensors.wait_for_producers(list(dests.values()))
        packed = _client.Packed(descs, [layouts[n] for n in names])
        return self._call(self.rank, lambda c: (c.restore(step, packed), _stats(c))[1])

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
