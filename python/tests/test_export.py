"""`ckptctl export --format safetensors` of shards a real ckptd wrote.

A ckpt.torch shard exports under the state_dict's own keys, with the
package's header and skeleton in the safetensors metadata, so that
model.load_state_dict(safetensors.torch.load_file(path)) works; a shard of
another client (the C API's names) exports its tensors as they are named.

The safetensors file is read with the `safetensors` module when it is
installed, else parsed here (8-byte little-endian header length, the JSON
header, the data), which is the whole format. $CKPTCTL_BINARY names the
ckptctl to run (default: ckptctl on PATH).
"""

import collections
import json
import os
import struct
import subprocess
import sys
import unittest

try:
    import torch
except ImportError:  # the CTest still reports the reason
    raise unittest.SkipTest("torch is not installed for %s" % sys.executable)

import ckpt.torch
from ckpt import _client
from ckpt.torch import _tensors
from tests.cluster_procs import wait_for
from tests.daemon_case import (DaemonTestCase, bits, random_tensor,
                               same_bits, shard_path)

try:
    import safetensors.torch as st_torch
except ImportError:
    st_torch = None

_DTYPES = {"F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "F64": torch.float64, "I8": torch.int8,
           "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32,
           "I64": torch.int64, "BOOL": torch.bool}


def read_safetensors(path):
    """(tensors as an OrderedDict, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    body = data[8 + n:]
    out = collections.OrderedDict()
    end = 0
    for key, e in sorted(header.items(),
                         key=lambda kv: kv[1]["data_offsets"][0]):
        lo, hi = e["data_offsets"]
        if lo != end:
            raise AssertionError("%s: data at %d, expected %d" % (key, lo, end))
        end = hi
        raw = torch.frombuffer(bytearray(body[lo:hi]) or bytearray(1),
                               dtype=torch.uint8)[:hi - lo]
        out[key] = raw.view(_DTYPES[e["dtype"]]).reshape(e["shape"])
    if end != len(body):
        raise AssertionError("%d data bytes, the header covers %d"
                             % (len(body), end))
    if st_torch is not None:  # the reference reader agrees
        ref = st_torch.load_file(path)
        assert set(ref) == set(out), (sorted(ref), sorted(out))
    return out, metadata


class Net(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 3),
                                         torch.nn.ReLU(),
                                         torch.nn.Linear(3, 2))
        self.register_buffer("scale", torch.rand(2).to(torch.bfloat16))


class ExportTest(DaemonTestCase):

    def export(self, job, step):
        out = os.path.join(self.tmp, "%s-%d.safetensors" % (job, step))
        ctl = os.environ.get("CKPTCTL_BINARY", "ckptctl")
        r = subprocess.run(
            [ctl, "export", shard_path(self.daemon.root, job, step),
             "--format", "safetensors", "--out", out],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertEqual(r.returncode, 0, r.stdout)
        return out

    def test_ckpt_torch_state_dict_exports_under_its_own_keys(self):
        net = Net(seed=1)
        c = self.checkpointer()
        c.save(3, net.state_dict())
        c.wait_durable(3)
        tensors, metadata = read_safetensors(self.export(c.job, 3))
        self.assertEqual(list(tensors), list(net.state_dict()))
        self.assertIn("model.0.weight", tensors)
        # The package's own entries went to the metadata, readable there.
        self.assertNotIn("%ckpt/header", tensors)
        self.assertNotIn("%ckpt/skeleton", tensors)
        skeleton = json.loads(metadata["%ckpt/skeleton"])
        self.assertEqual(skeleton["format"], "ckpt.torch/1")
        self.assertEqual(metadata["step"], "3")
        fresh = Net(seed=2)
        fresh.load_state_dict(tensors)  # strict: every key, no extra
        for key, want in net.state_dict().items():
            got = fresh.state_dict()[key]
            self.assertEqual(want.dtype, got.dtype, key)
            self.assertTrue(torch.equal(bits(want), bits(got)), key)

    def test_nested_state_joins_keys_with_dots(self):
        net = Net(seed=3)
        state = {"net": net.state_dict(), "step": 7,
                 "extra": [torch.arange(5), {"a/b%": torch.ones(2, 2)}]}
        c = self.checkpointer()
        c.save(1, state)
        c.wait_durable(1)
        tensors, _ = read_safetensors(self.export(c.job, 1))
        want = ["net." + k for k in net.state_dict()] + ["extra.0",
                                                        "extra.1.a/b%"]
        self.assertEqual(list(tensors), want)
        self.assertTrue(torch.equal(tensors["extra.0"], torch.arange(5)))
        self.assertTrue(torch.equal(tensors["net.model.2.bias"],
                                    net.state_dict()["model.2.bias"]))

    def test_keys_that_collide_are_refused_naming_both(self):
        c = self.checkpointer()
        c.save(1, {"k": {0: torch.zeros(1), "0": torch.ones(1)}})
        c.wait_durable(1)
        out = os.path.join(self.tmp, "collide.safetensors")
        r = subprocess.run(
            [os.environ.get("CKPTCTL_BINARY", "ckptctl"), "export",
             shard_path(self.daemon.root, c.job, 1), "--out", out],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('tensors "k/#0" and "k/0" would both be exported as '
                      '"k.0"', r.stdout)
        self.assertFalse(os.path.exists(out))

    def test_another_clients_shard_keeps_its_names(self):
        job = self.new_job()
        client = _client.Client(job, self.daemon.socket, 0, 1)
        self.addCleanup(client.close)
        w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        b = torch.tensor([1, -1], dtype=torch.int64)
        client.save(2, _client.Packed([_tensors.desc(b"layer/w", w),
                                       _tensors.desc(b"layer/b", b)]))
        client.wait_durable(2, 60000)
        tensors, metadata = read_safetensors(self.export(job, 2))
        self.assertEqual(list(tensors), ["layer/w", "layer/b"])
        self.assertTrue(torch.equal(tensors["layer/w"], w))
        self.assertTrue(torch.equal(tensors["layer/b"], b))
        self.assertNotIn("%ckpt/skeleton", metadata)
        self.assertEqual(metadata["job"], job)

    def test_a_sharded_step_exports_its_global_tensors_by_state_dict_key(self):
        """Two ranks of one job save rows [0, 3) and [3, 6) of model.w as
        ckpt.torch Pieces, and each the same model.b: `ckptctl export
        --root --job --step` (no --rank) writes model.w whole and model.b
        once, under their state_dict keys, bit-exact."""
        job = self.new_job()
        w = random_tensor(torch.float32, (6, 4), torch.Generator().manual_seed(5))
        b = torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16)
        ranks = []
        for rank in range(2):
            c = ckpt.torch.Checkpointer(job=job, socket=self.daemon.socket,
                                        rank=rank, world_size=2)
            self.addCleanup(c.close)
            ranks.append(c)
            piece = ckpt.torch.Piece(w[3 * rank:3 * rank + 3].clone(),
                                     (6, 4), (3 * rank, 0))
            c.save(5, {"model": {"w": piece, "b": b.clone()}, "step": 5})
        for c in ranks:
            c.wait_durable(5)
        manifest = os.path.join(self.daemon.root, job, "step-%020d" % 5,
                                "MANIFEST")
        wait_for(lambda: os.path.exists(manifest), 60, manifest)
        out = os.path.join(self.tmp, "%s-step.safetensors" % job)
        r = subprocess.run(
            [os.environ.get("CKPTCTL_BINARY", "ckptctl"), "export", "--root",
             self.daemon.root, "--job", job, "--step", "5", "--out", out],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertEqual(r.returncode, 0, r.stdout)
        tensors, metadata = read_safetensors(out)
        self.assertEqual(sorted(tensors), ["model.b", "model.w"])
        self.assertTrue(same_bits(tensors["model.w"], w))
        self.assertTrue(same_bits(tensors["model.b"], b))
        self.assertEqual(metadata["world_size"], "2")
        # reshard does not rewrite ckpt.torch's per-rank skeletons: refused.
        r = subprocess.run(
            [os.environ.get("CKPTCTL_BINARY", "ckptctl"), "reshard", "--root",
             self.daemon.root, "--job", job, "--step", "5", "--world-size",
             "3", "--out", os.path.join(self.tmp, job + "-3")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("was saved by ckpt.torch", r.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, job + "-3")))


if __name__ == "__main__":
    unittest.main()
