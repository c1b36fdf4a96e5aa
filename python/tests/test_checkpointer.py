"""ckpt.torch.Checkpointer against a real ckptd (started per test class):
round trips in place, save modes, restore from disk after a restart.

Run by CTest (python/CMakeLists.txt, label slow) with Debian's python3 and
torch; $CKPTD_BINARY and $CKPT_LIB name what was built. Skips (with the
reason) where torch is missing; CUDA cases skip without a GPU.
"""

import collections
import math
import os
import struct
import subprocess
import sys
import unittest

try:
    import torch
except ImportError:  # the CTest still reports the reason
    raise unittest.SkipTest("torch is not installed for %s" % sys.executable)

import ckpt
import ckpt.torch
from tests.daemon_case import (DaemonTestCase, PACKAGE_ROOT, bits,
                               flip_first_tensor_byte, shard_path,
                               nested_state, same_bits, tensors_of,
                               without_tensors)


class RoundTripTest(DaemonTestCase):

    def test_nested_state_dict_with_every_dtype_restores_in_place_bit_exact(self):
        gen = torch.Generator().manual_seed(1)
        saved = nested_state(gen)
        c = self.checkpointer()
        c.save(5, saved)
        target = nested_state(torch.Generator().manual_seed(2))
        ptrs = [t.data_ptr() for t in tensors_of(target)]
        back = c.load(5, target)
        for want, got in zip(tensors_of(saved), tensors_of(target)):
            self.assertTrue(same_bits(want, got), (want, got))
        self.assertEqual(ptrs, [t.data_ptr() for t in tensors_of(target)])
        # The returned structure holds the live tensors themselves.
        for a, b in zip(tensors_of(back), tensors_of(target)):
            self.assertIs(a, b)
        self.assertGreaterEqual(len(ckpt.torch.storable_dtypes()), 10)

    def test_non_tensor_values_come_back_equal_with_their_types(self):
        saved = nested_state(torch.Generator().manual_seed(3))
        saved["specials"].append(math.nan)
        c = self.checkpointer()
        c.save(1, saved)
        back = c.load(None, nested_state(torch.Generator().manual_seed(4)))
        nan = back["specials"].pop()
        saved["specials"].pop()
        self.assertTrue(math.isnan(nan))
        self.assertEqual(without_tensors(back), without_tensors(saved))
        self.assertIs(type(back["tuple"]), tuple)
        self.assertIs(type(back["tuple"][1][1]), list)
        self.assertIs(type(back["model"]), collections.OrderedDict)
        self.assertEqual(math.copysign(1, back["specials"][2]), -1)
        self.assertEqual(back["big"], 2**70)

    def test_load_without_a_state_dict_returns_new_tensors(self):
        saved = {"w": torch.arange(6.0).reshape(2, 3), "n": 3}
        c = self.checkpointer()
        c.save(2, saved)
        back = c.load(2)
        self.assertTrue(torch.equal(back["w"], saved["w"]))
        self.assertEqual(back["n"], 3)

    def test_non_strict_load_returns_saved_tensors_the_target_lacks(self):
        c = self.checkpointer()
        c.save(1, {"a": torch.ones(2), "b": torch.full((3,), 7.0)})
        a = torch.zeros(2)
        back = c.load(1, {"a": a}, strict=False)
        self.assertIs(back["a"], a)
        self.assertTrue(torch.equal(a, torch.ones(2)))
        self.assertTrue(torch.equal(back["b"], torch.full((3,), 7.0)))

    def test_non_contiguous_tensors_are_saved_and_restored_in_place(self):
        base = torch.arange(24.0).reshape(4, 6)
        c = self.checkpointer()
        c.save(1, {"t": base.t(), "s": base[:, 1::2]})
        target = torch.zeros(4, 6).t()  # non-contiguous, as base.t()
        strided = torch.zeros(4, 6)[:, 1::2]
        ptr = target.data_ptr()
        c.load(1, {"t": target, "s": strided})
        self.assertEqual(target.data_ptr(), ptr)
        self.assertTrue(torch.equal(target, base.t()))
        self.assertTrue(torch.equal(strided, base[:, 1::2]))

    def test_a_tensor_of_more_than_eight_dimensions_round_trips(self):
        t = torch.arange(2.0 ** 9).reshape((2,) * 9)
        c = self.checkpointer()
        c.save(1, {"t": t})
        out = torch.empty((2,) * 9)
        c.load(1, {"t": out})
        self.assertTrue(torch.equal(out, t))

    def test_long_key_paths_get_distinct_names(self):
        long_a, long_b = "x" * 200 + "a", "x" * 200 + "b"
        c = self.checkpointer()
        c.save(1, {long_a: torch.ones(1), long_b: torch.zeros(1)})
        a, b = torch.empty(1), torch.empty(1)
        c.load(1, {long_a: a, long_b: b})
        self.assertEqual((a.item(), b.item()), (1.0, 0.0))


class SaveModesTest(DaemonTestCase):

    def test_save_async_wait_copied_then_wait_then_latest_step(self):
        c = self.checkpointer()
        self.assertIsNone(c.latest_step())
        t = torch.arange(1000.0)
        handle = c.save_async(3, {"t": t})
        handle.wait_copied()
        t.fill_(-1)  # allowed once copied
        handle.wait()
        self.assertTrue(handle.done)
        self.assertEqual(c.latest_step(), 3)
        out = torch.empty(1000)
        c.load(3, {"t": out})
        self.assertTrue(torch.equal(out, torch.arange(1000.0)))

    def test_load_of_a_missing_step_names_the_step_and_the_newest(self):
        c = self.checkpointer()
        c.save(4, {"t": torch.ones(8)})
        c.save(6, {"t": torch.ones(8)})
        with self.assertRaises(ckpt.NotFound) as cm:
            c.load(999, {"t": torch.empty(8)})
        msg = cm.exception.message
        self.assertRegex(msg, r"^restore step 999: .*job '[^']+' has no step 999 for rank 0; newest is 6")
        self.assertNotIn("skeleton", msg)

    def test_restore_step_is_ckptruns_choice_else_the_latest(self):
        c = self.checkpointer()
        saved = os.environ.pop("CKPT_RESTORE_STEP", None)
        self.addCleanup(os.environ.update,
                        {} if saved is None else {"CKPT_RESTORE_STEP": saved})
        self.assertIsNone(c.restore_step())
        c.save(8, {"t": torch.ones(1)})
        self.assertEqual(c.restore_step(), 8)
        os.environ["CKPT_RESTORE_STEP"] = "6"
        self.assertEqual(c.restore_step(), 6)
        os.environ["CKPT_RESTORE_STEP"] = "six"
        with self.assertRaises(ckpt.InvalidArgument) as e:
            c.restore_step()
        self.assertIn("$CKPT_RESTORE_STEP", str(e.exception))
        del os.environ["CKPT_RESTORE_STEP"]

    def test_a_saved_rank_to_restore_is_refused_by_name_not_ignored(self):
        # An elastic job's launcher names the saved rank a resized rank
        # restores ($CKPT_RESTORE_RANK); ckpt.torch reads its own rank's
        # shard only, so it refuses instead of loading the wrong one.
        c = self.checkpointer()
        c.save(3, {"t": torch.ones(4)})
        saved = {k: os.environ.pop(k, None)
                 for k in ("CKPT_RESTORE_RANK", "CKPT_RESTORE_WORLD_SIZE")}
        self.addCleanup(os.environ.update, {k: v for k, v in saved.items() if v is not None})
        os.environ["CKPT_RESTORE_RANK"] = "1"
        os.environ["CKPT_RESTORE_WORLD_SIZE"] = "2"
        into = torch.zeros(4)
        with self.assertRaises(ckpt.FailedPrecondition) as e:
            c.load(3, {"t": into})
        self.assertIn("$CKPT_RESTORE_RANK", str(e.exception))
        self.assertTrue(torch.equal(into, torch.zeros(4)))
        # The job's own rank is no other layout: it loads.
        os.environ["CKPT_RESTORE_RANK"] = "0"
        os.environ["CKPT_RESTORE_WORLD_SIZE"] = "1"
        c.load(3, {"t": into})
        self.assertTrue(torch.equal(into, torch.ones(4)))
        for k in ("CKPT_RESTORE_RANK", "CKPT_RESTORE_WORLD_SIZE"):
            del os.environ[k]

    def test_save_without_block_returns_after_the_copy(self):
        c = self.checkpointer()
        t = torch.ones(10)
        handle = c.save(1, {"t": t}, block=False)
        t.zero_()
        handle.wait()
        out = torch.empty(10)
        c.load(1, {"t": out})
        self.assertTrue(torch.equal(out, torch.ones(10)))

    def test_wait_durable_returns_for_a_saved_step(self):
        c = self.checkpointer()
        c.save(4, {"t": torch.ones(3)})
        c.wait_durable(4, timeout=30)
        stats = c.last_save_stats()
        self.assertGreater(stats["bytes"], 0)

    @unittest.skipUnless(torch.cuda.is_available(), "no CUDA device")
    def test_cuda_tensors_round_trip_in_place_after_their_producing_kernels(self):
        c = self.checkpointer()
        src = torch.randn(1 << 20, device="cuda")
        src.mul_(3).add_(1)  # queued on the current stream, not yet done
        want = src.cpu()
        handle = c.save_async(1, {"g": src})
        handle.wait_copied()
        src.zero_()
        handle.wait()
        out = torch.zeros(1 << 20, device="cuda")
        ptr = out.data_ptr()
        c.load(1, {"g": out})
        self.assertEqual(out.data_ptr(), ptr)
        self.assertTrue(torch.equal(out.cpu(), want))


class RewindTest(DaemonTestCase):
    """A save below the rank's newest step deletes the newer steps: only
    after a restore of an older step, or with rewind=True."""

    def saved_100_and_200(self, job):
        c = self.checkpointer(job=job)
        c.save(100, {"t": torch.full((64,), 100.0)})
        c.save(200, {"t": torch.full((64,), 200.0)})
        c.wait_durable(200, timeout=60)
        return c

    def test_fresh_checkpointer_saving_a_lower_step_is_refused(self):
        job = self.new_job()
        self.saved_100_and_200(job)
        fresh = self.checkpointer(job=job)
        with self.assertRaises(ckpt.errors.FailedPrecondition) as e:
            fresh.save(50, {"t": torch.zeros(64)})
        self.assertIn("newest step(s) 100, 200", e.exception.message)
        self.assertIn("rewind=True", e.exception.message)
        self.assertEqual(fresh.latest_step(), 200)
        for step in (100, 200):
            out = torch.empty(64)
            fresh.load(step, {"t": out})
            self.assertTrue(torch.equal(out, torch.full((64,), float(step))))

    def test_rewind_true_drops_the_newer_steps(self):
        job = self.new_job()
        self.saved_100_and_200(job)
        fresh = self.checkpointer(job=job, rewind=True)
        fresh.save(50, {"t": torch.zeros(64)})
        self.assertEqual(fresh.latest_step(), 50)
        with self.assertRaises(ckpt.errors.NotFound):
            fresh.load(200, {"t": torch.empty(64)})
        # save(..., rewind=True) overrides a Checkpointer's default.
        other = self.checkpointer(job=job)
        other.save(40, {"t": torch.zeros(64)}, rewind=True)
        self.assertEqual(other.latest_step(), 40)
        with self.assertRaises(ckpt.errors.InvalidArgument):
            other.save(30, {"t": torch.zeros(64)}, rewind=1)


class RestartTest(DaemonTestCase):

    def test_restore_from_disk_in_a_fresh_process_after_the_shm_is_gone(self):
        gen = torch.Generator().manual_seed(7)
        saved = nested_state(gen)
        job = self.new_job()
        c = self.checkpointer(job=job)
        c.save(11, saved)
        c.wait_durable(11, timeout=60)
        c.close()
        self.assertEqual(self.daemon.stop(), 0)
        self.daemon.drop_shm()
        self.daemon.start()
        path = os.path.join(self.tmp, "expected.pt")
        torch.save({"bits": [bits(t) for t in tensors_of(saved)]}, path)
        code = (
            "import sys, torch, ckpt.torch\n"
            "from tests.daemon_case import nested_state, tensors_of, bits\n"
            "torch.set_num_threads(1)\n"
            "c = ckpt.torch.Checkpointer(job=%r, socket=%r, rank=0, "
            "world_size=1)\n"
            "assert c.latest_step() == 11, c.latest_step()\n"
            "target = nested_state(torch.Generator().manual_seed(8))\n"
            "back = c.load(None, target)\n"
            "want = torch.load(%r, weights_only=False)['bits']\n"
            "got = [bits(t) for t in tensors_of(target)]\n"
            "assert len(want) == len(got)\n"
            "assert all((torch.equal(a, b) if isinstance(a, torch.Tensor) "
            "else a == b) for a, b in zip(want, got))\n"
            "assert back['step'] == 17\n"
            "print('restored-from-disk')\n" % (job, self.daemon.socket, path))
        out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE_ROOT,
                             capture_output=True, text=True, timeout=120)
        self.assertIn("restored-from-disk", out.stdout, out.stderr)

    def test_latest_load_over_a_flipped_byte_loads_the_previous_step(self):
        job = self.new_job()
        c = self.checkpointer(job=job)
        first = nested_state(torch.Generator().manual_seed(1))
        c.save(1, first)
        c.save(2, nested_state(torch.Generator().manual_seed(2)))
        c.wait_durable(2, timeout=60)
        c.close()
        self.assertEqual(self.daemon.stop(), 0)
        self.daemon.drop_shm()
        flip_first_tensor_byte(shard_path(self.daemon.root, job, 2))
        self.daemon.start()
        c = self.checkpointer(job=job)
        target = nested_state(torch.Generator().manual_seed(3))
        c.load(None, target)
        self.assertEqual(c.loaded_step, 1)
        self.assertTrue(all(same_bits(a, b) for a, b in
                            zip(tensors_of(first), tensors_of(target))),
                        "the tensors do not hold step 1's bytes")
        with self.assertRaises(ckpt.errors.Error) as e:
            c.load(2, target)
        self.assertIn("step 2", e.exception.message)


class LayoutTest(DaemonTestCase):
    """Tensors saved as pieces of global tensors (doc/resharding.md)."""

    def test_pieces_carry_their_layout_to_the_shard_and_back(self):
        c = self.checkpointer()
        w = torch.arange(8.0).reshape(2, 4)
        state = {"w": ckpt.torch.Piece(w, (8, 4), (4, 0)),
                 "emb": ckpt.torch.Piece(torch.full((3,), 5.0), [9], [3],
                                         global_name="embedding"),
                 "b": torch.ones(3)}
        c.save(1, state)
        into = {"w": ckpt.torch.Piece(torch.zeros(2, 4), (8, 4), (4, 0)),
                "emb": torch.zeros(3), "b": torch.zeros(3)}
        back = c.load(1, into)
        self.assertIs(back["w"], into["w"])
        self.assertTrue(torch.equal(into["w"].tensor, w))
        self.assertTrue(torch.equal(into["emb"], torch.full((3,), 5.0)))
        Layout = ckpt._client.Layout
        self.assertEqual(c.loaded_layouts, {
            "state_dict['w']": Layout((8, 4), (4, 0), b""),
            "state_dict['emb']": Layout((9,), (3,), b"embedding")})
        # The shard on disk is a version-2 shard (the layout is in it).
        c.wait_durable(1)
        with open(shard_path(self.daemon.root, c.job, 1), "rb") as f:
            self.assertEqual(struct.unpack_from("<I", f.read(12), 8)[0], 2)
        # Asked for at another place: refused, naming both places.
        moved = {"w": ckpt.torch.Piece(torch.zeros(2, 4), (8, 4), (2, 0)),
                 "emb": torch.zeros(3), "b": torch.zeros(3)}
        with self.assertRaises(ckpt.errors.FailedPrecondition) as e:
            c.load(1, moved)
        self.assertIn('("w"): asked for offsets [2, 0] of [8, 4] of "w", the '
                      'checkpoint holds offsets [4, 0] of [8, 4] of "w"',
                      e.exception.message)
        # Without a state_dict the pieces come back as plain tensors.
        plain = c.load(1)
        self.assertTrue(torch.equal(plain["w"], w))

    def test_a_piece_of_another_layout_is_filled_from_the_saved_pieces(self):
        # Two ranks save rows [0, 4) and [4, 8) of "w"; rank 1 of 3 asks
        # rows [2, 6), half of each saved piece.
        job = self.new_job()
        w = torch.arange(32.0).reshape(8, 4)
        for rank in range(2):
            c = ckpt.torch.Checkpointer(job=job, socket=self.daemon.socket,
                                        rank=rank, world_size=2)
            self.addCleanup(c.close)
            c.save(1, {"w": ckpt.torch.Piece(w[4 * rank:4 * rank + 4].clone(),
                                             (8, 4), (4 * rank, 0)),
                       "b": torch.full((3,), 7.0)})
        c = ckpt.torch.Checkpointer(job=job, socket=self.daemon.socket,
                                    rank=1, world_size=3)
        self.addCleanup(c.close)
        into = {"w": ckpt.torch.Piece(torch.zeros(4, 4), (8, 4), (2, 0)),
                "b": torch.zeros(3)}
        c.load(1, into)
        self.assertTrue(torch.equal(into["w"].tensor, w[2:6]))
        self.assertTrue(torch.equal(into["b"], torch.full((3,), 7.0)))
        # Another global shape than saved: refused, nothing written.
        into = {"w": ckpt.torch.Piece(torch.zeros(4, 4), (12, 4), (6, 0)),
                "b": torch.zeros(3)}
        with self.assertRaises(ckpt.errors.Error):
            c.load(1, into)
        self.assertTrue(torch.equal(into["w"].tensor, torch.zeros(4, 4)))

    def test_a_layout_that_does_not_fit_is_refused_naming_the_key_path(self):
        c = self.checkpointer()
        cases = [
            (ckpt.torch.Piece(torch.zeros(2, 4), (8, 4), (7, 0)),
             "state_dict['w']: offsets[0] 7 + length 2 exceed global_shape[0] 8"),
            (ckpt.torch.Piece(torch.zeros(2, 4), (8,), (0,)),
             "state_dict['w']: global_shape [8] is not 2 non-negative ints"),
            (ckpt.torch.Piece(torch.zeros(2, 4), (8, 4), (0, -1)),
             "state_dict['w']: offsets [0, -1] is not 2"),
            (ckpt.torch.Piece(torch.zeros(2), (4,), (0,), "w\u00e9"),
             "state_dict['w']: global_name"),
            (ckpt.torch.Piece(torch.zeros(2, dtype=torch.complex64), (4,),
                              (0,)),
             "stored as raw bytes, which cannot carry a layout"),
        ]
        for piece, message in cases:
            with self.assertRaises(ckpt.errors.InvalidArgument) as e:
                c.save(1, {"w": piece})
            self.assertIn(message, e.exception.message)
        # What only the daemon checks: a global_name it refuses, naming the
        # field; no step was saved.
        with self.assertRaises(ckpt.errors.InvalidArgument) as e:
            c.save(1, {"w": ckpt.torch.Piece(torch.zeros(2), (4,), (0,),
                                             "g" * 200)})
        self.assertIn(".global_name: 200 bytes, at most 159", e.exception.message)
        self.assertIsNone(c.latest_step())


if __name__ == "__main__":
    unittest.main()
