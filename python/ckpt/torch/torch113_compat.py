"""Makes torch 1.13's DCP importable on Python >= 3.11 (Debian's python3-torch).

Only when asked for: importing this module installs the hook, before
ckpt.torch.dcp (or DCP itself) is imported::

    import torch
    if torch.__version__.startswith("1."):
        import ckpt.torch.torch113_compat  # noqa: F401  torch 1.13 only
    from ckpt.torch.dcp import CkptdStorageWriter, CkptdStorageReader

Nothing else in ckpt imports it, so on torch >= 2 nothing of it is loaded.

torch 1.13 predates Python 3.11, whose dataclasses refuse an unhashable
default: torch/distributed/_shard/sharded_tensor/metadata.py declares
``tensor_properties: TensorProperties = field(default=TensorProperties())``,
so ``import torch.distributed._shard`` (and with it DCP, which lived in
torch.distributed._shard.checkpoint before 2.0) raises ValueError. install()
adds an import hook for that one module that compiles its source with
``field(default_factory=TensorProperties)`` instead: the same default, made
per instance. It does nothing on torch >= 2.0, on Python < 3.11, or once
the module is imported. Idempotent.
"""

import importlib.abc
import importlib.machinery
import sys
import threading

_TARGET = "torch.distributed._shard.sharded_tensor.metadata"
_OLD = b"field(default=TensorProperties())"
_NEW = b"field(default_factory=TensorProperties)"
_lock = threading.Lock()
_installed = False


class _PatchedLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        path = self.get_filename(fullname)
        source = self.get_data(path).replace(_OLD, _NEW)
        # Never the cached bytecode: it was compiled from the unpatched source.
        return compile(source, path, "exec", dont_inherit=True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None
        spec.loader = _PatchedLoader(name, spec.origin)
        return spec


def install():
    global _installed
    if sys.version_info < (3, 11) or _TARGET in sys.modules:
        return
    import torch
    if not torch.__version__.startswith("1."):
        return
    with _lock:
        if not _installed:
            sys.meta_path.insert(0, _Finder())
            _installed = True


install()
