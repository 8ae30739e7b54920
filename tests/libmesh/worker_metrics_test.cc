// Worker metrics without a server: MeteredProcessGroup(Factory) over real
// Gloo groups (two ranks as threads, InMemoryStore, loopback TCP) recording
// into a TestRegistry, and the redistribute hook.
#include "libmesh/src/worker_metrics.h"

#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "libmesh/src/metrics_hooks.h"
#include "mesh/process_group_gloo.h"
#include "tests/common/test_metrics.h"
#include "tests/libmesh/process_group_gloo_test_util.h"

namespace mesh::internal {
namespace worker_metrics_test {

using gloo_test::OnRanks;
using gloo_test::TestOptions;
using metrics::testing::TestRegistry;

constexpr int kWorld = 2;

class WorkerMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = std::make_shared<TestRegistry>();
    metrics_ = std::make_shared<WorkerMetrics>(registry_);
    InMemoryStoreOptions store_options;
    store_options.timeout = gloo_test::kTestTimeout;
    auto store = std::make_shared<InMemoryStore>(store_options);
    for (int r = 0; r < kWorld; ++r) {
      auto factory = GlooProcessGroupFactory::Create(store, r, kWorld, TestOptions());
      ASSERT_TRUE(factory.ok()) << factory.status();
      factories_.push_back(std::make_shared<MeteredProcessGroupFactory>(
          std::shared_ptr<ProcessGroupFactory>(*std::move(factory)), metrics_));
    }
  }

  std::shared_ptr<TestRegistry> registry_;
  std::shared_ptr<WorkerMetrics> metrics_;
  std::vector<std::shared_ptr<MeteredProcessGroupFactory>> factories_;
};

TEST_F(WorkerMetricsTest, CollectivesRecordBytesAndDurationByOpAndBackend) {
  constexpr int kElements = 1000;
  std::vector<absl::Status> statuses(kWorld);
  OnRanks(kWorld, [&](int rank) {
    auto world = factories_[rank]->World();
    if (!world.ok()) {
      statuses[rank] = world.status();
      return;
    }
    // Shared, as the factory contract asks.
    auto again = factories_[rank]->World();
    EXPECT_EQ(again->get(), world->get());
    EXPECT_EQ((*world)->backend(), "gloo");
    EXPECT_EQ((*world)->size(), kWorld);
    EXPECT_EQ((*world)->rank(), rank);
    std::vector<float> data(kElements, static_cast<float>(rank + 1));
    Tensor tensor = Tensor::Contiguous(data.data(), DType::kFloat32, {kElements});
    auto work = (*world)->AllReduce(tensor, ReduceOp::kSum);
    if (!work.ok()) {
      statuses[rank] = work.status();
      return;
    }
    statuses[rank] = (*work)->Wait();
    // The decorator forwards: the sum is right.
    EXPECT_EQ(data[0], 3.0f);
    EXPECT_EQ(data[kElements - 1], 3.0f);
    // The out-of-place form is metered as all_reduce too.
    std::vector<float> out(kElements, -1.0f);
    Tensor output = Tensor::Contiguous(out.data(), DType::kFloat32, {kElements});
    auto oop = (*world)->AllReduce(tensor, output, ReduceOp::kMax);
    ASSERT_TRUE(oop.ok()) << oop.status();
    ASSERT_TRUE((*oop)->Wait().ok());
    EXPECT_EQ(out[0], 3.0f);
    EXPECT_EQ(data[0], 3.0f);
    // A refused op moves nothing and records nothing.
    EXPECT_FALSE((*world)->Broadcast(tensor, /*root=*/7).ok());
    // A barrier: its duration, zero bytes.
    auto barrier = (*world)->Barrier();
    ASSERT_TRUE(barrier.ok()) << barrier.status();
    EXPECT_TRUE((*barrier)->Wait().ok());
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(statuses[r].ok()) << r << ": " << statuses[r];

  // Both ranks record into the one registry: two all-reduces each, 4000
  // bytes and a duration per call.
  EXPECT_EQ(registry_->CounterValue("mesh_collective_bytes_total", {"all_reduce", "gloo"}),
            4.0 * kElements * sizeof(float));
  EXPECT_EQ(registry_->HistogramCount("mesh_collective_duration_seconds", {"all_reduce", "gloo"}),
            4u);
  EXPECT_GT(registry_->HistogramSum("mesh_collective_duration_seconds", {"all_reduce", "gloo"}),
            0.0);
  EXPECT_EQ(registry_->CounterValue("mesh_collective_bytes_total", {"broadcast", "gloo"}), 0);
  EXPECT_EQ(registry_->HistogramCount("mesh_collective_duration_seconds", {"broadcast", "gloo"}),
            0u);
  EXPECT_EQ(registry_->HistogramCount("mesh_collective_duration_seconds", {"barrier", "gloo"}), 2u);
  EXPECT_EQ(registry_->CounterValue("mesh_collective_bytes_total", {"barrier", "gloo"}), 0);
}

TEST_F(WorkerMetricsTest, GroupsFromNewGroupsAreMeteredToo) {
  std::vector<absl::Status> statuses(kWorld);
  OnRanks(kWorld, [&](int rank) {
    GroupSpec spec;
    spec.family = "pair";
    spec.global_ranks = {0, 1};
    auto groups = factories_[rank]->NewGroups({spec});
    if (!groups.ok()) {
      statuses[rank] = groups.status();
      return;
    }
    std::vector<int32_t> in(4, rank), out(8, -1);
    auto work = groups->at(0)->AllGather(Tensor::Contiguous(in.data(), DType::kInt32, {4}),
                                         Tensor::Contiguous(out.data(), DType::kInt32, {8}));
    if (!work.ok()) {
      statuses[rank] = work.status();
      return;
    }
    // Completion seen through IsCompleted (as SynchronizeWork polls).
    const absl::Time deadline = absl::Now() + gloo_test::kTestTimeout;
    while (!(*work)->IsCompleted() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    statuses[rank] = (*work)->status();
    EXPECT_THAT(out, ::testing::ElementsAre(0, 0, 0, 0, 1, 1, 1, 1));
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(statuses[r].ok()) << r << ": " << statuses[r];
  EXPECT_EQ(registry_->CounterValue("mesh_collective_bytes_total", {"all_gather", "gloo"}), 32);
  EXPECT_EQ(registry_->HistogramCount("mesh_collective_duration_seconds", {"all_gather", "gloo"}),
            2u);
}

TEST(RedistributeHookTest, CountsOnlyWhileATargetIsSet) {
  auto registry = std::make_shared<TestRegistry>();
  auto metrics = std::make_shared<WorkerMetrics>(registry);
  RecordRedistributeStep(RedistributeOp::kAllGather);  // off: nowhere to go
  SetHookMetrics(metrics);
  RecordRedistributeStep(RedistributeOp::kAllGather);
  RecordRedistributeStep(RedistributeOp::kAllGather);
  RecordRedistributeStep(RedistributeOp::kLocalSlice);
  SetHookMetrics(nullptr);
  RecordRedistributeStep(RedistributeOp::kAllGather);
  EXPECT_EQ(registry->CounterValue("mesh_redistribute_steps_total", {"all_gather"}), 2);
  EXPECT_EQ(registry->CounterValue("mesh_redistribute_steps_total", {"local_slice"}), 1);
  EXPECT_EQ(registry->CounterValue("mesh_redistribute_steps_total", {"all_to_all"}), 0);
  // Every op has its series from the start.
  EXPECT_EQ(registry->Children("mesh_redistribute_steps_total").size(), 6u);
}

}  // namespace worker_metrics_test
}  // namespace mesh::internal
