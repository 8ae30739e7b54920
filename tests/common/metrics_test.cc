// common/metrics.cc (buckets, NoopRegistry) and tests/common/test_metrics.h.
#include "common/metrics.h"

#include <thread>
#include <vector>

#include "common/metrics_names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_metrics.h"

namespace mesh::metrics {
namespace metrics_test {

TEST(MetricsBucketsTest, LatencyBucketsIncreaseFrom100usTo100s) {
  const std::vector<double> buckets = LatencyBuckets();
  ASSERT_GE(buckets.size(), 10u);
  EXPECT_DOUBLE_EQ(buckets.front(), 0.0001);
  EXPECT_DOUBLE_EQ(buckets.back(), 100);
  for (size_t i = 1; i < buckets.size(); ++i) EXPECT_LT(buckets[i - 1], buckets[i]);
}

TEST(MetricsBucketsTest, ByteBucketsAreX4From1KiBTo4GiB) {
  const std::vector<double> buckets = ByteBuckets();
  ASSERT_EQ(buckets.size(), 12u);
  EXPECT_DOUBLE_EQ(buckets.front(), 1024);
  EXPECT_DOUBLE_EQ(buckets.back(), 4.0 * 1024 * 1024 * 1024);
  for (size_t i = 1; i < buckets.size(); ++i) EXPECT_DOUBLE_EQ(buckets[i], 4 * buckets[i - 1]);
}

TEST(MetricsNamesTest, PrometheusRules) {
  EXPECT_TRUE(IsValidMetricName("mesh_coordinator_jobs"));
  EXPECT_TRUE(IsValidMetricName("a:b_c9"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("9abc"));
  EXPECT_FALSE(IsValidMetricName("mesh-jobs"));
  EXPECT_TRUE(IsValidLabelName("state"));
  EXPECT_FALSE(IsValidLabelName("__name"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("1a"));
}

TEST(NoopRegistryTest, RecordsNothingAndReturnsTheSameFamily) {
  Registry& registry = NoopRegistry();
  Family<Counter>* counter = registry.AddCounter("mesh_test_noop_total", "help", {"op"});
  EXPECT_EQ(counter, registry.AddCounter("mesh_test_noop_total", "help", {"op"}));
  counter->WithLabels({"get"})->Increment();
  registry.AddGauge("mesh_test_noop_gauge", "help")->Get()->Set(3);
  registry.AddHistogram("mesh_test_noop_seconds", "help", {}, LatencyBuckets())->Get()->Observe(1);
  EXPECT_EQ(&NoopRegistry(), &registry);
}

TEST(NoopRegistryDeathTest, WrongLabelCountAborts) {
  Family<Counter>* counter = NoopRegistry().AddCounter("mesh_test_noop2_total", "help", {"op"});
  EXPECT_DEATH(counter->WithLabels({}), "label values");
  EXPECT_DEATH(NoopRegistry().AddGauge("mesh_test_noop2_total", "help", {"op"}), "another type");
  EXPECT_DEATH(NoopRegistry().AddCounter("bad-name", "help"), "bad metric name");
}

TEST(TestRegistryTest, ReadsBackCountersGaugesAndHistograms) {
  testing::TestRegistry registry;
  Family<Counter>* ops = registry.AddCounter("mesh_test_ops_total", "Ops.", {"op"});
  ops->WithLabels({"get"})->Increment();
  ops->WithLabels({"get"})->Increment(2);
  ops->WithLabels({"set"})->Increment();
  Gauge* keys = registry.AddGauge("mesh_test_keys", "Keys.")->Get();
  keys->Set(5);
  keys->Decrement();
  Histogram* latency =
      registry.AddHistogram("mesh_test_seconds", "Latency.", {"method"}, LatencyBuckets())
          ->WithLabels({"Join"});
  latency->Observe(0.5);
  latency->Observe(1.5);

  EXPECT_EQ(registry.CounterValue("mesh_test_ops_total", {"get"}), 3);
  EXPECT_EQ(registry.CounterValue("mesh_test_ops_total", {"set"}), 1);
  EXPECT_EQ(registry.CounterValue("mesh_test_ops_total", {"delete"}), 0);
  EXPECT_FALSE(registry.HasChild("mesh_test_ops_total", {"delete"}));
  EXPECT_TRUE(registry.HasChild("mesh_test_ops_total", {"set"}));
  EXPECT_EQ(registry.GaugeValue("mesh_test_keys"), 4);
  EXPECT_EQ(registry.HistogramCount("mesh_test_seconds", {"Join"}), 2u);
  EXPECT_DOUBLE_EQ(registry.HistogramSum("mesh_test_seconds", {"Join"}), 2.0);
  EXPECT_EQ(registry.Help("mesh_test_keys"), "Keys.");
  EXPECT_THAT(
      registry.Children("mesh_test_ops_total"),
      ::testing::ElementsAre(std::vector<std::string>{"get"}, std::vector<std::string>{"set"}));
  // Re-adding returns the same family and keeps values.
  registry.AddCounter("mesh_test_ops_total", "Ops.", {"op"})->WithLabels({"get"})->Increment();
  EXPECT_EQ(registry.CounterValue("mesh_test_ops_total", {"get"}), 4);
}

TEST(TestRegistryTest, ConcurrentRecordingCountsEverything) {
  testing::TestRegistry registry;
  Counter* counter = registry.AddCounter("mesh_test_concurrent_total", "Help.")->Get();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) counter->Increment();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(registry.CounterValue("mesh_test_concurrent_total"), 4000);
}

TEST(TestRegistryDeathTest, EnforcesTheRegistryRules) {
  testing::TestRegistry registry;
  registry.AddCounter("mesh_test_x_total", "Help.", {"op"});
  EXPECT_DEATH(registry.AddCounter("mesh_test_x_total", "Help.", {"other"}), "other labels");
  EXPECT_DEATH(registry.AddGauge("mesh_test_x_total", "Help."), "another type");
  EXPECT_DEATH(registry.AddGauge("mesh_test_y", ""), "no help");
}

}  // namespace metrics_test
}  // namespace mesh::metrics
