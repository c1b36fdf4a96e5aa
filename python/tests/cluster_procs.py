"""A simulated multi-node ckptd cluster for the Python training tests.

Like tests/cluster_harness.* and scripts/demo.sh, with real processes on
loopback: one ckpt-coordinator, nodes that are each a ckptd (own socket,
root and shared-memory prefix; one shared root) plus a ckptrun launching
the given trainer command, and spares. kill_node() SIGKILLs a node's
ckptrun process group and its ckptd and unlinks its shared memory. Binaries
come from $CKPT_COORDINATOR_BINARY, $CKPTD_BINARY, $CKPTRUN_BINARY and
$CKPTCTL_BINARY. Every process writes a log under the cluster's directory.
Not thread-safe: one test thread drives it.
"""

import glob
import json
import os
import re
import signal
import subprocess
import time


def _binary(var, name):
    return os.environ.get(var, name)


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))


def children(parent_pid, comm=None):
    """Pids whose parent is parent_pid (and whose comm is `comm`)."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[1]) == parent_pid and fields[0] != "Z" and (comm is None or name == comm):
            out.append(int(stat.split("/")[2]))
    return out


class Cluster:
    def __init__(self, directory, job, world_size, nproc_per_node, heartbeat_ms=2000):
        self.dir, self.job = directory, job
        self.world_size, self.nproc_per_node = world_size, nproc_per_node
        self.heartbeat_ms = heartbeat_ms
        self.shared = os.path.join(directory, "shared")
        self.shm_tag = "ckptpyc%d" % os.getpid()
        self.coordinator = None
        self.address = None
        self.daemons, self.launchers = {}, {}
        os.makedirs(self.shared, exist_ok=True)

    def _spawn(self, argv, log, env=None):
        with open(log, "ab") as f:
            return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, close_fds=True)

    def start_coordinator(self, extra_args=()):
        log = os.path.join(self.dir, "coordinator.log")
        self.coordinator = self._spawn(
            [_binary("CKPT_COORDINATOR_BINARY", "ckpt-coordinator"), "--listen", "127.0.0.1:0",
             "--state", os.path.join(self.dir, "coordinator"), "--shared-root", self.shared,
             "--heartbeat-timeout-ms", str(self.heartbeat_ms),
             "--insecure",
             # The simulated nodes share one machine: a figure measured
             # under the others' load is not a slow node.
             "--health-min-ratio", "0"] + list(extra_args), log)  # plaintext on loopback must be asked for

        def listening():
            with open(log) as f:
                m = re.search(r"^listening on (\S+)$", f.read(), re.M)
            self.address = m.group(1) if m else None
            return self.address is not None
        wait_for(listening, 20, "ckpt-coordinator to listen")

    def ctl_json(self, *args):
        """`ckptctl --coordinator ADDR ARGS... --json`, parsed; {} on failure."""
        r = subprocess.run([_binary("CKPTCTL_BINARY", "ckptctl"), "--coordinator", self.address]
                           + list(args) + ["--json"], capture_output=True, timeout=20)
        try:
            return json.loads(r.stdout.decode()) if r.returncode == 0 else {}
        except ValueError:
            return {}

    def cluster(self):
        return self.ctl_json("cluster")

    def node_alive(self, node_id):
        return any(n.get("node_id") == node_id and n.get("health") == "ALIVE"
                   for n in self.cluster().get("nodes", []))

    def node_dir(self, node_id):
        return os.path.join(self.dir, "node-" + node_id)

    def socket(self, node_id):
        return os.path.join(self.node_dir(node_id), "ckptd.sock")

    def start_node(self, node_id, spare=False, capacity=None, own_root=False, extra_args=()):
        """own_root: the node's --shared-root is a directory of its own (no
        node reads another's stored shards); capacity: other than
        nproc_per_node; extra_args: more ckptd flags."""
        d = self.node_dir(node_id)
        os.makedirs(d, exist_ok=True)
        stored = os.path.join(d, "stored") if own_root else self.shared
        os.makedirs(stored, exist_ok=True)
        argv = [_binary("CKPTD_BINARY", "ckptd"), "--socket", self.socket(node_id),
                "--root", os.path.join(d, "root"), "--shared-root", stored,
                "--coordinator", self.address, "--node-id", node_id, "--advertise-addr", "127.0.0.1",
                "--capacity", str(self.nproc_per_node if capacity is None else capacity),
                "--shm-prefix", "%s-%s" % (self.shm_tag, node_id),
                "--health-memcpy-mib", "4"] + list(extra_args)
        if spare:
            argv.append("--spare")
        self.daemons[node_id] = self._spawn(argv, os.path.join(d, "ckptd.log"))
        wait_for(lambda: self.node_alive(node_id), 30, "ckptd of node %s to join" % node_id)

    def tmp_dir(self, node_id):
        """The TMPDIR of the node's ckptrun and trainers: what a SIGKILLed
        ckptrun cannot remove (its stacks directory) stays in the test's
        directory, not in /tmp."""
        return os.path.join(self.node_dir(node_id), "tmp")

    def start_launcher(self, node_id, command, master_port, env=None):
        env = dict(os.environ if env is None else env)
        env["TMPDIR"] = self.tmp_dir(node_id)
        os.makedirs(env["TMPDIR"], exist_ok=True)
        self.launchers[node_id] = self._spawn(
            [_binary("CKPTRUN_BINARY", "ckptrun"), "--coordinator", self.address, "--node-id", node_id,
             "--nproc-per-node", str(self.nproc_per_node), "--world-size", str(self.world_size),
             "--job", self.job, "--socket", self.socket(node_id), "--poll-ms", "50",
             "--grace-ms", "1000", "--master-port", str(master_port), "--"] + list(command),
            self.log(node_id), env=env)

    def log(self, node_id):
        return os.path.join(self.node_dir(node_id), "ckptrun.log")

    def logs_text(self):
        out = []
        for node_id in sorted(self.launchers):
            try:
                with open(self.log(node_id), errors="replace") as f:
                    out.append(f.read())
            except OSError:
                pass
        return "\n".join(out)

    def trainers(self, node_id):
        return children(self.launchers[node_id].pid, "python3")

    def kill_node(self, node_id):
        launcher = self.launchers.pop(node_id)
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        daemon = self.daemons.pop(node_id)
        daemon.kill()
        daemon.wait()
        for path in glob.glob("/dev/shm/%s-%s*" % (self.shm_tag, node_id)):
            os.unlink(path)

    def close(self):
        for proc in list(self.launchers.values()) + list(self.daemons.values()) + [self.coordinator]:
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
        for path in glob.glob("/dev/shm/%s-*" % self.shm_tag):
            os.unlink(path)
