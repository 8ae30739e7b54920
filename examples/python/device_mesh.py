"""A Python worker on a 2-D device mesh: the Python twin of allreduce_2d.cc.

Run it as a job (4 ranks, mesh (2, 2) named dp, tp):

    meshctl cluster up --agents 2 --slots 2                      # terminal 1
    meshctl submit --nodes 2 --nproc-per-node 2 --mesh-shape 2,2 --dim-names dp,tp \\
        --env PYTHONPATH=$PWD/build/python -- /usr/bin/python3 $PWD/examples/python/device_mesh.py

Each rank all-reduces along each dim of the mesh and checks the sums against
the ranks it expects in its groups; any mismatch or failure exits non-zero,
and a peer's failure ends the collectives here with meshrt.JobFailedError.
"""

import sys

import torch

import meshrt


def main():
    # hostname: the address Gloo binds and advertises; 127.0.0.1 for a
    # cluster on one machine, leave it out on real hosts.
    with meshrt.init(hostname="127.0.0.1") as rt:
        mesh = rt.init_device_mesh()  # The job's own mesh; or init_device_mesh((2, 2), ("dp", "tp"))
        for dim in mesh.dim_names:
            group = mesh.get_group(dim)
            t = torch.full((1024,), float(rt.rank))
            group.all_reduce(t)  # In place, zero-copy through DLPack.
            want = float(sum(group.ranks))
            if not torch.all(t == want):
                raise SystemExit(f"rank {rt.rank}: {dim} sum {t[0].item()} != {want}")
            print(f"rank {rt.rank}: {dim} group {group.ranks} sum {want:g} ok", flush=True)
        # Async: overlap the two dims' reductions, then wait for both.
        a, b = torch.ones(8), torch.ones(8)
        works = [mesh.get_group("dp").all_reduce(a, async_op=True),
                 mesh.get_group("tp").all_reduce(b, async_op=True)]
        for work in works:
            work.wait()
        assert a[0] == mesh.size("dp") and b[0] == mesh.size("tp")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except meshrt.JobFailedError as e:
        print(f"the job failed: {e}", file=sys.stderr)
        sys.exit(1)
