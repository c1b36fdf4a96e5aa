"""ckpt: Python bindings of libckpt, the trainer side of ckptd.

``ckpt.torch.Checkpointer`` is the PyTorch API (see doc/python.md)::

    ckpt = ckpt.torch.Checkpointer()            # job/rank from CKPT_JOB, RANK...
    ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})

This module holds what needs no torch: the exception hierarchy (every
libckpt failure is a ``ckpt.Error`` with ``.code``) and ``lib_path()``, the
libckpt.so in use. The library is loaded lazily, on first use.
"""

from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from ._lib import lib_path, ABI_VERSION

__version__ = "0.1.0"
__all__ = list(_errors_all) + ["lib_path", "ABI_VERSION", "__version__"]
