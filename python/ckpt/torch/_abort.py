"""Aborting a process group from another thread, on every torch version.

A collective blocked on a peer must return when a new generation's plan
arrives, and tearing the group down must never wait for it (a blocking
destroy is what hangs survivors). torch >= 2 has ProcessGroup.abort(), the
required path for NCCL; torch 1.13's gloo group has no abort at all. What
works on both for gloo is to shut down the group's TCP sockets: every
pending read and write of its pairs fails at once ("Connection closed by
peer"), the blocked collective raises, the group's worker threads finish,
and the peers' sockets see the same end of stream, so their collectives
fail too: one aborted rank unblocks the others in cascade.

The group's sockets are the established TCP connections (not the store's)
the process opened while the group was formed (a snapshot before and after, by inode, so a descriptor number
reused later is never shut down by mistake).
"""

import os
import socket

_FD_DIR = "/proc/self/fd"


_ESTABLISHED = "01"


def _tcp_inodes(skip_port):
    """Inodes of the established TCP connections with no end on
    skip_port. Listeners and the store's connections are left alone: the
    store's server thread aborts the process when its sockets are shut
    down under it, and the pairs' end is all a collective waits on."""
    inodes = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    if len(fields) <= 9 or fields[3] != _ESTABLISHED:
                        continue
                    ports = {int(fields[1].rsplit(":", 1)[1], 16),
                             int(fields[2].rsplit(":", 1)[1], 16)}
                    if skip_port not in ports:
                        inodes.add(int(fields[9]))
        except (OSError, ValueError):
            continue
    return inodes


def tcp_sockets(skip_port=None):
    """{descriptor: inode} of this process's established TCP connections
    that have no end on skip_port (the store's)."""
    tcp = _tcp_inodes(skip_port)
    out = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(os.path.join(_FD_DIR, name))
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:[") and target.endswith("]"):
            inode = int(target[8:-1])
            if inode in tcp:
                out[int(name)] = inode
    return out


def shut_down(sockets):
    """shutdown(SHUT_RDWR) on each {fd: inode} still naming that socket;
    the descriptors stay open (their owner closes them). Returns how many
    were shut down."""
    done = 0
    for fd, inode in sockets.items():
        try:
            dup = os.dup(fd)
        except OSError:
            continue
        try:
            if os.fstat(dup).st_ino != inode:
                continue  # closed and reused for something else
            s = socket.socket(fileno=dup)
            dup = -1  # the socket object owns it now
            try:
                s.shutdown(socket.SHUT_RDWR)
                done += 1
            except OSError:
                pass  # not connected (a listener) or already shut
            finally:
                s.close()
        finally:
            if dup >= 0:
                os.close(dup)
    return done


def abort_group(pg):
    """torch's own abort of `pg` where the version has one (NCCL needs it;
    safe from another thread). Errors are swallowed: a backend without an
    abort is handled by shutting its sockets down."""
    if pg is None:
        return
    abort = getattr(pg, "abort", None)
    if abort is None:
        return
    try:
        abort()
    except Exception:  # noqa: BLE001 - "not implemented" for some backends
        pass


def drop_group(pg, aborted):
    """Removes the default group from torch.distributed's tables without a
    destroy that could block: after an abort, torch's own
    _abort_process_group (newer torch) or destroy_process_group (which on
    torch 1.13 only forgets the group; its threads end because its
    sockets are shut)."""
    import torch.distributed as dist
    c10d = dist.distributed_c10d
    if not dist.is_initialized():
        _reset_group_count(c10d)
        return
    if aborted and hasattr(c10d, "_abort_process_group"):
        try:
            c10d._abort_process_group()
            return
        except Exception:  # noqa: BLE001 - a backend without abort
            pass
    dist.destroy_process_group()


def _reset_group_count(c10d):
    """A group that failed to form (its rendezvous aborted or timed out)
    still counted itself in torch's group counter, which names the next
    group's store barrier key (store_based_barrier_key:N): unreset, this
    process would wait at another key than a new process of the next
    generation, forever. destroy_process_group resets it; here nothing
    was formed to destroy."""
    if hasattr(c10d, "_group_count"):  # torch 1.x
        c10d._group_count = 0
    world = getattr(c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):
        try:
            world.group_count = 0
        except AttributeError:  # a read-only property on some versions
            pass
