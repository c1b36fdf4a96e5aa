"""ckpt.torch.resilient: a training function that survives its peers'
failures in its own process.

    def train(ctx):
        model = ...                                  # on every (re)start
        step = 0
        if ctx.restore_step is not None:
            ctx.checkpointer.load(ctx.restore_step, state)
            step = ctx.restore_step
        while step < steps:
            ...                                      # forward, backward
            dist.all_reduce(grads)                   # may raise RestartRequested
            ctx.checkpointer.save(step, state)       # so may every ckpt call

    ckpt.torch.resilient(train)

Under ckptrun ($CKPT_RESTART_DIR set) the process tells the launcher it
restarts in place (ckpt_restart_enable), and a monitor thread reads the
plan when ckptrun writes it (inotify). A newer generation's plan
aborts the process group at once (ckpt/torch/_abort.py), so a collective
blocked in it returns; RestartRequested is raised at the next collective
or ckpt call. resilient() then tears the group down, writes `joined`,
forms the group of the new generation (its rank, world size and
rendezvous from the plan; a new store per generation, served by rank 0,
or the store ckptrun serves for every generation when
$CKPT_RENDEZVOUS=launcher, python -m ckpt.torch.store_server), opens a new
Checkpointer and calls train(ctx) again with ctx.restore_step set.

In a warm process of ckptrun --warm ($CKPT_WARM=1, no rank yet) the
script's imports are done by the time it calls resilient(), which writes
`capable` and waits for the first plan: its rank, world, rendezvous and
restore step are the plan's. The script does nothing else for it.

A collective that breaks because a peer is gone (its process or node
died) writes the peer-lost note (ckpt/_peers.py) and waits for the plan
instead of exiting. Any other exception leaves resilient() as it came:
the process exits and ckptrun plans the failure. Outside ckptrun,
train(ctx) runs once.

Only one resilient() runs at a time in a process; it must be called from
the main thread of the process that owns the default process group.
"""

import datetime
import functools
import gc
import sys
import threading
import time

import torch
import torch.distributed as dist

from .. import _peers, _restart, errors
from .._restart import RestartRequested
from . import Checkpointer, _abort, _kick

__all__ = ["resilient", "Context", "RestartRequested"]

# The collectives of torch.distributed that become restart boundaries
# while resilient() runs (those this torch has).
_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
    "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor",
    "_reduce_scatter_base", "broadcast", "broadcast_object_list", "barrier",
    "monitored_barrier", "reduce", "gather", "gather_object", "scatter",
    "scatter_object_list", "all_to_all", "all_to_all_single", "send", "recv")

_active_lock = threading.Lock()
_active = None  # the _Monitor of the running resilient()


def _log(line):
    sys.stderr.write("ckpt.resilient: %s\n" % line)
    sys.stderr.flush()


def _phases_on():
    import os
    return os.environ.get("CKPT_RESILIENT_PHASES", "") not in ("", "0")


_PHASES = _phases_on()


def _phase(what, plan):
    """With $CKPT_RESILIENT_PHASES=1: one line per phase of a restart,
    stamped with the wall clock (time.time(), the clock of a shell's
    $EPOCHREALTIME), so that the time from a kill divides into phases
    (scripts/demo.sh prints the table)."""
    if _PHASES:
        _log("phase %s gen=%d rank=%d wall=%.6f"
             % (what, plan.generation, plan.rank, time.time()))


class _Generation:
    """One generation's process group, store and sockets. abort() may run
    on the monitor thread while the main thread is inside the group."""

    def __init__(self, plan):
        self.plan = plan
        self.store = None
        self.pg = None
        self._lock = threading.Lock()
        # A store the launcher serves has no server thread in this process:
        # its links are shut down with the group's, so that a rendezvous
        # blocked on a peer that never comes returns at once (no dying
        # rank 0 breaks it). A store rank 0 serves here is left alone.
        self._skip = None if _store_served() else plan.master_port
        self._before = _abort.tcp_sockets(self._skip)
        self._sockets = None  # fixed once formed
        self._closed = False
        self.aborted = False
        self.threads = set()  # the group's threads (gloo's loop, workers)

    def formed(self):
        with self._lock:
            self.pg = dist.group.WORLD
            self._sockets = self._new_sockets()

    def _new_sockets(self):
        now = _abort.tcp_sockets(self._skip)
        return {fd: ino for fd, ino in now.items()
                if self._before.get(fd) != ino}

    def abort(self):
        """Unblocks whatever waits in this generation's group. Idempotent;
        a no-op once the group is closed (its descriptors may be reused)."""
        with self._lock:
            if self._closed:
                return
            self.aborted = True
            sockets = self._sockets if self._sockets is not None \
                else self._new_sockets()
            _abort.shut_down(sockets)
            _abort.abort_group(self.pg)

    def close(self, abort):
        if abort:
            self.abort()
        with self._lock:
            self._closed = True
        try:
            with _kick.Kicker(self.threads):  # gloo's turns, at once
                _abort.drop_group(self.pg, self.aborted)
        finally:
            self.pg = None
            self.store = None


class _Monitor(threading.Thread):
    """Reads the plan when ckptrun writes it (inotify on
    $CKPT_RESTART_DIR, a re-read every second as a safety net; every
    period_s where the directory cannot be watched); on a newer
    generation aborts the current group."""

    def __init__(self, generation, period_s):
        super().__init__(name="ckpt-restart-monitor", daemon=True)
        self._lock = threading.Lock()
        self._newest = generation
        self._plan = None          # a plan newer than the running one
        self._current = None       # the _Generation to abort
        self._period = period_s
        self._halt = threading.Event()
        self.arrived = threading.Event()
        self._complained = None
        # Watched before the first read: a plan renamed in after that
        # read is an event the loop sees.
        self._watch = _DirWatch(_restart_dir())

    def run(self):
        while not self._halt.is_set():
            self.poll_once()
            if self._watch.ok:
                self._watch.wait(max(self._period, 1.0))
            else:
                self._halt.wait(self._period)

    def poll_once(self):
        try:
            plan = _restart.poll(self._newest)
        except errors.NotFound:
            return None
        except errors.Error as e:
            if str(e) != self._complained:  # ckptrun may rewrite it
                self._complained = str(e)
                _log("the plan is unreadable: %s" % e)
            return None
        if plan is None:
            return None
        with self._lock:
            # The main thread polls too (after a broken collective): the
            # second reader of the same plan must not hand it out again
            # once the first one's was taken.
            if plan.generation <= self._newest:
                return None
            self._newest = plan.generation
            self._plan = plan
            current = self._current
        _phase("plan_seen", plan)
        self.arrived.set()
        if current is not None:
            current.abort()
            _phase("aborted_by_monitor", plan)
        return plan

    def watch(self, generation):
        with self._lock:
            self._current = generation
            pending = self._plan is not None
        if pending:
            generation.abort()

    def pending(self):
        with self._lock:
            return self._plan

    def take(self):
        """Blocks until a newer plan is there, returns it."""
        while True:
            self.arrived.wait()
            with self._lock:
                plan, self._plan = self._plan, None
                self._current = None
                self.arrived.clear()
            if plan is not None:
                return plan

    def stop(self):
        self._halt.set()
        self._watch.wake()
        if self.is_alive():
            self.join()
        self._watch.close()  # the thread is done with it


def _restart_dir():
    import os
    return os.environ.get("CKPT_RESTART_DIR", "")


class _DirWatch:
    """inotify on a directory (IN_MOVED_TO, IN_CLOSE_WRITE: ckptrun
    renames each plan in) plus a pipe that wakes the waiter; ok False
    where it cannot be set up (the caller then polls)."""

    _IN_CLOSE_WRITE, _IN_MOVED_TO = 0x8, 0x80

    def __init__(self, path):
        import os
        self.ok, self._fd, self._wake = False, -1, None
        if not path:
            return
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1")
            self._fd = fd
            if libc.inotify_add_watch(fd, os.fsencode(path),
                                      self._IN_MOVED_TO | self._IN_CLOSE_WRITE) < 0:
                raise OSError(ctypes.get_errno(), "inotify_add_watch")
            self._wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        except (OSError, AttributeError) as e:
            _log("cannot watch %s (%s): reading the plan every period" % (path, e))
            self.close()
            return
        self.ok = True

    def wait(self, timeout_s):
        """Until an event, wake() or timeout_s; drains the events (a plan
        renamed in after this returns is a new event)."""
        import os
        import select
        p = select.poll()
        p.register(self._fd, select.POLLIN)
        p.register(self._wake[0], select.POLLIN)
        if not p.poll(timeout_s * 1e3):
            return
        for fd in (self._fd, self._wake[0]):
            try:
                while os.read(fd, 4096):
                    pass
            except BlockingIOError:
                pass

    def wake(self):
        import os
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"x")
            except OSError:
                pass  # full: it wakes anyway

    def close(self):
        import os
        fds = [self._fd] + list(self._wake or ())
        self._fd, self._wake, self.ok = -1, None, False
        for fd in fds:
            if fd >= 0:
                os.close(fd)


class _GenerationCheckpointer(Checkpointer):
    """ctx.checkpointer: every call is a restart boundary."""

    def __init__(self, monitor, **kw):
        self._monitor = monitor
        super().__init__(**kw)


def _boundary(name):
    inner = getattr(Checkpointer, name)

    @functools.wraps(inner)
    def call(self, *args, **kw):
        _check(self._monitor)
        return inner(self, *args, **kw)
    return call


for _name in ("save", "save_async", "load", "latest_step", "restore_step",
              "wait_durable", "progress", "expect_pause"):
    setattr(_GenerationCheckpointer, _name, _boundary(_name))


def _check(monitor):
    if monitor is None:
        return
    plan = monitor.pending()
    if plan is not None:
        raise RestartRequested("generation %d's plan arrived" % plan.generation,
                               plan.generation)


class Context:
    """What train(ctx) gets: rank, world_size, local_rank, generation,
    restore_step (None on a fresh start), checkpointer (a Checkpointer of
    this generation, None without $CKPT_SOCKET), restarts (how many
    in-process restarts came before); check() and sleep(seconds) are
    restart boundaries."""

    def __init__(self, plan, checkpointer, monitor, restarts):
        self.rank, self.world_size = plan.rank, plan.world_size
        self.local_rank, self.generation = plan.local_rank, plan.generation
        self.restore_step = plan.restore_step
        self.checkpointer = checkpointer
        self.restarts = restarts
        self._monitor = monitor

    @property
    def restart_requested(self):
        """True once a newer generation's plan has arrived."""
        return self._monitor is not None and self._monitor.pending() is not None

    def check(self):
        """Raises RestartRequested if a newer plan arrived: a boundary for
        a long stretch with no collective or ckpt call."""
        _check(self._monitor)

    def sleep(self, seconds):
        """time.sleep(seconds) that a restart cuts short: raises
        RestartRequested as soon as a newer generation's plan arrives (at
        once if one is there), so a pause (pacing, waiting for data) is
        not waited out by the survivors of a failure."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not seconds >= 0:
            raise errors.InvalidArgument(
                "seconds: a number >= 0, not %r" % (seconds,))
        _check(self._monitor)
        if self._monitor is None:
            time.sleep(seconds)
            return
        self._monitor.arrived.wait(seconds)
        _check(self._monitor)


def _wrap_collective(fn):
    @functools.wraps(fn)
    def collective(*args, **kw):
        monitor = _active
        if monitor is None:
            return fn(*args, **kw)
        _check(monitor)
        try:
            return fn(*args, **kw)
        except Exception as e:
            _check(monitor)
            if _peers.looks_like_lost_peer(e):
                raise RestartRequested("a collective broke on a lost peer: %s"
                                       % str(e)[:200]) from e
            raise
    collective.__ckpt_collective__ = fn
    return collective


def _install_collectives():
    for name in _COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None and not hasattr(fn, "__ckpt_collective__"):
            setattr(dist, name, _wrap_collective(fn))


def _uninstall_collectives():
    for name in _COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None and hasattr(fn, "__ckpt_collective__"):
            setattr(dist, name, fn.__ckpt_collective__)


def _wait_listening(plan, monitor, deadline):
    """Until the store listens (rank 0's, or the launcher's): TCPStore's
    own connect retries hold the GIL on torch 1.13, which would stall the
    monitor."""
    import socket
    import struct
    last = "no connect tried"
    probes = 0
    while True:
        probes += 1
        try:
            with socket.create_connection((plan.master_addr, plan.master_port),
                                          timeout=1.0) as s:
                if s.getsockname()[:2] != s.getpeername()[:2]:
                    return
                last = "a self-connect of the probe"
                # A port in the ephemeral range can be handed to the probe
                # itself: a TCP self-connect, not a listening store. Reset
                # rather than closed, so that no TIME_WAIT keeps rank 0
                # from binding the port.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                             struct.pack("ii", 1, 0))
        except OSError as e:
            last = "%s: %s" % (type(e).__name__, e)
        if monitor is not None and monitor.pending() is not None:
            raise RestartRequested("a newer plan during the rendezvous")
        if time.monotonic() > deadline:
            raise errors.DeadlineExceeded(
                "rendezvous of generation %d: %s:%d does not listen (%d "
                "probes; the last: %s)"
                % (plan.generation, plan.master_addr, plan.master_port,
                   probes, last))
        if monitor is not None:
            monitor.arrived.wait(0.01)
        else:
            time.sleep(0.01)


def _store_served():
    """Whether ckptrun serves the store of every generation
    ($CKPT_RENDEZVOUS=launcher, `ckptrun --rendezvous torch`): the
    trainers are its clients only, rank 0 included. Unset: rank 0 serves
    a new one in each generation."""
    import os
    value = os.environ.get("CKPT_RENDEZVOUS", "")
    if value not in ("", "launcher"):
        raise errors.InvalidArgument(
            "$CKPT_RENDEZVOUS = %r: not 'launcher' (unset: rank 0 serves the "
            "store)" % value[:32])
    return value == "launcher"


def _form(gen, backend, timeout, monitor):
    import os
    plan = gen.plan
    if monitor is not None:
        monitor.watch(gen)
    if plan.world_size > 1 or backend is not None:
        served = _store_served()
        master = plan.rank == 0 and not served
        if not master:
            _wait_listening(plan, monitor,
                            time.monotonic() + timeout.total_seconds())
        _phase("rendezvous_begin", plan)
        store = dist.TCPStore(plan.master_addr, plan.master_port,
                              plan.world_size, master, timeout, False)
        _phase("store_ready", plan)
        # An abort that came before the store had its socket (a newer plan
        # read while this rank probed or connected) shut nothing down: the
        # rendezvous would block on a rank that never comes. One after this
        # check finds the socket (abort() marks before it scans).
        if gen.aborted:
            raise RestartRequested("generation %d: a newer plan came while "
                                   "its store connected" % plan.generation)
        # Keys of one generation never meet another's; a store that serves
        # every generation (and may be shared by the jobs of a host) also
        # keeps each job's apart.
        prefix = "ckpt-gen-%d/" % plan.generation
        if served:
            prefix = "ckpt-%s/%s" % (os.environ.get("CKPT_JOB", ""), prefix)
        gen.store = dist.PrefixStore(prefix, store)
        # gloo's loop turns, at once (ckpt/torch/_kick.py); another
        # backend's threads (NCCL's) are left alone.
        gloo = (backend or "gloo") == "gloo"
        before = _kick.threads() if gloo else set()
        with _barrier_by_wait(), _kick.Kicker(None if gloo else ()):
            dist.init_process_group(backend or "gloo", store=gen.store,
                                    rank=plan.rank, world_size=plan.world_size,
                                    timeout=timeout)
        gen.threads = _kick.threads() - before if gloo else set()
        gen.formed()
        _phase("formed", plan)


class _barrier_by_wait:
    """While forming the group: torch 1.13's store-based barrier at the end
    of init_process_group counts the ranks in the store and sleeps 10 ms
    between counts; this one has the last rank to count set a key the
    others wait for (store.wait, the GIL released), so no rank waits out
    a sleep. Same key, same timeout error; a torch without that barrier
    (or of another signature) is left as it is."""

    def __enter__(self):
        import inspect
        c10d = dist.distributed_c10d
        self._old = getattr(c10d, "_store_based_barrier", None)
        if self._old is None or \
                not hasattr(c10d, "STORE_BASED_BARRIER_PREFIX") or \
                not hasattr(c10d, "_group_count") or \
                list(inspect.signature(self._old).parameters) != \
                ["rank", "store", "timeout"]:
            self._old = None
            return self
        c10d._store_based_barrier = _store_barrier
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            dist.distributed_c10d._store_based_barrier = self._old


def _store_barrier(rank, store, timeout):
    c10d = dist.distributed_c10d
    key = "%s:%d" % (c10d.STORE_BASED_BARRIER_PREFIX, c10d._group_count)
    if store.add(key, 1) == dist.get_world_size():
        store.set(key + "/all", "1")
    try:
        store.wait([key + "/all"], timeout)
    except RuntimeError as e:
        raise RuntimeError(
            "rank %d: the store-based barrier of the group (key %s) did not "
            "complete within %s: %s" % (rank, key, timeout, e)) from e


def _checkpointer(plan, monitor, options):
    import os
    if options is None or not (options.get("socket") or
                               os.environ.get("CKPT_SOCKET")):
        return None
    return _GenerationCheckpointer(monitor, rank=plan.rank,
                                   world_size=plan.world_size, **options)


def resilient(train, *, backend=None, timeout=datetime.timedelta(seconds=60),
              checkpointer_options=None, poll_s=0.01):
    """Calls train(ctx) with the default process group formed for the
    current generation; after each in-process restart calls it again, in
    this process. Returns what train returns.

    backend: torch.distributed's backend (None: "gloo"; a world of one
    forms no group unless a backend is given). timeout: the rendezvous'
    and the collectives' timeout. checkpointer_options: keyword arguments
    of ctx.checkpointer's Checkpointer (None: {}); ctx.checkpointer is
    None without $CKPT_SOCKET (nor a "socket" option)."""
    global _active
    if not isinstance(timeout, datetime.timedelta):
        raise errors.InvalidArgument("timeout: a datetime.timedelta, not %s"
                                     % type(timeout).__name__)
    options = dict(checkpointer_options or {})
    warm = _restart.warm()
    if warm and not _restart.under_launcher():
        raise errors.FailedPrecondition(
            "$CKPT_WARM=1 without $CKPT_RESTART_DIR: a warm process is "
            "started by ckptrun --warm, which gives it its plan")
    plan = None if warm else _restart.plan_from_env()
    monitor = None
    if warm:
        _warm_up()  # before `capable`: ckptrun places only a ready process
    if _restart.under_launcher():
        _restart.enable()
        monitor = _Monitor(0 if warm else plan.generation, poll_s)
    with _active_lock:
        if _active is not None:
            raise errors.FailedPrecondition("resilient(): already running")
        _active = monitor
    # What lives before train(ctx) (the imports: ~100k objects with torch)
    # is left out of the full collection each restart runs, which then
    # scans what the generations made, not 25-40 ms of the interpreter.
    frozen = monitor is not None
    if frozen:
        gc.freeze()
    _install_collectives()
    try:
        if monitor is not None:
            monitor.start()
        if plan is None:
            plan = _wait_placed(monitor)
        return _generations(train, plan, backend, timeout, options, monitor)
    finally:
        if monitor is not None:
            monitor.stop()
        if frozen:
            gc.unfreeze()
        _uninstall_collectives()
        with _active_lock:
            _active = None


def _warm_up():
    """A warm process makes ready what it can before its rank is known (the
    script's imports are done by now)."""
    if torch.cuda.is_available() and torch.cuda.device_count() == 1:
        torch.cuda.init()  # the only device's context: no rank needed


def _wait_placed(monitor):
    """A warm process waits for its first plan: ckptrun writes it when it
    hands this process a rank."""
    import os
    _log("warm process (pid %d): waiting for a rank" % os.getpid())
    plan = monitor.take()
    _phase("placed", plan)
    # A plan rewritten for a newer generation before this process read the
    # first one finds it kept: it must say it joined, as a kept one does.
    _restart.joined(plan.generation)
    _log("generation %d: placed as rank %d of %d in this warm process"
         % (plan.generation, plan.rank, plan.world_size))
    return plan


class _Closer(threading.Thread):
    """Closes the old generation's checkpointer (its saver thread, its
    channel: tens of ms of ctypes calls, the GIL released) while the main
    thread tears the group down and forms the next one; joined before the
    next generation's checkpointer connects, so the two never overlap."""

    def __init__(self, ck):
        super().__init__(name="ckpt-restart-closer", daemon=True)
        self._ck = ck

    def run(self):
        try:
            self._ck.close()
        except errors.Error as e:
            _log("closing the generation's checkpointer: %s" % e)
        finally:
            self._ck = None


def _join(closer):
    if closer is not None:
        closer.join()


def _generations(train, plan, backend, timeout, options, monitor):
    restarts = 0
    started = None  # when the restart began (the abort)
    closer = None  # the previous generation's _Closer
    while True:
        _restart.export(plan)
        gen, ck, formed = _Generation(plan), None, False
        try:
            _form(gen, backend, timeout, monitor)
            formed = True
            _join(closer)
            closer = None
            ck = _checkpointer(plan, monitor, options)
            _phase("client_ready", plan)
            if started is not None:
                _log("generation %d: rank %d of %d re-formed in process in "
                     "%.0f ms" % (plan.generation, plan.rank, plan.world_size,
                                  (time.monotonic() - started) * 1e3))
            result = train(Context(plan, ck, monitor, restarts))
        except BaseException as e:
            if monitor is None or not _restarting(e, monitor, formed):
                if isinstance(e, Exception) and _peers.looks_like_lost_peer(e):
                    _peers.note_peer_lost()  # this exit is not a failure of its own
                _join(closer)
                _close(gen, ck, abort=gen.pg is not None)
                raise
            started = time.monotonic()
            _phase("left", plan)
            gen.abort()  # at once: peers blocked on this rank fail in cascade
            _phase("aborted", plan)
            _log("generation %d: rank %d leaves its group (%s: %s)"
                 % (plan.generation, plan.rank, type(e).__name__, str(e)[:200]))
        else:
            _join(closer)
            _close(gen, ck, abort=False)
            return result
        # Out of the except block, so that the old generation's frames (its
        # model, optimizer, tensors) are gone before it is torn down. The
        # checkpointer closes on a thread of its own meanwhile.
        if ck is not None:
            _join(closer)
            closer = _Closer(ck)
            closer.start()
            ck = None
        _close(gen, None, abort=True, plan=plan)
        _log("generation %d: rank %d tore its group down in %.0f ms"
             % (plan.generation, plan.rank, (time.monotonic() - started) * 1e3))
        if monitor.pending() is None:
            monitor.poll_once()
        if monitor.pending() is None:
            _peers.note_peer_lost()  # ckptrun tells the coordinator
        plan = monitor.take()
        _phase("plan_taken", plan)
        _restart.joined(plan.generation)
        _phase("joined", plan)
        restarts += 1


def _restarting(e, monitor, formed):
    """A restart, not the trainer's own failure: RestartRequested, or any
    exception once a newer plan is there (an aborted group's error inside
    autograd, say), or, once the group is formed, an error of a link to a
    lost peer. A group that fails to form with no newer plan (its port
    taken, a peer that never came) is a failure: the process exits and is
    started anew, rather than wait for a plan nothing will make."""
    if isinstance(e, RestartRequested):
        return True
    if not isinstance(e, Exception):
        return False  # KeyboardInterrupt, SystemExit
    if monitor.pending() is not None:
        return True
    return formed and _peers.looks_like_lost_peer(e)


def _close(gen, ck, abort, plan=None):
    try:
        if gen is not None:
            gen.close(abort)
            if plan is not None:
                _phase("group_dropped", plan)
    finally:
        if ck is not None:
            try:
                ck.close()
            except errors.Error as e:
                _log("closing the generation's checkpointer: %s" % e)
            if plan is not None:
                _phase("client_closed", plan)
        gc.collect()  # the old group's tensors and works, now
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        if plan is not None:
            _phase("collected", plan)
