"""Client: one connection to ckptd through the C API, torch-free.

Tensors are passed as ``TensorDesc`` tuples (name bytes, ckpt dtype code,
shape tuple, data address, device: -1 host, N cuda:N). ``Packed`` turns a
list of them into one C array (plus one array holding every shape), so each
save or restore is a single foreign call; ctypes releases the GIL for it.
A tensor that is a piece of a global tensor has a ``Layout`` (global shape,
offsets, global name bytes; doc/resharding.md) beside its descriptor.

Thread-safety: as ckpt.h's: a Client may be used from several threads; a
SaveHandle from one.
"""

import collections
import ctypes

from . import _lib, errors

TensorDesc = collections.namedtuple(
    "TensorDesc", ["name", "dtype", "shape", "data", "device"])

Layout = collections.namedtuple(
    "Layout", ["global_shape", "offsets", "global_name"])

_OPTION_FIELDS = {
    "slot_bytes": int, "num_slots": int, "block_when_busy": bool,
    "copy_threads": int, "slot_headroom": float, "busy_timeout_s": float,
}


class Packed:
    """A C array of ckpt_tensor and the buffers it points into; with
    layouts (a Layout or None per descriptor, not all None) also the
    array of ckpt_tensor_layout."""

    __slots__ = ("array", "count", "layouts", "_shapes", "_names", "_dims",
                 "_global_names")

    def __init__(self, descs, layouts=None):
        n = len(descs)
        dims = [d for desc in descs for d in desc.shape]
        self._shapes = (ctypes.c_int64 * max(1, len(dims)))(*dims)
        self._names = [desc.name for desc in descs]
        self.count = n
        base = ctypes.addressof(self._shapes)
        rows = []
        offset = 0
        for name, dtype, shape, data, device in descs:
            ndim = len(shape)
            rows.append((name, dtype, ndim, base + 8 * offset, data or None,
                         device))
            offset += ndim
        # One constructor call fills the array from tuples (faster than
        # setting fields through a proxy per element).
        self.array = (_lib.CTensor * max(1, n))(*rows)
        self.layouts = None
        if layouts is not None and any(l is not None for l in layouts):
            self._pack_layouts(layouts)

    def _pack_layouts(self, layouts):
        dims = []
        for l in layouts:
            if l is not None:
                dims.extend(l.global_shape)
                dims.extend(l.offsets)
        self._dims = (ctypes.c_int64 * max(1, len(dims)))(*dims)
        self._global_names = [l.global_name if l else None for l in layouts]
        base = ctypes.addressof(self._dims)
        rows, offset = [], 0
        for l in layouts:
            if l is None or not l.global_shape:
                rows.append((None, None, None))
                continue
            nd = len(l.global_shape)
            rows.append((base + 8 * offset, base + 8 * (offset + nd),
                         l.global_name or None))
            offset += 2 * nd
        self.layouts = (_lib.CTensorLayout * max(1, len(rows)))(*rows)


def _integer(value, field, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidArgument(
            "%s: an int, not %s" % (field, type(value).__name__))
    if not lo <= value <= hi:
        raise errors.InvalidArgument(
            "%s: %d is not in [%d, %d]" % (field, value, lo, hi))
    return value


def resolve_rank(rank=None, world_size=None):
    """(rank, world_size, local_rank or None) as libckpt decides them for
    every front end (ckpt_resolve_rank): a None comes from $RANK /
    $WORLD_SIZE; neither given nor set (no launcher) is rank 0 of 1.
    InvalidArgument names a bad argument or variable."""
    lib = _lib.lib()
    r = ctypes.c_int(-1 if rank is None else
                     _integer(rank, "rank", 0, 2**31 - 1))
    w = ctypes.c_int(-1 if world_size is None else
                     _integer(world_size, "world_size", 1, 2**31 - 1))
    local = ctypes.c_int(-1)
    _lib.check(lib.ckpt_resolve_rank(ctypes.byref(r), ctypes.byref(w),
                                     ctypes.byref(local)),
               "resolve_rank")
    return r.value, w.value, (local.value if local.value >= 0 else None)


def _options(job, socket, rank, world_size, options):
    lib = _lib.lib()
    o = _lib.COptions()
    lib.ckpt_options_init(ctypes.byref(o))
    integer = _integer

    def text(value, field):
        if value is None:
            return None
        if not isinstance(value, str):
            raise errors.InvalidArgument(
                "%s: a str, not %s" % (field, type(value).__name__))
        if "\0" in value:
            raise errors.InvalidArgument("%s: contains a NUL character" % field)
        return value.encode("utf-8")

    o.socket_path = text(socket, "socket")
    o.job = text(job, "job")
    if rank is not None:
        o.rank = integer(rank, "rank", 0, 2**31 - 1)
    if world_size is not None:
        o.world_size = integer(world_size, "world_size", 1, 2**31 - 1)
    for key, value in options.items():
        kind = _OPTION_FIELDS.get(key)
        if kind is None:
            raise errors.InvalidArgument(
                "%s: not an option (options: %s)"
                % (key, ", ".join(sorted(_OPTION_FIELDS))))
        if kind is bool:
            o.block_when_busy = 1 if value else 0
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise errors.InvalidArgument(
                    "%s: a number, not %s" % (key, type(value).__name__))
            if key == "busy_timeout_s":
                if not 0 <= value < 2**32 / 1000:
                    raise errors.InvalidArgument(
                        "busy_timeout_s: %r is not in [0, 2^32 ms)" % value)
                o.busy_timeout_ms = int(value * 1000)
            else:
                o.slot_headroom = float(value)  # C checks the range
        else:
            setattr(o, key, integer(value, key, 0, 2**63 - 1
                                    if key == "slot_bytes" else 2**31 - 1))
    # The strings must outlive the call: keep them with the struct.
    return o


def _save_options(rewind):
    """A ckpt_save_options; rewind must be a bool (see ckpt_save_ex)."""
    if not isinstance(rewind, bool):
        raise errors.InvalidArgument(
            "rewind: a bool, not %s" % type(rewind).__name__)
    o = _lib.CSaveOptions()
    _lib.lib().ckpt_save_options_init(ctypes.byref(o))
    o.rewind = 1 if rewind else 0
    return o


class SaveHandle:
    """The progress of one save_async (ckpt_save_handle)."""

    def __init__(self, handle, keepalive, what):
        self._handle = handle
        self._keepalive = keepalive  # the source buffers, until copied
        self._what = what
        self._copied = None  # None: not waited; else the Error or True
        self._done = None

    def wait_copied(self):
        """Blocks until every tensor has been read; the sources may change."""
        if self._copied is None:
            if self._handle is None:
                self._copied = True
            else:
                try:
                    _lib.check(_lib.lib().ckpt_wait_copied(self._handle),
                               self._what)
                    self._copied = True
                except errors.Error as e:
                    self._copied = e
                self._keepalive = None
        if self._copied is not True:
            raise self._copied

    def wait(self):
        """Blocks until the daemon holds the step; frees the C handle."""
        if self._done is None:
            handle, self._handle = self._handle, None
            try:
                if handle is not None:
                    _lib.check(_lib.lib().ckpt_wait(handle), self._what)
                self._done = True
            except errors.Error as e:
                self._done = e
            self._keepalive = None
            if self._copied is None:
                self._copied = self._done
        if self._done is not True:
            raise self._done

    @property
    def done(self):
        return self._done is not None

    def __del__(self):
        # An abandoned handle is waited for: the C handle owns a thread's
        # work and the sources must stay alive until it has read them.
        if getattr(self, "_handle", None) is not None:
            try:
                self.wait()
            except Exception:  # noqa: BLE001 - a finaliser cannot report
                pass


class Client:
    """ckpt_client: connect, save, save_async, restore, latest, durable."""

    def __init__(self, job=None, socket=None, rank=None, world_size=None,
                 **options):
        lib = _lib.lib()
        o = _options(job, socket, rank, world_size, options)
        out = ctypes.c_void_p()
        _lib.check(lib.ckpt_connect(ctypes.byref(o), ctypes.byref(out)),
                   "connect")
        self._client = out

    def close(self):
        """Finishes every queued save, then disconnects (idempotent)."""
        client, self._client = getattr(self, "_client", None), None
        if client is not None:
            _lib.lib().ckpt_close(client)

    def _live(self):
        if self._client is None:
            raise errors.FailedPrecondition("the client is closed")
        return self._client

    def save(self, step, packed, rewind=False):
        o = _save_options(rewind)
        if packed.layouts is None:
            status = _lib.lib().ckpt_save_ex(self._live(), step, packed.array,
                                             packed.count, ctypes.byref(o))
        else:
            status = _lib.layout_function("ckpt_save_layout")(
                self._live(), step, packed.array, packed.layouts, packed.count,
                ctypes.byref(o))
        _lib.check(status, "save step %d" % step)

    def save_async(self, step, packed, keepalive, rewind=False):
        o = _save_options(rewind)
        out = ctypes.c_void_p()
        if packed.layouts is None:
            status = _lib.lib().ckpt_save_async_ex(
                self._live(), step, packed.array, packed.count,
                ctypes.byref(o), ctypes.byref(out))
        else:
            status = _lib.layout_function("ckpt_save_async_layout")(
                self._live(), step, packed.array, packed.layouts, packed.count,
                ctypes.byref(o), ctypes.byref(out))
        _lib.check(status, "save_async step %d" % step)
        return SaveHandle(out, keepalive, "save_async step %d" % step)

    def restore(self, step, packed, report=False):
        """Restores packed's tensors; a tensor given a layout must have
        been saved with it. report=True returns, per tensor, the Layout it
        was saved with (None: saved whole)."""
        if packed.layouts is None and (
                not report or
                getattr(_lib.lib(), "ckpt_restore_layout", None) is None):
            _lib.check(_lib.lib().ckpt_restore(self._live(), step,
                                               packed.array, packed.count),
                       "restore step %d" % step)
            return [None] * packed.count if report else None
        saved = (_lib.CSavedLayout * max(1, packed.count))() if report \
            else None
        _lib.check(_lib.layout_function("ckpt_restore_layout")(
            self._live(), step, packed.array, packed.layouts, packed.count,
            saved), "restore step %d" % step)
        if not report:
            return None
        out = []
        for i in range(packed.count):
            s = saved[i]
            if not s.has_layout:
                out.append(None)
                continue
            nd = s.ndim
            out.append(Layout(tuple(s.global_shape[:nd]),
                              tuple(s.offsets[:nd]), s.global_name))
        return out

    def restore_latest(self, packed):
        """Restores the newest step whose copies verify; returns it."""
        step = ctypes.c_int64(-1)
        _lib.check(_lib.lib().ckpt_restore_latest(
            self._live(), packed.array, packed.count, ctypes.byref(step)),
            "restore of the latest step")
        return step.value

    def latest_step(self):
        step = ctypes.c_int64(-1)
        status = _lib.lib().ckpt_latest_step(self._live(), ctypes.byref(step))
        _lib.check(status, "latest_step")
        return step.value

    def wait_durable(self, step, timeout_ms):
        _lib.check(_lib.lib().ckpt_wait_durable(self._live(), step,
                                                timeout_ms),
                   "wait_durable step %d" % step)

    def progress(self, step, compute_s):
        _lib.check(_lib.lib().ckpt_progress(self._live(), step, compute_s),
                   "progress step %d" % step)

    def expect_pause(self, seconds, reason):
        _lib.check(_lib.lib().ckpt_expect_pause(self._live(), seconds,
                                                reason.encode("utf-8")),
                   "expect_pause")

    def last_save_stats(self):
        stats = _lib.CSaveStats()
        _lib.check(_lib.lib().ckpt_last_save_stats(self._live(),
                                                   ctypes.byref(stats)),
                   "last_save_stats")
        return {f: getattr(stats, f) for f, _ in stats._fields_}

    def last_restore_stats(self):
        """What the last restore read: bytes (asked for), bytes_read
        (saved bytes copied or hashed), saved_ranks, resharded."""
        stats = _lib.CRestoreStats()
        _lib.check(_lib.layout_function("ckpt_last_restore_stats")(
            self._live(), ctypes.byref(stats)), "last_restore_stats")
        return {"bytes": stats.bytes, "bytes_read": stats.bytes_read,
                "saved_ranks": stats.saved_ranks,
                "resharded": bool(stats.resharded)}

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finaliser cannot report
            pass
