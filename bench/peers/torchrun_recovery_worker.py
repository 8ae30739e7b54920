"""The torchrun side of bench/recovery_bench.py: a gloo all-reduce loop.

torchrun starts it once per rank, and again for every rank after a worker
dies (--max-restarts). Each committed step appends
"<restart> <step> <unix_ms>" to $RECOVERY_OUT/rank-<RANK>; the first line of
each process is "pid <pid> <restart>", so the driver can kill a rank.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist

out = os.environ["RECOVERY_OUT"]
steps = int(os.environ.get("RECOVERY_STEPS", "100000"))
step_ms = int(os.environ.get("RECOVERY_STEP_MS", "20"))
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ["RANK"])

with open(os.path.join(out, f"rank-{rank}"), "a", buffering=1) as log:
    log.write(f"pid {os.getpid()} {restart}\n")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.ones(4)
    for step in range(1, steps + 1):
        t.fill_(1.0)
        dist.all_reduce(t)
        log.write(f"{restart} {step} {time.time_ns() // 1_000_000}\n")
        time.sleep(step_ms / 1000.0)
    dist.destroy_process_group()
