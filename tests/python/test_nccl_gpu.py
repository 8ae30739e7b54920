"""meshrt on a GPU: CUDA tensors through DLPack on meshrt's NCCL group, and
torch's own NCCL backend through the mesh:// rendezvous.

One rank on CUDA device 0 (a GPU hosts one NCCL rank); the workers are in
tests/python/workers.py (scenarios nccl_cuda and torch_nccl). Skips where
torch sees no CUDA device, as on CI; scripts/gpu-check.sh runs it on a GPU
node.
"""

import unittest

import mesh_harness


def cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@unittest.skipUnless(cuda_available(), "torch sees no CUDA device (or torch is not installed)")
class NcclGpuTest(unittest.TestCase):
    def run_one(self, scenario):
        with mesh_harness.Cluster() as cluster:
            (rc, output), = cluster.run_workers(scenario, 1, timeout=120)
        self.assertEqual(rc, 0, f"'{scenario}' exited {rc}:\n{output}")
        self.assertIn(f"OK {scenario}", output, output)

    def test_meshrt_nccl_group_on_torch_cuda_tensors(self):
        self.run_one("nccl_cuda")

    def test_torch_nccl_backend_through_mesh_rendezvous(self):
        self.run_one("torch_nccl")


if __name__ == "__main__":
    unittest.main()
