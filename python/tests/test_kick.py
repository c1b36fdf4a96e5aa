"""ckpt.torch._kick: the no-op signal that makes gloo's event loop take
its turn at once. Two real processes form a gloo group with the kicks
on, reduce while every thread but the main one is kicked (reads, writes
and condition waits interrupted by the hundred), and drop the group
kicked: every sum exact. The kicks stay off where the program has a
handler of its own for the signal (installed before or after the
kicks' own), and with $CKPT_RESILIENT_KICK=0.
"""

import os
import platform
import subprocess
import sys
import textwrap
import unittest

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    raise unittest.SkipTest("this interpreter has no torch")

from tests.test_resilient import free_ports

_RANK = textwrap.dedent("""
    import datetime, sys, threading
    import torch, torch.distributed as dist
    from ckpt.torch import _kick
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0,
                          datetime.timedelta(seconds=60), False)
    before = _kick.threads()
    with _kick.Kicker() as k:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    group = _kick.threads() - before
    # Every thread but this one (gloo's, torch's, the interpreter's) is
    # kicked while the reductions run: until on both ranks 200 signals
    # went out and 20 reductions were checked (x[0] counts the ranks that
    # want more).
    others = _kick.threads() - {threading.get_native_id()}
    x = torch.zeros(1 << 16, dtype=torch.float64)
    n, more = 0, True
    with _kick.Kicker(others) as stress:
        while more:
            n += 1
            x.fill_(rank + n)
            x[0] = 1.0 if n < 20 or stress.sent < 200 else 0.0
            dist.all_reduce(x)
            assert bool((x[1:] == 2 * n + 1).all()), (n, x[:4])
            assert n < 100000, "the kicker sent %d" % stress.sent
            more = x[0].item() > 0
    with _kick.Kicker(group) as drop:
        dist.destroy_process_group()
    print("ok rank=%d reductions=%d kicks=%d/%d/%d group_threads=%d"
          % (rank, n, k.sent, stress.sent, drop.sent, len(group)))
""")

_OFF = textwrap.dedent("""
    import signal, sys
    from ckpt.torch import _kick
    sig = signal.SIGRTMIN + 5
    def mine(s, f):
        pass
    if sys.argv[1] == "handler":
        signal.signal(sig, mine)
    k = _kick.Kicker()
    with k:
        pass
    if sys.argv[1] == "handler-later":
        signal.signal(sig, mine)  # after the kicks installed theirs
        k = _kick.Kicker()
    handler = signal.getsignal(sig)
    print("on=%s ours=%s" % (k._on, handler is _kick._noop))
""")


def _python(code, *args, env=None):
    return subprocess.Popen([sys.executable, "-c", code] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)


@unittest.skipUnless(sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64"),
                     "kicks are sent on Linux x86_64 and aarch64 only")
class KickTest(unittest.TestCase):
    def test_kicked_group_forms_reduces_exactly_and_drops(self):
        port = free_ports(1)
        ranks = [_python(_RANK, r, port) for r in (0, 1)]
        outs = []
        for p in ranks:
            out, _ = p.communicate(timeout=240)
            outs.append(out)
            self.assertEqual(p.returncode, 0, out)
        for r, out in enumerate(outs):
            line = [x for x in out.splitlines() if x.startswith("ok ")]
            self.assertEqual(len(line), 1, out)
            self.assertIn("rank=%d" % r, line[0])
            fields = dict(f.split("=") for f in line[0].split()[1:])
            sent = [int(v) for v in fields["kicks"].split("/")]
            self.assertGreaterEqual(sent[1], 200, out)  # the stress ran kicked
            self.assertGreater(int(fields["group_threads"]), 0, out)

    def test_a_handler_of_the_program_keeps_the_kicks_off_and_is_kept(self):
        p = _python(_OFF, "handler")
        out, _ = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("on=False ours=False", out)
        p = _python(_OFF, "handler-later")
        out, _ = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("on=False ours=False", out)
        p = _python(_OFF, "none")
        out, _ = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("on=True ours=True", out)

    def test_kick_0_in_the_environment_keeps_them_off(self):
        env = dict(os.environ, CKPT_RESILIENT_KICK="0")
        p = _python(_OFF, "none", env=env)
        out, _ = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("on=False ours=False", out)


if __name__ == "__main__":
    unittest.main()
