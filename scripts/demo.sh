#!/usr/bin/env bash
# `make demo`: the end-to-end slice that exists today, run on this machine.
#
#   1. start mesh-coordinator on 127.0.0.1 with a port it picks itself;
#   2. ask it who it is and whether it is healthy, with meshctl;
#   3. measure its unary-call latency against gRPC's floor (mesh-bench ping);
#   4. stop it with SIGTERM and check that it exits cleanly.
#
# This grows with the project: once agents and jobs exist, it starts a local
# cluster and runs the DTensor example as a 2-node x 2-process job.
set -euo pipefail

build_dir=${1:-build}
bin_coordinator="$build_dir/coordinator/mesh-coordinator"
bin_meshctl="$build_dir/cli/meshctl"
bin_bench="$build_dir/bench/mesh-bench"
for bin in "$bin_coordinator" "$bin_meshctl" "$bin_bench"; do
  [[ -x "$bin" ]] || { echo "demo: $bin is missing; run 'make build' first" >&2; exit 1; }
done

work=$(mktemp -d)
coordinator_pid=""
cleanup() {
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
