// Metrics: the interface Mesh's logic classes record through. Managers
// (JobManager, Coordination, the Agent, libmesh's process groups) take a
// `metrics::Registry*` and never see prometheus-cpp; only the binaries wire
// a PrometheusRegistry (common/metrics_prometheus.h) and its /metrics
// exposer. Tests pass NoopRegistry() or a TestRegistry and read values back.
//
// Conventions (docs/metrics.md lists every family):
//   - names start with "mesh_", use base units ("_seconds", "_bytes"), and
//     counters end in "_total";
//   - every family has help text;
//   - label names are fixed per family, and label VALUES must come from a
//     small known set (a method, a state, an op). Never a job id, rank,
//     pid or request id, unless docs/metrics.md states the cap.
//
// Families are created once (Add*), usually in a manager's constructor, and
// live as long as the registry. A child (one set of label values) is
// created on first use and lives as long as the registry too: hold the
// pointer, it stays valid.
//
// Thread safety: everything is thread-safe. Recording (Increment, Set,
// Observe) is lock-free or nearly so in the Prometheus implementation; Add*
// and WithLabels take a lock.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mesh::metrics {

class Counter {
 public:
  virtual ~Counter() = default;
  // `value` >= 0.
  virtual void Increment(double value = 1) = 0;
};

class Gauge {
 public:
  virtual ~Gauge() = default;
  virtual void Set(double value) = 0;
  virtual void Increment(double value = 1) = 0;
  virtual void Decrement(double value = 1) = 0;
};

class Histogram {
 public:
  virtual ~Histogram() = default;
  virtual void Observe(double value) = 0;
};

// A family's children, by label values given in the order of its label
// names. A wrong number of values is a programmer error (checked).
template <typename Metric>
class Family {
 public:
  virtual ~Family() = default;
  virtual Metric* WithLabels(const std::vector<std::string>& values) = 0;
  // Drops the child with these label values, so it is no longer exported
  // (a per-job series once the job is gone). A pointer WithLabels returned
  // for it must not be used afterwards; a later WithLabels makes a new one.
  // No-op when there is none.
  virtual void Remove(const std::vector<std::string>& values) = 0;
  // The only child of a family without labels.
  Metric* Get() { return WithLabels({}); }
};

// Default buckets for latencies, in seconds: 100 us to ~100 s.
std::vector<double> LatencyBuckets();
// Buckets for sizes in bytes: 1 KiB to 4 GiB, x4 steps.
std::vector<double> ByteBuckets();

class Registry {
 public:
  virtual ~Registry() = default;
  // Adding a family twice with the same name, type and labels returns the
  // first one; with a different type or labels is a programmer error
  // (checked). Names and label names follow Prometheus's rules (checked).
  virtual Family<Counter>* AddCounter(absl::string_view name, absl::string_view help,
                                      std::vector<std::string> label_names = {}) = 0;
  virtual Family<Gauge>* AddGauge(absl::string_view name, absl::string_view help,
                                  std::vector<std::string> label_names = {}) = 0;
  virtual Family<Histogram>* AddHistogram(absl::string_view name, absl::string_view help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> buckets) = 0;
};

// Records nothing. Never null, never destroyed.
Registry& NoopRegistry();

}  // namespace mesh::metrics
