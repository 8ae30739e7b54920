// MeshLayout: the geometry of an N-dimensional device mesh, with no
// communication. DeviceMesh (mesh/device_mesh.h) pairs one with the process
// groups of the calling rank; everything here is pure and deterministic, so
// every rank computes the same answer without talking to anyone.
//
// A layout is an N-dimensional array of distinct world ranks. `shape` gives
// the size of each dimension, outermost first, and `ranks` lists the array's
// elements in row-major order, as a torch.Tensor's would be. Create() lays
// the world out in order (rank r at the row-major position r), which is what
// PyTorch's init_device_mesh does; FromRanks() takes any permutation for
// custom placements.
//
//   shape (2, 4), names ("replicate", "shard"), world of 8:
//
//              shard 0  1  2  3
//   replicate 0     [0  1  2  3]     groups along "shard":     {0,1,2,3} {4,5,6,7}
//             1     [4  5  6  7]     groups along "replicate": {0,4} {1,5} {2,6} {3,7}
//
// Groups along a set of dims D: fix the coordinates of every other dim and
// let the dims in D vary. Each choice of the other coordinates gives one
// group; its index in row-major order over those other dims is the group's
// "color", and its members are listed in row-major order over D. The groups
// of one D are disjoint and cover the layout, which is what lets a backend
// split a world communicator once per D (see GroupSpec in process_group.h).
//
// Slicing (mesh["tp"], mesh[{"dp", "tp"}]) keeps the named dims and fixes
// the others at a given rank's coordinate: the result is that rank's group
// along the named dims, reshaped. As in PyTorch, names must appear in mesh
// order. Flattening merges adjacent dims into one, named by joining their
// names with "_" unless a name is given ("dp", "tp" -> "dp_tp"); since the
// merged dims are adjacent, the row-major rank order does not change.
//
// Errors: INVALID_ARGUMENT for every bad input, with a message naming the
// offending value. Programmer errors (a dim index out of range in the
// index-based accessors) abort via MESH_CHECK.
//
// Thread safety: a MeshLayout is an immutable value; const methods may run
// concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mesh {

// One group of a layout: its members (world ranks, in group-rank order) and
// its index among the disjoint groups of its dims.
struct MeshGroup {
  int color = 0;
  std::vector<int> ranks;

  friend bool operator==(const MeshGroup&, const MeshGroup&) = default;
};

class MeshLayout {
 public:
  // The world of `world_size` ranks laid out row-major: rank r at row-major
  // position r. `dim_names` empty means "dim0", "dim1", ...
  // Possible errors (INVALID_ARGUMENT): an empty shape, a size < 1, a shape
  // whose product is not world_size (or overflows int), a number of names
  // that differs from the number of dims, an empty or duplicate name.
  static absl::StatusOr<MeshLayout> Create(std::vector<int64_t> shape,
                                           std::vector<std::string> dim_names, int world_size);

  // A custom placement: `ranks` (row-major) must be a permutation of
  // 0..ranks.size()-1 and ranks.size() the product of the shape.
  // Possible errors: those of Create, plus INVALID_ARGUMENT for a rank array
  // of the wrong length or one that is not a permutation (naming the first
  // duplicate or out-of-range rank).
  static absl::StatusOr<MeshLayout> FromRanks(std::vector<int64_t> shape,
                                              std::vector<std::string> dim_names,
                                              std::vector<int> ranks);

  // A layout over some of the ranks of a world of `world_size` (in-place
  // recovery's mesh of the live ranks): `ranks` (row-major) must be
  // distinct ranks in [0, world_size), as many as the shape holds.
  // Possible errors: those of Create, plus INVALID_ARGUMENT for a rank array
  // of the wrong length, a rank outside the world or one given twice.
  static absl::StatusOr<MeshLayout> FromMembers(std::vector<int64_t> shape,
                                                std::vector<std::string> dim_names,
                                                std::vector<int> ranks, int world_size);

  // "dim0", "dim1", ..., "dim<ndim-1>".
  static std::vector<std::string> DefaultDimNames(int ndim);

  int ndim() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  // World ranks in row-major order of their coordinates.
  const std::vector<int>& ranks() const { return ranks_; }
  // Number of ranks in the layout (the product of the shape).
  int size() const { return static_cast<int>(ranks_.size()); }
  // Size of dim `dim`; aborts unless 0 <= dim < ndim().
  int64_t Size(int dim) const;

  // INVALID_ARGUMENT naming the known dims when `name` is not one.
  absl::StatusOr<int> DimIndex(absl::string_view name) const;
  // The indices of `names`, which must be dims of this layout, distinct and
  // in mesh order (as PyTorch requires for slicing); INVALID_ARGUMENT
  // otherwise, and for an empty list.
  absl::StatusOr<std::vector<int>> DimIndices(absl::Span<const std::string> names) const;

  bool Contains(int rank) const;
  // The coordinate of `rank`, one entry per dim. INVALID_ARGUMENT when the
  // rank is not in the layout.
  absl::StatusOr<std::vector<int64_t>> Coordinate(int rank) const;
  // The rank at `coordinate`. INVALID_ARGUMENT for a wrong number of entries
  // or an entry out of range.
  absl::StatusOr<int> RankAt(absl::Span<const int64_t> coordinate) const;

  // Every group along `dims` (distinct, strictly increasing, in range; aborts
  // otherwise), ordered by color. For one dim d there are size()/Size(d)
  // groups of Size(d) ranks each.
  std::vector<std::vector<int>> Groups(absl::Span<const int> dims) const;
  std::vector<std::vector<int>> Groups(int dim) const {
    return Groups(absl::Span<const int>(&dim, 1));
  }
  // The group along `dims` that contains `rank`: O(group size), without
  // enumerating the others. INVALID_ARGUMENT for bad dims or a rank not in
  // the layout.
  absl::StatusOr<MeshGroup> GroupOf(absl::Span<const int> dims, int rank) const;

  // The sub-layout over `dims` (strictly increasing) through `rank`: the
  // other dims are fixed at rank's coordinate. Its ranks are
  // GroupOf(dims, rank).ranks. INVALID_ARGUMENT as GroupOf.
  absl::StatusOr<MeshLayout> Slice(absl::Span<const int> dims, int rank) const;
  // By name; names as DimIndices requires.
  absl::StatusOr<MeshLayout> Slice(absl::Span<const std::string> names, int rank) const;

  // Merges the adjacent dims `names` (in mesh order, at least one) into one
  // dim called `name`, or their names joined by "_" when `name` is empty.
  // Ranks keep their row-major order. INVALID_ARGUMENT when the names are
  // unknown, out of order or not adjacent, or when the new name equals the
  // name of a dim that remains.
  absl::StatusOr<MeshLayout> Flatten(absl::Span<const std::string> names,
                                     absl::string_view name = "") const;

  // "MeshLayout(shape=(2, 4), dim_names=(replicate, shard), ranks=[0, 1, ...])";
  // at most the first 64 ranks are printed.
  std::string DebugString() const;

  friend bool operator==(const MeshLayout& a, const MeshLayout& b) {
    return a.shape_ == b.shape_ && a.dim_names_ == b.dim_names_ && a.ranks_ == b.ranks_;
  }

 private:
  // Validated by the factories; `ranks` distinct and non-negative.
  MeshLayout(std::vector<int64_t> shape, std::vector<std::string> dim_names,
             std::vector<int> ranks);

  absl::Status CheckDims(absl::Span<const int> dims) const;
  int64_t IndexOf(int rank) const;  // -1 when absent.

  std::vector<int64_t> shape_;
  std::vector<std::string> dim_names_;
  std::vector<int> ranks_;
  // Row-major strides, in elements.
  std::vector<int64_t> strides_;
  // position_[r] is the row-major index of rank r, or -1; sized to the
  // largest rank + 1.
  std::vector<int64_t> position_;
};

}  // namespace mesh
