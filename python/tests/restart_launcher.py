"""Plays ckptrun's side of in-process restart for the Python tests: one
directory per trainer process ($CKPT_RESTART_DIR) holding the `plan` it
writes (client/restart_plan.h's format; libckpt validates it when the
trainer reads it), the launcher's environment for a first start, and
what a test reads back (`capable`, `joined`, the peer-lost note, the
trainer's output). Real trainer processes on localhost; one node, one
ckptd. Not thread-safe: one test thread drives it.
"""

import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class Trainer:
    def __init__(self, proc, directory, log):
        self.proc, self.dir, self.log = proc, directory, log

    @property
    def pid(self):
        return self.proc.pid

    def output(self):
        return read(self.log)

    def joined(self):
        text = read(os.path.join(self.dir, "joined")).strip()
        return int(text.split("=")[1]) if text.startswith("generation=") else None

    def capable(self):
        return read(os.path.join(self.dir, "capable")).strip() == "pid=%d" % self.pid

    def stacks(self):
        """Every thread's Python stack (SIGUSR2, ckpt/_stacks.py), for a
        failure's message; "" from a process that is gone."""
        path = os.path.join(self.dir, "stacks")
        if self.proc.poll() is not None:
            return ""
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not read(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        return read(path)

    def peer_lost_note(self):
        return read(os.path.join(self.dir, "peer-lost"))


class Launcher:
    """store_port: the launcher serves the store of every generation there
    (ckptrun --rendezvous torch; start_store_server) and the trainers are
    its clients ($CKPT_RENDEZVOUS=launcher); None: rank 0 serves one at
    base_port + G % 1000 in each generation."""

    def __init__(self, directory, socket, job, world_size, base_port, command,
                 store_port=None):
        self.dir, self.socket, self.job = directory, socket, job
        self.world_size, self.base_port, self.command = world_size, base_port, command
        self.store_port = store_port
        self.count = 0

    def port(self, generation):
        if self.store_port is not None:
            return self.store_port
        return self.base_port + generation % 1000

    def start_store_server(self):
        """`python -m ckpt.torch.store_server` on store_port, as ckptrun
        starts it; its output in <dir>/store.log."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [os.path.dirname(HERE), env.get("PYTHONPATH")] if p)
        log = os.path.join(self.dir, "store.log")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ckpt.torch.store_server", "--port",
                 str(self.store_port)], env=env, stdout=out, stderr=subprocess.STDOUT)
        return proc, log

    def plan_text(self, generation, rank, restore_step):
        text = ("generation=%d\nrank=%d\nworld_size=%d\nlocal_rank=%d\n"
                "local_world_size=%d\nmaster_addr=127.0.0.1\nmaster_port=%d\n"
                % (generation, rank, self.world_size, rank, self.world_size,
                   self.port(generation)))
        if restore_step is not None:
            text += "restore_step=%d\n" % restore_step
        return text

    def write_plan(self, trainer, generation, rank, restore_step):
        """Replaces the trainer's plan atomically, as ckptrun does."""
        tmp = os.path.join(trainer.dir, "plan.tmp")
        with open(tmp, "w") as f:
            f.write(self.plan_text(generation, rank, restore_step))
        os.rename(tmp, os.path.join(trainer.dir, "plan"))

    def start(self, generation, rank, restore_step):
        return self._start(generation, rank, restore_step)

    def start_warm(self):
        """A warm process (ckptrun --warm): CKPT_WARM=1, no rank, no plan
        until write_plan gives it one."""
        return self._start(None, None, None)

    def _start(self, generation, rank, restore_step):
        self.count += 1
        d = os.path.join(self.dir, "proc-%d" % self.count)
        os.makedirs(d, mode=0o700)
        env = dict(os.environ)
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "CKPT_GENERATION", "CKPT_RESTORE_STEP", "CKPT_WARM",
                  "CKPT_RENDEZVOUS"):
            env.pop(k, None)
        env.update(CKPT_SOCKET=self.socket, CKPT_JOB=self.job, CKPT_RESTART_DIR=d,
                   CKPT_PEER_LOST_FILE=os.path.join(d, "peer-lost"), PYTHONUNBUFFERED="1",
                   CKPT_STACKS_FILE=os.path.join(d, "stacks"))
        if generation is None:
            env["CKPT_WARM"] = "1"
        else:
            env.update(RANK=str(rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(self.world_size), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(self.port(generation)),
                       CKPT_GENERATION=str(generation))
            if restore_step is not None:
                env["CKPT_RESTORE_STEP"] = str(restore_step)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [os.path.dirname(HERE), env.get("PYTHONPATH")] if p)
        if self.store_port is not None:
            env["CKPT_RENDEZVOUS"] = "launcher"
        t = Trainer(None, d, os.path.join(d, "out.log"))
        with open(os.path.join(d, "peer-lost"), "w"):
            pass  # ckptrun empties it before each start
        if generation is not None:
            self.write_plan(t, generation, rank, restore_step)
        with open(t.log, "wb") as log:
            t.proc = subprocess.Popen([sys.executable] + list(self.command), env=env,
                                      stdout=log, stderr=subprocess.STDOUT, close_fds=True)
        return t
