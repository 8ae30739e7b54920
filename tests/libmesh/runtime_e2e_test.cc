// The worker runtime end to end: a real in-process coordinator on
// 127.0.0.1:0, four ranks as threads (each its own Runtime, explicit
// options), Gloo over loopback TCP. A 2x2 mesh all-reduces along each dim;
// a rank that hangs mid-collective, or reports an error, ends every other
// rank's pending collective within a few heartbeat intervals, naming it.
// Each case runs twice: the ranks calling the coordinator directly, and
// through two agents' rank relays (agent/rank_relay.h, one per host, as
// MESH_AGENT_SOCKET), whose batching must keep every one of these promises.
//
// Time bounds asserted here are not performance checks: each is far below
// the 60 s collective timeout the test configures, so exceeding one means a
// collective waited for its timeout instead of failing on the signal.
#include <sys/wait.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "agent/rank_relay.h"
#include "mesh/runtime.h"
#include "mesh/tensor.h"
#include "tests/util/in_process_coordinator.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace runtime_e2e_test {

using ::testing::HasSubstr;

constexpr int kWorld = 4;
constexpr absl::Duration kInterval = absl::Milliseconds(50);
constexpr absl::Duration kHeartbeatTimeout = absl::Milliseconds(300);
constexpr absl::Duration kCollectiveTimeout = absl::Seconds(60);
constexpr absl::Duration kPrompt = absl::Seconds(10);

enum class Path { kDirect, kThroughAgents };

class RuntimeE2eTest : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    auto coordinator = testing::InProcessCoordinator::Start(kInterval, kHeartbeatTimeout);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    ASSERT_TRUE(coordinator_->CreateJob("e2e", kWorld, {2, 2}, {"dp", "tp"}).ok());
    if (GetParam() == Path::kThroughAgents) {
      dir_ = testing::MakeTempDir("mesh-e2e-relay");
      for (int host = 0; host < 2; ++host) {
        agent::RankRelayOptions options;
        options.socket_path = absl::StrCat(dir_, "/relay-", host, ".sock");
        options.coordinator = coordinator_->address();
        auto relay = agent::RankRelay::Start(options);
        ASSERT_TRUE(relay.ok()) << relay.status();
        (*relay)->AddGeneration("e2e", 0, {2 * host, 2 * host + 1}, "");
        relays_.push_back(*std::move(relay));
      }
    }
  }

  void TearDown() override {
    for (auto& relay : relays_) {
      // Every rank went through its relay, which spoke for the node: one
      // JoinBatch for both ranks, or two when the second rank (a process
      // started later) came after the first's batching window.
      const agent::RankRelayStats stats = relay->stats();
      EXPECT_GT(stats.served, 0);
      EXPECT_GE(stats.join_batches, 1);
      EXPECT_LE(stats.join_batches, 2);
      relay->Shutdown();
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  RuntimeOptions Options(int rank) {
    RuntimeOptions options;
    options.env = nullptr;
    options.coordinator = coordinator_->address();
    if (!relays_.empty()) options.agent_socket = relays_[rank / 2]->socket_path();
    options.job_id = "e2e";
    options.generation = 0;
    options.rank = rank;
    options.world_size = kWorld;
    options.host = absl::StrCat("host-", rank / 2);  // Two ranks per host.
    options.join_timeout = absl::Seconds(30);
    options.rpc_timeout = absl::Seconds(10);
    options.store_timeout = absl::Seconds(30);
    options.group_options.timeout = kCollectiveTimeout;
    GlooOptions gloo;
    gloo.hostname = "127.0.0.1";
    options.backend = GlooBackend(gloo);
    return options;
  }

  // Runs `body(rank, runtime)` on one thread per rank after every rank's
  // Init; the runtimes are destroyed (Shutdown) when the threads end.
  void OnRanks(const std::function<void(int, Runtime&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Init(Options(r));
        ASSERT_TRUE(runtime.ok()) << "rank " << r << ": " << runtime.status();
        body(r, **runtime);
      });
    }
    for (auto& t : threads) t.join();
  }

  std::unique_ptr<testing::InProcessCoordinator> coordinator_;
  std::string dir_;
  std::vector<std::unique_ptr<agent::RankRelay>> relays_;  // One per host.
};

INSTANTIATE_TEST_SUITE_P(Paths, RuntimeE2eTest,
                         ::testing::Values(Path::kDirect, Path::kThroughAgents),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return info.param == Path::kDirect ? "Direct" : "ThroughAgents";
                         });

// Element i of rank r's input.
float Input(int rank, int i) { return static_cast<float>(100 * (rank + 1) + i); }

TEST_P(RuntimeE2eTest, TwoByTwoMeshAllReducesAlongEachDim) {
  constexpr int kElements = 1000;
  OnRanks([&](int rank, Runtime& runtime) {
    EXPECT_EQ(runtime.info().local_rank, rank % 2);
    EXPECT_EQ(runtime.info().node_rank, rank / 2);
    // The job's own mesh, (2, 2) over ("dp", "tp").
    absl::StatusOr<DeviceMesh> mesh = runtime.InitDeviceMesh();
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    ASSERT_EQ(mesh->dim_names(), (std::vector<std::string>{"dp", "tp"}));

    for (const char* dim : {"tp", "dp"}) {
      absl::StatusOr<std::shared_ptr<ProcessGroup>> group = mesh->GetGroup(dim);
      ASSERT_TRUE(group.ok()) << group.status();
      // tp groups are {0,1} {2,3}; dp groups {0,2} {1,3}.
      const std::vector<int> members = std::string(dim) == "tp"
                                           ? std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}
                                           : std::vector<int>{rank % 2, rank % 2 + 2};
      ASSERT_EQ((*group)->global_ranks(), members) << dim;
      std::vector<float> data(kElements);
      for (int i = 0; i < kElements; ++i) data[i] = Input(rank, i);
      Tensor tensor = Tensor::Contiguous(data.data(), DType::kFloat32, {kElements});
      auto work = (*group)->AllReduce(tensor, ReduceOp::kSum);
      ASSERT_TRUE(work.ok()) << work.status();
      ASSERT_TRUE((*work)->Wait().ok()) << dim << ": " << (*work)->status();
      for (int i = 0; i < kElements; ++i) {
        const float expected = Input(members[0], i) + Input(members[1], i);
        ASSERT_EQ(data[i], expected) << dim << " element " << i << " on rank " << rank;
      }
    }

    // The world through the runtime, and a flattened mesh, agree.
    absl::StatusOr<std::shared_ptr<ProcessGroup>> world = runtime.World();
    ASSERT_TRUE(world.ok()) << world.status();
    absl::StatusOr<DeviceMesh> flat = mesh->Flatten();
    ASSERT_TRUE(flat.ok()) << flat.status();
    EXPECT_EQ(flat->GetGroup()->get(), world->get());  // World in order: reused.
    int64_t value = rank;
    Tensor scalar = Tensor::Contiguous(&value, DType::kInt64, {1});
    auto work = (*world)->AllReduce(scalar, ReduceOp::kSum);
    ASSERT_TRUE(work.ok());
    ASSERT_TRUE((*work)->Wait().ok()) << (*work)->status();
    EXPECT_EQ(value, 0 + 1 + 2 + 3);
    EXPECT_TRUE(runtime.health().ok()) << runtime.health();
    // Every rank is done with its collectives before anyone leaves.
    auto barrier = (*world)->Barrier();
    ASSERT_TRUE(barrier.ok());
    ASSERT_TRUE((*barrier)->Wait().ok());
    EXPECT_TRUE(runtime.Shutdown().ok());
  });
  EXPECT_FALSE(coordinator_->JobFailed("e2e"));
}

// Ranks 0..2 issue collectives that need rank 3; rank 3 hangs instead (its
// heartbeats stop and it never joins the op).
TEST_P(RuntimeE2eTest, AHungRankEndsEveryPendingCollectiveNamingIt) {
  constexpr int kVictim = 3;
  absl::Barrier meshes_built(kWorld);
  // The victim keeps its sockets open until the others are done: a hang,
  // not an exit (an exit would close them and fail the peers by itself).
  absl::BlockingCounter others_done(kWorld - 1);
  std::vector<absl::Status> results(kWorld);
  std::vector<absl::Duration> took(kWorld);
  OnRanks([&](int rank, Runtime& runtime) {
    absl::StatusOr<DeviceMesh> mesh = runtime.InitDeviceMesh({2, 2}, {"dp", "tp"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    absl::StatusOr<std::shared_ptr<ProcessGroup>> world = runtime.World();
    ASSERT_TRUE(world.ok()) << world.status();
    meshes_built.Block();
    if (rank == kVictim) {
      runtime.SimulateHangForTesting();
      others_done.Wait();
      return;
    }
    // The world all-reduce needs the victim; so does rank 1's dp group
    // {1,3} and rank 2's tp group {2,3}.
    std::vector<float> data(1 << 16, 1.0f);
    Tensor tensor = Tensor::Contiguous(data.data(), DType::kFloat32, {1 << 16});
    const absl::Time start = absl::Now();
    auto work = (*world)->AllReduce(tensor, ReduceOp::kSum);
    ASSERT_TRUE(work.ok()) << work.status();
    results[rank] = (*work)->Wait(kCollectiveTimeout);
    took[rank] = absl::Now() - start;
    // Later collectives on any group of the runtime fail at once.
    auto tp = mesh->GetGroup("tp");
    ASSERT_TRUE(tp.ok());
    auto later = (*tp)->AllReduce(tensor, ReduceOp::kSum);
    if (later.ok()) {
      EXPECT_EQ((*later)->Wait(kPrompt).code(), absl::StatusCode::kAborted);
    } else {
      EXPECT_EQ(later.status().code(), absl::StatusCode::kAborted);
    }
    EXPECT_EQ(runtime.health().code(), absl::StatusCode::kAborted);
    others_done.DecrementCount();
  });
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(results[r].code(), absl::StatusCode::kAborted) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("rank 3 (host-1)"));
    EXPECT_LT(took[r], kPrompt);
    std::cout << "rank " << r << ": collective failed after " << absl::FormatDuration(took[r])
              << ": " << results[r] << "\n";
  }
}

TEST_P(RuntimeE2eTest, ReportErrorEndsEveryPendingCollectiveNamingTheReporter) {
  constexpr int kReporter = 1;
  absl::Barrier meshes_built(kWorld);
  // The reporter keeps its sockets open until the others are done, so that
  // they fail on the coordinator's word, not on a closed connection.
  absl::BlockingCounter others_done(kWorld - 1);
  std::vector<absl::Status> results(kWorld);
  OnRanks([&](int rank, Runtime& runtime) {
    absl::StatusOr<std::shared_ptr<ProcessGroup>> world = runtime.World();
    ASSERT_TRUE(world.ok()) << world.status();
    meshes_built.Block();
    if (rank == kReporter) {
      // Give the others time to block in the collective first.
      absl::SleepFor(absl::Milliseconds(200));
      EXPECT_TRUE(runtime.ReportError("loss is NaN at step 12").ok());
      ASSERT_TRUE([&] {
        for (int i = 0; i < 2000 && runtime.health().ok(); ++i) {
          absl::SleepFor(absl::Milliseconds(5));
        }
        return !runtime.health().ok();
      }());
      results[rank] = runtime.health();
      others_done.Wait();
      return;
    }
    std::vector<int32_t> data(1024, rank);
    Tensor tensor = Tensor::Contiguous(data.data(), DType::kInt32, {1024});
    auto work = (*world)->AllReduce(tensor, ReduceOp::kMax);
    ASSERT_TRUE(work.ok()) << work.status();
    results[rank] = (*work)->Wait(kCollectiveTimeout);
    others_done.DecrementCount();
  });
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(results[r].code(), absl::StatusCode::kAborted) << results[r];
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("rank 1 (host-0)"));
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("loss is NaN at step 12"));
  }
}

// The environment contract with real processes: examples/allreduce_2d,
// started as four workers with only MESH_* variables, joins, all-reduces on
// a 2x2 mesh and exits 0.
TEST_P(RuntimeE2eTest, ExampleWorkersRunFromTheEnvironment) {
  std::vector<::mesh::testing::Subprocess> workers;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<std::string> env = {
        absl::StrCat("MESH_COORDINATOR=", coordinator_->address()), "MESH_JOB_ID=e2e",
        "MESH_GENERATION=0", absl::StrCat("MESH_RANK=", r),
        // Two nodes on this one machine, as two agents would say: the node
        // name, not the host name, is what the coordinator groups ranks by
        // (the cross-check of the local ranks fails otherwise).
        absl::StrCat("MESH_WORLD_SIZE=", kWorld), absl::StrCat("MESH_LOCAL_RANK=", r % 2),
        "MESH_LOCAL_WORLD_SIZE=2", absl::StrCat("MESH_NODE_RANK=", r / 2),
        absl::StrCat("MESH_NODE_NAME=node-", r / 2)};
    if (!relays_.empty()) {
      env.push_back(absl::StrCat("MESH_AGENT_SOCKET=", relays_[r / 2]->socket_path()));
    }
    auto worker = ::mesh::testing::Subprocess::Start(
        {MESH_ALLREDUCE_2D_BIN, "--gloo-host", "127.0.0.1", "--elements", "4096"}, env);
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*std::move(worker));
  }
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    std::vector<std::string> lines;
    while (true) {
      absl::StatusOr<std::string> line = workers[r].ReadLine(absl::Seconds(60));
      if (!line.ok()) break;
      lines.push_back(*line);
    }
    absl::StatusOr<int> status = workers[r].Wait(absl::Seconds(30));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
    EXPECT_THAT(lines, ::testing::Contains(absl::StrCat("rank ", r, ": ok")));
    const std::string tp = r < 2 ? "0, 1" : "2, 3";
    const std::string dp = r % 2 == 0 ? "0, 2" : "1, 3";
    EXPECT_THAT(lines, ::testing::Contains(
                           absl::StrCat("rank ", r, ": tp group [", tp, "] all-reduce on cpu ok")));
    EXPECT_THAT(lines, ::testing::Contains(
                           absl::StrCat("rank ", r, ": dp group [", dp, "] all-reduce on cpu ok")));
  }
  EXPECT_FALSE(coordinator_->JobFailed("e2e"));
}

}  // namespace runtime_e2e_test
}  // namespace mesh
