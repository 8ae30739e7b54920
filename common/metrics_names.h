// Checks shared by every metrics::Registry implementation (NoopRegistry,
// PrometheusRegistry, tests' TestRegistry), so that a bad name or a
// family re-added with other labels fails the same way in a unit test with
// a fake registry as in the binary.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mesh::metrics {

// Prometheus's data model: [a-zA-Z_:][a-zA-Z0-9_:]*.
bool IsValidMetricName(absl::string_view name);
// [a-zA-Z_][a-zA-Z0-9_]*, and not starting with "__" (reserved).
bool IsValidLabelName(absl::string_view name);

// MESH_CHECKs the family's name and label names (programmer errors).
void CheckFamily(absl::string_view name, const std::vector<std::string>& label_names);
// MESH_CHECKs that `values` has one value per label name.
void CheckLabelValues(absl::string_view name, const std::vector<std::string>& label_names,
                      const std::vector<std::string>& values);

}  // namespace mesh::metrics
