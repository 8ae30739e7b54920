#include "mesh/mesh_layout.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "shape_string.h"

namespace mesh {
namespace {

using internal::ShapeString;

// Validates shape and names together; fills default names. Returns the
// number of ranks the shape holds.
absl::StatusOr<int> ValidateShapeAndNames(const std::vector<int64_t>& shape,
                                          std::vector<std::string>& names) {
  if (shape.empty()) return absl::InvalidArgumentError("mesh shape must have at least one dim");
  int64_t product = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("mesh shape ", ShapeString(shape), ": dim ", d,
                                                     " has size ", shape[d],
                                                     "; every size must be >= 1"));
    }
    if (product > std::numeric_limits<int>::max() / shape[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh shape ", ShapeString(shape), " holds more than 2^31-1 ranks"));
    }
    product *= shape[d];
  }
  if (names.empty()) names = MeshLayout::DefaultDimNames(static_cast<int>(shape.size()));
  if (names.size() != shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh shape ", ShapeString(shape), " has ", shape.size(), " dims but ",
                     names.size(), " dim names were given (", absl::StrJoin(names, ", "), ")"));
  }
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t d = 0; d < names.size(); ++d) {
    if (names[d].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("mesh dim ", d, " has an empty name"));
    }
    if (!seen.insert(names[d]).second) {
      return absl::InvalidArgumentError(absl::StrCat("mesh dim name '", names[d],
                                                     "' appears more than once in (",
                                                     absl::StrJoin(names, ", "), ")"));
    }
  }
  return static_cast<int>(product);
}

// Advances a row-major odometer over `dims` of `shape`; false once it wraps.
bool Advance(const std::vector<int64_t>& shape, absl::Span<const int> dims,
             std::vector<int64_t>& counter) {
  for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
    if (++counter[i] < shape[dims[i]]) return true;
    counter[i] = 0;
  }
  return false;
}

}  // namespace

std::vector<std::string> MeshLayout::DefaultDimNames(int ndim) {
  std::vector<std::string> names;
  names.reserve(ndim);
  for (int d = 0; d < ndim; ++d) names.push_back(absl::StrCat("dim", d));
  return names;
}

MeshLayout::MeshLayout(std::vector<int64_t> shape, std::vector<std::string> dim_names,
                       std::vector<int> ranks)
    : shape_(std::move(shape)), dim_names_(std::move(dim_names)), ranks_(std::move(ranks)) {
  strides_.assign(shape_.size(), 1);
  for (int d = static_cast<int>(shape_.size()) - 2; d >= 0; --d) {
    strides_[d] = strides_[d + 1] * shape_[d + 1];
  }
  const int max_rank = ranks_.empty() ? -1 : *std::max_element(ranks_.begin(), ranks_.end());
  position_.assign(static_cast<size_t>(max_rank + 1), -1);
  for (size_t i = 0; i < ranks_.size(); ++i) position_[ranks_[i]] = static_cast<int64_t>(i);
}

absl::StatusOr<MeshLayout> MeshLayout::Create(std::vector<int64_t> shape,
                                              std::vector<std::string> dim_names, int world_size) {
  absl::StatusOr<int> count = ValidateShapeAndNames(shape, dim_names);
  if (!count.ok()) return count.status();
  if (*count != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("mesh shape ", ShapeString(shape), " holds ",
                                                   *count, " ranks but the world has ",
                                                   world_size));
  }
  std::vector<int> ranks(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) ranks[r] = r;
  return MeshLayout(std::move(shape), std::move(dim_names), std::move(ranks));
}

absl::StatusOr<MeshLayout> MeshLayout::FromRanks(std::vector<int64_t> shape,
                                                 std::vector<std::string> dim_names,
                                                 std::vector<int> ranks) {
  absl::StatusOr<int> count = ValidateShapeAndNames(shape, dim_names);
  if (!count.ok()) return count.status();
  if (static_cast<size_t>(*count) != ranks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh shape ", ShapeString(shape), " holds ",
                                                   *count, " ranks but the rank array has ",
                                                   ranks.size()));
  }
  std::vector<bool> seen(ranks.size(), false);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || static_cast<size_t>(r) >= ranks.size()) {
      return absl::InvalidArgumentError(absl::StrCat("mesh rank array is not a permutation of 0..",
                                                     ranks.size() - 1, ": entry ", i, " is ", r,
                                                     ", out of range"));
    }
    if (seen[r]) {
      return absl::InvalidArgumentError(absl::StrCat("mesh rank array is not a permutation of 0..",
                                                     ranks.size() - 1, ": rank ", r,
                                                     " appears more than once"));
    }
    seen[r] = true;
  }
  return MeshLayout(std::move(shape), std::move(dim_names), std::move(ranks));
}

absl::StatusOr<MeshLayout> MeshLayout::FromMembers(std::vector<int64_t> shape,
                                                   std::vector<std::string> dim_names,
                                                   std::vector<int> ranks, int world_size) {
  absl::StatusOr<int> count = ValidateShapeAndNames(shape, dim_names);
  if (!count.ok()) return count.status();
  if (static_cast<size_t>(*count) != ranks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh shape ", ShapeString(shape), " holds ",
                                                   *count, " ranks but the rank array has ",
                                                   ranks.size()));
  }
  std::vector<bool> seen(static_cast<size_t>(std::max(world_size, 0)), false);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat("mesh rank array entry ", i, " is ", r,
                                                     ", outside a world of ", world_size));
    }
    if (seen[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh rank array holds rank ", r, " more than once"));
    }
    seen[r] = true;
  }
  return MeshLayout(std::move(shape), std::move(dim_names), std::move(ranks));
}

int64_t MeshLayout::Size(int dim) const {
  MESH_CHECK(dim >= 0 && dim < ndim(), "mesh dim index out of range");
  return shape_[dim];
}

absl::StatusOr<int> MeshLayout::DimIndex(absl::string_view name) const {
  for (int d = 0; d < ndim(); ++d) {
    if (dim_names_[d] == name) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("mesh has no dim '", name, "'; its dims are (",
                                                 absl::StrJoin(dim_names_, ", "), ")"));
}

absl::StatusOr<std::vector<int>> MeshLayout::DimIndices(absl::Span<const std::string> names) const {
  if (names.empty()) return absl::InvalidArgumentError("no mesh dim names given");
  std::vector<int> dims;
  dims.reserve(names.size());
  for (const std::string& name : names) {
    absl::StatusOr<int> d = DimIndex(name);
    if (!d.ok()) return d.status();
    if (!dims.empty() && *d <= dims.back()) {
      return absl::InvalidArgumentError(absl::StrCat("mesh dim names (", absl::StrJoin(names, ", "),
                                                     ") must be distinct and in mesh order (",
                                                     absl::StrJoin(dim_names_, ", "), ")"));
    }
    dims.push_back(*d);
  }
  return dims;
}

int64_t MeshLayout::IndexOf(int rank) const {
  if (rank < 0 || static_cast<size_t>(rank) >= position_.size()) return -1;
  return position_[rank];
}

bool MeshLayout::Contains(int rank) const { return IndexOf(rank) >= 0; }

absl::StatusOr<std::vector<int64_t>> MeshLayout::Coordinate(int rank) const {
  int64_t index = IndexOf(rank);
  if (index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in ", DebugString()));
  }
  std::vector<int64_t> coordinate(shape_.size());
  for (size_t d = 0; d < shape_.size(); ++d) {
    coordinate[d] = index / strides_[d];
    index %= strides_[d];
  }
  return coordinate;
}

absl::StatusOr<int> MeshLayout::RankAt(absl::Span<const int64_t> coordinate) const {
  if (coordinate.size() != shape_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("coordinate (", absl::StrJoin(coordinate, ", "),
                                                   ") has ", coordinate.size(),
                                                   " entries; the mesh has ", ndim(), " dims"));
  }
  int64_t index = 0;
  for (size_t d = 0; d < shape_.size(); ++d) {
    if (coordinate[d] < 0 || coordinate[d] >= shape_[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinate (", absl::StrJoin(coordinate, ", "), ") is outside mesh shape ",
                       ShapeString(shape_)));
    }
    index += coordinate[d] * strides_[d];
  }
  return ranks_[index];
}

absl::Status MeshLayout::CheckDims(absl::Span<const int> dims) const {
  if (dims.empty()) return absl::InvalidArgumentError("no mesh dims given");
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= ndim() || (i > 0 && dims[i] <= dims[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("mesh dims [", absl::StrJoin(dims, ", "),
                                                     "] must be distinct, increasing and below ",
                                                     ndim()));
    }
  }
  return absl::OkStatus();
}

std::vector<std::vector<int>> MeshLayout::Groups(absl::Span<const int> dims) const {
  MESH_CHECK(CheckDims(dims).ok(), "MeshLayout::Groups: bad dims");
  std::vector<int> others;
  for (int d = 0; d < ndim(); ++d) {
    if (!std::binary_search(dims.begin(), dims.end(), d)) others.push_back(d);
  }
  int64_t group_size = 1;
  for (int d : dims) group_size *= shape_[d];
  std::vector<std::vector<int>> groups;
  groups.reserve(ranks_.size() / group_size);
  std::vector<int64_t> outer(others.size(), 0);
  do {
    int64_t base = 0;
    for (size_t i = 0; i < others.size(); ++i) base += outer[i] * strides_[others[i]];
    std::vector<int>& group = groups.emplace_back();
    group.reserve(group_size);
    std::vector<int64_t> inner(dims.size(), 0);
    do {
      int64_t index = base;
      for (size_t i = 0; i < dims.size(); ++i) index += inner[i] * strides_[dims[i]];
      group.push_back(ranks_[index]);
    } while (Advance(shape_, dims, inner));
  } while (Advance(shape_, others, outer));
  return groups;
}

absl::StatusOr<MeshGroup> MeshLayout::GroupOf(absl::Span<const int> dims, int rank) const {
  if (absl::Status s = CheckDims(dims); !s.ok()) return s;
  absl::StatusOr<std::vector<int64_t>> coordinate = Coordinate(rank);
  if (!coordinate.ok()) return coordinate.status();
  MeshGroup group;
  int64_t base = 0;
  int64_t color = 0;
  for (int d = 0; d < ndim(); ++d) {
    if (std::binary_search(dims.begin(), dims.end(), d)) continue;
    base += (*coordinate)[d] * strides_[d];
    color = color * shape_[d] + (*coordinate)[d];
  }
  group.color = static_cast<int>(color);
  std::vector<int64_t> inner(dims.size(), 0);
  do {
    int64_t index = base;
    for (size_t i = 0; i < dims.size(); ++i) index += inner[i] * strides_[dims[i]];
    group.ranks.push_back(ranks_[index]);
  } while (Advance(shape_, dims, inner));
  return group;
}

absl::StatusOr<MeshLayout> MeshLayout::Slice(absl::Span<const int> dims, int rank) const {
  absl::StatusOr<MeshGroup> group = GroupOf(dims, rank);
  if (!group.ok()) return group.status();
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  for (int d : dims) {
    shape.push_back(shape_[d]);
    names.push_back(dim_names_[d]);
  }
  return MeshLayout(std::move(shape), std::move(names), std::move(group->ranks));
}

absl::StatusOr<MeshLayout> MeshLayout::Slice(absl::Span<const std::string> names, int rank) const {
  absl::StatusOr<std::vector<int>> dims = DimIndices(names);
  if (!dims.ok()) return dims.status();
  return Slice(*dims, rank);
}

absl::StatusOr<MeshLayout> MeshLayout::Flatten(absl::Span<const std::string> names,
                                               absl::string_view name) const {
  absl::StatusOr<std::vector<int>> dims = DimIndices(names);
  if (!dims.ok()) return dims.status();
  if (dims->back() - dims->front() + 1 != static_cast<int>(dims->size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot flatten mesh dims (", absl::StrJoin(names, ", "),
                     "): they are not adjacent in (", absl::StrJoin(dim_names_, ", "), ")"));
  }
  const std::string merged_name = name.empty() ? absl::StrJoin(names, "_") : std::string(name);
  const int first = dims->front();
  const int last = dims->back();
  std::vector<int64_t> shape;
  std::vector<std::string> new_names;
  for (int d = 0; d < ndim(); ++d) {
    if (d < first || d > last) {
      if (dim_names_[d] == merged_name) {
        return absl::InvalidArgumentError(absl::StrCat("cannot name the flattened dim '",
                                                       merged_name,
                                                       "': the mesh keeps a dim of that name"));
      }
      shape.push_back(shape_[d]);
      new_names.push_back(dim_names_[d]);
    } else if (d == first) {
      int64_t size = 1;
      for (int e = first; e <= last; ++e) size *= shape_[e];
      shape.push_back(size);
      new_names.push_back(merged_name);
    }
  }
  return MeshLayout(std::move(shape), std::move(new_names), ranks_);
}

std::string MeshLayout::DebugString() const {
  constexpr size_t kMaxRanks = 64;
  std::string ranks;
  if (ranks_.size() <= kMaxRanks) {
    ranks = absl::StrJoin(ranks_, ", ");
  } else {
    ranks = absl::StrCat(absl::StrJoin(ranks_.begin(), ranks_.begin() + kMaxRanks, ", "), ", ... (",
                         ranks_.size(), " ranks)");
  }
  return absl::StrCat("MeshLayout(shape=", ShapeString(shape_), ", dim_names=(",
                      absl::StrJoin(dim_names_, ", "), "), ranks=[", ranks, "])");
}

}  // namespace mesh
