// Smoke only: the whole `make bench` pipeline at smoke sizes
// (scripts/bench.sh --smoke: every mesh-bench suite, the peers in
// bench/peers/ where torch or OpenMPI are installed, bench/report.py), and
// `mesh-bench --smoke` running every suite. Checks that the report has a
// row per suite and that nothing failed; never asserts a time.
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/util/subprocess.h"

namespace mesh::bench {
namespace bench_report_smoke_test {

using ::mesh::testing::Subprocess;

std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "mesh-bench-report-XXXXXX";
  const char* dir = mkdtemp(pattern.data());
  return dir == nullptr ? "" : std::string(dir);
}

// Runs argv to completion with a deadline; returns its stdout lines.
std::vector<std::string> RunToEnd(const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env, absl::Duration deadline,
                                  int* exit_status) {
  auto process = Subprocess::Start(argv, env);
  EXPECT_TRUE(process.ok()) << process.status();
  std::vector<std::string> lines;
  if (!process.ok()) return lines;
  const absl::Time end = absl::Now() + deadline;
  for (;;) {
    auto line = process->ReadLine(std::max(end - absl::Now(), absl::Seconds(1)));
    if (!line.ok()) {
      EXPECT_TRUE(absl::IsOutOfRange(line.status())) << line.status();
      break;
    }
    lines.push_back(*line);
  }
  auto status = process->Wait(absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status.status();
  *exit_status = status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  return lines;
}

TEST(BenchReportSmoke, PipelineWritesOneTableWithEverySuite) {
  const std::string out = MakeTempDir();
  ASSERT_FALSE(out.empty());
  int status = -1;
  const auto lines =
      RunToEnd({"/bin/bash", MESH_SOURCE_DIR "/scripts/bench.sh", "--smoke", MESH_BUILD_DIR},
               {"MESH_BENCH_OUT=" + out, "MESH_BENCH_NO_INSTALL=1"}, absl::Seconds(270), &status);
  ASSERT_EQ(status, 0) << "scripts/bench.sh --smoke failed; see stderr";

  // Exactly one Markdown table, with the report's columns.
  int headers = 0, table_rows = 0;
  for (const std::string& line : lines) {
    if (line == "| suite | row | Mesh | peer | ratio | note |") ++headers;
    if (absl::StartsWith(line, "| ") && !absl::StartsWith(line, "| suite ")) ++table_rows;
  }
  EXPECT_EQ(headers, 1);

  std::ifstream file(out + "/latest.json");
  ASSERT_TRUE(file) << "no latest.json in " << out;
  const nlohmann::json doc = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(doc.is_object());
  ASSERT_TRUE(doc.contains("rows"));
  EXPECT_EQ(static_cast<int>(doc["rows"].size()), table_rows);
  EXPECT_TRUE(doc["machine"].contains("cores"));

  std::set<std::string> suites;
  // The rendezvous rows: every rank its own connection, three ways.
  std::set<std::string> rendezvous_rows;
  for (const nlohmann::json& row : doc["rows"]) {
    const std::string suite = row["suite"];
    const std::string name = row["row"];
    suites.insert(suite);
    if (suite == "rendezvous") rendezvous_rows.insert(name.substr(0, name.find(':')));
    // Mesh's figure is a number, except where the GPU section skips and
    // where python_bench.py's collectives skip for want of torch.
    if (suite == "gpu" || suite == "python") {
      EXPECT_TRUE(row["mesh"].is_number() || row["mesh"] == "skipped") << name;
    } else {
      EXPECT_TRUE(row["mesh"].is_number())
          << suite << ": " << name << " = " << row["mesh"] << " (" << row["note"] << ")";
    }
    // A peer that is installed must have run; one that is not says why.
    if (row["peer"].is_string()) {
      const std::string peer = row["peer"];
      EXPECT_THAT(peer, ::testing::AnyOf("skipped", "unsupported", "—"))
          << suite << ": " << name << " (" << row["note"] << ")";
      if (peer != "—") {
        EXPECT_FALSE(row["note"].get<std::string>().empty()) << name;
      }
    }
  }
  EXPECT_EQ(suites,
            (std::set<std::string>{"rpc latency", "rendezvous", "waiters", "collectives (2 procs)",
                                   "redistribute", "launch", "recovery", "metrics", "progress",
                                   "store", "python", "gpu"}));
  EXPECT_EQ(rendezvous_rows,
            (std::set<std::string>{"64 ranks, a connection each", "64 ranks through agents of 8",
                                   "64 ranks through agents of 8, TLS"}));
  std::filesystem::remove_all(out);
}

TEST(BenchReportSmoke, MeshBenchSmokeAloneRunsEverySuite) {
  const std::string out = MakeTempDir();
  ASSERT_FALSE(out.empty());
  int status = -1;
  const auto lines =
      RunToEnd({MESH_BENCH_BIN, "--smoke", "--json-dir", out}, {}, absl::Seconds(240), &status);
  EXPECT_EQ(status, 0);
  for (const char* suite : {"ping", "rendezvous", "waiters", "collectives", "redistribute",
                            "launch", "metrics", "store", "nccl-overhead", "dtensor-pack"}) {
    EXPECT_TRUE(std::filesystem::exists(absl::StrCat(out, "/", suite, ".json"))) << suite;
  }
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "# mesh-bench --smoke: 11 suites, 0 failed");
  std::filesystem::remove_all(out);
}

TEST(BenchReportSmoke, NoSuiteWithoutSmokeIsAnError) {
  int status = -1;
  RunToEnd({MESH_BENCH_BIN}, {}, absl::Seconds(30), &status);
  EXPECT_EQ(status, 2);
}

}  // namespace bench_report_smoke_test
}  // namespace mesh::bench
