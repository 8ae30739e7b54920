#!/usr/bin/env bash
# mesh/mesh.h is the whole public API in one include: every public header
# but the NCCL backend's (mesh/process_group_nccl.h and the current-stream
# table it uses, mesh/cuda_stream.h), which programs include by name.
set -euo pipefail
dir=${1:?usage: mesh_h_test.sh LIBMESH_INCLUDE_MESH_DIR}
missing=0
for header in "$dir"/*.h; do
  name=$(basename "$header")
  case "$name" in
    mesh.h | process_group_nccl.h | cuda_stream.h) continue ;;
  esac
  if ! grep -q "^#include \"mesh/$name\"" "$dir/mesh.h"; then
    echo "mesh/mesh.h does not include mesh/$name"
    missing=1
  fi
done
[ "$missing" -eq 0 ] && echo "mesh/mesh.h includes every public header"
exit "$missing"
