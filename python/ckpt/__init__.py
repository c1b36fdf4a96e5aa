"""ckpt: Python bindings of libckpt, the trainer side of ckptd.

``ckpt.torch.Checkpointer`` is the PyTorch API (see doc/python.md)::

    ckpt = ckpt.torch.Checkpointer()            # job/rank from CKPT_JOB, RANK...
    ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})

This module holds what needs no torch: the exception hierarchy (every
libckpt failure is a ``ckpt.Error`` with ``.code``) and ``lib_path()``, the
libckpt.so in use. The library is loaded lazily, on first use.
``ckpt.peers_watched()`` (or ``ckpt.note_peer_lost()`` by hand) tells
ckptrun that a collective broke because peers are gone.
``ckpt.RestartRequested`` (a BaseException) unwinds a ``train(ctx)`` run
by ``ckpt.torch.resilient`` when a new generation's plan arrives.
"""

from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from ._lib import lib_path, ABI_VERSION
from ._peers import note_peer_lost, looks_like_lost_peer, peers_watched
from ._restart import RestartRequested

__version__ = "0.1.0"
__all__ = list(_errors_all) + ["lib_path", "ABI_VERSION", "__version__",
                               "note_peer_lost", "looks_like_lost_peer", "peers_watched",
                               "RestartRequested"]
