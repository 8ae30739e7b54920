// mesh-bench metrics: what Prometheus metrics cost the coordinator.
//
//   scrape    GET /metrics of an in-process coordinator (prometheus-cpp's
//             exposer, as mesh-coordinator --metrics-port serves it) after
//             `jobs` one-rank jobs have each gone through CreateJob, Join,
//             KvSet, KvGet, Barrier and Leave over gRPC: the families, label
//             sets and histogram buckets a long-lived coordinator carries.
//             Baseline: a scrape of an exposer serving only mesh_build_info,
//             the floor of an HTTP round trip through the same exposer. Also
//             the body's size, against its size after the first job (labels
//             never carry job ids, so the size must not grow with `jobs`).
//   increment Counter::Increment on a labelled child through
//             metrics::Registry (what managers call on the hot path),
//             against a relaxed std::atomic<uint64_t>::fetch_add, the floor
//             of any shared counter. Single thread, ns per call.
//
// Scrapes of the two servers alternate, one each in turn, after a warm-up.
//
// Possible errors: INVALID_ARGUMENT for non-positive counts; UNAVAILABLE when
// a server cannot start; INTERNAL for a failed scrape (status, short body)
// or a failed RPC while building the history.
// Thread safety: RunMetricsBench is not meant to run twice at once.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "bench/latency_stats.h"

namespace mesh::bench {

struct MetricsBenchOptions {
  int jobs = 1000;                  // Jobs of history before scraping.
  int scrapes = 50;                 // Measured scrapes of each server.
  int warmup = 5;                   // Unmeasured scrapes of each first.
  int64_t increments = 20'000'000;  // Measured increments of each kind.
};

struct MetricsBenchResult {
  int jobs = 0;
  LatencyStats scrape;           // The coordinator's /metrics after `jobs`.
  LatencyStats baseline_scrape;  // mesh_build_info only.
  int64_t scrape_bytes = 0;
  int64_t empty_coordinator_bytes = 0;  // The coordinator's before any job,
  int64_t one_job_bytes = 0;            // and after the first.
  int64_t baseline_bytes = 0;
  int families = 0;  // "# TYPE" lines in the coordinator's body.
  double scrape_p50_ratio = 0;
  double increment_ns = 0;           // Counter::Increment, median of 5 batches.
  double baseline_increment_ns = 0;  // std::atomic fetch_add, likewise.
  double increment_ratio = 0;
  double load_average = 0;
};

absl::StatusOr<MetricsBenchResult> RunMetricsBench(const MetricsBenchOptions& options);

nlohmann::json ToJson(const MetricsBenchResult& result);

}  // namespace mesh::bench
