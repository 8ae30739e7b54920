"""Shared pieces of the meshrt.torch tests (no tests of its own).

- ``require_torch()``: exits 77 (ctest's SKIP_RETURN_CODE for these tests)
  with a loud SKIPPED line when torch is missing, so a machine without
  python3-torch skips instead of failing.
- ``LocalCluster``: ``meshctl cluster up`` on 127.0.0.1 with a free port,
  as a context manager; every wait has a deadline and the cluster is
  stopped (SIGINT, then SIGKILL of meshctl, whose children die with it) on
  exit, whatever happened.
- ``meshctl(...)``: runs meshctl against a cluster, with a timeout.

Binaries: ``MESH_MESHCTL`` (set by ctest), else ``<repo>/build-b16/cli/meshctl``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("MESH_BUILD_DIR", os.path.join(REPO, "build-b16"))
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def require_torch() -> None:
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("torch.distributed with Gloo is not available")
    except ImportError as e:
        print(f"SKIPPED: torch is not importable by {sys.executable}: {e}", file=sys.stderr)
        sys.exit(77)


def meshctl_path() -> str:
    path = os.environ.get("MESH_MESHCTL") or os.path.join(BUILD, "cli", "meshctl")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"meshctl not found at {path}: build it or set MESH_MESHCTL")
    return path


def python_path() -> str:
    """The PYTHONPATH that imports meshrt (the one this process uses)."""
    import meshrt
    return os.path.dirname(os.path.dirname(os.path.abspath(meshrt.__file__)))


class LocalCluster:
    def __init__(self, agents: int = 1, slots: int = 1, ready_timeout: float = 30.0):
        self.agents = agents
        self.slots = slots
        self.ready_timeout = ready_timeout
        self.dir: Optional[str] = None
        self.proc: Optional[subprocess.Popen] = None
        self.address = ""

    def __enter__(self) -> "LocalCluster":
        self.dir = tempfile.mkdtemp(prefix="mesh-torch-test-")
        ready = os.path.join(self.dir, "ready")
        self.log = open(os.path.join(self.dir, "cluster.out"), "w+b")
        self.proc = subprocess.Popen(
            [meshctl_path(), "cluster", "up", "--agents", str(self.agents), "--slots",
             str(self.slots), "--port", "0", "--state-dir", os.path.join(self.dir, "state"),
             "--ready-file", ready, "--grace", "2", *self._bins()],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + self.ready_timeout
            while time.monotonic() < deadline:
                if os.path.exists(ready) and os.path.getsize(ready) > 0:
                    with open(ready) as f:
                        self.address = f.read().strip()
                    return self
                if self.proc.poll() is not None:
                    raise RuntimeError(f"meshctl cluster up exited {self.proc.returncode}:\n{self.output()}")
                time.sleep(0.05)
            raise RuntimeError(f"no cluster after {self.ready_timeout}s:\n{self.output()}")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    @staticmethod
    def _bins() -> List[str]:
        """The daemons ctest names (MESH_COORDINATOR_BIN, MESH_AGENT_BIN);
        else meshctl finds them itself."""
        args = []
        for flag, name in (("--coordinator-bin", "MESH_COORDINATOR_BIN"), ("--agent-bin", "MESH_AGENT_BIN")):
            if os.environ.get(name):
                args += [flag, os.environ[name]]
        return args

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.dir is not None:
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def meshctl(self, *args: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([meshctl_path(), "--coordinator", self.address, *args],
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"meshctl {' '.join(args)} exited {result.returncode}:\n"
                               f"{result.stdout}\n{result.stderr}")
        return result


def worker_options(address: str, job_id: str, rank: int = 0, world_size: int = 1) -> dict:
    """meshrt.init options for a process of a bare job (create-job)."""
    return dict(coordinator=address, job_id=job_id, generation=0, rank=rank,
                world_size=world_size, read_env=False, hostname="127.0.0.1",
                join_timeout=20, store_timeout=30)


def worker_env(address: str, job_id: str, rank: int = 0, world_size: int = 1) -> dict:
    """The MESH_* environment of a process of a bare job, as an agent sets it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESH_", "MASTER_"))}
    env.update(MESH_COORDINATOR=address, MESH_JOB_ID=job_id, MESH_GENERATION="0",
               MESH_RANK=str(rank), MESH_WORLD_SIZE=str(world_size), MESH_NODE_NAME="127.0.0.1")
    return env


def env_list(names: List[str]) -> List[str]:
    return [f"{name}={os.environ[name]}" for name in names if name in os.environ]
