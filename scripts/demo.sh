#!/usr/bin/env bash
# `make demo`: the user's main path, on this machine.
#
#   1. `meshctl cluster up --agents 2 --slots 2`: a coordinator and two
#      agents (local-0, local-1), in the background of this script;
#   2. `meshctl nodes`: both agents registered;
#   3. `meshctl submit` of examples/allreduce_2d as a 2-node x 2-process job
#      on a (2, 2) mesh named (dp, tp): the agents launch the workers, which
#      join, build the 2-D DeviceMesh over Gloo and all-reduce along each dim
#      and the world, checking every sum. `meshctl logs -f` streams their
#      output with rank prefixes; `meshctl wait` exits with the job's result;
#   4. `meshctl describe`: the job's placement, events and final state;
#   5. `mesh-bench ping`: coordinator call latency against gRPC's floor;
#   6. Ctrl-C (SIGINT) to the cluster: every process stops cleanly.
set -euo pipefail

build_dir=${1:-build}
bin_meshctl="$build_dir/cli/meshctl"
bin_bench="$build_dir/bench/mesh-bench"
bin_worker="$build_dir/examples/allreduce_2d"
for bin in "$bin_meshctl" "$bin_bench" "$bin_worker" "$build_dir/coordinator/mesh-coordinator" \
  "$build_dir/agent/mesh-agent"; do
  [[ -x "$bin" ]] || { echo "demo: $bin is missing; run 'make build' first" >&2; exit 1; }
done
bin_worker=$(realpath "$bin_worker")

work=$(mktemp -d)
cluster_pid=""
cleanup() {
  # Never leave a cluster behind, whatever happened above.
  if [[ -n "$cluster_pid" ]] && kill -0 "$cluster_pid" 2>/dev/null; then
    kill -INT "$cluster_pid" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$cluster_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$cluster_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "meshctl cluster up --agents 2 --slots 2 (a coordinator and two agents)"
"$bin_meshctl" cluster up --agents 2 --slots 2 --port 0 --state-dir "$work/cluster" \
  --ready-file "$work/ready" --grace 5 >"$work/cluster.out" 2>&1 &
cluster_pid=$!
for _ in $(seq 1 300); do
  [[ -s "$work/ready" ]] && break
  kill -0 "$cluster_pid" 2>/dev/null || { cat "$work/cluster.out" >&2; exit 1; }
  sleep 0.1
done
[[ -s "$work/ready" ]] || { cat "$work/cluster.out" >&2; echo "demo: no cluster in 30 s" >&2; exit 1; }
cat "$work/cluster.out"
export MESH_COORDINATOR=$(cat "$work/ready")

step "meshctl nodes"
"$bin_meshctl" nodes

step "meshctl submit: allreduce_2d on 2 nodes x 2 processes, mesh (2, 2) = (dp, tp)"
job_id=$("$bin_meshctl" submit --parsable --name allreduce-2d --nodes 2 --nproc-per-node 2 \
  --mesh-shape 2,2 --dim-names dp,tp -- "$bin_worker" --gloo-host 127.0.0.1)
echo "submitted $job_id"

step "meshctl logs -f $job_id (ends when the job does)"
"$bin_meshctl" logs -f "$job_id"

step "meshctl wait $job_id (exit code 0 only when it SUCCEEDED)"
"$bin_meshctl" wait "$job_id" --timeout 120

step "meshctl describe $job_id"
"$bin_meshctl" describe "$job_id"

step "mesh-bench ping: coordinator call latency vs the gRPC floor"
"$bin_bench" ping --coordinator "$MESH_COORDINATOR" -n 2000 -w 200

step "Stopping the cluster with SIGINT (Ctrl-C)"
kill -INT "$cluster_pid"
status=0
wait "$cluster_pid" || status=$?
cluster_pid=""
sed -n '/Stopping\|stopped\|exited/p' "$work/cluster.out" | sed 's/^/  /'
if [[ $status -ne 0 ]]; then
  cat "$work/cluster.out" >&2
  echo "demo: meshctl cluster up exited with status $status" >&2
  exit 1
fi
echo
echo "demo: OK"
