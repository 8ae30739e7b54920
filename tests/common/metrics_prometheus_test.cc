// common/metrics_prometheus.cc: PrometheusRegistry through a real /metrics
// scrape on 127.0.0.1 (port 0), and MetricsServer's errors.
#include "common/metrics_prometheus.h"

#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/http_get.h"

namespace mesh::metrics {
namespace metrics_prometheus_test {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(PrometheusRegistryTest, ScrapeShowsFamiliesLabelsAndBuckets) {
  PrometheusRegistry registry;
  AddBuildInfo(registry, "coordinator");
  Family<Counter>* ops = registry.AddCounter("mesh_test_kv_operations_total", "KV calls.", {"op"});
  ops->WithLabels({"get"})->Increment(3);
  ops->WithLabels({"set"})->Increment();
  EXPECT_EQ(ops->WithLabels({"get"}), ops->WithLabels({"get"}));  // Children are cached.
  EXPECT_EQ(ops, registry.AddCounter("mesh_test_kv_operations_total", "KV calls.", {"op"}));
  registry.AddGauge("mesh_test_keys", "Keys stored.")->Get()->Set(7);
  Histogram* latency = registry
                           .AddHistogram("mesh_test_rpc_duration_seconds", "RPC latency.",
                                         {"method", "code"}, {0.1, 1, 10})
                           ->WithLabels({"Join", "OK"});
  latency->Observe(0.05);
  latency->Observe(5);

  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);

  absl::StatusOr<testing::HttpReply> reply = testing::HttpGet((*server)->port(), "/metrics");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  const std::string& body = reply->body;
  EXPECT_THAT(body, HasSubstr("# HELP mesh_test_kv_operations_total KV calls."));
  EXPECT_THAT(body, HasSubstr("# TYPE mesh_test_kv_operations_total counter"));
  EXPECT_THAT(body, HasSubstr("mesh_test_kv_operations_total{op=\"get\"} 3"));
  EXPECT_THAT(body, HasSubstr("mesh_test_kv_operations_total{op=\"set\"} 1"));
  EXPECT_THAT(body, HasSubstr("# TYPE mesh_test_keys gauge"));
  EXPECT_THAT(body, HasSubstr("mesh_test_keys 7"));
  EXPECT_THAT(body, HasSubstr("# TYPE mesh_test_rpc_duration_seconds histogram"));
  EXPECT_THAT(body, HasSubstr("mesh_test_rpc_duration_seconds_bucket{code=\"OK\",method=\"Join\","
                              "le=\"0.1\"} 1"));
  EXPECT_THAT(body, HasSubstr("mesh_test_rpc_duration_seconds_bucket{code=\"OK\",method=\"Join\","
                              "le=\"10\"} 2"));
  EXPECT_THAT(body, HasSubstr("mesh_test_rpc_duration_seconds_bucket{code=\"OK\",method=\"Join\","
                              "le=\"+Inf\"} 2"));
  EXPECT_THAT(body,
              HasSubstr("mesh_test_rpc_duration_seconds_count{code=\"OK\",method=\"Join\"} 2"));
  EXPECT_THAT(body, HasSubstr(absl::StrCat("mesh_build_info{component=\"coordinator\",protocol=\"",
                                           kProtocolVersion, "\",version=\"", kVersion, "\"} 1")));

  // Recording after the server started shows in the next scrape.
  ops->WithLabels({"delete"})->Increment();
  reply = testing::HttpGet((*server)->port(), "/metrics");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_THAT(reply->body, HasSubstr("mesh_test_kv_operations_total{op=\"delete\"} 1"));
  EXPECT_THAT(registry.Serialize(), HasSubstr("mesh_test_keys 7"));
}

TEST(PrometheusRegistryTest, UnknownPathIsNotFound) {
  PrometheusRegistry registry;
  auto server = MetricsServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  auto reply = testing::HttpGet((*server)->port(), "/nothing");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 404);
  EXPECT_THAT(reply->body, Not(HasSubstr("mesh_")));
}

TEST(MetricsServerTest, PortInUseIsUnavailable) {
  PrometheusRegistry registry;
  auto first = MetricsServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsServer::Start("127.0.0.1", (*first)->port(), registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

TEST(MetricsServerTest, BadPortIsInvalidArgument) {
  PrometheusRegistry registry;
  EXPECT_EQ(MetricsServer::Start("127.0.0.1", 70000, registry).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsServer::Start("127.0.0.1", -1, registry).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PrometheusRegistryDeathTest, ReAddingWithOtherLabelsOrTypeAborts) {
  PrometheusRegistry registry;
  registry.AddCounter("mesh_test_x_total", "Help.", {"op"});
  EXPECT_DEATH(registry.AddCounter("mesh_test_x_total", "Help.", {"other"}), "other labels");
  EXPECT_DEATH(registry.AddGauge("mesh_test_x_total", "Help.", {"op"}), "another type");
  EXPECT_DEATH(registry.AddGauge("bad name", "Help."), "bad metric name");
}

}  // namespace metrics_prometheus_test
}  // namespace mesh::metrics
