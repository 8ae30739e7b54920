#include "bench/latency_stats.h"

#include <algorithm>
#include <cmath>

namespace mesh::bench {
namespace {

// Nearest-rank percentile of sorted microsecond values, q in (0, 1].
double Percentile(const std::vector<double>& sorted, double q) {
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

}  // namespace

LatencyStats Summarize(std::vector<absl::Duration> samples) {
  LatencyStats stats;
  if (samples.empty()) return stats;
  std::vector<double> us;
  us.reserve(samples.size());
  double sum = 0;
  for (absl::Duration d : samples) {
    us.push_back(absl::ToDoubleMicroseconds(d));
    sum += us.back();
  }
  std::sort(us.begin(), us.end());
  stats.count = static_cast<int>(us.size());
  stats.mean_us = sum / static_cast<double>(us.size());
  stats.p50_us = Percentile(us, 0.50);
  stats.p90_us = Percentile(us, 0.90);
  stats.p99_us = Percentile(us, 0.99);
  stats.max_us = us.back();
  return stats;
}

nlohmann::json ToJson(const LatencyStats& stats) {
  return {{"count", stats.count},   {"mean_us", stats.mean_us}, {"p50_us", stats.p50_us},
          {"p90_us", stats.p90_us}, {"p99_us", stats.p99_us},   {"max_us", stats.max_us}};
}

}  // namespace mesh::bench
