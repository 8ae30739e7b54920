#include "mesh/build_info.h"

#include <gloo/config.h>

#include "absl/status/status.h"
#include "mesh/config.h"

namespace mesh {

#if MESH_HAVE_NCCL
// Defined in backends/nccl/nccl_runtime.cc.
int NcclHeaderVersion();
#endif

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.version = MESH_VERSION_STRING;
  info.has_gloo = MESH_HAVE_GLOO != 0;
  info.has_cuda = MESH_HAVE_CUDA != 0;
  info.has_nccl = MESH_HAVE_NCCL != 0;
  info.gloo_version = GLOO_VERSION;
#if MESH_HAVE_NCCL
  info.nccl_version = NcclHeaderVersion();
#endif
  return info;
}

#if !MESH_HAVE_CUDA
int CudaDeviceCount() { return 0; }

absl::StatusOr<int> NcclRuntimeVersion() {
  return absl::UnimplementedError("libmesh was built without NCCL");
}

absl::Status CudaRoundTripSelfTest(size_t) {
  return absl::UnimplementedError("libmesh was built without CUDA");
}
#endif

}  // namespace mesh
