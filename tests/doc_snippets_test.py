#!/usr/bin/env python3
"""Runs the documentation's runnable code blocks against a real ckptd.

A block is runnable when the line right before its opening fence is the
HTML comment `<!-- doc-test -->` (GitHub renders nothing for it), e.g.

    <!-- doc-test -->
    ```python
    import ckpt.torch
    ...
    ```

The fence's language says how it runs:
  c       cc -std=c11 against include/ and the build's libckpt.so, then run;
  cpp     c++ -std=c++20 against include/ and the build's libckpt.a (linked
          as doc_link_probe, an in-tree program that links ckpt_client);
  python  python3 with PYTHONPATH=python/ and CKPT_LIB (the build's libckpt);
  sh      bash -e with the build's binaries first on PATH.
Every block gets its own ckptd (fresh socket, root and shared memory) and a
scratch working directory; its environment names them, as a launcher or a
user would: CKPT_SOCKET, CKPT_JOB, CKPT_ROOT (the daemon's --root), RANK=0,
WORLD_SIZE=1, MASTER_ADDR/MASTER_PORT (a free local port, for a process
group). A C, C++ or Python block runs twice against the same daemon: a
job's first run, then a rerun that must resume from what the first saved.
So a block must be a whole program as a user would paste it, guard the
first run, and set up what it needs; the harness adds nothing to its text.

--torch runs only the blocks that import torch (slow: torch loads in
seconds), --no-torch only the others. Exit status 0 only if every selected
block ran with exit status 0 both times; each failure is printed with its
file and line.
"""

import argparse
import glob
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time

MARKER = "<!-- doc-test -->"
LANGS = {"c": "c", "cpp": "cpp", "c++": "cpp", "python": "python",
         "sh": "sh", "bash": "sh"}
RUN_TIMEOUT_S = 120


class Block:
    def __init__(self, path, line, lang, text):
        self.path, self.line, self.lang, self.text = path, line, lang, text

    def where(self):
        return "%s:%d (%s)" % (self.path, self.line, self.lang)

    def uses_torch(self):
        return re.search(r"^\s*(import|from)\s+(torch|ckpt\.torch)\b",
                         self.text, re.M) is not None


def extract(path, display):
    """The runnable blocks of one Markdown file; a marker before anything
    but a fence of a known language is an error."""
    blocks, errors = [], []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() != MARKER:
            i += 1
            continue
        fence = lines[i + 1] if i + 1 < len(lines) else ""
        m = re.match(r"^(`{3,})\s*([A-Za-z+]*)", fence)
        if not m or m.group(2) not in LANGS:
            errors.append("%s:%d: %s must be followed by a fence of one of %s"
                          % (display, i + 1, MARKER, sorted(LANGS)))
            i += 1
            continue
        start = i + 2
        end = start
        while end < len(lines) and not lines[end].startswith(m.group(1)):
            end += 1
        if end == len(lines):
            errors.append("%s:%d: unclosed fence" % (display, i + 2))
            break
        blocks.append(Block(display, i + 2, LANGS[m.group(2)],
                            "\n".join(lines[start:end]) + "\n"))
        i = end + 1
    return blocks, errors


# What torch's TCPStore says when MASTER_PORT was taken meanwhile.
PORT_TAKEN = "errno: 98 - Address already in use"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env, cwd, input_text=None):
    """(exit status, combined output) of one command."""
    try:
        p = subprocess.run(cmd, env=env, cwd=cwd, input=input_text,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=RUN_TIMEOUT_S)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else ""
        return 124, out + "\n(timed out after %d s)" % RUN_TIMEOUT_S


class Harness:
    def __init__(self, args):
        self.a = args
        self.bin_dirs = sorted({os.path.dirname(b) for b in args.binary})
        self._cpp_link = None

    def cpp_link_command(self):
        """The probe's link command from Ninja, as a list: the snippet's
        object replaces the probe's, so the snippet links exactly what a
        target linking ckpt_client links."""
        if self._cpp_link is None:
            if not os.path.exists(os.path.join(self.a.build_dir,
                                               "build.ninja")):
                raise RuntimeError("C++ blocks take the link line from Ninja:"
                                   " configure %s with -G Ninja"
                                   % self.a.build_dir)
            out = subprocess.run(
                ["ninja", "-C", self.a.build_dir, "-t", "commands",
                 self.a.link_probe], stdout=subprocess.PIPE, text=True,
                check=True).stdout.strip().split("\n")[-1]
            out = re.sub(r"^:\s*&&\s*", "", out)
            out = re.sub(r"\s*&&\s*:\s*$", "", out)
            self._cpp_link = shlex.split(out)
        return self._cpp_link

    def build(self, block, work):
        """[argv to run the block], or (None, error output)."""
        inc = os.path.join(self.a.source_dir, "include")
        if block.lang == "python":
            path = os.path.join(work, "snippet.py")
            open(path, "w").write(block.text)
            return [sys.executable, path], None
        if block.lang == "sh":
            path = os.path.join(work, "snippet.sh")
            open(path, "w").write(block.text)
            return ["bash", "-e", path], None
        exe = os.path.join(work, "snippet")
        if block.lang == "c":
            src = os.path.join(work, "snippet.c")
            open(src, "w").write(block.text)
            libdir = os.path.dirname(self.a.libckpt)
            cmd = ["cc", "-std=c11", "-Wall", "-Werror", "-I", inc, src,
                   "-o", exe, "-L", libdir, "-lckpt", "-Wl,-rpath," + libdir]
            rc, out = run(cmd, None, work)
            return ([exe], None) if rc == 0 else (None, out)
        src = os.path.join(work, "snippet.cc")
        obj = os.path.join(work, "snippet.o")
        open(src, "w").write(block.text)
        rc, out = run(["c++", "-std=c++20", "-Wall", "-Werror", "-I", inc,
                       "-c", src, "-o", obj], None, work)
        if rc != 0:
            return None, out
        link = self.cpp_link_command()
        probe_obj = [i for i, w in enumerate(link)
                     if w.endswith(".o") and "doc_link_probe" in w]
        out_flag = link.index("-o")
        if len(probe_obj) != 1:
            return None, "no single probe object in: %s" % " ".join(link)
        link = list(link)
        link[probe_obj[0]] = obj
        link[out_flag + 1] = exe
        rc, out = run(link, None, self.a.build_dir)
        return ([exe], None) if rc == 0 else (None, out)

    def run_block(self, block):
        """None when the block ran, else the failure text."""
        with tempfile.TemporaryDirectory(prefix="doctest") as tmp:
            work = os.path.join(tmp, "work")
            os.makedirs(work)
            daemon = CkptdProcess(tmp, binary=self.a.ckptd)
            argv, err = self.build(block, work)
            if argv is None:
                return "does not build:\n" + err
            daemon.start()
            try:
                env = dict(os.environ)
                env.update({
                    "CKPT_SOCKET": daemon.socket, "CKPT_ROOT": daemon.root,
                    "CKPT_JOB": "doc%d" % block.line,
                    "CKPT_LIB": self.a.libckpt,
                    "PYTHONPATH": os.path.join(self.a.source_dir, "python"),
                    "PYTHONDONTWRITEBYTECODE": "1",
                    "RANK": "0", "WORLD_SIZE": "1",
                    "MASTER_ADDR": "127.0.0.1",
                    "PATH": os.pathsep.join(self.bin_dirs + [env["PATH"]]),
                })
                env.pop("CKPT_RESTORE_STEP", None)
                runs = 1 if block.lang == "sh" else 2
                for n in range(1, runs + 1):
                    # A free port is free only until someone binds it: a
                    # test running beside this one, or an outgoing
                    # connection's ephemeral port, may take it before the
                    # block's process group does. Such a run is made again
                    # on another port (at most twice); any other failure
                    # is the block's.
                    for attempt in range(3):
                        env["MASTER_PORT"] = str(free_port())
                        rc, out = run(argv, env, work)
                        if rc == 0 or PORT_TAKEN not in out:
                            break
                    if rc != 0:
                        return ("run %d of %d: exit %d:\n%s\nckptd log:\n%s"
                                % (n, runs, rc, out.rstrip()[-3000:],
                                   daemon.log_tail(1500)))
            finally:
                daemon.stop()
                daemon.drop_shm()
        return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source-dir", required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--ckptd", required=True)
    p.add_argument("--libckpt", required=True)
    p.add_argument("--link-probe", default="doc_link_probe",
                   help="the Ninja target whose link line C++ blocks reuse")
    p.add_argument("--binary", action="append", default=[],
                   help="a binary whose directory goes on PATH (repeat)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--torch", action="store_true")
    g.add_argument("--no-torch", action="store_true")
    p.add_argument("files", nargs="+",
                   help="Markdown files or globs, source-relative")
    a = p.parse_args()
    a.binary.append(a.ckptd)
    sys.path.insert(0, os.path.join(a.source_dir, "python"))
    global CkptdProcess
    from tests.ckptd_process import CkptdProcess
    blocks, errors = [], []
    files = []
    for pattern in a.files:
        found = sorted(glob.glob(os.path.join(a.source_dir, pattern)))
        if not found:
            errors.append("%s: no such file" % pattern)
        files += [os.path.relpath(f, a.source_dir) for f in found]
    for f in files:
        b, e = extract(os.path.join(a.source_dir, f), f)
        blocks += b
        errors += e
    if a.torch:
        blocks = [b for b in blocks if b.uses_torch()]
    elif a.no_torch:
        blocks = [b for b in blocks if not b.uses_torch()]
    for e in errors:
        print("FAIL " + e)
    if not blocks:
        print("FAIL no runnable blocks selected in %s" % " ".join(a.files))
        return 1
    h = Harness(a)
    failed = len(errors)
    for b in blocks:
        t0 = time.monotonic()
        err = h.run_block(b)
        dt = time.monotonic() - t0
        if err is None:
            print("ok   %s %.1f s" % (b.where(), dt), flush=True)
        else:
            failed += 1
            print("FAIL %s %.1f s: %s" % (b.where(), dt, err), flush=True)
    print("%d of %d blocks failed" % (failed, len(blocks)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
