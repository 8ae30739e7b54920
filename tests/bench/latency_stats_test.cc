#include "bench/latency_stats.h"

#include <gtest/gtest.h>

namespace mesh::bench {
namespace latency_stats_test {

TEST(LatencyStats, EmptyIsZero) {
  const LatencyStats s = Summarize({});
  EXPECT_EQ(s.count, 0);
  EXPECT_EQ(s.p99_us, 0);
}

TEST(LatencyStats, NearestRankPercentilesOfOneToHundred) {
  std::vector<absl::Duration> samples;
  for (int i = 100; i >= 1; --i) samples.push_back(absl::Microseconds(i));  // Unsorted.
  const LatencyStats s = Summarize(samples);
  EXPECT_EQ(s.count, 100);
  EXPECT_DOUBLE_EQ(s.p50_us, 50);
  EXPECT_DOUBLE_EQ(s.p90_us, 90);
  EXPECT_DOUBLE_EQ(s.p99_us, 99);
  EXPECT_DOUBLE_EQ(s.max_us, 100);
  EXPECT_DOUBLE_EQ(s.mean_us, 50.5);
}

TEST(LatencyStats, SingleSample) {
  const LatencyStats s = Summarize({absl::Milliseconds(2)});
  EXPECT_DOUBLE_EQ(s.p50_us, 2000);
  EXPECT_DOUBLE_EQ(s.p99_us, 2000);
}

}  // namespace latency_stats_test
}  // namespace mesh::bench
