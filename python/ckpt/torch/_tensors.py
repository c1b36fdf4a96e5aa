"""How a torch tensor meets libckpt: the one place for every front end
(Checkpointer, the DCP plugin).

- The dtype table: torch dtype -> ckpt_dtype code, canonical names.
- desc(): the C descriptor (ckpt._client.TensorDesc) of a contiguous tensor.
- wait_for_producers(): orders libckpt's copies after the kernels that
  wrote (or will read) CUDA tensors.
- Piece and placed(): a tensor that is one piece of a global tensor (given
  explicitly, a DTensor, a ShardedTensor as FSDP's sharded state dict
  holds them): its local tensor and its layout (doc/resharding.md).


The ten dtypes ckpt.h knows are stored as themselves (ckptctl shows them).
Every other dtype the installed torch has (complex, uint16/32/64, the float8
variants, ...) is stored as its raw bytes, a flat uint8 tensor; the
skeleton records the real dtype and shape, so it comes back bit for bit.
Quantized dtypes (their bytes alone do not describe their values) and the
sub-byte shell dtypes are refused.
"""

import functools
import sys
import warnings

import torch

from .. import _client

CKPT_UINT8 = 6
_MAX_DIMS = 8  # ckpt::kMaxTensorDims

# torch dtype -> ckpt_dtype code (ckpt.h).
NATIVE = {
    torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4,
    torch.int8: 5, torch.uint8: 6, torch.int16: 7, torch.int32: 8,
    torch.int64: 9, torch.bool: 10,
}


def _all_dtypes():
    found = {}
    for attr in dir(torch):
        value = getattr(torch, attr, None)
        if isinstance(value, torch.dtype):
            found.setdefault(value, str(value).split(".", 1)[-1])
    return found


# torch dtype -> its canonical name ("bfloat16", "float8_e4m3fn"), for every
# dtype of the installed torch, and back.
NAME = _all_dtypes()
BY_NAME = {name: dtype for dtype, name in NAME.items()}


@functools.lru_cache(maxsize=None)
def refusal(dtype):
    """Why a dtype cannot be stored, or None if it can."""
    name = NAME.get(dtype, str(dtype))
    if name.startswith(("qint", "quint")):
        return "quantized dtype %s (dequantize it first)" % name
    if name in ("uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
                "int1", "int2", "int3", "int4", "int5", "int6", "int7"):
        return "sub-byte dtype %s (pack it into a byte dtype first)" % name
    return None


def storable_dtypes():
    """Every dtype of the installed torch that save() accepts."""
    out = []
    for dtype in NAME:
        if refusal(dtype) is None:
            try:
                with warnings.catch_warnings():  # "ComplexHalf ... experimental"
                    warnings.simplefilter("ignore")
                    torch.empty(1, dtype=dtype)
            except (RuntimeError, TypeError):
                continue
            out.append(dtype)
    return out


def dtype_name(dtype):
    """The canonical name of a torch dtype ("bfloat16")."""
    return NAME.get(dtype) or str(dtype).split(".", 1)[-1]


def desc(name, t, what=None):
    """The TensorDesc of a contiguous CPU or CUDA tensor t, named `name`
    (bytes). A dtype ckptd lacks, or more dimensions than it takes, is
    described as the tensor's raw bytes (flat uint8 over the same memory);
    the caller records what it really is. ValueError names `what` (or the
    name) for a tensor that cannot be described."""
    what = what or name
    if not t.is_contiguous():
        raise ValueError("%s: not contiguous" % what)
    if t.device.type == "cuda":
        device = t.device.index
        if device is None:
            device = torch.cuda.current_device()
    elif t.device.type == "cpu":
        device = -1
    else:
        raise ValueError("%s: on %s (cpu or cuda only)" % (what, t.device))
    code = NATIVE.get(t.dtype)
    if code is None or t.dim() > _MAX_DIMS:
        code, shape = CKPT_UINT8, (t.numel() * t.element_size(),)
    else:
        shape = tuple(int(d) for d in t.shape)
    return _client.TensorDesc(name, code, shape, t.data_ptr(), device)


def wait_for_producers(tensors):
    """Orders what follows after the kernels queued on torch's current
    stream of every CUDA device among tensors: records an event there and
    waits for it (torch releases the GIL while waiting)."""
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    for device in devices:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        event.synchronize()


class Piece:
    """A tensor saved as one piece of a global tensor: the box
    [offsets, offsets + tensor.shape) of a tensor of global_shape, named
    global_name (None: the tensor's own key path). Put it in a state_dict
    where the tensor would be, for save() and for load() (which then checks
    that the step holds this very piece)."""

    __slots__ = ("tensor", "global_shape", "offsets", "global_name")

    def __init__(self, tensor, global_shape, offsets, global_name=None):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("tensor: a torch.Tensor, not %s"
                            % type(tensor).__name__)
        self.tensor = tensor
        self.global_shape = tuple(global_shape)
        self.offsets = tuple(offsets)
        if global_name is not None and not isinstance(global_name, str):
            raise TypeError("global_name: a str or None, not %s"
                            % type(global_name).__name__)
        self.global_name = global_name

    def __repr__(self):
        return "Piece(shape=%s, global_shape=%s, offsets=%s, global_name=%r)" % (
            list(self.tensor.shape), list(self.global_shape),
            list(self.offsets), self.global_name)


def _loaded_class(modules, name):
    # Only a module the caller imported can have made the object: nothing
    # is imported here (torch 1.13's _shard does not import on Python 3.11
    # without ckpt.torch.torch113_compat).
    for module in modules:
        m = sys.modules.get(module)
        cls = getattr(m, name, None) if m is not None else None
        if cls is not None:
            return cls
    return None


def _dtensor_piece(value, path):
    placements = tuple(value.placements)
    for p in placements:
        if type(p).__name__ in ("Partial", "_Partial"):
            raise ValueError(
                "%s: a DTensor with a Partial placement is not a piece of a "
                "value (redistribute it to Shard or Replicate first)" % path)
    local = value.to_local()
    global_shape = tuple(int(d) for d in value.shape)
    if all(type(p).__name__ == "Replicate" for p in placements):
        offsets = (0,) * len(global_shape)
    else:
        compute = None
        for module in ("torch.distributed.tensor._utils",
                       "torch.distributed._tensor._utils"):
            try:
                compute = getattr(__import__(module, fromlist=["x"]),
                                  "compute_local_shape_and_global_offset")
                break
            except (ImportError, AttributeError):
                continue
        if compute is None:
            raise ValueError("%s: this torch has no "
                             "compute_local_shape_and_global_offset to place "
                             "the DTensor's local piece" % path)
        shape, offsets = compute(value.shape, value.device_mesh, placements)
        offsets = tuple(int(o) for o in offsets)
        if tuple(int(d) for d in shape) != tuple(local.shape):
            raise ValueError("%s: DTensor local shape %s, its placements "
                             "give %s" % (path, list(local.shape),
                                          list(shape)))
    return local, global_shape, offsets


def placed(value, path):
    """(local tensor, global_shape, offsets, global_name or None) when value
    is a Piece, a DTensor or a ShardedTensor; None for anything else.
    ValueError names path when the value cannot be one piece."""
    if isinstance(value, Piece):
        return (value.tensor, value.global_shape, value.offsets,
                value.global_name)
    dtensor = _loaded_class(("torch.distributed.tensor._api",
                             "torch.distributed._tensor.api",
                             "torch.distributed.tensor"), "DTensor")
    if dtensor is not None and isinstance(value, dtensor):
        local, global_shape, offsets = _dtensor_piece(value, path)
        return local, global_shape, offsets, None
    sharded = _loaded_class(("torch.distributed._shard.sharded_tensor.api",),
                            "ShardedTensor")
    if sharded is not None and isinstance(value, sharded):
        shards = value.local_shards()
        if len(shards) != 1:
            raise ValueError(
                "%s: a ShardedTensor with %d local shards on this rank (one "
                "is supported; pass several as ckpt.torch.Piece values)"
                % (path, len(shards)))
        meta = shards[0].metadata
        return (shards[0].tensor, tuple(int(d) for d in value.size()),
                tuple(int(o) for o in meta.shard_offsets), None)
    return None
