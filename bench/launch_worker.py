"""The trivial torchrun worker of `mesh-bench launch` (bench/launch_bench.h).

torchrun starts it once per rank. It records CLOCK_REALTIME when it starts
and once init_process_group("gloo") has returned (every rank is then in the
group: the "all ranks joined" moment, as WorkerService.Join is for Mesh),
and writes "<start_ns> <joined_ns>" to $LAUNCH_BENCH_OUT/rank-<RANK>.

`import torch` is part of what a torch worker pays before it can join, so it
happens after the first timestamp and counts.
"""
import os
import time

start_ns = time.clock_gettime_ns(time.CLOCK_REALTIME)

import datetime  # noqa: E402

import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
joined_ns = time.clock_gettime_ns(time.CLOCK_REALTIME)
rank = dist.get_rank()
dist.destroy_process_group()

path = os.path.join(os.environ["LAUNCH_BENCH_OUT"], f"rank-{rank}")
with open(path + ".tmp", "w") as f:
    f.write(f"{start_ns} {joined_ns}\n")
os.rename(path + ".tmp", path)
