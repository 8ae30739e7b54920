"""Conformance of meshrt.torch.Store with torch's own stores.

The same cases run against torch's HashStore and TCPStore (the reference:
what torch's code and tests rely on) and against meshrt.torch.Store over a
real coordinator's store, each both directly and through torch's C++
PrefixStore (which reaches a Python store through torch's trampoline, with
other argument types and method names). Then cases only meshrt has: bad
input, use after the job failed, the timeout error's classes.

Run: PYTHONPATH=build-b16/python /usr/bin/python3 tests/python/test_torch_store.py
(exit 77 = skipped: no torch).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_torch_support import LocalCluster, require_torch, worker_options  # noqa: E402

require_torch()

import torch.distributed as dist  # noqa: E402

import meshrt  # noqa: E402
import meshrt.torch as mt  # noqa: E402

SHORT = datetime.timedelta(milliseconds=150)
LONG = datetime.timedelta(seconds=20)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conformance:
    """Cases every store must pass. Subclasses set ``self.store``."""

    store = None
    # torch 1.13's HashStore.wait(keys) ignores set_timeout (it waits c10d's
    # 300 s default), so that case is not checked on it.
    wait_uses_store_timeout = True

    def setUp(self):
        self.store.set_timeout(LONG)
        self.n = 0

    def k(self, name: str) -> str:
        return f"{type(self).__name__}.{self._testMethodName}/{name}"

    def thread_store(self):
        """A store for another thread to use (TCPStore clients are not
        thread-safe: each thread needs its own connection)."""
        return self.store

    def run_thread(self, fn):
        box = {}

        def body():
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                box["error"] = e

        t = threading.Thread(target=body, daemon=True)
        t.start()
        return t, box

    def test_set_get_bytes_and_str(self):
        self.store.set(self.k("b"), b"\x00\xffraw")
        self.store.set(self.k("s"), "h\u00e9")
        self.assertEqual(self.store.get(self.k("b")), b"\x00\xffraw")
        value = self.store.get(self.k("s"))
        self.assertIsInstance(value, bytes)
        self.assertEqual(value, "h\u00e9".encode())
        self.store.set(self.k("b"), b"")
        self.assertEqual(self.store.get(self.k("b")), b"")

    def test_get_blocks_until_set(self):
        key = self.k("late")
        start = time.monotonic()
        other = self.thread_store()
        t, box = self.run_thread(lambda: (other.get(key), time.monotonic()))
        time.sleep(0.15)
        self.assertTrue(t.is_alive(), f"get returned before the key was set: {box}")
        self.store.set(key, b"v")
        t.join(10)
        self.assertFalse(t.is_alive(), "get was not released by set")
        self.assertNotIn("error", box)
        value, when = box["value"]
        self.assertEqual(value, b"v")
        self.assertGreaterEqual(when - start, 0.12)

    def test_get_honours_store_timeout(self):
        self.store.set_timeout(SHORT)
        self.assertEqual(self.store.timeout, SHORT)
        start = time.monotonic()
        with self.assertRaises(RuntimeError):
            self.store.get(self.k("never"))
        self.assertGreaterEqual(time.monotonic() - start, 0.1)
        self.assertLess(time.monotonic() - start, 8)

    def test_wait_until_all_set(self):
        a, b = self.k("a"), self.k("b")
        other = self.thread_store()
        t, box = self.run_thread(lambda: other.wait([a, b]))
        self.store.set(a, "1")
        time.sleep(0.1)
        self.assertTrue(t.is_alive(), "wait returned with one key of two")
        self.store.set(b, "2")
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertNotIn("error", box)
        self.store.wait([])
        self.store.wait([a], SHORT)

    def test_wait_timeout(self):
        cases = [([self.k("x")], SHORT)]
        if self.wait_uses_store_timeout:
            cases.append(([self.k("x")],))
        for args in cases:
            if len(args) == 1:
                self.store.set_timeout(SHORT)
            start = time.monotonic()
            with self.assertRaises(RuntimeError):
                self.store.wait(*args)
            self.assertGreaterEqual(time.monotonic() - start, 0.1)
            self.assertLess(time.monotonic() - start, 8)

    def test_add(self):
        key = self.k("n")
        self.assertEqual(self.store.add(key, 5), 5)
        self.assertEqual(self.store.add(key, -7), -2)
        self.assertEqual(self.store.add(key, 0), -2)
        self.assertEqual(self.store.get(key), b"-2")
        self.store.set(key, "40")
        self.assertEqual(self.store.add(key, 2), 42)

    def test_add_is_atomic_under_threads(self):
        key, threads, each = self.k("count"), 4, 25
        seen, errors = [], []

        def body(store):
            try:
                for _ in range(each):
                    seen.append(store.add(key, 1))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=body, args=(self.thread_store(),), daemon=True)
              for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(sorted(seen), list(range(1, threads * each + 1)))
        self.assertEqual(self.store.add(key, 0), threads * each)

    def test_compare_set(self):
        key = self.k("cas")
        # Absent key, non-empty expected: no swap, c10d returns expected.
        self.assertEqual(self.store.compare_set(key, "old", "new"), b"old")
        self.assertFalse(self.store.delete_key(key), "compare_set created the key")
        # Absent key, empty expected: created.
        self.assertEqual(self.store.compare_set(key, "", "v1"), b"v1")
        self.assertEqual(self.store.get(key), b"v1")
        # Match: swapped, returns desired.
        self.assertEqual(self.store.compare_set(key, b"v1", b"v2"), b"v2")
        self.assertEqual(self.store.get(key), b"v2")
        # Mismatch: unchanged, returns the current value.
        self.assertEqual(self.store.compare_set(key, "nope", "v3"), b"v2")
        self.assertEqual(self.store.compare_set(key, "", "v3"), b"v2")
        self.assertEqual(self.store.get(key), b"v2")

    def test_delete_key_and_num_keys(self):
        before = self.store.num_keys()
        self.store.set(self.k("d1"), "x")
        self.store.set(self.k("d2"), "y")
        self.assertEqual(self.store.num_keys(), before + 2)
        self.assertTrue(self.store.delete_key(self.k("d1")))
        self.assertFalse(self.store.delete_key(self.k("d1")))
        self.assertEqual(self.store.num_keys(), before + 1)
        with self.assertRaises(RuntimeError):
            self.store.wait([self.k("d1")], SHORT)

    def test_wrong_types_are_type_errors(self):
        with self.assertRaises(TypeError):
            self.store.set(1, "x")
        with self.assertRaises(TypeError):
            self.store.get(None)
        with self.assertRaises(TypeError):
            self.store.set(self.k("t"), 5)
        with self.assertRaises(TypeError):
            self.store.add(self.k("t"), "1")


class HashStoreTest(Conformance, unittest.TestCase):
    wait_uses_store_timeout = False
    @classmethod
    def setUpClass(cls):
        cls.store = dist.HashStore()


class TCPStoreTest(Conformance, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.store = dist.TCPStore("127.0.0.1", cls.port, 1, True, LONG)

    def thread_store(self):
        client = dist.TCPStore("127.0.0.1", self.port, 1, False, LONG)
        client.set_timeout(self.store.timeout)
        return client


class PrefixHashStoreTest(Conformance, unittest.TestCase):
    wait_uses_store_timeout = False
    @classmethod
    def setUpClass(cls):
        cls.store = dist.PrefixStore("p", dist.HashStore())


_cluster = None
_rt = None


def mesh_runtime():
    """One coordinator and one single-rank job for every meshrt case."""
    global _cluster, _rt
    if _rt is None:
        _cluster = LocalCluster(agents=1, slots=1).__enter__()
        _cluster.meshctl("create-job", "--world-size", "1", "--job-id", "store-conf")
        _rt = meshrt.init(**worker_options(_cluster.address, "store-conf"))
    return _rt


def tearDownModule():
    global _cluster, _rt
    if _rt is not None:
        try:
            _rt.shutdown()
        finally:
            _rt = None
    if _cluster is not None:
        _cluster.__exit__(None, None, None)
        _cluster = None


class MeshStoreTest(Conformance, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.store = mt.Store(mesh_runtime().store)


class PrefixMeshStoreTest(Conformance, unittest.TestCase):
    """Through torch's C++ PrefixStore: compare_set gets lists, num_keys and
    delete_key arrive as getNumKeys/deleteKey, wait's timeout as timedelta."""

    @classmethod
    def setUpClass(cls):
        cls.base = mt.Store(mesh_runtime().store, prefix="pre/")
        cls.store = dist.PrefixStore("p", cls.base)


class MeshOnlyTest(unittest.TestCase):
    def test_timeout_error_classes(self):
        store = mt.Store(mesh_runtime().store, timeout=0.3)
        self.assertEqual(store.timeout, datetime.timedelta(seconds=0.3))
        with self.assertRaises(mt.StoreTimeoutError) as caught:
            store.get("mesh-only/never")
        e = caught.exception
        self.assertIsInstance(e, RuntimeError)
        self.assertIsInstance(e, meshrt.TimeoutError)
        self.assertIsInstance(e, TimeoutError)
        self.assertIn("mesh-only/never", str(e))
        self.assertEqual(e.code, "DEADLINE_EXCEEDED")

    def test_prefix_and_multi(self):
        base = mesh_runtime().store
        store = mt.Store(base, prefix="mp/")
        store.multi_set(["a", "b"], [b"1", "2"])
        self.assertEqual(store.multi_get(["a", "b"]), [b"1", b"2"])
        self.assertEqual(base.get("mp/a"), b"1")
        self.assertTrue(store.check(["a", "b"]))
        self.assertFalse(store.check(["a", "zz"]))
        with self.assertRaises(ValueError):
            store.multi_set(["a"], [])

    def test_bad_input(self):
        store = mt.Store(mesh_runtime().store)
        with self.assertRaisesRegex(TypeError, "key must be str"):
            store.set(3.5, b"x")
        with self.assertRaisesRegex(TypeError, "list of keys"):
            store.wait("one-key")
        with self.assertRaisesRegex(TypeError, "bytes or str"):
            store.compare_set("k", 1, b"x")
        store.set("mesh-only/text", "abc")
        with self.assertRaises(meshrt.InvalidArgumentError):
            store.add("mesh-only/text", 1)

    def test_use_after_the_job_failed(self):
        mesh_runtime()
        _cluster.meshctl("create-job", "--world-size", "1", "--job-id", "store-fail")
        rt = meshrt.init(**worker_options(_cluster.address, "store-fail"))
        try:
            store = mt.Store(rt.store, timeout=20)
            store.set("k", "v")
            start = time.monotonic()
            box = {}

            def blocked():
                try:
                    store.get("never-set")
                except BaseException as e:  # noqa: BLE001
                    box["error"] = e

            t = threading.Thread(target=blocked, daemon=True)
            t.start()
            time.sleep(0.2)
            rt.report_error("test: failing the job on purpose")
            t.join(10)
            self.assertFalse(t.is_alive(), "a blocked get outlived the job")
            self.assertIsInstance(box.get("error"), meshrt.JobFailedError, box)
            self.assertLess(time.monotonic() - start, 10)
            # Every later call fails at once, naming the failure.
            with self.assertRaises(meshrt.JobFailedError) as caught:
                store.set("k", "v2")
            self.assertEqual(caught.exception.code, "ABORTED")
            self.assertIn("failing the job on purpose", str(caught.exception))
            with self.assertRaises(meshrt.JobFailedError):
                dist.PrefixStore("p", store).get("k")
        finally:
            try:
                rt.shutdown()
            except meshrt.Error:
                pass


if __name__ == "__main__":
    unittest.main(verbosity=2)
