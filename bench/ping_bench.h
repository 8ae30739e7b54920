// mesh-bench ping: unary-call latency of the coordinator against the floor,
// gRPC's built-in health Check on the same server and channel. The ratio is
// the coordinator's own per-call overhead. Three coordinator calls:
//
//   AdminService.GetServerInfo  no state at all (gRPC + the service shell)
//   WorkerService.KvGet         a 128-byte value, try-get, as a joined rank
//   WorkerService.Heartbeat     the liveness path, as a joined rank
//
// The worker calls need a rank: the bench creates a one-rank job through
// AdminService.CreateJob, joins it and sets the key before measuring.
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
  LatencyStats kv_get;
  LatencyStats heartbeat;
  LatencyStats health_check;  // The baseline.
  double p50_ratio = 0;       // get_server_info.p50 / health_check.p50.
  double p99_ratio = 0;
  double kv_get_p50_ratio = 0;  // Likewise for KvGet,
  double kv_get_p99_ratio = 0;
  double heartbeat_p50_ratio = 0;  // and for Heartbeat.
  double heartbeat_p99_ratio = 0;
};

// Possible errors: INVALID_ARGUMENT for non-positive counts; UNAVAILABLE when
// the coordinator cannot be started or reached; any error a call returns.
absl::StatusOr<PingBenchResult> RunPingBench(const PingBenchOptions& options);

nlohmann::json ToJson(const PingBenchResult& result);

}  // namespace mesh::bench
