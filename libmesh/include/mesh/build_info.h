// What this libmesh build contains and what the machine offers it.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace mesh {

struct BuildInfo {
  std::string version;    // libmesh version, e.g. "0.1.0".
  bool has_gloo = false;  // Gloo CPU backend compiled in (always true).
  bool has_cuda = false;  // CUDA code paths compiled in.
  bool has_nccl = false;  // NCCL backend compiled in.
  int gloo_version = 0;   // GLOO_VERSION, e.g. 500 for 0.5.0.
  int nccl_version = 0;   // NCCL_VERSION_CODE of the headers built against.
};

// Compile-time facts; never fails, never touches a device.
BuildInfo GetBuildInfo();

// Number of CUDA devices visible to this process. 0 when the build has no
// CUDA, when no driver is installed, or when no device is visible; none of
// those is an error, since CPU-only workers are normal.
// Thread safety: safe to call from any thread.
int CudaDeviceCount();

// Version of the NCCL library loaded at run time (ncclGetVersion), e.g.
// 22803 for 2.28.3.
// Possible errors: UNIMPLEMENTED when built without NCCL; INTERNAL when the
// library reports an error.
absl::StatusOr<int> NcclRuntimeVersion();

// Copies `bytes` bytes host → device 0 → host and checks they survive:
// the smallest proof that the CUDA runtime works end to end.
// Possible errors: UNIMPLEMENTED without CUDA; FAILED_PRECONDITION when no
// device is visible; INTERNAL with the CUDA error string otherwise.
absl::Status CudaRoundTripSelfTest(size_t bytes);

}  // namespace mesh
