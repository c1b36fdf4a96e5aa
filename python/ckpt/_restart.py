"""In-process restart under ckptrun, the part that needs no torch.

ckptrun gives each trainer process a directory ($CKPT_RESTART_DIR) where it
writes the plan of the newest generation for that process; libckpt reads
and validates it (ckpt_restart_poll). This module binds those calls and
defines RestartRequested. The process-group side is ckpt.torch.resilient.
"""

import ctypes
import os

from . import _lib, errors

__all__ = ["RestartRequested", "Plan", "enable", "poll", "joined",
           "plan_from_env", "warm"]


class RestartRequested(BaseException):
    """A newer generation's plan arrived: unwinds ``train(ctx)`` out of
    its step so that ckpt.torch.resilient can re-form the process group
    and call it again, in the same process.

    A BaseException (like KeyboardInterrupt), so ``except Exception:``
    does not catch it. Code that catches BaseException, or everything with
    a bare ``except:``, must re-raise it::

        except RestartRequested:
            raise
        except BaseException:
            ...

    ``generation`` is the plan's generation (None when the process group
    broke because a peer was lost and the plan is still to come)."""

    def __init__(self, message, generation=None):
        super().__init__(message)
        self.generation = generation


class Plan:
    """One generation's assignment of this process."""

    __slots__ = ("generation", "rank", "world_size", "local_rank",
                 "local_world_size", "master_addr", "master_port",
                 "restore_step")

    def __init__(self, generation, rank, world_size, local_rank,
                 local_world_size, master_addr, master_port, restore_step):
        self.generation, self.rank, self.world_size = generation, rank, world_size
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.master_addr, self.master_port = master_addr, master_port
        self.restore_step = restore_step  # None: a fresh start

    def __repr__(self):
        return ("Plan(generation=%d, rank=%d of %d, master=%s:%d, "
                "restore_step=%r)" % (self.generation, self.rank,
                                      self.world_size, self.master_addr,
                                      self.master_port, self.restore_step))


def under_launcher():
    """True when ckptrun gave this process a restart directory."""
    return bool(os.environ.get("CKPT_RESTART_DIR", ""))


def warm():
    """True in a warm process of ckptrun --warm ($CKPT_WARM=1): started
    ahead with no rank, it waits for its first plan."""
    return os.environ.get("CKPT_WARM", "") == "1"


def enable():
    """Writes `capable`: ckptrun keeps this process across generations.
    FailedPrecondition when $CKPT_RESTART_DIR is unset."""
    lib = _lib.lib()
    _lib.check(lib.ckpt_restart_enable(), "ckpt_restart_enable")


def poll(after):
    """The plan of a generation newer than `after`, or None. Never blocks;
    NotFound when ckptrun has written no plan yet, InvalidArgument (naming
    the key) for a malformed one. Releases the GIL (ctypes)."""
    lib = _lib.lib()
    out, fresh = _lib.CPlan(), ctypes.c_int(0)
    _lib.check(lib.ckpt_restart_poll(after, ctypes.byref(out),
                                     ctypes.byref(fresh)),
               "ckpt_restart_poll")
    if not fresh.value:
        return None
    return Plan(out.generation, out.rank, out.world_size, out.local_rank,
                out.local_world_size,
                out.master_addr.decode("utf-8", "replace"), out.master_port,
                out.restore_step if out.has_restore_step else None)


def joined(generation):
    """Writes `joined`: this process left its old generation for
    `generation` (its process group is torn down)."""
    lib = _lib.lib()
    _lib.check(lib.ckpt_restart_joined(generation), "ckpt_restart_joined")


def _env_int(name, lo, hi, default):
    text = os.environ.get(name, "")
    if text == "":
        return default
    if not text.isdigit() or len(text) > 20 or not lo <= int(text) <= hi:
        raise errors.InvalidArgument("$%s: %.40r is not an integer in [%d, %d]"
                                     % (name, text, lo, hi))
    return int(text)


def plan_from_env():
    """The first generation's plan, from the environment ckptrun (or
    torchrun) sets: ckptrun writes the same values to `plan` before the
    first start, and a generation 0 is never newer than anything, so the
    environment is where the first one is read. Outside a launcher: rank 0
    of 1, generation 0, 127.0.0.1:29500. An error names the variable."""
    world = _env_int("WORLD_SIZE", 1, 2**31 - 1, 1)
    rank = _env_int("RANK", 0, world - 1, 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1, 2**31 - 1, 1)
    local_rank = _env_int("LOCAL_RANK", 0, 2**31 - 1, 0)
    port = _env_int("MASTER_PORT", 1, 65535, 29500)
    generation = _env_int("CKPT_GENERATION", 0, 2**64 - 1, 0)
    restore = _env_int("CKPT_RESTORE_STEP", 0, 2**63 - 1, None)
    addr = os.environ.get("MASTER_ADDR", "") or "127.0.0.1"
    if len(addr) > 255:
        raise errors.InvalidArgument("$MASTER_ADDR: longer than 255 bytes")
    return Plan(generation, rank, world, local_rank, local_world, addr, port,
                restore)


def export(plan):
    """Sets the launcher's variables to `plan`'s values, so that code that
    reads them (RANK, MASTER_PORT, CKPT_RESTORE_STEP...) sees the current
    generation."""
    env = os.environ
    env["RANK"], env["WORLD_SIZE"] = str(plan.rank), str(plan.world_size)
    env["LOCAL_RANK"] = str(plan.local_rank)
    env["LOCAL_WORLD_SIZE"] = str(plan.local_world_size)
    env["MASTER_ADDR"], env["MASTER_PORT"] = plan.master_addr, str(plan.master_port)
    env["CKPT_GENERATION"] = str(plan.generation)
    if plan.restore_step is None:
        env.pop("CKPT_RESTORE_STEP", None)
    else:
        env["CKPT_RESTORE_STEP"] = str(plan.restore_step)
