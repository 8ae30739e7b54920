"""DistributedDataParallel on Mesh, with no MASTER_ADDR and no TCPStore.

    meshctl submit --nodes 2 --nproc-per-node 2 --max-restarts 1 \\
      --env PYTHONPATH=$PWD/build-b16/python -- /usr/bin/python3 examples/python/ddp.py

Importing meshrt.torch registers the mesh:// rendezvous: the process joins
its Mesh job (rank and world size come from the job) and torch.distributed
keeps its keys in the coordinator's store. The progress hook reports the
collectives the Python API sees, so the coordinator can name the rank a hung
collective waits for (docs/python.md). CPU and Gloo here; on GPUs use
backend "nccl" and move the model to cuda:<local rank>.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import meshrt.torch  # noqa: F401  (registers mesh://)


def main() -> None:
    dist.init_process_group("gloo", init_method="mesh://")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    data = torch.Generator().manual_seed(rank)  # each rank its own shard
    for step in range(20):
        x = torch.randn(32, 16, generator=data)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP averages the gradients across ranks here
        opt.step()
        if step % 5 == 0 or step == 19:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            if rank == 0:
                print(f"step {step:2d}  loss {mean.item() / world:.4f}", flush=True)

    print(f"rank {rank}/{world} (generation {os.environ.get('MESH_GENERATION')}) done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
