"""ckpt.note_peer_lost / ckpt.peers_watched: what a trainer tells ckptrun
when its collective broke because peers are gone ($CKPT_PEER_LOST_FILE)."""

import os
import tempfile
import unittest
from unittest import mock

import ckpt


class PeerLostNoteTest(unittest.TestCase):
    def setUp(self):
        fd, self.path = tempfile.mkstemp(prefix="ckpt-peer-lost-")
        os.close(fd)
        self.env = mock.patch.dict(os.environ, {"CKPT_PEER_LOST_FILE": self.path})
        self.env.start()

    def tearDown(self):
        self.env.stop()
        os.unlink(self.path)

    def note(self):
        with open(self.path) as f:
            return f.read()

    def test_named_ranks_are_written_separated_by_blanks(self):
        self.assertTrue(ckpt.note_peer_lost([3, 0]))
        self.assertEqual(self.note(), "3 0\n")

    def test_unnamed_peers_are_a_lone_newline(self):
        self.assertTrue(ckpt.note_peer_lost())
        self.assertEqual(self.note(), "\n")

    def test_a_bad_rank_is_refused_naming_it_and_writes_nothing(self):
        for bad in (-1, "2", 1.0, True):
            with self.assertRaisesRegex(ValueError, r"ranks: .* is not a rank"):
                ckpt.note_peer_lost([1, bad])
        self.assertEqual(self.note(), "")

    def test_outside_ckptrun_nothing_is_written(self):
        with mock.patch.dict(os.environ, {"CKPT_PEER_LOST_FILE": ""}):
            self.assertFalse(ckpt.note_peer_lost())
        self.assertEqual(self.note(), "")

    def test_a_broken_link_in_the_loop_writes_the_note_and_unwinds(self):
        # What torch's gloo backend raises when the peer's process is gone.
        gloo = RuntimeError("[./gloo/transport/tcp/pair.cc:589] Read error "
                            "[127.0.0.1]:27544: Connection reset by peer")
        with self.assertRaises(RuntimeError):
            with ckpt.peers_watched():
                raise gloo
        self.assertEqual(self.note(), "\n")

    def test_a_wrapped_broken_link_counts_too(self):
        try:
            try:
                raise RuntimeError("Timed out waiting 30000ms for recv operation to complete")
            except RuntimeError as inner:
                raise ValueError("step 12 failed") from inner
        except ValueError as e:
            self.assertTrue(ckpt.looks_like_lost_peer(e))

    def test_an_error_of_the_trainers_own_writes_nothing(self):
        with self.assertRaises(ZeroDivisionError):
            with ckpt.peers_watched():
                1 / 0
        with self.assertRaises(KeyboardInterrupt):
            with ckpt.peers_watched():
                raise KeyboardInterrupt
        self.assertEqual(self.note(), "")


if __name__ == "__main__":
    unittest.main()
