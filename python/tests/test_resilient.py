"""ckpt.torch.resilient: surviving ranks restart in their process.

examples/train_gpt.py (2 ranks over gloo on localhost, one real ckptd) is
started by a test that plays ckptrun (tests/restart_launcher.py): it kills
a rank's process, or hangs one, and writes the next generation's plan.
Each run must end with the params_digest of an undisturbed run, the
survivors in the processes they started in.
"""

import os
import re
import shutil
import signal
import sys
import tempfile
import time
import unittest

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    raise unittest.SkipTest("this interpreter has no torch")

import ckpt
import ckpt.torch
from tests.ckptd_process import CkptdProcess
from tests.cluster_procs import wait_for
from tests.restart_launcher import Launcher

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "train_gpt.py")
WORLD = 2
_references = {}


def train_args(steps, every):
    return [TRAIN, "--steps", str(steps), "--ckpt-every", str(every), "--threads", "1",
            "--timeout-s", "30", "--log-every", "1"]


def digests(text):
    return re.findall(r"^params_digest=([0-9a-f]+)$", text, re.M)


def generation_output(text, generation):
    """The output after `generation`'s start line ("" before it)."""
    m = re.search(r"^generation %d: rank \d+ of \d+ starts.*$" % generation, text, re.M)
    return text[m.end():] if m else None


def first_step(text, generation):
    rest = generation_output(text, generation)
    return rest is not None and re.search(r"^step \d+ loss ", rest, re.M) is not None


def free_ports(count):
    """The first of `count` consecutive TCP ports that nothing on this
    machine is bound to now, below the ephemeral range (other tests on a
    shared machine pick rendezvous ports too: a port taken by one of them
    makes a rendezvous fail)."""
    import random
    import socket
    rng = random.Random(os.getpid())
    while True:
        base = rng.randrange(10000, 32000)
        held = []
        try:
            for p in range(base, base + count):
                s = socket.socket(socket.AF_INET6)
                held.append(s)
                s.bind(("::", p))  # dual-stack: IPv4 and IPv6 both free
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()


def reference(steps):
    """The undisturbed run's digest: WORLD ranks by hand, no checkpoints."""
    if steps in _references:
        return _references[steps]
    import subprocess
    env = dict(os.environ, WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_ports(1)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(HERE), env.get("PYTHONPATH")] if p)
    for k in ("CKPT_SOCKET", "CKPT_JOB", "CKPT_RESTART_DIR", "CKPT_RESTORE_STEP"):
        env.pop(k, None)
    procs = [subprocess.Popen([sys.executable] + train_args(steps, 0) + ["--log-every", "0"],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for r in range(WORLD)]
    outs = [p.communicate(timeout=300)[0].decode() for p in procs]
    found = set(d for out in outs for d in digests(out))
    assert len(found) == 1 and all(p.returncode == 0 for p in procs), outs
    _references[steps] = found.pop()
    return _references[steps]


def usage(pid):
    """(RSS bytes, open descriptors, threads, RssShmem bytes) of a live
    process."""
    with open("/proc/%d/status" % pid) as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    rss = int(status["VmRSS"].split()[0]) * 1024
    shmem = int(status["RssShmem"].split()[0]) * 1024
    return rss, len(os.listdir("/proc/%d/fd" % pid)), int(status["Threads"]), shmem


class ResilientTest(unittest.TestCase):
    jobs = 0

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ckpt-resilient-test.")
        # Every durable step kept (--retain 0): the tests play the launcher
        # without a coordinator, and every generation restores one step
        # that retention would drop once three newer ones are durable
        # ("job has no step 1 ...; newest is 4").
        cls.daemon = CkptdProcess(cls.tmp, extra_args=["--retain", "0"])
        cls.daemon.start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.daemon.drop_shm()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        ResilientTest.jobs += 1
        self.job = "resilient%d" % ResilientTest.jobs
        self.dir = os.path.join(self.tmp, self.job)
        os.makedirs(self.dir)
        self.trainers = []

    def tearDown(self):
        for t in self.trainers:
            if t.proc.poll() is None:
                t.proc.kill()
                t.proc.wait()

    def launcher(self, steps, every, extra=()):
        port = free_ports(25)
        return Launcher(self.dir, self.daemon.socket, self.job, WORLD, port,
                        train_args(steps, every) + list(extra))

    def start(self, launcher, generation, rank, restore):
        t = launcher.start(generation, rank, restore)
        self.trainers.append(t)
        return t

    def latest(self):
        """The step a coordinator's plan would restore: the newest one
        every rank holds."""
        with ckpt.torch.Checkpointer(job=self.job, socket=self.daemon.socket, rank=0,
                                     world_size=WORLD) as c:
            return c.latest_step()

    def say(self, trainers, stacks=False):
        return "\n".join("--- %s (pid %d):\n%s%s" % (t.dir, t.pid, t.output()[-3000:],
                                                   t.stacks() if stacks else "")
                         for t in trainers)

    def finish(self, trainers, steps):
        for t in trainers:
            try:
                rc = t.proc.wait(timeout=240)
            except Exception:
                rc = None
            self.assertEqual(rc, 0, self.say(trainers))
        want = reference(steps)
        for t in trainers:
            self.assertEqual(digests(t.output()), [want], self.say(trainers))

    def sockets(self, ln, restarts):
        """`ss` lines of the rendezvous ports, for a failure's message."""
        import subprocess
        ports = {str(ln.port(g)) for g in range(restarts + 1)}
        try:
            out = subprocess.run(["ss", "-tanp"], capture_output=True, text=True,
                                 timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as e:
            return "ss: %s" % e
        return "sockets on the rendezvous ports:\n" + "\n".join(
            line for line in out.splitlines()
            if any(":" + p + " " in line + " " for p in ports))

    def assert_kept(self, t, generation, restarts):
        self.assertIn("generation %d: rank" % generation, t.output())
        self.assertRegex(t.output(), r"generation %d: rank \d of 2 starts \(pid %d, in-process "
                         r"restarts %d\)" % (generation, t.pid, restarts))

    def test_survivor_keeps_its_process_when_rank_0_is_killed_bit_identical(self):
        steps = 40
        ln = self.launcher(steps, 3, ["--step-sleep-ms", "20"])
        r0, r1 = self.start(ln, 0, 0, None), self.start(ln, 0, 1, None)
        wait_for(lambda: r0.capable() and r1.capable(), 60, "both trainers to say they are capable")
        wait_for(lambda: "step 10 loss" in r1.output(), 120, "step 10")
        os.kill(r0.pid, signal.SIGKILL)
        killed = time.monotonic()
        r0.proc.wait()
        # The survivor's collective broke on the lost peer: it says so and
        # waits for the plan instead of exiting.
        wait_for(lambda: r1.peer_lost_note() == "\n", 60, "the survivor's peer-lost note")
        self.assertIsNone(r1.proc.poll(), self.say([r1]))
        restore = self.latest()
        self.assertIsNotNone(restore)
        ln.write_plan(r1, 1, 1, restore)
        n0 = self.start(ln, 1, 0, restore)
        wait_for(lambda: first_step(r1.output(), 1), 120, "the survivor's first step")
        print("kill -> survivor's first step: %.0f ms" % ((time.monotonic() - killed) * 1e3),
              file=sys.stderr)
        self.finish([r1, n0], steps)
        self.assertEqual(r1.joined(), 1)
        self.assert_kept(r1, 1, 1)
        self.assertIn("restored step %d" % restore, generation_output(r1.output(), 1))

    def test_killed_rank_is_replaced_by_a_warm_process_bit_identical(self):
        steps = 40
        ln = self.launcher(steps, 3, ["--step-sleep-ms", "20"])
        r0, r1 = self.start(ln, 0, 0, None), self.start(ln, 0, 1, None)
        warm = ln.start_warm()
        self.trainers.append(warm)
        wait_for(lambda: r0.capable() and r1.capable() and warm.capable(), 60,
                 "the trainers and the warm process to say they are capable")
        # It says so after it wrote `capable`: wait for the line, do not
        # assume it is already in the log.
        wait_for(lambda: "waiting for a rank" in warm.output(), 60,
                 "the warm process to say it waits for a rank")
        wait_for(lambda: "step 10 loss" in r1.output(), 120, "step 10")
        os.kill(r0.pid, signal.SIGKILL)
        killed = time.monotonic()
        r0.proc.wait()
        wait_for(lambda: r1.peer_lost_note() == "\n", 60, "the survivor's peer-lost note")
        restore = self.latest()
        self.assertIsNotNone(restore)
        ln.write_plan(r1, 1, 1, restore)
        ln.write_plan(warm, 1, 0, restore)  # what ckptrun --warm does
        wait_for(lambda: first_step(warm.output(), 1), 120, "the warm process's first step")
        print("kill -> warm process's first step: %.0f ms"
              % ((time.monotonic() - killed) * 1e3), file=sys.stderr)
        self.finish([r1, warm], steps)
        self.assertRegex(warm.output(), r"generation 1: rank 0 of 2 starts \(pid %d, "
                         r"in-process restarts 0\)" % warm.pid)
        self.assertIn("restored step %d" % restore, generation_output(warm.output(), 1))
        self.assert_kept(r1, 1, 1)

    def test_a_plan_aborts_a_collective_blocked_on_a_live_peer(self):
        steps = 30
        ln = self.launcher(steps, 2, ["--fault-hang", "9:1"])
        r0, r1 = self.start(ln, 0, 0, None), self.start(ln, 0, 1, None)
        wait_for(lambda: "fault-hang: rank 1 spins" in r1.output(), 120, "rank 1 to hang")
        restore = self.latest()
        ln.write_plan(r0, 1, 0, restore)
        # Rank 0 waits in the all-reduce for rank 1, which is alive: only
        # the abort of its group lets it leave for generation 1.
        wait_for(lambda: r0.joined() == 1, 60, "rank 0 to join generation 1")
        self.assertIsNone(r1.proc.poll())
        self.assertIn("step 8 loss", r0.output())
        self.assertNotIn("step 9 loss", r0.output())
        os.kill(r1.pid, signal.SIGKILL)  # what ckptrun's restart timeout does
        r1.proc.wait()
        n1 = self.start(ln, 1, 1, restore)
        self.finish([r0, n1], steps)
        self.assert_kept(r0, 1, 1)

    def test_a_plan_cuts_a_pause_short(self):
        # Each step is followed by a 10-minute ctx.sleep (train_gpt's
        # --step-sleep-ms): a plan must end it, or no rank joins before
        # the wait below gives up. Before ctx.sleep, train_gpt paced with
        # time.sleep and the survivors waited their pause out.
        ln = self.launcher(30, 1, ["--step-sleep-ms", "600000"])
        r0, r1 = self.start(ln, 0, 0, None), self.start(ln, 0, 1, None)
        wait_for(lambda: "step 1 loss" in r0.output() and "step 1 loss" in r1.output(),
                 120, "both ranks to train step 1")
        restore = self.latest()
        ln.write_plan(r0, 1, 0, restore)
        ln.write_plan(r1, 1, 1, restore)
        wait_for(lambda: r0.joined() == 1 and r1.joined() == 1, 60,
                 "both ranks to leave their pause for generation 1")
        wait_for(lambda: first_step(r0.output(), 1) and first_step(r1.output(), 1), 120,
                 "both ranks to train in generation 1")
        for t in (r0, r1):  # generation 0 ended in its first pause
            out = t.output()
            gen0 = out[:out.find("generation 1: rank")]
            self.assertIn("step 1 loss", gen0, out)
            self.assertNotIn("step 2 loss", gen0, out)
        self.assert_kept(r0, 1, 1)
        self.assert_kept(r1, 1, 1)

    def test_a_probe_connected_to_itself_is_not_a_listening_store(self):
        # A probe handed the store's own port connects to itself (a TCP
        # self-connect on localhost): _wait_listening must keep waiting,
        # and leave no TIME_WAIT that keeps the store from binding the port.
        # Before: it returned at once, and rank 0's bind failed EADDRINUSE.
        import socket
        import threading
        from ckpt.torch import _resilient
        port = free_ports(1)
        plan = type("P", (), dict(master_addr="127.0.0.1", master_port=port, generation=0))()
        real = socket.create_connection
        calls = []
        # Set at the second probe: the self-connected socket is closed by
        # then. (Set at the first, the store raced its close and could find
        # the port still taken by the probe itself, not by a TIME_WAIT.)
        probed_again = threading.Event()
        listening = threading.Event()

        def probe(address, timeout=None):
            calls.append(address)
            if len(calls) > 1:
                probed_again.set()
                return real(address, timeout=timeout)
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.connect(("127.0.0.1", port))  # a self-connect
            return s

        def serve():
            if not probed_again.wait(30):
                return  # _wait_listening returned on the self-connect
            srv = socket.socket()  # no SO_REUSEADDR: a TIME_WAIT would refuse it
            try:
                srv.bind(("127.0.0.1", port))
                srv.listen(1)
                listening.set()
                srv.accept()[0].close()
            finally:
                srv.close()

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        socket.create_connection = probe
        try:
            _resilient._wait_listening(plan, None, time.monotonic() + 30)
        finally:
            socket.create_connection = real
        self.assertTrue(listening.is_set(), "returned on its own self-connect")
        server.join(30)

    def test_sleep_refuses_a_bad_duration_naming_it(self):
        from ckpt.torch._resilient import Context
        ctx = Context(type("P", (), dict(rank=0, world_size=1, local_rank=0, generation=0,
                                         restore_step=None))(), None, None, 0)
        for bad in (-1, "1", None, float("nan"), True):
            with self.assertRaises(ckpt.InvalidArgument) as e:
                ctx.sleep(bad)
            self.assertIn("seconds", str(e.exception))
        ctx.sleep(0)  # no monitor: a plain sleep

    # Off by default: on a loaded 2-core machine one of its twenty
    # generations at times never forms (rank 0 serves the store and waits
    # in gloo's connect; rank 1, which left the generation before on a
    # broken collective rather than on the plan, probes the store's port
    # for 60 s and never connects: "Socket Timeout" / "does not listen").
    # A rendezvous race of the in-process restart, open (see the closing
    # note of 2026-11-30); CKPT_TEST_MANY_RESTARTS=1 runs the test.
    @unittest.skipUnless(os.environ.get("CKPT_TEST_MANY_RESTARTS") == "1",
                         "a known rendezvous race; CKPT_TEST_MANY_RESTARTS=1 runs it")
    def test_twenty_restarts_in_process_leak_nothing_and_end_bit_identical(self):
        steps, restarts = 300, 20
        ln = self.launcher(steps, 1, ["--step-sleep-ms", "10"])
        ranks = [self.start(ln, 0, r, None) for r in range(WORLD)]
        seen = []
        try:
            self.restart_many(ln, ranks, restarts, seen)
        except AssertionError as e:
            raise AssertionError("%s\n%s\n%s" % (e, self.say(ranks, stacks=True),
                                                 self.sockets(ln, restarts))) from None
        self.finish(ranks, steps)
        for t in ranks:
            self.assert_kept(t, restarts, restarts)
        self.assert_flat(seen, restarts)

    def restart_many(self, ln, ranks, restarts, seen):
        # Every generation restores the same step. A generation still
        # running saves steps above its restore step, and its first save
        # drops the newer steps of the generation before (a rewind):
        # without a coordinator fencing the old generation, the one step
        # no running generation can drop is the one they all restore.
        wait_for(lambda: self.latest() is not None, 120, "a first checkpoint")
        restore = self.latest()
        for g in range(1, restarts + 1):
            if g % 2:
                # While the generation restores (or is about to): a restart
                # during a restore.
                wait_for(lambda: all(generation_output(t.output(), g - 1) is not None
                                     for t in ranks), 120, "generation %d to start" % (g - 1))
            else:
                # While it trains, a save always in flight (--ckpt-every 1).
                wait_for(lambda: all(first_step(t.output(), g - 1) for t in ranks), 120,
                         "generation %d's first step" % (g - 1))
            for r, t in enumerate(ranks):
                ln.write_plan(t, g, r, restore)
            wait_for(lambda: all(first_step(t.output(), g) for t in ranks), 120,
                     "generation %d's first step" % g)
            seen.append([usage(t.pid) for t in ranks])

    def assert_flat(self, seen, restarts):
        for r in range(WORLD):
            print("rank %d, RSS MiB after each restart: %s" % (r, " ".join(
                "%.0f" % (row[r][0] / 2**20) for row in seen)), file=sys.stderr)
        for r in range(WORLD):
            # RSS against the fifth restart's: within the first few restarts
            # RSS steps up once (about 96 MiB of anonymous memory with one
            # more thread, on torch 1.13; at restart 2 or 3), then stays
            # flat to the 20th. Descriptors and threads against the first's.
            rss_base = seen[4][r][0]
            first, last = seen[0][r], seen[-1][r]
            print("rank %d after restart 1 / %d: RSS %.1f / %.1f MiB, fds %d / %d, threads %d / %d"
                  % (r, restarts, first[0] / 2**20, last[0] / 2**20, first[1], last[1],
                     first[2], last[2]), file=sys.stderr)
            for g, row in enumerate(seen, 1):
                rss, fds, threads, _ = row[r]
                what = "rank %d, restart %d: %r vs the first's %r" % (r, g, row[r], first)
                if g >= 5:
                    self.assertLessEqual(abs(rss - rss_base), 0.05 * rss_base, what)
                self.assertLessEqual(abs(fds - first[1]), 2, what)
                self.assertLessEqual(abs(threads - first[2]), 2, what)


if __name__ == "__main__":
    unittest.main()
