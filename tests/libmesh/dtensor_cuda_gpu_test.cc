// Label gpu: DTensor with CUDA tensors over NCCL, a world of one on cuda:0
// (1-D and 2-D meshes of size 1), compared with the CPU reference; and the
// strided CUDA copies (cudaMemcpy2D) that pack and unpack Shard(d) blocks,
// which a world of one never makes non-contiguous. Skips without CUDA/NCCL
// in the build or without a visible device.
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "dtensor_test_util.h"
#include "mesh/build_info.h"
#include "mesh/dtensor.h"
#include "mesh/process_group_nccl.h"
#include "sharding/strided_copy.h"

namespace mesh {
namespace dtensor_cuda_gpu_test {

using dtensor_test::Describe;
using dtensor_test::Expected;
using dtensor_test::MakeGlobal;
using dtensor_test::SameValues;

constexpr Device kCuda0 = Device::Cuda(0);

Tensor Upload(const Tensor& host) {
  auto dev = Tensor::Empty(host.dtype(), host.shape(), kCuda0);
  EXPECT_TRUE(dev.ok()) << dev.status();
  EXPECT_TRUE(CopyTensor(*dev, host).ok());
  return *dev;
}

Tensor Download(const Tensor& dev) {
  auto host = Tensor::Empty(dev.dtype(), dev.shape());
  EXPECT_TRUE(host.ok()) << host.status();
  const absl::Status s = CopyTensor(*host, dev);
  EXPECT_TRUE(s.ok()) << s;
  return *host;
}

class DTensorCudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GetBuildInfo().has_cuda) GTEST_SKIP() << "built without CUDA";
    if (!GetBuildInfo().has_nccl) GTEST_SKIP() << "built without NCCL";
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  }

  // A world of one over NCCL and a mesh of `shape` (all ones) on it.
  DeviceMesh MakeMesh(std::vector<int64_t> shape) {
    NcclProcessGroupFactoryOptions options;
    options.world_rank = 0;
    options.world_size = 1;
    options.device = kCuda0;
    absl::StatusOr<std::string> id = GenerateNcclUniqueId();
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) options.world_unique_id = *id;
    options.init_timeout = absl::Seconds(60);
    options.group_options.timeout = absl::Seconds(60);
    options.destroy_timeout = absl::Seconds(10);
    auto factory = NcclProcessGroupFactory::Create(std::move(options));
    EXPECT_TRUE(factory.ok()) << factory.status();
    factory_ = std::shared_ptr<NcclProcessGroupFactory>(std::move(*factory));
    auto mesh = DeviceMesh::Init(factory_, shape);
    EXPECT_TRUE(mesh.ok()) << mesh.status();
    return *std::move(mesh);
  }

  std::shared_ptr<NcclProcessGroupFactory> factory_;
};

TEST_F(DTensorCudaGpuTest, StridedCopyOfAShardBlockIsExact) {
  // A [5, 7, 3] tensor's columns [2, 6) along dim 1 into a packed buffer and
  // back into another tensor at the same place.
  const Tensor host = MakeGlobal(DType::kFloat32, {5, 7, 3}, 3);
  const Tensor dev = Upload(host);
  auto box = dev.Narrow(1, 2, 4);
  ASSERT_TRUE(box.ok());
  auto packed = Tensor::Empty(DType::kFloat32, {5, 4, 3}, kCuda0);
  ASSERT_TRUE(packed.ok());
  ASSERT_TRUE(sharding::CopyStrided(*packed, *box).ok());
  auto host_box = Tensor::Empty(DType::kFloat32, {5, 4, 3});
  ASSERT_TRUE(CopyTensor(*host_box, *host.Narrow(1, 2, 4)).ok());
  EXPECT_TRUE(SameValues(Download(*packed), *host_box));
  auto back = Tensor::Zeros(DType::kFloat32, {5, 7, 3}, kCuda0);
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(sharding::CopyStrided(*back->Narrow(1, 2, 4), *packed).ok());
  const Tensor result = Download(*back);
  EXPECT_TRUE(SameValues(*result.Narrow(1, 2, 4), *host.Narrow(1, 2, 4)));
  EXPECT_EQ(gloo_test::Get(result, 0), 0.0);  // Outside the box: untouched.
}

TEST_F(DTensorCudaGpuTest, EveryTransitionOnAWorldOfOne) {
  for (const std::vector<int64_t>& mesh_shape :
       {std::vector<int64_t>{1}, std::vector<int64_t>{1, 1}}) {
    DeviceMesh mesh = MakeMesh(mesh_shape);
    const std::vector<Placement> per_dim = {Placement::Shard(0), Placement::Shard(1),
                                            Placement::Replicate(), Placement::Partial(),
                                            Placement::Partial(ReduceOp::kMax)};
    // Every valid combination. Partials that do not commute ([P(sum),
    // P(max)]) are invalid, and DistributeTensor must say so.
    std::vector<Placements> all;
    std::vector<Placements> candidates;
    for (const Placement& a : per_dim) {
      if (mesh_shape.size() == 1) {
        candidates.push_back({a});
        continue;
      }
      for (const Placement& b : per_dim) candidates.push_back({a, b});
    }
    for (const Placements& p : candidates) {
      if (ValidatePlacements(p, mesh.shape(), 2).ok()) {
        all.push_back(p);
        continue;
      }
      auto rejected = DistributeTensor(Upload(MakeGlobal(DType::kFloat32, {2, 2}, 1)), mesh, p);
      EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument)
          << PlacementsToString(p);
    }
    ASSERT_EQ(all.size(), mesh_shape.size() == 1 ? 5u : 23u);
    uint64_t seed = 0;
    for (DType dtype : {DType::kFloat32, DType::kInt32}) {
      for (const std::vector<int64_t>& shape :
           {std::vector<int64_t>{7, 5}, std::vector<int64_t>{3, 1}, std::vector<int64_t>{0, 4}}) {
        const Tensor global = MakeGlobal(dtype, shape, ++seed);
        const Tensor global_dev = Upload(global);
        for (const Placements& src : all) {
          for (int src_rank : {-1, 0}) {
            DistributeOptions options;
            options.src_rank = src_rank;
            auto x = DistributeTensor(global_dev, mesh, src, options);
            ASSERT_TRUE(x.ok()) << x.status();
            EXPECT_EQ(x->device(), kCuda0);
            EXPECT_TRUE(SameValues(Download(x->local()),
                                   Expected(global, mesh.shape(), src, mesh.GetCoordinate())));
          }
          auto x = DistributeTensor(global_dev, mesh, src);
          ASSERT_TRUE(x.ok()) << x.status();
          for (const Placements& dst : all) {
            auto y = Redistribute(*x, dst);
            ASSERT_TRUE(y.ok()) << Describe(shape, dtype, src, dst) << ": " << y.status();
            EXPECT_EQ(y->device(), kCuda0);
            EXPECT_TRUE(SameValues(Download(y->local()),
                                   Expected(global, mesh.shape(), dst, mesh.GetCoordinate())))
                << Describe(shape, dtype, src, dst);
            auto full = y->FullTensor();
            ASSERT_TRUE(full.ok()) << full.status();
            EXPECT_TRUE(SameValues(Download(*full), global)) << Describe(shape, dtype, src, dst);
          }
        }
      }
    }
  }
}

TEST_F(DTensorCudaGpuTest, FromLocalInfersAndVerifiesOnTheDevice) {
  DeviceMesh mesh = MakeMesh({1, 1});
  const Tensor global = MakeGlobal(DType::kFloat32, {6, 4}, 11);
  FromLocalOptions options;
  options.verify = true;
  auto x = DTensor::FromLocal(Upload(global), mesh, {Placement::Shard(0), Placement::Replicate()},
                              options);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->shape(), absl::Span<const int64_t>({6, 4}));
  auto full = x->FullTensor();
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_TRUE(SameValues(Download(*full), global));
}

}  // namespace dtensor_cuda_gpu_test
}  // namespace mesh
