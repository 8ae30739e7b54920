// Latency samples -> summary statistics (nearest-rank percentiles).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "absl/time/time.h"

namespace mesh::bench {

struct LatencyStats {
  int count = 0;
  double mean_us = 0;
  double p50_us = 0;
  double p90_us = 0;
  double p99_us = 0;
  double max_us = 0;
};

// Summarizes `samples` (any order). An empty input gives count 0 and zeros.
LatencyStats Summarize(std::vector<absl::Duration> samples);

nlohmann::json ToJson(const LatencyStats& stats);

}  // namespace mesh::bench
