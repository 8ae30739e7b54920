"""Smoke test of bench/python_bench.py (docs/performance.md): --smoke runs the
whole harness at tiny sizes (coordinator, 1-rank job, the Python calls and
the meshrt._meshrt._bench hooks) and writes its JSON. Never asserts a time.
The second test hides torch: the store rows still run and the collectives
are skipped, exit status 0."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import mesh_harness

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                     "python_bench.py")


class PythonBenchSmoke(unittest.TestCase):
    def run_bench(self, prelude=""):
        with tempfile.TemporaryDirectory(prefix="python-bench-") as tmp:
            out = os.path.join(tmp, "python.json")
            argv = [BENCH, "--smoke", "--json", out]
            code = (f"import runpy, sys\n{prelude}\nsys.argv = {argv!r}\n"
                    f"runpy.run_path({BENCH!r}, run_name='__main__')")
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=60, env=mesh_harness.clean_env())
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            with open(out) as f:
                return json.load(f), proc.stdout

    def check_store(self, result, stdout):
        self.assertEqual(result["suite"], "python")
        self.assertTrue(result["smoke"])
        store = result["store"]
        for key in ("python_ns", "cpp_ns", "ratio"):
            self.assertGreater(store[key], 0, key)
        self.assertEqual(len(store["python_batch_ns"]), store["batches"])
        self.assertIn("| measure | Python | C++ | ratio | added per call |", stdout)

    @unittest.skipUnless(mesh_harness.have_torch(), "needs torch (python3-torch)")
    def test_smoke_with_torch(self):
        result, stdout = self.run_bench()
        self.check_store(result, stdout)
        rows = result["all_reduce"]["rows"]
        self.assertEqual([r["numel"] for r in rows], [1, 1024])
        self.assertEqual(result["all_reduce"]["world_size"], 1)
        for row in rows:
            self.assertGreater(row["python_ns"], 0)
            self.assertGreater(row["cpp_ns"], 0)

    def test_smoke_without_torch_skips_the_collectives(self):
        result, stdout = self.run_bench(prelude="sys.modules['torch'] = None")
        self.check_store(result, stdout)
        self.assertTrue(result["all_reduce"]["skipped"])
        self.assertIn("torch", result["all_reduce"]["skip_reason"])
        self.assertIn("skipped: all_reduce:", stdout)


if __name__ == "__main__":
    unittest.main()
