"""A state_dict as tensors plus a skeleton: the safe encoding of the rest.

flatten() walks a nested state_dict (dict/OrderedDict, list, tuple, tensors,
int, float, bool, str, None) and returns the tensors with their shard names
and key paths, and the skeleton: the structure with every tensor replaced by
a reference, as UTF-8 JSON (never pickle). unflatten() rebuilds the
structure from the skeleton, taking each tensor from a callback.

Skeleton nodes (JSON): null/true/false, an int, a str; {"f": float.hex()}
(exact, inf and nan included); {"d": [[key, value], ...]} a dict ("o": 1 an
OrderedDict) whose keys are scalar nodes; {"l": [...]} a list; {"t": [...]}
a tuple; {"T": i} the i-th entry of "tensors" (name, path, dtype, shape).

Shard names: the key path's components joined by "/": a str key is
percent-encoded (every byte outside printable ASCII, and "%", "/", "#", is
%XX; "" is "%e"); an int key or index is "#<int>"; other scalar keys are
"#True", "#False", "#None", "#f<hex>". The mapping is injective: components
never contain "/", and the three kinds cannot be confused. A name over 159
bytes (ckpt.h's limit) becomes "%h" + 32 hex digits of its SHA-256 + "~" +
its last 120 bytes. Names starting "%c" are reserved for the package.
"""

import collections
import functools
import hashlib
import json
import re

import torch

from .. import _client, errors
from . import _tensors

FORMAT = "ckpt.torch/1"
MAX_NAME = 159
_SAFE = frozenset(range(0x21, 0x7F)) - {ord("%"), ord("/"), ord("#")}


def _display_key(key):
    return "[%r]" % (key,)


# Bytes a str key keeps as they are: printable ASCII except % / #.
_UNSAFE = re.compile(r"[^\x21\x22\x24\x26-\x2e\x30-\x7e]")


# Keys repeat across a state_dict ("weight", "exp_avg", 0, 1, ...); typed,
# so True and 1 (equal, same hash) stay apart.
@functools.lru_cache(maxsize=1 << 16, typed=True)
def _component(key):
    if isinstance(key, str):
        if key == "":
            return "%e"
        if _UNSAFE.search(key) is None:
            return key
        data = key.encode("utf-8", "surrogatepass")
        return "".join(chr(b) if b in _SAFE else "%%%02X" % b for b in data)
    if isinstance(key, bool) or key is None:
        return "#%r" % (key,)
    if isinstance(key, int):
        return "#%d" % key
    return "#f" + key.hex()  # float


def shard_name(components):
    name = "/".join(components)
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(name.encode("ascii")).hexdigest()[:32]
        name = "%h" + digest + "~" + name[-120:]
    return name


class Flat:
    """The result of flatten(): tensors (name, path, tensor) and skeleton.

    layouts: name -> _client.Layout for the tensors that are pieces of a
    global tensor (a Piece, DTensor or ShardedTensor; the tensor in
    `tensors` is then its local tensor), and objects: name -> that value."""

    __slots__ = ("tensors", "skeleton", "layouts", "objects")

    def __init__(self):
        self.tensors = []
        self.skeleton = None
        self.layouts = {}
        self.objects = {}

    def skeleton_bytes(self):
        return json.dumps(self.skeleton, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")


_KEY_TYPES = (str, int, float, bool, type(None))


def _check_str(value, path):
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidArgument(
            "%s: a str that is not valid Unicode (a lone surrogate); it "
            "cannot be stored as UTF-8" % path) from None


def _key_node(key, path):
    if type(key) not in _KEY_TYPES:
        raise errors.InvalidArgument(
            "%s: a dict key of type %s; keys may be str, int, float, bool or "
            "None" % (path, type(key).__name__))
    if type(key) is str:
        _check_str(key, path + " (its key)")
    if type(key) is float:
        return {"f": key.hex()}
    return key


def _layout(t, layout, path):
    """The _client.Layout of local tensor t placed by (global_shape,
    offsets, global_name); InvalidArgument naming path when it cannot be."""
    global_shape, offsets, global_name = layout
    if t.dtype not in _tensors.NATIVE or t.dim() > _tensors._MAX_DIMS:
        raise errors.InvalidArgument(
            "%s: dtype %s with %d dims is stored as raw bytes, which cannot "
            "carry a layout" % (path, _tensors.dtype_name(t.dtype), t.dim()))
    if t.dim() == 0:
        raise errors.InvalidArgument(
            "%s: a scalar cannot be a piece of a global tensor" % path)
    for what, dims in (("global_shape", global_shape), ("offsets", offsets)):
        if len(dims) != t.dim() or any(
                type(d) is not int or d < 0 for d in dims):
            raise errors.InvalidArgument(
                "%s: %s %r is not %d non-negative ints (the tensor's dims)"
                % (path, what, list(dims), t.dim()))
    for d, (g, o, n) in enumerate(zip(global_shape, offsets, t.shape)):
        if o + n > g:
            raise errors.InvalidArgument(
                "%s: offsets[%d] %d + length %d exceed global_shape[%d] %d"
                % (path, d, o, n, d, g))
    name = b""
    if global_name is not None:
        try:
            name = global_name.encode("ascii")
        except UnicodeEncodeError:
            raise errors.InvalidArgument(
                "%s: global_name %.60r is not ASCII" % (path, global_name)
            ) from None
    return _client.Layout(tuple(global_shape), tuple(offsets), name)


def flatten(state_dict, root="state_dict", lenient=False):
    """Flat of state_dict; InvalidArgument names the key path of a refusal.

    lenient (for a load's target): a value of another type is skipped (its
    node is null) instead of refused; only the tensors matter there."""
    if type(state_dict) not in (dict, collections.OrderedDict):
        raise errors.InvalidArgument(
            "%s: a dict, not %s" % (root, type(state_dict).__name__))
    flat = Flat()
    entries = []
    seen = {}

    def walk(value, path, components):
        kind = type(value)
        if kind is str:
            _check_str(value, path)
            return value
        if value is None or kind is bool:
            return value
        if kind is int:
            return value
        if kind is float:
            return {"f": value.hex()}
        if kind is torch.Tensor or kind is torch.nn.Parameter:
            return tensor(value, path, components)
        if isinstance(value, torch.Tensor) or kind is _tensors.Piece:
            try:
                piece = _tensors.placed(value, path)
            except ValueError as e:
                raise errors.InvalidArgument(str(e)) from None
            if piece is None:
                return tensor(value, path, components)
            return tensor(piece[0], path, components, piece[1:], value)
        if kind in (dict, collections.OrderedDict):
            items = []
            for k, v in value.items():
                sub = path + _display_key(k)
                if lenient and type(k) not in _KEY_TYPES:
                    continue
                items.append([_key_node(k, sub),
                              walk(v, sub, components + [_component(k)])])
            node = {"d": items}
            if kind is collections.OrderedDict:
                node["o"] = 1
            return node
        if kind in (list, tuple):
            items = [walk(v, "%s[%d]" % (path, i), components + ["#%d" % i])
                     for i, v in enumerate(value)]
            return {"l" if kind is list else "t": items}
        if lenient:
            return None
        raise errors.InvalidArgument(
            "%s: an object of type %s.%s cannot be saved (ckpt stores "
            "tensors, dict, list, tuple, int, float, bool, str and None; "
            "never pickle)" % (path, kind.__module__, kind.__qualname__))

    def tensor(t, path, components, layout=None, obj=None):
        why = _tensors.refusal(t.dtype)
        if why is not None:
            raise errors.InvalidArgument("%s: %s" % (path, why))
        if t.layout != torch.strided:
            raise errors.InvalidArgument(
                "%s: a %s tensor; only dense (strided) tensors can be saved"
                % (path, t.layout))
        if t.is_quantized:
            raise errors.InvalidArgument("%s: a quantized tensor" % path)
        if t.device.type not in ("cpu", "cuda"):
            raise errors.InvalidArgument(
                "%s: on device %s; only cpu and cuda tensors can be saved"
                % (path, t.device))
        name = shard_name(components)
        if name in seen:
            raise errors.InvalidArgument(
                "%s: its shard name %r is that of %s too" %
                (path, name, seen[name]))
        seen[name] = path
        index = len(entries)
        entry = {"name": name, "path": path, "dtype": _tensors.NAME[t.dtype],
                 "shape": list(t.shape)}
        if layout is not None:
            flat.layouts[name] = _layout(t, layout, path)
            flat.objects[name] = obj
            entry["global_shape"] = list(layout[0])
            entry["offsets"] = list(layout[1])
        entries.append(entry)
        flat.tensors.append((name, path, t))
        return {"T": index}

    flat.skeleton = {"format": FORMAT,
                     "root": walk(state_dict, root, []),
                     "tensors": entries}
    return flat


def parse_skeleton(data, what):
    """The skeleton dict from its bytes; DataLoss naming `what` if bad."""
    try:
        skeleton = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise errors.DataLoss("%s: not UTF-8 JSON (%s)" % (what, e)) from None
    if not isinstance(skeleton, dict) or skeleton.get("format") != FORMAT:
        raise errors.DataLoss("%s: format is not %s" % (what, FORMAT))
    tensors = skeleton.get("tensors")
    if not isinstance(tensors, list):
        raise errors.DataLoss("%s: no tensor table" % what)
    for i, e in enumerate(tensors):
        ok = (isinstance(e, dict) and isinstance(e.get("name"), str)
              and isinstance(e.get("path"), str)
              and e.get("dtype") in _tensors.BY_NAME
              and isinstance(e.get("shape"), list)
              and all(type(d) is int and d >= 0 for d in e["shape"]))
        if not ok:
            name = e.get("dtype") if isinstance(e, dict) else None
            if isinstance(e, dict) and isinstance(name, str) and \
                    name not in _tensors.BY_NAME:
                raise errors.FailedPrecondition(
                    "%s: tensors[%d] (%s) has dtype %s, which this torch %s "
                    "lacks" % (what, i, str(e.get("path"))[:200], name[:40],
                               torch.__version__))
            raise errors.DataLoss("%s: tensors[%d] is malformed" % (what, i))
    return skeleton


def unflatten(skeleton, tensor_for, what):
    """The structure of a skeleton; tensor_for(i) gives the i-th tensor."""
    count = len(skeleton["tensors"])

    def bad(node):
        return errors.DataLoss("%s: malformed node %.80r" % (what, node))

    def scalar(node):
        if node is None or type(node) in (bool, int, str):
            return node
        if type(node) is dict and set(node) == {"f"} and \
                isinstance(node["f"], str):
            try:
                return float.fromhex(node["f"])
            except ValueError:
                raise bad(node) from None
        raise bad(node)

    def build(node, depth):
        if depth > 200:  # well inside Python's recursion limit
            raise errors.DataLoss("%s: nested too deeply" % what)
        if type(node) is not dict or "f" in node:
            return scalar(node)
        if "T" in node:
            i = node["T"]
            if type(i) is not int or not 0 <= i < count:
                raise bad(node)
            return tensor_for(i)
        if "d" in node:
            kind = collections.OrderedDict if node.get("o") else dict
            items = node["d"]
            if type(items) is not list:
                raise bad(node)
            out = kind()
            for item in items:
                if type(item) is not list or len(item) != 2:
                    raise bad(node)
                out[scalar(item[0])] = build(item[1], depth + 1)
            return out
        for tag, kind in (("l", list), ("t", tuple)):
            if tag in node:
                if type(node[tag]) is not list:
                    raise bad(node)
                return kind(build(v, depth + 1) for v in node[tag])
        raise bad(node)

    return build(skeleton.get("root"), 0)

