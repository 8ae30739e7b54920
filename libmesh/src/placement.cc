#include "mesh/placement.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "shape_string.h"

namespace mesh {
namespace {

using internal::ShapeString;

bool IsKnownReduceOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kProd:
      return true;
  }
  return false;
}

}  // namespace

std::string Placement::ToString() const {
  switch (kind_) {
    case Kind::kReplicate:
      return "R";
    case Kind::kShard:
      return absl::StrCat("S(", dim_, ")");
    case Kind::kPartial:
      return absl::StrCat("P(", ReduceOpName(op_), ")");
  }
  return "?";
}

std::string PlacementsToString(absl::Span<const Placement> placements) {
  return absl::StrCat("[",
                      absl::StrJoin(placements, ", ",
                                    [](std::string* out, const Placement& p) {
                                      absl::StrAppend(out, p.ToString());
                                    }),
                      "]");
}

absl::Status ValidatePlacements(absl::Span<const Placement> placements,
                                absl::Span<const int64_t> mesh_shape, int tensor_rank) {
  if (placements.size() != mesh_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placements ", PlacementsToString(placements), " name ", placements.size(),
        " mesh dims but the mesh ", ShapeString(mesh_shape), " has ", mesh_shape.size()));
  }
  for (size_t i = 0; i < mesh_shape.size(); ++i) {
    // ChunkOf needs at least one part; a mesh never has an empty dim.
    if (mesh_shape[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("mesh ", ShapeString(mesh_shape),
                                                     ": mesh dim ", i, " has size ", mesh_shape[i],
                                                     "; every size must be >= 1"));
    }
    const Placement& p = placements[i];
    if (p.is_shard() && (p.dim() < 0 || p.dim() >= tensor_rank)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placements ", PlacementsToString(placements), ": mesh dim ", i, " is ", p.ToString(),
          " but the tensor has ", tensor_rank, " dims (valid: 0..", tensor_rank - 1, ")"));
    }
    if (p.is_partial() && !IsKnownReduceOp(p.op())) {
      return absl::InvalidArgumentError(
          absl::StrCat("placements ", PlacementsToString(placements), ": mesh dim ", i,
                       " is Partial with unknown reduce op ", static_cast<int>(p.op()),
                       " (valid: sum, avg, min, max, prod)"));
    }
  }
  // Partials on several mesh dims must reduce to one value whatever order
  // the dims are reduced in: sum and avg (both linear) mix; min, max and
  // prod only go with themselves (max of mins is not min of maxes).
  auto family = [](ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; };
  const Placement* first = nullptr;
  size_t first_dim = 0;
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_partial()) continue;
    if (first == nullptr) {
      first = &placements[i];
      first_dim = i;
    } else if (family(first->op()) != family(placements[i].op())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placements ", PlacementsToString(placements), ": mesh dims ", first_dim, " and ", i,
          " are ", first->ToString(), " and ", placements[i].ToString(),
          ", which do not commute; Partial dims may mix sum and avg, and min, max and prod "
          "only with the same op"));
    }
  }
  return absl::OkStatus();
}

Chunk ChunkOf(int64_t size, int64_t parts, int64_t index) {
  MESH_CHECK(size >= 0, "ChunkOf: size must be >= 0");
  MESH_CHECK(parts >= 1, "ChunkOf: parts must be >= 1");
  MESH_CHECK(index >= 0 && index < parts, "ChunkOf: index outside [0, parts)");
  // ceil(size / parts) without overflow for size near INT64_MAX.
  const int64_t chunk = size / parts + (size % parts != 0 ? 1 : 0);
  // index * chunk <= size when index < ceil(size / chunk); otherwise the
  // start is clamped. Compare by division so huge sizes cannot overflow.
  const int64_t begin = (chunk == 0 || index > size / chunk) ? size : index * chunk;
  const int64_t end = (size - begin <= chunk) ? size : begin + chunk;
  return Chunk{end - begin, begin};
}

absl::StatusOr<LocalLayout> ComputeLocalLayout(absl::Span<const int64_t> global_shape,
                                               absl::Span<const int64_t> mesh_shape,
                                               absl::Span<const Placement> placements,
                                               absl::Span<const int64_t> coordinate) {
  if (absl::Status s =
          ValidatePlacements(placements, mesh_shape, static_cast<int>(global_shape.size()));
      !s.ok()) {
    return s;
  }
  for (size_t d = 0; d < global_shape.size(); ++d) {
    if (global_shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("global shape ", ShapeString(global_shape),
                                                     ": dim ", d, " has negative size ",
                                                     global_shape[d]));
    }
  }
  if (coordinate.size() != mesh_shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinate ", ShapeString(coordinate), " has ", coordinate.size(),
                     " dims but the mesh ", ShapeString(mesh_shape), " has ", mesh_shape.size()));
  }
  for (size_t i = 0; i < mesh_shape.size(); ++i) {
    if (coordinate[i] < 0 || coordinate[i] >= mesh_shape[i]) {
      return absl::InvalidArgumentError(absl::StrCat("coordinate ", ShapeString(coordinate),
                                                     " is outside the mesh ",
                                                     ShapeString(mesh_shape), " at mesh dim ", i));
    }
  }
  LocalLayout layout;
  layout.shape.assign(global_shape.begin(), global_shape.end());
  layout.offset.assign(global_shape.size(), 0);
  for (size_t i = 0; i < mesh_shape.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    const int d = placements[i].dim();
    const Chunk chunk = ChunkOf(layout.shape[d], mesh_shape[i], coordinate[i]);
    layout.shape[d] = chunk.size;
    // An empty shard sits at the global extent, PyTorch's out-of-range
    // offset for it (distributed checkpointing de-duplicates shards by it).
    layout.offset[d] = chunk.size == 0 ? global_shape[d] : layout.offset[d] + chunk.offset;
  }
  return layout;
}

}  // namespace mesh
