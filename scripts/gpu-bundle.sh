#!/usr/bin/env bash
# Packs the GPU checks into a relocatable tarball for a bare GPU node: one
# that has the NVIDIA driver, CUDA and a Python with PyTorch (whose wheel
# carries NCCL), but none of the Debian -dev packages and no network.
# docs/gpu.md says how to use it. `make gpu-bundle` calls this through the
# CMake target gpu-bundle, which passes the built files:
#
#   scripts/gpu-bundle.sh OUT.tar.gz --bin FILE... --tests FILE... [--python DIR]
#
# --python DIR: the built meshrt package (<build>/python/meshrt). Its
# extension only loads in the Python it was built for (Python_EXECUTABLE at
# configure time), so for a node whose python3 is another version, point
# this at a build configured with a python3 of that version.
#
# Layout of the tarball (one top folder, mesh-gpu-bundle/):
#   bin/      the binaries the checks start (coordinator, agent, meshctl,
#             mesh-bench, the examples)
#   tests/    every gpu-labelled test binary, plus the CPU seam test
#   lib/      every shared library they need that a GPU node lacks: all of
#             ldd's answer except glibc's own libraries, libcuda (the driver)
#             and libnccl (the node's, or PyTorch's; gpu-check.sh finds it)
#   python/  with --python: the meshrt package, and python-tests/ with the
#             GPU test of it (tests/python/test_nccl_gpu.py and its helpers)
#   scripts/gpu-check.sh, docs/gpu.md, BUILD (what was built, from where)
#
# Every ELF file gets RUNPATH $ORIGIN/../lib (bin/, tests/) or $ORIGIN
# (lib/; $ORIGIN/../../lib for the Python extension), so nothing needs
# LD_LIBRARY_PATH, and the image's own Python and
# torch never see our libstdc++. Debug info is stripped: a GPU node has no
# debugger use for it, and it would make the bundle several times larger.
set -euo pipefail

usage() {
  sed -n '2,14p' "$0" >&2
  exit 2
}

[ $# -ge 1 ] || usage
out=$1
shift
bins=()
tests=()
python=
mode=
for arg in "$@"; do
  case "$arg" in
    --bin) mode=bin ;;
    --tests) mode=tests ;;
    --python) mode=python ;;
    *)
      case "$mode" in
        bin) bins+=("$arg") ;;
        tests) tests+=("$arg") ;;
        python)
          [ -z "$python" ] || usage
          python=$arg
          ;;
        *) usage ;;
      esac
      ;;
  esac
done
[ ${#bins[@]} -gt 0 ] && [ ${#tests[@]} -gt 0 ] || usage
for tool in patchelf strip ldd tar; do
  command -v "$tool" >/dev/null || {
    echo "gpu-bundle.sh: needs $tool (scripts/install-deps.sh installs it)" >&2
    exit 1
  }
done

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
top=$work/mesh-gpu-bundle
mkdir -p "$top/bin" "$top/tests" "$top/lib" "$top/scripts" "$top/docs"

cp "${bins[@]}" "$top/bin/"
cp "${tests[@]}" "$top/tests/"
cp "$root/scripts/gpu-check.sh" "$top/scripts/"
extensions=()
if [ -n "$python" ]; then
  compgen -G "$python/_meshrt*.so" >/dev/null || {
    echo "gpu-bundle.sh: $python holds no built _meshrt extension" >&2
    exit 1
  }
  mkdir -p "$top/python/meshrt" "$top/python-tests"
  cp "$python"/*.py "$python"/_meshrt*.so "$top/python/meshrt/"
  for name in test_nccl_gpu.py workers.py mesh_harness.py run_unittest.py; do
    cp "$root/tests/python/$name" "$top/python-tests/"
  done
  extensions=("$top"/python/meshrt/_meshrt*.so)
fi
cp "$root/docs/gpu.md" "$top/docs/"

# Libraries the node provides: glibc's own, the driver's, NCCL, the loader.
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libnccl)\.so'

# The closure of what every binary loads, as resolved on this machine.
declare -A libs=()
for file in "$top"/bin/* "$top"/tests/* "${extensions[@]}"; do
  while read -r name _ path _; do
    [ -n "$path" ] && [ "$path" != "not" ] || continue
    [[ "$name" =~ $provided ]] && continue
    libs[$name]=$path
  done < <(ldd "$file" | grep '=>')
done
for name in "${!libs[@]}"; do
  cp -L "${libs[$name]}" "$top/lib/$name"
done

for file in "$top"/bin/* "$top"/tests/*; do
  strip --strip-debug "$file"
  patchelf --set-rpath '$ORIGIN/../lib' "$file"
done
for file in "${extensions[@]}"; do
  chmod u+w "$file"
  strip --strip-debug "$file"
  patchelf --set-rpath '$ORIGIN/../../lib' "$file"
done
for file in "$top"/lib/*; do
  chmod u+w "$file"
  strip --strip-debug "$file"
  patchelf --set-rpath '$ORIGIN' "$file"
done

{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "source: $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "nccl headers: $(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "${NCCL_HEADER:-/usr/local/cuda/include/nccl.h}" 2>/dev/null)"
  echo "libraries: ${#libs[@]} (left to the node: glibc, libcuda, libnccl)"
  if [ ${#extensions[@]} -gt 0 ]; then
    echo "python: meshrt $(basename "${extensions[0]}")"
  else
    echo "python: none (built without --python)"
  fi
} > "$top/BUILD"

mkdir -p "$(dirname "$out")"
tar -C "$work" -czf "$out" mesh-gpu-bundle
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1), ${#bins[@]} binaries, ${#tests[@]} tests, ${#libs[@]} libraries)"
