// Smoke only: `mesh-bench redistribute --smoke` (tiny sizes, worlds of 2 and
// 4 processes), so that the harness (process launch, the DTensor calls, the
// raw baselines built from each plan, the correctness check, the table and
// the JSON) cannot rot. Never asserts a time.
#include "bench/redistribute_bench.h"

#include <sys/wait.h>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "tests/util/subprocess.h"

namespace mesh::bench {
namespace redistribute_bench_smoke_test {

using ::mesh::testing::Subprocess;
using ::testing::HasSubstr;

TEST(RedistributeBenchSmoke, TheCommandLineRunsEveryCaseAndWritesJson) {
  const std::string json_path = ::testing::TempDir() + "/redistribute_smoke.json";
  auto process =
      Subprocess::Start({MESH_BENCH_BIN, "redistribute", "--smoke", "--json", json_path});
  ASSERT_TRUE(process.ok()) << process.status();
  std::vector<std::string> lines;
  for (;;) {
    auto line = process->ReadLine(absl::Seconds(120));
    if (!line.ok()) {
      EXPECT_EQ(line.status().code(), absl::StatusCode::kOutOfRange) << line.status();
      break;
    }
    lines.push_back(*line);
  }
  auto status = process->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back(), HasSubstr("wrong elements: 0 OK"));

  std::ifstream file(json_path);
  const nlohmann::json json = nlohmann::json::parse(file);
  EXPECT_EQ(json["benchmark"], "redistribute");
  // Worlds 2 and 4: 4 one-dim cases x 2 sizes each, plus the 2-D case x 2
  // sizes on the world of 4 only.
  ASSERT_EQ(json["rows"].size(), 4u * 2 + 4u * 2 + 2u);
  std::set<std::string> cases;
  int table_rows = 0;
  for (const std::string& line : lines) {
    if (absl::StartsWith(line, "| ") && !absl::StartsWith(line, "| transition")) ++table_rows;
  }
  EXPECT_EQ(table_rows, 18);
  for (const auto& j : json["rows"]) {
    auto row = RedistributeRowFromJson(j);
    ASSERT_TRUE(row.ok()) << row.status();
    cases.insert(row->case_name);
    SCOPED_TRACE(row->transition + " " + row->mesh);
    EXPECT_EQ(row->wrong, 0);
    EXPECT_GT(row->redistribute_us, 0);
    EXPECT_GT(row->raw_us, 0);
    EXPECT_NEAR(row->ratio, row->redistribute_us / row->raw_us, 1e-9);
    EXPECT_GT(row->paired_ratio, 0);
    ASSERT_EQ(row->shape.size(), 2u);
    EXPECT_EQ(row->bytes, row->shape[0] * row->shape[1] * 4);
    EXPECT_GT(row->plan_bytes_per_rank, 0);
    // The 1-D plans are the one collective the transition names.
    const std::map<std::string, std::string> one_step = {{"s0_r", "all_gather"},
                                                         {"p_r", "all_reduce"},
                                                         {"p_s0", "reduce_scatter"},
                                                         {"s0_s1", "all_to_all"}};
    if (auto it = one_step.find(row->case_name); it != one_step.end()) {
      EXPECT_EQ(row->plan, it->second);
    } else {
      EXPECT_EQ(row->mesh, "(2, 2)");
      EXPECT_THAT(row->plan, HasSubstr("all_gather(dp)"));
      EXPECT_THAT(row->plan, HasSubstr("all_gather(tp)"));
    }
  }
  EXPECT_EQ(cases, (std::set<std::string>{"s0_r", "p_r", "p_s0", "s0_s1", "s0s1_rr"}));
}

TEST(RedistributeBenchSmoke, RejectsBadOptions) {
  RedistributeBenchOptions options;
  options.executable = MESH_BENCH_BIN;
  options.cases = {"s0_r", "s1_r"};
  EXPECT_EQ(RunRedistributeBench(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = RedistributeBenchOptions();
  options.sizes = {2};
  EXPECT_EQ(RunRedistributeBench(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = RedistributeBenchOptions();
  options.nprocs = {0};
  EXPECT_EQ(RunRedistributeBench(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RedistributeBenchSmoke, ASizeTheMeshDoesNotDivideFailsTheRunNamingIt) {
  RedistributeBenchOptions options;
  options.executable = MESH_BENCH_BIN;
  options.nprocs = {3};  // 32 x 32 does not split three ways evenly.
  options.sizes = {4096};
  options.cases = {"s0_r"};
  options.iterations = 1;
  options.warmup = 0;
  options.timeout = absl::Seconds(60);
  options.deadline = absl::Seconds(100);
  auto result = RunRedistributeBench(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("worker rank"));
}

}  // namespace redistribute_bench_smoke_test
}  // namespace mesh::bench
