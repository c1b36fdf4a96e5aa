"""The DCP reader at another world size on other nodes (doc/python-dcp.md,
"What a load does"): real processes on loopback, a ckpt-coordinator and
four ckptds, each with a stored root of its own (no shared root, no
object tier). A torch job of 4 ranks on nodes a and b (2 each, under
ckptrun) saves a step through CkptdStorageWriter over gloo; 2 ranks on
node c and 3 ranks on node d, whose ckptds hold nothing of the job, load
it through CkptdStorageReader: every shard they read comes from a's and
b's shared memory (the owner's slot, fetched and verified by their own
ckptd), and every tensor equals the saved one bit for bit, including a
[2000, 1024] ShardedTensor split by rows 4 ways when saved and 2 and 3
ways when loaded, whose read items are parts of the saved pieces: each
rank's piece loads read no more than the saved pieces its rows overlap
(the byte-range restore reads only the chunks it needs)."""

import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - the interpreter without torch
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
SAVED = 4


def free_ports(count):
    """The first of `count` consecutive TCP ports nothing is bound to now,
    below the ephemeral range (as test_resilient's)."""
    import socket
    rng = random.Random(os.getpid())
    while True:
        base = rng.randrange(10000, 32000)
        held = []
        try:
            for p in range(base, base + count):
                s = socket.socket(socket.AF_INET6)
                held.append(s)
                s.bind(("::", p))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()


def rank_env(**kw):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(HERE), env.get("PYTHONPATH")] if p)
    env["PYTHONUNBUFFERED"] = "1"
    for k in ("RANK", "WORLD_SIZE", "CKPT_SOCKET", "CKPT_JOB", "CKPT_RESTORE_STEP"):
        env.pop(k, None)
    env.update({k: str(v) for k, v in kw.items()})
    return env


@unittest.skipIf(torch is None, "this interpreter has no torch")
class DcpPeersTest(unittest.TestCase):
    def setUp(self):
        from tests.cluster_procs import Cluster
        self.dir = tempfile.mkdtemp(prefix="ckpt-dcp-peers-", dir="/var/tmp")
        self.cluster = Cluster(self.dir, "dcpj", SAVED, 2)
        self.hold = os.path.join(self.dir, "release")

    def tearDown(self):
        with open(self.hold, "w"):
            pass
        self.cluster.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_saved_at_4_on_two_nodes_loads_at_2_and_3_on_other_nodes(self):
        from tests.cluster_procs import wait_for
        c = self.cluster
        c.start_coordinator()
        base = free_ports(40)
        for i, n in enumerate("abcd"):
            # c and d are spares: they host none of the job's ranks.
            c.start_node(n, spare=n in "cd", own_root=True,
                         extra_args=["--replica-port", str(base + i)])
        port = base + 10
        cmd = [sys.executable, "-m", "tests.dcp_peers_rank", "save", "dcpj", "1", self.hold]
        for n in "ab":
            c.start_launcher(n, cmd, port, env=rank_env())
        wait_for(lambda: c.logs_text().count("saved rank=") == SAVED, 120,
                 "the 4 ranks to save step 1:\n" + c.logs_text()[-3000:])
        for node, world, master in (("c", 2, port + 10), ("d", 3, port + 20)):
            procs, logs = [], []
            for r in range(world):
                logs.append(os.path.join(self.dir, "load-%s-%d.log" % (node, r)))
                with open(logs[-1], "wb") as out:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "tests.dcp_peers_rank", "load", "dcpj", "1", self.hold,
                         str(SAVED)],
                        cwd=os.path.dirname(HERE), stdout=out, stderr=subprocess.STDOUT,
                        env=rank_env(RANK=r, WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=master,
                                     CKPT_SOCKET=c.socket(node))))
            for r, p in enumerate(procs):
                try:
                    p.wait(timeout=240)  # torch imports on a loaded 2-core machine
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                        q.wait()
                with open(logs[r], errors="replace") as f:
                    out = f.read()
                self.assertEqual(p.returncode, 0, "%s rank %d of %d:\n%s\n%s" % (node, r, world, out, self.log(node)))
                self.assertIn("load ok rank=%d world=%d" % (r, world), out)
                # What its piece loads read, against the saved pieces of
                # "rows" its rows overlap (the rank checked the bound).
                print("\n".join(l for l in out.splitlines() if l.startswith("read stats")), flush=True)
            # Every saved rank came from its owner's memory on a or b.
            log = self.log(node)
            for saved in range(SAVED):
                self.assertRegex(log, r"step 1 saved rank %d: from the owner's slot on [ab] " % saved, log)

    def log(self, node):
        with open(os.path.join(self.cluster.node_dir(node), "ckptd.log"), errors="replace") as f:
            return f.read()


if __name__ == "__main__":
    unittest.main()
