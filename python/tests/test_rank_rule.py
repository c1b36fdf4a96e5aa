"""The launcher rule, the same in every front end: with no rank given,
$RANK of $WORLD_SIZE (and $LOCAL_RANK) decide; with neither variable set
(no launcher) a process is rank 0 of 1; a malformed, negative or
out-of-range value is InvalidArgument naming the variable. libckpt decides
(ckpt_resolve_rank); Checkpointer and the DCP plugin only ask it."""

import os
import unittest
from unittest import mock

import ckpt
from tests.daemon_case import DaemonTestCase  # skips the module without torch
import torch
if torch.__version__.startswith("1."):
    import ckpt.torch.torch113_compat  # noqa: F401  _dcp_shards reads DCP
from ckpt.torch import _dcp_shards

_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")

# environment -> (rank, world size, local rank) or the variable the
# refusal names.
CASES = [
    ({}, (0, 1, None)),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, (1, 4, 1)),
    ({"RANK": "0"}, "$WORLD_SIZE"),
    ({"WORLD_SIZE": "2"}, "$RANK"),
    ({"RANK": "1_0", "WORLD_SIZE": "16"}, "$RANK"),
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "$RANK"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "$RANK"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "$RANK"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "$WORLD_SIZE"),
    ({"RANK": "0", "WORLD_SIZE": "x"}, "$WORLD_SIZE"),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "x"}, "$LOCAL_RANK"),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "-1"}, "$LOCAL_RANK"),
]


def _env(values):
    env = {k: v for k, v in os.environ.items() if k not in _VARS}
    env.update(values)
    return mock.patch.dict(os.environ, env, clear=True)


class RankRuleTest(DaemonTestCase):
    def checkpointer_outcome(self):
        try:
            c = ckpt.torch.Checkpointer(job=self.new_job(),
                                        socket=self.daemon.socket)
        except ckpt.InvalidArgument as e:
            return e
        c.close()
        return (c.rank, c.world_size, c.local_rank)

    def dcp_outcome(self):
        try:
            s = _dcp_shards.Shards(self.new_job(), self.daemon.socket, None,
                                   None)
        except ckpt.InvalidArgument as e:
            return e
        return (s.rank, s.world_size)

    def test_checkpointer_and_dcp_follow_the_one_rule(self):
        for values, want in CASES:
            with self.subTest(env=values), _env(values):
                for front, got in (("Checkpointer", self.checkpointer_outcome()),
                                   ("dcp", self.dcp_outcome())):
                    if isinstance(want, tuple):
                        self.assertNotIsInstance(got, Exception, front)
                        self.assertEqual(got, want[:len(got)], front)
                    else:
                        self.assertIsInstance(got, ckpt.InvalidArgument, front)
                        self.assertIn(want, str(got), front)

    def test_given_rank_and_world_size_win_over_the_environment(self):
        with _env({"RANK": "abc", "WORLD_SIZE": "x"}):
            c = ckpt.torch.Checkpointer(job=self.new_job(),
                                        socket=self.daemon.socket, rank=1,
                                        world_size=3)
            c.close()
            self.assertEqual((c.rank, c.world_size), (1, 3))
            s = _dcp_shards.Shards(self.new_job(), self.daemon.socket, 1, 3)
            self.assertEqual((s.rank, s.world_size), (1, 3))


if __name__ == "__main__":
    unittest.main()
