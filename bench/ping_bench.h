// mesh-bench ping: unary-call latency of the coordinator's AdminService
// against the floor, gRPC's built-in health Check on the same server and
// channel. The ratio is the coordinator's own per-call overhead.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "bench/latency_stats.h"

namespace mesh::bench {

struct PingBenchOptions {
  // Coordinator to measure; empty starts one in this process on 127.0.0.1:0.
  std::string coordinator;
  // Measured calls per method, and unmeasured warm-up calls per method.
  int iterations = 5000;
  int warmup = 500;
  // Calls are made in alternating blocks of this size, so that drift on a
  // shared machine hits both methods alike.
  int block = 100;
};

struct PingBenchResult {
  std::string coordinator;
  LatencyStats get_server_info;
  LatencyStats health_check;  // The baseline.
  double p50_ratio = 0;       // get_server_info.p50 / health_check.p50.
  double p99_ratio = 0;
};

// Possible errors: INVALID_ARGUMENT for non-positive counts; UNAVAILABLE when
// the coordinator cannot be started or reached; any error a call returns.
absl::StatusOr<PingBenchResult> RunPingBench(const PingBenchOptions& options);

nlohmann::json ToJson(const PingBenchResult& result);

}  // namespace mesh::bench
