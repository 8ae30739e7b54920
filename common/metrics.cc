#include "common/metrics.h"

#include <cstdio>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/check.h"
#include "common/metrics_names.h"

namespace mesh::metrics {

std::vector<double> LatencyBuckets() {
  // 1-2.5-5 steps per decade: fine enough to tell a 1 ms RPC from a 5 ms one,
  // coarse enough (19 buckets) that a histogram per RPC method stays cheap.
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1,      2.5,   5,      10,    25,   50,    100};
}

std::vector<double> ByteBuckets() {
  std::vector<double> buckets;
  for (double b = 1024; b <= 4.0 * 1024 * 1024 * 1024; b *= 4) buckets.push_back(b);
  return buckets;
}

namespace {

bool IsNameChar(char c, bool allow_colon) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
         (allow_colon && c == ':');
}

}  // namespace

bool IsValidMetricName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!IsNameChar(c, /*allow_colon=*/true)) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return false;
  for (char c : name) {
    if (!IsNameChar(c, /*allow_colon=*/false)) return false;
  }
  return true;
}

void CheckFamily(absl::string_view name, const std::vector<std::string>& label_names) {
  MESH_CHECK(IsValidMetricName(name), absl::StrCat("bad metric name '", name, "'").c_str());
  for (const std::string& label : label_names) {
    MESH_CHECK(IsValidLabelName(label),
               absl::StrCat("bad label name '", label, "' in ", name).c_str());
  }
}

void CheckLabelValues(absl::string_view name, const std::vector<std::string>& label_names,
                      const std::vector<std::string>& values) {
  MESH_CHECK(values.size() == label_names.size(),
             absl::StrCat(name, ": ", values.size(), " label values for ", label_names.size(),
                          " label names")
                 .c_str());
}

namespace {

class NoopCounter final : public Counter {
 public:
  void Increment(double) override {}
};
class NoopGauge final : public Gauge {
 public:
  void Set(double) override {}
  void Increment(double) override {}
  void Decrement(double) override {}
};
class NoopHistogram final : public Histogram {
 public:
  void Observe(double) override {}
};

// One shared child per type: recording into it does nothing, so every label
// set may share it. The family still checks the number of values so that a
// test with NoopRegistry catches the same mistakes as the binary.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
};

template <typename Metric, typename Noop>
class NoopFamily final : public Family<Metric>, public FamilyBase {
 public:
  NoopFamily(std::string name, std::vector<std::string> label_names)
      : name_(std::move(name)), label_names_(std::move(label_names)) {}
  Metric* WithLabels(const std::vector<std::string>& values) override {
    CheckLabelValues(name_, label_names_, values);
    return &child_;
  }
  void Remove(const std::vector<std::string>& values) override {
    CheckLabelValues(name_, label_names_, values);
  }

 private:
  const std::string name_;
  const std::vector<std::string> label_names_;
  Noop child_;
};

// Families are kept (by name) for the life of the process, so that re-adding
// a family returns the first one, as the contract says, and nothing leaks
// however many managers a test constructs.
class NoopRegistryImpl final : public Registry {
 public:
  Family<Counter>* AddCounter(absl::string_view name, absl::string_view,
                              std::vector<std::string> label_names) override {
    return Add<Counter, NoopCounter>(name, std::move(label_names));
  }
  Family<Gauge>* AddGauge(absl::string_view name, absl::string_view,
                          std::vector<std::string> label_names) override {
    return Add<Gauge, NoopGauge>(name, std::move(label_names));
  }
  Family<Histogram>* AddHistogram(absl::string_view name, absl::string_view,
                                  std::vector<std::string> label_names,
                                  std::vector<double>) override {
    return Add<Histogram, NoopHistogram>(name, std::move(label_names));
  }

 private:
  struct Entry {
    std::vector<std::string> label_names;
    std::unique_ptr<FamilyBase> family;
  };

  template <typename Metric, typename Noop>
  Family<Metric>* Add(absl::string_view name, std::vector<std::string> label_names) {
    CheckFamily(name, label_names);
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = families_.try_emplace(std::string(name));
    if (inserted) {
      it->second.label_names = label_names;
      it->second.family =
          std::make_unique<NoopFamily<Metric, Noop>>(std::string(name), std::move(label_names));
    }
    auto* family = dynamic_cast<NoopFamily<Metric, Noop>*>(it->second.family.get());
    MESH_CHECK(family != nullptr,
               absl::StrCat("metric ", name, " re-added with another type").c_str());
    MESH_CHECK(inserted || it->second.label_names == label_names,
               absl::StrCat("metric ", name, " re-added with other labels").c_str());
    return family;
  }

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

Registry& NoopRegistry() {
  static Registry* const registry = new NoopRegistryImpl();
  return *registry;
}

}  // namespace mesh::metrics
