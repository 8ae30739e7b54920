// Label gpu: tensors on cuda:0. Skips without CUDA in the build or without a
// visible device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "mesh/build_info.h"
#include "mesh/config.h"
#include "mesh/dlpack.h"
#include "mesh/tensor.h"
#include "tests/util/status_matchers.h"

#if MESH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mesh {
namespace tensor_cuda_gpu_test {

using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TensorCudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GetBuildInfo().has_cuda) GTEST_SKIP() << "built without CUDA";
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

// Host -> device -> host through CopyTensor, returning what came back.
std::vector<float> ThroughDevice(const std::vector<float>& in) {
  const int64_t n = static_cast<int64_t>(in.size());
  auto device = Tensor::Empty(DType::kFloat32, {n}, Device::Cuda(0));
  EXPECT_TRUE(device.ok()) << device.status();
  std::vector<float> out(in.size(), -1.0f);
  EXPECT_TRUE(
      CopyTensor(*device, Tensor::Contiguous(const_cast<float*>(in.data()), DType::kFloat32, {n}))
          .ok());
  EXPECT_TRUE(CopyTensor(Tensor::Contiguous(out.data(), DType::kFloat32, {n}), *device).ok());
  return out;
}

TEST_F(TensorCudaGpuTest, EmptyAllocatesOnTheNamedDevice) {
  auto t = Tensor::Empty(DType::kFloat32, {1024}, Device::Cuda(0));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->device(), Device::Cuda(0));
  EXPECT_NE(t->data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % 256, 0u);
#if MESH_HAVE_CUDA
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, t->data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);
#endif
}

TEST_F(TensorCudaGpuTest, ZeroElementAllocationIsNonNull) {
  auto t = Tensor::Empty(DType::kInt64, {0, 3}, Device::Cuda(0));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NE(t->data(), nullptr);
}

TEST_F(TensorCudaGpuTest, ValuesSurviveHostDeviceHost) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, size_t{1} << 20}) {
    std::vector<float> in(n);
    std::iota(in.begin(), in.end(), 0.5f);
    EXPECT_EQ(ThroughDevice(in), in) << n << " elements";
  }
}

TEST_F(TensorCudaGpuTest, ZerosAndFill) {
  auto z = Tensor::Zeros(DType::kInt32, {3, 5}, Device::Cuda(0));
  ASSERT_TRUE(z.ok()) << z.status();
  std::vector<int32_t> host(15, -1);
  Tensor h = Tensor::Contiguous(host.data(), DType::kInt32, {3, 5});
  ASSERT_TRUE(CopyTensor(h, *z).ok());
  EXPECT_EQ(host, std::vector<int32_t>(15, 0));
  ASSERT_TRUE(Fill(*z, 42).ok());
  ASSERT_TRUE(CopyTensor(h, *z).ok());
  EXPECT_EQ(host, std::vector<int32_t>(15, 42));
}

TEST_F(TensorCudaGpuTest, NonContiguousHostSidesAreStaged) {
  // Host [3, 4] row-major; the device gets its transpose [4, 3].
  std::vector<int64_t> host(12);
  std::iota(host.begin(), host.end(), 0);
  auto transposed = Tensor::Create(host.data(), DType::kInt64, {4, 3}, {1, 4}, Device::Cpu());
  ASSERT_TRUE(transposed.ok());
  auto device = Tensor::Empty(DType::kInt64, {4, 3}, Device::Cuda(0));
  ASSERT_TRUE(device.ok());
  ASSERT_TRUE(CopyTensor(*device, *transposed).ok());

  std::vector<int64_t> back(12, -1);
  ASSERT_TRUE(CopyTensor(Tensor::Contiguous(back.data(), DType::kInt64, {4, 3}), *device).ok());
  EXPECT_THAT(back, ElementsAre(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11));

  // Device -> strided host: scatter into every other column of [4, 6].
  std::vector<int64_t> wide(24, -1);
  auto every_other = Tensor::Create(wide.data(), DType::kInt64, {4, 3}, {6, 2}, Device::Cpu());
  ASSERT_TRUE(every_other.ok());
  ASSERT_TRUE(CopyTensor(*every_other, *device).ok());
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 6; ++c) {
      EXPECT_EQ(wide[r * 6 + c], c % 2 == 0 ? back[r * 3 + c / 2] : -1) << r << "," << c;
    }
  }
}

TEST_F(TensorCudaGpuTest, DeviceToDeviceAndAsync) {
  std::vector<float> in(1000);
  std::iota(in.begin(), in.end(), 1.0f);
  auto a = Tensor::Empty(DType::kFloat32, {1000}, Device::Cuda(0));
  auto b = Tensor::Empty(DType::kFloat32, {1000}, Device::Cuda(0));
  ASSERT_TRUE(a.ok() && b.ok());
  Tensor host_in = Tensor::Contiguous(in.data(), DType::kFloat32, {1000});
  ASSERT_TRUE(CopyTensorAsync(*a, host_in, nullptr).ok());
  ASSERT_TRUE(CopyTensor(*b, *a).ok());  // Same legacy stream: ordered after the async copy.
  std::vector<float> out(1000, 0.0f);
  ASSERT_TRUE(CopyTensor(Tensor::Contiguous(out.data(), DType::kFloat32, {1000}), *b).ok());
  EXPECT_EQ(out, in);
}

TEST_F(TensorCudaGpuTest, NonContiguousDeviceTensorsAreRefused) {
  auto t = Tensor::Empty(DType::kFloat32, {4, 4}, Device::Cuda(0));
  ASSERT_TRUE(t.ok());
  auto cols = t->Narrow(1, 0, 2);
  ASSERT_TRUE(cols.ok());
  std::vector<float> host(8);
  absl::Status s = CopyTensor(Tensor::Contiguous(host.data(), DType::kFloat32, {4, 2}), *cols);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(s.message(), HasSubstr("non-contiguous CUDA tensor"));
}

TEST_F(TensorCudaGpuTest, MissingOrdinalIsAFailedPrecondition) {
  const int count = CudaDeviceCount();
  auto t = Tensor::Empty(DType::kFloat32, {4}, Device::Cuda(count));
  EXPECT_THAT(t.status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(t.status().message(), HasSubstr("cuda:" + std::to_string(count)));
}

TEST_F(TensorCudaGpuTest, ImpossibleAllocationIsResourceExhausted) {
  // 2^50 bytes: far beyond any GPU, but a valid size.
  auto t = Tensor::Empty(DType::kUInt8, {int64_t{1} << 50}, Device::Cuda(0));
  EXPECT_THAT(t.status(), StatusIs(absl::StatusCode::kResourceExhausted));
  // The failure is not sticky: the device still works.
  EXPECT_EQ(ThroughDevice({1.0f, 2.0f}), (std::vector<float>{1.0f, 2.0f}));
}

TEST_F(TensorCudaGpuTest, CurrentDeviceIsRestored) {
#if MESH_HAVE_CUDA
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs two devices";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  {
    auto t = Tensor::Zeros(DType::kFloat32, {16}, Device::Cuda(0));
    ASSERT_TRUE(t.ok());
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 1);
  }  // Freed on cuda:0 while cuda:1 is current.
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
#endif
}

TEST_F(TensorCudaGpuTest, DLPackRoundTripOnDeviceZero) {
  auto t = Tensor::Empty(DType::kBFloat16, {8, 2}, Device::Cuda(0));
  ASSERT_TRUE(t.ok());
  std::weak_ptr<void> memory = t->keep_alive();
  DLManagedTensor* managed = ToDLPack(*t);
  EXPECT_EQ(managed->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(managed->dl_tensor.device.device_id, 0);
  EXPECT_EQ(managed->dl_tensor.data, t->data());
  auto back = FromDLPack(managed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data(), t->data());
  EXPECT_EQ(back->device(), Device::Cuda(0));
  EXPECT_EQ(back->dtype(), DType::kBFloat16);
  *t = Tensor();
  EXPECT_FALSE(memory.expired());
  // The import is usable: zero it and read it back.
  ASSERT_TRUE(Fill(*back, 0.0).ok());
  std::vector<uint16_t> host(16, 0xffff);
  ASSERT_TRUE(CopyTensor(Tensor::Contiguous(host.data(), DType::kBFloat16, {8, 2}), *back).ok());
  EXPECT_EQ(host, std::vector<uint16_t>(16, 0));
  *back = Tensor();
  EXPECT_TRUE(memory.expired());
}

}  // namespace tensor_cuda_gpu_test
}  // namespace mesh
