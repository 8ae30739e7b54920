// Labels gpu, integration: a GPU job end to end on a real device. A
// coordinator and an agent that discovers the host's GPUs through NVML; a
// 1-GPU job of examples/allreduce_2d --device cuda submitted with meshctl,
// which must SUCCEED with CUDA_VISIBLE_DEVICES set to the GPU the agent gave
// it and the agent's GPU accounting following the job; and the same job
// SIGKILLed in the middle of its collectives, which must restart and
// succeed (ncclCommAbort and a fresh communicator on a real device). While
// that job runs, the agent's /metrics show its GPU and what NVML reads of
// it (mesh_agent_job_gpu_*).
//
// Skips without NCCL in the build, without a visible CUDA device, or when
// the agent's NVML discovery finds no GPU. MESH_TEST_BIN_DIR, when set,
// names the folder of the binaries it starts (the GPU bundle's bin/;
// docs/gpu.md) instead of their build paths.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "mesh/build_info.h"
#include "tests/metrics/metrics_test_util.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh::testing {
namespace gpu_job_test {

using ::testing::HasSubstr;

constexpr absl::Duration kJobTimeout = absl::Minutes(3);

// The value of `family`{job="<job>"} in a Prometheus text body; nullopt
// when the body has no such sample.
std::optional<double> JobSample(const std::string& body, const std::string& family,
                                const std::string& job) {
  const std::string prefix = absl::StrCat(family, "{job=\"", job, "\"} ");
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    double value = 0;
    if (absl::ConsumePrefix(&line, prefix) && absl::SimpleAtod(line, &value)) return value;
  }
  return std::nullopt;
}

// `name` in MESH_TEST_BIN_DIR when that is set, else the build's `built`.
std::string Binary(const char* name, const char* built) {
  const char* dir = std::getenv("MESH_TEST_BIN_DIR");
  return dir != nullptr && *dir != '\0' ? absl::StrCat(dir, "/", name) : built;
}

class GpuJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GetBuildInfo().has_nccl) GTEST_SKIP() << "built without NCCL";
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    absl::StatusOr<int> port = FreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    metrics_port_ = *port;
    ASSERT_TRUE(cluster_
                    .StartAgent(0, /*slots=*/1, /*gpus=*/"auto",
                                {"--metrics-port", absl::StrCat(metrics_port_)})
                    .ok());
    ASSERT_TRUE(WaitUntil([&] { return cluster_.ReadyNodes() == 1; }, absl::Seconds(30)));
    absl::StatusOr<v1::Node> node = GetNode(cluster_.jobs(), "node-0");
    ASSERT_TRUE(node.ok()) << node.status();
    if (node->gpus_size() == 0) GTEST_SKIP() << "the agent's NVML discovery found no GPU";
    gpu_ = node->gpus(0).index();
    gpus_ = node->gpus_size();
    EXPECT_EQ(node->free_gpus(), gpus_);
  }

  CommandOutput Meshctl(std::vector<std::string> args) {
    std::vector<std::string> argv = {Binary("meshctl", MESHCTL_BIN), "--coordinator",
                                     cluster_.address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunMerged(argv, kJobTimeout);
  }

  int FreeGpus() {
    absl::StatusOr<v1::Node> node = GetNode(cluster_.jobs(), "node-0");
    return node.ok() ? node->free_gpus() : -1;
  }

  const std::string example_ = Binary("allreduce_2d", ALLREDUCE_2D_BIN);
  MeshCluster cluster_{
      {Binary("mesh-coordinator", MESH_COORDINATOR_BIN), Binary("mesh-agent", MESH_AGENT_BIN)},
      "mesh-gpu-job"};
  int metrics_port_ = 0;  // The agent's /metrics.
  int gpu_ = -1;          // The first GPU the agent discovered.
  int gpus_ = 0;          // How many it discovered.
};

TEST_F(GpuJobTest, CudaExampleSucceedsOnTheGpuTheAgentGaveIt) {
  // The shell prints what the agent put in the environment, then becomes
  // the worker.
  CommandOutput submit = Meshctl(
      {"submit", "--name", "gpu-allreduce", "--nodes", "1", "--nproc-per-node", "1",
       "--gpus-per-proc", "1", "--", "/bin/sh", "-c",
       "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; exec \"$0\" --device cuda", example_});
  EXPECT_EQ(submit.code, 0) << submit.output;
  EXPECT_THAT(submit.output, HasSubstr(absl::StrCat("CUDA_VISIBLE_DEVICES=", gpu_)));
  EXPECT_THAT(submit.output, HasSubstr("all-reduce on cuda:0 ok"));
  EXPECT_THAT(submit.output, HasSubstr("rank 0: ok"));
  // The job's GPU is the node's again.
  EXPECT_TRUE(WaitUntil([&] { return FreeGpus() == gpus_; }, absl::Seconds(10)));
}

TEST_F(GpuJobTest, WorkerKilledMidCollectivesRestartsAndSucceeds) {
  // Not MESH_*: that prefix is the agent's, and submit refuses it.
  const std::string marker = absl::StrCat("GPU_JOB_TEST_MARKER=", ::getpid());
  // Generation 0 all-reduces for a long time; the restart runs one round.
  CommandOutput submit = Meshctl(
      {"submit", "--parsable", "--name", "gpu-kill", "--nodes", "1", "--nproc-per-node", "1",
       "--gpus-per-proc", "1", "--max-restarts", "1", "--env", marker, "--", "/bin/sh", "-c",
       "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec \"$0\" --device cuda --rounds "
       "100000000; else exec \"$0\" --device cuda; fi",
       example_});
  ASSERT_EQ(submit.code, 0) << submit.output;
  const std::string job(absl::StripAsciiWhitespace(submit.output));

  // Mid-collectives: the first round has completed and the loop goes on.
  ASSERT_TRUE(WaitUntil(
      [&] {
        return absl::StrContains(Meshctl({"logs", job}).output, "rank 0: round 1 ok");
      },
      absl::Seconds(60)))
      << Meshctl({"logs", job}).output;
  EXPECT_EQ(FreeGpus(), gpus_ - 1) << "a running GPU job holds one of the node's GPUs";
  // The agent's per-job GPU figures: one GPU, and NVML's reading of it (the
  // worker's CUDA context and NCCL buffers alone take device memory).
  std::string body;
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<std::string> scraped = Scrape(metrics_port_);
        body = scraped.ok() ? *scraped : scraped.status().ToString();
        return JobSample(body, "mesh_agent_job_gpu_memory_bytes", job).value_or(0) > 0;
      },
      absl::Seconds(20)))
      << body;
  EXPECT_EQ(JobSample(body, "mesh_agent_job_gpus", job), 1.0) << body;
  const std::optional<double> utilization =
      JobSample(body, "mesh_agent_job_gpu_utilization_ratio", job);
  ASSERT_TRUE(utilization.has_value()) << body;
  EXPECT_GE(*utilization, 0.0);
  EXPECT_LE(*utilization, 1.0);
  std::vector<pid_t> workers = LiveProcessesWithEnv({marker});
  ASSERT_EQ(workers.size(), 1u);
  ASSERT_EQ(::kill(workers[0], SIGKILL), 0);

  CommandOutput wait = Meshctl({"wait", job, "--timeout", "90s"});
  EXPECT_EQ(wait.code, 0) << wait.output << Meshctl({"describe", job}).output;
  absl::StatusOr<v1::Job> done = cluster_.GetJob(job);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done->restarts(), 1);
  EXPECT_THAT(Meshctl({"describe", job}).output, HasSubstr("SIGKILL"));
  EXPECT_TRUE(WaitUntil([&] { return FreeGpus() == gpus_; }, absl::Seconds(10)));
}

}  // namespace gpu_job_test
}  // namespace mesh::testing
