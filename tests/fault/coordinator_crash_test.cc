// Coordinator crashes (kill -9) with real processes on 127.0.0.1
// (reliability scenarios 1 and 3; docs/failure-semantics.md):
//
//   1. kill -9 right after a submit is acknowledged, and again while its
//      workers run; each time a restart on the same port and state
//      directory: the job is there with the same id, the agents reconnect,
//      the running workers keep running (same pids) and are reconciled, and
//      the job finishes SUCCEEDED.
//   3. kill -9 while ranks block in Join, a barrier and a key wait with 120 s
//      deadlines: every call ends with UNAVAILABLE within seconds (measured
//      and printed). Then libmesh's policy: a blocked store Get returns
//      UNAVAILABLE at once; a joined Runtime fails with UNAVAILABLE naming
//      the lost coordinator once its heartbeat timeout passes; a Runtime::Init
//      blocked in Join retries through the restart and completes the
//      rendezvous on the new coordinator.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "mesh/process_group_gloo.h"
#include "mesh/runtime.h"
#include "mesh/store.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/job.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/pending_call.h"
#include "tests/util/proc.h"

namespace mesh {
namespace coordinator_crash_test {

using ::mesh::testing::ContextWithDeadline;
using ::mesh::testing::CreateBareJob;
using ::mesh::testing::JoinRank;
using ::mesh::testing::MeshCluster;
using ::mesh::testing::RankOf;
using ::mesh::testing::WaitUntil;
using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT

// The deadlines of the blocked calls: far beyond what unblocking may take.
constexpr absl::Duration kLongWait = absl::Seconds(120);
// A blocked call must end this soon after kill -9 (a dropped connection is
// seen at once; the margin is for a loaded 2-core machine).
constexpr absl::Duration kUnblockBound = absl::Seconds(15);

::mesh::testing::MeshClusterBinaries ClusterBinaries() {
  return {MESH_COORDINATOR_BIN, MESH_AGENT_BIN};
}

using PendingCall = ::mesh::testing::PendingCall<absl::Status>;

class CoordinatorCrashTest : public ::testing::Test {
 protected:
  CoordinatorCrashTest() : cluster_(ClusterBinaries(), "mesh-fault-crash") {}

  JobSpec ShellJob(const std::string& script) {
    return ::mesh::testing::ShellJobSpec(script, /*nodes=*/2, /*nproc=*/1, marker_);
  }

  // The worker processes of `job`: children of an agent. (Their `sleep`
  // children share the environment, and are called "sh" too between fork
  // and exec; their parent is the worker, not an agent.)
  std::vector<pid_t> WorkerShells(const std::string& job) {
    std::vector<pid_t> workers;
    for (pid_t pid :
         ::mesh::testing::LiveProcessesWithEnv({"MARKER=" + marker_, "MESH_JOB_ID=" + job})) {
      const pid_t parent = ::mesh::testing::ParentOf(pid);
      for (int i = 0; i < 2; ++i) {
        if (parent == cluster_.agent(i)->pid()) workers.push_back(pid);
      }
    }
    return workers;
  }

  void CreateJob(const std::string& id, int world_size) {
    const absl::Status status = CreateBareJob(cluster_.admin(), id, world_size);
    ASSERT_TRUE(status.ok()) << status;
  }

  // Join on a channel of its own, so that each pending call sees the
  // connection drop by itself.
  absl::Status Join(const std::shared_ptr<grpc::Channel>& channel, const RankContext& rank,
                    absl::Duration timeout) {
    return FromGrpcStatus(JoinRank(*WorkerService::NewStub(channel), rank, timeout));
  }

  RuntimeOptions RuntimeFor(const std::string& job, int rank, int world) {
    RuntimeOptions options;
    options.env = nullptr;
    options.coordinator = cluster_.address();
    options.job_id = job;
    options.generation = 0;
    options.rank = rank;
    options.world_size = world;
    options.host = "host-a";
    options.join_timeout = absl::Seconds(60);
    options.rpc_timeout = absl::Seconds(10);
    options.store_timeout = kLongWait;
    GlooOptions gloo;
    gloo.hostname = "127.0.0.1";
    options.backend = GlooBackend(gloo);
    return options;
  }

  MeshCluster cluster_;
  std::string marker_ =
      absl::StrCat("fault-crash-test-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
};

// The node heartbeat timeout of this test: also the reconciliation window
// after a restart. Long enough for an agent to come back on a loaded host
// (about a second; coordinator_restart_loop_test measures it), short enough
// for the test to wait it out.
constexpr absl::Duration kNodeTimeout = absl::Seconds(10);

TEST_F(CoordinatorCrashTest, Kill9AfterSubmitAckAndWhileRunningKeepsTheJobAndItsWorkers) {
  ASSERT_TRUE(cluster_.StartCoordinator(0, {}, kNodeTimeout).ok());
  ASSERT_TRUE(cluster_.StartAgent(0).ok());
  ASSERT_TRUE(cluster_.StartAgent(1).ok());
  ASSERT_TRUE(WaitUntil([&] { return cluster_.ReadyNodes() == 2; }, absl::Seconds(20)));
  const int port = cluster_.port();
  const std::string release = cluster_.dir() + "/release";

  const absl::StatusOr<Job> submitted = ::mesh::testing::SubmitJob(
      cluster_.jobs(), ShellJob(absl::StrCat("while [ ! -e '", release,
                                             "' ]; do sleep 0.1; done; echo done $RANK")));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  // Right after the acknowledgement: the launch orders may or may not have
  // reached the agents.
  ASSERT_TRUE(cluster_.KillCoordinator().ok());
  const std::string id = submitted->id();
  std::printf("[ scenario 1 ] submitted %s (state %s at ack), coordinator killed\n", id.c_str(),
              JobState_Name(submitted->state()).c_str());

  absl::Time restart = absl::Now();
  ASSERT_TRUE(cluster_.StartCoordinator(port, {}, kNodeTimeout).ok());
  absl::StatusOr<Job> job = cluster_.GetJob(id);
  ASSERT_TRUE(job.ok()) << "acknowledged job " << id << " lost: " << job.status();
  EXPECT_EQ(job->id(), id);
  // Recovered nodes count as READY at once (last seen: the recovery); an
  // agent is back when its heartbeats (every 0.2 s) are seen after that.
  auto agents_back = [&] {
    const absl::Time after = absl::Now() + absl::Milliseconds(300);
    return WaitUntil([&] { return cluster_.NodesSeenSince(after) == 2; }, kNodeTimeout);
  };
  ASSERT_TRUE(agents_back()) << "agents did not reconnect";
  std::printf("[ scenario 1 ] agents back %.2f s after the restart\n",
              absl::ToDoubleSeconds(absl::Now() - restart));
  ASSERT_TRUE(cluster_.WaitForState(id, JOB_STATE_RUNNING, absl::Seconds(30)))
      << JobState_Name(cluster_.GetJob(id).value_or(Job()).state());
  ASSERT_TRUE(WaitUntil([&] { return WorkerShells(id).size() == 2; }, absl::Seconds(10)));
  const std::vector<pid_t> before = WorkerShells(id);
  const int64_t generation = cluster_.GetJob(id)->generation();

  // Again while the workers run.
  ASSERT_TRUE(cluster_.KillCoordinator().ok());
  restart = absl::Now();
  ASSERT_TRUE(cluster_.StartCoordinator(port, {}, kNodeTimeout).ok());
  job = cluster_.GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), JOB_STATE_RUNNING);
  ASSERT_TRUE(agents_back()) << "agents did not reconnect";
  std::printf("[ scenario 1 ] agents back %.2f s after the second restart\n",
              absl::ToDoubleSeconds(absl::Now() - restart));
  // Past the reconciliation window (the node heartbeat timeout after the
  // restart): the same processes, the same generation, nothing restarted.
  EXPECT_FALSE(WaitUntil([&] { return WorkerShells(id) != before; },
                         restart + kNodeTimeout + absl::Seconds(1) - absl::Now()))
      << WorkerShells(id).size() << " workers now";
  job = cluster_.GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), JOB_STATE_RUNNING);
  EXPECT_EQ(job->generation(), generation);

  std::ofstream(release).put('\n');
  absl::StatusOr<Job> done = cluster_.WaitTerminal(id, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), JOB_STATE_SUCCEEDED) << done->root_cause().message();
  EXPECT_EQ(done->generation(), generation);
}

TEST_F(CoordinatorCrashTest, Kill9EndsBlockedJoinBarrierAndGetWithUnavailableWithinSeconds) {
  ASSERT_TRUE(
      cluster_.StartCoordinator(0, {"--heartbeat-interval", "0.5", "--heartbeat-timeout", "300"})
          .ok());
  // join: 2 ranks, only rank 0 comes. barrier: 2 joined ranks, rank 1 never
  // arrives. kv: 1 joined rank waits for a key nobody sets.
  CreateJob("join", 2);
  CreateJob("barrier", 2);
  CreateJob("kv", 1);
  {
    auto a = cluster_.NewChannel();
    PendingCall other([&] { return Join(a, RankOf("barrier", 1), absl::Seconds(20)); });
    ASSERT_TRUE(Join(cluster_.NewChannel(), RankOf("barrier", 0), absl::Seconds(20)).ok());
  }
  ASSERT_TRUE(Join(cluster_.NewChannel(), RankOf("kv", 0), absl::Seconds(20)).ok());

  std::vector<std::string> names = {"join", "barrier", "kv get"};
  std::vector<std::unique_ptr<PendingCall>> calls;
  auto join_channel = cluster_.NewChannel();
  calls.push_back(std::make_unique<PendingCall>(
      [&, join_channel] { return Join(join_channel, RankOf("join", 0), kLongWait); }));
  auto barrier_channel = cluster_.NewChannel();
  calls.push_back(std::make_unique<PendingCall>([&, barrier_channel] {
    BarrierRequest request;
    *request.mutable_context() = RankOf("barrier", 0);
    request.set_name("rank-1-never-comes");
    request.set_timeout_seconds(absl::ToDoubleSeconds(kLongWait));
    BarrierResponse response;
    return FromGrpcStatus(WorkerService::NewStub(barrier_channel)
                              ->Barrier(ContextWithDeadline(kLongWait).get(), request, &response));
  }));
  auto kv_channel = cluster_.NewChannel();
  calls.push_back(std::make_unique<PendingCall>([&, kv_channel] {
    KvGetRequest request;
    *request.mutable_context() = RankOf("kv", 0);
    request.set_key("never-set");
    request.set_wait(true);
    request.set_timeout_seconds(absl::ToDoubleSeconds(kLongWait));
    KvGetResponse response;
    return FromGrpcStatus(WorkerService::NewStub(kv_channel)
                              ->KvGet(ContextWithDeadline(kLongWait).get(), request, &response));
  }));
  // Parked on the server: none has ended a second later.
  EXPECT_FALSE(WaitUntil(
      [&] {
        for (auto& call : calls) {
          if (call->ended()) return true;
        }
        return false;
      },
      absl::Seconds(1)));
  for (size_t i = 0; i < calls.size(); ++i) {
    ASSERT_FALSE(calls[i]->ended()) << names[i] << ": " << calls[i]->status();
  }

  const absl::Time kill = absl::Now();
  ASSERT_TRUE(cluster_.KillCoordinator().ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (auto& call : calls) {
          if (!call->ended()) return false;
        }
        return true;
      },
      kUnblockBound));
  for (size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(names[i]);
    const absl::Duration took = calls[i]->ended_at() - kill;
    std::printf("[ scenario 3 ] raw %s ended %.3f s after kill -9: %s\n", names[i].c_str(),
                absl::ToDoubleSeconds(took), calls[i]->status().ToString().c_str());
    EXPECT_EQ(calls[i]->status().code(), absl::StatusCode::kUnavailable) << calls[i]->status();
    EXPECT_LT(took, kUnblockBound);
  }
}

TEST_F(CoordinatorCrashTest, LibmeshStoreFailsFastRuntimeFailsAfterHeartbeatTimeoutJoinRetries) {
  // A 3 s rank heartbeat timeout: the Runtime gives up on a lost coordinator
  // after that long.
  ASSERT_TRUE(
      cluster_.StartCoordinator(0, {"--heartbeat-interval", "0.5", "--heartbeat-timeout", "3"})
          .ok());
  const int port = cluster_.port();
  CreateJob("solo", 1);
  std::atomic<bool> failure_seen{false};
  RuntimeOptions solo_options = RuntimeFor("solo", 0, 1);
  solo_options.on_failure = [&](const absl::Status&) { failure_seen = true; };
  absl::StatusOr<std::unique_ptr<Runtime>> solo = Runtime::Init(solo_options);
  ASSERT_TRUE(solo.ok()) << solo.status();
  Runtime& runtime = **solo;

  PendingCall get([&] { return runtime.store()->Get("never-set", kLongWait).status(); });
  ASSERT_FALSE(WaitUntil([&] { return get.ended(); }, absl::Seconds(1))) << get.status();

  const absl::Time kill = absl::Now();
  ASSERT_TRUE(cluster_.KillCoordinator().ok());
  ASSERT_TRUE(WaitUntil([&] { return get.ended(); }, kUnblockBound));
  std::printf("[ scenario 3 ] libmesh store Get ended %.3f s after kill -9: %s\n",
              absl::ToDoubleSeconds(get.ended_at() - kill), get.status().ToString().c_str());
  EXPECT_EQ(get.status().code(), absl::StatusCode::kUnavailable) << get.status();
  EXPECT_LT(get.ended_at() - kill, kUnblockBound);

  // The Runtime itself: healthy through a blip shorter than its heartbeat
  // timeout, failed with UNAVAILABLE naming the coordinator after it.
  ASSERT_TRUE(WaitUntil([&] { return !runtime.health().ok(); }, absl::Seconds(3) + kUnblockBound))
      << "the Runtime never noticed the coordinator was gone";
  std::printf("[ scenario 3 ] libmesh Runtime failed %.3f s after kill -9: %s\n",
              absl::ToDoubleSeconds(absl::Now() - kill), runtime.health().ToString().c_str());
  EXPECT_EQ(runtime.health().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(runtime.health().message(), HasSubstr("lost the coordinator"));
  EXPECT_GE(absl::Now() - kill, absl::Seconds(2));
  EXPECT_TRUE(WaitUntil([&] { return failure_seen.load(); }, absl::Seconds(5)));
  solo->reset();

  // Join retries while the coordinator is away: rank 0 starts Init with no
  // coordinator at all, it comes back (same port; rendezvous state is
  // ephemeral, so the job is created again), rank 1 joins, both complete.
  absl::StatusOr<std::unique_ptr<Runtime>> rank0;
  const absl::Time start = absl::Now();
  std::thread init0([&] { rank0 = Runtime::Init(RuntimeFor("pair", 0, 2)); });
  struct Joiner {
    std::thread& thread;
    ~Joiner() {
      if (thread.joinable()) thread.join();
    }
  } joiner{init0};
  // Let it retry against a closed port for a while: long enough for gRPC's
  // default reconnect backoff (1 s, x1.6) to lag behind the Join retries.
  absl::SleepFor(absl::Seconds(4));
  // A long rank heartbeat timeout from here on: the restart below must not
  // be mistaken for a lost coordinator, however slow the machine.
  ASSERT_TRUE(
      cluster_.StartCoordinator(port, {"--heartbeat-interval", "0.5", "--heartbeat-timeout", "30"})
          .ok());
  CreateJob("pair", 2);
  absl::StatusOr<std::unique_ptr<Runtime>> rank1 = Runtime::Init(RuntimeFor("pair", 1, 2));
  init0.join();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  std::printf("[ scenario 3 ] libmesh Join retried through the restart: rendezvous %.2f s\n",
              absl::ToDoubleSeconds(absl::Now() - start));
  EXPECT_TRUE((*rank0)->health().ok());
  EXPECT_TRUE((*rank1)->health().ok());

  // Ranks past Join when the coordinator restarts: the rendezvous was in
  // memory, so the new coordinator does not know them (it has the job again,
  // as a restarted JobManager re-creates running jobs). Their next heartbeat
  // is refused (FAILED_PRECONDITION, "has not joined"), not retried: each
  // Runtime fails within about a heartbeat interval, well before its
  // heartbeat timeout, and its worker is expected to exit non-zero so that
  // the job restarts in a new generation (max_restarts) or fails.
  ASSERT_TRUE(cluster_.KillCoordinator().ok());
  const absl::Time second_kill = absl::Now();
  ASSERT_TRUE(
      cluster_.StartCoordinator(port, {"--heartbeat-interval", "0.5", "--heartbeat-timeout", "30"})
          .ok());
  CreateJob("pair", 2);
  for (auto* rank : {&rank0, &rank1}) {
    Runtime& runtime = ***rank;
    ASSERT_TRUE(WaitUntil([&] { return !runtime.health().ok(); }, kUnblockBound))
        << "rank " << runtime.rank() << " never noticed the restart";
    std::printf("[ scenario 3 ] joined rank %d failed %.3f s after kill -9 and restart: %s\n",
                runtime.rank(), absl::ToDoubleSeconds(absl::Now() - second_kill),
                runtime.health().ToString().c_str());
    EXPECT_EQ(runtime.health().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(runtime.health().message(), HasSubstr("has not joined"));
  }
}

}  // namespace coordinator_crash_test
}  // namespace mesh
