// A real Prometheus server scraping a real Mesh cluster through the
// coordinator's service-discovery file, with deploy/prometheus/prometheus.yml
// itself (only the SD path, the intervals and the rule file's path
// rewritten): the coordinator and both agents come up (up == 1), a job's
// success reaches mesh_coordinator_jobs_finished_total, the alert rules load
// and evaluate, and every query of the Grafana dashboard is one Prometheus
// accepts.
//
// Needs Debian's `prometheus` package (the server); skips loudly without.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tests/common/http_get.h"
#include "tests/metrics/metrics_test_util.h"
#include "tests/util/proc.h"

namespace mesh::testing {
namespace prometheus_scrape_test {

using ::testing::HasSubstr;

const std::string kSource = MESH_SOURCE_DIR;
constexpr absl::Duration kScrapeDeadline = absl::Seconds(60);

// deploy/prometheus/prometheus.yml with `replacements` applied; each `from`
// must occur exactly once, so that a change to the shipped file that this
// test no longer rewrites fails here instead of testing something else.
absl::StatusOr<std::string> RewrittenConfig(
    const std::vector<std::pair<std::string, std::string>>& replacements) {
  absl::StatusOr<std::string> config = ReadFile(kSource + "/deploy/prometheus/prometheus.yml");
  if (!config.ok()) return config.status();
  for (const auto& [from, to] : replacements) {
    const size_t at = config->find(from);
    if (at == std::string::npos || config->find(from, at + 1) != std::string::npos) {
      return absl::FailedPreconditionError(
          absl::StrCat("deploy/prometheus/prometheus.yml must contain '", from, "' exactly once"));
    }
    config->replace(at, from.size(), to);
  }
  return config;
}

class PrometheusScrapeTest : public ::testing::Test {
 protected:
  // /api/v1/query: the result vector, or an error.
  absl::StatusOr<nlohmann::json> Query(const std::string& promql) {
    absl::StatusOr<HttpReply> reply =
        HttpGet(prometheus_port_, "/api/v1/query?query=" + UrlEncode(promql), absl::Seconds(5));
    if (!reply.ok()) return reply.status();
    nlohmann::json body = nlohmann::json::parse(reply->body, nullptr, false);
    if (body.is_discarded() || body.value("status", "") != "success") {
      return absl::InternalError(absl::StrCat("HTTP ", reply->status, ": ", reply->body));
    }
    return body["data"]["result"];
  }

  // Waits until `promql` returns exactly `series` series (or, with -1, at
  // least one). Reports what it saw last.
  void ExpectSeriesEventually(const std::string& promql, int series) {
    std::string last = "no answer";
    const bool ok = WaitUntil(
        [&] {
          absl::StatusOr<nlohmann::json> result = Query(promql);
          last = result.ok() ? result->dump() : std::string(result.status().message());
          if (!result.ok()) return false;
          return series < 0 ? !result->empty() : static_cast<int>(result->size()) == series;
        },
        kScrapeDeadline);
    EXPECT_TRUE(ok) << promql << " after " << absl::FormatDuration(kScrapeDeadline)
                    << ": last result " << last;
  }

  int prometheus_port_ = 0;
};

TEST_F(PrometheusScrapeTest, ScrapesTheClusterThroughTheSdFileAndSeesAJobSucceed) {
  std::optional<std::string> prometheus = FindTool("prometheus", "MESH_PROMETHEUS");
  if (!prometheus.has_value()) {
    GTEST_SKIP() << MissingToolMessage("prometheus", "MESH_PROMETHEUS", "prometheus");
  }
  auto cluster = MetricsCluster::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  const std::string dir = (*cluster)->dir();
  absl::StatusOr<std::string> config = RewrittenConfig({
      {"- /var/lib/mesh/prometheus/targets.json", "- " + (*cluster)->sd_file()},
      {"scrape_interval: 15s", "scrape_interval: 1s"},
      {"scrape_timeout: 10s", "scrape_timeout: 1s"},
      {"evaluation_interval: 15s", "evaluation_interval: 1s"},
      {"refresh_interval: 1m", "refresh_interval: 1s"},
      {"  - alerts.yml", "  - " + kSource + "/deploy/prometheus/alerts.yml"},
  });
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(WriteFile(dir + "/prometheus.yml", *config).ok());

  absl::StatusOr<int> port = FreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  prometheus_port_ = *port;
  auto server = Subprocess::Start({*prometheus, "--config.file=" + dir + "/prometheus.yml",
                                   "--storage.tsdb.path=" + dir + "/tsdb",
                                   absl::StrCat("--web.listen-address=127.0.0.1:", *port),
                                   "--log.level=warn"});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<HttpReply> ready = HttpGet(*port, "/-/ready", absl::Seconds(2));
        return ready.ok() && ready->status == 200;
      },
      absl::Seconds(30)))
      << "prometheus did not become ready on 127.0.0.1:" << *port;

  // The coordinator and both agents, found through the SD file, are up.
  ExpectSeriesEventually("up{job=\"mesh\", mesh_component=\"coordinator\"} == 1", 1);
  ExpectSeriesEventually("up{job=\"mesh\", mesh_component=\"agent\", node=~\"node-0|node-1\"} == 1",
                         MetricsCluster::kAgents);
  ExpectSeriesEventually("mesh_agent_connected{mesh_component=\"agent\"} == 1",
                         MetricsCluster::kAgents);

  // A job on both nodes succeeds, and Prometheus sees it.
  mesh::v1::JobSpec spec;
  spec.set_name("true");
  spec.add_command("/bin/true");
  spec.mutable_nodes()->set_min(MetricsCluster::kAgents);
  spec.set_nproc_per_node(1);
  absl::StatusOr<std::string> id = (*cluster)->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<mesh::v1::Job> job = (*cluster)->WaitTerminal(*id, absl::Seconds(60));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), mesh::v1::JOB_STATE_SUCCEEDED) << job->DebugString();
  ExpectSeriesEventually(
      "mesh_coordinator_jobs_finished_total{job=\"mesh\", mesh_component=\"coordinator\", "
      "state=\"SUCCEEDED\"} >= 1",
      1);
  ExpectSeriesEventually("sum(mesh_agent_worker_exits_total{reason=\"exit_0\"}) >= 2", 1);

  // Every alert rule loaded and evaluates without error; none fires on a
  // healthy cluster.
  absl::StatusOr<HttpReply> rules = HttpGet(*port, "/api/v1/rules", absl::Seconds(5));
  ASSERT_TRUE(rules.ok()) << rules.status();
  nlohmann::json body = nlohmann::json::parse(rules->body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << rules->body;
  int loaded = 0;
  for (const auto& group : body["data"]["groups"]) {
    for (const auto& rule : group["rules"]) {
      ++loaded;
      EXPECT_EQ(rule.value("health", ""), "ok") << rule.dump();
      EXPECT_EQ(rule.value("state", ""), "inactive") << rule.dump();
    }
  }
  EXPECT_EQ(loaded, 8) << rules->body;

  // Every dashboard query is valid PromQL to this server.
  std::optional<std::string> python = FindTool("python3", "MESH_PYTHON3");
  if (python.has_value()) {
    absl::StatusOr<ToolResult> r = RunTool(
        {*python, kSource + "/scripts/check_dashboard.py", "--dashboard",
         kSource + "/deploy/grafana/dashboards/mesh.json", "--docs", kSource + "/docs/metrics.md",
         "--prometheus", absl::StrCat("http://127.0.0.1:", *port)});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->exit_code, 0) << r->output;
  } else {
    std::fprintf(stderr, "%s\n", MissingToolMessage("python3", "MESH_PYTHON3", "python3").c_str());
  }
  // server, then the cluster: the destructors kill and reap everything.
}

}  // namespace prometheus_scrape_test
}  // namespace mesh::testing
