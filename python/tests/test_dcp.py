"""ckpt.torch.dcp against a real ckptd: DCP save/load round trips (world
size 1 in-process, 2 over gloo), a restore from disk after the daemon
restarts without its shared memory, and bad input (ids, steps, daemon,
metadata). Run with Debian's python3 (torch 1.13): the 1.13 API names."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
except ImportError:  # pragma: no cover - the interpreter without torch
    torch = None
if torch is not None and torch.__version__.startswith("1."):
    import ckpt.torch.torch113_compat  # noqa: F401  DCP on torch 1.13 (opt-in)

HERE = os.path.dirname(os.path.abspath(__file__))


@unittest.skipIf(torch is None, "this interpreter has no torch")
class DcpTest(unittest.TestCase):
    def setUp(self):
        torch.set_num_threads(1)
        from tests.ckptd_process import CkptdProcess
        from ckpt.torch import dcp
        self.dcp = dcp
        self.torch_dcp = dcp.dcp_module()
        self.dir = tempfile.mkdtemp(prefix="ckpt-dcp-test-")
        self.daemon = CkptdProcess(self.dir)
        self.daemon.start()

    def tearDown(self):
        self.daemon.stop()
        self.daemon.drop_shm()
        shutil.rmtree(self.dir, ignore_errors=True)

    def save(self, sd, cid, **kw):
        w = self.dcp.CkptdStorageWriter(cid, socket=self.daemon.socket, **kw)
        return self.torch_dcp.save_state_dict(sd, storage_writer=w, no_dist=True)

    def load(self, sd, cid):
        r = self.dcp.CkptdStorageReader(cid, socket=self.daemon.socket)
        self.torch_dcp.load_state_dict(sd, storage_reader=r, no_dist=True)

    def roundtrip(self, cid, sd, restart_without_shm=False):
        from tests import dcp_roundtrip
        got = dcp_roundtrip.zeroed(sd)
        ptrs = {k: v.data_ptr() for k, v in got.items() if isinstance(v, torch.Tensor)}
        if restart_without_shm:
            self.daemon.stop()
            self.daemon.drop_shm()
            self.daemon.start()
        self.load(got, cid)
        self.assertIsNone(dcp_roundtrip.first_difference(sd, got))
        self.assertEqual([k for k, p in ptrs.items() if got[k].data_ptr() != p], [],
                         "tensors not restored in place")

    def test_roundtrip_world1_model_and_optimizer_bit_identical_in_place(self):
        from tests import dcp_roundtrip
        sd = dcp_roundtrip.state(0, 1)
        self.save(sd, "ckptd://dcpjob/5")
        self.roundtrip("ckptd://dcpjob/5", sd)
        self.roundtrip("ckptd://dcpjob/latest", sd)

    def test_roundtrip_from_disk_after_daemon_restart_without_shared_memory(self):
        from tests import dcp_roundtrip
        sd = dcp_roundtrip.state(0, 1)
        self.save(sd, "ckptd://diskjob/3")  # returns once durable
        self.roundtrip("ckptd://diskjob/3", sd, restart_without_shm=True)

    def test_latest_load_over_a_flipped_byte_loads_the_previous_step(self):
        from tests import dcp_roundtrip
        from tests.daemon_case import flip_first_tensor_byte, shard_path

        def shifted(v):
            if isinstance(v, torch.Tensor):
                return v + 1 if v.is_floating_point() else v.clone()
            if isinstance(v, dict):
                return {k: shifted(x) for k, x in v.items()}
            if isinstance(v, list):
                return [shifted(x) for x in v]
            return v
        first = dcp_roundtrip.state(0, 1)
        self.save(first, "ckptd://rot/1")
        self.save(shifted(first), "ckptd://rot/2")  # returns once durable
        self.daemon.stop()
        self.daemon.drop_shm()
        flip_first_tensor_byte(shard_path(self.daemon.root, "rot", 2))
        self.daemon.start()
        # That step by its number: DataLoss naming the saved tensor and its
        # DCP key.
        with self.assertRaisesRegex(BaseException, r"(?s)checksum mismatch.*dcp/0/0 = DCP key '0.weight'"):
            self.load(dcp_roundtrip.zeroed(first), "ckptd://rot/2")
        got = dcp_roundtrip.zeroed(first)
        self.load(got, "ckptd://rot/latest")
        self.assertIsNone(dcp_roundtrip.first_difference(first, got))

    def test_roundtrip_world2_over_gloo_reads_the_other_ranks_shard(self):
        env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(20000 + os.getpid() % 20000), CKPT_SOCKET=self.daemon.socket,
                   PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
        procs = []
        for rank in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.dcp_roundtrip", "gloojob", "7"], cwd=os.path.dirname(HERE),
                env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=120)
            outs.append((p.returncode, out.decode("utf-8", "replace")))
        for rank, (rc, out) in enumerate(outs):
            self.assertEqual(rc, 0, out)
            self.assertIn("roundtrip ok rank=%d" % rank, out)
            # The same processes save and load a ShardedTensor (and a
            # DTensor on torch >= 2) through ckpt.torch with its layout.
            self.assertIn("layout ok rank=%d" % rank, out)

    def test_torch2_method_names_drive_a_save_and_a_load(self):
        """The call sequence of DCP 2.x (reset, set_up_storage_writer/reader,
        storage_meta, the AsyncStager's stage), driven by hand with this
        torch's planners: no torch 2.x here to run dcp.save itself."""
        try:
            from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
        except ImportError:
            from torch.distributed._shard.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
        live = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)}
        w = self.dcp.CkptdStorageWriter(socket=self.daemon.socket)
        w.reset("ckptd://v2job/4")
        meta = w.storage_meta()
        self.assertTrue(meta is None or meta.checkpoint_id == "ckptd://v2job/4")
        sd = w.stage(live)
        self.assertTrue(all(sd[k].data_ptr() != live[k].data_ptr() for k in live))
        live["a"].add_(100)  # training goes on; the staged copy is saved
        planner = DefaultSavePlanner()
        getattr(planner, "set_up_planner", getattr(planner, "init", None))(sd, True)
        w.set_up_storage_writer(True)
        plans, md = planner.create_global_plan([w.prepare_local_plan(planner.create_local_plan())])
        final = planner.finish_plan(w.prepare_global_plan(plans)[0])
        w.finish(md, [w.write_data(final, planner).wait()])

        r = self.dcp.CkptdStorageReader(socket=self.daemon.socket)
        r.reset("ckptd://v2job/latest")
        md2 = r.read_metadata()
        got = {"a": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.bfloat16)}
        lp = DefaultLoadPlanner()
        getattr(lp, "set_up_planner", getattr(lp, "init", None))(got, md2, True)
        r.set_up_storage_reader(md2, True)
        plan = r.prepare_global_plan([r.prepare_local_plan(lp.create_local_plan())])[0]
        r.read_data(lp.finish_plan(plan), lp).wait()
        self.assertTrue(torch.equal(got["a"], torch.arange(6.0).reshape(2, 3)))
        self.assertTrue(torch.equal(got["b"], torch.ones(2, dtype=torch.bfloat16)))

    def save_any(self, sd, cid):
        """dcp.save where this torch has it (2.x), else save_state_dict."""
        if hasattr(self.torch_dcp, "save"):
            w = self.dcp.CkptdStorageWriter(socket=self.daemon.socket)
            return self.torch_dcp.save(sd, checkpoint_id=cid, storage_writer=w)
        return self.save(sd, cid)

    def load_any(self, sd, cid):
        if hasattr(self.torch_dcp, "load"):
            r = self.dcp.CkptdStorageReader(socket=self.daemon.socket)
            return self.torch_dcp.load(sd, checkpoint_id=cid, storage_reader=r)
        return self.load(sd, cid)

    def test_torch2_dcp_save_async_save_and_load_through_the_plugin(self):
        if not hasattr(self.torch_dcp, "async_save"):
            self.skipTest("torch %s has no dcp.async_save (2.x)" % torch.__version__)
        from tests import dcp_roundtrip
        sd = dcp_roundtrip.state(0, 1)
        self.save_any(sd, "ckptd://real2/7")
        got = dcp_roundtrip.zeroed(sd)
        self.load_any(got, "ckptd://real2/7")
        self.assertIsNone(dcp_roundtrip.first_difference(sd, got))
        w = self.dcp.CkptdStorageWriter(socket=self.daemon.socket)
        fut = self.torch_dcp.async_save(sd, checkpoint_id="ckptd://real2/8", storage_writer=w)
        fut.result()
        got = dcp_roundtrip.zeroed(sd)
        self.load_any(got, "ckptd://real2/latest")
        self.assertIsNone(dcp_roundtrip.first_difference(sd, got))

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(), "no CUDA device")
    def test_cuda_state_dict_round_trips_in_place_into_cuda_tensors(self):
        from tests import dcp_roundtrip
        sd = {k: (v.cuda() if isinstance(v, torch.Tensor) else v)
              for k, v in dcp_roundtrip.state(0, 1).items()}
        self.save_any(sd, "ckptd://cudajob/3")
        got = dcp_roundtrip.zeroed(sd)
        self.assertTrue(all(v.is_cuda for v in got.values() if isinstance(v, torch.Tensor)))
        ptrs = {k: v.data_ptr() for k, v in got.items() if isinstance(v, torch.Tensor)}
        self.load_any(got, "ckptd://cudajob/3")
        self.assertIsNone(dcp_roundtrip.first_difference(sd, got))
        self.assertEqual([k for k, p in ptrs.items() if got[k].data_ptr() != p], [])

    # --- piece loads: a read item becomes a byte-range restore ----------

    def _dcp(self, name):
        import importlib
        try:
            return importlib.import_module("torch.distributed.checkpoint." + name)
        except ImportError:
            return importlib.import_module("torch.distributed._shard.checkpoint." + name)

    def region_planner(self, regions):
        """A DCP load planner that asks, per key, for one region of the
        saved tensor (the one chunk a whole-tensor save has): {key:
        (storage_offsets, lengths, dest_offsets)}; the destination is the
        state_dict's tensor, narrowed at dest_offsets (as DCP's planner
        does for a resharding load)."""
        planner, md = self._dcp("planner"), self._dcp("metadata")

        class Regions(self._dcp("default_planner").DefaultLoadPlanner):
            def create_local_plan(self):
                items = []
                for key, (within, lengths, dest) in regions.items():
                    chunk = md.MetadataIndex(key, torch.Size([0] * len(lengths)))
                    items.append(planner.ReadItem(
                        type=planner.LoadItemType.TENSOR, dest_index=md.MetadataIndex(key),
                        dest_offsets=torch.Size(dest), storage_index=chunk,
                        storage_offsets=torch.Size(within), lengths=torch.Size(lengths)))
                return planner.LoadPlan(items)
        return Regions()

    def load_regions(self, sd, cid, regions):
        r = self.dcp.CkptdStorageReader(cid, socket=self.daemon.socket)
        self.torch_dcp.load_state_dict(sd, storage_reader=r, planner=self.region_planner(regions), no_dist=True)
        return r.last_read_stats

    def test_half_of_a_tensor_reads_half_of_its_bytes_through_a_piece_load(self):
        MiB = 1 << 20
        torch.manual_seed(3)
        w = torch.randn(1024, 2048)  # 8 MiB: 8 checksum chunks
        c = torch.randn(1024, 1024, dtype=torch.complex64)  # 8 MiB, stored as raw bytes
        self.save({"w": w, "c": c}, "ckptd://halfjob/1")
        # The bottom half of rows: 4 MiB of w, 4 of c.
        half = ((512, 0), (512, 2048), (0, 0))
        got = {"w": torch.zeros(512, 2048), "c": torch.zeros(512, 1024, dtype=torch.complex64)}
        ptr = got["w"].data_ptr()
        stats = self.load_regions(got, "ckptd://halfjob/1", {"w": half, "c": ((512, 0), (512, 1024), (0, 0))})
        self.assertTrue(torch.equal(got["w"], w[512:]))
        self.assertTrue(torch.equal(got["c"].view(torch.uint8), c[512:].contiguous().view(torch.uint8)))
        self.assertEqual(got["w"].data_ptr(), ptr)  # restored in place
        # w through a Piece load: the 4 chunks it asks for, no more.
        self.assertEqual((stats["piece_items"], stats["piece_bytes"], stats["piece_bytes_read"]),
                         (1, 4 * MiB, 4 * MiB), stats)
        # c, a dtype stored as raw bytes (no layout): the whole-item path
        # restores the whole stored tensor and narrows it.
        self.assertEqual((stats["whole_items"], stats["whole_bytes"], stats["whole_bytes_read"]),
                         (1, 8 * MiB, 8 * MiB), stats)
        # The same from disk (the daemon restarted without its shared
        # memory): the touched chunks of the shard file.
        self.daemon.stop()
        self.daemon.drop_shm()
        self.daemon.start()
        got = {"w": torch.zeros(512, 2048)}
        stats = self.load_regions(got, "ckptd://halfjob/1", {"w": half})
        self.assertTrue(torch.equal(got["w"], w[512:]))
        self.assertEqual((stats["piece_bytes"], stats["piece_bytes_read"]), (4 * MiB, 4 * MiB), stats)

        # Before: the same load of a step saved without layouts (the
        # format of before, still read) restores w whole.
        self.dcp.CkptdStorageWriter._piece_layouts = False
        try:
            self.save({"w": w}, "ckptd://halfold/1")
        finally:
            self.dcp.CkptdStorageWriter._piece_layouts = True
        got = {"w": torch.zeros(512, 2048)}
        stats = self.load_regions(got, "ckptd://halfold/1", {"w": half})
        self.assertTrue(torch.equal(got["w"], w[512:]))
        self.assertEqual((stats["piece_items"], stats["whole_items"], stats["whole_bytes_read"]),
                         (0, 1, 8 * MiB), stats)

        # A region that is not contiguous in its destination (the right
        # half of the columns, into a narrow view of a whole tensor):
        # restored into a temporary of the region, then copied in.
        into = torch.zeros(1024, 2048)
        stats = self.load_regions({"w": into}, "ckptd://halfjob/1", {"w": ((0, 1024), (1024, 1024), (0, 1024))})
        self.assertTrue(torch.equal(into[:, 1024:], w[:, 1024:]))
        self.assertEqual(int(into[:, :1024].count_nonzero()), 0)
        self.assertEqual(stats["piece_bytes"], 4 * MiB, stats)

    def test_region_no_saved_piece_holds_is_refused_before_any_byte_moves(self):
        planner, md = self._dcp("planner"), self._dcp("metadata")
        props = self.dcp._dcp_json._CLASSES["TensorProperties"]
        top = torch.arange(32.0).reshape(4, 8)

        class TopHalf(self._dcp("default_planner").DefaultSavePlanner):
            """Saves key "p" as the top half of a [8, 8] global tensor."""
            def create_local_plan(self):
                chunk = md.ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 8]))
                item = planner.WriteItem(
                    index=md.MetadataIndex("p", torch.Size([0, 0])), type=planner.WriteItemType.SHARD,
                    tensor_data=planner.TensorWriteData(chunk=chunk, properties=props.create_from_tensor(top),
                                                        size=torch.Size([8, 8])))
                self.plan = planner.SavePlan([item])
                return self.plan
        w = self.dcp.CkptdStorageWriter("ckptd://gapjob/1", socket=self.daemon.socket)
        self.torch_dcp.save_state_dict({"p": top}, storage_writer=w, planner=TopHalf(), no_dist=True)
        # Rows 2..5 asked: rows 4 and 5 are in no saved piece.
        got = {"p": torch.full((4, 8), -1.0)}
        with self.assertRaisesRegex(BaseException, r"(?s)in no saved piece.*DCP key 'p'") as cm:
            self.load_regions(got, "ckptd://gapjob/1", {"p": ((2, 0), (4, 8), (0, 0))})
        self.assertTrue(torch.equal(got["p"], torch.full((4, 8), -1.0)))  # untouched
        # Rows 0..3: the saved piece, exactly.
        self.load_regions(got, "ckptd://gapjob/1", {"p": ((0, 0), (4, 8), (0, 0))})
        self.assertTrue(torch.equal(got["p"], top))

    def test_checkpoint_id_that_is_not_ckptd_is_refused(self):
        W, R = self.dcp.CkptdStorageWriter, self.dcp.CkptdStorageReader
        for bad in ("/tmp/ckpt/5", "s3://bucket/5", "ckptd://job", "ckptd://job/", "ckptd:///5",
                    "ckptd://job/-1", "ckptd://job/1e3", "ckptd://job/%d" % (1 << 62)):
            self.assertFalse(W.validate_checkpoint_id(bad), bad)
            self.assertFalse(R.validate_checkpoint_id(bad), bad)
            with self.assertRaisesRegex(ValueError, "checkpoint_id"):
                W(bad)
        self.assertTrue(W.validate_checkpoint_id("ckptd://job/12"))
        self.assertFalse(W.validate_checkpoint_id("ckptd://job/latest"))
        self.assertTrue(R.validate_checkpoint_id("ckptd://job/latest"))
        with self.assertRaisesRegex(ValueError, "checkpoint_id: a str"):
            W(17)

    def test_checkpoint_id_whose_job_ckptd_would_refuse_is_refused_at_construction(self):
        # The job part becomes a directory and a shared-memory name on the
        # node: the daemon's rules ([A-Za-z0-9._-], 1-127, no leading '.' or
        # '-', no '..') apply at construction, not at the first save.
        W, R = self.dcp.CkptdStorageWriter, self.dcp.CkptdStorageReader
        for bad, why in (("ckptd://team/llm/100", "character 0x2f"),
                         ("ckptd://my job/1", "character 0x20"),
                         ("ckptd://.hidden/1", "may not start with"),
                         ("ckptd://-x/1", "may not start with"),
                         ("ckptd://a..b/1", "'..'"),
                         ("ckptd://%s/1" % ("j" * 128), "at most 127")):
            self.assertFalse(W.validate_checkpoint_id(bad), bad)
            self.assertFalse(R.validate_checkpoint_id(bad.replace("/1", "/latest")), bad)
            with self.assertRaisesRegex(ValueError, "checkpoint_id .*job .*" + re.escape(why)):
                W(bad)
            with self.assertRaisesRegex(ValueError, "checkpoint_id .*job .*" + re.escape(why)):
                R(bad)
        self.assertTrue(W.validate_checkpoint_id("ckptd://team.llm_v2-a/100"))

    def test_missing_step_is_an_error_naming_the_step(self):
        self.save({"t": torch.ones(3)}, "ckptd://onejob/1")
        with self.assertRaisesRegex(BaseException, "onejob/2"):
            self.load_any({"t": torch.zeros(3)}, "ckptd://onejob/2")
        with self.assertRaisesRegex(BaseException, "no complete step"):
            self.load_any({"t": torch.zeros(3)}, "ckptd://nosuchjob/latest")
        self.assertTrue(self.daemon.running())

    def test_key_the_checkpoint_lacks_is_an_error_naming_it(self):
        self.save({"t": torch.ones(3)}, "ckptd://keyjob/1")
        # Named by the plugin (torch 1.13) or by DCP's own planner (2.x).
        with self.assertRaisesRegex(BaseException, "missing_key"):
            self.load_any({"missing_key": torch.zeros(3)}, "ckptd://keyjob/1")
        self.assertTrue(self.daemon.running())

    def test_daemon_that_is_not_running_is_an_error(self):
        w = self.dcp.CkptdStorageWriter("ckptd://j/1", socket=os.path.join(self.dir, "none.sock"))
        with self.assertRaisesRegex(BaseException, "none.sock|connect|UNAVAILABLE|nreachable"):
            self.torch_dcp.save_state_dict({"t": torch.ones(2)}, storage_writer=w, no_dist=True)

    def test_metadata_json_refuses_what_it_cannot_store_or_does_not_know(self):
        from ckpt.torch import _dcp_json
        md = _dcp_json._CLASSES["Metadata"](state_dict_metadata={}, planner_data=object())
        with self.assertRaisesRegex(ValueError, "planner_data: a object"):
            _dcp_json.encode(md)
        for bad in (b"\xff", b"[]", b'{"format":"ckptd-dcp/1","metadata":{"c":"os.system","v":{}}}',
                    b'{"format":"ckptd-dcp/1","metadata":{"y":"not_a_dtype"}}',
                    b'{"format":"ckptd-dcp/1","metadata":{"l":[]}}'):
            with self.assertRaises(ValueError):
                _dcp_json.decode(bad)


@unittest.skipIf(torch is None, "this interpreter has no torch")
class DcpTorch113ShimTest(unittest.TestCase):
    """The torch 1.13 import hook is loaded only when asked for
    (doc/python-dcp.md), never by importing ckpt.torch.dcp."""

    def run_python(self, code):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=os.path.dirname(HERE),
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out.stdout.splitlines()

    def test_importing_dcp_alone_loads_nothing_of_the_shim(self):
        lines = self.run_python(
            "import sys\n"
            "try:\n"
            "    import ckpt.torch.dcp\n"
            "    print('imported')\n"
            "except ImportError as e:\n"
            "    print('refused: %s' % e)\n"
            "print(sorted(m for m in sys.modules if 'torch113' in m))\n"
            "print([type(f).__module__ for f in sys.meta_path if 'ckpt' in type(f).__module__])\n")
        self.assertEqual(lines[1:], ["[]", "[]"], lines)
        needs_shim = torch.__version__.startswith("1.") and sys.version_info >= (3, 11)
        if needs_shim:  # refused with the way to ask for it
            self.assertIn("ckpt.torch.torch113_compat", lines[0])
        else:
            self.assertEqual(lines[0], "imported")

    def test_asking_for_the_shim_makes_dcp_importable(self):
        lines = self.run_python(
            "import ckpt.torch.torch113_compat\n"
            "from ckpt.torch.dcp import CkptdStorageWriter, dcp_module\n"
            "print(hasattr(dcp_module(), 'save_state_dict'))\n")
        self.assertEqual(lines, ["True"])


if __name__ == "__main__":
    unittest.main()
