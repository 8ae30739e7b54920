// The prometheus-cpp side of common/metrics.h, for the binaries only:
//   - PrometheusRegistry: a metrics::Registry over a prometheus::Registry;
//   - MetricsServer: a /metrics HTTP exposer (prometheus-cpp's civetweb) on
//     host:port, port 0 = a free port, port() = the one bound;
//   - AddBuildInfo: the mesh_build_info gauge every binary exports.
//
// Errors: MetricsServer::Start returns UNAVAILABLE when the address cannot
// be bound (in use, bad host) and INVALID_ARGUMENT for a port outside
// 0..65535. Bad metric or label names are programmer errors (MESH_CHECK).
//
// Thread safety: PrometheusRegistry is thread-safe (see metrics.h);
// recording goes straight to prometheus-cpp's atomics. MetricsServer is
// created once and destroyed once; its exposer serves scrapes on its own
// threads.
//
// Ownership: a MetricsServer holds a shared_ptr to the prometheus registry
// it serves, so the registry outlives the server's threads; a
// PrometheusRegistry must outlive every Family*/child pointer it handed out.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

namespace prometheus {
class Registry;
class Exposer;
}  // namespace prometheus

namespace mesh::metrics {

class PrometheusRegistry final : public Registry {
 public:
  PrometheusRegistry();
  ~PrometheusRegistry() override;

  Family<Counter>* AddCounter(absl::string_view name, absl::string_view help,
                              std::vector<std::string> label_names = {}) override;
  Family<Gauge>* AddGauge(absl::string_view name, absl::string_view help,
                          std::vector<std::string> label_names = {}) override;
  Family<Histogram>* AddHistogram(absl::string_view name, absl::string_view help,
                                  std::vector<std::string> label_names,
                                  std::vector<double> buckets) override;

  // The underlying registry, for an exposer (or a test that serializes it).
  const std::shared_ptr<prometheus::Registry>& prometheus_registry() const { return registry_; }

  // The text exposition format of everything registered (what /metrics
  // serves); for tests and debugging.
  std::string Serialize() const;

  // Implementation detail (the type-erased families_ entries).
  class FamilyBase;

 private:
  template <typename Metric, typename Impl, typename... Extra>
  Family<Metric>* Add(absl::string_view name, absl::string_view help,
                      std::vector<std::string> label_names, Extra&&... extra);

  const std::shared_ptr<prometheus::Registry> registry_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

// Serves `registry` on http://host:port/metrics until destroyed.
class MetricsServer {
 public:
  // `host` is an IPv4 address or a name ("0.0.0.0", "127.0.0.1", "[::]").
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port,
                                                              const PrometheusRegistry& registry);
  ~MetricsServer();

  // The bound port (the free one picked when asked for port 0).
  int port() const { return port_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port);
  std::unique_ptr<prometheus::Exposer> exposer_;
  const int port_;
};

// Adds mesh_build_info{component, version, protocol} = 1.
void AddBuildInfo(Registry& registry, absl::string_view component);

}  // namespace mesh::metrics
