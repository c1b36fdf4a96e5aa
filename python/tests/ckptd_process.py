"""A real ckptd for the Python tests and bench/py_bench.py.

CkptdProcess starts $CKPTD_BINARY (or the given binary) on its own socket,
root and shared-memory prefix inside a directory it is given, with its log
in a file there; start() returns once the socket accepts a connection.
stop() sends SIGTERM and waits (the daemon drains its persists first);
drop_shm() then unlinks the arenas the daemon left, so the next restore
has to come from disk. Not thread-safe.
"""

import glob
import os
import signal
import socket
import subprocess
import time


class CkptdProcess:
    def __init__(self, directory, binary=None, extra_args=()):
        self.binary = binary or os.environ.get("CKPTD_BINARY", "ckptd")
        self.directory = directory
        self.socket = os.path.join(directory, "ckptd.sock")
        self.root = os.path.join(directory, "root")
        self.log = os.path.join(directory, "ckptd.log")
        self.shm_prefix = "ckptpy%d-%d" % (os.getpid(), id(self) % 100000)
        self.extra_args = list(extra_args)
        self.proc = None

    def start(self, timeout=20.0):
        os.makedirs(self.root, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--socket", self.socket, "--root", self.root,
                 "--shm-prefix", self.shm_prefix, "--health-memcpy-mib", "4"] + self.extra_args,
                stdout=log, stderr=subprocess.STDOUT, close_fds=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("ckptd exited with %s during start-up; "
                                   "log:\n%s" % (self.proc.returncode,
                                                 self.log_tail()))
            if os.path.exists(self.socket):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(self.socket)
                    return
                except OSError:
                    pass
                finally:
                    s.close()
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("ckptd did not listen on %s; log:\n%s"
                           % (self.socket, self.log_tail()))

    def stop(self, timeout=60.0):
        if self.proc is None:
            return 0
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def drop_shm(self):
        """Unlinks every arena of this daemon (call after stop())."""
        for path in glob.glob("/dev/shm/%s*" % self.shm_prefix):
            os.unlink(path)

    def log_tail(self, n=4000):
        try:
            with open(self.log, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""
