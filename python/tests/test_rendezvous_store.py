"""The rendezvous store served by a process of no generation
(`python -m ckpt.torch.store_server`, what `ckptrun --rendezvous torch`
keeps up): examples/train_gpt.py (2 ranks over gloo, one real ckptd) under
a test that plays ckptrun (tests/restart_launcher.py) with
$CKPT_RENDEZVOUS=launcher. Rank 0's trainer is SIGKILLed: the survivor
keeps its process and re-forms on the same store server (same process,
never restarted), the new rank 0 is one of its clients, and both end
bit-identical to an undisturbed run.
"""

import os
import signal
import socket
import unittest

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    raise unittest.SkipTest("this interpreter has no torch")

from tests.cluster_procs import wait_for
from tests.restart_launcher import Launcher, read
from tests import test_resilient as base
from tests.test_resilient import first_step, free_ports, generation_output, train_args


def listens(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        return True
    except OSError:
        return False


class RendezvousStoreTest(base.ResilientTest):
    # ResilientTest's fixture (one ckptd, a job per test), not its tests.
    test_survivor_keeps_its_process_when_rank_0_is_killed_bit_identical = None
    test_a_plan_aborts_a_collective_blocked_on_a_live_peer = None
    test_twenty_restarts_in_process_leak_nothing_and_end_bit_identical = None

    def test_store_outlives_rank_0s_trainer_and_survivor_reforms_on_it(self):
        steps = 40
        port = free_ports(1)
        ln = Launcher(self.dir, self.daemon.socket, self.job, 2, port,
                      train_args(steps, 3) + ["--step-sleep-ms", "20"], store_port=port)
        server, log = ln.start_store_server()
        try:
            wait_for(lambda: "serving the rendezvous store" in read(log) or
                     server.poll() is not None, 120, "the store server")
            self.assertIsNone(server.poll(), read(log))
            r0, r1 = self.start(ln, 0, 0, None), self.start(ln, 0, 1, None)
            wait_for(lambda: "step 10 loss" in r1.output(), 120, "step 10")
            os.kill(r0.pid, signal.SIGKILL)
            r0.proc.wait()
            wait_for(lambda: r1.peer_lost_note() == "\n", 60, "the survivor's peer-lost note")
            # Rank 0's process is gone; the store is not.
            self.assertTrue(listens(port), read(log))
            restore = self.latest()
            self.assertIsNotNone(restore)
            ln.write_plan(r1, 1, 1, restore)
            n0 = self.start(ln, 1, 0, restore)
            wait_for(lambda: first_step(r1.output(), 1), 120, "the survivor's first step")
            self.finish([r1, n0], steps)
            self.assertEqual(r1.joined(), 1)
            self.assert_kept(r1, 1, 1)
            self.assertIn("restored step %d" % restore, generation_output(r1.output(), 1))
            # One server for both generations, never restarted, and no
            # trainer served one (rank 0 would have failed to bind).
            self.assertIsNone(server.poll(), read(log))
            self.assertEqual(read(log).count("serving the rendezvous store"), 1, read(log))
        finally:
            server.terminate()
            server.wait()
        self.assertEqual(server.returncode, 0, read(log))

    def test_plan_ends_a_rendezvous_blocked_on_the_launchers_store_at_once(self):
        """The survivor joins generation 1, whose rank 0 never comes: it
        waits in the rendezvous, on the store no process of the job
        serves, so no dying peer breaks that wait. Generation 2's plan must
        (the abort shuts the store's links too), long before the
        rendezvous timeout (300 s here)."""
        steps = 30
        port = free_ports(1)
        ln = Launcher(self.dir, self.daemon.socket, self.job, 2, port,
                      train_args(steps, 3) + ["--step-sleep-ms", "20", "--timeout-s", "300"],
                      store_port=port)
        server, log = ln.start_store_server()
        try:
            wait_for(lambda: "serving the rendezvous store" in read(log) or
                     server.poll() is not None, 120, "the store server")
            r0, r1 = self.start(ln, 0, 0, None), self.start(ln, 0, 1, None)
            wait_for(lambda: "step 10 loss" in r1.output(), 120, "step 10")
            os.kill(r0.pid, signal.SIGKILL)
            r0.proc.wait()
            wait_for(lambda: r1.peer_lost_note() == "\n", 60, "the survivor's peer-lost note")
            restore = self.latest()
            ln.write_plan(r1, 1, 1, restore)  # its rank 0 is never started
            wait_for(lambda: r1.joined() == 1, 60, "the survivor to join generation 1")
            ln.write_plan(r1, 2, 1, restore)
            wait_for(lambda: r1.joined() == 2, 120,
                     "the survivor to leave generation 1's rendezvous:\n" + self.say([r1]))
            n0 = self.start(ln, 2, 0, restore)
            self.finish([r1, n0], steps)
            self.assert_kept(r1, 2, 2)
        finally:
            server.terminate()
            server.wait()

    def test_an_abort_before_the_store_connected_still_ends_the_rendezvous(self):
        """A newer plan's abort that came before this generation's store
        had a socket (the monitor read the plan while the survivor probed
        or connected) shut nothing down: the rendezvous then blocked on a
        rank 0 that never comes, until its timeout (the flake of the test
        above under a parallel build). The generation must not block."""
        import datetime
        import time
        from unittest import mock
        import torch.distributed as dist
        from ckpt import _restart
        from ckpt.torch import _resilient
        port = free_ports(1)
        # The launcher's store; rank 0 never joins it.
        server = dist.TCPStore("127.0.0.1", port, 2, True,
                               datetime.timedelta(seconds=60), False)
        try:
            with mock.patch.dict(os.environ, {"CKPT_RENDEZVOUS": "launcher"}):
                plan = _restart.Plan(1, 1, 2, 0, 1, "127.0.0.1", port, None)
                gen = _resilient._Generation(plan)
                gen.abort()  # the abort, before any socket of the generation
                started = time.monotonic()
                with self.assertRaises(_resilient.RestartRequested):
                    _resilient._form(gen, "gloo", datetime.timedelta(seconds=20),
                                     None)
                self.assertLess(time.monotonic() - started, 10)
                self.assertFalse(dist.is_initialized())
        finally:
            del server

    def test_bad_rendezvous_variable_is_refused_naming_it(self):
        import ckpt
        from ckpt.torch import _resilient
        from unittest import mock
        for value, served in (("", False), ("launcher", True)):
            with mock.patch.dict(os.environ, {"CKPT_RENDEZVOUS": value}):
                self.assertEqual(_resilient._store_served(), served)
        with mock.patch.dict(os.environ, {"CKPT_RENDEZVOUS": "rank0"}):
            with self.assertRaisesRegex(ckpt.errors.InvalidArgument,
                                        r"\$CKPT_RENDEZVOUS = 'rank0'"):
                _resilient._store_served()


if __name__ == "__main__":
    unittest.main()
