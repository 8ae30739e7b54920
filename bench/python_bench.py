#!/usr/bin/env python3
"""What the meshrt bindings add over libmesh's C++ calls, in one process.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py [--json FILE] [--smoke]

Starts a mesh-coordinator on 127.0.0.1 (tests/python/mesh_harness.py), creates
a 1-rank job, joins it in this process (meshrt.init, Gloo on 127.0.0.1) and
times, in alternating batches, each Python call against the same work done by
a C++ loop of meshrt._meshrt._bench (python/src/bench_hooks.cc) on the very
objects the Python API uses:

  store     rt.store.set(key, value) + rt.store.get(key), 128-byte value, vs
            mesh::Store::Set + Get on the mesh::Store behind rt.store.
            Target: Python / C++ <= 1.5 per call.
  all_reduce  rt.world().all_reduce(t) (sync) on float32 torch CPU tensors of
            1 and 1024 elements, vs ProcessGroup::AllReduce + Wait of the same
            group on the same buffer (imported once through DLPack).
            Target: Python adds <= 5 µs per call.

Python and C++ are each the median over the batches of the mean time per
call within a batch; ratio and added are the medians of each pair of adjacent
batches' own ratio (Python / C++) and difference (Python - C++).
Prints a Markdown table; --json writes the figures the way mesh-bench suites
do ({"suite": "python", ...}; bench/report.py reads it). Without torch the
collective rows are skipped (exit 0, "skipped: ..." and a skipped JSON
section); the store rows need no torch. --smoke: tiny sizes, checks the
harness only (tests/python/test_python_bench.py).

The coordinator binary: --coordinator-bin, else $MESH_COORDINATOR_BIN, else
coordinator/mesh-coordinator of the build whose python/ dir meshrt came from.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import mesh_harness  # noqa: E402  (tests/python: starts and kills the coordinator)
import meshrt  # noqa: E402
from meshrt._meshrt import _bench  # noqa: E402

STORE_TARGET_RATIO = 1.5
COLLECTIVE_TARGET_ADDED_US = 5.0


def coordinator_bin(arg):
    if arg:
        return arg
    if os.environ.get("MESH_COORDINATOR_BIN"):
        return os.environ["MESH_COORDINATOR_BIN"]
    # <build>/python/meshrt/__init__.py -> <build>/coordinator/mesh-coordinator
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(meshrt.__file__))))
    return os.path.join(build, "coordinator", "mesh-coordinator")


def alternate(batches, python_side, cpp_side):
    """Runs the two sides in alternating batches (C++ first in odd batches).

    Each side returns ns per call over its batch. Returns the per-batch
    figures of both sides.
    """
    py_ns, cpp_ns = [], []
    for b in range(batches):
        if b % 2:
            cpp_ns.append(cpp_side())
            py_ns.append(python_side())
        else:
            py_ns.append(python_side())
            cpp_ns.append(cpp_side())
    return py_ns, cpp_ns


def summarize(py_ns, cpp_ns, calls):
    """Medians of each side, and of the paired batches' ratios and differences.

    Adjacent batches share the machine's state (load, which core the group's
    worker thread runs on), so pairing them cancels much of the drift.
    """
    return {"python_ns": statistics.median(py_ns), "cpp_ns": statistics.median(cpp_ns),
            "ratio": statistics.median(p / c for p, c in zip(py_ns, cpp_ns)),
            "added_ns": statistics.median(p - c for p, c in zip(py_ns, cpp_ns)),
            "calls_per_batch": calls, "batches": len(py_ns),
            "python_batch_ns": py_ns, "cpp_batch_ns": cpp_ns}


def bench_store(store, pairs, batches):
    key, value = "python-bench/key", b"v" * 128

    def python_side():
        s_set, s_get = store.set, store.get
        start = time.perf_counter_ns()
        for _ in range(pairs):
            s_set(key, value)
            s_get(key)
        return (time.perf_counter_ns() - start) / pairs

    def cpp_side():
        return _bench.store_set_get(store, key, value, pairs)

    python_side()  # Warm-up: channel, key.
    cpp_side()
    assert store.get(key) == value
    return summarize(*alternate(batches, python_side, cpp_side), pairs)


def bench_all_reduce(group, tensor, calls, batches):
    def python_side():
        ar = group.all_reduce
        start = time.perf_counter_ns()
        for _ in range(calls):
            ar(tensor)
        return (time.perf_counter_ns() - start) / calls

    def cpp_side():
        return _bench.all_reduce(group, tensor, calls)

    python_side()  # Warm-up: the group's worker thread, DLPack's first export.
    cpp_side()
    return summarize(*alternate(batches, python_side, cpp_side), calls)


def table(result):
    lines = ["| measure | Python | C++ | ratio | added per call |", "|---|---|---|---|---|"]
    s = result["store"]
    lines.append(f"| store set + get, 128 B (µs per pair) | {s['python_ns'] / 1e3:.1f} | "
                 f"{s['cpp_ns'] / 1e3:.1f} | {s['ratio']:.2f} | {s['added_ns'] / 1e3:.2f} µs |")
    coll = result["all_reduce"]
    if coll.get("skipped"):
        lines.append(f"| all_reduce | skipped | skipped | — | {coll['skip_reason']} |")
    else:
        for row in coll["rows"]:
            lines.append(f"| all_reduce {row['numel']} x float32, sync (µs per call) | "
                         f"{row['python_ns'] / 1e3:.2f} | {row['cpp_ns'] / 1e3:.2f} | "
                         f"{row['ratio']:.2f} | {row['added_ns'] / 1e3:.2f} µs |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the results as JSON to this file")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the harness only")
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--store-pairs", type=int, default=100, help="set+get pairs per batch")
    p.add_argument("--calls", type=int, default=1000, help="all_reduce calls per batch")
    p.add_argument("--numels", default="1,1024", help="tensor sizes (float32 elements)")
    p.add_argument("--coordinator-bin")
    args = p.parse_args()
    if args.smoke:
        args.batches, args.store_pairs, args.calls = 2, 5, 20
    numels = [int(n) for n in args.numels.split(",") if n]
    if args.batches < 1 or args.store_pairs < 1 or args.calls < 1 or not numels:
        p.error("--batches, --store-pairs, --calls and --numels must be positive")

    try:
        import torch
    except ImportError as e:
        torch = None
        torch_reason = f"torch is not importable by {sys.executable}: {e}"

    os.environ["MESH_COORDINATOR_BIN"] = coordinator_bin(args.coordinator_bin)
    result = {"suite": "python", "smoke": args.smoke, "python": sys.version.split()[0],
              "torch": torch.__version__ if torch else None,
              "targets": {"store_ratio": STORE_TARGET_RATIO,
                          "all_reduce_added_us": COLLECTIVE_TARGET_ADDED_US}}
    # Slow heartbeats: the benchmark, not the failure detector, is timed.
    with mesh_harness.Cluster(heartbeat_interval=1.0, heartbeat_timeout=30) as cluster:
        job_id, generation = meshrt.JobClient(cluster.address).create_job(1)
        rt = meshrt.init(coordinator=cluster.address, job_id=job_id, generation=generation,
                         rank=0, world_size=1, read_env=False, hostname="127.0.0.1",
                         join_timeout=20, store_timeout=30)
        try:
            result["store"] = bench_store(rt.store, args.store_pairs, args.batches)
            if torch is None:
                result["all_reduce"] = {"skipped": True, "skip_reason": torch_reason}
            else:
                group = rt.world()
                rows = []
                for numel in numels:
                    t = torch.zeros(numel, dtype=torch.float32)
                    row = bench_all_reduce(group, t, args.calls, args.batches)
                    rows.append({"numel": numel, "bytes": 4 * numel, **row})
                result["all_reduce"] = {"group": group.name, "backend": group.backend,
                                        "world_size": group.size, "rows": rows}
        finally:
            rt.finish()
    result["load_average"] = os.getloadavg()[0]
    s = result["store"]
    result["store_target_met"] = s["ratio"] <= STORE_TARGET_RATIO
    if not result["all_reduce"].get("skipped"):
        result["all_reduce_target_met"] = all(
            r["added_ns"] <= COLLECTIVE_TARGET_ADDED_US * 1e3 for r in result["all_reduce"]["rows"])

    print(f"# python: meshrt vs C++ on the same objects, {args.batches} alternating batches "
          f"(load average {result['load_average']:.2f})")
    print(table(result))
    if result["all_reduce"].get("skipped"):
        print(f"skipped: all_reduce: {result['all_reduce']['skip_reason']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
