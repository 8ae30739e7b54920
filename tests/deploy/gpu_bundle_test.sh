#!/usr/bin/env bash
# The GPU bundle (scripts/gpu-bundle.sh, docs/gpu.md) built from this tree,
# unpacked somewhere else, and its gpu-check.sh run: on a machine without a
# GPU that is the CPU part (the seam test passes, the GPU tests skip, the
# benchmarks say they skipped). Checks that the tarball is under 40 MiB, that
# every binary and library finds its libraries inside the bundle (RUNPATH,
# no LD_LIBRARY_PATH), and that nothing left to the node (glibc, libcuda,
# libnccl) was packed. The meshrt package rides along: its extension finds
# its libraries in the bundle too, and gpu-check.sh runs its GPU test with
# PYTHON (the interpreter the build made it for) as the node's python3, where
# it skips without a GPU.
#
#   gpu_bundle_test.sh BUILD_DIR PYTHON
#
# Exit 77 (skipped) without patchelf.
set -euo pipefail
build=$1
python=$2
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

[ -f "$b/python-tests/test_nccl_gpu.py" ] || fail "no python-tests/test_nccl_gpu.py in the bundle"
extension=$(compgen -G "$b/python/meshrt/_meshrt*.so" | head -1) || fail "no meshrt extension in the bundle"
[ "$(patchelf --print-rpath "$extension")" = '$ORIGIN/../../lib' ] ||
  fail "$extension: RUNPATH $(patchelf --print-rpath "$extension")"
for file in "$b"/bin/* "$b"/tests/* "$extension"; do
  case "$file" in
    "$extension") ;;
    *) [ "$(patchelf --print-rpath "$file")" = '$ORIGIN/../lib' ] || fail "$file: RUNPATH $(patchelf --print-rpath "$file")" ;;
  esac
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

# The CPU part of the check, in its own folder, as on a node whose python3
# is the one the extension was built for.
mkdir "$work/path"
ln -s "$python" "$work/path/python3"
log=$work/node/gpu-check.log
PATH=$work/path:$PATH MESH_GPU_CHECK_SECONDS=${MESH_GPU_CHECK_SECONDS:-240} \
  "$b/scripts/gpu-check.sh" "$log" ||
  fail "gpu-check.sh failed (log above)"
summary=$(tail -1 "$log")
echo "gpu-check: $summary"
[[ "$summary" =~ ^([0-9]+)\ passed,\ 0\ failed,\ ([0-9]+)\ skipped$ ]] || fail "summary: $summary"
[ "${BASH_REMATCH[1]}" -gt 0 ] || fail "no test passed (the seam test should)"
grep -q 'nccl_seam_test: [1-9][0-9]* passed, 0 failed' "$log" || fail "the seam test did not pass"
grep -q -- '-- python: 0 passed, 0 failed, 2 skipped' "$log" || fail "the meshrt GPU test did not run and skip"
echo "PASS"
