"""meshrt.torch's progress hook, against a recording fake of the Runtime.

A one-rank Gloo world over torch's HashStore (no coordinator needed): each
collective must be entered before it runs and completed after, once, with
its kind, on the right group; nested calls count once; async ops complete
when their Work does; a call that raises still completes; uninstalling puts
torch's functions back. test_torch_rendezvous.py checks the hook with a real
Runtime.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_torch_support import require_torch  # noqa: E402

require_torch()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import meshrt  # noqa: E402
import meshrt.torch as mt  # noqa: E402


class FakeProgress:
    def __init__(self, rt: "FakeRuntime", name: str, members):
        self.rt, self.name, self.members, self.last = rt, name, list(members), 0

    def enter(self, kind: str) -> int:
        with self.rt.lock:
            self.last += 1
            self.rt.log.append(("enter", self.name, kind, self.last))
            return self.last

    def complete(self, seq: int) -> None:
        with self.rt.lock:
            self.rt.log.append(("complete", self.name, seq))


class FakeRuntime:
    def __init__(self):
        self.lock = threading.Lock()
        self.log = []
        self.groups = {}

    def track_group(self, name, members):
        assert name not in self.groups, f"group {name} tracked twice"
        self.groups[name] = FakeProgress(self, name, members)
        return self.groups[name]

    def take(self):
        with self.lock:
            log, self.log = self.log, []
        return log


class ProgressHookTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        cls.original = {"all_reduce": dist.all_reduce}

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()

    def setUp(self):
        self.rt = FakeRuntime()
        mt.install_progress_hook(self.rt)

    def tearDown(self):
        mt.uninstall_progress_hook()

    def test_sync_collectives_enter_then_complete(self):
        t = torch.ones(3)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        dist.barrier()
        out = [torch.zeros(3)]
        dist.all_gather(out, t)
        dist.reduce(t, dst=0)
        self.assertEqual(self.rt.take(), [
            ("enter", "torch/world", "all_reduce", 1), ("complete", "torch/world", 1),
            ("enter", "torch/world", "broadcast", 2), ("complete", "torch/world", 2),
            ("enter", "torch/world", "barrier", 3), ("complete", "torch/world", 3),
            ("enter", "torch/world", "all_gather", 4), ("complete", "torch/world", 4),
            ("enter", "torch/world", "reduce", 5), ("complete", "torch/world", 5),
        ])
        self.assertEqual(self.rt.groups["torch/world"].members, [0])

    def test_nested_calls_count_once(self):
        out = [None]
        dist.all_gather_object(out, {"a": 1})
        self.assertEqual(out, [{"a": 1}])
        objs = [{"b": 2}]
        dist.broadcast_object_list(objs, src=0)
        self.assertEqual(self.rt.take(), [
            ("enter", "torch/world", "all_gather", 1), ("complete", "torch/world", 1),
            ("enter", "torch/world", "broadcast", 2), ("complete", "torch/world", 2),
        ])

    def test_async_completes_with_the_work(self):
        t = torch.ones(1 << 16)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        deadline = time.monotonic() + 10
        while len(self.rt.log) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(self.rt.take(), [("enter", "torch/world", "all_reduce", 1),
                                          ("complete", "torch/world", 1)])

    def test_failed_call_counts_as_completed(self):
        # Gloo has no reduce_scatter: the call raises after it was entered.
        with self.assertRaises(RuntimeError):
            dist.reduce_scatter(torch.zeros(1), [torch.ones(1)])
        self.assertEqual(self.rt.take(), [("enter", "torch/world", "reduce_scatter", 1),
                                          ("complete", "torch/world", 1)])

    def test_subgroup_named_by_torch(self):
        group = dist.new_group([0])
        name, members = mt.group_name_and_members(group)
        self.assertTrue(name.startswith("torch/pg"), name)
        self.assertEqual(members, [0])
        t = torch.ones(2)
        dist.all_reduce(t, group=group)
        dist.all_reduce(t)
        self.assertEqual(self.rt.take(), [
            ("enter", name, "all_reduce", 1), ("complete", name, 1),
            ("enter", "torch/world", "all_reduce", 1), ("complete", "torch/world", 1),
        ])
        self.assertEqual(mt.group_name_and_members(dist.group.WORLD), ("torch/world", [0]))

    def test_ddp_parameter_broadcast_is_seen(self):
        model = torch.nn.Linear(4, 2)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        kinds = [entry[2] for entry in self.rt.take() if entry[0] == "enter"]
        self.assertIn("broadcast", kinds)  # _broadcast_coalesced of the parameters
        ddp(torch.ones(1, 4)).sum().backward()  # the reducer's all-reduce: not seen

    def test_refusing_runtime_turns_the_hook_off(self):
        # What a shut-down Runtime's track_group raises.
        def refuse(name, members):
            error = meshrt.Error(f"track_group('{name}'): the Runtime of rank 0 has shut down")
            error.code, error.message = "FAILED_PRECONDITION", str(error)
            raise error

        self.rt.track_group = refuse
        t = torch.ones(2)
        with self.assertWarnsRegex(RuntimeWarning, "progress hook off.*shut down"):
            dist.all_reduce(t)  # Runs all the same.
        self.assertEqual(t.tolist(), [1.0, 1.0])
        self.assertFalse(mt.progress_hook_installed())
        dist.barrier()
        self.assertEqual(self.rt.take(), [])

    def test_uninstall_restores_torch(self):
        self.assertIsNot(dist.all_reduce, self.original["all_reduce"])
        self.assertTrue(mt.progress_hook_installed())
        mt.uninstall_progress_hook()
        self.assertIs(dist.all_reduce, self.original["all_reduce"])
        self.assertFalse(mt.progress_hook_installed())
        dist.all_reduce(torch.ones(1))
        self.assertEqual(self.rt.take(), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
