// The thread-local "current CUDA stream" table (mesh/cuda_stream.h). It only
// stores handles, so fake stream values test it without a GPU.
#include "mesh/cuda_stream.h"

#include <gtest/gtest.h>

#include <thread>

namespace mesh {
namespace nccl_current_stream_test {

void* FakeStream(uintptr_t n) { return reinterpret_cast<void*>(n); }

TEST(CurrentCudaStream, DefaultsToTheLegacyDefaultStream) {
  EXPECT_EQ(CurrentCudaStream(Device::Cuda(0)), nullptr);
  EXPECT_EQ(CurrentCudaStream(Device::Cuda(7)), nullptr);  // Never touched: still null.
}

TEST(CurrentCudaStream, GuardsNestAndRestore) {
  {
    CudaStreamGuard outer(Device::Cuda(0), FakeStream(0x10));
    EXPECT_EQ(CurrentCudaStream(Device::Cuda(0)), FakeStream(0x10));
    {
      CudaStreamGuard inner(Device::Cuda(0), FakeStream(0x20));
      EXPECT_EQ(CurrentCudaStream(Device::Cuda(0)), FakeStream(0x20));
    }
    EXPECT_EQ(CurrentCudaStream(Device::Cuda(0)), FakeStream(0x10));
  }
  EXPECT_EQ(CurrentCudaStream(Device::Cuda(0)), nullptr);
}

TEST(CurrentCudaStream, IsPerDevice) {
  CudaStreamGuard on3(Device::Cuda(3), FakeStream(0x30));
  EXPECT_EQ(CurrentCudaStream(Device::Cuda(3)), FakeStream(0x30));
  EXPECT_EQ(CurrentCudaStream(Device::Cuda(0)), nullptr);
  EXPECT_EQ(CurrentCudaStream(Device::Cuda(2)), nullptr);
  {
    CudaStreamGuard on0(Device::Cuda(0), FakeStream(0x40));
    EXPECT_EQ(CurrentCudaStream(Device::Cuda(3)), FakeStream(0x30));
    EXPECT_EQ(CurrentCudaStream(Device::Cuda(0)), FakeStream(0x40));
  }
  EXPECT_EQ(CurrentCudaStream(Device::Cuda(0)), nullptr);
}

TEST(CurrentCudaStream, IsPerThread) {
  CudaStreamGuard mine(Device::Cuda(0), FakeStream(0x50));
  void* seen_by_other = FakeStream(1);
  void* set_by_other = FakeStream(1);
  std::thread other([&] {
    seen_by_other = CurrentCudaStream(Device::Cuda(0));
    CudaStreamGuard theirs(Device::Cuda(0), FakeStream(0x60));
    set_by_other = CurrentCudaStream(Device::Cuda(0));
  });
  other.join();
  EXPECT_EQ(seen_by_other, nullptr);
  EXPECT_EQ(set_by_other, FakeStream(0x60));
  EXPECT_EQ(CurrentCudaStream(Device::Cuda(0)), FakeStream(0x50));
}

TEST(CurrentCudaStreamDeathTest, TheCpuHasNoStream) {
  EXPECT_DEATH(CurrentCudaStream(Device::Cpu()), "needs a CUDA device");
}

}  // namespace nccl_current_stream_test
}  // namespace mesh
