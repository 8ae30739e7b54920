#!/usr/bin/env bash
# `make bench`: runs every mesh-bench suite and writes bench/results/latest.json.
# Knobs: MESH_BENCH_RENDEZVOUS_RANKS (default "1024 4096 16384"),
#        MESH_BENCH_WAITERS_RANKS (default 10000).
# Each suite prints Mesh's figure, its baseline's and the ratio; absolute times
# on a shared machine drift, ratios measured in the same run do not.
set -euo pipefail
build_dir=${1:-build}
bench="$build_dir/bench/mesh-bench"
[[ -x "$bench" ]] || { echo "bench: $bench is missing; run 'make build' first" >&2; exit 1; }
out_dir="$(dirname "$0")/../bench/results"
mkdir -p "$out_dir"

echo "# Machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
"$bench" --json "$out_dir/ping.json" ping

# Rendezvous of N simulated ranks (docs/performance.md). 65536 ranks take
# minutes here; add it with MESH_BENCH_RENDEZVOUS_RANKS="1024 4096 16384 65536".
# Sizes from an earlier run must not be merged into this one's latest.json.
rm -f "$out_dir"/rendezvous_*.json
for ranks in ${MESH_BENCH_RENDEZVOUS_RANKS:-1024 4096 16384}; do
  rounds=(--repeat 3 --warmup 1)
  if (( ranks > 16384 )); then rounds=(--repeat 1 --warmup 0); fi
  "$bench" --json "$out_dir/rendezvous_$ranks.json" rendezvous --ranks "$ranks" "${rounds[@]}"
done
"$bench" --json "$out_dir/waiters.json" waiters --ranks "${MESH_BENCH_WAITERS_RANKS:-10000}"

# CPU collectives, 2 local processes, TCP and shared memory (docs/collectives.md).
"$bench" --json "$out_dir/collectives_tcp.json" collectives --nproc 2 -b 64K -e 64M -f 4 -c
"$bench" --json "$out_dir/collectives_shm.json" collectives --nproc 2 -b 64K -e 64M -f 4 -c --shm
# DTensor Redistribute vs the raw collectives of its plan, 16 and 64 MiB,
# worlds of 2 and 4 processes plus a (2, 2) mesh (docs/sharding.md).
"$bench" --json "$out_dir/redistribute.json" redistribute --nproc 2,4 --sizes 16M,64M
# Launch: SubmitJob reply -> 8 ranks joined, real coordinator + agent as
# processes, vs torchrun (skipped without python3-torch) (docs/performance.md).
"$bench" --json "$out_dir/launch.json" launch --nproc 8 --rounds 5
# GPU section: prints "skipped" and exits 0 without a CUDA device.
"$bench" --json "$out_dir/nccl_overhead.json" nccl-overhead

# Merge the per-suite files into one document.
python3 - "$out_dir" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
suites = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "latest"}
(out / "latest.json").write_text(json.dumps(suites, indent=2) + "\n")
print(f"\nwrote {out / 'latest.json'} ({', '.join(suites)})")
PY
