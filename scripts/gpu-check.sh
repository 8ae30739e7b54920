#!/usr/bin/env bash
# Runs every GPU check of a Mesh GPU bundle (scripts/gpu-bundle.sh) on this
# machine and writes one log: each test binary under tests/ (the gpu-labelled
# tests and the CPU seam test), then the GPU benchmarks (mesh-bench
# nccl-overhead on both stream modes, and dtensor-pack). Bounded to under 5
# minutes in all; what does not fit is reported as not run. docs/gpu.md says
# how to use it.
#
#   scripts/gpu-check.sh [LOG]        default LOG: gpu-check.log beside the bundle
#
# NCCL: the binaries link libnccl.so.2 but the bundle does not carry it. When
# the system has none (ldconfig), this script looks for the one inside
# PyTorch's nvidia-nccl wheel and links it into the bundle's lib/, which
# every binary's RUNPATH already names; nothing else changes, and the
# environment of the node's own Python is left alone.
#
# Exit status: 0 when nothing failed (tests that skip, e.g. without a GPU,
# are not failures), 1 otherwise. The last line is "N passed, N failed,
# N skipped".
set -uo pipefail

bundle=$(cd "$(dirname "$0")/.." && pwd)
log=${1:-$bundle/../gpu-check.log}
exec > >(tee "$log") 2>&1
tee_pid=$!
budget=${MESH_GPU_CHECK_SECONDS:-290}
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }

echo "== Mesh GPU check: $(cat "$bundle/BUILD" 2>/dev/null | head -2 | tr '\n' ' ')"
echo "host: $(uname -n), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
# Whether the driver sees a GPU: then a GPU test that skips every case
# (its process saw no device: a driver older than the bundle's CUDA runtime,
# say) is a failure, not a skip.
gpus=0
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
else
  echo "nvidia-smi: not found (no driver?)"
fi

find_nccl() {
  if ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
    echo "system"
    return
  fi
  local dir
  for py in python3 python; do
    command -v "$py" >/dev/null || continue
    dir=$("$py" - 2>/dev/null <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
for path in (spec.submodule_search_locations or []) if spec else []:
    lib = os.path.join(path, "lib")
    if os.path.exists(os.path.join(lib, "libnccl.so.2")):
        print(lib)
        break
PY
)
    if [ -n "$dir" ]; then
      echo "$dir/libnccl.so.2"
      return
    fi
  done
  find / -xdev \( -path /proc -o -path /sys \) -prune -o -name libnccl.so.2 -print 2>/dev/null | head -1
}
nccl=$(find_nccl)
case "$nccl" in
  system) echo "nccl: the system's ($(ldconfig -p | grep -m1 'libnccl\.so\.2 ' | awk '{print $NF}'))" ;;
  "") echo "nccl: none found; the NCCL tests will fail to start" ;;
  *)
    ln -sf "$nccl" "$bundle/lib/libnccl.so.2"
    echo "nccl: $nccl (linked into the bundle's lib/)"
    ;;
esac

passed=0
failed=0
skipped=0
# Adds one test binary's (or file's) counts, which the caller set in oks,
# fails and skips from its output, to the totals, after judging how it ended:
# a timeout, or an exit code other than 0 and `skip_code` with no failed
# case, is one failure more, and so is every case skipping while
# nvidia-smi lists a GPU (the process saw no device).
tally() {
  local name=$1 code=$2 limit=$3 skip_code=${4:-0}
  if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
    echo "-- $name: timed out after ${limit}s"
    fails=$((fails + 1))
  elif [ "$code" -ne 0 ] && [ "$code" -ne "$skip_code" ] && [ "$fails" -eq 0 ]; then
    echo "-- $name: exited $code"
    fails=1
  elif [ "$gpus" -gt 0 ] && [ "$oks" -eq 0 ] && [ "$skips" -gt 0 ]; then
    echo "-- $name: nvidia-smi lists $gpus GPU(s), but every case skipped (no device seen)"
    fails=1
  fi
  echo "-- $name: $oks passed, $fails failed, $skips skipped"
  passed=$((passed + oks))
  failed=$((failed + fails))
  skipped=$((skipped + skips))
}
not_run=()
# Tests that start other binaries find them here instead of at their build
# paths.
export MESH_TEST_BIN_DIR=$bundle/bin
for test in "$bundle"/tests/*; do
  name=$(basename "$test")
  if [ "$(left)" -lt 30 ]; then
    not_run+=("$name")
    continue
  fi
  limit=$(( $(left) - 20 ))
  [ "$limit" -gt 180 ] && limit=180
  echo
  echo "== $name (limit ${limit}s)"
  out=$(mktemp)
  timeout --kill-after=5 "$limit" "$test" --gtest_color=no >"$out" 2>&1
  code=$?
  cat "$out"
  # One line per finished test case: "[ STATUS ] Suite.Case (N ms)".
  count() { grep -cE "^\[ *$1 *\] [^ ]+ \([0-9]+ ms\)\$" "$out"; }
  oks=$(count OK)
  fails=$(count FAILED)
  skips=$(count SKIPPED)
  tally "$name" "$code" "$limit"
  rm -f "$out"
done

# The meshrt package (a bundle made with --python): its GPU test, in the
# node's own python3, which must be the Python the extension was built for.
if [ -d "$bundle/python/meshrt" ]; then
  echo
  ext=$(basename "$(compgen -G "$bundle/python/meshrt/_meshrt*.so" | head -1)")
  want=${ext#_meshrt}
  have=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
  if [ "$want" != "$have" ]; then
    echo "== python: not run: meshrt was built for '$want', this node's python3 loads '${have:-nothing}'"
    not_run+=("python-tests")
  elif [ "$(left)" -lt 40 ]; then
    not_run+=("python-tests")
  else
    limit=$(( $(left) - 20 ))
    [ "$limit" -gt 240 ] && limit=240
    echo "== python-tests/test_nccl_gpu.py (limit ${limit}s)"
    out=$(mktemp)
    PYTHONPATH=$bundle/python MESH_COORDINATOR_BIN=$bundle/bin/mesh-coordinator \
      MESH_AGENT_BIN=$bundle/bin/mesh-agent PYTHONUNBUFFERED=1 \
      timeout --kill-after=5 "$limit" python3 "$bundle/python-tests/run_unittest.py" \
      "$bundle/python-tests/test_nccl_gpu.py" >"$out" 2>&1
    code=$?
    cat "$out"
    # unittest -v: one "name (...) ... ok|FAIL|ERROR|skipped '...'" per case.
    oks=$(grep -cE '\.\.\. ok$' "$out")
    fails=$(grep -cE '\.\.\. (FAIL|ERROR)$' "$out")
    skips=$(grep -cE '\.\.\. skipped' "$out")
    tally python "$code" "$limit" 77  # run_unittest.py: 77 when every test skipped
    rm -f "$out"
  fi
fi

echo
echo "== benchmarks"
bench=$bundle/bin/mesh-bench
for args in "nccl-overhead" "nccl-overhead --stream current" "dtensor-pack --sizes 1M,16M,64M,256M"; do
  if [ "$(left)" -lt 20 ]; then
    not_run+=("mesh-bench $args")
    continue
  fi
  echo "-- mesh-bench $args"
  # shellcheck disable=SC2086
  timeout --kill-after=5 $(( $(left) - 10 )) "$bench" $args || {
    echo "-- mesh-bench $args: exited $?"
    failed=$((failed + 1))
  }
done

echo
[ ${#not_run[@]} -eq 0 ] || echo "not run (out of the ${budget}s budget): ${not_run[*]}"
echo "took $(($(date +%s) - start))s; log: $log"
echo "$passed passed, $failed failed, $skipped skipped"
# Let tee finish writing the log before the caller reads it.
exec >&- 2>&-
wait "$tee_pid" 2>/dev/null
[ "$failed" -eq 0 ]
