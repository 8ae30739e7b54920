#include "common/metrics_prometheus.h"

#include <exception>
#include <map>
#include <type_traits>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/metrics_names.h"
#include "common/version.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace mesh::metrics {
namespace {

class CounterImpl final : public Counter {
 public:
  explicit CounterImpl(prometheus::Counter& counter) : counter_(counter) {}
  void Increment(double value) override { counter_.Increment(value); }

 private:
  prometheus::Counter& counter_;
};

class GaugeImpl final : public Gauge {
 public:
  explicit GaugeImpl(prometheus::Gauge& gauge) : gauge_(gauge) {}
  void Set(double value) override { gauge_.Set(value); }
  void Increment(double value) override { gauge_.Increment(value); }
  void Decrement(double value) override { gauge_.Decrement(value); }

 private:
  prometheus::Gauge& gauge_;
};

class HistogramImpl final : public Histogram {
 public:
  explicit HistogramImpl(prometheus::Histogram& histogram) : histogram_(histogram) {}
  void Observe(double value) override { histogram_.Observe(value); }

 private:
  prometheus::Histogram& histogram_;
};

// Per type: how to build the prometheus family and add a child to it.
struct CounterTraits {
  using Prom = prometheus::Counter;
  using Impl = CounterImpl;
  static auto Build() { return prometheus::BuildCounter(); }
};
struct GaugeTraits {
  using Prom = prometheus::Gauge;
  using Impl = GaugeImpl;
  static auto Build() { return prometheus::BuildGauge(); }
};
struct HistogramTraits {
  using Prom = prometheus::Histogram;
  using Impl = HistogramImpl;
  static auto Build() { return prometheus::BuildHistogram(); }
};

}  // namespace

class PrometheusRegistry::FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual const std::vector<std::string>& label_names() const = 0;
};

namespace {

template <typename Metric, typename Traits>
class FamilyImpl final : public Family<Metric>, public PrometheusRegistry::FamilyBase {
 public:
  // `buckets` is used for histograms only.
  FamilyImpl(std::string name, std::vector<std::string> label_names,
             prometheus::Family<typename Traits::Prom>& family, std::vector<double> buckets)
      : name_(std::move(name)),
        label_names_(std::move(label_names)),
        family_(family),
        buckets_(std::move(buckets)) {}

  const std::vector<std::string>& label_names() const override { return label_names_; }

  Metric* WithLabels(const std::vector<std::string>& values) override {
    CheckLabelValues(name_, label_names_, values);
    absl::MutexLock lock(&mu_);
    auto it = children_.find(values);
    if (it != children_.end()) return it->second.get();
    prometheus::Labels labels;
    for (size_t i = 0; i < values.size(); ++i) labels.emplace(label_names_[i], values[i]);
    typename Traits::Prom* child;
    if constexpr (std::is_same_v<typename Traits::Prom, prometheus::Histogram>) {
      child = &family_.Add(labels, buckets_);
    } else {
      child = &family_.Add(labels);
    }
    auto impl = std::make_unique<typename Traits::Impl>(*child);
    Metric* result = impl.get();
    children_.emplace(values, std::move(impl));
    prom_children_.emplace(values, child);
    return result;
  }

  void Remove(const std::vector<std::string>& values) override {
    absl::MutexLock lock(&mu_);
    auto it = prom_children_.find(values);
    if (it == prom_children_.end()) return;
    family_.Remove(it->second);
    prom_children_.erase(it);
    children_.erase(values);
  }

 private:
  const std::string name_;
  const std::vector<std::string> label_names_;
  prometheus::Family<typename Traits::Prom>& family_;
  const std::vector<double> buckets_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::vector<std::string>, std::unique_ptr<Metric>> children_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::vector<std::string>, typename Traits::Prom*> prom_children_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

PrometheusRegistry::PrometheusRegistry() : registry_(std::make_shared<prometheus::Registry>()) {}
PrometheusRegistry::~PrometheusRegistry() = default;

template <typename Metric, typename Traits, typename... Extra>
Family<Metric>* PrometheusRegistry::Add(absl::string_view name, absl::string_view help,
                                        std::vector<std::string> label_names, Extra&&... extra) {
  CheckFamily(name, label_names);
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    auto* family = dynamic_cast<FamilyImpl<Metric, Traits>*>(it->second.get());
    MESH_CHECK(family != nullptr,
               absl::StrCat("metric ", name, " re-added with another type").c_str());
    MESH_CHECK(family->label_names() == label_names,
               absl::StrCat("metric ", name, " re-added with other labels").c_str());
    return family;
  }
  auto& prom_family =
      Traits::Build().Name(std::string(name)).Help(std::string(help)).Register(*registry_);
  auto family = std::make_unique<FamilyImpl<Metric, Traits>>(
      std::string(name), std::move(label_names), prom_family, std::forward<Extra>(extra)...);
  Family<Metric>* result = family.get();
  families_.emplace(std::string(name), std::move(family));
  return result;
}

Family<Counter>* PrometheusRegistry::AddCounter(absl::string_view name, absl::string_view help,
                                                std::vector<std::string> label_names) {
  return Add<Counter, CounterTraits>(name, help, std::move(label_names), std::vector<double>{});
}

Family<Gauge>* PrometheusRegistry::AddGauge(absl::string_view name, absl::string_view help,
                                            std::vector<std::string> label_names) {
  return Add<Gauge, GaugeTraits>(name, help, std::move(label_names), std::vector<double>{});
}

Family<Histogram>* PrometheusRegistry::AddHistogram(absl::string_view name, absl::string_view help,
                                                    std::vector<std::string> label_names,
                                                    std::vector<double> buckets) {
  for (size_t i = 1; i < buckets.size(); ++i) {
    MESH_CHECK(buckets[i - 1] < buckets[i],
               absl::StrCat("histogram ", name, ": buckets not increasing").c_str());
  }
  return Add<Histogram, HistogramTraits>(name, help, std::move(label_names), std::move(buckets));
}

std::string PrometheusRegistry::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port)
    : exposer_(std::move(exposer)), port_(port) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, const PrometheusRegistry& registry) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is outside 0..65535"));
  }
  const std::string address = absl::StrCat(host, ":", port);
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // civetweb throws (CivetException) when it cannot listen.
    exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address, ": ", e.what()));
  }
  exposer->RegisterCollectable(registry.prometheus_registry());
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return absl::UnavailableError(
        absl::StrCat("serving /metrics on ", address, " but no bound port was reported"));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), ports.front()));
}

void AddBuildInfo(Registry& registry, absl::string_view component) {
  registry
      .AddGauge("mesh_build_info", "Mesh build: always 1; the labels name the version.",
                {"component", "version", "protocol"})
      ->WithLabels({std::string(component), kVersion, absl::StrCat(kProtocolVersion)})
      ->Set(1);
}

}  // namespace mesh::metrics
