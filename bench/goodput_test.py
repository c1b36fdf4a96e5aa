#!/usr/bin/env python3
"""Tests of bench/goodput.py's model against hand-computed values.

Python 3 standard library only (no matplotlib): run with
`python3 -m unittest -v goodput_test` in bench/ (ctest: goodput_model).
"""

import copy
import io
import json
import math
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goodput  # noqa: E402  pylint: disable=wrong-import-position


def inputs():
    values, _ = goodput.load_inputs(goodput.DEFAULT_INPUTS)
    return values


class InputsTest(unittest.TestCase):
    def test_every_input_names_a_measured_or_assumed_source(self):
        with open(goodput.DEFAULT_INPUTS, encoding="utf-8") as f:
            doc = json.load(f)
        self.assertTrue(doc["inputs"])
        for name, entry in doc["inputs"].items():
            with self.subTest(input=name):
                self.assertIn(entry["source"]["kind"], ("measured", "assumed"))
                self.assertTrue(entry["source"]["where"].strip())
                self.assertIsInstance(entry["value"], (int, float))

    def test_the_restart_costs_are_recovery_benchs_measurements(self):
        # In-process restart, warm replacement and detection from peers
        # come from recovery_bench's restart rounds, not assumptions.
        with open(goodput.DEFAULT_INPUTS, encoding="utf-8") as f:
            doc = json.load(f)
        for name in ("inprocess_restart_s", "replacement_start_s",
                     "peer_detect_s"):
            with self.subTest(input=name):
                source = doc["inputs"][name]["source"]
                self.assertEqual(source["kind"], "measured")
                self.assertIn("recovery_bench --restart", source["where"])

    def test_model_uses_only_inputs_of_the_file(self):
        # A missing input is a KeyError naming it, never a silent default.
        values = inputs()
        del values["restart_s"]
        with self.assertRaisesRegex(KeyError, "restart_s"):
            goodput.model(values, 16384)

    def test_an_input_without_a_source_is_refused_by_name(self):
        with open(goodput.DEFAULT_INPUTS, encoding="utf-8") as f:
            doc = json.load(f)
        doc["inputs"]["step_s"]["source"] = {"kind": "guessed", "where": "x"}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(doc, f)
        try:
            with self.assertRaisesRegex(ValueError, r"inputs\.step_s\.source"):
                goodput.load_inputs(f.name)
        finally:
            os.unlink(f.name)


class ModelTest(unittest.TestCase):
    def test_young_interval(self):
        # sqrt(2 x 50 s x 10,000 s) = 1,000 s.
        self.assertAlmostEqual(goodput.young(50.0, 10000.0), 1000.0)

    def test_mtbf_at_llama3_scale(self):
        # 54 days x 86,400 s / 419 = 11,135.08 s at 16,384 GPUs.
        self.assertAlmostEqual(goodput.mtbf_s(inputs(), 16384), 11135.08, places=1)
        # Proportional to the GPU count: 4x the GPUs, a quarter of the MTBF.
        self.assertAlmostEqual(goodput.mtbf_s(inputs(), 65536), 11135.08 / 4, places=1)

    def test_step_bound_binds_for_ckptd(self):
        # ckptd's stall (SaveAsync return, no step slowdown measured) gives a
        # Young interval of sqrt(2 x 5e-5 x 11,135) = 1.06 s, below one 6 s
        # step: the interval is the step.
        p = inputs()
        r = goodput.model(p, 16384)["ckptd_replicas"]
        self.assertLess(goodput.young(p["save_async_return_s"], 11135.08), p["step_s"])
        self.assertEqual(r["interval_bound"], "step")
        self.assertAlmostEqual(r["interval_s"], p["step_s"])
        self.assertAlmostEqual(r["stall_share"], 5e-5 / 6.0)

    def test_storage_only_by_hand_at_16k(self):
        # 405e9 x 16 B = 6.48e12 B over 2,048 nodes; each node's share of
        # 2 TB/s is 0.977 GB/s: stall = 6.48e12 / 2e12 = 3.24 s; Young:
        # sqrt(2 x 3.24 x 11,135.08) = 268.6 s.
        p = inputs()
        r = goodput.model(p, 16384)["storage_only"]
        self.assertAlmostEqual(r["stall_s"], 3.24, places=6)
        self.assertAlmostEqual(r["interval_s"], math.sqrt(2 * 3.24 * 11135.0834), places=2)
        self.assertEqual(r["interval_bound"], "young")
        m = 54 * 86400 / 419
        rec_crash = 0.0 + 0.751 + 60.0 + 3.24
        rec_node = 3.0 + 1.434 + 60.0 + 3.24
        lost = r["interval_s"] / 2
        want = (1 - 3.24 / r["interval_s"]
                - (0.22 * (rec_crash + lost) + 0.78 * (rec_node + lost)) / m)
        self.assertAlmostEqual(r["effective"], want, places=9)

    def test_more_gpus_lower_effective_time(self):
        p = inputs()
        scales = [1024, 2048, 4096, 8192, 16384, 32768, 100000]
        for system in goodput.SYSTEMS:
            eff = [goodput.model(p, n)[system]["effective"] for n in scales]
            with self.subTest(system=system):
                self.assertEqual(eff, sorted(eff, reverse=True))
                self.assertGreater(eff[0], eff[-1])

    def test_replicas_never_worse_than_without(self):
        p = inputs()
        # Also where replication is slower than persisting (a slow NIC).
        slow_nic = copy.deepcopy(p)
        slow_nic["nic_node_bytes_per_s"] = 1e9
        for values in (p, slow_nic):
            for n in (1024, 4096, 16384, 100000):
                r = goodput.model(values, n)
                with self.subTest(gpus=n, nic=values["nic_node_bytes_per_s"]):
                    self.assertGreaterEqual(r["ckptd_replicas"]["effective"],
                                            r["ckptd_no_replicas"]["effective"])

    def test_node_loss_from_peers_by_hand_at_16k(self):
        # Per node 8 x 6.48e12 / 16,384 = 3.164e9 B. Replication lag:
        # 3.164e9 / (25e9 / 4.0) = 0.506 s (the bulk put); fetch
        # 3.164e9 / 25e9 x 1.01 (the bulk get).
        p = inputs()
        node = goodput.model(p, 16384)["ckptd_replicas"]["node_loss"]
        per_node = 8 * 405e9 * 16 / 16384
        self.assertEqual(node["from"], "peer memory")
        self.assertAlmostEqual(node["replication_lag_s"], per_node / (25e9 / 4.0))
        self.assertAlmostEqual(node["lost_s"], 6.0 / 2 + per_node / (25e9 / 4.0))
        self.assertAlmostEqual(node["recovery_s"],
                               3.0 + 1.434 + 60.0 + per_node / 25e9 * 1.01)

    def test_inprocess_node_loss_by_hand_at_16k(self):
        # The relaunch's restart_s and heartbeat timeout give way to the
        # slower of a survivor's in-process restart and a replaced rank's
        # start, collective re-initialisation, and detection from peers.
        p = inputs()
        node = goodput.model(p, 16384)["ckptd_inprocess"]["node_loss"]
        per_node = 8 * 405e9 * 16 / 16384
        restart = (max(p["inprocess_restart_s"], p["replacement_start_s"]) +
                   p["collective_init_s"])
        self.assertEqual(node["from"], "peer memory")
        self.assertAlmostEqual(
            node["recovery_s"], p["peer_detect_s"] + p["plan_ack_node_loss_s"] +
            restart + per_node / p["nic_node_bytes_per_s"] * p["peer_get_vs_tcp"])

    def test_inprocess_equals_relaunch_when_its_restart_costs_the_same(self):
        # With a restart and a detection as long as the relaunch's, the
        # in-process system is the replicas system, figure for figure.
        p = inputs()
        p["inprocess_restart_s"] = p["replacement_start_s"] = p["restart_s"]
        p["collective_init_s"] = 0.0
        p["peer_detect_s"] = p["heartbeat_timeout_s"]
        for n in goodput.DEFAULT_SCALES:
            r = goodput.model(p, n)
            self.assertAlmostEqual(r["ckptd_inprocess"]["effective"],
                                   r["ckptd_replicas"]["effective"])


class CliTest(unittest.TestCase):
    def test_json_has_every_scale_and_system(self):
        out = io.StringIO()
        with redirect_stdout(out):
            rc = goodput.main(["--json", "--set", "restart_s=20"])
        self.assertEqual(rc, 0)
        doc = json.loads(out.getvalue())
        self.assertEqual(doc["inputs"]["restart_s"], 20.0)
        self.assertEqual(sorted(doc["results"]), sorted(str(n) for n in goodput.DEFAULT_SCALES))
        for r in doc["results"].values():
            self.assertEqual(sorted(r), sorted(goodput.SYSTEMS))

    def test_unknown_set_is_refused_by_name(self):
        err = io.StringIO()
        with redirect_stdout(io.StringIO()):
            sys_stderr, sys.stderr = sys.stderr, err
            try:
                rc = goodput.main(["--set", "nope=1"])
            finally:
                sys.stderr = sys_stderr
        self.assertEqual(rc, 2)
        self.assertIn("--set nope=1", err.getvalue())


if __name__ == "__main__":
    unittest.main()
