#!/usr/bin/env python3
"""goodput: what ckptd buys at scale, from measured figures and published rates.

Reads bench/goodput_inputs.json (--inputs FILE; --set NAME=VALUE overrides
one value): every input names its source, 'measured' (a figure of this
repository's benchmarks) or 'assumed' (a published figure or stated
reasoning). Prints, for N GPUs in --scales (default 1k, 4k, 16k, 100k) and
three systems, the checkpoint interval, the shares of time lost to stalls,
to lost work and to recovery, and the effective training time, next to the
goal of >= 99%. --json prints the same numbers; --plot PATH draws effective
% vs GPUs (matplotlib if importable, else gnuplot if on PATH, else a
message and no plot).

The model (doc/goodput.md has it with the inputs and results):

  Failures. Job MTBF M(N) = (days x 86400 / interruptions) x (ref_gpus /
  N), 11,135 s at Llama 3's 16,384 GPUs: failures grow in proportion to the GPU count. A share
  hardware_fraction of them are node losses (the node is replaced), the
  rest trainer crashes (restart in place).

  State. S = params x bytes_per_param, split evenly: s = S / N per GPU,
  n = 8 s per node.

  Systems.
  (a) ckptd with replicas. Stall per checkpoint d = SaveAsync return +
      max(0, step ratio with a save in flight - 1) x step. A checkpoint is
      in shared memory after copy = s x device save time per byte. It is
      replicated after rep = n / (NIC / Put ratio), durable after
      dur = max(s x call->durable per byte, n / (storage share per node x
      min(1, persist ratio))), where a node's storage share is
      min(storage per node, aggregate / nodes).
      Trainer crash: lost = tau/2 + copy; recovery = detection (0) + plan
      ack + restart + s x crash restore per byte.
      Node loss: the plan restores the newest step held in memory somewhere
      or durable, whichever costs less: from peers lost = max(tau, rep)/2 +
      rep, recovery = heartbeat timeout + plan ack + restart + n / NIC x
      Get ratio; from storage as (b).
  (b) ckptd without replicas. Trainer crash as (a). Node loss: lost =
      max(tau, dur)/2 + dur; recovery = heartbeat timeout + plan ack +
      restart + n / storage share x measured storage restore ratio.
  (a') (a) with in-process restart: the restart term becomes
      max(survivor's in-process restart, a replaced rank's process start)
      + collective re-initialisation at scale, and a node loss is found by
      its peers (peer_detect_s) instead of the heartbeat timeout.
  (c) storage-only synchronous checkpoint of the same state: stall d = S /
      (nodes x storage share) (every node writes its n at once); any
      failure: lost = tau/2, recovery = detection + plan ack + restart +
      the same read x storage_only_read_ratio.

  Interval. Young/Daly tau* = sqrt(2 d M), but never below one step nor
  below the time a checkpoint needs to become restorable locally (copy for
  ckptd, d itself for (c)): tau = max(tau*, step, copy); the bound that
  binds is reported. For a node loss ckptd's restorable interval is
  max(tau, rep) or max(tau, dur) (a slower stage keeps only the newest
  step: it skips the ones in between).

  Effective training time = 1 - d/tau - (1/M) sum_k p_k (R_k + lost_k),
  k in {trainer crash, node loss}: the first-order model of Young (1974)
  and Daly (2006), valid while tau and R are well below M.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

GIB = 1 << 30
DEFAULT_INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "goodput_inputs.json")
DEFAULT_SCALES = (1024, 4096, 16384, 100000)
GOAL = 0.99
SYSTEMS = ("ckptd_inprocess", "ckptd_replicas", "ckptd_no_replicas",
           "storage_only")
SYSTEM_NAMES = {
    "ckptd_inprocess": "ckptd, replicas, in-process",
    "ckptd_replicas": "ckptd with replicas",
    "ckptd_no_replicas": "ckptd without replicas",
    "storage_only": "storage-only sync checkpoint",
}
SOURCE_KINDS = ("measured", "assumed")


def load_inputs(path):
    """Returns (values, doc): values maps name -> float; doc the parsed file.

    Raises ValueError naming the input when a value or source is missing.
    """
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    entries = doc.get("inputs")
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f"{path}: 'inputs' must be a non-empty object")
    values = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict) or "value" not in entry:
            raise ValueError(f"inputs.{name}: needs a 'value'")
        v = entry["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"inputs.{name}.value: not a number")
        src = entry.get("source")
        if (not isinstance(src, dict) or src.get("kind") not in SOURCE_KINDS
                or not str(src.get("where", "")).strip()):
            raise ValueError(f"inputs.{name}.source: needs kind "
                             f"'measured' or 'assumed' and a 'where'")
        values[name] = float(v)
    return values, doc


def young(stall_s, mtbf_s):
    """Young's optimum checkpoint interval sqrt(2 d M)."""
    return math.sqrt(2.0 * stall_s * mtbf_s)


def mtbf_s(p, gpus):
    """The job's mean time between failures at `gpus` GPUs."""
    ref = p["interruption_days"] * 86400.0 / p["interruptions"]
    return ref * p["reference_gpus"] / gpus


def _interval(stall, m, step, restorable, restorable_name):
    """tau = max(Young, step, restorable) and the name of the bound."""
    cands = (("young", young(stall, m)), ("step", step),
             (restorable_name, restorable))
    name, tau = max(cands, key=lambda c: c[1])
    return tau, name


def _result(tau, bound, stall, m, kinds):
    """kinds: list of (probability, recovery_s, lost_s, detail dict)."""
    stall_share = stall / tau
    lost_share = sum(p * lost for p, _, lost, _ in kinds) / m
    recovery_share = sum(p * r for p, r, _, _ in kinds) / m
    return {
        "interval_s": tau,
        "interval_bound": bound,
        "stall_s": stall,
        "stall_share": stall_share,
        "lost_share": lost_share,
        "recovery_share": recovery_share,
        "effective": 1.0 - stall_share - lost_share - recovery_share,
        "trainer_crash": kinds[0][3],
        "node_loss": kinds[1][3],
    }


def model(p, gpus):
    """The three systems at `gpus` GPUs: {system: result dict}."""
    m = mtbf_s(p, gpus)
    nodes = gpus / p["gpus_per_node"]
    per_gpu = p["params"] * p["bytes_per_param"] / gpus
    per_node = per_gpu * p["gpus_per_node"]
    share = min(p["storage_node_bytes_per_s"],
                p["storage_aggregate_bytes_per_s"] / nodes)
    step = p["step_s"]
    p_node = p["hardware_fraction"]
    p_crash = 1.0 - p_node

    # ckptd: the stall, and when a checkpoint is restorable by each path.
    stall = p["save_async_return_s"] + max(
        0.0, p["step_ratio_save_in_flight"] - 1.0) * step
    copy = per_gpu * p["device_save_s_per_16gib"] / (16 * GIB)
    rep = per_node / (p["nic_node_bytes_per_s"] / p["peer_put_vs_tcp"])
    dur_gpu = per_gpu * p["durable_s_per_gib"] / GIB
    dur_storage = per_node / (share * min(1.0, p["persist_vs_raw_write"]))
    dur = max(dur_gpu, dur_storage)
    dur_bound = "call->durable (measured)" if dur_gpu >= dur_storage else "storage share"
    tau, bound = _interval(stall, m, step, copy, "copy")

    restart = p["restart_s"]
    crash_rec = (p["crash_detection_s"] + p["plan_ack_trainer_crash_s"] +
                 restart + per_gpu * p["trainer_crash_restore_s_per_gib"] / GIB)
    crash_lost = tau / 2.0 + copy
    crash = (p_crash, crash_rec, crash_lost,
             {"from": "local shared memory", "recovery_s": crash_rec,
              "lost_s": crash_lost})
    node_detect = p["heartbeat_timeout_s"] + p["plan_ack_node_loss_s"]
    st_rec = (node_detect + restart +
              per_node / share * p["storage_restore_ratio"])
    st_lost = max(tau, dur) / 2.0 + dur
    storage_path = {"from": "storage", "recovery_s": st_rec, "lost_s": st_lost,
                    "durable_lag_s": dur, "durable_bound": dur_bound}
    peer_rec = (node_detect + restart +
                per_node / p["nic_node_bytes_per_s"] * p["peer_get_vs_tcp"])
    peer_lost = max(tau, rep) / 2.0 + rep
    peer_path = {"from": "peer memory", "recovery_s": peer_rec,
                 "lost_s": peer_lost, "replication_lag_s": rep}
    # The plan takes the newest restorable step: from peers unless the
    # durable one costs less (then the storage path).
    best = (peer_path if peer_rec + peer_lost <= st_rec + st_lost
            else storage_path)

    # In-process restart: survivors keep their processes and the lost ranks
    # start anew beside them, so the job restart shrinks to the slower of
    # the two plus re-forming the collectives at scale; a node loss is
    # detected by its peers' broken links instead of the heartbeat timeout.
    ip_restart = (max(p["inprocess_restart_s"], p["replacement_start_s"]) +
                  p["collective_init_s"])
    ip_crash_rec = crash_rec - restart + ip_restart
    ip_detect = p["peer_detect_s"] + p["plan_ack_node_loss_s"]
    ip_peer_rec = peer_rec - restart - node_detect + ip_detect + ip_restart
    ip_st_rec = st_rec - restart - node_detect + ip_detect + ip_restart
    ip_best = ({"from": "peer memory", "recovery_s": ip_peer_rec,
                "lost_s": peer_lost, "replication_lag_s": rep}
               if ip_peer_rec + peer_lost <= ip_st_rec + st_lost else
               {"from": "storage", "recovery_s": ip_st_rec, "lost_s": st_lost,
                "durable_lag_s": dur, "durable_bound": dur_bound})

    out = {}
    out["ckptd_inprocess"] = _result(
        tau, bound, stall, m,
        [(p_crash, ip_crash_rec, crash_lost,
          {"from": "local shared memory", "recovery_s": ip_crash_rec,
           "lost_s": crash_lost}),
         (p_node, ip_best["recovery_s"], ip_best["lost_s"], ip_best)])
    out["ckptd_replicas"] = _result(
        tau, bound, stall, m,
        [crash, (p_node, best["recovery_s"], best["lost_s"], best)])
    out["ckptd_no_replicas"] = _result(
        tau, bound, stall, m,
        [crash, (p_node, st_rec, st_lost, storage_path)])

    # Storage only: a synchronous checkpoint of the whole state.
    s_stall = per_node / share
    s_tau, s_bound = _interval(s_stall, m, step, s_stall, "write")
    read = per_node / share * p["storage_only_read_ratio"]
    s_crash_rec = (p["crash_detection_s"] + p["plan_ack_trainer_crash_s"] +
                   restart + read)
    s_node_rec = node_detect + restart + read
    out["storage_only"] = _result(
        s_tau, s_bound, s_stall, m,
        [(p_crash, s_crash_rec, s_tau / 2.0,
          {"from": "storage", "recovery_s": s_crash_rec, "lost_s": s_tau / 2.0}),
         (p_node, s_node_rec, s_tau / 2.0,
          {"from": "storage", "recovery_s": s_node_rec, "lost_s": s_tau / 2.0})])
    for r in out.values():
        r["mtbf_s"] = m
        r["state_per_gpu_bytes"] = per_gpu
        r["state_per_node_bytes"] = per_node
        r["storage_share_bytes_per_s"] = share
    return out


def run(p, scales):
    return {str(n): model(p, n) for n in scales}


def format_table(results, scales):
    lines = [
        f"goal: effective training time >= {GOAL * 100:.0f}%",
        "",
        f"{'GPUs':>7} {'MTBF':>8}  {'system':<29} {'interval':>9} {'bound':<6}"
        f" {'stall':>6} {'lost':>6} {'recov':>6} {'effective':>9}  goal",
    ]
    for n in scales:
        for sys_name in SYSTEMS:
            r = results[str(n)][sys_name]
            lines.append(
                f"{n:>7} {r['mtbf_s']:>7.0f}s  {SYSTEM_NAMES[sys_name]:<29}"
                f" {r['interval_s']:>8.1f}s {r['interval_bound']:<6}"
                f" {r['stall_share'] * 100:>5.2f}% {r['lost_share'] * 100:>5.2f}%"
                f" {r['recovery_share'] * 100:>5.2f}% {r['effective'] * 100:>8.2f}%"
                f"  {'met' if r['effective'] >= GOAL else 'not met'}")
    return "\n".join(lines)


def plot(results, scales, path):
    """Draws effective % vs GPUs; returns a message saying what happened."""
    series = {s: [results[str(n)][s]["effective"] * 100 for n in scales]
              for s in SYSTEMS}
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    except ImportError:
        plt = None
    if plt is not None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for s in SYSTEMS:
            ax.plot(scales, series[s], marker="o", label=SYSTEM_NAMES[s])
        ax.axhline(GOAL * 100, color="gray", linestyle="--", label="goal: 99%")
        ax.set_xscale("log")
        ax.set_xticks(list(scales))
        ax.set_xticklabels([f"{n:,}" for n in scales])
        ax.set_xlabel("GPUs")
        ax.set_ylabel("effective training time (%)")
        ax.set_title("Llama 3 405B failure rate, model state 6.5 TB")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower left")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        return f"plot: {path} (matplotlib)"
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        return ("plot: skipped, neither matplotlib (python3-matplotlib) nor "
                "gnuplot is available")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "goodput.dat")
        with open(data, "w", encoding="utf-8") as f:
            for i, n in enumerate(scales):
                f.write(f"{n} " + " ".join(f"{series[s][i]:.4f}" for s in SYSTEMS) + "\n")
        plots = ", ".join(
            f"'{data}' using 1:{i + 2} with linespoints title '{SYSTEM_NAMES[s]}'"
            for i, s in enumerate(SYSTEMS))
        script = (
            "set terminal pngcairo size 840,500\n"
            f"set output '{path}'\nset logscale x\nset key bottom left\n"
            "set xlabel 'GPUs'\nset ylabel 'effective training time (%)'\n"
            "set grid\n"
            f"plot {plots}, {GOAL * 100} with lines dashtype 2 title 'goal: 99%'\n")
        done = subprocess.run([gnuplot], input=script, text=True, check=False)
    if done.returncode != 0:
        return f"plot: gnuplot failed (exit {done.returncode}), no plot"
    return f"plot: {path} (gnuplot)"


def parse_set(items, values):
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or name not in values:
            raise ValueError(f"--set {item}: expected NAME=VALUE with NAME one of "
                             f"the inputs ({', '.join(sorted(values))})")
        try:
            values[name] = float(raw)
        except ValueError:
            raise ValueError(f"--set {name}: '{raw}' is not a number") from None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", default=DEFAULT_INPUTS,
                    help="the inputs file (default: bench/goodput_inputs.json)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override one input (e.g. restart_s=20); repeatable")
    ap.add_argument("--scales", default=",".join(str(n) for n in DEFAULT_SCALES),
                    help="comma-separated GPU counts")
    ap.add_argument("--json", action="store_true", help="print JSON, no table")
    ap.add_argument("--plot", default=None, metavar="PNG",
                    help="draw effective %% vs GPUs there (e.g. doc/goodput.png)")
    args = ap.parse_args(argv)
    try:
        values, doc = load_inputs(args.inputs)
        parse_set(args.set, values)
        try:
            scales = [int(x) for x in args.scales.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--scales {args.scales}: not comma-separated "
                             f"GPU counts") from None
        if not scales or any(n < values["gpus_per_node"] for n in scales):
            raise ValueError("--scales: GPU counts of at least one node")
    except (OSError, ValueError) as e:
        print(f"goodput: {e}", file=sys.stderr)
        return 2
    results = run(values, scales)
    if args.json:
        sources = {k: v["source"]["kind"] for k, v in doc["inputs"].items()}
        print(json.dumps({"goal": GOAL, "scales": scales, "inputs": values,
                          "input_kinds": sources, "results": results},
                         indent=2, sort_keys=True))
    else:
        print(format_table(results, scales))
        measured = sorted(k for k, v in doc["inputs"].items()
                          if v["source"]["kind"] == "measured")
        assumed = sorted(k for k, v in doc["inputs"].items()
                         if v["source"]["kind"] == "assumed")
        print(f"\nmeasured: {', '.join(measured)}")
        print(f"assumed: {', '.join(assumed)}")
    if args.plot:
        print(plot(results, scales, args.plot), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
