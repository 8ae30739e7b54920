// kill -9 of the coordinator, again and again, during a stream of 200
// submits (reliability scenario 2; docs/failure-semantics.md).
//
// Each submit carries its own idempotency key; the client retries a submit
// whose reply it did not get, with the same key, until it is acknowledged
// (as meshctl and any careful client does). A killer thread kills the
// coordinator after every ~20 acknowledgements, at a random moment a few
// milliseconds later (so that some kills land between a commit and its
// reply); the client's thread reaps it and restarts it on the same port and
// state directory when a try fails. No agents
// run: the jobs stay PENDING, and the test is about the store.
//
// Asserts: every acknowledged submit is present exactly once (ListJobs, all
// pages), with the id it was acknowledged with; a retried submit whose first
// try was committed came back deduplicated, never as a second job; 200 jobs
// in all, before and after a final restart.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
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
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"

namespace mesh {
namespace submit_storm_test {

using ::mesh::testing::ContextWithDeadline;
using ::mesh::testing::MeshCluster;
using namespace mesh::v1;  // NOLINT

constexpr int kSubmits = 200;
constexpr int kKillEvery = 20;
// One submit may need several tries across a restart; never more than this.
constexpr absl::Duration kPerSubmit = absl::Seconds(60);

TEST(SubmitStormTest, Kill9DuringSubmitsLosesAndDuplicatesNothing) {
  MeshCluster cluster({MESH_COORDINATOR_BIN, MESH_AGENT_BIN}, "mesh-fault-storm");
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  const int port = cluster.port();
  const std::string address = cluster.address();

  std::atomic<int> acked{0};
  std::atomic<bool> done{false};
  std::atomic<int> kills{0};
  // The coordinator's pid while it runs; -1 once killed. The killer only
  // signals it; the main thread reaps and restarts it (a Subprocess dies with
  // the thread that started it: PR_SET_PDEATHSIG). The mutex keeps a kill
  // from reaching a reaped, reused pid.
  absl::Mutex pid_mu;
  pid_t pid = cluster.coordinator_pid();  // Guarded by pid_mu.

  std::thread killer([&] {
    std::mt19937 random(12345);
    int next = kKillEvery;
    while (!done.load()) {
      if (acked.load() < next) {
        absl::SleepFor(absl::Microseconds(200));
        continue;
      }
      next += kKillEvery;
      absl::SleepFor(absl::Microseconds(random() % 5000));
      absl::MutexLock lock(&pid_mu);
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        pid = -1;
        ++kills;
      }
    }
  });
  // Reaps a killed coordinator and starts it again on the same port.
  auto restart_if_killed = [&]() -> absl::Status {
    absl::MutexLock lock(&pid_mu);
    if (pid > 0) return absl::OkStatus();
    if (absl::Status reaped = cluster.KillCoordinator(); !reaped.ok()) return reaped;
    if (absl::Status started = cluster.StartCoordinator(port); !started.ok()) return started;
    pid = cluster.coordinator_pid();
    return absl::OkStatus();
  };

  // Stops and joins the killer however the test leaves (a failed ASSERT
  // returns early).
  struct StopKiller {
    std::atomic<bool>& done;
    std::thread& killer;
    ~StopKiller() {
      done = true;
      if (killer.joinable()) killer.join();
    }
  } stop_killer{done, killer};

  // The client: its own channel, which reconnects by itself.
  // Reconnects by itself, soon after a restart (gRPC's default backoff grows
  // to minutes), and a call waits for the connection (wait_for_ready) within
  // its deadline instead of failing at once while the coordinator is down.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  // The minimum time one connection attempt gets (not a backoff).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  auto jobs = JobService::NewStub(channel);
  std::map<std::string, std::string> id_of_key;  // Acknowledged.
  int retried = 0;                               // Submits that needed more than one try.
  int deduplicated = 0;                          // Acknowledged as an earlier, committed try.
  int failed_tries = 0;
  for (int i = 0; i < kSubmits; ++i) {
    const std::string key = absl::StrCat("storm-", i);
    SubmitJobRequest request;
    request.mutable_spec()->set_name(key);
    request.mutable_spec()->add_command("/bin/true");
    request.mutable_spec()->mutable_nodes()->set_min(1);
    request.mutable_spec()->set_nproc_per_node(1);
    request.mutable_spec()->set_idempotency_key(key);
    const absl::Time give_up = absl::Now() + kPerSubmit;
    int tries = 0;
    SubmitJobResponse response;
    for (;;) {
      ++tries;
      response.Clear();
      std::unique_ptr<grpc::ClientContext> context = ContextWithDeadline(absl::Seconds(5));
      context->set_wait_for_ready(true);
      const grpc::Status status = jobs->SubmitJob(context.get(), request, &response);
      if (status.ok()) break;
      ++failed_tries;
      const absl::Status restarted = restart_if_killed();
      ASSERT_TRUE(restarted.ok()) << restarted;
      ASSERT_THAT(status.error_code(),
                  ::testing::AnyOf(grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::CANCELLED,
                                   grpc::StatusCode::DEADLINE_EXCEEDED))
          << key << ": " << status.error_message();
      ASSERT_LT(absl::Now(), give_up) << key << " never acknowledged: " << status.error_message();
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_FALSE(response.job().id().empty());
    ASSERT_EQ(response.job().spec().idempotency_key(), key);
    if (tries > 1) ++retried;
    if (response.deduplicated()) ++deduplicated;
    // The first acknowledgement of a key is the only one there is.
    ASSERT_TRUE(id_of_key.emplace(key, response.job().id()).second) << key;
    ++acked;
  }
  done = true;
  killer.join();
  // A kill after the last acknowledgement.
  const absl::Status restarted = restart_if_killed();
  ASSERT_TRUE(restarted.ok()) << restarted;
  std::printf(
      "[ scenario 2 ] %d submits acknowledged across %d kill -9s: %d retried (%d failed tries), "
      "%d deduplicated\n",
      kSubmits, kills.load(), retried, failed_tries, deduplicated);
  EXPECT_GE(kills.load(), kSubmits / kKillEvery - 1);

  // Every acknowledged job exactly once, with its acknowledged id; checked
  // on the coordinator as the storm left it, and after one more restart.
  auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    absl::StatusOr<std::vector<Job>> all = cluster.ListAllJobs();
    const absl::Time first = absl::Now();
    ASSERT_TRUE(::mesh::testing::WaitUntil(
        [&] {
          all = cluster.ListAllJobs();
          return all.ok();
        },
        absl::Seconds(20)))
        << all.status();
    std::printf("[ scenario 2 ] ListJobs answered after %.3f s\n",
                absl::ToDoubleSeconds(absl::Now() - first));
    EXPECT_EQ(all->size(), static_cast<size_t>(kSubmits));
    std::set<std::string> ids;
    std::map<std::string, int> per_key;
    for (const Job& job : *all) {
      EXPECT_TRUE(ids.insert(job.id()).second) << "id " << job.id() << " listed twice";
      const std::string& key = job.spec().idempotency_key();
      ++per_key[key];
      auto acked_id = id_of_key.find(key);
      ASSERT_NE(acked_id, id_of_key.end())
          << "job " << job.id() << " with key '" << key << "' was never acknowledged";
      EXPECT_EQ(job.id(), acked_id->second) << key;
      EXPECT_EQ(job.state(), JOB_STATE_PENDING) << job.id();
    }
    for (const auto& [key, id] : id_of_key) {
      EXPECT_EQ(per_key[key], 1) << key << " (" << id << ")";
    }
  };
  check("after the storm");
  ASSERT_TRUE(cluster.KillCoordinator().ok());
  ASSERT_TRUE(cluster.StartCoordinator(port).ok());
  check("after one more restart");
}

}  // namespace submit_storm_test
}  // namespace mesh
