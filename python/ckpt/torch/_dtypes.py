"""torch dtypes and how each is stored in a shard.

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

CKPT_UINT8 = 6

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
