"""meshrt.JobClient against a real mesh-coordinator and mesh-agent."""

import os
import sys
import tempfile
import threading
import time
import unittest

import mesh_harness
import meshrt

HERE = os.path.dirname(os.path.abspath(__file__))


class JobClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = mesh_harness.Cluster().__enter__()
        cls.cluster.start_agent("node-0", slots=2)
        cls.client = meshrt.JobClient(cls.cluster.address, timeout=10)
        # The agent registers within a few node heartbeats.
        deadline = time.monotonic() + 20
        while True:
            job = cls.client.submit(["/bin/true"], nproc_per_node=1, name="warm-up")
            if cls.client.wait(job, timeout=20).state == "SUCCEEDED":
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the agent never ran a job")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def test_submit_wait_get_list_logs(self):
        job_id = self.client.submit(
            [sys.executable, "-c", "import os; print('hello', os.environ['MESH_RANK'])"],
            nodes=1, nproc_per_node=2, name="py-hello", labels={"suite": "python"})
        job = self.client.wait(job_id, timeout=30)
        self.assertEqual(job.state, "SUCCEEDED", job)
        self.assertTrue(job.terminal)
        got = self.client.get(job_id)
        self.assertEqual((got.id, got.name, got.nproc_per_node), (job_id, "py-hello", 2))
        self.assertEqual(got.command[0], sys.executable)
        self.assertIsNone(got.root_cause)
        self.assertIn(job_id, [j.id for j in self.client.list()])
        self.assertIn(job_id, [j.id for j in self.client.list(states=["SUCCEEDED"])])
        self.assertNotIn(job_id, [j.id for j in self.client.list(states=["RUNNING"])])
        self.assertEqual(self.client.logs(job_id, rank=1), "hello 1\n")
        logs = self.client.logs(job_id)
        self.assertIn("[0] hello 0\n", logs)
        self.assertIn("[1] hello 1\n", logs)

    def test_failed_job_names_its_root_cause(self):
        job_id = self.client.submit([sys.executable, "-c", "import sys; sys.exit(3)"],
                                    nproc_per_node=1)
        job = self.client.wait(job_id, timeout=30)
        self.assertEqual(job.state, "FAILED")
        self.assertEqual(job.root_cause["exit_code"], 3, job.root_cause)
        self.assertEqual(job.root_cause["rank"], 0)

    def test_cancel_and_wait_timeout(self):
        job_id = self.client.submit(["/bin/sleep", "60"], nproc_per_node=1)
        start = time.monotonic()
        with self.assertRaises(meshrt.TimeoutError) as raised:
            self.client.wait(job_id, timeout=0.5)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(raised.exception.code, "DEADLINE_EXCEEDED")
        self.client.cancel(job_id, reason="test")
        self.assertEqual(self.client.wait(job_id, timeout=30).state, "CANCELLED")

    def test_errors(self):
        with self.assertRaises(meshrt.NotFoundError):
            self.client.get("no-such-job")
        with self.assertRaises(TypeError):
            self.client.submit("python3 train.py")
        with self.assertRaises(meshrt.InvalidArgumentError):
            self.client.submit([], nproc_per_node=1)
        with self.assertRaises(meshrt.InvalidArgumentError):
            self.client.list(states=["NOT_A_STATE"])

    def test_hang_timeout_and_policy(self):
        job_id = self.client.submit(["/bin/true"], nproc_per_node=1, hang_timeout=7.5,
                                    on_hang="fail")
        job = self.client.get(job_id)
        # Whole seconds in the spec: a fraction rounds up.
        self.assertEqual((job.hang_timeout, job.on_hang), (8.0, "fail"))
        self.assertEqual(self.client.wait(job_id, timeout=30).on_hang, "fail")
        job = self.client.wait(self.client.submit(["/bin/true"], nproc_per_node=1,
                                                  hang_timeout=60, on_hang="RESTART"), timeout=30)
        self.assertEqual((job.hang_timeout, job.on_hang), (60.0, "restart"))
        job = self.client.wait(self.client.submit(["/bin/true"], nproc_per_node=1), timeout=30)
        self.assertEqual((job.hang_timeout, job.on_hang), (300.0, "restart"))  # the defaults
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "hang_timeout"):
            self.client.submit(["/bin/true"], hang_timeout=10**9)  # the coordinator's bound

    def test_grow_policy_and_resizes(self):
        job_id = self.client.submit(["/bin/true"], nodes=(1, 2), nproc_per_node=1,
                                    grow="after:10m")
        job = self.client.wait(job_id, timeout=30)
        self.assertEqual(job.grow, "after 10m")
        self.assertEqual(job.resizes, [])  # It ran at one size.
        job = self.client.wait(self.client.submit(["/bin/true"], nproc_per_node=1), timeout=30)
        self.assertEqual(job.grow, "never")
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "grow: 'sometimes'"):
            self.client.submit(["/bin/true"], nodes=(1, 2), grow="sometimes")
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "spec.grow"):
            self.client.submit(["/bin/true"], nodes=1, grow="on_restart")  # a fixed size

    def test_restart_policy_and_membership(self):
        job_id = self.client.submit(["/bin/true"], nproc_per_node=2, mesh_shape=[2],
                                    mesh_dim_names=["dp"], restart_policy="in_place")
        job = self.client.wait(job_id, timeout=30)
        self.assertEqual(job.state, "SUCCEEDED", job)
        # The coordinator's default dimension.
        self.assertEqual((job.restart_policy, job.in_place_dim), ("in_place", "dp"))
        self.assertEqual(job.membership, [])  # No rank was lost.
        job = self.client.wait(self.client.submit(
            ["/bin/true"], nproc_per_node=2, mesh_shape=[2, 1], mesh_dim_names=["replica", "tp"],
            restart_policy="IN_PLACE", in_place_dim="replica"), timeout=30)
        self.assertEqual((job.restart_policy, job.in_place_dim), ("in_place", "replica"))
        job = self.client.wait(self.client.submit(["/bin/true"], nproc_per_node=1), timeout=30)
        self.assertEqual((job.restart_policy, job.in_place_dim), ("group", ""))  # the default
        self.assertEqual(job.membership, [])
        job = self.client.wait(self.client.submit(["/bin/true"], restart_policy="group"),
                               timeout=30)
        self.assertEqual(job.restart_policy, "group")
        # Checked here, before anything is sent; a ValueError.
        with self.assertRaisesRegex(meshrt.InvalidArgumentError,
                                    "restart_policy: 'solo' is not a restart policy"):
            self.client.submit(["/bin/true"], restart_policy="solo")
        with self.assertRaises(ValueError):
            self.client.submit(["/bin/true"], restart_policy="")
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "in_place_dim: expected the name"):
            self.client.submit(["/bin/true"], restart_policy="in_place", in_place_dim="")
        with self.assertRaises(TypeError):
            self.client.submit(["/bin/true"], restart_policy=1)
        # The coordinator judges the dimension against the mesh.
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "spec.in_place_dim"):
            self.client.submit(["/bin/true"], nproc_per_node=2, mesh_shape=[2],
                               mesh_dim_names=["dp"], restart_policy="in_place",
                               in_place_dim="tp")
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "spec.in_place_dim"):
            self.client.submit(["/bin/true"], in_place_dim="dp")  # group takes no dimension

    def test_in_place_job_reports_each_membership_change(self):
        # Rank 1 fails once the world has formed; the agent relaunches it
        # alone while rank 0 runs on. Both then wait for `done`, so the job
        # is still RUNNING (and its membership kept) while it is read.
        worker = "\n".join([
            "import os, sys, time, meshrt",
            "rt = meshrt.init(timeout=30)",
            "lost = os.path.join(sys.argv[1], 'lost')",
            "if rt.rank == 1 and not os.path.exists(lost):",
            "    open(lost, 'w').close()",
            "    os._exit(1)",
            "while not os.path.exists(os.path.join(sys.argv[1], 'done')):",
            "    time.sleep(0.05)",
            "rt.shutdown()",
        ])
        scratch = tempfile.mkdtemp(dir=self.cluster.dir)
        job_id = self.client.submit(
            [sys.executable, "-c", worker, scratch], nproc_per_node=2, mesh_shape=[2],
            mesh_dim_names=["dp"], restart_policy="in_place", max_restarts=1,
            env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
        try:
            deadline = time.monotonic() + 30
            job = self.client.get(job_id)
            while len(job.membership) < 2 and not job.terminal:
                self.assertLess(time.monotonic(), deadline, job.membership)
                time.sleep(0.1)
                job = self.client.get(job_id)
        finally:
            open(os.path.join(scratch, "done"), "w").close()
        self.assertEqual(job.state, "RUNNING", self.client.logs(job_id))
        self.assertEqual((job.generation, job.restarts), (0, 1))  # In place: same generation.
        lost, returned = job.membership
        self.assertEqual((lost["epoch"], lost["rank"], lost["kind"], lost["incarnation"]),
                         (1, 1, "LOST", 0))
        self.assertIn("rank 1", lost["reason"])
        self.assertIn("exited with code 1", lost["reason"])
        self.assertEqual((returned["epoch"], returned["rank"], returned["kind"], returned["reason"]),
                         (2, 1, "RETURNED", ""))
        self.assertGreater(returned["incarnation"], 0)
        self.assertLessEqual(abs(lost["time"] - time.time()), 60)  # Unix seconds.
        self.assertLessEqual(lost["time"], returned["time"])
        self.assertEqual(self.client.wait(job_id, timeout=30).state, "SUCCEEDED")

    def test_create_job_hang_timeout_reaches_the_coordinator(self):
        # Two ranks of a bare job in this process; rank 0 waits in op #1 of
        # a group that rank 1 never enters. A 1 s hang timeout (not the
        # default 300 s) fails the job within seconds.
        job_id, generation = self.client.create_job(2, hang_timeout=1)
        runtimes = [None, None]

        def join(rank):
            runtimes[rank] = meshrt.init(
                read_env=False, coordinator=self.cluster.address, job_id=job_id,
                generation=generation, rank=rank, world_size=2, join_timeout=20)

        threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertTrue(all(runtimes), "a rank did not join")
        try:
            groups = [rt.track_group("stuck", [0, 1]) for rt in runtimes]
            start = time.monotonic()
            groups[0].enter("all_reduce")
            error = None
            while error is None and time.monotonic() - start < 15:
                try:
                    runtimes[0].health()
                    time.sleep(0.05)
                except meshrt.JobFailedError as e:
                    error = e
            self.assertIsNotNone(error, "no hang diagnosed within 15 s")
            self.assertIn("hang in group 'stuck'", error.message)
            self.assertIn("rank 1 never entered it", error.message)
        finally:
            for rt in runtimes:
                rt.shutdown()

    def test_address_from_environment(self):
        os.environ["MESH_COORDINATOR"] = self.cluster.address
        try:
            self.assertEqual(meshrt.JobClient().address, self.cluster.address)
        finally:
            del os.environ["MESH_COORDINATOR"]

    @unittest.skipUnless(mesh_harness.have_torch(), "torch is not installed for this interpreter")
    def test_meshrt_workers_under_the_agent(self):
        env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        job_id = self.client.submit([sys.executable, os.path.join(HERE, "workers.py"), "agent"],
                                    nproc_per_node=2, env=env)
        job = self.client.wait(job_id, timeout=60)
        logs = self.client.logs(job_id)
        self.assertEqual(job.state, "SUCCEEDED", logs)
        self.assertIn("[0] OK agent rank 0 of 2 sum 1", logs)
        self.assertIn("[1] OK agent rank 1 of 2 sum 1", logs)


if __name__ == "__main__":
    unittest.main()
