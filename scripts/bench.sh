#!/usr/bin/env bash
# `make bench`: every mesh-bench suite against its peer, then one report.
#
#   scripts/bench.sh [--smoke] [BUILD_DIR]
#
# Writes each run's JSON under $OUT/raw/, merges them with bench/report.py
# into $OUT/latest.json and prints ONE Markdown table (suite, row, Mesh,
# peer, ratio, note) on stdout; the suites' own tables go to $OUT/bench.log.
# See docs/performance.md for what each row measures.
#
# Peers (bench/peers/): torch.distributed TCPStore and Gloo (python3-torch),
# OpenMPI (openmpi-bin, libopenmpi-dev; mpi_collectives.c is built here with
# mpicc). Missing ones are installed with `scripts/install-deps.sh --bench`;
# when that is not possible their rows say "skipped" and why.
#
# --smoke: tiny sizes, one pass, nothing installed; checks the pipeline only
# (tests/bench/bench_report_smoke_test runs it). Never timed in `make test`.
#
# Knobs (environment):
#   MESH_BENCH_OUT             results folder (default bench/results)
#   MESH_BENCH_PASSES          alternating Mesh/peer passes per suite (default 3)
#   MESH_BENCH_RENDEZVOUS_RANKS  default "1024 4096 16384": Mesh (direct,
#                              through agents, through agents over TLS) and
#                              TCPStore, every rank its own connection
#   MESH_BENCH_RENDEZVOUS_LARGE_RANKS  default "65536 131072": Mesh through
#                              agents only, one pass each (minutes on 2 cores)
#   MESH_BENCH_PEER_MAX_RANKS  largest N the TCPStore peer runs (default 16384)
#   MESH_BENCH_PEER_TIMEOUT    seconds before a peer run counts as timed out (300)
#   MESH_BENCH_WAITERS_RANKS   default 10000
#   MESH_BENCH_REDISTRIBUTE_SIZES  default "16M,64M"
#   MESH_BENCH_PYTHON          the interpreter with torch (default /usr/bin/python3;
#                              a pyenv `python3` on PATH usually lacks torch); it
#                              also runs bench/python_bench.py, with the build's meshrt
#   MESH_BENCH_MPICC           the MPI C compiler (default mpicc)
#   MESH_BENCH_NO_INSTALL=1    never install peers
set -euo pipefail

smoke=false
if [[ "${1:-}" == "--smoke" ]]; then smoke=true; shift; fi
build_dir=${1:-build}
repo=$(cd "$(dirname "$0")/.." && pwd)
bench="$build_dir/bench/mesh-bench"
[[ -x "$bench" ]] || { echo "bench: $bench is missing; run 'make build' first" >&2; exit 1; }
bench=$(cd "$(dirname "$bench")" && pwd)/mesh-bench
out=${MESH_BENCH_OUT:-$repo/bench/results}
raw="$out/raw"
mkdir -p "$out"
# Figures from an earlier run must never be merged into this one's report.
rm -rf "$raw"
mkdir -p "$raw"
log="$out/bench.log"
: >"$log"
python=${MESH_BENCH_PYTHON:-/usr/bin/python3}
peers="$repo/bench/peers"
peer_timeout=${MESH_BENCH_PEER_TIMEOUT:-300}

if $smoke; then
  passes=1
  rendezvous_ranks="64"
  rendezvous_large_ranks=""
  peer_max_ranks=64
  smoke_flag=(--smoke)
else
  passes=${MESH_BENCH_PASSES:-3}
  rendezvous_ranks=${MESH_BENCH_RENDEZVOUS_RANKS:-1024 4096 16384}
  rendezvous_large_ranks=${MESH_BENCH_RENDEZVOUS_LARGE_RANKS:-65536 131072}
  peer_max_ranks=${MESH_BENCH_PEER_MAX_RANKS:-16384}
  smoke_flag=()
fi

say() { echo "bench: $*" >&2; }
# Runs a suite, its own table to the log. A failure is recorded, not fatal:
# the report shows the row as failed rather than losing the others.
run_mesh() {  # run_mesh NAME ARGS...
  local name=$1
  shift
  say "mesh-bench $*"
  echo "## mesh-bench $*" >>"$log"
  if ! "$bench" "$@" --json "$raw/$name.json" "${smoke_flag[@]}" >>"$log" 2>>"$log.stderr"; then
    say "mesh-bench $1 failed (see $log.stderr)"
    printf '{"error": "mesh-bench %s failed, exit status nonzero; see bench.log.stderr"}\n' "$1" \
      >"$raw/$name.json"
  fi
}
# Writes a note file the report turns into "skipped" rows.
note() {  # note PEER TEXT
  printf '{"peer": "%s", "note": %s}\n' "$1" "$("$python_any" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$2")" \
    >"$raw/peer_$1.json"
}
python_any=$(command -v python3 || echo "$python")

# ---- Peers: install when missing, then see which are usable -------------------
if ! $smoke && [[ "${MESH_BENCH_NO_INSTALL:-0}" != 1 ]]; then
  if ! "$repo/scripts/install-deps.sh" --bench >>"$log" 2>&1; then
    say "installing the peers failed (see $log); their rows will be skipped"
  fi
fi
have_torch=false
if "$python" -c 'import torch, torch.distributed' 2>/dev/null; then
  have_torch=true
  note torch "torch $("$python" -c 'import torch; print(torch.__version__)')"
else
  note torch "skipped: $python cannot import torch (python3-torch not installed or not installable here)"
fi
have_mpi=false
mpi_bin="$out/mpi_collectives"
mpicc=${MESH_BENCH_MPICC:-mpicc}
if command -v "$mpicc" >/dev/null && command -v mpirun >/dev/null; then
  if "$mpicc" -O2 -o "$mpi_bin" "$peers/mpi_collectives.c" 2>>"$log"; then
    have_mpi=true
    note openmpi "$(mpirun --version 2>/dev/null | head -1)"
  else
    note openmpi "skipped: mpicc could not build bench/peers/mpi_collectives.c (see bench.log)"
  fi
else
  note openmpi "skipped: no mpicc/mpirun (openmpi-bin, libopenmpi-dev not installed or not installable here)"
fi
mpirun_args=(-np 2 --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && mpirun_args+=(--allow-run-as-root)

# Machine and versions, for the report's header.
"$python_any" - "$raw/machine.json" "$python" <<'PY'
import json, os, platform, subprocess, sys
def cmd(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception:
        return ""
model = ""
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        model = line.split(":", 1)[1].strip()
        break
info = {"cores": os.cpu_count(), "cpu": model, "kernel": platform.release(),
        "load_average_start": os.getloadavg(),
        "python": cmd(sys.argv[2], "--version"),
        "torch": cmd(sys.argv[2], "-c", "import torch; print(torch.__version__)"),
        "openmpi": (cmd("mpirun", "--version").splitlines() or [""])[0],
        "gpu": (cmd("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader").splitlines() or [""])[0]}
json.dump(info, open(sys.argv[1], "w"), indent=1)
PY

# ---- Coordinator RPC latency (its own floor: grpc.health Check) -----------------
run_mesh ping ping

# ---- Rendezvous: Mesh vs TCPStore, alternating passes --------------------------
# Every rank its own connection, as in a real job, on both sides. Mesh runs
# three ways: ranks calling the coordinator directly, through agents of 8
# (the coordinator's side of the rank relay), and through agents over TLS.
# A run that needs more descriptors than this process may open (a client
# and a server end per connection) measures a `mesh-bench serve` process.
pki="$out/pki"
have_pki=false
if "$repo/scripts/bench-pki.sh" "$pki" 2>>"$log.stderr"; then
  have_pki=true
else
  say "scripts/bench-pki.sh failed (no openssl?); the TLS rows are left out"
fi
fd_limit=$(ulimit -Hn)
[[ "$fd_limit" == unlimited ]] && fd_limit=1048576
declare -A serve_pids=() serve_addresses=()
stop_serves() {
  local pid
  for pid in "${serve_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  serve_pids=()
  serve_addresses=()
}
trap stop_serves EXIT
# start_serve KIND ARGS...: one `mesh-bench serve ARGS...` per KIND, started
# on first use; its address lands in serve_addresses[KIND].
start_serve() {
  local kind=$1
  shift
  [[ -n "${serve_pids[$kind]:-}" ]] && return 0
  local listening="$out/serve_$kind.out" address=
  : >"$listening"
  "$bench" serve "$@" >"$listening" 2>>"$log.stderr" &
  serve_pids[$kind]=$!
  for _ in $(seq 100); do
    address=$(sed -n 's/^mesh-bench serve listening on //p' "$listening")
    if [[ -n "$address" ]]; then
      serve_addresses[$kind]=$address
      return 0
    fi
    kill -0 "${serve_pids[$kind]}" 2>/dev/null || break
    sleep 0.1
  done
  say "mesh-bench serve $* did not start (see $log.stderr)"
  return 1
}
# rendezvous_run NAME CONNECTIONS plain|tls ARGS...: in process when a client
# and a server end per connection fit this process's descriptors, else
# against a `mesh-bench serve` process (with the PKI above for tls).
rendezvous_run() {
  local name=$1 connections=$2 kind=$3
  shift 3
  local tls=()
  if [[ "$kind" == tls ]]; then
    $have_pki || return 0
    tls=(--tls-ca "$pki/ca.crt")
  fi
  if ((2 * connections + 512 <= fd_limit)); then
    [[ "$kind" == tls ]] && tls+=(--tls-cert "$pki/server.crt" --tls-key "$pki/server.key")
    run_mesh "$name" rendezvous "$@" "${tls[@]}"
  elif [[ "$kind" == tls ]]; then
    start_serve tls --tls-cert "$pki/server.crt" --tls-key "$pki/server.key" &&
      run_mesh "$name" rendezvous --coordinator "${serve_addresses[tls]}" "$@" "${tls[@]}"
  else
    start_serve plain && run_mesh "$name" rendezvous --coordinator "${serve_addresses[plain]}" "$@"
  fi
}
for ranks in $rendezvous_ranks; do
  agents=$(((ranks + 7) / 8))
  for ((pass = 1; pass <= passes; pass++)); do
    rounds=(--repeat 1 --warmup 1)
    $smoke && rounds=()
    rendezvous_run "rendezvous_${ranks}_$pass" "$ranks" plain --ranks "$ranks" \
      --connection-per-rank "${rounds[@]}"
    rendezvous_run "rendezvous_agents_${ranks}_$pass" "$agents" plain --ranks "$ranks" \
      --via-agent --ranks-per-node 8 "${rounds[@]}"
    rendezvous_run "rendezvous_agents_tls_${ranks}_$pass" "$agents" tls --ranks "$ranks" \
      --via-agent --ranks-per-node 8 "${rounds[@]}"
    if $have_torch && ((ranks <= peer_max_ranks)); then
      # torch 1.13's client holds two connections, so with its server in the
      # same process a rank costs about five descriptors: past this
      # process's limit the server runs as its own process, as Mesh's does.
      peer_args=()
      ((5 * ranks + 512 > fd_limit)) && peer_args=(--server-process)
      say "tcpstore_rendezvous.py --ranks $ranks --connection-per-rank ${peer_args[*]} (pass $pass)"
      # A failure or a timeout is the peer's result at this N, not a lost row.
      rc=0
      timeout -k 10 "$peer_timeout" "$python" "$peers/tcpstore_rendezvous.py" --ranks "$ranks" \
        --connection-per-rank "${peer_args[@]}" --repeat 1 --warmup 1 --timeout "$peer_timeout" \
        >"$raw/tcpstore_${ranks}_$pass.json" 2>>"$log.stderr" || rc=$?
      if ((rc == 124 || rc == 137)); then
        printf '{"ranks": %d, "error": "timed out after %d s"}\n' "$ranks" "$peer_timeout" \
          >"$raw/tcpstore_${ranks}_$pass.json"
      elif [[ ! -s "$raw/tcpstore_${ranks}_$pass.json" ]]; then
        printf '{"ranks": %d, "error": "exited with status %d and no result"}\n' "$ranks" "$rc" \
          >"$raw/tcpstore_${ranks}_$pass.json"
      fi
    fi
  done
done
# Mesh alone at the sizes no peer reaches: through agents of 8, once each.
for ranks in $rendezvous_large_ranks; do
  agents=$(((ranks + 7) / 8))
  rendezvous_run "rendezvous_agents_${ranks}_1" "$agents" plain --ranks "$ranks" --via-agent \
    --ranks-per-node 8 --repeat 1 --warmup 0
  rendezvous_run "rendezvous_agents_tls_${ranks}_1" "$agents" tls --ranks "$ranks" --via-agent \
    --ranks-per-node 8 --repeat 1 --warmup 0
done
stop_serves
if $smoke; then
  run_mesh waiters waiters
else
  run_mesh waiters waiters --ranks "${MESH_BENCH_WAITERS_RANKS:-10000}"
fi

# ---- Ceilings: memcpy and loopback TCP bandwidth (bench/peers/ceilings.py) ----------
if $smoke; then ceiling_args=(--mib 1 --repeat 1); else ceiling_args=(--mib 64 --repeat 5); fi
"$python_any" "$peers/ceilings.py" "${ceiling_args[@]}" >"$raw/ceilings.json" 2>>"$log.stderr" ||
  echo '{"error": "ceilings.py failed"}' >"$raw/ceilings.json"

# ---- CPU collectives, 2 ranks: Mesh (TCP, shm) vs torch Gloo and OpenMPI ----------
ops=all_reduce,all_gather,reduce_scatter,all_to_all
if $smoke; then
  sizes=(-b 1K -e 4K -f 4 -n 2 -w 1)  # What `collectives --smoke` runs.
else
  sizes=(-b 64K -e 64M -f 4 -n 20 -w 5)
fi
for ((pass = 1; pass <= passes; pass++)); do
  if $smoke; then
    run_mesh "collectives_tcp_$pass" collectives --nproc 2 --ops "$ops" -c
    run_mesh "collectives_shm_$pass" collectives --nproc 2 --ops "$ops" -c --shm
  else
    run_mesh "collectives_tcp_$pass" collectives --nproc 2 --ops "$ops" "${sizes[@]}" -c
    run_mesh "collectives_shm_$pass" collectives --nproc 2 --ops "$ops" "${sizes[@]}" -c --shm
  fi
  if $have_torch; then
    say "torch_gloo_collectives.py (pass $pass)"
    timeout -k 10 "$peer_timeout" "$python" "$peers/torch_gloo_collectives.py" --nproc 2 \
      --ops "$ops" "${sizes[@]}" --timeout "$peer_timeout" >"$raw/gloo_$pass.jsonl" \
      2>>"$log.stderr" || echo "{\"error\": \"torch_gloo_collectives.py exited with status $?\"}" \
      >>"$raw/gloo_$pass.jsonl"
  fi
  if $have_mpi; then
    say "mpirun mpi_collectives (pass $pass)"
    timeout -k 10 "$peer_timeout" mpirun "${mpirun_args[@]}" "$mpi_bin" -o "$ops" "${sizes[@]}" \
      >"$raw/mpi_$pass.jsonl" 2>>"$log.stderr" ||
      echo "{\"error\": \"mpi_collectives exited with status $?\"}" >>"$raw/mpi_$pass.jsonl"
  fi
done

# ---- Redistribute vs its raw collectives; launch vs torchrun -------------------------
if $smoke; then
  run_mesh redistribute redistribute --nproc 2
  run_mesh launch launch --no-torchrun
else
  run_mesh redistribute redistribute --nproc 2,4 --sizes "${MESH_BENCH_REDISTRIBUTE_SIZES:-16M,64M}"
  # torchrun from the interpreter that has torch (Debian's /usr/bin).
  PATH="$(dirname "$python"):$PATH" run_mesh launch launch --nproc 8 --rounds 5
fi

# ---- In-place recovery vs torchrun's group restart (bench/recovery_bench.py) -----------
say "recovery_bench.py"
echo "## bench/recovery_bench.py" >>"$log"
if $smoke; then
  recovery_args=(--nproc 2 --rounds 1 --no-torchrun)
else
  recovery_args=(--nproc 8 --rounds 3)
fi
rc=0
PATH="$(dirname "$python"):$PATH" MESH_BENCH_PYTHON="$python" \
  timeout -k 10 "$peer_timeout" "$python_any" "$repo/bench/recovery_bench.py" --build "$build_dir" \
  "${recovery_args[@]}" --json "$raw/recovery.json" >>"$log" 2>>"$log.stderr" || rc=$?
if ((rc != 0)); then
  say "recovery_bench.py failed (see $log.stderr)"
  printf '{"error": "bench/recovery_bench.py exited with status %d; see bench.log.stderr"}\n' "$rc" \
    >"$raw/recovery.json"
fi

# ---- Metrics; collective progress tracking (hang diagnosis) ------------------------
run_mesh metrics metrics
run_mesh progress progress

# ---- The job store: SQLite against a 3-member etcd it starts; leader takeover -----------
run_mesh store store

# ---- Python bindings: meshrt against the C++ calls on the same objects -----------------
# Debian's interpreter (torch) with the build's meshrt; without torch the
# suite still times the store and reports the collectives as skipped.
say "python_bench.py"
echo "## bench/python_bench.py ${smoke_flag[*]}" >>"$log"
build_abs=$(cd "$build_dir" && pwd)
rc=0
PYTHONPATH="$build_abs/python" MESH_COORDINATOR_BIN="$build_abs/coordinator/mesh-coordinator" \
  timeout -k 10 "$peer_timeout" "$python" "$repo/bench/python_bench.py" --json "$raw/python.json" \
  "${smoke_flag[@]}" >>"$log" 2>>"$log.stderr" || rc=$?
if ((rc != 0)); then
  say "python_bench.py failed (see $log.stderr)"
  printf '{"error": "bench/python_bench.py exited with status %d; see bench.log.stderr"}\n' "$rc" \
    >"$raw/python.json"
fi

# ---- GPU section: each reports "skipped" without a CUDA device -----------------------
run_mesh nccl_overhead nccl-overhead
run_mesh dtensor_pack dtensor-pack

say "suites' own tables: $log"
"$python_any" "$repo/bench/report.py" "$raw" --out "$out/latest.json" \
  --date "$(date +%F)" ${MESH_BENCH_REPORT_ARGS:-}
