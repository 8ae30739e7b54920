#!/usr/bin/env python3
"""Recovery from a lost rank: Mesh's in-place recovery against torchrun's
restart of the whole group, on one machine (docs/performance.md).

    python3 bench/recovery_bench.py [--build build] [--nproc 8] [--rounds 3]
                                    [--no-torchrun] [--replacement-delay-ms MS]
                                    [--json FILE] [--keep]

Mesh. A mesh-coordinator (ranks heartbeat every 0.25 s, dead after 1 s of
silence) and one mesh-agent with --nproc slots run as children. Each round
submits examples/elastic_train as one node x nproc ranks on a (nproc, 1)
dp x tp mesh with restart_policy IN_PLACE, waits until every rank has
committed 20 steps, and kill -9s rank nproc/2. Measured, from the kill:
  - recovered: rank 0's first committed all-reduce of a later membership
    epoch (the survivors' first successful collective of the new epoch;
    with nproc - 1 replicas, or nproc when the replacement was already
    back when they rebuilt);
  - rejoined: rank 0's first step with nproc replicas in the epoch the
    replacement came back in (it took the state from a peer and the groups
    grew back).

torchrun. torchrun --standalone --nproc_per_node nproc --max-restarts 1 runs
bench/peers/torchrun_recovery_worker.py, a gloo all-reduce loop. The same
rank is killed after 20 steps; torchrun stops the others and starts all
nproc again. Measured, from the kill: the first all-reduce the new group
completes (on any rank). Skipped when torchrun or torch (under
$MESH_BENCH_PYTHON, default /usr/bin/python3) is missing.

Both run the same 20 ms step loop. Rounds alternate the two. The report
gives each round, the medians and the ratio torchrun / Mesh; the issue's
goal is Mesh under 1 s. Every wait has a deadline, and every child is
killed on exit.
"""
import argparse
import getpass
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM_STEPS = 20


def now_ms():
    return time.time_ns() // 1_000_000


def wait_until(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def pid_of(job_id, rank):
    """The live process with MESH_JOB_ID=job_id and MESH_RANK=rank."""
    want = {f"MESH_JOB_ID={job_id}".encode(), f"MESH_RANK={rank}".encode()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            return int(entry)
    return None


class MeshCluster:
    """A coordinator and one agent as children of this script."""

    def __init__(self, build, nproc, tmp):
        self.build = build
        self.tmp = tmp
        self.children = []
        state = os.path.join(tmp, "state")
        os.makedirs(state)
        coordinator = subprocess.Popen(
            [os.path.join(build, "coordinator", "mesh-coordinator"), "--insecure", "--listen",
             "127.0.0.1", "--port", "0", "--state-dir", state, "--heartbeat-interval", "0.25",
             "--heartbeat-timeout", "1", "--kill-grace", "1", "--shutdown-grace", "0.5"],
            stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "coordinator.log"), "w"),
            text=True)
        self.children.append(coordinator)
        banner = coordinator.stdout.readline().strip()
        prefix = "mesh-coordinator listening on "
        if not banner.startswith(prefix):
            raise RuntimeError(f"coordinator did not start: {banner!r}; see {tmp}/coordinator.log")
        self.address = banner[len(prefix):]
        self.work = os.path.join(tmp, "agent")
        self.children.append(subprocess.Popen(
            [os.path.join(build, "agent", "mesh-agent"), "--coordinator", self.address, "--name",
             "bench-0", "--address", "127.0.0.1", "--slots", str(nproc), "--gpus", "none",
             "--work-dir", self.work, "--grace", "1", "--unowned-job-user", getpass.getuser()],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "agent.log"), "w")))

    def meshctl(self, *args, timeout=30):
        return subprocess.run(
            [os.path.join(self.build, "cli", "meshctl"), "--coordinator", self.address, *args],
            capture_output=True, text=True, timeout=timeout, check=True).stdout

    def steps(self, job_id, rank):
        """(step, replicas, ms, epoch) of every committed step in the rank's log."""
        path = os.path.join(self.work, "jobs", job_id, "gen-0", f"rank-{rank}.log")
        out = []
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 12 and parts[0] == "step":
                        out.append((int(parts[1]), int(parts[3]), int(parts[11]), int(parts[7])))
        except OSError:
            pass
        return out

    def stop(self):
        for child in reversed(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def mesh_round(cluster, nproc, victim, index, replacement_delay_ms):
    job_id = cluster.meshctl(
        "submit", "--parsable", "--name", f"recovery-{index}", "--nodes", "1",
        "--nproc-per-node", str(nproc), "--mesh-shape", f"{nproc},1", "--dim-names", "dp,tp",
        "--restart-policy", "in_place", "--max-restarts", "3", "--",
        os.path.join(cluster.build, "examples", "elastic_train"), "--steps", "100000",
        "--step-ms", "20", "--gloo-host", "127.0.0.1", "--restart-delay-ms",
        str(replacement_delay_ms)).strip()
    try:
        wait_until(lambda: all(len(cluster.steps(job_id, r)) >= WARM_STEPS for r in range(nproc)),
                   60, f"job {job_id}: every rank at step {WARM_STEPS}")
        pid = pid_of(job_id, victim)
        if pid is None:
            raise RuntimeError(f"job {job_id}: no process for rank {victim}")
        epoch = cluster.steps(job_id, 0)[-1][3]
        killed = now_ms()
        os.kill(pid, signal.SIGKILL)

        def first(predicate):
            for _, replicas, ms, seen in cluster.steps(job_id, 0):
                if ms >= killed and predicate(replicas, seen):
                    return ms
            return None

        # The first step of a later epoch: with nproc - 1 replicas, or with
        # nproc when the replacement was back before the survivors'
        # rebuild (both lost and back in one AliveRanks round).
        recovered = wait_until(lambda: first(lambda r, e: e > epoch), 30,
                               f"job {job_id}: a step after the loss")
        rejoined = wait_until(lambda: first(lambda r, e: e >= epoch + 2 and r == nproc), 60,
                              f"job {job_id}: {nproc} replicas again")
        return {"job": job_id, "recovered_s": (recovered - killed) / 1000.0,
                "rejoined_s": (rejoined - killed) / 1000.0}
    finally:
        subprocess.run([os.path.join(cluster.build, "cli", "meshctl"), "--coordinator",
                        cluster.address, "cancel", job_id], capture_output=True, timeout=30)
        wait_until(lambda: all(pid_of(job_id, r) is None for r in range(nproc)), 30,
                   f"job {job_id}: workers gone after cancel")


def torch_unavailable(python):
    if shutil.which("torchrun") is None:
        return "torchrun is not on PATH"
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        return f"{python} cannot import torch"
    return ""


def torch_round(python, nproc, victim, tmp, index):
    out = os.path.join(tmp, f"torch-{index}")
    os.makedirs(out)
    env = dict(os.environ, RECOVERY_OUT=out, RECOVERY_STEPS="100000", RECOVERY_STEP_MS="20",
               OMP_NUM_THREADS="1")
    log = open(out + ".log", "w")
    torchrun = subprocess.Popen(
        [python, shutil.which("torchrun"), "--standalone", f"--nproc_per_node={nproc}",
         "--max_restarts=1", "--redirects=1", "--tee=2", f"--log_dir={out}/torchrun",
         os.path.join(REPO, "bench", "peers", "torchrun_recovery_worker.py")],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def lines(rank):
        try:
            with open(os.path.join(out, f"rank-{rank}")) as f:
                return [line.split() for line in f]
        except OSError:
            return []

    try:
        def warm():
            return all(sum(1 for p in lines(r) if p[0] == "0") >= WARM_STEPS for r in range(nproc))
        wait_until(warm, 120, f"torchrun round {index}: every rank at step {WARM_STEPS}")
        pid = next(int(p[1]) for p in lines(victim) if p[0] == "pid")
        killed = now_ms()
        os.kill(pid, signal.SIGKILL)

        def first_after_restart():
            times = [int(p[2]) for r in range(nproc) for p in lines(r)
                     if p[0] == "1" and len(p) == 3]
            return min(times) if times else None

        recovered = wait_until(first_after_restart, 120,
                               f"torchrun round {index}: the restarted group's first all-reduce")
        return {"recovered_s": (recovered - killed) / 1000.0}
    finally:
        try:
            os.killpg(torchrun.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        torchrun.wait()
        log.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-torchrun", action="store_true")
    parser.add_argument("--replacement-delay-ms", type=int, default=0,
                        help="the Mesh replacement waits this long before joining, as one "
                             "that loads a framework would (elastic_train --restart-delay-ms)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp dir (the workers' logs) and print where it is")
    args = parser.parse_args()
    if args.nproc < 2 or args.rounds < 1:
        parser.error("--nproc must be >= 2 and --rounds >= 1")
    build = os.path.abspath(args.build)
    for binary in ("coordinator/mesh-coordinator", "agent/mesh-agent", "cli/meshctl",
                   "examples/elastic_train"):
        if not os.access(os.path.join(build, binary), os.X_OK):
            sys.exit(f"recovery_bench: {build}/{binary} is missing; build first (make build)")
    victim = args.nproc // 2  # Never rank 0, whose log is read.
    python = os.environ.get("MESH_BENCH_PYTHON", "/usr/bin/python3")
    skip = "--no-torchrun" if args.no_torchrun else torch_unavailable(python)

    tmp = tempfile.mkdtemp(prefix="mesh-recovery-bench-")
    cluster = MeshCluster(build, args.nproc, tmp)
    mesh, torch = [], []
    try:
        for index in range(args.rounds):
            mesh.append(mesh_round(cluster, args.nproc, victim, index,
                                   args.replacement_delay_ms))
            print(f"mesh round {index}: recovered {mesh[-1]['recovered_s']:.3f} s, "
                  f"rejoined {mesh[-1]['rejoined_s']:.3f} s", flush=True)
            if not skip:
                torch.append(torch_round(python, args.nproc, victim, tmp, index))
                print(f"torchrun round {index}: recovered {torch[-1]['recovered_s']:.3f} s",
                      flush=True)
    except Exception:
        print(f"recovery_bench: failed; logs kept in {tmp}", file=sys.stderr)
        raise
    finally:
        cluster.stop()
    mesh_median = statistics.median(r["recovered_s"] for r in mesh)
    rejoin_median = statistics.median(r["rejoined_s"] for r in mesh)
    result = {"nproc": args.nproc, "victim": victim, "mesh": mesh, "torchrun": torch,
              "replacement_delay_ms": args.replacement_delay_ms,
              "mesh_recovered_median_s": mesh_median, "mesh_rejoined_median_s": rejoin_median,
              "load_average": os.getloadavg()[0]}
    print(f"\n{args.nproc} ranks on one CPU host, kill -9 of rank {victim}, medians of "
          f"{args.rounds} rounds:")
    print(f"  Mesh in place: survivors' first collective of the new epoch {mesh_median:.3f} s "
          f"(goal < 1 s), replacement back in the mesh {rejoin_median:.3f} s")
    if torch:
        torch_median = statistics.median(r["recovered_s"] for r in torch)
        result["torchrun_recovered_median_s"] = torch_median
        result["ratio"] = torch_median / mesh_median
        print(f"  torchrun group restart: first collective of the new group {torch_median:.3f} s")
        print(f"  ratio torchrun / Mesh: {torch_median / mesh_median:.1f}x")
    else:
        result["torchrun_skipped"] = skip
        print(f"  torchrun: skipped ({skip})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.keep:
        print(f"  logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
