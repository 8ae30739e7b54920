// mesh-bench store: the coordinator's job store on SQLite and on etcd, side
// by side in one run (docs/ha.md, docs/performance.md):
//
//   ack         CreateJob (with an idempotency key, as a submit is) one after
//               the other: the acknowledgement latency, p50/p99;
//   throughput  CreateJob from `threads` threads at once: creates per second;
//   takeover    two LeaderElection replicas on the etcd cluster; the leader
//               stops renewing its lease, as a replica killed with -9 does,
//               and the time until the other leads is measured (the
//               coordinator's failover, before it reads the store).
//
// SQLite is a file in a fresh temp dir (WAL, synchronous=FULL: an fsync per
// commit). etcd is a 3-member cluster on 127.0.0.1 that the bench starts
// (etcd from Debian's etcd-server), unless --etcd names one; each run uses a
// fresh key prefix. Targets (issue): p99 acknowledgement under 20 ms on a
// 3-member loopback etcd; takeover under 3 s with a 2 s lease.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "bench/latency_stats.h"

namespace mesh::bench {

struct StoreBenchOptions {
  int creates = 1000;  // Sequential CreateJobs per backend.
  int threads = 8;
  int concurrent_creates = 2000;  // Over all threads, per backend.
  int takeovers = 5;
  double lease_s = 2;
  // host:port,...: an etcd cluster to use; empty: start 3 members here.
  std::string etcd_endpoints;
  std::string etcd_binary = "/usr/bin/etcd";
};

struct StoreBackendResult {
  std::string name;  // "sqlite", "etcd".
  LatencyStats ack;
  double creates_per_s = 0;             // Sequential.
  double concurrent_creates_per_s = 0;  // `threads` at once.
};

struct StoreBenchResult {
  std::vector<StoreBackendResult> backends;
  LatencyStats takeover;  // In microseconds, as every LatencyStats.
  double lease_s = 0;
  std::string etcd;  // What etcd was used: "3 members started here" or the endpoints.
  double load_average = 0;
};

// Possible errors: FAILED_PRECONDITION (no etcd binary and no --etcd);
// UNAVAILABLE (etcd did not come up); a store's errors.
absl::StatusOr<StoreBenchResult> RunStoreBench(const StoreBenchOptions& options);

nlohmann::json ToJson(const StoreBenchResult& result);

}  // namespace mesh::bench
