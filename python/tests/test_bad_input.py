"""Refusals of ckpt.torch against a real ckptd: an unsupported object, a
shape/dtype mismatch, a missing key, bad steps and options, a missing
environment variable, no daemon, another uid's job. Each must be a
ckpt.Error naming the key or field; the daemon keeps serving."""

import json
import os
import subprocess
import sys
import unittest

try:
    import torch
except ImportError:  # the CTest still reports the reason
    raise unittest.SkipTest("torch is not installed for %s" % sys.executable)

import ckpt
import ckpt.torch
from tests.daemon_case import DaemonTestCase, HERE, PACKAGE_ROOT


class BadInputTest(DaemonTestCase):

    def assert_error(self, cls, text, fn, *args, **kwargs):
        with self.assertRaises(cls) as e:
            fn(*args, **kwargs)
        self.assertIn(text, str(e.exception))
        self.assertIsInstance(e.exception, ckpt.Error)
        self.assertIsInstance(e.exception.code, int)
        return e.exception

    def test_an_unsupported_object_is_refused_naming_its_key_path(self):
        c = self.checkpointer()
        sd = {"optim": {"param_groups": [{"lr": 1.0, "foo": object()}]}}
        self.assert_error(ckpt.InvalidArgument,
                          "state_dict['optim']['param_groups'][0]['foo']",
                          c.save, 1, sd)
        self.assert_error(ckpt.InvalidArgument, "state_dict[(1, 2)]",
                          c.save, 1, {(1, 2): 3})
        self.assert_error(ckpt.InvalidArgument, "state_dict['q']",
                          c.save, 1, {"q": torch.quantize_per_tensor(
                              torch.ones(2), 0.1, 0, torch.qint8)})
        self.assert_error(ckpt.InvalidArgument, "state_dict: a dict",
                          c.save, 1, [torch.ones(1)])
        self.assertIsNone(c.latest_step())  # nothing was saved

    def test_a_shape_or_dtype_mismatch_at_load_names_the_key(self):
        c = self.checkpointer()
        c.save(1, {"m": {"w": torch.ones(2, 3)}})
        self.assert_error(ckpt.InvalidArgument, "state_dict['m']['w']: shape",
                          c.load, 1, {"m": {"w": torch.ones(3, 2)}})
        self.assert_error(ckpt.InvalidArgument, "state_dict['m']['w']: dtype",
                          c.load, 1, {"m": {"w": torch.ones(2, 3).double()}})

    def test_a_missing_key_at_load_names_it(self):
        c = self.checkpointer()
        c.save(1, {"a": torch.ones(1), "b": torch.ones(1)})
        self.assert_error(ckpt.NotFound, "state_dict['b']: in step 1",
                          c.load, 1, {"a": torch.ones(1)})
        self.assert_error(ckpt.NotFound, "state_dict['c']: not in step 1",
                          c.load, 1, {"a": torch.ones(1), "b": torch.ones(1),
                                      "c": torch.ones(1)})
        self.assert_error(ckpt.NotFound, "step 9", c.load, 9,
                          {"a": torch.ones(1)})

    def test_bad_steps_and_options_name_the_field(self):
        c = self.checkpointer()
        self.assert_error(ckpt.InvalidArgument, "step", c.save, -1, {})
        self.assert_error(ckpt.InvalidArgument, "step", c.save, "1", {})
        self.assert_error(ckpt.InvalidArgument, "timeout", c.wait_durable, 1,
                          timeout=-1)
        self.assert_error(ckpt.InvalidArgument, "no_such_option",
                          ckpt.torch.Checkpointer, job="j",
                          socket=self.daemon.socket, rank=0, world_size=1,
                          no_such_option=1)
        self.assert_error(ckpt.InvalidArgument, "num_slots",
                          ckpt.torch.Checkpointer, job="j",
                          socket=self.daemon.socket, rank=0, world_size=1,
                          num_slots=1)
        self.assert_error(ckpt.InvalidArgument, "rank",
                          ckpt.torch.Checkpointer, job="j",
                          socket=self.daemon.socket, rank=3, world_size=2)

    def test_a_missing_environment_variable_is_named(self):
        env = {k: v for k, v in os.environ.items()
               if k not in ("CKPT_JOB", "CKPT_SOCKET", "RANK", "WORLD_SIZE")}
        code = ("import ckpt, ckpt.torch\n"
                "try:\n"
                "    ckpt.torch.Checkpointer(socket=%r)\n"
                "except ckpt.InvalidArgument as e:\n"
                "    print(e)\n" % self.daemon.socket)
        out = subprocess.run([sys.executable, "-c", code], env=env,
                             cwd=PACKAGE_ROOT, capture_output=True, text=True,
                             timeout=60)
        self.assertIn("$CKPT_JOB", out.stdout, out.stderr)
        env.update(CKPT_JOB="envjob", CKPT_SOCKET=self.daemon.socket,
                   RANK="0", WORLD_SIZE="1")
        code = ("import ckpt.torch\n"
                "c = ckpt.torch.Checkpointer()\n"
                "print(c.job, c.rank, c.world_size, c.latest_step())\n")
        out = subprocess.run([sys.executable, "-c", code], env=env,
                             cwd=PACKAGE_ROOT, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.stdout.strip(), "envjob 0 1 None", out.stderr)
        # Not under a launcher (no $RANK, no $WORLD_SIZE): rank 0 of 1.
        # One of the two without the other is still refused, naming it.
        for k in ("RANK", "WORLD_SIZE"):
            env.pop(k)
        out = subprocess.run([sys.executable, "-c", code], env=env,
                             cwd=PACKAGE_ROOT, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.stdout.strip(), "envjob 0 1 None", out.stderr)
        env["WORLD_SIZE"] = "2"
        code = ("import ckpt, ckpt.torch\n"
                "try:\n"
                "    ckpt.torch.Checkpointer()\n"
                "except ckpt.InvalidArgument as e:\n"
                "    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code], env=env,
                             cwd=PACKAGE_ROOT, capture_output=True, text=True,
                             timeout=60)
        self.assertIn("$RANK", out.stdout, out.stderr)

    def test_a_daemon_that_is_not_running_is_unavailable_naming_the_socket(self):
        missing = os.path.join(self.tmp, "nobody-listens.sock")
        e = self.assert_error(ckpt.Unavailable, missing,
                              ckpt.torch.Checkpointer, job="j",
                              socket=missing, rank=0, world_size=1)
        self.assertEqual(e.code, 14)
        self.assertEqual(e.code_name, "UNAVAILABLE")

    def test_a_job_of_another_uid_is_permission_denied(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to start the probe that drops to "
                          "uid 65534")
        job = self.new_job()
        c = self.checkpointer(job=job)
        c.save(1, {"t": torch.ones(4)})
        out = subprocess.run(
            [sys.executable, os.path.join(HERE, "uid_probe.py"),
             self.daemon.socket, job],
            cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        results = json.loads(out.stdout.strip().splitlines()[-1])
        # Connecting reaches no job yet (libckpt registers on first save).
        self.assertIn(results.pop("connect")[0],
                      ("no exception", "PermissionDenied"))
        self.assertEqual(sorted(results), ["latest_step", "load", "save"])
        for what, (name, message) in results.items():
            self.assertEqual(name, "PermissionDenied", (what, message))
            self.assertIn("uid 65534", message)
        self.assertEqual(c.latest_step(), 1)  # untouched


if __name__ == "__main__":
    unittest.main()
