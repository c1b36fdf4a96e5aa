"""How a torch tensor meets libckpt: the one place for every front end
(Checkpointer, the DCP plugin).

- The dtype table: torch dtype -> ckpt_dtype code, canonical names.
- desc(): the C descriptor (ckpt._client.TensorDesc) of a contiguous tensor.
- wait_for_producers(): orders libckpt's copies after the kernels that
  wrote (or will read) CUDA tensors.


The ten dtypes ckpt.h knows are stored as themselves (ckptctl shows them).
Every other dtype the installed torch has (complex, uint16/32/64, the float8
variants, ...) is stored as its raw bytes, a flat uint8 tensor; the
skeleton records the real dtype and shape, so it comes back bit for bit.
Quantized dtypes (their bytes alone do not describe their values) and the
sub-byte shell dtypes are refused.
"""

import functools
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
