"""DDP end to end under `meshctl cluster up`: 2 nodes x 2 processes, Gloo,
CPU, initialised through mesh:// (test_torch_ddp_worker.py checks the
training step and that no TCPStore exists). Rank 0 SIGKILLs itself in
generation 0, so the job restarts once (max_restarts 1) and must succeed in
generation 1 with every rank reporting OK.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_torch_support import PYTHON, LocalCluster, python_path, require_torch  # noqa: E402

require_torch()


class DdpEndToEndTest(unittest.TestCase):
    def test_ddp_step_and_restart_after_sigkill(self):
        start = time.monotonic()
        with LocalCluster(agents=2, slots=2) as cluster:
            submit = cluster.meshctl(
                "submit", "--name", "torch-ddp", "--nodes", "2", "--nproc-per-node", "2",
                "--max-restarts", "1", "--deadline", "120s",
                "--env", f"PYTHONPATH={python_path()}", "--env", "GLOO_SOCKET_IFNAME=lo",
                "--env", "DDP_TEST_KILL_RANK0=1", "--env", "OMP_NUM_THREADS=1",
                "--", PYTHON, os.path.join(HERE, "test_torch_ddp_worker.py"),
                timeout=90, check=False)
            out = submit.stdout + submit.stderr
            self.assertEqual(submit.returncode, 0, f"the job did not succeed:\n{out}\n"
                             f"cluster:\n{cluster.output()}")
            self.assertIn("rank 0 of generation 0: SIGKILL myself", out)
            self.assertRegex(out, r"generation 1 \(restart 1\)")
            for rank in range(4):
                self.assertRegex(out, rf"\[rank {rank}\] OK rank {rank} generation 1\b", out)
            self.assertNotIn("FAIL:", out)
            job_id = re.search(r"submitted job (\S+?);", out).group(1)
            status = json.loads(cluster.meshctl("status", job_id, "-o", "json").stdout)
            self.assertEqual(status["state"], "SUCCEEDED", status)
            self.assertEqual(status["generation"], 1, status)
        print(f"DDP end to end: {time.monotonic() - start:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
