"""The Python side of in-process restart's files (ckpt/_restart.py over
libckpt's ckpt_restart_*): the plan ckptrun writes, read and validated by
libckpt; `capable` and `joined` written for ckptrun; RestartRequested's
place in the exception hierarchy; resilient() outside ckptrun."""

import os
import shutil
import tempfile
import unittest
from unittest import mock

import ckpt
from ckpt import _restart

PLAN = ("generation=3\nrank=1\nworld_size=4\nlocal_rank=1\nlocal_world_size=2\n"
        "master_addr=10.0.0.7\nmaster_port=29503\n")


class RestartFilesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-restart-dir.")
        self.addCleanup(shutil.rmtree, self.dir, True)
        env = mock.patch.dict(os.environ, {"CKPT_RESTART_DIR": self.dir})
        env.start()
        self.addCleanup(env.stop)

    def write_plan(self, text):
        with open(os.path.join(self.dir, "plan.tmp"), "w") as f:
            f.write(text)
        os.rename(os.path.join(self.dir, "plan.tmp"), os.path.join(self.dir, "plan"))

    def read(self, name):
        with open(os.path.join(self.dir, name)) as f:
            return f.read()

    def test_a_newer_plan_is_read_with_every_field(self):
        self.write_plan(PLAN + "restore_step=40\n")
        p = _restart.poll(2)
        self.assertEqual((p.generation, p.rank, p.world_size, p.local_rank, p.local_world_size,
                          p.master_addr, p.master_port, p.restore_step),
                         (3, 1, 4, 1, 2, "10.0.0.7", 29503, 40))

    def test_a_plan_not_newer_is_none_and_no_restore_step_is_a_fresh_start(self):
        self.write_plan(PLAN)
        self.assertIsNone(_restart.poll(3))
        self.assertIsNone(_restart.poll(2).restore_step)

    def test_a_malformed_plan_is_refused_naming_the_key(self):
        self.write_plan(PLAN.replace("master_port=29503", "master_port=70000"))
        with self.assertRaisesRegex(ckpt.InvalidArgument, "master_port"):
            _restart.poll(0)

    def test_capable_names_this_process_and_joined_the_generation(self):
        _restart.enable()
        self.assertEqual(self.read("capable"), "pid=%d\n" % os.getpid())
        _restart.joined(7)
        self.assertEqual(self.read("joined"), "generation=7\n")

    def test_enable_outside_ckptrun_is_refused(self):
        with mock.patch.dict(os.environ, {"CKPT_RESTART_DIR": ""}):
            with self.assertRaisesRegex(ckpt.FailedPrecondition, "CKPT_RESTART_DIR"):
                _restart.enable()


class RestartRequestedTest(unittest.TestCase):
    def test_except_exception_does_not_swallow_it(self):
        self.assertTrue(issubclass(ckpt.RestartRequested, BaseException))
        self.assertFalse(issubclass(ckpt.RestartRequested, Exception))
        with self.assertRaises(ckpt.RestartRequested):
            try:
                raise ckpt.RestartRequested("generation 2's plan arrived", 2)
            except Exception:
                self.fail("caught by except Exception")

    def test_the_environment_is_the_first_plan_and_a_bad_value_is_named(self):
        env = {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "29501",
               "CKPT_GENERATION": "5", "CKPT_RESTORE_STEP": "30", "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "2"}
        with mock.patch.dict(os.environ, env):
            p = _restart.plan_from_env()
            self.assertEqual((p.generation, p.rank, p.world_size, p.master_addr,
                              p.master_port, p.restore_step), (5, 2, 4, "h", 29501, 30))
        with mock.patch.dict(os.environ, dict(env, RANK="4")):
            with self.assertRaisesRegex(ckpt.InvalidArgument, r"\$RANK"):
                _restart.plan_from_env()


class OutsideCkptrunTest(unittest.TestCase):
    def test_train_runs_once_as_rank_0_of_1(self):
        try:
            import ckpt.torch
        except ImportError:
            self.skipTest("this interpreter has no torch")
        calls = []
        keep = {k: os.environ.pop(k) for k in ("CKPT_RESTART_DIR", "RANK", "WORLD_SIZE",
                                                "CKPT_SOCKET", "CKPT_RESTORE_STEP")
                if k in os.environ}
        self.addCleanup(os.environ.update, keep)
        out = ckpt.torch.resilient(lambda ctx: calls.append(
            (ctx.rank, ctx.world_size, ctx.generation, ctx.restore_step, ctx.checkpointer,
             ctx.restarts)) or "result")
        self.assertEqual(out, "result")
        self.assertEqual(calls, [(0, 1, 0, None, None, 0)])


if __name__ == "__main__":
    unittest.main()
