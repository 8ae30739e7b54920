// TestRegistry: an in-memory metrics::Registry for unit tests of managers.
// Record through it as the binary would through PrometheusRegistry, then
// read values back by family name and label values:
//
//   metrics::testing::TestRegistry registry;
//   JobManager manager(..., &registry);
//   ...
//   EXPECT_EQ(registry.GaugeValue("mesh_coordinator_jobs", {"RUNNING"}), 1);
//
// It enforces the same rules as the real registry (names, label counts,
// re-adding a family with another type or labels aborts), so a test catches
// what the binary would. Reading a family or child that was never created
// returns 0 (a counter that never moved reads 0 in Prometheus too); use
// HasFamily/HasChild to tell "absent" from "zero".
//
// Thread safety: thread-safe; values are read under the same lock as they
// are written.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/check.h"
#include "common/metrics.h"
#include "common/metrics_names.h"

namespace mesh::metrics::testing {

class TestRegistry final : public Registry {
 public:
  enum class Type { kCounter, kGauge, kHistogram };

  Family<Counter>* AddCounter(absl::string_view name, absl::string_view help,
                              std::vector<std::string> label_names = {}) override {
    return &Add(name, help, Type::kCounter, std::move(label_names), {})->counters;
  }
  Family<Gauge>* AddGauge(absl::string_view name, absl::string_view help,
                          std::vector<std::string> label_names = {}) override {
    return &Add(name, help, Type::kGauge, std::move(label_names), {})->gauges;
  }
  Family<Histogram>* AddHistogram(absl::string_view name, absl::string_view help,
                                  std::vector<std::string> label_names,
                                  std::vector<double> buckets) override {
    return &Add(name, help, Type::kHistogram, std::move(label_names), std::move(buckets))
                ->histograms;
  }

  bool HasFamily(const std::string& name) const {
    absl::MutexLock lock(&mu_);
    return families_.count(name) > 0;
  }
  bool HasChild(const std::string& name, const std::vector<std::string>& values) const {
    absl::MutexLock lock(&mu_);
    absl::MutexLock value_lock(&value_mu_);
    return FindLocked(name, values) != nullptr;
  }
  // The help text of a family ("" if absent).
  std::string Help(const std::string& name) const {
    absl::MutexLock lock(&mu_);
    auto it = families_.find(name);
    return it == families_.end() ? "" : it->second->help;
  }
  // Label value sets of every child of `name`, sorted.
  std::vector<std::vector<std::string>> Children(const std::string& name) const {
    absl::MutexLock lock(&mu_);
    std::vector<std::vector<std::string>> result;
    auto it = families_.find(name);
    if (it == families_.end()) return result;
    absl::MutexLock value_lock(&value_mu_);
    for (const auto& [values, child] : it->second->children) result.push_back(values);
    return result;
  }

  double CounterValue(const std::string& name, const std::vector<std::string>& values = {}) const {
    return Value(name, values, Type::kCounter);
  }
  double GaugeValue(const std::string& name, const std::vector<std::string>& values = {}) const {
    return Value(name, values, Type::kGauge);
  }
  // Number of observations.
  uint64_t HistogramCount(const std::string& name,
                          const std::vector<std::string>& values = {}) const {
    absl::MutexLock lock(&mu_);
    CheckTypeLocked(name, Type::kHistogram);
    absl::MutexLock value_lock(&value_mu_);
    const Child* child = FindLocked(name, values);
    return child == nullptr ? 0 : child->count;
  }
  // Sum of observations.
  double HistogramSum(const std::string& name, const std::vector<std::string>& values = {}) const {
    absl::MutexLock lock(&mu_);
    CheckTypeLocked(name, Type::kHistogram);
    absl::MutexLock value_lock(&value_mu_);
    const Child* child = FindLocked(name, values);
    return child == nullptr ? 0 : child->sum;
  }

 private:
  struct FamilyData;

  // One child: a value (counter, gauge) or count + sum (histogram).
  struct Child final : Counter, Gauge, Histogram {
    explicit Child(absl::Mutex* mu) : mu(mu) {}
    void Increment(double v) override {  // Counter and Gauge.
      absl::MutexLock lock(mu);
      value += v;
    }
    void Set(double v) override {
      absl::MutexLock lock(mu);
      value = v;
    }
    void Decrement(double v) override {
      absl::MutexLock lock(mu);
      value -= v;
    }
    void Observe(double v) override {
      absl::MutexLock lock(mu);
      ++count;
      sum += v;
    }
    absl::Mutex* mu;
    double value = 0;
    uint64_t count = 0;
    double sum = 0;
  };

  template <typename Metric>
  struct FamilyView final : Family<Metric> {
    explicit FamilyView(FamilyData* data) : data(data) {}
    Metric* WithLabels(const std::vector<std::string>& values) override {
      return data->GetOrAdd(values);
    }
    void Remove(const std::vector<std::string>& values) override { data->Remove(values); }
    FamilyData* data;
  };

  struct FamilyData {
    FamilyData(absl::Mutex* mu, std::string name, std::string help, Type type,
               std::vector<std::string> label_names)
        : mu(mu),
          name(std::move(name)),
          help(std::move(help)),
          type(type),
          label_names(std::move(label_names)),
          counters(this),
          gauges(this),
          histograms(this) {}
    Child* GetOrAdd(const std::vector<std::string>& values) {
      CheckLabelValues(name, label_names, values);
      absl::MutexLock lock(mu);
      auto& child = children[values];
      if (child == nullptr) child = std::make_unique<Child>(mu);
      return child.get();
    }
    void Remove(const std::vector<std::string>& values) {
      CheckLabelValues(name, label_names, values);
      absl::MutexLock lock(mu);
      children.erase(values);
    }
    absl::Mutex* mu;
    const std::string name;
    const std::string help;
    const Type type;
    const std::vector<std::string> label_names;
    std::map<std::vector<std::string>, std::unique_ptr<Child>> children;
    FamilyView<Counter> counters;
    FamilyView<Gauge> gauges;
    FamilyView<Histogram> histograms;
  };

  FamilyData* Add(absl::string_view name, absl::string_view help, Type type,
                  std::vector<std::string> label_names, std::vector<double> buckets) {
    CheckFamily(name, label_names);
    MESH_CHECK(!help.empty(), absl::StrCat("metric ", name, " has no help text").c_str());
    for (size_t i = 1; i < buckets.size(); ++i) {
      MESH_CHECK(buckets[i - 1] < buckets[i], "histogram buckets not increasing");
    }
    absl::MutexLock lock(&mu_);
    auto& data = families_[std::string(name)];
    if (data == nullptr) {
      data = std::make_unique<FamilyData>(&value_mu_, std::string(name), std::string(help), type,
                                          std::move(label_names));
      return data.get();
    }
    MESH_CHECK(data->type == type,
               absl::StrCat("metric ", name, " re-added with another type").c_str());
    MESH_CHECK(data->label_names == label_names,
               absl::StrCat("metric ", name, " re-added with other labels").c_str());
    return data.get();
  }

  void CheckTypeLocked(const std::string& name, Type type) const {
    auto it = families_.find(name);
    MESH_CHECK(it == families_.end() || it->second->type == type,
               absl::StrCat("metric ", name, " read as another type").c_str());
  }

  // Needs mu_ and value_mu_.
  const Child* FindLocked(const std::string& name, const std::vector<std::string>& values) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, value_mu_) {
    auto it = families_.find(name);
    if (it == families_.end()) return nullptr;
    auto child = it->second->children.find(values);
    return child == it->second->children.end() ? nullptr : child->second.get();
  }

  double Value(const std::string& name, const std::vector<std::string>& values, Type type) const {
    absl::MutexLock lock(&mu_);
    CheckTypeLocked(name, type);
    absl::MutexLock value_lock(&value_mu_);
    const Child* child = FindLocked(name, values);
    return child == nullptr ? 0 : child->value;
  }

  // mu_ guards the family map; value_mu_ (taken after mu_, never before)
  // guards children and their values, so recording never waits on Add*.
  mutable absl::Mutex mu_;
  mutable absl::Mutex value_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<std::string, std::unique_ptr<FamilyData>> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::metrics::testing
