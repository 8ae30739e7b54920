// Hang diagnosis end to end: a real in-process coordinator on 127.0.0.1:0,
// three ranks as threads (each its own Runtime), Gloo over loopback TCP.
//
// One rank stays alive (its heartbeat thread keeps beating) but never
// enters its 6th all_reduce. The coordinator, seeing the others wait in
// all_reduce #6 that rank 1 never entered, fails the generation after the
// job's hang timeout; the waiting ranks' collectives end with ABORTED naming
// rank 1 and the op, within the timeout plus two heartbeat intervals (plus
// scheduling slack on a loaded machine). Ranks that compute for longer than
// the hang timeout between collectives are never flagged.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/job_layout.h"
#include "mesh/runtime.h"
#include "mesh/tensor.h"
#include "tests/util/in_process_coordinator.h"

namespace mesh {
namespace runtime_hang_test {

using ::testing::HasSubstr;

constexpr int kWorld = 3;
constexpr absl::Duration kInterval = absl::Milliseconds(100);
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(5);
constexpr absl::Duration kHangTimeout = absl::Seconds(2);
// Far beyond the hang timeout: a collective that fails by its own timeout
// means the diagnosis did not happen.
constexpr absl::Duration kCollectiveTimeout = absl::Seconds(60);
// Loaded CI machines delay threads by hundreds of milliseconds.
constexpr absl::Duration kSlack = absl::Seconds(2);

class RuntimeHangTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto coordinator = testing::InProcessCoordinator::Start(kInterval, kHeartbeatTimeout);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    coordinator::JobLayout layout;
    layout.job_id = "hang";
    layout.world_size = kWorld;
    layout.hang_timeout = kHangTimeout;
    ASSERT_TRUE(coordinator_->CreateJob(layout).ok());
  }

  RuntimeOptions Options(int rank) {
    RuntimeOptions options;
    options.env = nullptr;
    options.coordinator = coordinator_->address();
    options.job_id = "hang";
    options.generation = 0;
    options.rank = rank;
    options.world_size = kWorld;
    options.host = absl::StrCat("host-", rank);
    options.join_timeout = absl::Seconds(30);
    options.rpc_timeout = absl::Seconds(10);
    options.group_options.timeout = kCollectiveTimeout;
    GlooOptions gloo;
    gloo.hostname = "127.0.0.1";
    options.backend = GlooBackend(gloo);
    return options;
  }

  // Rank r's Runtime and its world group.
  void Join(int r, std::unique_ptr<Runtime>& runtime, std::shared_ptr<ProcessGroup>& world) {
    absl::StatusOr<std::unique_ptr<Runtime>> joined = Runtime::Init(Options(r));
    ASSERT_TRUE(joined.ok()) << "rank " << r << ": " << joined.status();
    runtime = *std::move(joined);
    absl::StatusOr<std::shared_ptr<ProcessGroup>> group = runtime->World();
    ASSERT_TRUE(group.ok()) << group.status();
    world = *std::move(group);
  }

  absl::Status AllReduceOnce(ProcessGroup& group) {
    float value = 1.0f;
    Tensor tensor = Tensor::Contiguous(&value, DType::kFloat32, {1});
    absl::StatusOr<ProcessGroup::WorkPtr> work = group.AllReduce(tensor, ReduceOp::kSum);
    if (!work.ok()) return work.status();
    return (*work)->Wait();
  }

  std::unique_ptr<testing::InProcessCoordinator> coordinator_;
};

TEST_F(RuntimeHangTest, ARankThatNeverEntersItsSixthAllReduceIsNamed) {
  absl::Notification release;  // Ends rank 1's "forever" when the test is done.
  std::vector<absl::Status> sixth(kWorld);
  std::vector<absl::Duration> waited(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Runtime> runtime;
      std::shared_ptr<ProcessGroup> world;
      ASSERT_NO_FATAL_FAILURE(Join(r, runtime, world));
      for (int i = 1; i <= 5; ++i) {
        ASSERT_TRUE(AllReduceOnce(*world).ok()) << "rank " << r << " all_reduce " << i;
      }
      if (r == 1) {
        // Alive but stuck outside the collective.
        release.WaitForNotificationWithTimeout(kCollectiveTimeout);
        return;
      }
      const absl::Time entered = absl::Now();
      sixth[r] = AllReduceOnce(*world);
      waited[r] = absl::Now() - entered;
    });
  }
  threads[0].join();
  threads[2].join();
  release.Notify();
  threads[1].join();

  for (int r : {0, 2}) {
    EXPECT_EQ(sixth[r].code(), absl::StatusCode::kAborted) << "rank " << r << ": " << sixth[r];
    EXPECT_THAT(sixth[r].message(), HasSubstr("rank 1 (host-1)"));
    EXPECT_THAT(sixth[r].message(), HasSubstr("hang in group 'world' (ranks 0-2)"));
    EXPECT_THAT(sixth[r].message(), HasSubstr("in all_reduce #6"));
    EXPECT_THAT(sixth[r].message(), HasSubstr("rank 1 never entered it (last: all_reduce #5"));
    EXPECT_GE(waited[r], kHangTimeout) << "rank " << r;
    EXPECT_LE(waited[r], kHangTimeout + 2 * kInterval + kSlack) << "rank " << r;
  }
}

TEST_F(RuntimeHangTest, ComputingLongerThanTheHangTimeoutBetweenCollectivesIsNotAHang) {
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Runtime> runtime;
      std::shared_ptr<ProcessGroup> world;
      ASSERT_NO_FATAL_FAILURE(Join(r, runtime, world));
      for (int step = 0; step < 2; ++step) {
        ASSERT_TRUE(AllReduceOnce(*world).ok()) << "rank " << r << " step " << step;
        // "Compute" for 1.5x the hang timeout, every rank alike.
        absl::SleepFor(kHangTimeout + kHangTimeout / 2);
      }
      EXPECT_TRUE(AllReduceOnce(*world).ok()) << "rank " << r;
      EXPECT_TRUE(runtime->health().ok()) << runtime->health();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(coordinator_->JobFailed("hang"));
}

}  // namespace runtime_hang_test
}  // namespace mesh
