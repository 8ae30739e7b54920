#!/usr/bin/env bash
# make fuzz: builds the libFuzzer harnesses of tests/fuzz with clang (ASan,
# UBSan, coverage) in their own build directory and runs each for a bounded
# time, starting from its seed corpus. docs/fuzzing.md.
#
#   scripts/fuzz.sh [TARGET...]     default: every target
#
# Knobs (environment):
#   FUZZ_SECONDS=60         seconds per target (libFuzzer -max_total_time)
#   FUZZ_BUILD_DIR=build-fuzz
#   FUZZ_JOBS=2             build parallelism
#   FUZZ_ARGS=              extra libFuzzer flags, e.g. "-max_len=4096"
#
# New interesting inputs go to $FUZZ_BUILD_DIR/fuzz-out/<target>/corpus (the
# seed corpus in tests/fuzz/corpus/ is only read); crashes, leaks and
# timeouts are saved as $FUZZ_BUILD_DIR/fuzz-out/<target>/crash-* (etc.).
# Exit status: 0 when no target found anything, 1 when one did (each saved
# artifact is listed with the command that replays it), 2 on a build error.
set -euo pipefail

cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${FUZZ_JOBS:-2}
all_targets=(job_spec coordination job_manager layout)
targets=("$@")
((${#targets[@]} > 0)) || targets=("${all_targets[@]}")

for tool in clang clang++; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fuzz.sh: $tool not found; run scripts/install-deps.sh (clang, libclang-rt-14-dev)" >&2
    exit 2
  fi
done

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DMESH_FUZZ=ON \
  -DMESH_WITH_CUDA=OFF "${launcher[@]}" >/dev/null || exit 2
build_targets=()
for t in "${targets[@]}"; do build_targets+=("fuzz_$t"); done
cmake --build "$build" -j "$jobs" --target "${build_targets[@]}" || exit 2

found=0
for t in "${targets[@]}"; do
  out="$build/fuzz-out/$t"
  mkdir -p "$out/corpus"
  echo "fuzz.sh: fuzz_$t for ${seconds}s"
  log="$out/fuzz.log"
  # -max_total_time bounds the run; -timeout and -rss_limit_mb make a hang
  # or a memory blow-up a finding too. The log keeps libFuzzer's stats.
  set +e
  "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/" ${FUZZ_ARGS:-} \
    "$out/corpus" "tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+ +DONE)' "$log" || true
  artifacts=$(find "$out" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' \
    -o -name 'timeout-*' -o -name 'oom-*' -o -name 'slow-unit-*' \) | sort)
  if [[ $rc -ne 0 || -n "$artifacts" ]]; then
    found=1
    echo "fuzz.sh: fuzz_$t FOUND something (exit $rc); the log is $log:" >&2
    grep -E 'ERROR|FUZZ_CHECK|MESH_CHECK|runtime error|SUMMARY' "$log" | head -20 >&2 || true
    for a in $artifacts; do
      echo "fuzz.sh:   $a   (replay: $build/tests/fuzz/fuzz_$t $a)" >&2
    done
  fi
done
if ((found)); then
  echo "fuzz.sh: add each reproducer to tests/fuzz/corpus/<target>/ once fixed." >&2
  exit 1
fi
echo "fuzz.sh: no findings in ${#targets[@]} target(s), ${seconds}s each."
