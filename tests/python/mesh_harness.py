"""Real processes on 127.0.0.1 for the meshrt tests.

Coordinator: the built mesh-coordinator (MESH_COORDINATOR_BIN, set by
tests/python/CMakeLists.txt) on a free port, plaintext, with fast heartbeats
so that failures propagate in about a second. Workers: /usr/bin/python3 (this
interpreter) running tests/python/workers.py with the MESH_* variables set by
hand, as an agent would set them, for a job created with
AdminService.CreateJob (JobClient.create_job).

Every process starts in its own session and is killed (the whole process
group) when the test ends, whatever happens; every wait has a deadline.
"""

import os
import pwd
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BANNER = "mesh-coordinator listening on "
HERE = os.path.dirname(os.path.abspath(__file__))


def binary(name):
    """Path of a built binary from the environment ctest sets."""
    path = os.environ.get(name, "")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError(f"{name} is not set to a built binary (run through ctest)")
    return path


def clean_env(extra=None):
    """This process's environment without MESH_* variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESH_") or k.endswith("_BIN")}
    env.update(extra or {})
    return env


def kill_group(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Cluster:
    """A coordinator, optionally agents; use as a context manager."""

    def __init__(self, heartbeat_interval=0.1, heartbeat_timeout=1.5):
        self.dir = tempfile.mkdtemp(prefix="meshrt-test-")
        self.procs = []
        self.address = None
        self.heartbeat = (heartbeat_interval, heartbeat_timeout)

    def __enter__(self):
        try:
            self._start_coordinator()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        for proc in reversed(self.procs):
            kill_group(proc)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _spawn(self, argv, env=None, **kwargs):
        proc = subprocess.Popen(argv, env=clean_env(env), start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def _start_coordinator(self, timeout=20):
        interval, hb_timeout = self.heartbeat
        proc = self._spawn(
            [binary("MESH_COORDINATOR_BIN"), "--insecure", "--listen", "127.0.0.1", "--port", "0",
             "--state-dir", os.path.join(self.dir, "state"),
             "--heartbeat-interval", str(interval), "--heartbeat-timeout", str(hb_timeout),
             "--node-heartbeat-interval", "0.2", "--node-heartbeat-timeout", "3",
             "--kill-grace", "1", "--shutdown-grace", "0.2"],
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.dir, "coordinator.log"), "wb"))
        line = read_line(proc.stdout, timeout)
        if not line.startswith(BANNER):
            raise RuntimeError(f"mesh-coordinator did not start: {line!r}; see its log")
        self.address = line[len(BANNER):].strip()

    def start_agent(self, name, slots):
        self._spawn(
            [binary("MESH_AGENT_BIN"), "--coordinator", self.address, "--name", name,
             "--address", "127.0.0.1", "--slots", str(slots), "--gpus", "none",
             "--work-dir", os.path.join(self.dir, name), "--grace", "1",
             # Jobs of this coordinator have no owner (no authentication):
             # run them as this user when the agent is root.
             "--unowned-job-user", pwd.getpwuid(os.geteuid()).pw_name],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, f"{name}.log"), "wb"))

    def run_workers(self, scenario, world_size, mesh_shape=None, dim_names=None, timeout=60,
                    extra_env=None, in_place=False):
        """Creates a job and runs `world_size` workers of `scenario`.

        Returns [(returncode, output)] in rank order; kills them all after
        `timeout` seconds (returncode None then).
        """
        import meshrt

        job_id, generation = meshrt.JobClient(self.address).create_job(
            world_size, mesh_shape=mesh_shape, mesh_dim_names=dim_names, in_place=in_place)
        workers = []
        for rank in range(world_size):
            env = {
                "MESH_COORDINATOR": self.address,
                "MESH_JOB_ID": job_id,
                "MESH_GENERATION": str(generation),
                "MESH_RANK": str(rank),
                "MESH_WORLD_SIZE": str(world_size),
                "MESH_NODE_NAME": "node-0",
                "PYTHONUNBUFFERED": "1",
            }
            env.update(extra_env or {})
            out = open(os.path.join(self.dir, f"{job_id}-{rank}.log"), "w+b")
            proc = self._spawn([sys.executable, os.path.join(HERE, "workers.py"), scenario],
                               env=env, stdout=out, stderr=subprocess.STDOUT)
            workers.append((proc, out))
        deadline = time.monotonic() + timeout
        results = []
        for proc, out in workers:
            try:
                rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rc = None
            results.append(rc)
        for proc, _ in workers:
            kill_group(proc)
        outputs = []
        for (proc, out), rc in zip(workers, results):
            out.seek(0)
            outputs.append((rc, out.read().decode("utf-8", "replace")))
            out.close()
        return outputs


def read_line(stream, timeout):
    """One line from a pipe, or '' after `timeout` seconds."""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not sel.select(remaining):
            break
        chunk = os.read(stream.fileno(), 1)
        if not chunk:
            break
        data += chunk
    sel.close()
    return data.decode("utf-8", "replace")


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False
