// Smoke only: runs `mesh-bench launch --smoke --no-torchrun` as a process (a
// real coordinator, agent and workers under it) so the harness cannot rot,
// and checks its report. Never asserts a time.
#include "bench/launch_bench.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/util/subprocess.h"

namespace mesh::bench {
namespace launch_bench_smoke_test {

namespace fs = std::filesystem;
using ::mesh::testing::Subprocess;
using ::testing::HasSubstr;

constexpr absl::Duration kRunTimeout = absl::Seconds(150);

struct BenchRun {
  int wait_status = -1;
  std::vector<std::string> lines;
  std::string text() const { return absl::StrJoin(lines, "\n"); }
};

// Runs mesh-bench with `args` and the environment overrides `env`
// ("NAME=value", set with env(1) so they replace inherited values), reading
// its stdout and stderr (merged) to the end.
BenchRun RunBench(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$@\" 2>&1", "sh", "/usr/bin/env"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(MESH_BENCH_BIN);
  argv.insert(argv.end(), args.begin(), args.end());
  BenchRun run;
  auto process = Subprocess::Start(argv);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return run;
  const absl::Time deadline = absl::Now() + kRunTimeout;
  while (true) {
    auto line = process->ReadLine(deadline - absl::Now());
    if (!line.ok()) {
      EXPECT_TRUE(absl::IsOutOfRange(line.status())) << line.status();
      break;
    }
    run.lines.push_back(*line);
  }
  auto status = process->Wait(std::max(deadline - absl::Now(), absl::Seconds(1)));
  EXPECT_TRUE(status.ok()) << status.status();
  if (status.ok()) run.wait_status = *status;
  return run;
}

void WriteFile(const std::string& path, const std::string& text, bool executable = false) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
  if (executable) {
    fs::permissions(path, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  }
}

class LaunchBenchSmoke : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/launch-bench-smoke-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(LaunchBenchSmoke, LaunchesJobsThroughARealClusterAndReportsAMedian) {
  const std::string json_path = dir_ + "/launch.json";
  const std::string tmp = dir_ + "/tmp";
  fs::create_directories(tmp);
  // TMPDIR: the bench's own temp dir goes there, so the test can see it is
  // removed.
  const BenchRun run =
      RunBench({"--json", json_path, "launch", "--smoke", "--no-torchrun"}, {"TMPDIR=" + tmp});
  ASSERT_TRUE(WIFEXITED(run.wait_status) && WEXITSTATUS(run.wait_status) == 0)
      << "wait status " << run.wait_status << "; output:\n"
      << run.text();
  EXPECT_THAT(run.text(), HasSubstr("mesh-bench launch: 2 local CPU ranks"));
  EXPECT_THAT(run.text(), HasSubstr("mesh: median "));
  EXPECT_THAT(run.text(), HasSubstr("torchrun: skipped (--no-torchrun)"));
  EXPECT_THAT(run.text(), ::testing::Not(HasSubstr("ratio (torchrun / mesh)")));

  std::ifstream in(json_path);
  ASSERT_TRUE(in) << json_path;
  const nlohmann::json json = nlohmann::json::parse(in);
  EXPECT_EQ(json["benchmark"], "launch");
  EXPECT_EQ(json["nproc"], 2);
  ASSERT_EQ(json["mesh"]["rounds"].size(), 1u);
  const nlohmann::json& round = json["mesh"]["rounds"][0];
  EXPECT_FALSE(round["job_id"].get<std::string>().empty());
  // Ordering, not timing: the last rank's Join completes after every
  // worker's main() began, and before the job SUCCEEDED was seen.
  const double launch = round["launch_s"].get<double>();
  EXPECT_GT(launch, 0);
  EXPECT_LE(round["first_main_s"].get<double>(), round["last_main_s"].get<double>());
  EXPECT_LE(round["last_main_s"].get<double>(), launch);
  EXPECT_LE(launch, round["succeeded_s"].get<double>());
  EXPECT_GT(round["submit_rpc_s"].get<double>(), 0);
  // The job's events were read: it was SCHEDULED and RUNNING.
  EXPECT_GT(round["scheduled_s"].get<double>(), -1);
  EXPECT_GT(round["running_s"].get<double>(), -1);
  EXPECT_DOUBLE_EQ(json["mesh"]["median_s"].get<double>(), launch);
  EXPECT_EQ(json["torchrun"]["skipped"], "--no-torchrun");
  EXPECT_FALSE(json.contains("ratio"));

  // Its temp dir (cluster state, worker time files) is gone.
  EXPECT_TRUE(fs::is_empty(tmp)) << "left behind in " << tmp;
}

TEST_F(LaunchBenchSmoke, AMissingBinaryFailsNamingTheFlag) {
  const BenchRun run =
      RunBench({"launch", "--smoke", "--no-torchrun", "--agent-bin", dir_ + "/no-such-agent"});
  ASSERT_TRUE(WIFEXITED(run.wait_status));
  EXPECT_EQ(WEXITSTATUS(run.wait_status), 1);
  EXPECT_THAT(run.text(), HasSubstr("--agent-bin " + dir_ + "/no-such-agent: not an executable"));
}

TEST_F(LaunchBenchSmoke, AFailingWorkerFailsTheRunNamingTheJobAndRank) {
  const std::string tmp = dir_ + "/tmp";
  fs::create_directories(tmp);
  const BenchRun run = RunBench(
      {"launch", "--smoke", "--no-torchrun", "--timeout", "20", "--worker-bin", "/bin/false"},
      {"TMPDIR=" + tmp});
  ASSERT_TRUE(WIFEXITED(run.wait_status));
  EXPECT_EQ(WEXITSTATUS(run.wait_status), 1) << run.text();
  EXPECT_THAT(run.text(), HasSubstr("ended JOB_STATE_FAILED"));
  EXPECT_THAT(run.text(), HasSubstr("exited with code 1"));
  // The logs are kept for reading, and the message says where.
  EXPECT_THAT(run.text(), HasSubstr("(logs kept in " + tmp + "/mesh-bench-launch-"));
}

// The torchrun half, end to end, against stand-ins: a `torchrun` on PATH
// that starts --nproc-per-node Python processes of the script with RANK
// set, and a `torch` package whose init_process_group returns at once. It
// checks the plumbing (probe, spawn, time files, ratio), not torch.
TEST_F(LaunchBenchSmoke, RunsTheTorchrunHalfAndPrintsTheRatio) {
  WriteFile(dir_ + "/bin/torchrun", R"(#!/usr/bin/env python3
import os, subprocess, sys
n, script = 1, None
for a in sys.argv[1:]:
    if a.startswith("--nproc_per_node="):
        n = int(a.split("=", 1)[1])
    elif not a.startswith("--"):
        script = a
procs = [subprocess.Popen([sys.executable, script], env=dict(os.environ, RANK=str(r)))
         for r in range(n)]
sys.exit(max(p.wait() for p in procs))
)",
            /*executable=*/true);
  WriteFile(dir_ + "/py/torch/__init__.py", "");
  WriteFile(dir_ + "/py/torch/distributed/__init__.py", R"(import os
def init_process_group(backend, timeout=None):
    assert backend == "gloo"
def get_rank():
    return int(os.environ["RANK"])
def destroy_process_group():
    pass
)");
  const char* path = std::getenv("PATH");
  const std::string json_path = dir_ + "/launch.json";
  const BenchRun run =
      RunBench({"--json", json_path, "launch", "--smoke"},
               {absl::StrCat("PATH=", dir_, "/bin:", path != nullptr ? path : "/usr/bin:/bin"),
                "PYTHONPATH=" + dir_ + "/py"});
  ASSERT_TRUE(WIFEXITED(run.wait_status) && WEXITSTATUS(run.wait_status) == 0)
      << "wait status " << run.wait_status << "; output:\n"
      << run.text();
  EXPECT_THAT(run.text(), HasSubstr("torchrun: median "));
  EXPECT_THAT(run.text(), HasSubstr("ratio (torchrun / mesh): "));
  std::ifstream in(json_path);
  ASSERT_TRUE(in) << json_path;
  const nlohmann::json json = nlohmann::json::parse(in);
  ASSERT_EQ(json["torchrun"]["rounds"].size(), 1u);
  const nlohmann::json& round = json["torchrun"]["rounds"][0];
  EXPECT_GT(round["launch_s"].get<double>(), 0);
  EXPECT_LE(round["last_main_s"].get<double>(), round["launch_s"].get<double>());
  EXPECT_LE(round["launch_s"].get<double>(), round["exited_s"].get<double>());
  EXPECT_GT(json["ratio"].get<double>(), 0);
}

TEST(LaunchBenchReport, PrintsRatioAndGoalsWhenTorchrunRan) {
  LaunchBenchResult result;
  result.nproc = 8;
  result.coordinator = "127.0.0.1:1234";
  result.mesh.resize(1);
  result.mesh[0].launch_s = 0.1;
  result.mesh_median_s = 0.1;
  result.torchrun_ran = true;
  result.torchrun.resize(1);
  result.torchrun[0].launch_s = 4.0;
  result.torchrun_median_s = 4.0;
  result.ratio = 40;
  const std::string text = FormatLaunchReport(result, 1);
  EXPECT_THAT(text, HasSubstr("mesh: median 0.100 s (goal < 0.3 s: met)"));
  EXPECT_THAT(text, HasSubstr("torchrun: median 4.000 s"));
  EXPECT_THAT(text, HasSubstr("ratio (torchrun / mesh): 40.0x (goal >= 5x: met)"));
  const nlohmann::json json = ToJson(result);
  EXPECT_EQ(json["ratio"], 40);
  EXPECT_EQ(json["ratio_meets_goal"], true);
  EXPECT_EQ(json["mesh_meets_goal"], true);
  EXPECT_EQ(json["torchrun"]["rounds"].size(), 1u);

  result.mesh_median_s = 0.5;
  result.ratio = 2;
  const std::string slow = FormatLaunchReport(result, 1);
  EXPECT_THAT(slow, HasSubstr("(goal < 0.3 s: NOT met)"));
  EXPECT_THAT(slow, HasSubstr("(goal >= 5x: NOT met)"));
}

TEST(LaunchBenchReport, SaysWhyTorchrunWasSkipped) {
  EXPECT_THAT(TorchrunUnavailableReason(""), HasSubstr("torchrun is not on PATH"));
  LaunchBenchResult result;
  result.torchrun_skip_reason = "python3-torch not installed: python3 cannot import torch";
  EXPECT_THAT(FormatLaunchReport(result, 0),
              HasSubstr("torchrun: skipped (python3-torch not installed: "));
}

}  // namespace launch_bench_smoke_test
}  // namespace mesh::bench
