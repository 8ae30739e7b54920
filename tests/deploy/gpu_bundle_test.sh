#!/usr/bin/env bash
# The GPU bundle (scripts/gpu-bundle.sh, docs/gpu.md) built from this tree,
# unpacked somewhere else, and its gpu-check.sh run: on a machine without a
# GPU that is the CPU part (the seam test passes, the GPU tests skip, the
# benchmarks say they skipped). Checks that the tarball is under 40 MiB, that
# every binary and library finds its libraries inside the bundle (RUNPATH,
# no LD_LIBRARY_PATH), and that nothing left to the node (glibc, libcuda,
# libnccl) was packed.
#
#   gpu_bundle_test.sh BUILD_DIR
#
# Exit 77 (skipped) without patchelf.
set -euo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v patchelf >/dev/null || { echo "SKIP: no patchelf (scripts/install-deps.sh)"; exit 77; }
[ -f "$build/build.ninja" ] || { echo "SKIP: $build is not a Ninja build"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The file list the gpu-bundle target passes, taken from the build's own
# command for it, so this test packs exactly what `make gpu-bundle` packs.
cmd=$(ninja -C "$build" -t commands gpu-bundle | grep 'gpu-bundle.sh' | tail -1)
[ -n "$cmd" ] || fail "no gpu-bundle command in $build"
out=$work/out/mesh-gpu-bundle.tar.gz
eval "set -- ${cmd#*gpu-bundle.sh}"
shift  # the target's own output path
"$root/scripts/gpu-bundle.sh" "$out" "$@"

size=$(stat -c %s "$out")
echo "bundle: $size bytes"
[ "$size" -lt $((40 * 1024 * 1024)) ] || fail "bundle is $size bytes, over 40 MiB"

mkdir "$work/node"
tar -C "$work/node" -xzf "$out"
b=$work/node/mesh-gpu-bundle
for dir in bin tests lib scripts docs; do [ -d "$b/$dir" ] || fail "no $dir/ in the bundle"; done
ls "$b/lib" | grep -Eq '^(libc|libm|libcuda|libnccl)\.so' && fail "packed a library the node provides"
[ -e "$b/tests/nccl_seam_test" ] || fail "no nccl_seam_test in the bundle"

for file in "$b"/bin/* "$b"/tests/*; do
  [ "$(patchelf --print-rpath "$file")" = '$ORIGIN/../lib' ] || fail "$file: RUNPATH $(patchelf --print-rpath "$file")"
  # Resolved inside the bundle (or glibc); libnccl comes from the node.
  missing=$(env -u LD_LIBRARY_PATH ldd "$file" | grep 'not found' | grep -v 'libnccl\.so' || true)
  [ -z "$missing" ] || fail "$file: $missing"
  outside=$(env -u LD_LIBRARY_PATH ldd "$file" | awk '/=>/ {print $1, $3}' |
    grep -Ev '^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libnccl)\.so' |
    while read -r name path; do
      case "$(realpath -m "$path")" in "$b"/lib/*) ;; *) echo "$name $path" ;; esac
    done)
  [ -z "$outside" ] || fail "$file loads from outside the bundle: $outside"
done
if command -v readelf >/dev/null && readelf -S "$b/bin/mesh-coordinator" | grep -q '\.debug_info'; then
  fail "debug info was not stripped"
fi

# The CPU part of the check, in its own folder, as on a node.
log=$work/node/gpu-check.log
MESH_GPU_CHECK_SECONDS=${MESH_GPU_CHECK_SECONDS:-240} "$b/scripts/gpu-check.sh" "$log" ||
  fail "gpu-check.sh failed (log above)"
summary=$(tail -1 "$log")
echo "gpu-check: $summary"
[[ "$summary" =~ ^([0-9]+)\ passed,\ 0\ failed,\ ([0-9]+)\ skipped$ ]] || fail "summary: $summary"
[ "${BASH_REMATCH[1]}" -gt 0 ] || fail "no test passed (the seam test should)"
grep -q 'nccl_seam_test: [1-9][0-9]* passed, 0 failed' "$log" || fail "the seam test did not pass"
echo "PASS"
