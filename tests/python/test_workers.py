"""meshrt end to end: Python workers of a real job on 127.0.0.1.

A mesh-coordinator and worker processes (tests/python/workers.py) that join
through meshrt.init(); each scenario checks itself against torch and prints
"OK <scenario>". Here we check that every rank did.
"""

import unittest

import mesh_harness


@unittest.skipUnless(mesh_harness.have_torch(),
                     "torch is not installed for this interpreter (Debian: python3-torch)")
class WorkersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = mesh_harness.Cluster().__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def check_all_ok(self, scenario, results):
        for rank, (rc, output) in enumerate(results):
            self.assertEqual(rc, 0, f"rank {rank} of '{scenario}' exited {rc}:\n{output}")
            self.assertIn(f"OK {scenario}", output, f"rank {rank}:\n{output}")

    def test_core_runtime_store_collectives_mesh_dtensor(self):
        results = self.cluster.run_workers("core", 4, mesh_shape=[2, 2], dim_names=["dp", "tp"],
                                           timeout=90)
        self.check_all_ok("core", results)

    def test_failure_reaches_every_rank(self):
        results = self.cluster.run_workers("failure", 3, timeout=60)
        self.check_all_ok("failure", results)

    def test_in_place_survivors_agree_on_the_live_ranks(self):
        results = self.cluster.run_workers("in_place", 3, timeout=60, in_place=True)
        self.check_all_ok("in_place", results)

    def test_elastic_mesh_carries_on_and_takes_back_a_replacement(self):
        results = self.cluster.run_workers("elastic_mesh", 4, mesh_shape=[4, 1],
                                           dim_names=["dp", "tp"], timeout=90, in_place=True)
        self.check_all_ok("elastic_mesh", results)

    def test_elastic_mesh_errors(self):
        results = self.cluster.run_workers("elastic_errors", 2, timeout=60)
        self.check_all_ok("elastic_errors", results)

    def test_op_timeout_is_a_timeout_error(self):
        results = self.cluster.run_workers("op_timeout", 2, timeout=60)
        self.check_all_ok("op_timeout", results)


if __name__ == "__main__":
    unittest.main()
