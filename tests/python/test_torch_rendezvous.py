"""mesh:// rendezvous in one process: a single-rank job of a real
coordinator, joined through the MESH_* environment an agent would set.

init_process_group(init_method="mesh://") without MASTER_ADDR/PORT; the
default store is a PrefixStore over meshrt.torch.Store (no TCPStore);
torch's timeout reaches the store; the progress hook reports to the real
Runtime; a second init gets fresh keys; bad URLs and a rank that disagrees
with the job are errors; env:// still works with meshrt.torch imported; the
hook turns itself off once the Runtime shut down.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_torch_support import LocalCluster, require_torch, worker_env  # noqa: E402

require_torch()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402

import meshrt  # noqa: E402
import meshrt.torch as mt  # noqa: E402

_cluster = None


def setUpModule():
    global _cluster
    _cluster = LocalCluster(agents=1, slots=1).__enter__()
    _cluster.meshctl("create-job", "--world-size", "1", "--job-id", "rdzv")
    for name in [n for n in os.environ if n.startswith(("MESH_", "MASTER_"))]:
        del os.environ[name]
    os.environ.update(worker_env(_cluster.address, "rdzv"))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def tearDownModule():
    if dist.is_initialized():
        dist.destroy_process_group()
    rt = mt._runtime
    if rt is not None:
        rt.finish()
    _cluster.__exit__(None, None, None)


class MeshRendezvousTest(unittest.TestCase):
    def tearDown(self):
        if dist.is_initialized():
            dist.destroy_process_group()

    def test_1_bad_urls_are_refused_before_joining(self):
        for url, text in (("mesh://host:7450", "no host or path"),
                          ("mesh://?bogus=1", "unknown parameter 'bogus'"),
                          ("mesh://?progress=maybe", "progress must be 0 or 1"),
                          ("mesh://?rank=abc", "rank is not an integer"),
                          ("mesh://?world_size=1.5", "world_size is not an integer")):
            with self.assertRaisesRegex(ValueError, text):
                dist.init_process_group("gloo", init_method=url)
        self.assertIsNone(mt._runtime, "a bad URL joined the job")
        self.assertFalse(dist.is_initialized())

    def test_2_init_through_mesh_url(self):
        self.assertNotIn("MASTER_ADDR", os.environ)
        self.assertNotIn("MASTER_PORT", os.environ)
        dist.init_process_group("gloo", init_method="mesh://",
                                timeout=datetime.timedelta(seconds=42))
        rt = mt.runtime()
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (rt.rank, rt.world_size))
        self.assertEqual(rt.job_id, "rdzv")
        default = c10d._get_default_store()
        self.assertIs(type(default), dist.PrefixStore)  # torch's "default_pg"
        store = mt.find_store(default)
        self.assertIsInstance(store, mt.Store)
        self.assertIs(default.underlying_store, store)
        self.assertIs(store.base, rt.store)
        self.assertEqual(store.timeout, datetime.timedelta(seconds=42))
        # The keys torch wrote live in the coordinator's store, under the prefix.
        self.assertEqual(rt.store.try_get(store.prefix + "default_pg/store_based_barrier_key:1"), b"1")

        t = torch.arange(4.0)
        dist.all_reduce(t)
        dist.barrier()
        out = [None]
        dist.all_gather_object(out, "x")
        self.assertTrue(mt.progress_hook_installed())
        # Named apart from the Runtime's own "world" group.
        self.assertEqual(list(mt.tracked_groups()), ["torch/world"])
        snap = mt.tracked_groups()["torch/world"].snapshot()
        self.assertEqual((snap["entered"], snap["completed"]), (3, 3))
        self.assertEqual(snap["completed_kind"], "all_gather")
        self.assertEqual(snap["pending_kind"], "none")
        self.assertIsInstance(snap["since_completed"], float)
        self.assertTrue(0 <= snap["since_completed"] < 60, snap)
        self.assertEqual(rt.world().name, "world")

    def test_3_second_init_gets_fresh_keys_and_reuses_the_runtime(self):
        rt = mt.init_process_group("gloo", progress=False)
        self.assertIs(rt, mt.runtime())
        first = mt.find_store(c10d._get_default_store()).prefix
        dist.destroy_process_group()
        dist.init_process_group("gloo", init_method="mesh://?progress=0")
        second = mt.find_store(c10d._get_default_store()).prefix
        self.assertNotEqual(first, second)
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertEqual(t.tolist(), [1.0, 1.0])

    def test_4_rank_must_agree_with_the_job(self):
        with self.assertRaisesRegex(ValueError, "rank 0 of job rdzv"):
            dist.init_process_group("gloo", init_method="mesh://", rank=3, world_size=4)
        dist.init_process_group("gloo", init_method="mesh://", rank=0, world_size=1)
        self.assertEqual(dist.get_world_size(), 1)

    def test_5_env_url_still_works(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        saved = dict(os.environ)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
        try:
            dist.init_process_group("gloo", init_method="env://")
            self.assertIsNone(mt.find_store(c10d._get_default_store()))
            self.assertIsInstance(c10d._get_default_store().underlying_store, dist.TCPStore)
            dist.all_reduce(torch.ones(1))
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def test_6_init_process_group_rejects_store_and_init_method(self):
        with self.assertRaisesRegex(TypeError, "init_method"):
            mt.init_process_group("gloo", init_method="env://")
        with self.assertRaisesRegex(TypeError, "store"):
            mt.init_process_group("gloo", store=dist.HashStore())

    def test_7_hook_turns_off_once_the_runtime_shut_down(self):
        # Last: it shuts the process's Runtime down.
        dist.init_process_group("gloo", init_method="mesh://")
        rt = mt.runtime()
        group = dist.new_group([0])  # Needs the store: made before the shutdown.
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertTrue(mt.progress_hook_installed())
        rt.shutdown()
        with self.assertRaises(meshrt.Error) as raised:
            rt.track_group("late", [0])
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        self.assertIn("shut down", raised.exception.message)
        # A group not tracked yet: track_group refuses, the call still runs.
        with self.assertWarnsRegex(RuntimeWarning, "progress hook off"):
            dist.all_reduce(t, group=group)
        self.assertEqual(t.tolist(), [1.0, 1.0])
        self.assertFalse(mt.progress_hook_installed())
        dist.all_reduce(t)
        self.assertNotIn(mt.group_name_and_members(group)[0], mt.tracked_groups())


if __name__ == "__main__":
    unittest.main(verbosity=2)
