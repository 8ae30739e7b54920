// The operator's worker environment and allow list, end to end: a
// --worker-env-file reaches every worker; a job-spec name Mesh refuses by
// default (LD_LIBRARY_PATH) is refused at submit unless the coordinator's
// operator allows it, and at launch unless the node's operator does too; a
// worker the dynamic loader cannot start (a library missing) fails with the
// loader's message as its root cause, and the operator's LD_LIBRARY_PATH
// fixes it.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"

namespace mesh {
namespace worker_env_test {

using ::testing::HasSubstr;

class WorkerEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<testing::MeshCluster>(
        testing::MeshClusterBinaries{MESH_COORDINATOR_BIN, MESH_AGENT_BIN}, "mesh-worker-env");
  }

  void Start(const std::vector<std::string>& coordinator_flags,
             const std::vector<std::string>& agent_flags) {
    ASSERT_TRUE(cluster_->StartCoordinator(0, coordinator_flags).ok());
    ASSERT_TRUE(cluster_->StartAgent(0, 2, "none", agent_flags).ok());
    ASSERT_TRUE(testing::WaitUntil([&] { return cluster_->ReadyNodes() == 1; }, absl::Seconds(20)))
        << "the agent did not register";
  }

  // Replaces the agent with one started with `flags`, and waits until the
  // new one has registered.
  void RestartAgent(const std::vector<std::string>& flags) {
    testing::Subprocess* old = cluster_->agent(0);
    old->Signal(SIGKILL);
    ASSERT_TRUE(old->Wait(absl::Seconds(10)).ok());
    const absl::Time since = absl::Now();
    ASSERT_TRUE(cluster_->StartAgent(0, 2, "none", flags).ok());
    ASSERT_TRUE(
        testing::WaitUntil([&] { return cluster_->NodesSeenSince(since) == 1; }, absl::Seconds(20)))
        << "the new agent did not register";
  }

  std::string WriteEnvFile(const std::string& text) {
    const std::string path = cluster_->dir() + "/worker.env";
    std::ofstream(path) << text;
    return path;
  }

  v1::JobSpec Spec(std::vector<std::string> command) {
    v1::JobSpec spec;
    for (std::string& arg : command) spec.add_command(std::move(arg));
    spec.mutable_nodes()->set_min(1);
    spec.mutable_nodes()->set_max(1);
    spec.set_nproc_per_node(1);
    return spec;
  }

  absl::StatusOr<v1::Job> Run(const v1::JobSpec& spec) {
    auto job = testing::SubmitJob(cluster_->jobs(), spec);
    if (!job.ok()) return job.status();
    return cluster_->WaitTerminal(job->id(), absl::Seconds(60));
  }

  std::string RankLog(const std::string& job) {
    std::ifstream in(absl::StrCat(cluster_->dir(), "/agent-0/jobs/", job, "/gen-0/rank-0.log"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::unique_ptr<testing::MeshCluster> cluster_;
};

TEST_F(WorkerEnvTest, TheOperatorsVariablesReachEveryWorkerAndTheJobsOwnWinOverThem) {
  const std::string file = WriteEnvFile(
      "# this node's network\n"
      "NCCL_SOCKET_IFNAME=eth7\n"
      "\n"
      "HTTPS_PROXY=http://proxy:3128\n"
      "PIP_INDEX_URL=http://mirror/simple\n");
  Start({}, {"--worker-env-file", file});
  if (HasFatalFailure()) return;
  v1::JobSpec spec = Spec({"/bin/sh", "-c",
                           "echo \"ifname=$NCCL_SOCKET_IFNAME proxy=$HTTPS_PROXY "
                           "index=$PIP_INDEX_URL\""});
  (*spec.mutable_env())["PIP_INDEX_URL"] = "http://mine/simple";
  auto job = Run(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->root_cause().message();
  EXPECT_THAT(RankLog(job->id()),
              HasSubstr("ifname=eth7 proxy=http://proxy:3128 index=http://mine/simple"));
}

TEST_F(WorkerEnvTest, ADeniedNameNeedsTheCoordinatorsAndTheNodesOperator) {
  // Only the coordinator's operator allows it: accepted at submit, refused
  // at launch by a node whose operator did not.
  Start({"--allow-job-env", "LD_LIBRARY_PATH"}, {});
  if (HasFatalFailure()) return;
  v1::JobSpec spec = Spec({"/bin/sh", "-c", "echo \"path=$LD_LIBRARY_PATH\""});
  (*spec.mutable_env())["LD_LIBRARY_PATH"] = "/opt/lib";
  auto job = Run(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->root_cause().message(), HasSubstr("LD_LIBRARY_PATH"));
  EXPECT_THAT(job->root_cause().message(), HasSubstr("--allow-job-env"));

  // Both allow it: the worker gets it.
  RestartAgent({"--allow-job-env", "LD_LIBRARY_PATH"});
  if (HasFatalFailure()) return;
  auto allowed = Run(spec);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(allowed->state(), v1::JOB_STATE_SUCCEEDED) << allowed->root_cause().message();
  EXPECT_THAT(RankLog(allowed->id()), HasSubstr("path=/opt/lib"));
}

TEST_F(WorkerEnvTest, ByDefaultTheCoordinatorRefusesADeniedNameNamingTheFlag) {
  Start({}, {});
  if (HasFatalFailure()) return;
  v1::JobSpec spec = Spec({"/bin/true"});
  (*spec.mutable_env())["LD_LIBRARY_PATH"] = "/opt/lib";
  auto job = testing::SubmitJob(cluster_->jobs(), spec);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("spec.env[\"LD_LIBRARY_PATH\"]"));
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("--allow-job-env"));
}

TEST_F(WorkerEnvTest, AMissingLibraryIsTheRootCauseAndTheOperatorsLibraryPathFixesIt) {
  Start({}, {});
  if (HasFatalFailure()) return;
  auto failed = Run(Spec({NEEDS_MISSING_LIB_BIN}));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->root_cause().exit_code(), 127);
  EXPECT_THAT(failed->root_cause().message(),
              HasSubstr("exited with code 127: error while loading shared libraries: "
                        "libmesh_test_missing_lib.so"));
  std::printf("root cause: %s\n", failed->root_cause().message().c_str());

  const std::string file = WriteEnvFile(absl::StrCat("LD_LIBRARY_PATH=", MISSING_LIB_DIR, "\n"));
  RestartAgent({"--worker-env-file", file});
  if (HasFatalFailure()) return;
  auto fixed = Run(Spec({NEEDS_MISSING_LIB_BIN}));
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->state(), v1::JOB_STATE_SUCCEEDED) << fixed->root_cause().message();
}

TEST_F(WorkerEnvTest, BadOperatorInputStopsTheAgentAtStartWithAReason) {
  const std::string reserved = WriteEnvFile("RANK=3\n");
  auto run = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv = {MESH_AGENT_BIN, "--coordinator", "127.0.0.1:1", "--work-dir",
                                     cluster_->dir() + "/bad"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto process = testing::Subprocess::Start(argv);
    EXPECT_TRUE(process.ok()) << process.status();
    auto status = process->Wait(absl::Seconds(20));
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? testing::ExitCode(*status) : -1;
  };
  EXPECT_EQ(run({"--worker-env-file", reserved}), 2);
  EXPECT_EQ(run({"--worker-env-file", cluster_->dir() + "/missing.env"}), 2);
  EXPECT_EQ(run({"--allow-job-env", "RANK"}), 2);
  EXPECT_EQ(run({"--allow-job-env", "PATH"}), 2);
}

}  // namespace worker_env_test
}  // namespace mesh
