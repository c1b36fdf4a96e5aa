"""Progress beacons and hang evidence from Python: Checkpointer.progress
and expect_pause store into the rank's arena (read back here the way ckptd
reads it), bad arguments are refused naming them, and ckpt.torch dumps
every thread's Python stack on SIGUSR2 into $CKPT_STACKS_FILE.

Run by CTest (python/CMakeLists.txt) like test_checkpointer.
"""

import os
import struct
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
except ImportError:  # the CTest still reports the reason
    raise unittest.SkipTest("torch is not installed for %s" % sys.executable)

import ckpt
from tests.daemon_case import DaemonTestCase, PACKAGE_ROOT

# shm/beacon.h: seq, step, progress_count, compute_ns, pause_count,
# pause_ms, then 128 bytes of reason; at offset 4096 of the arena.
_BEACON = struct.Struct("<QqQQQQ128s")


class ProgressTest(DaemonTestCase):

    def beacon(self, job):
        path = "/dev/shm/%s.%s.r0" % (self.daemon.shm_prefix, job)
        with open(path, "rb") as f:
            f.seek(4096)
            fields = _BEACON.unpack(f.read(_BEACON.size))
        return {"seq": fields[0], "step": fields[1], "count": fields[2],
                "compute_ns": fields[3], "pause_ms": fields[5],
                "reason": fields[6].rstrip(b"\0").decode()}

    def test_progress_and_a_declared_pause_reach_the_arena(self):
        job = self.new_job()
        c = self.checkpointer(job=job)
        c.progress(3)  # before the arena exists: kept, written with it
        c.save(4, {"t": torch.ones(8)})
        self.assertEqual(self.beacon(job)["step"], 3)
        c.progress(5, compute_s=0.5)
        c.expect_pause(30, "evaluation")
        b = self.beacon(job)
        self.assertEqual(b["seq"] % 2, 0)
        self.assertEqual(b["step"], 5)
        self.assertEqual(b["compute_ns"], 500000000)
        self.assertEqual(b["pause_ms"], 30000)
        self.assertEqual(b["reason"], "evaluation")

    def test_bad_arguments_are_refused_naming_them(self):
        c = self.checkpointer()
        for call, name in [(lambda: c.progress(-1), "step"),
                           (lambda: c.progress(1, compute_s="x"), "compute_s"),
                           (lambda: c.progress(1, compute_s=-2.0), "compute_s"),
                           (lambda: c.expect_pause(-1, "x"), "seconds"),
                           (lambda: c.expect_pause(1, 7), "reason")]:
            with self.assertRaises(ckpt.InvalidArgument) as e:
                call()
            self.assertIn(name, str(e.exception))


class StackDumpTest(unittest.TestCase):

    def test_sigusr2_dumps_every_threads_python_stack_to_the_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "rank-0.pystacks")
            code = ("import os, signal, ckpt.torch\n"
                    "def stuck_in_a_loop():\n"
                    "    os.kill(os.getpid(), signal.SIGUSR2)\n"
                    "stuck_in_a_loop()\n")
            env = dict(os.environ, CKPT_STACKS_FILE=path,
                       PYTHONPATH=PACKAGE_ROOT)
            subprocess.run([sys.executable, "-c", code], env=env, check=True,
                           timeout=120)
            with open(path) as f:
                dump = f.read()
        self.assertIn("stuck_in_a_loop", dump)
        self.assertIn('File "<string>", line 3', dump)


if __name__ == "__main__":
    unittest.main()
