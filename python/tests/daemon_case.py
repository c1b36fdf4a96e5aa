"""Shared by the Python tests: a unittest case with a real ckptd per test
class (its socket, root and shared memory in a temporary directory), and
random nested state_dicts with every dtype the installed torch can make
from raw bytes."""

import collections
import math
import os
import shutil
import struct
import sys
import tempfile
import unittest

try:
    import torch
except ImportError:  # the CTest still reports the reason
    raise unittest.SkipTest("torch is not installed for %s" % sys.executable)

import ckpt
import ckpt.torch
from tests.ckptd_process import CkptdProcess

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)


def random_tensor(dtype, shape, gen):
    """Random bits of any dtype (NaN payloads included), bools 0/1."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def dtypes_with_random_bits():
    """The storable dtypes whose tensors can be made from raw bytes (all
    of torch 1.13's; a newer torch may have a dtype view() refuses)."""
    out = []
    for dtype in ckpt.torch.storable_dtypes():
        try:
            random_tensor(dtype, (1,), torch.Generator())
            out.append(dtype)
        except (RuntimeError, TypeError):
            pass
    return out


def bits(t):
    """The tensor's bytes, for bit-exact comparison of any dtype."""
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).clone() if t.numel() else b""


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        bool(torch.equal(bits(a), bits(b))) if a.numel() else a.shape == b.shape


def shard_path(root, job, step, rank=0):
    """A one-node ckptd's shard file of (job, step, rank) under root."""
    return os.path.join(root, job, "step-%020d" % step, "rank-%05d.shard" % rank)


def flip_first_tensor_byte(path):
    """Flips one byte of the first tensor's data in a shard file (its
    header's data_offset, a little-endian u64 at byte 48)."""
    with open(path, "r+b") as f:
        data_offset = struct.unpack_from("<Q", f.read(64), 48)[0]
        f.seek(data_offset)
        byte = f.read(1)[0]
        f.seek(data_offset)
        f.write(bytes([byte ^ 0x20]))


class DaemonTestCase(unittest.TestCase):
    jobs = 0

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ckpt-py-test.")
        os.chmod(cls.tmp, 0o755)  # the other-uid probe reaches the socket
        cls.daemon = CkptdProcess(cls.tmp)
        cls.daemon.start()

    @classmethod
    def tearDownClass(cls):
        status = cls.daemon.stop()
        cls.daemon.drop_shm()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if status != 0:
            raise AssertionError("ckptd exited with %d" % status)

    def new_job(self):
        DaemonTestCase.jobs += 1
        return "py%d" % DaemonTestCase.jobs

    def checkpointer(self, job=None, **options):
        c = ckpt.torch.Checkpointer(job=job or self.new_job(),
                                    socket=self.daemon.socket, rank=0,
                                    world_size=1, **options)
        self.addCleanup(c.close)
        return c

    def tearDown(self):
        self.assertTrue(self.daemon.running(),
                        "ckptd died:\n" + self.daemon.log_tail())


def nested_state(gen):
    dtypes = dtypes_with_random_bits()
    return {
        "model": collections.OrderedDict(
            ("layer%d.%s" % (i, d), random_tensor(d, (3, 5), gen))
            for i, d in enumerate(dtypes)),
        "optim": {
            "state": {0: {"step": torch.tensor(17.0),
                          "exp_avg": random_tensor(torch.float32, (4,), gen)},
                      1: {"exp_avg_sq": random_tensor(torch.bfloat16, (2, 2),
                                                      gen)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8,
                              "params": [0, 1], "foreach": None,
                              "amsgrad": False}],
        },
        "scalar": random_tensor(torch.float64, (), gen),
        "empty": torch.empty(0, 3),
        "rng": torch.get_rng_state(),
        "step": 17,
        "big": 2**70,
        "specials": [math.inf, -math.inf, -0.0, 0.1, "", "ü/%#", None, True],
        "tuple": (1, (2, [3, (4,)])),
        "": {"a/b": torch.arange(3), "a": {"b": torch.arange(4)}},
        "keys": {0: torch.zeros(1), "0": torch.ones(1), "#0": torch.ones(2),
                 1.5: "float key", None: "none key", True: "bool key"},
    }


def tensors_of(tree, out=None):
    out = [] if out is None else out
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            tensors_of(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            tensors_of(v, out)
    return out


def without_tensors(tree):
    if isinstance(tree, torch.Tensor):
        return "T"
    if isinstance(tree, dict):
        return type(tree)((k, without_tensors(v)) for k, v in tree.items())
    if isinstance(tree, (list, tuple)):
        return type(tree)(without_tensors(v) for v in tree)
    return tree
