"""The skeleton encoding of ckpt.torch (_tree.py) on its own: shard names
are injective, values come back with their types, and a damaged or hostile
skeleton is a ckpt.DataLoss, never another exception. No daemon needed."""

import collections
import json
import math
import sys
import unittest

try:
    import torch
except ImportError:
    raise unittest.SkipTest("torch is not installed for %s" % sys.executable)

import ckpt
from ckpt.torch import _tree


def names(state):
    return [n for n, _p, _t in _tree.flatten(state).tensors]


class TreeTest(unittest.TestCase):

    def test_tricky_keys_get_distinct_printable_names_of_at_most_159_bytes(self):
        t = torch.zeros(1)
        state = {"a/b": t, "a": {"b": t, "": t, "%e": t}, 0: t, "0": t,
                 "#0": t, True: {1: t}, None: t, 1.5: t, "é": t, "%C3%A9": t,
                 "x" * 300: t, "x" * 299 + "y": t, "l": [t, (t, [t])]}
        got = names(state)
        self.assertEqual(len(got), len(set(got)), got)
        for n in got:
            self.assertLessEqual(len(n), 159)
            self.assertTrue(all(0x20 <= ord(c) <= 0x7E for c in n), n)
            self.assertFalse(n.startswith("%c"), n)

    def test_values_round_trip_with_their_types(self):
        state = collections.OrderedDict(
            f=[0.1, -0.0, math.inf, -math.inf, 1e308, 5e-324],
            t=(1, (2,)), b=[True, False, None], s="ü\x00/", i=-(2**80),
            d={0: "int", "0": "str", 2.5: "float", None: "none"})
        flat = _tree.flatten(state)
        back = _tree.unflatten(
            _tree.parse_skeleton(flat.skeleton_bytes(), "x"), None, "x")
        self.assertEqual(back, state)
        self.assertIs(type(back), collections.OrderedDict)
        self.assertIs(type(back["t"][1]), tuple)
        self.assertEqual(math.copysign(1, back["f"][1]), -1)

    def test_a_str_that_is_not_valid_unicode_is_refused_naming_its_path(self):
        for state, path in (({"a": ["\ud800"]}, "state_dict['a'][0]"),
                            ({"a": {"\udfff": 1}}, "state_dict['a']")):
            with self.assertRaises(ckpt.InvalidArgument) as e:
                _tree.flatten(state)
            self.assertIn(path, str(e.exception))

    def test_a_damaged_or_hostile_skeleton_is_data_loss(self):
        good = json.loads(_tree.flatten({"a": torch.zeros(1)}).skeleton_bytes())
        bad_roots = [{"T": 5}, {"T": "0"}, {"d": [[1]]}, {"d": "x"},
                     {"f": "zz"}, {"q": 1}, [1], {"l": 3}]
        for root in bad_roots:
            doc = dict(good, root=root)
            with self.assertRaises(ckpt.DataLoss, msg=root):
                skeleton = _tree.parse_skeleton(json.dumps(doc).encode(), "x")
                _tree.unflatten(skeleton, lambda i: None, "x")
        deep = "[" * 100000 + "]" * 100000
        for data in (b"\xff", b"{", b"[]", json.dumps(dict(good, format="v9")
                                                     ).encode(),
                     json.dumps(dict(good, tensors=[{"name": 1}])).encode(),
                     deep.encode(),
                     json.dumps(dict(good, root={"l": [{"l": []}]})
                                ).encode().replace(b"[]", deep.encode())):
            with self.assertRaises(ckpt.Error, msg=data[:40]):
                skeleton = _tree.parse_skeleton(data, "x")
                _tree.unflatten(skeleton, lambda i: None, "x")
        nested = {"l": []}
        node = nested
        for _ in range(500):
            node["l"].append({"l": []})
            node = node["l"][0]
        with self.assertRaises(ckpt.DataLoss):
            _tree.unflatten(dict(good, root=nested), lambda i: None, "x")


if __name__ == "__main__":
    unittest.main()
