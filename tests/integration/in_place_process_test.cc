// In-place recovery with real processes on 127.0.0.1 (docs/elastic.md). A
// mesh-coordinator, one mesh-agent with four slots, and a (4, 1) dp x tp
// job of examples/elastic_train under restart_policy IN_PLACE. kill -9 of
// rank 2: the other three processes carry on as three replicas without a
// restart of their own, the agent starts a new rank 2 in the same
// generation, which takes the step and weights from a peer, and the mesh is
// four replicas again. Then three agents: kill -9 of one agent of the job,
// whose ranks move to the free node in place (InPlaceNodeProcessTest).
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace in_place_process_test {
namespace {

using ::mesh::testing::MeshCluster;
using ::testing::HasSubstr;

constexpr int kWorld = 4;

// One "step S replicas R sum X epoch E pid P ms T" line of elastic_train.
struct Step {
  int64_t step = 0;
  int64_t replicas = 0;
  double sum = 0;
  int pid = 0;
  int64_t ms = 0;
};

// Every step line of a rank's log (both processes' when it was replaced).
std::vector<Step> StepsIn(const std::string& path) {
  std::ifstream file(path);
  std::vector<Step> steps;
  std::string line;
  while (std::getline(file, line)) {
    const std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() != 12 || f[0] != "step") continue;
    Step s;
    if (absl::SimpleAtoi(f[1], &s.step) && absl::SimpleAtoi(f[3], &s.replicas) &&
        absl::SimpleAtod(f[5], &s.sum) && absl::SimpleAtoi(f[9], &s.pid) &&
        absl::SimpleAtoi(f[11], &s.ms)) {
      steps.push_back(s);
    }
  }
  return steps;
}

// A (4, 1) dp x tp job of elastic_train under IN_PLACE with 2 restarts, on
// `nodes` nodes of 4 / `nodes` processes, its workers tagged with `marker`.
// A replacement waits 1.5 s before it joins, as a real one spends starting
// up, so the survivors run with fewer replicas first.
mesh::v1::JobSpec ElasticTrainSpec(const std::string& marker, int nodes, int steps) {
  mesh::v1::JobSpec spec;
  spec.set_name("elastic");
  spec.add_command(ELASTIC_TRAIN_BIN);
  for (const std::string& arg :
       {std::string("--steps"), absl::StrCat(steps), std::string("--step-ms"), std::string("20"),
        std::string("--gloo-host"), std::string("127.0.0.1"), std::string("--restart-delay-ms"),
        std::string("1500")}) {
    spec.add_command(arg);
  }
  (*spec.mutable_env())["MARKER"] = marker;
  spec.mutable_nodes()->set_min(nodes);
  spec.set_nproc_per_node(kWorld / nodes);
  spec.add_mesh_shape(kWorld);
  spec.add_mesh_shape(1);
  spec.add_mesh_dim_names("dp");
  spec.add_mesh_dim_names("tp");
  spec.set_restart_policy(mesh::v1::RESTART_POLICY_IN_PLACE);
  spec.set_max_restarts(2);
  return spec;
}

std::string FileText(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

class InPlaceProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Ranks heartbeat every 0.25 s and are dead after 1 s of silence.
    ASSERT_TRUE(
        cluster_.StartCoordinator(0, {"--heartbeat-interval", "0.25", "--heartbeat-timeout", "1"})
            .ok());
    ASSERT_TRUE(cluster_.StartAgent(0, /*slots=*/kWorld).ok());
    ASSERT_TRUE(
        ::mesh::testing::WaitUntil([&] { return cluster_.ReadyNodes() == 1; }, absl::Seconds(20)))
        << "the agent did not register";
  }

  mesh::v1::Job Get(const std::string& id) {
    absl::StatusOr<mesh::v1::Job> job = cluster_.GetJob(id);
    return job.ok() ? *std::move(job) : mesh::v1::Job();
  }

  std::vector<pid_t> Rank(const std::string& id, int rank) {
    return ::mesh::testing::LiveProcessesWithEnv(
        {"MARKER=" + marker_, "MESH_JOB_ID=" + id, absl::StrCat("MESH_RANK=", rank)});
  }

  std::string LogPath(const std::string& id, int rank) {
    return absl::StrCat(cluster_.dir(), "/agent-0/jobs/", id, "/gen-0/rank-", rank, ".log");
  }
  std::vector<Step> Steps(const std::string& id, int rank) { return StepsIn(LogPath(id, rank)); }
  std::string Log(const std::string& id, int rank) { return FileText(LogPath(id, rank)); }

  ::mesh::testing::CommandOutput Meshctl(std::vector<std::string> args) {
    args.insert(args.begin(), {MESHCTL_BIN, "--coordinator", cluster_.address()});
    return ::mesh::testing::RunMerged(args, absl::Seconds(30));
  }

  MeshCluster cluster_{{MESH_COORDINATOR_BIN, MESH_AGENT_BIN}, "mesh-in-place-test"};
  std::string marker_ =
      absl::StrCat("in-place-process-test-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
};

TEST_F(InPlaceProcessTest, SurvivorsCarryOnAndTheReplacementRejoinsWithAPeersState) {
  const mesh::v1::JobSpec spec = ElasticTrainSpec(marker_, /*nodes=*/1, /*steps=*/250);
  absl::StatusOr<mesh::v1::Job> submitted = mesh::testing::SubmitJob(cluster_.jobs(), spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id();
  EXPECT_EQ(submitted->spec().in_place_dim(), "dp");

  // Every rank runs steps as four replicas.
  ASSERT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        for (int r = 0; r < kWorld; ++r) {
          if (Steps(id, r).size() < 10) return false;
        }
        return true;
      },
      absl::Seconds(60)))
      << Log(id, 0);
  std::vector<pid_t> survivors;
  for (int r : {0, 1, 3}) {
    const std::vector<pid_t> pids = Rank(id, r);
    ASSERT_EQ(pids.size(), 1u) << "rank " << r;
    survivors.push_back(pids[0]);
  }
  const std::vector<pid_t> victim = Rank(id, 2);
  ASSERT_EQ(victim.size(), 1u);

  const int64_t killed_ms = absl::ToUnixMillis(absl::Now());
  ASSERT_EQ(kill(victim[0], SIGKILL), 0);

  // The others commit a step as three replicas within 2 s.
  int64_t first_three_ms = 0;
  ASSERT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        for (const Step& s : Steps(id, 0)) {
          if (s.replicas == 3 && s.ms >= killed_ms) {
            first_three_ms = s.ms;
            return true;
          }
        }
        return false;
      },
      absl::Seconds(20)))
      << Log(id, 0);
  EXPECT_LT(first_three_ms - killed_ms, 2000) << Log(id, 0);
  std::printf("in-place recovery: first step of 3 replicas %lld ms after kill -9\n",
              static_cast<long long>(first_three_ms - killed_ms));

  // A new rank 2 runs in the same generation, takes the state and the mesh
  // is four replicas again.
  ASSERT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        const std::vector<Step> steps = Steps(id, 2);
        return !steps.empty() && steps.back().pid != victim[0] && steps.back().replicas == 4;
      },
      absl::Seconds(60)))
      << Log(id, 2) << "\n"
      << Get(id).DebugString();
  EXPECT_THAT(Log(id, 2), HasSubstr("replacement, took step"));

  // The survivors are the same processes throughout, and every step they
  // committed summed one per replica.
  const std::vector<pid_t> after = {Rank(id, 0).at(0), Rank(id, 1).at(0), Rank(id, 3).at(0)};
  EXPECT_EQ(after, survivors);
  for (int r : {0, 1, 3}) {
    bool three = false;
    bool four_again = false;
    for (const Step& s : Steps(id, r)) {
      EXPECT_EQ(s.sum, static_cast<double>(s.replicas)) << "rank " << r << " step " << s.step;
      if (s.replicas == 3) three = true;
      if (three && s.replicas == 4) four_again = true;
    }
    EXPECT_TRUE(three) << "rank " << r;
    EXPECT_TRUE(four_again) << "rank " << r;
  }
  // The replacement started where a peer was, not at step 0.
  const std::vector<Step> replaced = Steps(id, 2);
  for (const Step& s : replaced) {
    if (s.pid != victim[0]) {
      EXPECT_GT(s.step, 10);
      break;
    }
  }

  mesh::v1::Job job = Get(id);
  EXPECT_EQ(job.state(), mesh::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 1);
  ASSERT_GE(job.membership_size(), 2) << job.DebugString();
  EXPECT_EQ(job.membership(0).rank(), 2);
  EXPECT_EQ(job.membership(0).kind(), mesh::v1::MembershipChange::KIND_LOST);
  EXPECT_EQ(job.membership(1).rank(), 2);
  EXPECT_EQ(job.membership(1).kind(), mesh::v1::MembershipChange::KIND_RETURNED);

  const mesh::testing::CommandOutput described = Meshctl({"describe", id});
  EXPECT_EQ(described.code, 0) << described.output;
  EXPECT_THAT(described.output, HasSubstr("relaunched in place"));

  // Every rank finishes its 250 steps; the job succeeds.
  absl::StatusOr<mesh::v1::Job> done = cluster_.WaitTerminal(id, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), mesh::v1::JOB_STATE_SUCCEEDED) << done->DebugString() << Log(id, 2);
}

// Three mesh-agents of two slots and a (4, 1) job on two of them: kill -9 of
// the agent of ranks 2 and 3 takes its workers with it. Once its node is
// LOST, the coordinator moves those ranks to the free node in place; ranks 0
// and 1 carry on as two replicas meanwhile and are never restarted.
class InPlaceNodeProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Ranks heartbeat every 0.25 s and are dead after 1 s of silence; a
    // node silent for 2 s is LOST.
    ASSERT_TRUE(cluster_
                    .StartCoordinator(0,
                                      {"--heartbeat-interval", "0.25", "--heartbeat-timeout", "1"},
                                      absl::Seconds(2))
                    .ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster_.StartAgent(i, /*slots=*/2).ok());
    ASSERT_TRUE(
        ::mesh::testing::WaitUntil([&] { return cluster_.ReadyNodes() == 3; }, absl::Seconds(20)))
        << "the agents did not register";
  }

  mesh::v1::Job Get(const std::string& id) {
    absl::StatusOr<mesh::v1::Job> job = cluster_.GetJob(id);
    return job.ok() ? *std::move(job) : mesh::v1::Job();
  }

  std::string LogPath(const std::string& id, int agent, int rank) {
    return absl::StrCat(cluster_.dir(), "/agent-", agent, "/jobs/", id, "/gen-0/rank-", rank,
                        ".log");
  }

  std::vector<Step> Steps(const std::string& id, int agent, int rank) {
    return StepsIn(LogPath(id, agent, rank));
  }
  std::string Log(const std::string& id, int agent, int rank) {
    return FileText(LogPath(id, agent, rank));
  }

  MeshCluster cluster_{{MESH_COORDINATOR_BIN, MESH_AGENT_BIN}, "mesh-in-place-node-test"};
  std::string marker_ =
      absl::StrCat("in-place-node-test-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
};

TEST_F(InPlaceNodeProcessTest, ALostNodesRanksMoveToTheFreeNodeWhileTheOthersCarryOn) {
  const mesh::v1::JobSpec spec = ElasticTrainSpec(marker_, /*nodes=*/2, /*steps=*/400);
  absl::StatusOr<mesh::v1::Job> submitted = mesh::testing::SubmitJob(cluster_.jobs(), spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id();
  ASSERT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        const mesh::v1::Job job = Get(id);
        return job.nodes_size() == 2 && job.nodes(0) == "node-0" && job.nodes(1) == "node-1" &&
               Steps(id, 0, 0).size() >= 10 && Steps(id, 0, 1).size() >= 10 &&
               Steps(id, 1, 2).size() >= 10 && Steps(id, 1, 3).size() >= 10;
      },
      absl::Seconds(60)))
      << Get(id).DebugString() << Log(id, 0, 0);
  std::vector<pid_t> survivors;
  for (int r : {0, 1}) {
    const std::vector<pid_t> pids = ::mesh::testing::LiveProcessesWithEnv(
        {"MARKER=" + marker_, "MESH_JOB_ID=" + id, absl::StrCat("MESH_RANK=", r)});
    ASSERT_EQ(pids.size(), 1u) << "rank " << r;
    survivors.push_back(pids[0]);
  }

  const int64_t killed_ms = absl::ToUnixMillis(absl::Now());
  cluster_.agent(1)->Signal(SIGKILL);
  ASSERT_TRUE(cluster_.agent(1)->Wait(absl::Seconds(10)).ok());

  // Ranks 0 and 1 carry on as two replicas...
  int64_t first_two_ms = 0;
  ASSERT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        for (const Step& s : Steps(id, 0, 0)) {
          if (s.replicas == 2 && s.ms >= killed_ms) {
            first_two_ms = s.ms;
            return true;
          }
        }
        return false;
      },
      absl::Seconds(20)))
      << Log(id, 0, 0);
  // ...until ranks 2 and 3, started on node-2, take the state and the mesh
  // is four replicas again.
  ASSERT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        for (int r : {2, 3}) {
          const std::vector<Step> steps = Steps(id, 2, r);
          if (steps.empty() || steps.back().replicas != 4) return false;
        }
        return true;
      },
      absl::Seconds(60)))
      << Get(id).DebugString() << Log(id, 2, 2);
  EXPECT_THAT(Log(id, 2, 2), HasSubstr("replacement, took step"));
  EXPECT_GT(Steps(id, 2, 2).front().step, 10);
  int64_t four_again_ms = 0;
  for (const Step& s : Steps(id, 0, 0)) {
    if (s.replicas == 4 && s.ms > first_two_ms) {
      four_again_ms = s.ms;
      break;
    }
  }
  std::printf(
      "lost node: first step of 2 replicas %lld ms after kill -9 of its agent, 4 replicas again "
      "after %lld ms (node heartbeat timeout 2 s, replacement start-up delay 1.5 s)\n",
      static_cast<long long>(first_two_ms - killed_ms),
      static_cast<long long>(four_again_ms - killed_ms));

  mesh::v1::Job job = Get(id);
  EXPECT_EQ(job.state(), mesh::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(job.nodes(), ::testing::ElementsAre("node-0", "node-2"));
  EXPECT_EQ(job.root_cause().node(), "node-1");
  bool event = false;
  for (const mesh::v1::JobStateEvent& e : job.events()) {
    if (absl::StrContains(e.reason(), "ranks move to node node-2")) event = true;
  }
  EXPECT_TRUE(event) << job.DebugString();

  // The survivors are the same processes, and every step summed one per
  // replica: four, then two, then four again.
  for (int r : {0, 1}) {
    const std::vector<pid_t> pids = ::mesh::testing::LiveProcessesWithEnv(
        {"MARKER=" + marker_, "MESH_JOB_ID=" + id, absl::StrCat("MESH_RANK=", r)});
    EXPECT_EQ(pids, std::vector<pid_t>{survivors[r]}) << "rank " << r;
    bool two = false;
    bool four_again = false;
    for (const Step& s : Steps(id, 0, r)) {
      EXPECT_EQ(s.sum, static_cast<double>(s.replicas)) << "rank " << r << " step " << s.step;
      if (s.replicas == 2) two = true;
      if (two && s.replicas == 4) four_again = true;
    }
    EXPECT_TRUE(two) << "rank " << r;
    EXPECT_TRUE(four_again) << "rank " << r;
  }

  absl::StatusOr<mesh::v1::Job> done = cluster_.WaitTerminal(id, absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), mesh::v1::JOB_STATE_SUCCEEDED) << done->DebugString();
}

}  // namespace
}  // namespace in_place_process_test
}  // namespace mesh
