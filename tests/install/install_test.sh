#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, checked as an installed user
# sees it:
#   1. the layout: binaries, libmeshrt.so.<major> with its SONAME and the
#      link-time name, libmeshrt.a, the public headers, the CMake package,
#      meshrt.pc and the systemd units pointing at the prefix's binaries;
#   2. nothing private: no header outside include/mesh/, no path of the
#      source or build tree in the package files, no protobuf or gRPC
#      symbol of ours exported by libmeshrt.so;
#   3. copies of examples/allreduce_2d.cc and examples/dtensor_redistribute.cc
#      built outside the tree, once with find_package(Mesh) and once with
#      pkg-config (shared), and allreduce_2d once more against libmeshrt.a
#      (pkg-config --static);
#   4. each of those binaries run as a 2-rank job on a local cluster started
#      with the installed meshctl (`meshctl cluster up`), which must SUCCEED.
#
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail

build=$(realpath "$1")
source=$(realpath "$2")
work=$(mktemp -d "${TMPDIR:-/tmp}/mesh-install-test.XXXXXX")
cluster_pid=""
cleanup() {
  if [[ -n "$cluster_pid" ]] && kill -0 "$cluster_pid" 2>/dev/null; then
    kill -INT "$cluster_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$cluster_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$cluster_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "install_test: FAILED: $*" >&2
  exit 1
}
step() { echo "== $*"; }

prefix=$work/prefix
step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install failed"; }

# ---- 1. Layout --------------------------------------------------------------
libdir=$(cd "$prefix" && dirname "$(find . -name 'libmeshrt.so.*.*' | head -1)")
[[ "$libdir" != "." ]] || fail "no libmeshrt.so.X.Y.Z installed"
libdir=$prefix/${libdir#./}
for f in bin/mesh-coordinator bin/mesh-agent bin/meshctl include/mesh/mesh.h \
  include/mesh/config.h include/mesh/dtensor.h lib/systemd/system/mesh-coordinator.service \
  lib/systemd/system/mesh-agent.service; do
  [[ -e "$prefix/$f" ]] || fail "$f is not installed"
done
for f in libmeshrt.so libmeshrt.a cmake/Mesh/MeshConfig.cmake cmake/Mesh/MeshConfigVersion.cmake \
  cmake/Mesh/MeshTargets.cmake pkgconfig/meshrt.pc; do
  [[ -e "$libdir/$f" ]] || fail "${libdir#"$prefix"/}/$f is not installed"
done
soname=$(readelf -d "$libdir/libmeshrt.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ "$soname" =~ ^libmeshrt\.so\.[0-9]+$ ]] || fail "libmeshrt.so's SONAME is '$soname'"
[[ -e "$libdir/$soname" ]] || fail "$soname (the SONAME) is not installed"
[[ -z "$(find "$prefix" -name 'libmesh.so*')" ]] || fail "a file named libmesh.so is installed"
grep -q "ExecStart=$prefix/bin/mesh-coordinator" "$prefix/lib/systemd/system/mesh-coordinator.service" ||
  fail "mesh-coordinator.service does not start $prefix/bin/mesh-coordinator"
grep -q "ExecStart=$prefix/bin/mesh-agent" "$prefix/lib/systemd/system/mesh-agent.service" ||
  fail "mesh-agent.service does not start $prefix/bin/mesh-agent"

# ---- 2. Nothing private -----------------------------------------------------
extra=$(cd "$prefix/include" && find . -type f ! -path './mesh/*')
[[ -z "$extra" ]] || fail "headers outside include/mesh/: $extra"
public=$(cd "$source/libmesh/include/mesh" && ls ./*.h | wc -l)
installed=$(ls "$prefix/include/mesh/"*.h | wc -l)
[[ "$installed" -eq $((public + 1)) ]] ||
  fail "include/mesh/ holds $installed headers, expected the $public public ones and config.h"
if grep -rlF -e "$build" -e "$source" "$libdir/cmake" "$libdir/pkgconfig" "$prefix/include"; then
  fail "an installed package file names the build or source tree (above)"
fi
if readelf -d "$libdir/libmeshrt.so" | grep -E 'R(UN)?PATH' | grep -qF -e "$build" -e "$source"; then
  fail "libmeshrt.so keeps a RUNPATH into the build tree"
fi
exported=$(nm -D --defined-only "$libdir/libmeshrt.so" | c++filt)
leaked=$(grep -cE ' [A-Za-z] (mesh::(v1|security|metrics)::|grpc|google::|absl::)' <<<"$exported" || true)
[[ "$leaked" -eq 0 ]] || fail "libmeshrt.so exports $leaked symbols of its private helpers"
grep -qE ' [A-Za-z] mesh::Runtime::' <<<"$exported" || fail "libmeshrt.so does not export mesh::Runtime"
grep -qE ' [A-Za-z] typeinfo for mesh::Store$' <<<"$exported" ||
  fail "libmeshrt.so does not export mesh::Store's type information"

# ---- 3. Out-of-tree builds --------------------------------------------------
consumer=$work/consumer
mkdir -p "$consumer"
cp "$source/examples/allreduce_2d.cc" "$source/examples/dtensor_redistribute.cc" "$consumer/"
cat >"$consumer/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.22)
project(mesh_consumer LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(Mesh 0.1 REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
foreach(example allreduce_2d dtensor_redistribute)
  add_executable(${example} ${example}.cc)
  target_link_libraries(${example} PRIVATE Mesh::mesh CLI11::CLI11)
endforeach()
EOF
step "find_package(Mesh): building the examples out of tree"
cmake -S "$consumer" -B "$work/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  >"$work/cmake-build.log" 2>&1 || { cat "$work/cmake-build.log" >&2; fail "configure with find_package(Mesh)"; }
cmake --build "$work/cmake-build" >>"$work/cmake-build.log" 2>&1 ||
  { cat "$work/cmake-build.log" >&2; fail "build with find_package(Mesh)"; }

step "pkg-config meshrt: building the examples out of tree"
export PKG_CONFIG_PATH=$libdir/pkgconfig
mkdir -p "$work/pc-build"
for example in allreduce_2d dtensor_redistribute; do
  # shellcheck disable=SC2046
  c++ -std=c++20 -c -o "$work/pc-build/$example.o" "$consumer/$example.cc" \
    $(pkg-config --cflags meshrt) || fail "compile of $example with pkg-config meshrt"
  # shellcheck disable=SC2046
  c++ -o "$work/pc-build/$example" "$work/pc-build/$example.o" $(pkg-config --libs meshrt) \
    -Wl,-rpath,"$libdir" || fail "link of $example with pkg-config meshrt"
done
step "pkg-config --static meshrt: allreduce_2d against libmeshrt.a"
# meshrt.pc names the CUDA runtime and NCCL (when the build has them) without
# their directory, which the static link supplies.
for var in CUDAToolkit_LIBRARY_DIR NCCL_LIBRARY; do
  value=$(sed -n "s/^$var:[A-Z]*=//p" "$build/CMakeCache.txt")
  [[ -z "$value" || "$value" == *NOTFOUND ]] && continue
  [[ -f "$value" ]] && value=$(dirname "$value")
  export LIBRARY_PATH=$value${LIBRARY_PATH:+:$LIBRARY_PATH}
done
# The same object as above, linked against the archive.
# shellcheck disable=SC2046
c++ -o "$work/pc-build/allreduce_2d_static" "$work/pc-build/allreduce_2d.o" \
  -L"$libdir" -Wl,-Bstatic -lmeshrt -Wl,-Bdynamic \
  $(pkg-config --static --libs meshrt | sed 's/-lmeshrt//') ||
  fail "static link of allreduce_2d with pkg-config --static meshrt"
if ldd "$work/pc-build/allreduce_2d_static" | grep -q libmeshrt; then
  fail "the static build still needs libmeshrt.so"
fi

# ---- 4. Each as a 2-rank job on the installed cluster -----------------------
meshctl=$prefix/bin/meshctl
step "meshctl cluster up (installed binaries)"
"$meshctl" cluster up --agents 1 --slots 2 --port 0 --state-dir "$work/cluster" \
  --ready-file "$work/ready" --grace 5 >"$work/cluster.out" 2>&1 &
cluster_pid=$!
for _ in $(seq 1 300); do
  [[ -s "$work/ready" ]] && break
  kill -0 "$cluster_pid" 2>/dev/null || { cat "$work/cluster.out" >&2; fail "cluster up exited"; }
  sleep 0.1
done
[[ -s "$work/ready" ]] || { cat "$work/cluster.out" >&2; fail "no cluster within 30 s"; }
# meshctl finds mesh-coordinator and mesh-agent next to itself.
children=$(for pid in $(ps -o pid= --ppid "$cluster_pid"); do readlink "/proc/$pid/exe" || true; done)
for daemon in mesh-coordinator mesh-agent; do
  grep -qx "$prefix/bin/$daemon" <<<"$children" ||
    fail "cluster up did not run the installed $daemon (its children: $children)"
done
export MESH_COORDINATOR
MESH_COORDINATOR=$(cat "$work/ready")

for bin in "$work/cmake-build/allreduce_2d" "$work/cmake-build/dtensor_redistribute" \
  "$work/pc-build/allreduce_2d" "$work/pc-build/dtensor_redistribute" \
  "$work/pc-build/allreduce_2d_static"; do
  name=${bin#"$work"/}
  step "job: $name as 2 ranks"
  job=$("$meshctl" submit --parsable --name "${name//\//-}" --nodes 1 --nproc-per-node 2 \
    -- "$bin" --gloo-host 127.0.0.1) || fail "submit of $name"
  if ! "$meshctl" wait "$job" --timeout 120; then
    "$meshctl" describe "$job" >&2 || true
    "$meshctl" logs "$job" >&2 || true
    fail "job $job ($name) did not succeed"
  fi
done
echo "install_test: OK"
