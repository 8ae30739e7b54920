// Placements: how a global tensor is laid out over a DeviceMesh, one
// placement per mesh dim, with PyTorch DTensor's semantics
// (torch.distributed.tensor.{Shard, Replicate, Partial}). docs/sharding.md
// has the rules with pictures.
//
//   Shard(d)     the tensor's dim d is split across this mesh dim, with
//                torch.chunk's rule: chunks of ceil(n / k) elements, so the
//                trailing chunks may be smaller or empty (n = 5, k = 4:
//                2, 2, 1, 0). A tensor dim smaller than the mesh dim is legal.
//   Replicate()  every rank of this mesh dim holds the same values.
//   Partial(op)  every rank holds a partial value; the global value is the
//                reduction (sum, avg, min, max or prod) over this mesh dim.
//
// Several mesh dims may shard the same tensor dim. They apply left to right,
// as in PyTorch: with placements (Shard(0), Shard(0)) on a (2, 2) mesh, dim 0
// is first chunked in two along mesh dim 0, and each of those chunks is
// chunked in two again along mesh dim 1. ComputeLocalLayout spells it out.
//
// Everything here is pure: no communication, no allocation beyond the
// results. Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "mesh/process_group.h"
#include "mesh/tensor.h"

namespace mesh {

class Placement {
 public:
  enum class Kind : uint8_t { kReplicate, kShard, kPartial };

  // Replicate().
  Placement() = default;

  static Placement Replicate() { return Placement(); }
  // Shard(dim); dim >= 0 (checked against a tensor by ValidatePlacements).
  static Placement Shard(int dim) { return Placement(Kind::kShard, dim, ReduceOp::kSum); }
  static Placement Partial(ReduceOp op = ReduceOp::kSum) {
    return Placement(Kind::kPartial, 0, op);
  }

  Kind kind() const { return kind_; }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  bool is_shard(int dim) const { return kind_ == Kind::kShard && dim_ == dim; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  // The sharded tensor dim; meaningful for Shard only.
  int dim() const { return dim_; }
  // The reduction; meaningful for Partial only.
  ReduceOp op() const { return op_; }

  // "S(0)", "R", "P(sum)": PyTorch's short forms.
  std::string ToString() const;

  friend bool operator==(const Placement& a, const Placement& b) {
    if (a.kind_ != b.kind_) return false;
    if (a.kind_ == Kind::kShard) return a.dim_ == b.dim_;
    if (a.kind_ == Kind::kPartial) return a.op_ == b.op_;
    return true;
  }
  friend bool operator!=(const Placement& a, const Placement& b) { return !(a == b); }

 private:
  Placement(Kind kind, int dim, ReduceOp op) : kind_(kind), dim_(dim), op_(op) {}

  Kind kind_ = Kind::kReplicate;
  int dim_ = 0;
  ReduceOp op_ = ReduceOp::kSum;
};

using Placements = std::vector<Placement>;

// "[S(0), R]".
std::string PlacementsToString(absl::Span<const Placement> placements);

// Checks placements against a mesh shape and a tensor rank.
// Possible errors (INVALID_ARGUMENT, naming the mesh dim): a count other than
// the mesh's number of dims; Shard(d) with d outside [0, tensor_rank);
// Partial with an op other than sum, avg, min, max, prod; Partials on
// several mesh dims whose reductions do not commute (sum and avg may mix;
// min, max and prod only with the same op), since the global value would
// then depend on the order the dims are reduced in.
absl::Status ValidatePlacements(absl::Span<const Placement> placements,
                                absl::Span<const int64_t> mesh_shape, int tensor_rank);

// torch.chunk's rule for one split: the size and start of chunk `index` of
// `size` elements split `parts` ways. Chunks hold ceil(size / parts)
// elements; the last non-empty one may hold fewer and those after it none
// (their start is clamped to `size`). Preconditions (checked): size >= 0,
// parts >= 1, 0 <= index < parts.
struct Chunk {
  int64_t size = 0;
  int64_t offset = 0;
  friend bool operator==(const Chunk&, const Chunk&) = default;
};
Chunk ChunkOf(int64_t size, int64_t parts, int64_t index);

// Where one rank's local tensor sits in the global tensor.
struct LocalLayout {
  DimVector shape;   // The local tensor's shape.
  DimVector offset;  // Its first element's index in the global tensor.
  friend bool operator==(const LocalLayout&, const LocalLayout&) = default;
};

// The local shape and global offset of the shard held by the rank at mesh
// coordinate `coordinate`, by the left-to-right rule: for each mesh dim i in
// order, a Shard(d) there replaces the current extent of dim d with chunk
// coordinate[i] of it (ChunkOf(extent, mesh_shape[i], coordinate[i])) and
// adds that chunk's offset to offset[d]. An empty shard's offset[d] is the
// global extent global_shape[d], as PyTorch's
// compute_local_shape_and_global_offset gives it, wherever its parent chunk
// ended. Replicate and Partial change nothing. Possible errors: those of ValidatePlacements;
// INVALID_ARGUMENT for a negative global size or a coordinate outside the mesh.
absl::StatusOr<LocalLayout> ComputeLocalLayout(absl::Span<const int64_t> global_shape,
                                               absl::Span<const int64_t> mesh_shape,
                                               absl::Span<const Placement> placements,
                                               absl::Span<const int64_t> coordinate);

}  // namespace mesh
