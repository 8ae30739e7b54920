// The Runtime's NCCL backend against an in-process coordinator, world of one.
// Without a CUDA device, Init must fail promptly with a clear error; with
// one (label gpu), the world group and a 1-D mesh all-reduce on cuda:0.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mesh/build_info.h"
#include "mesh/runtime.h"
#include "mesh/tensor.h"
#include "tests/util/in_process_coordinator.h"

namespace mesh {
namespace runtime_nccl_test {

class RuntimeNcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator::CoordinatorConfig config = testing::InProcessCoordinator::DefaultConfig();
    // The service's own heartbeat defaults (1 s, 10 s).
    config.coordination = coordinator::CoordinationOptions();
    auto coordinator = testing::InProcessCoordinator::Start(config);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    ASSERT_TRUE(coordinator_->CreateJob("job", 1).ok());
  }

  RuntimeOptions Options(NcclWorldInit world_init = NcclWorldInit::kAuto) {
    RuntimeOptions options;
    options.env = nullptr;
    options.coordinator = coordinator_->address();
    options.job_id = "job";
    options.generation = 0;
    options.rank = 0;
    options.world_size = 1;
    options.host = "host-0";
    options.join_timeout = absl::Seconds(20);
    options.rpc_timeout = absl::Seconds(5);
    NcclBackendOptions nccl;
    nccl.init_timeout = absl::Seconds(60);
    nccl.world_init = world_init;
    options.backend = NcclBackend(nccl);
    return options;
  }

  std::unique_ptr<testing::InProcessCoordinator> coordinator_;
};

TEST_F(RuntimeNcclTest, WithoutADeviceInitFailsWithAClearError) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Init(Options());
  ASSERT_FALSE(runtime.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // UNIMPLEMENTED in builds without NCCL; otherwise the missing device.
  EXPECT_THAT(
      runtime.status().code(),
      ::testing::AnyOf(absl::StatusCode::kFailedPrecondition, absl::StatusCode::kUnimplemented,
                       absl::StatusCode::kUnavailable, absl::StatusCode::kInternal))
      << runtime.status();
  std::printf("Init without a device: %s\n", runtime.status().ToString().c_str());
}

// The world communicator from one root (ncclCommInitRankConfig, the
// default for a small world) or through ncclCommInitRankScalable, which
// large worlds use (NcclWorldInit::kScalable forces it here: one root).
class RuntimeNcclWorldTest : public RuntimeNcclTest,
                             public ::testing::WithParamInterface<NcclWorldInit> {};

TEST_P(RuntimeNcclWorldTest, WorldOfOneAllReducesOnCuda0) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Init(Options(GetParam()));
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  EXPECT_EQ((*runtime)->info().world_unique_id.size(), 128u);

  absl::StatusOr<DeviceMesh> mesh = (*runtime)->InitDeviceMesh({1}, {"dp"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto group = mesh->GetGroup("dp");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->backend(), "nccl");

  absl::StatusOr<Tensor> device = Tensor::Empty(DType::kFloat32, {1024}, Device::Cuda(0));
  ASSERT_TRUE(device.ok()) << device.status();
  ASSERT_TRUE(Fill(*device, 3.0).ok());
  auto work = (*group)->AllReduce(*device, ReduceOp::kSum);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_TRUE(SynchronizeWork(**work, absl::Seconds(60)).ok());

  std::vector<float> host(1024, -1.0f);
  ASSERT_TRUE(CopyTensor(Tensor::Contiguous(host.data(), DType::kFloat32, {1024}), *device).ok());
  for (float v : host) ASSERT_EQ(v, 3.0f);
  EXPECT_TRUE((*runtime)->Shutdown().ok());
}

INSTANTIATE_TEST_SUITE_P(WorldInit, RuntimeNcclWorldTest,
                         ::testing::Values(NcclWorldInit::kAuto, NcclWorldInit::kScalable),
                         [](const ::testing::TestParamInfo<NcclWorldInit>& info) {
                           return info.param == NcclWorldInit::kAuto ? "OneRoot" : "Scalable";
                         });

}  // namespace runtime_nccl_test
}  // namespace mesh
