// Elastic membership with real processes on 127.0.0.1 (docs/elastic.md): a
// mesh-coordinator, four mesh-agents, and a job with nodes 2:4 whose
// workers are /bin/sh scripts. kill -9 of an agent shrinks the job to three
// nodes at the next generation without counting a restart; the agent's
// return grows it back to four under grow AFTER; meshctl describe lists both
// resizes with their reasons.
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace elastic_process_test {
namespace {

using ::mesh::testing::MeshCluster;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kNodes = 4;

class ElasticProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A node silent for 2 s is LOST (heartbeats every 0.2 s).
    ASSERT_TRUE(cluster_.StartCoordinator(0, {}, absl::Seconds(2)).ok());
    for (int i = 0; i < kNodes; ++i) ASSERT_TRUE(cluster_.StartAgent(i, /*slots=*/1).ok());
    ASSERT_TRUE(::mesh::testing::WaitUntil([&] { return cluster_.ReadyNodes() == kNodes; },
                                           absl::Seconds(20)))
        << "agents did not register";
  }

  mesh::v1::Job Get(const std::string& id) {
    absl::StatusOr<mesh::v1::Job> job = cluster_.GetJob(id);
    return job.ok() ? *std::move(job) : mesh::v1::Job();
  }

  // The job runs generation `generation` and every one of its `world`
  // workers is up with that world size.
  bool RunsAt(const std::string& id, int64_t generation, int world) {
    return ::mesh::testing::WaitUntil(
        [&] {
          const mesh::v1::Job job = Get(id);
          return job.state() == mesh::v1::JOB_STATE_RUNNING && job.generation() == generation &&
                 static_cast<int>(Workers(id, generation, world).size()) == world;
        },
        absl::Seconds(30));
  }

  std::vector<pid_t> Workers(const std::string& id, int64_t generation, int world) {
    return ::mesh::testing::LiveProcessesWithEnv({"MARKER=" + marker_, "MESH_JOB_ID=" + id,
                                                  absl::StrCat("MESH_GENERATION=", generation),
                                                  absl::StrCat("MESH_WORLD_SIZE=", world)});
  }

  // meshctl against this cluster: its exit code and output.
  ::mesh::testing::CommandOutput Meshctl(std::vector<std::string> args) {
    args.insert(args.begin(), {MESHCTL_BIN, "--coordinator", cluster_.address()});
    return ::mesh::testing::RunMerged(args, absl::Seconds(30));
  }

  MeshCluster cluster_{{MESH_COORDINATOR_BIN, MESH_AGENT_BIN}, "mesh-elastic-test"};
  // Tags this test's workers so /proc scans find only them.
  std::string marker_ =
      absl::StrCat("elastic-process-test-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
};

TEST_F(ElasticProcessTest, AKilledAgentShrinksTheJobAndItsReturnGrowsItBack) {
  mesh::v1::JobSpec spec = mesh::testing::ShellJobSpec("exec sleep 300", 2, 1, marker_);
  spec.mutable_nodes()->set_max(kNodes);
  spec.add_mesh_shape(-1);
  spec.add_mesh_dim_names("dp");
  spec.set_grow(mesh::v1::GROW_POLICY_AFTER);
  spec.set_grow_after_seconds(2);
  absl::StatusOr<mesh::v1::Job> submitted = mesh::testing::SubmitJob(cluster_.jobs(), spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id();
  ASSERT_TRUE(RunsAt(id, 0, 4)) << Get(id).DebugString();

  cluster_.agent(3)->Signal(SIGKILL);
  ASSERT_TRUE(cluster_.agent(3)->Wait(absl::Seconds(10)).ok());

  // Three nodes carry on at generation 1; no restart is counted (there are
  // none to count: max_restarts is 0).
  ASSERT_TRUE(RunsAt(id, 1, 3)) << Get(id).DebugString();
  mesh::v1::Job job = Get(id);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(job.nodes(), ElementsAre("node-0", "node-1", "node-2"));
  ASSERT_EQ(job.resizes_size(), 1);
  EXPECT_EQ(job.resizes(0).from_nodes(), 4);
  EXPECT_EQ(job.resizes(0).to_nodes(), 3);
  EXPECT_THAT(job.resizes(0).reason(), HasSubstr("node node-3 lost"));
  EXPECT_EQ(job.root_cause().node(), "node-3");

  // node-3 returns; after 2 s at three nodes the job grows back to four.
  ASSERT_TRUE(cluster_.StartAgent(3, /*slots=*/1).ok());
  ASSERT_TRUE(RunsAt(id, 2, 4)) << Get(id).DebugString();
  job = Get(id);
  EXPECT_EQ(job.restarts(), 0);
  ASSERT_EQ(job.resizes_size(), 2);
  EXPECT_EQ(job.resizes(1).from_nodes(), 3);
  EXPECT_EQ(job.resizes(1).to_nodes(), 4);
  EXPECT_THAT(job.resizes(1).reason(), HasSubstr("grow after 2s"));
  // No worker of an older generation is left.
  EXPECT_TRUE(::mesh::testing::WaitUntil(
      [&] { return Workers(id, 0, 4).empty() && Workers(id, 1, 3).empty(); }, absl::Seconds(10)));

  const ::mesh::testing::CommandOutput described = Meshctl({"describe", id});
  const std::string& out = described.output;
  EXPECT_EQ(described.code, 0) << out;
  EXPECT_THAT(out, HasSubstr("Resizes:"));
  EXPECT_THAT(out, ::testing::ContainsRegex("1 +4 -> 3 +node node-3 lost"));
  EXPECT_THAT(out, ::testing::ContainsRegex("2 +3 -> 4 +grow after 2s"));
  EXPECT_THAT(out, HasSubstr("(grow: after 2s)"));

  EXPECT_EQ(Meshctl({"cancel", id}).code, 0);
  EXPECT_TRUE(
      ::mesh::testing::WaitUntil([&] { return Workers(id, 2, 4).empty(); }, absl::Seconds(10)));
}

}  // namespace
}  // namespace elastic_process_test
}  // namespace mesh
