// The deploy/ files checked by the tools that read them: promtool checks
// deploy/prometheus/prometheus.yml and alerts.yml and runs the alert unit
// tests (tests/metrics/alerts_test.yml); scripts/check_dashboard.py checks
// that the Grafana dashboard is well formed and that it and the alerts
// query only metrics docs/metrics.md documents. Each check is also shown to
// fail on a broken input, so that none can pass vacuously.
//
// promtool comes from Debian's `prometheus` package; without it (or
// python3) the tests skip with a loud message.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/metrics/metrics_test_util.h"

namespace mesh::testing {
namespace deploy_config_test {

using ::testing::HasSubstr;

const std::string kSource = MESH_SOURCE_DIR;
const std::string kConfig = kSource + "/deploy/prometheus/prometheus.yml";
const std::string kAlerts = kSource + "/deploy/prometheus/alerts.yml";
const std::string kAlertTests = kSource + "/tests/metrics/alerts_test.yml";
const std::string kDashboard = kSource + "/deploy/grafana/dashboards/mesh.json";
const std::string kChecker = kSource + "/scripts/check_dashboard.py";
const std::string kDocs = kSource + "/docs/metrics.md";

class DeployConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/mesh-deploy-config-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    tmp_ = pattern;
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf '", tmp_, "'").c_str()); }

  // Runs promtool with `args`, or skips the test when there is none.
  ToolResult Promtool(std::vector<std::string> args) {
    std::optional<std::string> promtool = FindTool("promtool", "MESH_PROMTOOL");
    if (!promtool.has_value()) {
      skipped_ = MissingToolMessage("promtool", "MESH_PROMTOOL", "prometheus");
      return {};
    }
    args.insert(args.begin(), *promtool);
    absl::StatusOr<ToolResult> result = RunTool(args);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : ToolResult{};
  }

  ToolResult CheckDashboard(std::vector<std::string> args) {
    std::optional<std::string> python = FindTool("python3", "MESH_PYTHON3");
    if (!python.has_value()) {
      skipped_ = MissingToolMessage("python3", "MESH_PYTHON3", "python3");
      return {};
    }
    args.insert(args.begin(), {*python, kChecker});
    absl::StatusOr<ToolResult> result = RunTool(args);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : ToolResult{};
  }

  std::string tmp_;
  std::string skipped_;
};

#define SKIP_IF_MISSING()                            \
  do {                                               \
    if (!skipped_.empty()) GTEST_SKIP() << skipped_; \
  } while (0)

TEST_F(DeployConfigTest, PromtoolAcceptsThePrometheusConfigAndItsRuleFile) {
  ToolResult r = Promtool({"check", "config", kConfig});
  SKIP_IF_MISSING();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SUCCESS: 1 rule files found")) << r.output;
}

TEST_F(DeployConfigTest, PromtoolAcceptsTheAlertRules) {
  ToolResult r = Promtool({"check", "rules", kAlerts});
  SKIP_IF_MISSING();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SUCCESS: 8 rules found")) << r.output;
}

TEST_F(DeployConfigTest, AlertsFireAndStayQuietAsTheirUnitTestsExpect) {
  ToolResult r = Promtool({"test", "rules", kAlertTests});
  SKIP_IF_MISSING();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SUCCESS")) << r.output;
}

TEST_F(DeployConfigTest, PromtoolRejectsABrokenRule) {
  const std::string broken = tmp_ + "/broken.yml";
  ASSERT_TRUE(WriteFile(broken,
                        "groups:\n  - name: x\n    rules:\n      - alert: Broken\n"
                        "        expr: rate(mesh_coordinator_job_restarts_total[5m] > 3\n")
                  .ok());
  ToolResult r = Promtool({"check", "rules", broken});
  SKIP_IF_MISSING();
  EXPECT_NE(r.exit_code, 0) << r.output;
}

TEST_F(DeployConfigTest, DashboardAndAlertsUseOnlyDocumentedMetrics) {
  ToolResult r = CheckDashboard({"--dashboard", kDashboard, "--rules", kAlerts, "--docs", kDocs});
  SKIP_IF_MISSING();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // The families of every row are there (the extractor found them).
  for (const char* name :
       {"mesh_coordinator_nodes", "mesh_coordinator_jobs_finished_total",
        "mesh_agent_heartbeat_age_seconds", "mesh_coordinator_rpc_duration_seconds_bucket",
        "mesh_collective_bytes_total", "mesh_agent_restarts_total"}) {
    EXPECT_THAT(r.output, HasSubstr(name)) << r.output;
  }
}

// A metric name with a typo (and a label value that looks like a metric),
// a repeated panel id, a panel tied to one data source.
constexpr char kBadDashboard[] = R"json({
  "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
  "panels": [
    {"id": 1, "type": "timeseries", "title": "ok",
     "datasource": {"type": "prometheus", "uid": "${datasource}"},
     "gridPos": {"h": 8, "w": 12, "x": 0, "y": 0},
     "targets": [{"refId": "A", "expr": "sum by (state) (mesh_coordinator_jobs)"}]},
    {"id": 2, "type": "timeseries", "title": "typo",
     "datasource": {"type": "prometheus", "uid": "${datasource}"},
     "gridPos": {"h": 8, "w": 12, "x": 12, "y": 0},
     "targets": [{"refId": "A",
                  "expr": "rate(mesh_coordinator_job_restart_total{x=\"mesh_fake\"}[5m])"}]},
    {"id": 2, "type": "stat", "title": "hardcoded",
     "datasource": {"type": "prometheus", "uid": "prod"},
     "gridPos": {"h": 8, "w": 12, "x": 0, "y": 8},
     "targets": [{"refId": "A", "expr": "up"}]}
  ]})json";

TEST_F(DeployConfigTest, DashboardCheckNamesAnUnknownMetricAndABadPanel) {
  const std::string dashboard = tmp_ + "/bad.json";
  ASSERT_TRUE(WriteFile(dashboard, kBadDashboard).ok());
  ToolResult r = CheckDashboard({"--dashboard", dashboard, "--docs", kDocs});
  SKIP_IF_MISSING();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("unknown metric mesh_coordinator_job_restart_total")) << r.output;
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("mesh_fake"))) << "label values are not metrics";
  EXPECT_THAT(r.output, HasSubstr("duplicate panel id")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("datasource is not ${datasource}")) << r.output;

  // Not valid JSON at all.
  ASSERT_TRUE(WriteFile(dashboard, "{\"panels\": [").ok());
  r = CheckDashboard({"--dashboard", dashboard, "--docs", kDocs});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("not valid JSON")) << r.output;
}

}  // namespace deploy_config_test
}  // namespace mesh::testing
