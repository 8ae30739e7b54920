// Label gpu: runs on a machine with a CUDA device and skips elsewhere.
#include <gtest/gtest.h>

#include "mesh/build_info.h"

namespace mesh {
namespace cuda_gpu_test {

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GetBuildInfo().has_cuda) GTEST_SKIP() << "built without CUDA";
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_F(CudaGpuTest, BytesSurviveARoundTripThroughDeviceZero) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4099}, size_t{64} << 20}) {
    EXPECT_TRUE(CudaRoundTripSelfTest(bytes).ok()) << bytes << " bytes";
  }
}

TEST_F(CudaGpuTest, NcclLoadsAtRunTime) {
  auto version = NcclRuntimeVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_GE(*version, 20000);
}

}  // namespace cuda_gpu_test
}  // namespace mesh
