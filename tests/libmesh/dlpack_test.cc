#include "mesh/dlpack.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "tests/util/status_matchers.h"

namespace mesh {
namespace dlpack_test {

using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int64_t> Vec(absl::Span<const int64_t> s) { return {s.begin(), s.end()}; }

// A DLPack producer written the way a foreign framework would: it owns its
// buffer, shape and strides in the manager context and counts deleter calls.
struct ForeignProducer {
  struct Context {
    std::vector<unsigned char> buffer;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    int* deletions;
    DLManagedTensor managed{};
  };

  // Returns a managed tensor over a fresh buffer of `bytes` bytes; strides
  // empty means strides == NULL.
  static DLManagedTensor* Make(int* deletions, DLDataType dtype, std::vector<int64_t> shape,
                               std::vector<int64_t> strides, size_t bytes,
                               DLDevice device = {kDLCPU, 0}, uint64_t byte_offset = 0) {
    auto* ctx = new Context{std::vector<unsigned char>(bytes), std::move(shape), std::move(strides),
                            deletions};
    for (size_t i = 0; i < ctx->buffer.size(); ++i) {
      ctx->buffer[i] = static_cast<unsigned char>(i);
    }
    DLTensor& dl = ctx->managed.dl_tensor;
    dl.data = ctx->buffer.data();
    dl.device = device;
    dl.ndim = static_cast<int32_t>(ctx->shape.size());
    dl.dtype = dtype;
    dl.shape = ctx->shape.data();
    dl.strides = ctx->strides.empty() ? nullptr : ctx->strides.data();
    dl.byte_offset = byte_offset;
    ctx->managed.manager_ctx = ctx;
    ctx->managed.deleter = [](DLManagedTensor* self) {
      auto* c = static_cast<Context*>(self->manager_ctx);
      ++*c->deletions;
      delete c;
    };
    return &ctx->managed;
  }
};

constexpr DLDataType kF32{kDLFloat, 32, 1};

// ---- Import. ------------------------------------------------------------------

TEST(FromDLPack, ImportsWithoutCopying) {
  int deletions = 0;
  DLManagedTensor* managed = ForeignProducer::Make(&deletions, kF32, {2, 3}, {3, 1}, 24);
  void* const data = managed->dl_tensor.data;
  auto t = FromDLPack(managed);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->data(), data);
  EXPECT_EQ(t->dtype(), DType::kFloat32);
  EXPECT_THAT(Vec(t->shape()), ElementsAre(2, 3));
  EXPECT_THAT(Vec(t->strides()), ElementsAre(3, 1));
  EXPECT_EQ(t->device(), Device::Cpu());
  EXPECT_NE(t->keep_alive(), nullptr);
  EXPECT_EQ(deletions, 0);
}

TEST(FromDLPack, DeleterRunsOnceWhenTheLastViewDies) {
  int deletions = 0;
  auto t = FromDLPack(ForeignProducer::Make(&deletions, kF32, {4, 4}, {}, 64));
  ASSERT_TRUE(t.ok());
  Tensor copy = *t;
  auto slice = t->Narrow(0, 1, 2);
  ASSERT_TRUE(slice.ok());
  t = Tensor();
  copy = Tensor();
  EXPECT_EQ(deletions, 0);                            // `slice` still holds the memory.
  EXPECT_EQ(slice->data_as<unsigned char>()[0], 16);  // Row 1 begins at byte 16.
  slice = Tensor();
  EXPECT_EQ(deletions, 1);
}

TEST(FromDLPack, NullStridesMeanRowMajor) {
  int deletions = 0;
  auto t = FromDLPack(ForeignProducer::Make(&deletions, kF32, {2, 3, 4}, {}, 96));
  ASSERT_TRUE(t.ok());
  EXPECT_THAT(Vec(t->strides()), ElementsAre(12, 4, 1));
  EXPECT_TRUE(t->is_contiguous());
}

TEST(FromDLPack, KeepsExplicitNonContiguousStrides) {
  int deletions = 0;
  auto t = FromDLPack(ForeignProducer::Make(&deletions, kF32, {3, 2}, {1, 3}, 24));
  ASSERT_TRUE(t.ok());
  EXPECT_THAT(Vec(t->strides()), ElementsAre(1, 3));
  EXPECT_FALSE(t->is_contiguous());
}

TEST(FromDLPack, HonoursByteOffset) {
  int deletions = 0;
  DLManagedTensor* managed =
      ForeignProducer::Make(&deletions, DLDataType{kDLInt, 32, 1}, {2}, {}, 32, {kDLCPU, 0}, 16);
  auto* base = static_cast<unsigned char*>(managed->dl_tensor.data);
  auto t = FromDLPack(managed);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->data(), base + 16);
  EXPECT_EQ(t->data_as<unsigned char>()[0], 16);
}

TEST(FromDLPack, ZeroDimScalar) {
  int deletions = 0;
  DLManagedTensor* managed = ForeignProducer::Make(&deletions, kF32, {}, {}, 4);
  managed->dl_tensor.shape = nullptr;  // Legal for ndim 0.
  auto t = FromDLPack(managed);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dim(), 0);
  EXPECT_EQ(t->numel(), 1);
}

TEST(FromDLPack, MapsDevices) {
  int deletions = 0;
  auto host = FromDLPack(ForeignProducer::Make(&deletions, kF32, {1}, {}, 4, {kDLCUDAHost, 0}));
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->device(), Device::Cpu());
  // Building a view of CUDA memory touches no device, so this runs anywhere.
  auto cuda = FromDLPack(ForeignProducer::Make(&deletions, kF32, {1}, {}, 4, {kDLCUDA, 3}));
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(cuda->device(), Device::Cuda(3));
}

TEST(FromDLPack, MapsDtypesIncludingBoolFromNewerProducers) {
  int deletions = 0;
  auto as_uint8 = FromDLPack(ForeignProducer::Make(&deletions, {kDLUInt, 8, 1}, {2}, {}, 2));
  ASSERT_TRUE(as_uint8.ok());
  EXPECT_EQ(as_uint8->dtype(), DType::kUInt8);  // DLPack 0.6 bool is indistinguishable.
  auto as_bool = FromDLPack(ForeignProducer::Make(&deletions, {6, 8, 1}, {2}, {}, 2));
  ASSERT_TRUE(as_bool.ok()) << as_bool.status();
  EXPECT_EQ(as_bool->dtype(), DType::kBool);  // kDLBool of DLPack >= 0.8.
  auto bf16 = FromDLPack(ForeignProducer::Make(&deletions, {kDLBfloat, 16, 1}, {2}, {}, 4));
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->dtype(), DType::kBFloat16);
}

TEST(FromDLPack, NullDeleterIsAllowed) {
  float x[2] = {1, 2};
  int64_t shape[1] = {2};
  DLManagedTensor managed{};
  managed.dl_tensor = DLTensor{x, {kDLCPU, 0}, 1, kF32, shape, nullptr, 0};
  auto t = FromDLPack(&managed);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->data(), x);
}

TEST(FromDLPack, RejectsNull) {
  EXPECT_THAT(FromDLPack(nullptr).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

struct RejectCase {
  const char* name;
  DLDataType dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLDevice device;
  const char* message;
};

class FromDLPackRejects : public ::testing::TestWithParam<RejectCase> {};

TEST_P(FromDLPackRejects, WithAClearErrorAndRunsTheDeleterAtOnce) {
  const RejectCase& c = GetParam();
  int deletions = 0;
  absl::Status s =
      FromDLPack(ForeignProducer::Make(&deletions, c.dtype, c.shape, c.strides, 64, c.device))
          .status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr(c.message));
  EXPECT_EQ(deletions, 1);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FromDLPackRejects,
    ::testing::Values(
        RejectCase{"rocm", kF32, {2}, {}, {kDLROCM, 0}, "unsupported device type kDLROCM (10)"},
        RejectCase{"metal", kF32, {2}, {}, {kDLMetal, 0}, "kDLMetal"},
        RejectCase{"managed", kF32, {2}, {}, {kDLCUDAManaged, 0}, "kDLCUDAManaged"},
        RejectCase{"negative_device", kF32, {2}, {}, {kDLCUDA, -1}, "negative CUDA device_id"},
        RejectCase{
            "complex", {kDLComplex, 64, 1}, {2}, {}, {kDLCPU, 0}, "unsupported DLPack dtype"},
        RejectCase{"uint16", {kDLUInt, 16, 1}, {2}, {}, {kDLCPU, 0}, "unsupported DLPack dtype"},
        RejectCase{"lanes", {kDLFloat, 32, 4}, {2}, {}, {kDLCPU, 0}, "lanes"},
        RejectCase{"bool_bits", {6, 1, 1}, {2}, {}, {kDLCPU, 0}, "unsupported DLPack dtype"},
        RejectCase{"negative_size", kF32, {2, -3}, {}, {kDLCPU, 0}, "negative size at dim 1"},
        RejectCase{"negative_stride", kF32, {2, 2}, {2, -1}, {kDLCPU, 0}, "negative stride"}),
    [](const ::testing::TestParamInfo<RejectCase>& info) { return std::string(info.param.name); });

TEST(FromDLPack, RejectsStructuralNonsense) {
  int deletions = 0;
  DLManagedTensor* no_shape = ForeignProducer::Make(&deletions, kF32, {2}, {}, 8);
  no_shape->dl_tensor.shape = nullptr;
  absl::Status s = FromDLPack(no_shape).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("shape is NULL"));
  EXPECT_EQ(deletions, 1);

  DLManagedTensor* negative_ndim = ForeignProducer::Make(&deletions, kF32, {2}, {}, 8);
  negative_ndim->dl_tensor.ndim = -1;
  EXPECT_THAT(FromDLPack(negative_ndim).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(deletions, 2);

  DLManagedTensor* no_data = ForeignProducer::Make(&deletions, kF32, {2}, {}, 8);
  no_data->dl_tensor.data = nullptr;
  s = FromDLPack(no_data).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("null data pointer"));
  EXPECT_EQ(deletions, 3);
}

// ---- Export and round trips. --------------------------------------------------

TEST(ToDLPack, DescribesTheTensor) {
  auto t = Tensor::Empty(DType::kBFloat16, {4, 6});
  ASSERT_TRUE(t.ok());
  auto cols = t->Narrow(1, 2, 3);
  ASSERT_TRUE(cols.ok());
  DLManagedTensorPtr managed(ToDLPack(*cols));
  ASSERT_NE(managed, nullptr);
  const DLTensor& dl = managed->dl_tensor;
  EXPECT_EQ(dl.data, cols->data());
  EXPECT_EQ(dl.byte_offset, 0u);
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  EXPECT_EQ(dl.device.device_id, 0);
  EXPECT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl.dtype.code, kDLBfloat);
  EXPECT_EQ(dl.dtype.bits, 16);
  EXPECT_EQ(dl.dtype.lanes, 1);
  EXPECT_THAT(std::vector<int64_t>(dl.shape, dl.shape + 2), ElementsAre(4, 3));
  ASSERT_NE(dl.strides, nullptr);
  EXPECT_THAT(std::vector<int64_t>(dl.strides, dl.strides + 2), ElementsAre(6, 1));
}

TEST(ToDLPack, CudaDeviceIsDescribed) {
  // A view of pretend device memory: exporting touches no device.
  Tensor t = Tensor::Contiguous(reinterpret_cast<void*>(uintptr_t{0x10000}), DType::kFloat32, {2},
                                Device::Cuda(1));
  DLManagedTensorPtr managed(ToDLPack(t));
  EXPECT_EQ(managed->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(managed->dl_tensor.device.device_id, 1);
}

TEST(ToDLPack, ExportKeepsOwnedMemoryAliveUntilTheConsumerDeletes) {
  std::weak_ptr<void> memory;
  DLManagedTensor* managed = nullptr;
  {
    auto t = Tensor::Empty(DType::kInt32, {16});
    ASSERT_TRUE(t.ok());
    memory = t->keep_alive();
    managed = ToDLPack(*t);
  }
  EXPECT_FALSE(memory.expired());
  static_cast<int32_t*>(managed->dl_tensor.data)[15] = 7;  // Still valid.
  managed->deleter(managed);
  EXPECT_TRUE(memory.expired());
}

TEST(DLPack, RoundTripOfEveryDtypeIsZeroCopyAndExact) {
  for (DType dtype : kAllDTypes) {
    auto t = Tensor::Empty(dtype, {3, 5});
    ASSERT_TRUE(t.ok());
    auto* bytes = t->data_as<unsigned char>();
    for (size_t i = 0; i < t->nbytes(); ++i) bytes[i] = static_cast<unsigned char>(i * 7);
    std::weak_ptr<void> memory = t->keep_alive();

    DLManagedTensor* managed = ToDLPack(*t);
    EXPECT_EQ(managed->dl_tensor.dtype.bits, ElementSize(dtype) * 8);
    auto back = FromDLPack(managed);
    ASSERT_TRUE(back.ok()) << DTypeName(dtype) << ": " << back.status();
    EXPECT_EQ(back->data(), t->data()) << DTypeName(dtype);
    // A libmesh export comes back with its exact dtype, bool included.
    EXPECT_EQ(back->dtype(), dtype) << DTypeName(dtype);
    EXPECT_THAT(Vec(back->shape()), ElementsAre(3, 5));
    EXPECT_THAT(Vec(back->strides()), ElementsAre(5, 1));
    EXPECT_EQ(back->device(), Device::Cpu());
    for (size_t i = 0; i < t->nbytes(); ++i) {
      ASSERT_EQ(back->data_as<unsigned char>()[i], static_cast<unsigned char>(i * 7));
    }
    t = Tensor();
    EXPECT_FALSE(memory.expired()) << "the import holds the export, which holds the memory";
    back = Tensor();
    EXPECT_TRUE(memory.expired()) << DTypeName(dtype);
  }
}

TEST(DLPack, BoolExportsAsUInt8) {
  auto t = Tensor::Zeros(DType::kBool, {4});
  ASSERT_TRUE(t.ok());
  DLManagedTensorPtr managed(ToDLPack(*t));
  EXPECT_EQ(managed->dl_tensor.dtype.code, kDLUInt);
  EXPECT_EQ(managed->dl_tensor.dtype.bits, 8);
}

TEST(DLPack, ForeignTensorSurvivesAReExportChainAndIsDeletedOnce) {
  int deletions = 0;
  DLManagedTensor* foreign = ForeignProducer::Make(&deletions, kF32, {8}, {}, 32);
  void* const data = foreign->dl_tensor.data;
  auto imported = FromDLPack(foreign);
  ASSERT_TRUE(imported.ok());
  DLManagedTensor* reexported = ToDLPack(*imported);
  imported = Tensor();
  EXPECT_EQ(deletions, 0);
  auto again = FromDLPack(reexported);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), data);
  EXPECT_EQ(deletions, 0);
  again = Tensor();
  EXPECT_EQ(deletions, 1);
}

TEST(DLPack, ManagedPtrCallsTheDeleter) {
  int deletions = 0;
  { DLManagedTensorPtr p(ForeignProducer::Make(&deletions, kF32, {1}, {}, 4)); }
  EXPECT_EQ(deletions, 1);
}

}  // namespace dlpack_test
}  // namespace mesh
