"""Hang diagnosis of a torch job (docs/hangs.md) under `meshctl cluster up`:
2 nodes x 2 processes, Gloo, CPU, initialised through mesh:// so that
meshrt.torch's progress hook numbers the collectives of the default group,
"torch/world" (test_torch_hang_worker.py; the worker checks that the hook counted
exactly its own five all_reduces, so the sixth is op #6).

Two jobs run side by side on one cluster (each agent has 4 slots), both with
--hang-timeout 3s --on-hang fail:

- ``hang``: after 5 all_reduces rank 1 sleeps for an hour while ranks 0, 2
  and 3 enter all_reduce #6. The job must end FAILED with a root cause that
  is a hang (`hang: true`) of rank 1 in all_reduce #6; every waiting rank
  must get a JobFailedError naming rank 1, between the hang timeout and the
  timeout + 2 heartbeat intervals + slack after it entered the op. (The
  agents' SIGTERM, sent as the job fails, usually reaches a waiter before
  its Runtime has heard of the failure; the worker keeps polling for up to
  3 s after it, well inside the 10 s kill grace, and logs both times.)
- ``compute``: every rank sleeps 2x the hang timeout between two
  all_reduces; the job must succeed: nobody waits in an op then.

The coordinator's heartbeat interval comes from MESH_HEARTBEAT_INTERVAL,
which `meshctl cluster up` passes on to the coordinator it starts (its
children inherit its environment); 0.2 s instead of the default 1 s makes
the bound tight.
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

HANG_TIMEOUT_S = 3.0
HEARTBEAT_INTERVAL_S = 0.2
# Slack on top of the documented bound (timeout + 2 heartbeat intervals):
# the waiters learn of the failure through their own next heartbeat or
# watch event, poll health() every 10 ms, and this machine runs the
# coordinator, two agents and eight Python processes on 2 shared cores.
SLACK_S = 3.0
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


class TorchHangTest(unittest.TestCase):
    def submit(self, cluster: LocalCluster, name: str, mode: str, *env: str,
               nodes: int = 2) -> str:
        args = ["submit", "--parsable", "--name", name, "--nodes", str(nodes), "--nproc-per-node", "2",
                "--hang-timeout", f"{HANG_TIMEOUT_S:g}s", "--on-hang", "fail", "--deadline", "90s",
                "--env", f"PYTHONPATH={python_path()}", "--env", "GLOO_SOCKET_IFNAME=lo",
                "--env", "OMP_NUM_THREADS=1", "--env", "PYTHONUNBUFFERED=1",
                "--env", f"HANG_TEST_MODE={mode}"]
        for e in env:
            args += ["--env", e]
        args += ["--", PYTHON, os.path.join(HERE, "test_torch_hang_worker.py")]
        return cluster.meshctl(*args).stdout.strip()

    def status(self, cluster: LocalCluster, job: str) -> dict:
        return json.loads(cluster.meshctl("-o", "json", "status", job).stdout)

    def wait_terminal(self, cluster: LocalCluster, job: str, deadline: float) -> dict:
        while True:
            status = self.status(cluster, job)
            if status["state"] in TERMINAL or time.monotonic() > deadline:
                return status
            time.sleep(0.2)

    def logs(self, cluster: LocalCluster, job: str) -> str:
        result = cluster.meshctl("logs", job, check=False)
        return result.stdout + result.stderr

    def test_sleeping_rank_diagnosed_long_compute_not(self):
        start = time.monotonic()
        os.environ["MESH_HEARTBEAT_INTERVAL"] = f"{HEARTBEAT_INTERVAL_S:g}"
        try:
            cluster_cm = LocalCluster(agents=2, slots=4)
            cluster = cluster_cm.__enter__()
        finally:
            del os.environ["MESH_HEARTBEAT_INTERVAL"]
        try:
            self.run_jobs(cluster)
        except BaseException:
            print(f"cluster:\n{cluster.output()}", file=sys.stderr)
            raise
        finally:
            cluster_cm.__exit__(None, None, None)
        print(f"torch hang test: {time.monotonic() - start:.1f}s", file=sys.stderr)

    def coordinator_env(self, cluster: LocalCluster) -> dict:
        """The environment of the mesh-coordinator that `cluster up` started
        (a child of its meshctl), from /proc."""
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != cluster.proc.pid:
                    continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if not f.read().split(b"\0")[0].endswith(b"mesh-coordinator"):
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    entries = f.read().decode(errors="replace").split("\0")
                return dict(e.split("=", 1) for e in entries if "=" in e)
            except (OSError, ValueError, IndexError):
                continue
        self.fail("no mesh-coordinator child of meshctl cluster up in /proc")

    def run_jobs(self, cluster: LocalCluster) -> None:
        # The bound below assumes the short heartbeat interval.
        self.assertEqual(self.coordinator_env(cluster).get("MESH_HEARTBEAT_INTERVAL"),
                         f"{HEARTBEAT_INTERVAL_S:g}")
        hang_job = self.submit(cluster, "torch-hang", "hang")
        # Two ranks are enough to show no false positive, and spare two
        # torch imports on a 2-core machine.
        compute_job = self.submit(cluster, "torch-long-compute", "compute",
                                  f"HANG_TEST_COMPUTE_SECONDS={2 * HANG_TIMEOUT_S:g}", nodes=1)
        deadline = time.monotonic() + 60

        # --- the hang ---
        status = self.wait_terminal(cluster, hang_job, deadline)
        # The waiters print their DIAGNOSED (or FAIL) line within about a
        # heartbeat interval of the job's failure (the worker waits at most
        # 3 s after the agents' SIGTERM).
        logs = ""
        logs_deadline = min(deadline, time.monotonic() + 8)
        while time.monotonic() < logs_deadline:
            logs = self.logs(cluster, hang_job)
            if all(re.search(rf"^\[rank {r}\] (DIAGNOSED|FAIL:)", logs, re.M) for r in (0, 2, 3)):
                break
            time.sleep(0.2)
        context = f"status: {json.dumps(status, indent=1)}\nlogs:\n{logs}"
        self.assertEqual(status["state"], "FAILED", context)
        cause = status["root_cause"]
        self.assertIsNotNone(cause, context)
        self.assertIs(cause["hang"], True, context)
        self.assertEqual(cause["rank"], 1, context)
        self.assertEqual(cause["generation"], 0, context)
        # The hook numbers only the group's collectives, from 1, and init ran
        # none (the worker checks entered == 5 after its five all_reduces),
        # so rank 1 is missing from op #6 exactly.
        message = cause["message"]
        self.assertIn("hang in group 'torch/world' (ranks 0-3)", message, context)
        self.assertRegex(message, r"ranks 0, 2, 3 have waited [\d.]+ ?m?s in all_reduce #6\b", context)
        self.assertIn("rank 1 never entered it (last: all_reduce #5", message, context)
        self.assertNotIn("FAIL:", logs, context)
        self.assertIn("[rank 1] rank 1: sleeping before all_reduce #6", logs, context)

        # Diagnosis latency on each waiting rank, from entering all_reduce #6
        # to the JobFailedError, measured on the rank's monotonic clock.
        upper = HANG_TIMEOUT_S + 2 * HEARTBEAT_INTERVAL_S + SLACK_S
        latencies = {}
        for rank in (0, 2, 3):
            m = re.search(rf"^\[rank {rank}\] DIAGNOSED ([\d.]+) SIGTERM (\S+): (.*)$", logs, re.M)
            self.assertIsNotNone(m, f"rank {rank} printed no diagnosis\n{context}")
            latency, sigterm, error = float(m.group(1)), m.group(2), m.group(3)
            latencies[rank] = (latency, sigterm)
            self.assertGreaterEqual(latency, HANG_TIMEOUT_S, context)
            self.assertLessEqual(latency, upper, context)
            self.assertRegex(error, r"generation 0: rank 1 \(.*\) failed: hang in group 'torch/world'", context)
            self.assertIn("in all_reduce #6; rank 1 never entered it", error, context)
        print(f"diagnosis latency (hang timeout {HANG_TIMEOUT_S:g} s, heartbeat "
              f"{HEARTBEAT_INTERVAL_S:g} s): " + ", ".join(f"rank {r} {s:.2f}s (SIGTERM at {t})" for r, (s, t) in
                                                         sorted(latencies.items())), file=sys.stderr)

        # --- the long computation ---
        status = self.wait_terminal(cluster, compute_job, deadline)
        logs = self.logs(cluster, compute_job)
        context = f"status: {json.dumps(status, indent=1)}\nlogs:\n{logs}"
        self.assertEqual(status["state"], "SUCCEEDED", context)
        self.assertIsNone(status.get("root_cause"), context)
        self.assertEqual(status["generation"], 0, context)
        self.assertNotIn("FAIL:", logs, context)
        for rank in range(2):
            self.assertIn(f"[rank {rank}] rank {rank}: computing for {2 * HANG_TIMEOUT_S:g} s", logs, context)
            self.assertIn(f"[rank {rank}] OK rank {rank}", logs, context)


if __name__ == "__main__":
    unittest.main(verbosity=2)
