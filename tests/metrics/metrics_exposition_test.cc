// /metrics of the real binaries: a coordinator, two agents and two
// libmesh workers (tests/metrics/metrics_worker, which runs an all_reduce
// and a DTensor redistribute) on 127.0.0.1, every metrics port 0.
//
//   - each exposition passes `promtool check metrics` (parses, and follows
//     Prometheus's naming and help-text lint);
//   - every metric the Grafana dashboard and the alert rules query is one
//     of those expositions exports (scripts/check_dashboard.py).
//
// The workers are scraped while they are held up; the coordinator and the
// agents after the job succeeded, so that the families that appear on
// first use (jobs finished, worker exits, RPCs, KV operations) are there.
// Without promtool or python3 the tests skip with a loud message.
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/metrics/metrics_test_util.h"
#include "tests/util/proc.h"

namespace mesh::testing {
namespace metrics_exposition_test {

using ::testing::HasSubstr;

const std::string kSource = MESH_SOURCE_DIR;

class MetricsExpositionTest : public ::testing::Test {
 protected:
  // Runs the cluster and a worker job; fills dumps_ (name -> file).
  void CollectDumps() {
    auto cluster = MetricsCluster::Start();
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);

    std::vector<int> worker_ports;
    absl::StatusOr<std::string> job =
        cluster_->StartHeldWorkerJob(METRICS_WORKER_BIN, &worker_ports);
    ASSERT_TRUE(job.ok()) << job.status();
    for (size_t rank = 0; rank < worker_ports.size(); ++rank) {
      ASSERT_GT(worker_ports[rank], 0) << "rank " << rank << " serves no /metrics";
      Save(absl::StrCat("worker-", rank), worker_ports[rank]);
    }
    // The coordinator lists the workers in its SD file too.
    std::vector<SdTarget> workers;
    EXPECT_TRUE(WaitUntil(
        [&] {
          auto targets = cluster_->Targets("worker");
          if (targets.ok()) workers = *targets;
          return workers.size() == worker_ports.size();
        },
        absl::Seconds(10)))
        << workers.size() << " worker targets in " << cluster_->sd_file();
    for (const SdTarget& w : workers) EXPECT_EQ(w.job, *job) << w.address;

    ASSERT_TRUE(cluster_->Release().ok());
    absl::StatusOr<mesh::v1::Job> done = cluster_->WaitTerminal(*job, absl::Seconds(60));
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), mesh::v1::JOB_STATE_SUCCEEDED) << done->DebugString();

    auto coordinators = cluster_->Targets("coordinator");
    ASSERT_TRUE(coordinators.ok()) << coordinators.status();
    ASSERT_EQ(coordinators->size(), 1u);
    Save("coordinator", coordinators->front().port);
    auto agents = cluster_->Targets("agent");
    ASSERT_TRUE(agents.ok()) << agents.status();
    ASSERT_EQ(agents->size(), static_cast<size_t>(MetricsCluster::kAgents));
    for (const SdTarget& agent : *agents) Save("agent-" + agent.node, agent.port);

    // Each binary says what it is: the scrapes reached the right processes.
    EXPECT_THAT(text_["coordinator"], HasSubstr("mesh_build_info{component=\"coordinator\""));
    EXPECT_THAT(text_["agent-node-0"], HasSubstr("mesh_build_info{component=\"agent\""));
    EXPECT_THAT(text_["worker-0"], HasSubstr("mesh_build_info{component=\"worker\""));
    EXPECT_THAT(text_["coordinator"],
                HasSubstr("mesh_coordinator_jobs_finished_total{state=\"SUCCEEDED\"} 1"));
  }

  void Save(const std::string& name, int port) {
    absl::StatusOr<std::string> text = Scrape(port);
    ASSERT_TRUE(text.ok()) << name << " on port " << port << ": " << text.status();
    const std::string path = absl::StrCat(cluster_->dir(), "/", name, ".prom");
    ASSERT_TRUE(WriteFile(path, *text).ok());
    dumps_[name] = path;
    text_[name] = *text;
  }

  std::unique_ptr<MetricsCluster> cluster_;
  std::map<std::string, std::string> dumps_;
  std::map<std::string, std::string> text_;
};

TEST_F(MetricsExpositionTest, EveryBinarysExpositionPassesPromtoolLint) {
  std::optional<std::string> promtool = FindTool("promtool", "MESH_PROMTOOL");
  if (!promtool.has_value()) {
    GTEST_SKIP() << MissingToolMessage("promtool", "MESH_PROMTOOL", "prometheus");
  }
  ASSERT_NO_FATAL_FAILURE(CollectDumps());
  ASSERT_EQ(dumps_.size(), 5u);  // coordinator, 2 agents, 2 workers
  for (const auto& [name, path] : dumps_) {
    absl::StatusOr<ToolResult> r = RunTool({*promtool, "check", "metrics"}, path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->exit_code, 0) << name << " (" << path << "):\n" << r->output;
    EXPECT_EQ(r->output, "") << name << ": promtool found problems";
  }
}

TEST_F(MetricsExpositionTest, DashboardAndAlertsUseOnlyMetricsTheBinariesExport) {
  std::optional<std::string> python = FindTool("python3", "MESH_PYTHON3");
  if (!python.has_value()) {
    GTEST_SKIP() << MissingToolMessage("python3", "MESH_PYTHON3", "python3");
  }
  ASSERT_NO_FATAL_FAILURE(CollectDumps());
  std::vector<std::string> args = {*python,       kSource + "/scripts/check_dashboard.py",
                                   "--dashboard", kSource + "/deploy/grafana/dashboards/mesh.json",
                                   "--rules",     kSource + "/deploy/prometheus/alerts.yml"};
  for (const auto& [name, path] : dumps_) {
    args.push_back("--metrics");
    args.push_back(path);
  }
  absl::StatusOr<ToolResult> r = RunTool(args);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->output;
  EXPECT_THAT(r->output, HasSubstr("OK")) << r->output;
}

}  // namespace metrics_exposition_test
}  // namespace mesh::testing
