#include "mesh/build_info.h"

#include <gtest/gtest.h>

#include "mesh/config.h"

#if MESH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mesh {
namespace build_info_test {

TEST(BuildInfo, ReflectsTheConfigHeader) {
  const BuildInfo info = GetBuildInfo();
  EXPECT_EQ(info.version, MESH_VERSION_STRING);
  EXPECT_TRUE(info.has_gloo);
  EXPECT_GT(info.gloo_version, 0);
  EXPECT_EQ(info.has_cuda, MESH_HAVE_CUDA == 1);
  EXPECT_EQ(info.has_nccl, MESH_HAVE_NCCL == 1);
  if (info.has_nccl) {
    EXPECT_GE(info.nccl_version, 20000) << "NCCL 2.x encodes as MAJOR*10000+...";
  } else {
    EXPECT_EQ(info.nccl_version, 0);
  }
}

// The count is the CUDA runtime's own (0 when it reports an error, as on a
// machine without a driver or GPU) and the same on every call; where there
// is a device, asking leaves no error behind for the next CUDA call to trip
// over. (Without a driver every runtime call, cudaGetLastError included,
// reports that, so there is nothing to leave behind.) Without CUDA in the
// build it is 0.
TEST(BuildInfo, DeviceCountIsTheRuntimesAndLeavesNoError) {
  const int count = CudaDeviceCount();
#if MESH_HAVE_CUDA
  int runtime = 0;
  if (cudaGetDeviceCount(&runtime) != cudaSuccess) runtime = 0;
  cudaGetLastError();  // What the direct query may have left.
  EXPECT_EQ(count, runtime);
  EXPECT_EQ(CudaDeviceCount(), count);
  if (count > 0) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "CudaDeviceCount left a CUDA error behind";
  }
#else
  EXPECT_EQ(count, 0);
  EXPECT_EQ(CudaDeviceCount(), 0);
#endif
}

TEST(BuildInfo, NcclRuntimeMatchesTheBuild) {
  auto version = NcclRuntimeVersion();
  if (!GetBuildInfo().has_nccl) {
    EXPECT_EQ(version.status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  // ncclGetVersion needs no device; it proves libnccl is linked and loads.
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version / 10000, GetBuildInfo().nccl_version / 10000)
      << "runtime NCCL major differs from the headers";
}

TEST(BuildInfo, CudaSelfTestFailsCleanlyWithoutADevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a device is present; see cuda_gpu_test";
  const absl::Status status = CudaRoundTripSelfTest(64);
  EXPECT_TRUE(status.code() == absl::StatusCode::kFailedPrecondition ||
              status.code() == absl::StatusCode::kUnimplemented)
      << status;
}

}  // namespace build_info_test
}  // namespace mesh
