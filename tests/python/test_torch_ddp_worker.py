"""The worker of test_torch_ddp.py (not a test module: run by Mesh agents).

One DDP training step initialised through mesh://, Gloo, CPU; checks that
the parameters and gradients agree across ranks and equal a local
reference computed from every rank's data; checks that there is no
TCPStore (MASTER_ADDR/PORT are removed before init, the default store is a
PrefixStore over meshrt.torch.Store, and nothing listens on MASTER_PORT).
With DDP_TEST_KILL_RANK0=1, rank 0 of generation 0 SIGKILLs itself after
the step, so the job restarts. Prints "OK rank R generation G" at the end.
"""

import os
import signal
import socket
import sys


def fail(message: str) -> None:
    print(f"FAIL: {message}", flush=True)
    sys.exit(3)


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import meshrt.torch as mt

    master = (os.environ.pop("MASTER_ADDR", None), os.environ.pop("MASTER_PORT", None))
    generation = int(os.environ["MESH_GENERATION"])

    dist.init_process_group("gloo", init_method="mesh://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank != int(os.environ["MESH_RANK"]) or world != int(os.environ["MESH_WORLD_SIZE"]):
        fail(f"rank {rank}/{world} disagrees with MESH_RANK/MESH_WORLD_SIZE")
    default = c10d._get_default_store()
    if type(default) is not dist.PrefixStore or not isinstance(mt.find_store(default), mt.Store):
        fail(f"default store is {default!r} over {getattr(default, 'underlying_store', None)!r}")
    if master[1]:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((master[0] or "127.0.0.1", int(master[1]))) == 0:
                fail(f"something listens on MASTER_PORT {master[1]}")

    torch.manual_seed(1000 + rank)  # different initial weights: DDP must broadcast rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    initial = [p.detach().clone() for p in model.parameters()]

    def batch(r):
        g = torch.Generator().manual_seed(r)
        return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)

    x, y = batch(rank)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    # Every rank holds the same gradients and parameters...
    all_grads = [torch.empty_like(grads) for _ in range(world)]
    all_params = [torch.empty_like(params) for _ in range(world)]
    dist.all_gather(all_grads, grads)
    dist.all_gather(all_params, params)
    for r in range(world):
        if not torch.equal(all_grads[r], grads) or not torch.equal(all_params[r], params):
            fail(f"rank {r}'s gradients or parameters differ from rank {rank}'s")
    # ... and they are the average over every rank's batch.
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        for p, q in zip(reference.parameters(), initial):
            p.copy_(q)
    loss = sum(torch.nn.functional.mse_loss(reference(bx), by) for bx, by in map(batch, range(world)))
    (loss / world).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    if not torch.allclose(grads, expected, atol=1e-6):
        fail(f"gradients are not the average over ranks: {grads[:4]} vs {expected[:4]}")

    snap = mt.tracked_groups()["torch/world"].snapshot()
    # DDP's parameter broadcast + the two all_gathers, all complete.
    if snap["entered"] != 3 or snap["completed"] != 3 or snap["completed_kind"] != "all_gather":
        fail(f"progress of the world group: {snap}")

    if os.environ.get("DDP_TEST_KILL_RANK0") == "1" and generation == 0 and rank == 0:
        print(f"rank 0 of generation {generation}: SIGKILL myself", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    dist.barrier()
    dist.destroy_process_group()
    print(f"OK rank {rank} generation {generation}", flush=True)


if __name__ == "__main__":
    main()
