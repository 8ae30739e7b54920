// ElasticMesh (mesh/elastic_mesh.h) with ranks as threads on real Gloo
// groups and an in-process coordinator whose job recovers in place: a
// (4, 1) dp x tp job loses rank 2, the others carry on as 3 replicas, and a
// new process for rank 2 takes the state from a peer and brings the mesh
// back to 4.
#include "mesh/elastic_mesh.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/job_layout.h"
#include "mesh/process_group_gloo.h"
#include "mesh/runtime.h"
#include "tests/util/in_process_coordinator.h"
#include "tests/util/proc.h"
#include "tests/util/status_matchers.h"

namespace mesh {
namespace {

using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kWorld = 4;
// Every member stops at this step; with the state transferred at each
// rebuild, every member reaches it.
constexpr int64_t kFinalStep = 60;

// What one rank saw at each step it committed.
struct Committed {
  int64_t step = 0;
  int64_t replicas = 0;
  float sum = 0;
  bool derived = false;  // ElasticMesh::membership_derived() at the commit.
};

class ElasticMeshTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto coordinator =
        testing::InProcessCoordinator::Start(absl::Milliseconds(50), absl::Milliseconds(1000));
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    coordinator::JobLayout layout;
    layout.job_id = "job";
    layout.world_size = kWorld;
    layout.mesh_shape = {kWorld, 1};
    layout.mesh_dim_names = {"dp", "tp"};
    layout.in_place = true;
    layout.in_place_dim = "dp";
    ASSERT_TRUE(coordinator_->CreateJob(layout).ok());
  }

  RuntimeOptions Options(int rank, const std::string& job = "job", int world = kWorld) {
    RuntimeOptions options;
    options.env = nullptr;
    options.coordinator = coordinator_->address();
    options.job_id = job;
    options.generation = 0;
    options.rank = rank;
    options.world_size = world;
    options.host = absl::StrCat("host-", rank);
    options.join_timeout = absl::Seconds(20);
    options.rpc_timeout = absl::Seconds(5);
    options.group_options.timeout = absl::Seconds(20);
    GlooOptions gloo;
    gloo.hostname = "127.0.0.1";
    options.backend = GlooBackend(gloo);
    return options;
  }

  // Every rank of `job` (of `world` ranks) joins at once, each on a thread
  // (Join waits for the whole world). Null where a rank's Init failed, with
  // the failure recorded.
  std::vector<std::unique_ptr<Runtime>> InitAll(const std::string& job = "job",
                                                int world = kWorld) {
    std::vector<std::unique_ptr<Runtime>> runtimes(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        auto rt = Runtime::Init(Options(r, job, world));
        EXPECT_TRUE(rt.ok()) << "rank " << r << ": " << rt.status();
        if (rt.ok()) runtimes[r] = *std::move(rt);
      });
    }
    for (auto& t : threads) t.join();
    return runtimes;
  }

  // The step loop of one rank: Sync, then an all-reduce of ones over "dp";
  // a step whose collective failed is not committed. Stops at kFinalStep,
  // after `die_after` commits (then reports an error, as a crashing rank
  // would be noticed), or when the deadline passes.
  absl::Status Train(Runtime& rt, std::vector<Committed>& log, int die_after = -1,
                     int64_t* first_step = nullptr) {
    std::vector<float> weights(4, 0.0f);
    int64_t step = 0;
    ElasticMeshOptions options;
    options.timeout = absl::Seconds(20);
    options.state = [&]() -> absl::StatusOr<std::vector<Tensor>> {
      return std::vector<Tensor>{Tensor::Contiguous(weights.data(), DType::kFloat32, {4}),
                                 Tensor::Contiguous(&step, DType::kInt64, {1})};
    };
    absl::StatusOr<std::unique_ptr<ElasticMesh>> elastic = ElasticMesh::Create(rt, options);
    if (!elastic.ok()) return elastic.status();
    if (first_step != nullptr) *first_step = step;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    int commits = 0;
    while (step < kFinalStep && absl::Now() < deadline) {
      absl::StatusOr<bool> changed = (*elastic)->Sync();
      if (!changed.ok()) return changed.status();
      if (!(*elastic)->is_member()) continue;
      absl::StatusOr<std::shared_ptr<ProcessGroup>> dp = (*elastic)->mesh().GetGroup("dp");
      if (!dp.ok()) return dp.status();
      // Owned by the tensor, which the op holds: a step abandoned on an
      // error never leaves the op writing into freed memory.
      absl::StatusOr<Tensor> ones = Tensor::Empty(DType::kFloat32, {4});
      if (!ones.ok()) return ones.status();
      if (absl::Status s = Fill(*ones, 1.0); !s.ok()) return s;
      absl::StatusOr<ProcessGroup::WorkPtr> work = (*dp)->AllReduce(*ones, ReduceOp::kSum);
      if (!work.ok() || !(*work)->Wait(absl::Seconds(20)).ok()) continue;
      const float* sum = ones->data_as<float>();
      for (int i = 0; i < 4; ++i) weights[i] += sum[i];
      ++step;
      log.push_back(
          Committed{step, (*elastic)->replicas(), sum[0], (*elastic)->membership_derived()});
      if (++commits == die_after) {
        (void)rt.ReportError("rank 2 crashed on purpose");
        return absl::OkStatus();
      }
      // Room for the membership to change between steps.
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (step < kFinalStep) return absl::DeadlineExceededError(absl::StrCat("at step ", step));
    return absl::OkStatus();
  }

  std::unique_ptr<testing::InProcessCoordinator> coordinator_;
};

TEST_F(ElasticMeshTest, SurvivorsCarryOnAsThreeReplicasAndTheReplacementTakesTheState) {
  std::vector<std::unique_ptr<Runtime>> runtimes = InitAll();
  for (int r = 0; r < kWorld; ++r) ASSERT_NE(runtimes[r], nullptr) << r;
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(runtimes[r]->info().in_place);

  std::vector<std::vector<Committed>> logs(kWorld);
  std::vector<absl::Status> results(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = Train(*runtimes[r], logs[r], /*die_after=*/r == 2 ? 5 : -1); });
  }
  threads[2].join();
  ASSERT_TRUE(results[2].ok()) << results[2];
  runtimes[2].reset();  // The crashed process is gone.

  // The replacement: a new process (incarnation) for rank 2, once the
  // others run as three replicas.
  ASSERT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        auto info = coordinator_->coordination().GetJob("job");
        return info.ok() && info->membership_epoch >= 1;
      },
      absl::Seconds(20)))
      << "the coordinator never lost the rank";
  absl::SleepFor(absl::Milliseconds(200));
  auto replacement = Runtime::Init(Options(2));
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  EXPECT_GE((*replacement)->info().membership_epoch, 2) << "joined as a returning rank";
  std::vector<Committed> new_log;
  int64_t first_step = -1;
  absl::Status new_result = Train(**replacement, new_log, -1, &first_step);
  for (int r : {0, 1, 3}) threads[r].join();
  ASSERT_TRUE(new_result.ok()) << new_result;
  for (int r : {0, 1, 3}) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];

  // The replacement started from a peer's step, not from 0.
  EXPECT_GT(first_step, 5);
  // Each survivor: 4 replicas, then 3, then 4 again; every commit's sum is
  // the replica count it saw.
  for (int r : {0, 1, 3}) {
    const std::vector<Committed>& log = logs[r];
    ASSERT_FALSE(log.empty());
    EXPECT_EQ(log.back().step, kFinalStep);
    bool saw_three = false;
    bool back_to_four = false;
    for (const Committed& c : log) {
      EXPECT_EQ(c.sum, static_cast<float>(c.replicas)) << "rank " << r << " step " << c.step;
      if (c.replicas == 3) {
        saw_three = true;
        // The survivors' membership is the four's without rank 2 (NCCL:
        // ncclCommShrink), not a new one.
        EXPECT_TRUE(c.derived) << "rank " << r << " step " << c.step;
      }
      if (saw_three && c.replicas == 4) back_to_four = true;
    }
    EXPECT_TRUE(saw_three) << "rank " << r;
    EXPECT_TRUE(back_to_four) << "rank " << r;
  }
  ASSERT_FALSE(new_log.empty());
  EXPECT_EQ(new_log.back().step, kFinalStep);
  for (const Committed& c : new_log) EXPECT_EQ(c.replicas, 4);
  // The replacement is a new process: everyone made a new membership.
  EXPECT_FALSE(new_log.front().derived);
  for (int r : {0, 1, 3}) EXPECT_TRUE(runtimes[r]->Shutdown().ok());
  EXPECT_TRUE((*replacement)->Shutdown().ok());
}

// A (4, 2) dp x tp job: when rank 5 dies, replica 2 (ranks 4 and 5) is
// broken. Ranks 0-3 and 6-7 carry on as three replicas while rank 4 waits
// outside the mesh; the replacement for rank 5 makes replica 2 whole again,
// and both of its ranks take the state.
TEST_F(ElasticMeshTest, ATensorParallelReplicaDropsOutWholeAndComesBackWhole) {
  constexpr int kRanks = 8;
  coordinator::JobLayout layout;
  layout.job_id = "job42";
  layout.world_size = kRanks;
  layout.mesh_shape = {4, 2};
  layout.mesh_dim_names = {"dp", "tp"};
  layout.in_place = true;
  ASSERT_TRUE(coordinator_->CreateJob(layout).ok());
  std::vector<std::unique_ptr<Runtime>> runtimes = InitAll("job42", kRanks);
  for (int r = 0; r < kRanks; ++r) ASSERT_NE(runtimes[r], nullptr) << r;

  std::vector<std::vector<Committed>> logs(kRanks);
  std::vector<absl::Status> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = Train(*runtimes[r], logs[r], /*die_after=*/r == 5 ? 5 : -1); });
  }
  threads[5].join();
  ASSERT_TRUE(results[5].ok()) << results[5];
  runtimes[5].reset();
  ASSERT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        auto info = coordinator_->coordination().GetJob("job42");
        return info.ok() && info->membership_epoch >= 1;
      },
      absl::Seconds(20)))
      << "the coordinator never lost the rank";
  absl::SleepFor(absl::Milliseconds(300));
  auto replacement = Runtime::Init(Options(5, "job42", kRanks));
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  std::vector<Committed> new_log;
  int64_t first_step = -1;
  const absl::Status new_result = Train(**replacement, new_log, -1, &first_step);
  for (int r = 0; r < kRanks; ++r) {
    if (r != 5) {
      threads[r].join();
    }
  }
  ASSERT_TRUE(new_result.ok()) << new_result;
  for (int r = 0; r < kRanks; ++r) {
    if (r != 5) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    }
  }
  EXPECT_GT(first_step, 5);
  for (int r = 0; r < kRanks; ++r) {
    if (r == 5) continue;
    bool three = false;
    for (const Committed& c : logs[r]) {
      EXPECT_EQ(c.sum, static_cast<float>(c.replicas)) << "rank " << r << " step " << c.step;
      if (c.replicas == 3) three = true;
    }
    // Rank 4 waited outside the mesh while the others ran as three.
    EXPECT_EQ(three, r != 4) << "rank " << r;
    EXPECT_EQ(logs[r].back().step, kFinalStep) << "rank " << r;
    EXPECT_EQ(logs[r].back().replicas, 4) << "rank " << r;
  }
  // Rank 4 skipped the steps of the three replicas: it took the state.
  int64_t previous = 0;
  bool jumped = false;
  for (const Committed& c : logs[4]) {
    if (c.step > previous + 1) jumped = true;
    previous = c.step;
  }
  EXPECT_TRUE(jumped);
  for (int r = 0; r < kRanks; ++r) {
    if (r != 5) {
      EXPECT_TRUE(runtimes[r]->Shutdown().ok());
    }
  }
  EXPECT_TRUE((*replacement)->Shutdown().ok());
}

// The members agree on deriving the next membership: rank 3 drops its
// ElasticMesh (and with it the membership it held) and makes a new one in
// the same process, so the membership's ranks and incarnations are the same
// as before, yet rank 3 holds nothing to derive from. Ranks 0-2 must then
// start a new membership with it rather than derive theirs (with NCCL, a
// shrink or share of a communicator rank 3 no longer has would hang).
TEST_F(ElasticMeshTest, AMemberWithoutTheMembershipMakesEveryoneStartANewOne) {
  std::vector<std::unique_ptr<Runtime>> runtimes = InitAll();
  for (int r = 0; r < kWorld; ++r) ASSERT_NE(runtimes[r], nullptr) << r;
  ElasticMeshOptions options;
  options.timeout = absl::Seconds(20);
  std::vector<int> derived(kWorld, -1);
  std::vector<absl::Status> results(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<ElasticMesh>> em = ElasticMesh::Create(*runtimes[r], options);
      if (!em.ok()) {
        results[r] = em.status();
        return;
      }
      if (r == 3) {
        absl::SleepFor(absl::Milliseconds(100));
        em->reset();  // Its groups close; the others' next collective fails.
        em = ElasticMesh::Create(*runtimes[r], options);
        if (!em.ok()) {
          results[r] = em.status();
          return;
        }
        derived[r] = (*em)->membership_derived();
        return;
      }
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (absl::Now() < deadline) {
        absl::StatusOr<bool> changed = (*em)->Sync();
        if (!changed.ok()) {
          results[r] = changed.status();
          return;
        }
        if ((*em)->round() >= 2) {
          derived[r] = (*em)->membership_derived();
          return;
        }
        absl::SleepFor(absl::Milliseconds(10));
      }
      results[r] = absl::DeadlineExceededError("no second round");
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    EXPECT_EQ(derived[r], 0) << "rank " << r;
  }
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(runtimes[r]->Shutdown().ok());
}

TEST_F(ElasticMeshTest, ACollectiveOfTheOldEpochFailsFastNamingTheLostRank) {
  std::vector<std::unique_ptr<Runtime>> runtimes = InitAll();
  for (int r = 0; r < kWorld; ++r) ASSERT_NE(runtimes[r], nullptr);
  // The world group of every rank (collective), then ranks 0, 1 and 3 enter
  // an all-reduce that rank 2 never will: it fails instead.
  std::vector<std::shared_ptr<ProcessGroup>> worlds(kWorld);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        auto world = runtimes[r]->World();
        if (world.ok()) worlds[r] = *std::move(world);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < kWorld; ++r) ASSERT_NE(worlds[r], nullptr);
  std::vector<absl::StatusOr<Tensor>> data;
  std::vector<ProcessGroup::WorkPtr> works;
  for (int r : {0, 1, 3}) {
    data.push_back(Tensor::Empty(DType::kFloat32, {4}));
    ASSERT_TRUE(data.back().ok());
    absl::StatusOr<ProcessGroup::WorkPtr> work = worlds[r]->AllReduce(*data.back(), ReduceOp::kSum);
    ASSERT_TRUE(work.ok()) << work.status();
    works.push_back(*std::move(work));
  }
  const absl::Time lost_at = absl::Now();
  ASSERT_TRUE(runtimes[2]->ReportError("CUDA error: an illegal memory access").ok());
  for (const ProcessGroup::WorkPtr& work : works) {
    // The group's op timeout is 20 s: only the Runtime's abort ends it this
    // soon, once a heartbeat (every 50 ms) names the lost rank.
    // Mostly the coordinator's reason; a peer's closed connection may be
    // noticed first, when it names the rank as its peer.
    const absl::Status status = work->Wait(absl::Seconds(10));
    if (status.code() == absl::StatusCode::kAborted) {
      EXPECT_THAT(std::string(status.message()), HasSubstr("rank 2 (host-2) failed: CUDA error"));
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      EXPECT_THAT(std::string(status.message()), HasSubstr("world rank 2"));
    }
  }
  EXPECT_LT(absl::Now() - lost_at, absl::Seconds(5));
  // The survivors stay healthy: only the groups with the lost rank end.
  for (int r : {0, 1, 3}) EXPECT_TRUE(runtimes[r]->health().ok()) << runtimes[r]->health();
  for (int r : {0, 1, 3}) EXPECT_TRUE(runtimes[r]->Shutdown().ok());
}

TEST_F(ElasticMeshTest, CreateNamesWhatIsWrong) {
  std::vector<std::unique_ptr<Runtime>> runtimes = InitAll();
  for (int r = 0; r < kWorld; ++r) ASSERT_NE(runtimes[r], nullptr);
  ElasticMeshOptions options;
  options.dim = "pp";
  EXPECT_THAT(ElasticMesh::Create(*runtimes[0], options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no dim 'pp'")));
  options.dim = "dp";
  options.timeout = absl::ZeroDuration();
  EXPECT_THAT(ElasticMesh::Create(*runtimes[0], options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
  for (auto& rt : runtimes) EXPECT_TRUE(rt->Shutdown().ok());

  // A job that restarts every rank on a failure has no use for it.
  ASSERT_TRUE(coordinator_->CreateJob("plain", 1, {1}, {"dp"}).ok());
  RuntimeOptions plain = Options(0);
  plain.job_id = "plain";
  plain.world_size = 1;
  auto alone = Runtime::Init(plain);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_THAT(ElasticMesh::Create(**alone).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in-place recovery")));
  EXPECT_TRUE((*alone)->Shutdown().ok());
}

}  // namespace
}  // namespace mesh
