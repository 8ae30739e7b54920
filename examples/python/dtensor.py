"""A sharded tensor on a (2, 2) mesh from Python: the twin of
dtensor_redistribute.cc.

    meshctl submit --nodes 2 --nproc-per-node 2 --mesh-shape 2,2 --dim-names dp,tp \\
        --env PYTHONPATH=$PWD/build/python -- /usr/bin/python3 $PWD/examples/python/dtensor.py

Every rank builds the same global tensor, takes its shard of
(Shard(0), Replicate()), redistributes it to (Replicate(), Shard(1)) and
checks its new shard and the gathered full tensor against torch's own
slicing.
"""

import sys

import torch

import meshrt
from meshrt import Replicate, Shard


def main():
    with meshrt.init(hostname="127.0.0.1") as rt:
        mesh = rt.init_device_mesh((2, 2), ("dp", "tp"))
        # 7 rows over 2 ranks: torch.chunk's uneven rule, 4 + 3.
        full = torch.arange(7 * 6, dtype=torch.float32).reshape(7, 6)
        x = meshrt.distribute_tensor(full, mesh, [Shard(0), Replicate()])
        print(f"rank {rt.rank}: {x}", flush=True)

        y = x.redistribute([Replicate(), Shard(1)])
        shape, offset = meshrt.compute_local_shape_and_offset(full.shape, mesh, y.placements)
        want = full[:, offset[1]:offset[1] + shape[1]]
        if not torch.equal(y.to_local(), want):
            raise SystemExit(f"rank {rt.rank}: shard {y.to_local()} != {want}")
        if not torch.equal(y.full_tensor(), full):
            raise SystemExit(f"rank {rt.rank}: full_tensor differs")
        print(f"rank {rt.rank}: (R, S(1)) shard {tuple(shape)} at {tuple(offset)} ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
