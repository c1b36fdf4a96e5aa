"""The Python half of hang evidence: when ckptrun names a file in
$CKPT_STACKS_FILE, a faulthandler dump of every thread's Python stack is
written there on SIGUSR2. ckptrun sends SIGUSR2 only to a process that
catches it, when the coordinator detected a hang, and reads the file
before it stops the trainer (doc/operations.md, "Hangs")."""

import faulthandler
import os
import signal

_file = None  # kept open: the handler writes to its descriptor


def register():
    """Registers the dump once; a file that cannot be opened is skipped
    (the native stacks are still captured)."""
    global _file
    path = os.environ.get("CKPT_STACKS_FILE", "")
    if _file is not None or not path:
        return
    try:
        f = open(path, "a")
        faulthandler.register(signal.SIGUSR2, file=f, all_threads=True,
                              chain=False)
    except (OSError, ValueError, RuntimeError, AttributeError):
        return
    _file = f
