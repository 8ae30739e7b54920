#!/usr/bin/env bash
# `make demo`: the end-to-end slice that exists today, run on this machine.
#
#   1. start mesh-coordinator on 127.0.0.1 with a port it picks itself;
#   2. ask it who it is and whether it is healthy, with meshctl;
#   3. create a 4-rank job with a 2x2 mesh ("dp", "tp") and start 4 worker
#      processes of examples/allreduce_2d with the MESH_* environment an
#      agent would give them: they join, build the 2-D DeviceMesh over Gloo
#      and all-reduce along each dim and the world, checking every sum;
#   4. measure its unary-call latency against gRPC's floor (mesh-bench ping);
#   5. stop it with SIGTERM and check that it exits cleanly.
#
# This grows with the project: once agents and the job service exist, the
# agents launch the workers from `meshctl submit`.
set -euo pipefail

build_dir=${1:-build}
bin_coordinator="$build_dir/coordinator/mesh-coordinator"
bin_meshctl="$build_dir/cli/meshctl"
bin_bench="$build_dir/bench/mesh-bench"
bin_worker="$build_dir/examples/allreduce_2d"
for bin in "$bin_coordinator" "$bin_meshctl" "$bin_bench" "$bin_worker"; do
  [[ -x "$bin" ]] || { echo "demo: $bin is missing; run 'make build' first" >&2; exit 1; }
done

work=$(mktemp -d)
coordinator_pid=""
worker_pids=()
cleanup() {
  for pid in "${worker_pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  # Never leave a coordinator behind, whatever happened above.
  if [[ -n "$coordinator_pid" ]] && kill -0 "$coordinator_pid" 2>/dev/null; then
    kill -KILL "$coordinator_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Starting mesh-coordinator on 127.0.0.1 (port 0: it picks a free one)"
"$bin_coordinator" --listen 127.0.0.1 --port 0 --port-file "$work/port" \
  --shutdown-grace 1 >"$work/stdout" 2>"$work/coordinator.log" &
coordinator_pid=$!
for _ in $(seq 1 100); do
  [[ -s "$work/port" ]] && break
  kill -0 "$coordinator_pid" 2>/dev/null || { cat "$work/coordinator.log" >&2; exit 1; }
  sleep 0.1
done
[[ -s "$work/port" ]] || { echo "demo: coordinator did not start within 10 s" >&2; exit 1; }
export MESH_COORDINATOR="127.0.0.1:$(cat "$work/port")"
cat "$work/stdout"

step "meshctl version"
"$bin_meshctl" version

step "meshctl health"
"$bin_meshctl" health
"$bin_meshctl" health --service mesh.v1.AdminService -o json

step "A 4-rank job on a 2x2 mesh: meshctl create-job, then 4 allreduce_2d workers"
"$bin_meshctl" create-job --job-id demo --world-size 4 --mesh-shape 2,2 --dim-names dp,tp
for rank in 0 1 2 3; do
  MESH_JOB_ID=demo MESH_GENERATION=0 MESH_RANK=$rank MESH_WORLD_SIZE=4 \
    MESH_LOCAL_RANK=$rank MESH_LOCAL_WORLD_SIZE=4 MESH_NODE_RANK=0 \
    timeout 60 "$bin_worker" --gloo-host 127.0.0.1 >"$work/worker$rank.log" 2>&1 &
  worker_pids+=($!)
done
failed=0
for rank in 0 1 2 3; do
  rc=0
  wait "${worker_pids[$rank]}" || rc=$?
  sed "s/^/  worker $rank: /" "$work/worker$rank.log"
  [[ $rc -eq 0 ]] || { echo "demo: worker $rank exited with status $rc" >&2; failed=1; }
done
worker_pids=()
[[ $failed -eq 0 ]] || exit 1

step "mesh-bench ping: coordinator call latency vs the gRPC floor"
"$bin_bench" ping --coordinator "$MESH_COORDINATOR" -n 2000 -w 200

step "Stopping the coordinator with SIGTERM"
kill -TERM "$coordinator_pid"
status=0
wait "$coordinator_pid" || status=$?
coordinator_pid=""
sed 's/^/  coordinator log: /' "$work/coordinator.log"
if [[ $status -ne 0 ]]; then
  echo "demo: coordinator exited with status $status" >&2
  exit 1
fi
echo
echo "demo: OK"
