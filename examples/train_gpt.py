#!/usr/bin/env python3
"""train_gpt.py: a small GPT trained data-parallel, checkpointed through ckptd.

A real PyTorch training loop (torch.nn, AdamW, torch.distributed over gloo)
that uses ckpt.torch.Checkpointer the way a user would: every --ckpt-every
steps the whole training state (model, optimizer, step, torch's RNG, the data
sampler's position) goes to ckptd with save_async, whose copy overlaps the
next forward/backward; the optimizer step that would change the saved
tensors first waits for wait_copied(). The loop is a train(ctx) run by
ckpt.torch.resilient: after a failure of another rank, this process stays,
re-forms the process group of the new generation and calls train(ctx)
again, which restores ctx.restore_step in place; a rank that died is
started anew by ckptrun and restores the same step. The run is
deterministic, so a resumed job ends bit-identical to an undisturbed one.

Environment (as ckptrun and torchrun set it):
  RANK, WORLD_SIZE              this process's place (default 0 of 1)
  MASTER_ADDR, MASTER_PORT      gloo rendezvous (default 127.0.0.1:29500)
  CKPT_SOCKET, CKPT_JOB         the node's ckptd and the job; without
                                CKPT_SOCKET the run trains without checkpoints
  CKPT_RESTORE_STEP             restore this step (else: the job's latest, if any)
  CKPT_RESTART_DIR              ckptrun's plans of later generations (in-process restart)
Prints "generation G: rank R of W starts (pid P, in-process restarts K)" at
each (re)start, "step N loss X" lines, "restored step N" after a restore, then
"done rank=R step N params_digest=<hex>" and, as the last line,
"params_digest=<hex>" (SHA-256 of every parameter's name and bytes, in name
order; 16 hex digits).
"""
import argparse
import hashlib
import math
import os
import sys
import time


def _import_ckpt():
    try:
        import ckpt.torch as ckpt_torch
    except ImportError:
        # Run from a source tree without the package installed.
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(os.path.dirname(here), "python"))
        import ckpt.torch as ckpt_torch
    return ckpt_torch


def say(line):
    """One line in one write(): ranks sharing a pipe (ckptrun's output)
    never interleave within a line, even with $PYTHONUNBUFFERED."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


_PHASES = os.environ.get("CKPT_RESILIENT_PHASES", "") not in ("", "0")


def phase(what, ctx):
    """With $CKPT_RESILIENT_PHASES=1 (as ckpt.torch.resilient): a stamped
    line per phase of the restore and the first step after a (re)start."""
    if _PHASES:
        say(f"train_gpt: phase {what} gen={ctx.generation} rank={ctx.rank} wall={time.time():.6f}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, required=True, help="train until this many optimizer steps")
    p.add_argument("--ckpt-every", type=int, default=0, help="save every K steps (0: never)")
    p.add_argument("--seed", type=int, default=7, help="initial weights and data")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=8, help="sequences per step and rank")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda: cuda:$LOCAL_RANK modulo the GPUs)")
    p.add_argument("--log-every", type=int, default=1, help="print the loss every N steps (0: never)")
    p.add_argument("--step-sleep-ms", type=int, default=0,
                   help="sleep after each step (tests: a window to kill a rank in)")
    p.add_argument("--timeout-s", type=float, default=60,
                   help="how long ranks wait for each other (rendezvous, collectives)")
    p.add_argument("--fault-hang", default="", metavar="STEP:RANK",
                   help="rank RANK spins forever in a Python loop inside step STEP, before its "
                        "compute, while the others wait for it in the all-reduce (hang "
                        "detection tests; a process that restored a checkpoint never hangs, "
                        "so the restarted job finishes)")
    a = p.parse_args(argv)
    a.hang_step, a.hang_rank = -1, -1
    if a.fault_hang:
        parts = a.fault_hang.split(":")
        try:
            a.hang_step, a.hang_rank = int(parts[0]), int(parts[1])
        except (ValueError, IndexError):
            a.hang_step = -1
        if len(parts) != 2 or a.hang_step < 1 or a.hang_rank < 0:
            p.error(f"--fault-hang {a.fault_hang[:32]!r}: not STEP:RANK (STEP >= 1, RANK >= 0)")
    for name in ("steps", "vocab", "dim", "heads", "layers", "seq", "batch", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.ckpt_every < 0 or a.log_every < 0 or a.step_sleep_ms < 0:
        p.error("--ckpt-every, --log-every and --step-sleep-ms must not be negative")
    if a.dim % a.heads:
        p.error(f"--dim {a.dim} is not a multiple of --heads {a.heads}")
    if not 0 <= a.dropout < 1:
        p.error("--dropout must be in [0, 1)")
    if a.device not in ("cpu", "cuda"):
        p.error(f"--device {a.device[:16]!r}: cpu or cuda")
    return a


def build_model(torch, a):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(a.dim)
            self.qkv = nn.Linear(a.dim, 3 * a.dim)
            self.proj = nn.Linear(a.dim, a.dim)
            self.ln2 = nn.LayerNorm(a.dim)
            self.fc = nn.Linear(a.dim, 4 * a.dim)
            self.out = nn.Linear(4 * a.dim, a.dim)
            self.drop = nn.Dropout(a.dropout)

        def forward(self, x, mask):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            shape = (b, t, a.heads, d // a.heads)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // a.heads)
            att = self.drop(att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1))
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.drop(self.proj(y))
            return x + self.drop(self.out(torch.nn.functional.gelu(self.fc(self.ln2(x)))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(a.vocab, a.dim)
            self.pos = nn.Embedding(a.seq, a.dim)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln = nn.LayerNorm(a.dim)
            self.head = nn.Linear(a.dim, a.vocab, bias=False)
            self.register_buffer("mask", torch.ones(a.seq, a.seq).triu(1).bool(), persistent=False)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                x = blk(x, self.mask)
            return self.head(self.ln(x))

    return GPT()


class SyntheticData:
    """Sequences of an affine recurrence x[t+1] = (m*x[t] + c) mod vocab with
    per-sequence m in {1,3,5,7}, c in {0..3} and x0 drawn from a
    torch.Generator: learnable in context, and the
    sampler's position is its generator state (saved in the checkpoint)."""

    def __init__(self, torch, a, rank):
        self.torch, self.a = torch, a
        self.gen = torch.Generator()
        self.gen.manual_seed(a.seed * 1000003 + rank)

    def batch(self):
        torch, a = self.torch, self.a
        draw = torch.randint(0, 1 << 20, (a.batch, 3), generator=self.gen)
        m, c, x = (draw[:, 0:1] % 4) * 2 + 1, draw[:, 1:2] % 4, draw[:, 2:3] % a.vocab
        cols = [x]
        for _ in range(a.seq):
            x = (m * x + c) % a.vocab
            cols.append(x)
        seq = torch.cat(cols, dim=1)
        return seq[:, :-1], seq[:, 1:]


def hang_in_python_loop(rank, step):
    """--fault-hang: never returns. The stacks ckptrun captures on a hang
    must show this loop's line (python/tests/test_train_gpt.py looks for
    it by the marker comment)."""
    say(f"fault-hang: rank {rank} spins forever in step {step}")
    while True:
        time.sleep(0.05)  # fault-hang loop


def params_digest(model):
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def allreduce_mean_grads(torch, dist, model, world):
    """One all-reduce over a flat buffer of every gradient (deterministic:
    the same ranks always reduce in the same order)."""
    if world == 1:
        return
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(world)
    at = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[at:at + n].view_as(g))
        at += n


def materialize_optimizer_state(torch, model, opt):
    """Creates AdamW's per-parameter state (an lr-0 step on zero gradients
    leaves the parameters bit-identical) so a restore fills it in place."""
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for g, lr in zip(opt.param_groups, lrs):
        g["lr"] = lr


def lr_at(a, step):
    """Warm-up then cosine: a function of the step, so no scheduler state."""
    warm = max(1, a.steps // 10)
    if step < warm:
        return a.lr * (step + 1) / warm
    return a.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, a.steps - warm)))


def main(argv=None):
    a = parse_args(argv)
    import datetime
    import torch
    torch.set_num_threads(a.threads)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    torch.use_deterministic_algorithms(True)
    ckpt_torch = _import_ckpt()
    # Survivors of a failure restart in this process (under ckptrun): train()
    # runs again with the new generation's process group and restore step.
    return ckpt_torch.resilient(lambda ctx: train(torch, a, ctx),
                                timeout=datetime.timedelta(seconds=a.timeout_s))


def train(torch, a, ctx):
    import torch.distributed as dist
    rank, world = ctx.rank, ctx.world_size
    ck = ctx.checkpointer
    restore_step = ctx.restore_step
    if restore_step is None and ck is not None and ctx.restarts == 0:
        latest = ck.latest_step()  # started by hand on an existing job
        restore_step = latest if latest is not None and latest >= 0 else None
    say(f"generation {ctx.generation}: rank {rank} of {world} starts (pid {os.getpid()}, "
        f"in-process restarts {ctx.restarts})")
    device = torch.device("cpu")
    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("train_gpt: --device cuda, but torch sees no CUDA device")
        # More local ranks than GPUs (a simulated cluster on one machine)
        # share them round-robin.
        device = torch.device("cuda", ctx.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)

    torch.manual_seed(a.seed)
    model = build_model(torch, a).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    data = SyntheticData(torch, a, rank)
    torch.manual_seed(a.seed * 31 + rank)  # dropout: each rank its own stream
    step = 0

    def training_state():
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step,
                 "rng": torch.get_rng_state(), "data_rng": data.gen.get_state()}
        if device.type == "cuda":  # dropout draws from the device's generator
            state["cuda_rng"] = torch.cuda.get_rng_state(device)
        return state

    if restore_step is not None:
        if ck is None:
            raise SystemExit("train_gpt: a restore step is given but $CKPT_SOCKET is not")
        materialize_optimizer_state(torch, model, opt)
        state = training_state()
        phase("loading", ctx)
        rest = ck.load(restore_step, state)
        step = int(rest["step"])
        if step != restore_step:
            raise SystemExit(f"train_gpt: step {restore_step} holds training step {step}")
        torch.set_rng_state(state["rng"])
        if device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        data.gen.set_state(state["data_rng"])
        say(f"restored step {step}")

    pending = None  # the save in flight
    restored = restore_step is not None or ctx.restarts > 0
    first = True  # the first step of this (re)start: its phases stamped
    while step < a.steps:
        s = step + 1
        if first:
            phase("step_begin", ctx)
        if s == a.hang_step and rank == a.hang_rank and not restored:
            hang_in_python_loop(rank, s)
        for g in opt.param_groups:
            g["lr"] = lr_at(a, step)
        x, y = data.batch()
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        compute_start = time.monotonic()
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, a.vocab), y.reshape(-1))
        loss.backward()
        if first:
            phase("computed", ctx)
        if ck is not None:
            # The hang beacon, after this rank's own work and before it waits
            # for the others: a stuck rank stays behind the ones waiting.
            ck.progress(s, compute_s=min(time.monotonic() - compute_start, 3599.0))
        allreduce_mean_grads(torch, dist, model, world)
        if first:
            phase("reduced", ctx)
        if pending is not None:
            pending.wait_copied()  # the saved tensors may change from here on
        opt.step()
        step = s
        if a.log_every and (s % a.log_every == 0 or s == a.steps):
            lv = loss.detach().clone()
            if world > 1:
                dist.all_reduce(lv)
                lv /= world
            say(f"step {s} loss {lv.item():.4f}")
        first = False
        if ck is not None and a.ckpt_every and s % a.ckpt_every == 0:
            if pending is not None:
                pending.wait()
            pending = ck.save_async(s, training_state())
        if a.step_sleep_ms:
            ctx.sleep(a.step_sleep_ms / 1000)  # a plan cuts it short
    if pending is not None:
        pending.wait()
    digest = params_digest(model)
    if world > 1:
        mine = torch.tensor([int(digest, 16) >> 1], dtype=torch.int64)
        digests = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(digests, mine)
        if any(int(d) != int(mine) for d in digests):
            raise SystemExit(f"train_gpt: rank {rank}: ranks ended with different parameters")
    say(f"done rank={rank} step {step} params_digest={digest}")
    say(f"params_digest={digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
