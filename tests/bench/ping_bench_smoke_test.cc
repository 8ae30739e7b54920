#include "bench/ping_bench.h"

#include <gtest/gtest.h>

namespace mesh::bench {
namespace ping_bench_smoke_test {

TEST(PingBenchSmoke, MeasuresEveryMethodAgainstAnInProcessCoordinator) {
  PingBenchOptions options;
  options.iterations = 25;
  options.warmup = 2;
  options.block = 10;
  auto result = RunPingBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->get_server_info.count, 25);
  EXPECT_EQ(result->health_check.count, 25);
  // KvGet and Heartbeat ran as a joined rank (KvGet checks the value).
  EXPECT_EQ(result->kv_get.count, 25);
  EXPECT_EQ(result->heartbeat.count, 25);
  EXPECT_GT(result->kv_get_p50_ratio, 0);
  EXPECT_GT(result->heartbeat_p99_ratio, 0);
  EXPECT_GT(result->health_check.p50_us, 0);
  EXPECT_GT(result->p50_ratio, 0);
  const nlohmann::json json = ToJson(*result);
  EXPECT_EQ(json["benchmark"], "ping");
  EXPECT_EQ(json["get_server_info"]["count"], 25);
  EXPECT_EQ(json["kv_get"]["count"], 25);
  EXPECT_EQ(json["heartbeat"]["count"], 25);
}

TEST(PingBenchSmoke, RejectsBadOptionsAndUnreachableCoordinators) {
  PingBenchOptions bad;
  bad.iterations = 0;
  EXPECT_EQ(RunPingBench(bad).status().code(), absl::StatusCode::kInvalidArgument);
  PingBenchOptions nowhere;
  nowhere.coordinator = "127.0.0.1:1";
  nowhere.iterations = 1;
  nowhere.warmup = 1;
  EXPECT_EQ(RunPingBench(nowhere).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace ping_bench_smoke_test
}  // namespace mesh::bench
