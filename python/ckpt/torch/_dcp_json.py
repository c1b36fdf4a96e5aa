"""DCP Metadata as JSON: the plugin's checkpoint index, never pickle.

torch.distributed.checkpoint's ``Metadata`` (and what it holds: the
tensor/bytes storage metadata, chunks, ``MetadataIndex`` keys, the planner's
``planner_data``, ``StorageMeta``, our ``StorageLocation`` values) is turned
into plain JSON by ``encode`` and back by ``decode``. Only the dataclasses
of ``_CLASSES`` (looked up in the installed torch; 1.13 and 2.x differ) and
the JSON-able scalars and containers below are accepted; any other object
is refused with a ValueError naming its path, on encode and on decode, so
reading a checkpoint never runs code chosen by its bytes.

Nodes: null/true/false, int, str; {"f": float.hex()}; {"l": [...]} a list;
{"u": [...]} a tuple; {"d": [[key, value], ...]} a dict; {"S": [...]} a
torch.Size; {"y": "float32"} a torch.dtype; {"L": "strided"} a torch.layout;
{"M": "contiguous_format"} a torch.memory_format; {"c": "Name", "v": {field:
node}} a dataclass of _CLASSES. Pure functions, thread-safe.
"""

import dataclasses
import json
import os

import torch

FORMAT = "ckptd-dcp/1"
_MAX_DEPTH = 64


@dataclasses.dataclass(frozen=True)
class StorageLocation:
    """Where one DCP storage item lives in ckptd: the shard of ``rank`` of the
    step, tensor ``name``. ``kind``: "tensor" (stored as itself), "raw" (a
    tensor of a dtype ckptd lacks, stored as its bytes) or "bytes" (a BytesIO
    item, stored as uint8). ``dtype``/``shape`` are those of the item.

    ``global_name`` (not empty): the item was saved as a piece of the
    global tensor ``global_name`` of ``global_shape``, at ``offsets``
    (ckptd's layout, doc/resharding.md), so a load reads any region of it
    through the restore into another layout. Empty (every item saved
    before layouts, and raw, bytes, 0-d or empty items): restored whole by
    ``name`` from the shard of ``rank``."""
    rank: int
    name: str
    kind: str
    dtype: str
    shape: tuple
    global_name: str = ""
    global_shape: tuple = ()
    offsets: tuple = ()


def _dcp_classes():
    out = {"StorageLocation": StorageLocation}
    mods = []
    try:
        import torch.distributed.checkpoint.metadata as m  # torch >= 2.0
        mods.append(m)
    except ImportError:
        import torch.distributed._shard.checkpoint.metadata as m  # torch 1.13
        mods.append(m)
        from torch.distributed._shard.sharded_tensor import metadata as st
        mods.append(st)
    for mod in mods:
        for name in ("Metadata", "MetadataIndex", "ChunkStorageMetadata",
                     "TensorStorageMetadata", "BytesStorageMetadata",
                     "TensorProperties", "StorageMeta"):
            cls = getattr(mod, name, None)
            if cls is not None and dataclasses.is_dataclass(cls):
                out.setdefault(name, cls)
    return out


_CLASSES = _dcp_classes()


def _torch_attr(kind, name, path):
    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, kind):
        raise ValueError("%s: %r is not a %s of this torch" % (path, str(name)[:40], kind.__name__))
    return value


def _enc(obj, path, depth):
    if depth > _MAX_DEPTH:
        raise ValueError("%s: nested deeper than %d" % (path, _MAX_DEPTH))
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return {"f": obj.hex()}
    if isinstance(obj, torch.Size):
        return {"S": [int(d) for d in obj]}
    if isinstance(obj, torch.dtype):
        return {"y": str(obj).split(".", 1)[-1]}
    if isinstance(obj, torch.layout):
        return {"L": str(obj).split(".", 1)[-1]}
    if isinstance(obj, torch.memory_format):
        return {"M": str(obj).split(".", 1)[-1]}
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, list):
        return {"l": [_enc(v, "%s[%d]" % (path, i), depth + 1) for i, v in enumerate(obj)]}
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return {"u": [_enc(v, "%s[%d]" % (path, i), depth + 1) for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        items = []
        for i, (k, v) in enumerate(obj.items()):
            kp = "%s.key[%d]" % (path, i)
            items.append([_enc(k, kp, depth + 1), _enc(v, "%s[%r]" % (path, _short(k)), depth + 1)])
        return {"d": items}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = type(obj).__name__
        if _CLASSES.get(name) is not type(obj):
            raise ValueError("%s: a %s cannot be stored without pickle" % (path, name))
        fields = {}
        for f in dataclasses.fields(obj):
            if f.init:
                fields[f.name] = _enc(getattr(obj, f.name), "%s.%s" % (path, f.name), depth + 1)
        return {"c": name, "v": fields}
    raise ValueError("%s: a %s cannot be stored without pickle" % (path, type(obj).__name__))


def _short(key):
    return key[:40] if isinstance(key, str) else key


def _dec(node, path, depth):
    if depth > _MAX_DEPTH:
        raise ValueError("%s: nested deeper than %d" % (path, _MAX_DEPTH))
    if node is None or isinstance(node, (bool, str, int)):
        return node
    if not isinstance(node, dict) or len(node) not in (1, 2):
        raise ValueError("%s: not a node of %s" % (path, FORMAT))
    if len(node) == 2:
        name, fields = node.get("c"), node.get("v")
        cls = _CLASSES.get(name) if isinstance(name, str) else None
        if cls is None or not isinstance(fields, dict):
            raise ValueError("%s: unknown class %r" % (path, str(name)[:40]))
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        kwargs = {}
        for k, v in fields.items():
            if k not in known:
                raise ValueError("%s: %s has no field %r" % (path, name, k[:40]))
            kwargs[k] = _dec(v, "%s.%s" % (path, k), depth + 1)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError("%s: %s: %s" % (path, name, e)) from None
    (tag, v), = node.items()
    if tag == "f" and isinstance(v, str):
        try:
            return float.fromhex(v)
        except ValueError:
            raise ValueError("%s: bad float %r" % (path, v[:40])) from None
    if tag in ("l", "u", "S") and isinstance(v, list):
        if tag == "S":
            if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v):
                raise ValueError("%s: a torch.Size of non-negative ints" % path)
            return torch.Size(v)
        out = [_dec(x, "%s[%d]" % (path, i), depth + 1) for i, x in enumerate(v)]
        return out if tag == "l" else tuple(out)
    if tag == "d" and isinstance(v, list):
        out = {}
        for i, pair in enumerate(v):
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError("%s: entry %d is not a [key, value] pair" % (path, i))
            k = _dec(pair[0], "%s.key[%d]" % (path, i), depth + 1)
            try:
                hash(k)
            except TypeError:
                raise ValueError("%s.key[%d]: not hashable" % (path, i)) from None
            out[k] = _dec(pair[1], "%s[%r]" % (path, _short(k)), depth + 1)
        return out
    if tag == "y":
        return _torch_attr(torch.dtype, v, path)
    if tag == "L":
        return _torch_attr(torch.layout, v, path)
    if tag == "M":
        return _torch_attr(torch.memory_format, v, path)
    raise ValueError("%s: not a node of %s" % (path, FORMAT))


def encode(metadata):
    """Metadata -> UTF-8 JSON bytes; ValueError names what cannot be stored."""
    doc = {"format": FORMAT, "metadata": _enc(metadata, "metadata", 0)}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")


def decode(data):
    """UTF-8 JSON bytes -> Metadata; ValueError names the bad field."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError("dcp metadata: not UTF-8 JSON: %s" % str(e)[:80]) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError("dcp metadata: format %r, expected %r" % (str(got)[:40], FORMAT))
    md = _dec(doc.get("metadata"), "metadata", 0)
    if type(md) is not _CLASSES["Metadata"]:
        raise ValueError("dcp metadata: the root is a %s, not a Metadata" % type(md).__name__)
    return md
