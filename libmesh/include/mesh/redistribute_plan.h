// Redistribute plans: how a sharded tensor gets from one list of placements
// to another, as a value you can inspect before (or instead of) running it.
// mesh/dtensor.h's Redistribute executes them. docs/sharding.md has the
// transitions, their collectives and costs.
//
// A plan is a sequence of steps, each changing the placement of ONE mesh dim
// with one collective over that dim's group (or a local operation):
//
//   from         to           op              bytes received per rank
//   Shard(d)     Replicate    kAllGather      the peers' shards (uneven: their
//                                             real sizes, never padding)
//   Partial(op)  Replicate    kAllReduce      2 (k-1)/k x the local bytes
//   Partial(op)  Shard(d)     kReduceScatter  (k-1) x the rank's own chunk
//   Shard(d)     Shard(e)     kAllToAll       the parts of the new shard that
//                                             peers hold (one all_to_all,
//                                             never a gather)
//   Replicate    Shard(d)     kLocalSlice     0: keep this rank's chunk
//   Replicate    Partial(op)  kLocalPartial   0: sum and prod keep the value
//                                             on coordinate 0 of the dim and
//                                             put 0 (sum) or 1 (prod)
//                                             elsewhere; avg, min and max
//                                             keep it everywhere
//
// k is the size of the step's mesh dim; bytes are counted for the busiest
// rank of the step (the maximum over ranks), with the tensor's layout as it
// is before that step. Shard→Partial and Partial(a)→Partial(b) have no
// direct step; the planner goes through Replicate.
//
// Order. Several mesh dims may change at once. A step on mesh dim i that
// changes (or introduces) Shard(d) is only valid while no mesh dim j > i
// shards the same tensor dim d (left-to-right nesting: dim j's chunks live
// inside dim i's). The planner searches every order of single-dim steps,
// including detours (through Replicate, back to a dim's source placement,
// or through a Shard that neither end holds) where nesting or cost call for
// them: each mesh dim may take every Shard, Replicate, and the Partials of
// src and dst, unless states x ranks would exceed 2^20 (large meshes), when
// each keeps to its src, dst or Replicate. It returns one that receives the fewest bytes per rank
// in total (ties: fewest steps, then the fewest elements the executor must copy locally: pieces
// packed or unpacked because they are strided, and local steps' copies;
// then the lowest mesh dims first). Doing the dims one at a time in
// any valid order is one of the candidates, so the result is never worse.
//
// Thread safety: values and pure functions; RedistributePlanCache is
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "mesh/dtype.h"
#include "mesh/placement.h"

namespace mesh {

enum class RedistributeOp : uint8_t {
  kAllGather,
  kAllReduce,
  kReduceScatter,
  kAllToAll,
  kLocalSlice,
  kLocalPartial,
};

// "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "local_slice",
// "local_partial".
const char* RedistributeOpName(RedistributeOp op);

struct RedistributeStep {
  int mesh_dim = 0;
  RedistributeOp op = RedistributeOp::kLocalSlice;
  Placement from;
  Placement to;
  // Every mesh dim's placement before and after the step.
  Placements before;
  Placements after;
  // Bytes the busiest rank receives in this step (0 for local steps).
  int64_t bytes_per_rank = 0;
};

struct RedistributePlan {
  Placements src;
  Placements dst;
  std::vector<RedistributeStep> steps;  // Empty when src == dst.
  // Sum of the steps' bytes_per_rank.
  int64_t bytes_per_rank = 0;

  // One line per step: "mesh dim 1: S(0) -> R  all_gather  4096 B/rank".
  std::string ToString() const;
};

// Plans src → dst for a tensor of `global_shape` and `dtype` on a mesh of
// `mesh_shape` (see the file comment).
// Possible errors: INVALID_ARGUMENT from ValidatePlacements for either list,
// for a negative size, or for a Partial whose op cannot become the target
// (Partial(a) → Partial(b) with a != b is planned through Replicate; it is
// an error only when a step cannot be built, which the message names).
absl::StatusOr<RedistributePlan> PlanRedistribute(absl::Span<const int64_t> global_shape,
                                                  DType dtype, absl::Span<const int64_t> mesh_shape,
                                                  absl::Span<const Placement> src,
                                                  absl::Span<const Placement> dst);

// Plans cached per (mesh shape, global shape, dtype, src, dst). Plans are
// immutable once made and shared.
class RedistributePlanCache {
 public:
  // Possible errors: those of PlanRedistribute (not cached).
  absl::StatusOr<std::shared_ptr<const RedistributePlan>> Get(
      absl::Span<const int64_t> global_shape, DType dtype, absl::Span<const int64_t> mesh_shape,
      absl::Span<const Placement> src, absl::Span<const Placement> dst);

  int64_t hits() const;
  int64_t misses() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const RedistributePlan>> plans_
      ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mesh
