"""In-place recovery from Python: the twin of examples/elastic_train.cc.

A data-parallel loop over meshrt.ElasticMesh. Every step all-reduces a
gradient over "dp" and applies it to a small torch model; the model's
parameters and the step are the state a replacement takes from a peer.
Submit it with in-place recovery (4 ranks, mesh (4, 1) named dp, tp):

    meshctl cluster up --agents 1 --slots 4                      # terminal 1
    meshctl submit --nproc-per-node 4 --mesh-shape 4,1 --dim-names dp,tp \\
        --restart-policy in_place --max-restarts 3 \\
        --env PYTHONPATH=$PWD/build/python -- /usr/bin/python3 \\
        $PWD/examples/python/elastic_train.py --steps 300

Kill one worker (kill -9 of a rank's pid): the others print steps with
replicas=3 at once, the agent starts a new process for the rank, which
prints "replacement, took step N", and the steps go back to replicas=4.
Every rank checks that each committed step summed one per replica.
"""

import argparse
import time

import torch

import meshrt


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-ms", type=float, default=20, help="sleep per step, milliseconds")
    args = p.parse_args()

    # hostname: the address Gloo binds and advertises; 127.0.0.1 for a
    # cluster on one machine, leave it out on real hosts.
    with meshrt.init(hostname="127.0.0.1") as rt:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        step = torch.zeros(1, dtype=torch.int64)
        # The state: the parameters (taken detached, sharing their memory)
        # and the step. A rebuild overwrites them on a process that lacks it.
        em = meshrt.ElasticMesh(rt, state=lambda: [*model.parameters(), step])
        if rt.membership_epoch > 0:
            print(f"rank {rt.rank}: replacement, took step {int(step)}", flush=True)
        while int(step) < args.steps:
            em.sync()
            if not em.is_member:
                continue  # Its replica lost a rank; sync() waits for it.
            grad = torch.ones(8)  # Stands in for this replica's gradient.
            try:
                em.mesh.get_group("dp").all_reduce(grad)
            except meshrt.Error:
                continue  # Not committed: the next sync() rebuilds the groups.
            if grad[0].item() != em.replicas:
                raise SystemExit(f"rank {rt.rank}: sum {grad[0].item()} with {em.replicas} "
                                 "replicas")
            with torch.no_grad():
                model.weight -= 0.001 * grad / em.replicas
            step += 1
            print(f"rank {rt.rank}: step {int(step)} replicas {em.replicas} "
                  f"epoch {em.membership_epoch}", flush=True)
            time.sleep(args.step_ms / 1000)


if __name__ == "__main__":
    main()
