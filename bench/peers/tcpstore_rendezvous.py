#!/usr/bin/python3
"""torch.distributed TCPStore peer of `mesh-bench rendezvous` (bench/rendezvous_bench.h).

N simulated ranks join, pass a barrier and read a 128-byte ID through one
TCPStore server in this process, the way torch jobs rendezvous through c10d:

    join     add("join", 1); the last joiner sets "join_done"; wait(["join_done"])
             (rank 0 first sets "id", the 128-byte unique ID, as Mesh's rank 0
             Join carries it)
    barrier  add("barrier", 1); the last sets "barrier_done"; wait(["barrier_done"])
    id       get("id"), checked byte for byte

TCPStore's client API is blocking, so ranks cannot each be an asynchronous
chain as in the Mesh suite: --connections client threads (each its own TCP
connection, 4 by default like mesh-bench's channels) each drive N/connections
ranks through every step in turn; --connection-per-rank gives every rank its
own connection and thread, as a real job has. Every round uses fresh keys. Prints one
JSON document on stdout: per-round total and CPU time (this whole process:
clients and server, like Mesh's in-process figure), step times, the time
the clients took to connect before the round (connect_s) and the medians. On a timeout or a failure it prints the same document with
"error" set and exits 1 (2 for bad arguments, 3 without torch).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta

ID_BYTES = 128


def unique_id(seed):
    x = (seed * 2654435761 + 1) & 0xFFFFFFFF
    out = bytearray()
    for _ in range(ID_BYTES):
        x = (x * 1664525 + 1013904223) & 0xFFFFFFFF
        out.append(x >> 24)
    return bytes(out)


SERVER_CODE = """
import datetime, resource, sys
import torch.distributed as dist
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=float(sys.argv[1])))
print(store.port, flush=True)
sys.stdin.read()  # Until the parent closes it (or exits).
"""


def start_server_process(timeout):
    """The TCPStore server in a child process, as `mesh-bench serve` runs
    Mesh's coordinator: this process then holds only the clients' ends.
    Returns (process, port)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER_CODE, str(timeout.total_seconds())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = proc.stdout.readline()
    if not line.strip():
        proc.kill()
        raise RuntimeError("the TCPStore server process did not start")
    return proc, int(line)


def run_round(dist, port, n, connections, prefix, expected_id, timeout):
    """One round; returns {total_s, cpu_s, step_s} or raises."""
    step_names = ("join", "barrier", "unique_id")
    done = [[0.0] * len(step_names) for _ in range(connections)]
    errors = []
    # Clients connect before the clock starts, as mesh-bench's channels do;
    # how long that took is reported as connect_s, as mesh-bench does.
    c0 = time.perf_counter()
    clients = [dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
               for _ in range(connections)]
    connect_s = time.perf_counter() - c0
    start_gate = threading.Barrier(connections + 1)
    t0 = [0.0]

    def drive(c):
        store = clients[c]
        ranks = range(c, n, connections)
        try:
            start_gate.wait()
            for r in ranks:
                if r == 0:
                    store.set(f"{prefix}/id", expected_id)
                if store.add(f"{prefix}/join", 1) == n:
                    store.set(f"{prefix}/join_done", "1")
            for r in ranks:
                store.wait([f"{prefix}/join_done"], timeout)
            done[c][0] = time.perf_counter() - t0[0]
            for r in ranks:
                if store.add(f"{prefix}/barrier", 1) == n:
                    store.set(f"{prefix}/barrier_done", "1")
            for r in ranks:
                store.wait([f"{prefix}/barrier_done"], timeout)
            done[c][1] = time.perf_counter() - t0[0]
            for r in ranks:
                if store.get(f"{prefix}/id") != expected_id:
                    raise RuntimeError(f"rank {r} read a wrong ID")
            done[c][2] = time.perf_counter() - t0[0]
        except Exception as e:  # noqa: BLE001 - reported with the round
            errors.append(f"connection {c}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")

    threads = [threading.Thread(target=drive, args=(c,), daemon=True) for c in range(connections)]
    for t in threads:
        t.start()
    cpu0 = time.process_time()
    t0[0] = time.perf_counter()
    start_gate.wait()
    deadline = time.monotonic() + timeout.total_seconds() + 5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"round did not finish within {timeout.total_seconds():.0f} s")
    total = time.perf_counter() - t0[0]
    cpu = time.process_time() - cpu0
    if errors:
        raise RuntimeError(f"{len(errors)} connection(s) failed; first: {errors[0]}")
    return {"total_s": total, "cpu_s": cpu, "connect_s": connect_s,
            "step_s": {name: max(d[i] for d in done) for i, name in enumerate(step_names)}}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--ranks", type=int, default=4096)
    p.add_argument("-c", "--connections", type=int, default=4)
    p.add_argument("--connection-per-rank", action="store_true",
                   help="one connection and one client thread per rank, as in a real job "
                        "(overrides --connections)")
    p.add_argument("--server-process", action="store_true",
                   help="run the TCPStore server in a child process (CPU time is then the "
                        "clients' alone), as mesh-bench's --coordinator runs against serve")
    p.add_argument("-r", "--repeat", type=int, default=3)
    p.add_argument("-w", "--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120, help="per round, seconds")
    args = p.parse_args()
    if args.connection_per_rank:
        args.connections = args.ranks
    if args.ranks < 1 or args.connections < 1 or args.repeat < 1 or args.warmup < 0:
        p.error("ranks, connections and repeat must be >= 1, warmup >= 0")
    result = {"benchmark": "tcpstore_rendezvous", "ranks": args.ranks,
              "connections": min(args.connections, args.ranks), "rounds": []}
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        result["error"] = f"no torch ({e}); use /usr/bin/python3 with python3-torch"
        print(json.dumps(result))
        return 3
    result["torch"] = torch.__version__
    result["load_average"] = os.getloadavg()[0]
    timeout = timedelta(seconds=args.timeout)
    connections = result["connections"]
    # A connection per rank needs a descriptor per client and per server end,
    # and a thread per client: give the peer what mesh-bench takes for itself
    # (the hard descriptor limit) and small thread stacks, so that it fails
    # on its own limits rather than on this process's defaults.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(256 * 1024)
    result["server_process"] = args.server_process
    server_proc = None
    try:
        if args.server_process:
            server_proc, port = start_server_process(timeout)
        else:
            server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timeout)
            port = server.port
        for i in range(args.warmup + args.repeat):
            prefix = f"round{i}"
            r = run_round(dist, port, args.ranks, connections, prefix,
                          unique_id(i), timeout)
            if i >= args.warmup:
                result["rounds"].append(r)
    except Exception as e:  # noqa: BLE001 - the failure is the result
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    if result["rounds"]:
        result["total_s"] = statistics.median(r["total_s"] for r in result["rounds"])
        result["cpu_s"] = statistics.median(r["cpu_s"] for r in result["rounds"])
        result["connect_s"] = statistics.median(r["connect_s"] for r in result["rounds"])
    if server_proc is not None:
        server_proc.kill()
    print(json.dumps(result, indent=1))
    sys.stdout.flush()
    # A thread stuck in a store call must not keep the interpreter alive.
    os._exit(1 if "error" in result else 0)


if __name__ == "__main__":
    main()
