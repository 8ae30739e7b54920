#include "coordinator/job_layout.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mesh::coordinator {

bool IsValidJobId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

absl::Status NormalizeJobLayout(JobLayout& layout) {
  if (layout.world_size < 1 || layout.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", layout.world_size, " is outside 1..", kMaxWorldSize));
  }
  if (layout.hang_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("hang_timeout must be positive");
  }
  if (layout.mesh_shape.empty()) layout.mesh_shape = {layout.world_size};
  int64_t product = 1;
  for (int64_t dim : layout.mesh_shape) {
    if (dim < 1 || dim > kMaxWorldSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh_shape [", absl::StrJoin(layout.mesh_shape, ", "),
                       "] has a dimension outside 1..", kMaxWorldSize));
    }
    product *= dim;
    // Both factors are <= 2^20, so stopping here keeps the product in range.
    if (product > kMaxWorldSize) break;
  }
  if (product != layout.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh_shape [", absl::StrJoin(layout.mesh_shape, ", "), "] has product ",
        product > kMaxWorldSize ? absl::StrCat("over ", kMaxWorldSize) : absl::StrCat(product),
        ", not world_size ", layout.world_size));
  }
  if (layout.mesh_dim_names.empty()) {
    for (size_t i = 0; i < layout.mesh_shape.size(); ++i) {
      layout.mesh_dim_names.push_back(absl::StrCat("dim", i));
    }
  }
  if (layout.mesh_dim_names.size() != layout.mesh_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh_dim_names has ",
                                                   layout.mesh_dim_names.size(), " names for a ",
                                                   layout.mesh_shape.size(), "-d mesh"));
  }
  absl::flat_hash_set<std::string> names;
  for (const std::string& name : layout.mesh_dim_names) {
    if (name.empty()) return absl::InvalidArgumentError("mesh_dim_names has an empty name");
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh_dim_names has '", name, "' twice; names must be unique"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mesh::coordinator
