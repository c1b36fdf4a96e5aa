"""Detection from peers: a trainer whose collective broke because peers
are gone says so before it exits, so that ckptrun reports its exit as
``peer_lost`` and the coordinator probes the peers' nodes instead of
planning the exit as a failure of its own (one failure, one plan; see
doc/operations.md, "Detection from peers").

The note is the file ``$CKPT_PEER_LOST_FILE`` (ckptrun sets it per rank and
empties it before each start): the lost ranks, separated by blanks or
newlines, or a lone newline when the trainer cannot name them (gloo does
not say which rank a broken link led to).
"""

import contextlib
import os

__all__ = ["note_peer_lost", "looks_like_lost_peer", "peers_watched"]

# What torch's gloo and NCCL backends say when a peer's process or node is
# gone: a closed or reset link, a recv past its timeout, an aborted
# communicator. Lower case; matched as substrings.
_LOST_PEER_WORDS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out waiting",
    "socket timeout",
    "remote process exited",
    "communicator was aborted",
    "ncclremoteerror",
)


def note_peer_lost(ranks=None):
    """Writes $CKPT_PEER_LOST_FILE: ``ranks`` (an iterable of ints), or a
    lone newline for peers not named. Does nothing outside ckptrun (the
    variable unset or empty). Returns True when the note was written."""
    path = os.environ.get("CKPT_PEER_LOST_FILE", "")
    if not path:
        return False
    names = []
    for r in ranks or ():
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError("ranks: %r is not a rank (a non-negative int)" % (r,))
        names.append(str(r))
    try:
        with open(path, "w") as f:
            f.write(" ".join(names) + "\n")
    except OSError:
        return False  # the exit is then planned as a failure of its own
    return True


def looks_like_lost_peer(exc):
    """True if ``exc`` (or an exception it was raised from) is a collective
    that broke on a peer's link."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        kind = type(exc).__name__
        if kind in ("DistNetworkError",):
            return True
        text = str(exc).lower()
        if any(w in text for w in _LOST_PEER_WORDS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextlib.contextmanager
def peers_watched():
    """Around a training loop: an exception from a collective that broke
    on a peer's link writes the note (peers not named) and goes on
    unwinding, so the trainer still exits non-zero::

        with ckpt.peers_watched():
            for step in ...:
                ...
                dist.all_reduce(grads)
    """
    try:
        yield
    except Exception as e:
        if looks_like_lost_peer(e):
            note_peer_lost()
        raise
