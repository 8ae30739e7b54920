#!/usr/bin/python3
"""torch.distributed Gloo peer of `mesh-bench collectives` (bench/collectives_bench.h).

Same ops, sizes and bus-bandwidth formulas, float32, N local processes:

    /usr/bin/python3 bench/peers/torch_gloo_collectives.py --nproc 2 -b 64K -e 64M -f 4

For every op and size: `warmup` untimed calls, then `iters` calls back to back;
the time per call is the slowest rank's average, as in the Mesh suite. Each
size is then run once on deterministic data and checked exactly. Prints one
JSON object per line on stdout (rank 0's), with "error" instead of figures
when torch's Gloo backend cannot run the op (torch 1.13 has no Gloo
reduce_scatter). Exit status 1 on a wrong result, 3 without torch.
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time

BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def sizes(args):
    b = args.minbytes
    while b <= args.maxbytes:
        yield b
        b *= args.stepfactor


def worker(rank, n, store_path, args, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)

    def inputs(count):
        i = torch.arange(count, dtype=torch.int64)
        return ((rank + 1) * 3 + (i % 7)).to(torch.float32)

    def make(op, count):
        """Returns (call, output, expected) for `count` elements."""
        chunk = count // n
        x = inputs(count)
        if op == "all_reduce":
            buf = x.clone()
            want = sum(((r + 1) * 3 + (torch.arange(count) % 7)).float() for r in range(n))
            return (lambda: dist.all_reduce(buf)), buf, want, lambda: buf.copy_(x)
        if op == "all_gather":
            src = x[:chunk].clone()
            outs = [torch.empty(chunk) for _ in range(n)]
            want = torch.cat([((r + 1) * 3 + (torch.arange(chunk) % 7)).float() for r in range(n)])
            return (lambda: dist.all_gather(outs, src)), outs, want, lambda: None
        if op == "reduce_scatter":
            ins = list(x[: chunk * n].chunk(n))
            res = torch.empty(chunk)
            base = torch.arange(rank * chunk, (rank + 1) * chunk) % 7
            want = sum(((r + 1) * 3 + base).float() for r in range(n))
            return (lambda: dist.reduce_scatter(res, ins)), res, want, lambda: None
        if op == "all_to_all":
            src = x[: chunk * n].clone()
            res = torch.empty(chunk * n)
            idx = torch.arange(rank * chunk, (rank + 1) * chunk) % 7
            want = torch.cat([((r + 1) * 3 + idx).float() for r in range(n)])
            return (lambda: dist.all_to_all_single(res, src)), res, want, lambda: None
        raise ValueError(op)

    for op in args.ops.split(","):
        for nbytes in sizes(args):
            count = nbytes // 4
            if op != "all_reduce":
                count -= count % n
            row = {"op": op, "bytes": nbytes, "count": count}
            try:
                call, output, want, reset = make(op, count)
                for _ in range(args.warmup_iters):
                    call()
                dist.barrier()
                start = time.perf_counter()
                for _ in range(args.iters):
                    call()
                per_call = torch.tensor([(time.perf_counter() - start) / args.iters], dtype=torch.float64)
                dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
                reset()
                if isinstance(output, list):
                    for t in output:
                        t.fill_(float("nan"))
                elif op != "all_reduce":
                    output.fill_(float("nan"))
                call()
                got = torch.cat(output) if isinstance(output, list) else output
                wrong = torch.tensor([int((got != want).sum())], dtype=torch.int64)
                dist.all_reduce(wrong)
                seconds = float(per_call[0])
                algbw = count * 4 / seconds / 1e9
                row.update(time_us=seconds * 1e6, algbw_gbps=algbw,
                           busbw_gbps=algbw * BUS_FACTOR[op](n), wrong=int(wrong[0]))
            except (RuntimeError, ValueError) as e:  # e.g. an op Gloo lacks
                row["error"] = str(e).splitlines()[0][:200]
                dist.barrier()
            if rank == 0:
                out.put(row)
            if row.get("error"):
                break  # the other sizes of an unsupported op fail alike
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("-b", "--minbytes", type=parse_size, default=64 << 10)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,all_to_all")
    p.add_argument("--timeout", type=float, default=600, help="whole run, seconds")
    args = p.parse_args()
    if args.nproc < 1 or args.minbytes < 4 * args.nproc or args.maxbytes < args.minbytes or args.stepfactor < 2:
        p.error("bad sizes or process count")
    try:
        import torch  # noqa: F401  (fail here, not in every worker)
    except ImportError as e:
        print(f"torch_gloo_collectives: no torch ({e}); use /usr/bin/python3 with python3-torch",
              file=sys.stderr)
        return 3
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="mesh-bench-gloo-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=worker, args=(r, args.nproc, store, args, out)) for r in range(args.nproc)]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + args.timeout
        wrong = 0
        rc = 0
        while any(proc.is_alive() for proc in procs) or not out.empty():
            try:
                row = out.get(timeout=0.2)
            except Exception:  # queue.Empty
                if time.monotonic() > deadline:
                    print("torch_gloo_collectives: timed out", file=sys.stderr)
                    rc = 124
                    break
                if any(proc.exitcode not in (None, 0) for proc in procs):
                    rc = 1
                    break
                continue
            print(json.dumps(row), flush=True)
            wrong += row.get("wrong", 0)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        if rc == 0 and any(proc.exitcode != 0 for proc in procs):
            rc = 1
    return rc or (1 if wrong else 0)


if __name__ == "__main__":
    sys.exit(main())
