#include "mesh/tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/check.h"
#include "mesh/build_info.h"
#include "mesh/float16.h"
#include "tests/util/status_matchers.h"

namespace mesh {
namespace tensor_test {

using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int64_t> Vec(absl::Span<const int64_t> s) { return {s.begin(), s.end()}; }

// ---- Device. -------------------------------------------------------------------

TEST(Device, PrintsAndParsesLikePyTorch) {
  EXPECT_EQ(Device::Cpu().ToString(), "cpu");
  EXPECT_EQ(Device::Cuda(0).ToString(), "cuda:0");
  EXPECT_EQ(Device::Cuda(13).ToString(), "cuda:13");
  for (Device d : {Device::Cpu(), Device::Cuda(0), Device::Cuda(7), Device::Cuda(123)}) {
    auto parsed = Device::Parse(d.ToString());
    ASSERT_TRUE(parsed.ok()) << d;
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(*Device::Parse("cpu:0"), Device::Cpu());
  EXPECT_TRUE(Device::Parse("cuda:2")->is_cuda());
  EXPECT_EQ(Device::Parse("cuda:2")->index(), 2);
}

TEST(Device, RejectsAmbiguousOrMalformedText) {
  for (const char* bad : {"", "cuda", "cuda:", "cuda:-1", "cuda:+1", "cuda: 1", "cuda:1 ", "cuda:x",
                          "gpu:0", "cpu:1", "CPU", "cuda:99999999999"}) {
    EXPECT_THAT(Device::Parse(bad).status(), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_THAT(Device::Parse("cuda").status().message(), HasSubstr("cuda:N"));
  EXPECT_THAT(Device::Parse("tpu:0").status().message(), HasSubstr("'tpu:0'"));
}

TEST(Device, EqualityAndDefaults) {
  EXPECT_EQ(Device(), Device::Cpu());
  EXPECT_TRUE(Device().is_cpu());
  EXPECT_EQ(Device().index(), 0);
  EXPECT_FALSE(Device::Cuda(0) == Device::Cuda(1));
  EXPECT_FALSE(Device::Cuda(0) == Device::Cpu());
  static_assert(Device::Cuda(3).index() == 3);
}

TEST(Device, IsHashable) {
  absl::flat_hash_set<Device> devices = {Device::Cpu(), Device::Cuda(0), Device::Cuda(1)};
  devices.insert(*Device::Parse("cuda:1"));
  devices.insert(*Device::Parse("cpu:0"));
  EXPECT_EQ(devices.size(), 3u);
  EXPECT_TRUE(devices.contains(Device::Cuda(0)));
  EXPECT_FALSE(devices.contains(Device::Cuda(2)));
}

TEST(DeviceDeathTest, TrustedConstructorChecksInvariants) {
  EXPECT_DEATH(Device(DeviceType::kCuda, -1), "negative device index");
  EXPECT_DEATH(Device(DeviceType::kCpu, 1), "CPU device has index 0");
}

// ---- Strides and metadata. --------------------------------------------------

TEST(Tensor, ContiguousStridesMatchPyTorch) {
  EXPECT_THAT(ContiguousStrides({2, 3, 4}), ElementsAre(12, 4, 1));
  EXPECT_THAT(ContiguousStrides({}), ElementsAre());
  EXPECT_THAT(ContiguousStrides({5}), ElementsAre(1));
  // torch.empty(2, 1, 3).stride() == (3, 3, 1); torch.empty(0, 3).stride() == (3, 1).
  EXPECT_THAT(ContiguousStrides({2, 1, 3}), ElementsAre(3, 3, 1));
  EXPECT_THAT(ContiguousStrides({0, 3}), ElementsAre(3, 1));
  EXPECT_THAT(ContiguousStrides({3, 0}), ElementsAre(1, 1));
}

TEST(Tensor, DefaultIsAnEmptyCpuVector) {
  Tensor t;
  EXPECT_EQ(t.dim(), 1);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.keep_alive(), nullptr);
}

TEST(Tensor, ContiguousViewMetadata) {
  std::vector<double> buffer(24);
  Tensor t = Tensor::Contiguous(buffer.data(), DType::kFloat64, {2, 3, 4});
  EXPECT_EQ(t.data(), buffer.data());
  EXPECT_EQ(t.data_as<double>(), buffer.data());
  EXPECT_EQ(t.dtype(), DType::kFloat64);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.element_size(), 8u);
  EXPECT_EQ(t.nbytes(), 192u);
  EXPECT_EQ(t.size(1), 3);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_THAT(Vec(t.shape()), ElementsAre(2, 3, 4));
  EXPECT_THAT(Vec(t.strides()), ElementsAre(12, 4, 1));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.device(), Device::Cpu());
  EXPECT_EQ(t.DebugString(), "float64[2, 3, 4] strides [12, 4, 1] cpu");
}

TEST(Tensor, ScalarHasOneElement) {
  float x = 3.0f;
  Tensor t = Tensor::Contiguous(&x, DType::kFloat32, {});
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.nbytes(), 4u);
  EXPECT_TRUE(t.is_contiguous());
}

TEST(Tensor, Contiguity) {
  int32_t buffer[64] = {};
  auto view = [&](std::vector<int64_t> shape, std::vector<int64_t> strides) {
    auto t = Tensor::Create(buffer, DType::kInt32, shape, strides, Device::Cpu());
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  };
  EXPECT_TRUE(view({2, 3}, {3, 1}).is_contiguous());
  EXPECT_FALSE(view({2, 3}, {1, 2}).is_contiguous());        // Transposed.
  EXPECT_FALSE(view({2, 3}, {4, 1}).is_contiguous());        // Row padding.
  EXPECT_FALSE(view({3}, {2}).is_contiguous());              // Every other element.
  EXPECT_FALSE(view({2, 3}, {0, 1}).is_contiguous());        // Broadcast rows.
  EXPECT_TRUE(view({2, 1, 3}, {3, 99, 1}).is_contiguous());  // Size-1 strides ignored.
  EXPECT_TRUE(view({1, 1}, {5, 7}).is_contiguous());
  EXPECT_TRUE(view({2, 0, 3}, {7, 5, 3}).is_contiguous());  // No elements.
}

TEST(Tensor, CreateRejectsBadViewsWithClearErrors) {
  float buffer[16];
  auto create = [&](std::vector<int64_t> shape, std::vector<int64_t> strides,
                    void* data = nullptr) {
    return Tensor::Create(data != nullptr ? data : buffer, DType::kFloat32, shape, strides,
                          Device::Cpu())
        .status();
  };
  absl::Status s = create({2, -1}, {1, 1});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("negative size at dim 1"));

  s = create({2, 3}, {3});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("has 2 dims but strides [3] have 1"));

  s = create({2, 3}, {3, -1});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("negative stride at dim 1"));

  s = create({int64_t{1} << 40, int64_t{1} << 40}, {1, 1});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("overflows"));

  // Few elements, but the last one would be beyond 2^63 bytes.
  s = create({2, 2}, {int64_t{1} << 62, 1});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("spans more than"));

  auto null_data = Tensor::Create(nullptr, DType::kFloat32, {3}, {1}, Device::Cpu()).status();
  EXPECT_THAT(null_data, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(null_data.message(), HasSubstr("null data pointer for a tensor with 3 elements"));

  // Null data is fine when there is nothing to point at.
  EXPECT_TRUE(Tensor::Create(nullptr, DType::kFloat32, {0, 3}, {3, 1}, Device::Cpu()).ok());
  // Zero strides (broadcast) are valid views.
  EXPECT_TRUE(Tensor::Create(buffer, DType::kFloat32, {4, 4}, {0, 1}, Device::Cpu()).ok());
}

TEST(TensorDeathTest, TrustedConstructorAbortsOnBadViews) {
  float buffer[4];
  EXPECT_DEATH(Tensor::Contiguous(buffer, DType::kFloat32, {2, -2}), "negative size");
  EXPECT_DEATH(Tensor(buffer, DType::kFloat32, {2}, {1, 1}, Device::Cpu()), "strides");
  Tensor t = Tensor::Contiguous(buffer, DType::kFloat32, {4});
  EXPECT_DEATH(t.size(1), "dim out of range");
}

// ---- Narrow. ------------------------------------------------------------------

TEST(Tensor, NarrowIsAViewIntoTheSameMemory) {
  std::vector<int32_t> buffer(4 * 6);
  std::iota(buffer.begin(), buffer.end(), 0);
  auto owner = std::make_shared<int>(0);
  Tensor t = Tensor::Contiguous(buffer.data(), DType::kInt32, {4, 6}, Device::Cpu(), owner);

  auto rows = t.Narrow(0, 1, 2);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(Vec(rows->shape()), ElementsAre(2, 6));
  EXPECT_EQ(rows->data_as<int32_t>(), buffer.data() + 6);
  EXPECT_EQ(rows->numel(), 12);
  EXPECT_TRUE(rows->is_contiguous());
  EXPECT_EQ(rows->keep_alive(), owner);

  auto cols = t.Narrow(1, 2, 3);
  ASSERT_TRUE(cols.ok());
  EXPECT_THAT(Vec(cols->shape()), ElementsAre(4, 3));
  EXPECT_THAT(Vec(cols->strides()), ElementsAre(6, 1));
  EXPECT_EQ(*cols->data_as<int32_t>(), 2);
  EXPECT_FALSE(cols->is_contiguous());
  EXPECT_EQ(cols->nbytes(), 12u * 4);

  // Narrowing a narrowed view composes.
  auto cell = cols->Narrow(0, 3, 1);
  ASSERT_TRUE(cell.ok());
  EXPECT_EQ(*cell->data_as<int32_t>(), 3 * 6 + 2);
  EXPECT_EQ(owner.use_count(), 5);  // owner, t, rows, cols, cell.
}

TEST(Tensor, NarrowAllowsTheEmptyTrailingChunk) {
  std::vector<float> buffer(10);
  Tensor t = Tensor::Contiguous(buffer.data(), DType::kFloat32, {10});
  auto tail = t.Narrow(0, 10, 0);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->numel(), 0);
  EXPECT_EQ(tail->nbytes(), 0u);
  auto all = t.Narrow(0, 0, 10);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->data(), t.data());
}

TEST(Tensor, NarrowRejectsOutOfRange) {
  std::vector<float> buffer(12);
  Tensor t = Tensor::Contiguous(buffer.data(), DType::kFloat32, {3, 4});
  for (auto [dim, start, length] : std::vector<std::tuple<int, int64_t, int64_t>>{
           {-1, 0, 1}, {2, 0, 1}, {0, -1, 1}, {0, 4, 0}, {0, 0, -1}, {0, 2, 2}, {1, 1, 4}}) {
    auto r = t.Narrow(dim, start, length);
    EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kInvalidArgument))
        << dim << " " << start << " " << length;
  }
  EXPECT_THAT(t.Narrow(1, 3, 2).status().message(), HasSubstr("[3, 3 + 2) of dim 1"));
}

// ---- Allocation. --------------------------------------------------------------

TEST(Tensor, EmptyAllocatesAlignedOwnedMemory) {
  for (int64_t n : {0, 1, 3, 63, 64, 65, 1000}) {
    for (DType dtype : kAllDTypes) {
      auto t = Tensor::Empty(dtype, {n});
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_NE(t->data(), nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % 64, 0u) << n;
      EXPECT_EQ(t->numel(), n);
      EXPECT_EQ(t->dtype(), dtype);
      EXPECT_TRUE(t->is_contiguous());
      EXPECT_NE(t->keep_alive(), nullptr);
      // The whole range is writable (ASan would catch a short allocation).
      std::memset(t->data(), 0x5a, t->nbytes());
    }
  }
}

TEST(Tensor, EmptyMemoryLivesAsLongAsAnyView) {
  std::weak_ptr<void> memory;
  Tensor survivor;
  {
    auto t = Tensor::Empty(DType::kInt64, {8});
    ASSERT_TRUE(t.ok());
    memory = t->keep_alive();
    auto half = t->Narrow(0, 4, 4);
    ASSERT_TRUE(half.ok());
    survivor = *half;
  }
  EXPECT_FALSE(memory.expired());
  survivor.data_as<int64_t>()[3] = 42;  // Still valid.
  survivor = Tensor();
  EXPECT_TRUE(memory.expired());
}

TEST(Tensor, EmptyRejectsBadShapes) {
  EXPECT_THAT(Tensor::Empty(DType::kFloat32, {-1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Tensor::Empty(DType::kFloat64, {int64_t{1} << 61}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Tensor, ZerosAreZero) {
  for (DType dtype : kAllDTypes) {
    auto t = Tensor::Zeros(dtype, {3, 5});
    ASSERT_TRUE(t.ok());
    const auto* bytes = t->data_as<unsigned char>();
    EXPECT_TRUE(std::all_of(bytes, bytes + t->nbytes(), [](unsigned char b) { return b == 0; }));
  }
}

TEST(Tensor, CudaAllocationWithoutADeviceIsAFailedPrecondition) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible; see tensor_cuda_gpu_test";
  for (auto result : {Tensor::Empty(DType::kFloat32, {4}, Device::Cuda(0)),
                      Tensor::Zeros(DType::kFloat32, {4}, Device::Cuda(0))}) {
    EXPECT_THAT(result.status(), StatusIs(absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(result.status().message(), HasSubstr("cuda:0"));
  }
}

// ---- CopyTensor. --------------------------------------------------------------

// A view with the given shape over a larger, padded buffer whose dimensions
// are laid out in a random order: a mix of transposes and slices.
struct StridedBuffer {
  std::vector<unsigned char> bytes;
  Tensor view;
};

StridedBuffer RandomLayout(DType dtype, const std::vector<int64_t>& shape, std::mt19937& rng,
                           unsigned char garbage) {
  const size_t rank = shape.size();
  std::vector<int64_t> padded(rank), order(rank), strides(rank), start(rank);
  for (size_t d = 0; d < rank; ++d) padded[d] = shape[d] + static_cast<int64_t>(rng() % 3);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  int64_t running = 1;
  for (size_t i = rank; i-- > 0;) {
    strides[order[i]] = running;
    running *= std::max<int64_t>(padded[order[i]], 1);
  }
  int64_t offset = 0;
  for (size_t d = 0; d < rank; ++d) {
    // An empty dim keeps offset 0 so the view never points past the buffer.
    start[d] = shape[d] == 0
                   ? 0
                   : static_cast<int64_t>(rng() % static_cast<uint64_t>(padded[d] - shape[d] + 1));
    offset += start[d] * strides[d];
  }
  StridedBuffer out;
  const size_t es = ElementSize(dtype);
  out.bytes.assign(static_cast<size_t>(running) * es + es, garbage);
  auto view = Tensor::Create(out.bytes.data() + offset * es, dtype, shape, strides, Device::Cpu());
  MESH_CHECK(view.ok(), "RandomLayout built an invalid view");
  out.view = *view;
  return out;
}

// Calls f(offset_a, offset_b) in elements for every logical index.
template <typename F>
void ForEachIndex(const Tensor& a, const Tensor& b, F f) {
  if (a.numel() == 0) return;
  std::vector<int64_t> index(a.dim(), 0);
  while (true) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < a.dim(); ++d) {
      oa += index[d] * a.stride(d);
      ob += index[d] * b.stride(d);
    }
    f(oa, ob);
    int d = a.dim() - 1;
    for (; d >= 0; --d) {
      if (++index[d] < a.size(d)) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

TEST(CopyTensor, AnyStridesOnBothSidesForEveryElementSize) {
  std::mt19937 rng(20240611);
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {1}, {7}, {2, 3}, {3, 0, 2}, {5, 1, 4}, {2, 3, 5, 7}, {1, 1, 1}, {11, 13}};
  int checked = 0;
  for (DType dtype : {DType::kUInt8, DType::kFloat16, DType::kFloat32, DType::kFloat64}) {
    const size_t es = ElementSize(dtype);
    for (const auto& shape : shapes) {
      for (int trial = 0; trial < 8; ++trial) {
        StridedBuffer src = RandomLayout(dtype, shape, rng, 0);
        StridedBuffer dst = RandomLayout(dtype, shape, rng, 0xEE);
        // Distinct, non-garbage bytes in every source byte.
        for (size_t i = 0; i < src.bytes.size(); ++i) {
          src.bytes[i] = static_cast<unsigned char>(i % 251);
        }
        ASSERT_TRUE(CopyTensor(dst.view, src.view).ok()) << dst.view << " <- " << src.view;

        std::vector<bool> written(dst.bytes.size(), false);
        const auto* d0 = static_cast<const unsigned char*>(dst.view.data());
        const auto* s0 = static_cast<const unsigned char*>(src.view.data());
        ForEachIndex(dst.view, src.view, [&](int64_t od, int64_t os) {
          ASSERT_EQ(std::memcmp(d0 + od * es, s0 + os * es, es), 0)
              << dst.view << " <- " << src.view;
          for (size_t b = 0; b < es; ++b) written[(d0 - dst.bytes.data()) + od * es + b] = true;
        });
        for (size_t i = 0; i < dst.bytes.size(); ++i) {
          if (!written[i]) {
            ASSERT_EQ(dst.bytes[i], 0xEE) << "byte " << i << " of " << dst.view;
          }
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 4 * 10 * 8);
}

TEST(CopyTensor, ReadsBroadcastSources) {
  const float row[3] = {1, 2, 3};
  auto src =
      Tensor::Create(const_cast<float*>(row), DType::kFloat32, {2, 3}, {0, 1}, Device::Cpu());
  ASSERT_TRUE(src.ok());
  float out[6] = {};
  ASSERT_TRUE(CopyTensor(Tensor::Contiguous(out, DType::kFloat32, {2, 3}), *src).ok());
  EXPECT_THAT(out, ElementsAre(1, 2, 3, 1, 2, 3));
}

TEST(CopyTensor, RejectsMismatchesAndAliasingDestinations) {
  float a[6] = {}, b[6] = {};
  Tensor fa = Tensor::Contiguous(a, DType::kFloat32, {2, 3});
  absl::Status s = CopyTensor(fa, Tensor::Contiguous(b, DType::kInt32, {2, 3}));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("dtype mismatch: dst is float32, src is int32"));

  s = CopyTensor(fa, Tensor::Contiguous(b, DType::kFloat32, {3, 2}));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("shape mismatch: dst is [2, 3], src is [3, 2]"));

  s = CopyTensor(fa, Tensor::Contiguous(b, DType::kFloat32, {6}));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));

  auto broadcast = Tensor::Create(a, DType::kFloat32, {2, 3}, {0, 1}, Device::Cpu());
  ASSERT_TRUE(broadcast.ok());
  s = CopyTensor(*broadcast, Tensor::Contiguous(b, DType::kFloat32, {2, 3}));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("stride 0 at dim 0"));
}

TEST(CopyTensor, SameViewIsANoOp) {
  float a[4] = {1, 2, 3, 4};
  Tensor t = Tensor::Contiguous(a, DType::kFloat32, {4});
  EXPECT_TRUE(CopyTensor(t, t).ok());
  EXPECT_THAT(a, ElementsAre(1, 2, 3, 4));
}

TEST(CopyTensor, AsyncOnCpuCopiesSynchronously) {
  int64_t a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {};
  auto transposed = Tensor::Create(a, DType::kInt64, {3, 2}, {1, 3}, Device::Cpu());
  ASSERT_TRUE(transposed.ok());
  ASSERT_TRUE(
      CopyTensorAsync(Tensor::Contiguous(b, DType::kInt64, {3, 2}), *transposed, nullptr).ok());
  EXPECT_THAT(b, ElementsAre(1, 4, 2, 5, 3, 6));
}

TEST(CopyTensor, CudaWithoutADevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible; see tensor_cuda_gpu_test";
  float host[4] = {};
  // A view of (pretend) device memory: no CUDA call is made to build it.
  float* fake_device = reinterpret_cast<float*>(uintptr_t{0x10000});
  Tensor device = Tensor::Contiguous(fake_device, DType::kFloat32, {4}, Device::Cuda(0));
  Tensor cpu = Tensor::Contiguous(host, DType::kFloat32, {4});
  EXPECT_THAT(CopyTensor(device, cpu), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(CopyTensor(cpu, device), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(CopyTensorAsync(device, cpu, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Nothing to copy: succeeds without touching CUDA.
  Tensor empty_device = Tensor::Contiguous(fake_device, DType::kFloat32, {0}, Device::Cuda(0));
  EXPECT_TRUE(CopyTensor(empty_device, Tensor::Contiguous(host, DType::kFloat32, {0})).ok());
  // The contiguity rule is checked before any device is needed.
  auto strided_device = Tensor::Create(fake_device, DType::kFloat32, {2}, {2}, Device::Cuda(0));
  ASSERT_TRUE(strided_device.ok());
  absl::Status s = CopyTensor(*strided_device, Tensor::Contiguous(host, DType::kFloat32, {2}));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(s.message(), HasSubstr("non-contiguous CUDA tensor"));
  auto strided_host = Tensor::Create(host, DType::kFloat32, {2}, {2}, Device::Cpu());
  ASSERT_TRUE(strided_host.ok());
  EXPECT_THAT(
      CopyTensorAsync(Tensor::Contiguous(fake_device, DType::kFloat32, {2}, Device::Cuda(0)),
                      *strided_host, nullptr),
      StatusIs(absl::StatusCode::kUnimplemented));
}

// ---- Fill. --------------------------------------------------------------------

TEST(Fill, WritesEveryDtype) {
  auto check = [](DType dtype, double value, auto expected) {
    using T = decltype(expected);
    auto t = Tensor::Empty(dtype, {5});
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(Fill(*t, value).ok()) << DTypeName(dtype);
    for (int i = 0; i < 5; ++i) {
      T got;
      std::memcpy(&got, t->data_as<char>() + i * sizeof(T), sizeof(T));
      EXPECT_TRUE(got == expected) << DTypeName(dtype) << " element " << i;
    }
  };
  check(DType::kFloat32, 1.5, 1.5f);
  check(DType::kFloat64, -0.1, -0.1);
  check(DType::kFloat16, 0.1, Float16::FromBits(0x2e66));
  check(DType::kBFloat16, 1.0, BFloat16::FromBits(0x3f80));
  check(DType::kInt8, -128, int8_t{-128});
  check(DType::kUInt8, 255, uint8_t{255});
  check(DType::kInt32, -7, int32_t{-7});
  check(DType::kInt64, 1e15, int64_t{1000000000000000});
  check(DType::kBool, 2.0, uint8_t{1});
  check(DType::kBool, 0.0, uint8_t{0});
  check(DType::kFloat32, 1e300, std::numeric_limits<float>::infinity());
  check(DType::kFloat32, -1e300, -std::numeric_limits<float>::infinity());
}

TEST(Fill, RejectsValuesTheDtypeCannotHold) {
  for (auto [dtype, value] : std::vector<std::pair<DType, double>>{
           {DType::kInt8, 128},
           {DType::kInt8, -129},
           {DType::kUInt8, -1},
           {DType::kUInt8, 256},
           {DType::kInt32, 0.5},
           {DType::kInt64, 9.3e18},
           {DType::kInt64, std::numeric_limits<double>::quiet_NaN()},
           {DType::kInt32, std::numeric_limits<double>::infinity()}}) {
    auto t = Tensor::Zeros(dtype, {2});
    ASSERT_TRUE(t.ok());
    absl::Status s = Fill(*t, value);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument))
        << DTypeName(dtype) << " " << value;
    EXPECT_THAT(s.message(), HasSubstr(std::string(DTypeName(dtype))));
  }
}

TEST(SpansOverlap, ComparesTheSpansFromFirstToLastElement) {
  int32_t buffer[12] = {};
  Tensor all = Tensor::Contiguous(buffer, DType::kInt32, {3, 4});
  auto row0 = all.Narrow(0, 0, 1);
  auto row1 = all.Narrow(0, 1, 1);
  auto rows01 = all.Narrow(0, 0, 2);
  auto col0 = all.Narrow(1, 0, 1);
  auto col3 = all.Narrow(1, 3, 1);
  auto none = all.Narrow(0, 1, 0);
  ASSERT_TRUE(row0.ok() && row1.ok() && rows01.ok() && col0.ok() && col3.ok() && none.ok());
  EXPECT_TRUE(SpansOverlap(all, all));
  EXPECT_TRUE(SpansOverlap(*rows01, *row1));
  EXPECT_FALSE(SpansOverlap(*row0, *row1));  // Adjacent, not overlapping.
  EXPECT_FALSE(SpansOverlap(*row1, *row0));
  // Interleaved columns share no element, but their spans cross.
  EXPECT_TRUE(SpansOverlap(*col0, *col3));
  EXPECT_FALSE(SpansOverlap(*none, all));
  Tensor elsewhere(buffer, DType::kInt32, {3, 4}, {4, 1}, Device::Cuda(0));
  EXPECT_FALSE(SpansOverlap(all, elsewhere));  // Another device's memory.
}

TEST(Fill, TouchesOnlyTheView) {
  int32_t buffer[12] = {};
  Tensor all = Tensor::Contiguous(buffer, DType::kInt32, {3, 4});
  auto cols = all.Narrow(1, 1, 2);
  ASSERT_TRUE(cols.ok());
  ASSERT_TRUE(Fill(*cols, 9).ok());
  EXPECT_THAT(buffer, ElementsAre(0, 9, 9, 0, 0, 9, 9, 0, 0, 9, 9, 0));
}

}  // namespace tensor_test
}  // namespace mesh
