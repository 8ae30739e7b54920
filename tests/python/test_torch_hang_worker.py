"""The worker of test_torch_hang.py (not a test module: run by Mesh agents).

Gloo, CPU, initialised through mesh:// (so meshrt.torch's progress hook
numbers the collectives of the default group, "torch/world"). Every rank runs
five all_reduces and checks their sums and that the hook counted exactly
five ops of "torch/world" (init_process_group's own store-based barrier is no
collective, so numbering starts at our first all_reduce). Then, by
HANG_TEST_MODE:

- ``hang``: rank 1 sleeps (an hour: the job's kill ends it) while every
  other rank enters all_reduce #6. The waiting ranks issue it with
  ``async_op=True`` and poll ``rt.health()`` every 10 ms (a Gloo op itself
  never learns that the job failed; health() raises the job's
  JobFailedError as soon as this rank's Runtime knows). They print
  ``WAIT-ENTER <epoch>`` just before the call and
  ``DIAGNOSED <seconds> SIGTERM <seconds|none>: <message>`` when the
  exception arrives, both times measured with time.monotonic() from just
  before the call (the second: when the agent's SIGTERM came), and exit 2
  without tearing torch down (the Gloo op is still pending).
- ``compute``: every rank sleeps HANG_TEST_COMPUTE_SECONDS between all_reduce
  #6 and #7 (outside any collective), then prints ``OK rank R``.
"""

import os
import signal
import time


def log(message: str) -> None:
    print(message, flush=True)


def fail(message: str) -> None:
    log(f"FAIL: {message}")
    os._exit(3)  # no teardown: a Gloo op may be pending


def main() -> None:
    import torch
    import torch.distributed as dist

    import meshrt
    import meshrt.torch as mt

    mode = os.environ["HANG_TEST_MODE"]
    dist.init_process_group("gloo", init_method="mesh://")
    rt = mt.runtime()
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(1, 6):
        t = torch.full((4,), float(rank + step))
        dist.all_reduce(t)
        expected = float(sum(r + step for r in range(world)))
        if not torch.equal(t, torch.full((4,), expected)):
            fail(f"all_reduce #{step}: {t.tolist()} != {expected}")
    snap = mt.tracked_groups()["torch/world"].snapshot()
    if snap["entered"] != 5 or snap["completed"] != 5 or snap["completed_kind"] != "all_reduce":
        fail(f"progress of 'torch/world' after 5 all_reduces: {snap}")
    log(f"rank {rank}: 5 all_reduces done, world progress {snap}")

    if mode == "hang":
        if rank == 1:
            log("rank 1: sleeping before all_reduce #6")
            time.sleep(3600)
            fail("rank 1 woke up")
        # With --on-hang fail the agents SIGTERM the workers as the job
        # fails, often before this rank's Runtime has heard of the failure
        # (it learns within about a heartbeat interval). So SIGTERM only
        # starts a grace of 3 s (the agents' SIGKILL comes 10 s after it)
        # in which the exception must arrive.
        terminated = []
        signal.signal(signal.SIGTERM, lambda *_: terminated.append(time.monotonic()))
        t = torch.ones(4)
        log(f"WAIT-ENTER {time.time():.3f}")
        start = time.monotonic()
        work = dist.all_reduce(t, async_op=True)
        deadline = start + 120
        while time.monotonic() < deadline and not (terminated and time.monotonic() > terminated[0] + 3):
            try:
                rt.health()
            except meshrt.JobFailedError as e:
                elapsed = time.monotonic() - start
                sigterm = f"{terminated[0] - start:.3f}" if terminated else "none"
                log(f"DIAGNOSED {elapsed:.3f} SIGTERM {sigterm}: {e}")
                os._exit(2)  # the Gloo op is still pending: no teardown
            if work.is_completed():
                fail("all_reduce #6 completed without rank 1")
            time.sleep(0.01)
        fail(f"no JobFailedError {time.monotonic() - start:.1f} s after entering all_reduce #6"
             + (f", {time.monotonic() - terminated[0]:.1f} s after SIGTERM" if terminated else ""))
    elif mode == "compute":
        seconds = float(os.environ["HANG_TEST_COMPUTE_SECONDS"])
        t = torch.ones(4)
        dist.all_reduce(t)
        log(f"rank {rank}: computing for {seconds:g} s")
        time.sleep(seconds)
        dist.all_reduce(t)
        if not torch.equal(t, torch.full((4,), float(world * world))):
            fail(f"all_reduce #7: {t.tolist()}")
        snap = mt.tracked_groups()["torch/world"].snapshot()
        if snap["entered"] != 7 or snap["completed"] != 7:
            fail(f"progress of 'torch/world' after 7 all_reduces: {snap}")
        rt.health()
        dist.destroy_process_group()
        log(f"OK rank {rank}")
    else:
        fail(f"unknown HANG_TEST_MODE {mode!r}")


if __name__ == "__main__":
    main()
