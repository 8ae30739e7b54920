// Smoke only: tiny sizes with -c, so the harness (process launch, coordinator
// rendezvous, every descriptor, the bandwidth formulas, JSON) cannot rot.
// Never asserts a time.
#include "bench/collectives_bench.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "tests/util/subprocess.h"

namespace mesh::bench {
namespace collectives_bench_smoke_test {

using ::mesh::testing::Subprocess;
using ::testing::HasSubstr;

CollectivesBenchOptions Tiny(int nproc) {
  CollectivesBenchOptions options;
  options.executable = MESH_BENCH_BIN;
  options.nproc = nproc;
  options.min_bytes = 1024;
  options.max_bytes = 4096;
  options.factor = 4;
  options.iterations = 2;
  options.warmup = 1;
  options.check = true;
  options.timeout = absl::Seconds(60);
  options.deadline = absl::Seconds(100);
  return options;
}

TEST(CollectivesBenchSmoke, EveryOpRunsChecksAndReportsBusBandwidth) {
  const CollectivesBenchOptions options = Tiny(3);
  std::vector<std::string> streamed;
  auto result =
      RunCollectivesBench(options, [&](const CollectivesRow& row) { streamed.push_back(row.op); });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->nproc, 3);
  // 5 ops x sizes 1 KiB and 4 KiB.
  ASSERT_EQ(result->rows.size(), 10u);
  EXPECT_EQ(streamed.size(), 10u);
  std::set<std::string> ops;
  for (const CollectivesRow& row : result->rows) {
    ops.insert(row.op);
    EXPECT_EQ(row.wrong, 0) << row.op << " " << row.bytes;
    EXPECT_GT(row.time_us, 0);
    EXPECT_GT(row.count, 0);
    // Counts of split ops are multiples of the process count.
    if (row.op != "all_reduce" && row.op != "broadcast") {
      EXPECT_EQ(row.count % 3, 0) << row.op;
    }
    const double factor = row.op == "all_reduce"  ? 4.0 / 3.0
                          : row.op == "broadcast" ? 1.0
                                                  : 2.0 / 3.0;
    EXPECT_NEAR(row.busbw_gbps, row.algbw_gbps * factor, 1e-12) << row.op;
    EXPECT_NEAR(row.algbw_gbps, row.bytes / (row.time_us * 1e3), 1e-9) << row.op;
    EXPECT_EQ(row.algorithm.empty(), row.op != "all_reduce") << row.op;
  }
  EXPECT_EQ(ops, (std::set<std::string>{"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                        "broadcast"}));
  const nlohmann::json json = ToJson(options, *result);
  EXPECT_EQ(json["benchmark"], "collectives");
  EXPECT_EQ(json["rows"].size(), 10u);
  auto back = RowFromJson(json["rows"][0]);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->op, result->rows[0].op);
}

TEST(CollectivesBenchSmoke, TheCommandLineWritesTheTableAndJson) {
  const std::string json_path = ::testing::TempDir() + "/collectives_smoke.json";
  auto process = Subprocess::Start({MESH_BENCH_BIN,
                                    "collectives",
                                    "-b",
                                    "1K",
                                    "-e",
                                    "2K",
                                    "-f",
                                    "2",
                                    "-n",
                                    "2",
                                    "-w",
                                    "1",
                                    "-c",
                                    "--nproc",
                                    "2",
                                    "--ops",
                                    "all_reduce,broadcast",
                                    "--algorithm",
                                    "ring",
                                    "--json",
                                    json_path});
  ASSERT_TRUE(process.ok()) << process.status();
  std::vector<std::string> lines;
  for (;;) {
    auto line = process->ReadLine(absl::Seconds(60));
    if (!line.ok()) break;
    lines.push_back(*line);
  }
  auto status = process->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  int rows = 0;
  for (const std::string& line : lines) {
    if (absl::StartsWith(line, "  all_reduce") || absl::StartsWith(line, "  broadcast")) ++rows;
  }
  EXPECT_EQ(rows, 4);
  EXPECT_THAT(lines.back(), HasSubstr("OK"));
  std::ifstream file(json_path);
  const nlohmann::json json = nlohmann::json::parse(file);
  EXPECT_EQ(json["nproc"], 2);
  EXPECT_EQ(json["allreduce_algorithm"], "ring");
  ASSERT_EQ(json["rows"].size(), 4u);
  EXPECT_EQ(json["rows"][0]["algorithm"], "ring");
  EXPECT_EQ(json["rows"][0]["wrong"], 0);
}

TEST(CollectivesBenchSmoke, RejectsBadOptions) {
  CollectivesBenchOptions options = Tiny(2);
  options.ops = {"all_reduce", "gather"};
  EXPECT_EQ(RunCollectivesBench(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Tiny(2);
  options.factor = 1;
  EXPECT_EQ(RunCollectivesBench(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Tiny(2);
  options.max_bytes = 10;
  EXPECT_EQ(RunCollectivesBench(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CollectivesBenchSmoke, AWorkerThatFailsFailsTheRunNamingIt) {
  CollectivesBenchOptions options = Tiny(2);
  options.executable = "/bin/false";  // Every "worker" exits 1 at once.
  auto result = RunCollectivesBench(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("exit code 1"));
}

}  // namespace collectives_bench_smoke_test
}  // namespace mesh::bench
