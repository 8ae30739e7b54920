#include "mesh/redistribute_plan.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shape_string.h"

namespace mesh {
namespace {

using internal::ShapeString;

// Plans never count more than this many bytes for the whole tensor, so that
// every per-step and per-plan sum below stays far from int64 overflow.
constexpr int64_t kMaxTensorBytes = std::numeric_limits<int64_t>::max() / 1024;

// The step kind that moves one mesh dim from `from` to `to`, if there is one
// (the header's table). Shard→Partial and Partial(a)→Partial(b) have none.
std::optional<RedistributeOp> StepKind(const Placement& from, const Placement& to) {
  if (from == to) return std::nullopt;
  if (from.is_shard() && to.is_replicate()) return RedistributeOp::kAllGather;
  if (from.is_partial() && to.is_replicate()) return RedistributeOp::kAllReduce;
  if (from.is_partial() && to.is_shard()) return RedistributeOp::kReduceScatter;
  if (from.is_shard() && to.is_shard()) return RedistributeOp::kAllToAll;
  if (from.is_replicate() && to.is_shard()) return RedistributeOp::kLocalSlice;
  if (from.is_replicate() && to.is_partial()) return RedistributeOp::kLocalPartial;
  return std::nullopt;
}

// Left-to-right nesting: a step on mesh dim i that changes or introduces
// Shard(d) needs no mesh dim after i to shard d, because those dims' chunks
// are cut from the extent that mesh dim i decides.
bool NestingAllows(const Placements& state, int mesh_dim, const Placement& from,
                   const Placement& to) {
  for (size_t j = static_cast<size_t>(mesh_dim) + 1; j < state.size(); ++j) {
    if (!state[j].is_shard()) continue;
    if (from.is_shard(state[j].dim()) || to.is_shard(state[j].dim())) return false;
  }
  return true;
}

// Whether the state's Partials commute (ValidatePlacements' rule): the
// search never passes through a state whose global value would depend on the
// order its Partial dims are reduced in.
bool PartialsCommute(const Placements& state, absl::Span<const int64_t> mesh_shape) {
  return ValidatePlacements(state, mesh_shape, /*tensor_rank=*/1 << 20).ok();
}

// ComputeLocalLayout without the checks (the inputs were validated once).
struct Box {
  DimVector shape;
  DimVector offset;
};

Box LayoutOf(absl::Span<const int64_t> global_shape, absl::Span<const int64_t> mesh_shape,
             const Placements& placements, const std::vector<int64_t>& coordinate) {
  Box box;
  box.shape.assign(global_shape.begin(), global_shape.end());
  box.offset.assign(global_shape.size(), 0);
  for (size_t i = 0; i < mesh_shape.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    const int d = placements[i].dim();
    const Chunk chunk = ChunkOf(box.shape[d], mesh_shape[i], coordinate[i]);
    box.shape[d] = chunk.size;
    box.offset[d] += chunk.offset;
  }
  return box;
}

// Zero extents are checked first: the other extents of an empty tensor may
// multiply past int64 (only non-empty tensors are bounded by kMaxTensorBytes).
int64_t Numel(const Box& box) {
  if (std::find(box.shape.begin(), box.shape.end(), 0) != box.shape.end()) return 0;
  int64_t n = 1;
  for (int64_t s : box.shape) n *= s;
  return n;
}

int64_t OverlapNumel(const Box& a, const Box& b) {
  Box overlap;
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t begin = std::max(a.offset[d], b.offset[d]);
    const int64_t end = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    overlap.shape.push_back(std::max<int64_t>(end - begin, 0));
  }
  return Numel(overlap);
}

// Bytes the busiest rank receives when mesh dim `mesh_dim` goes from
// before[mesh_dim] to after[mesh_dim] with `op` (the header's table).
int64_t StepBytes(absl::Span<const int64_t> global_shape, int64_t element_size,
                  absl::Span<const int64_t> mesh_shape, const Placements& before,
                  const Placements& after, int mesh_dim, RedistributeOp op) {
  if (op == RedistributeOp::kLocalSlice || op == RedistributeOp::kLocalPartial) return 0;
  const int64_t k = mesh_shape[mesh_dim];
  const size_t ndim = mesh_shape.size();
  // A rank's layouts depend only on its coordinates along mesh dims that
  // shard before or after the step; the others stay at 0.
  std::vector<int64_t> extent(ndim, 1);
  for (size_t j = 0; j < ndim; ++j) {
    if (before[j].is_shard() || after[j].is_shard()) extent[j] = mesh_shape[j];
  }
  std::vector<int64_t> coordinate(ndim, 0);
  int64_t busiest = 0;
  while (true) {
    const Box old_box = LayoutOf(global_shape, mesh_shape, before, coordinate);
    int64_t elements = 0;
    switch (op) {
      case RedistributeOp::kAllGather:
        // The peers' real shard sizes, never padding. Nesting guarantees no
        // later mesh dim re-chunks the gathered tensor dim, so the peers'
        // shards tile the new box beside this rank's own: their sum is the
        // difference (O(1) per rank instead of O(k)).
        elements = Numel(LayoutOf(global_shape, mesh_shape, after, coordinate)) - Numel(old_box);
        break;
      case RedistributeOp::kAllReduce: {
        // ceil(2 (k-1) bytes / k); 128 bits because k can be large.
        const __int128 bytes = static_cast<__int128>(Numel(old_box)) * element_size;
        const __int128 total = 2 * (k - 1) * bytes;
        busiest = std::max(busiest, static_cast<int64_t>((total + k - 1) / k));
        break;
      }
      case RedistributeOp::kReduceScatter:
        elements = (k - 1) * Numel(LayoutOf(global_shape, mesh_shape, after, coordinate));
        break;
      case RedistributeOp::kAllToAll: {
        const Box new_box = LayoutOf(global_shape, mesh_shape, after, coordinate);
        elements = Numel(new_box) - OverlapNumel(new_box, old_box);
        break;
      }
      case RedistributeOp::kLocalSlice:
      case RedistributeOp::kLocalPartial:
        break;
    }
    busiest = std::max(busiest, elements * element_size);
    // Next coordinate, row-major.
    size_t j = ndim;
    while (j > 0) {
      --j;
      if (++coordinate[j] < extent[j]) break;
      coordinate[j] = 0;
      if (j == 0) return busiest;
    }
    if (ndim == 0) return busiest;
  }
}

// Product of the extents of `box` before tensor dim `d`: above 1, blocks cut
// along d are strided in the box (not one contiguous run). Saturates at
// int64's maximum: an empty tensor (a zero extent after d) is not bounded by
// kMaxTensorBytes, so its extents before d may multiply past int64 (found by
// tests/fuzz/layout_fuzz.cc).
int64_t OuterExtent(const Box& box, int d) {
  const auto outer = absl::MakeConstSpan(box.shape).first(static_cast<size_t>(d));
  if (std::find(outer.begin(), outer.end(), 0) != outer.end()) return 0;
  int64_t n = 1;
  for (int64_t s : outer) {
    n = n > std::numeric_limits<int64_t>::max() / s ? std::numeric_limits<int64_t>::max() : n * s;
  }
  return n;
}

// Elements the executor copies locally in a step besides what the
// collective itself moves, for the rank at coordinate 0 (the first chunk is
// the largest): the pieces it must pack because they are strided where they
// are, or unpack because they are strided where they go (Gloo's transport
// sends contiguous ranges only), and the copies of the local steps. Only a
// tie-break between plans that receive the same bytes in as many steps:
// e.g. [S(0), S(1)] -> [R, R] gathers the column-sharded mesh dim first,
// which unpacks a quarter of the tensor instead of half of it.
int64_t StepCopyElements(absl::Span<const int64_t> global_shape,
                         absl::Span<const int64_t> mesh_shape, const Placements& before,
                         const Placements& after, const Placement& from, const Placement& to,
                         RedistributeOp op) {
  const std::vector<int64_t> coordinate(mesh_shape.size(), 0);
  const Box old_box = LayoutOf(global_shape, mesh_shape, before, coordinate);
  const Box new_box = LayoutOf(global_shape, mesh_shape, after, coordinate);
  switch (op) {
    case RedistributeOp::kAllGather:
      return OuterExtent(new_box, from.dim()) > 1 ? Numel(new_box) - Numel(old_box) : 0;
    case RedistributeOp::kAllToAll: {
      const int64_t kept = OverlapNumel(new_box, old_box);
      int64_t copied = 0;
      if (OuterExtent(old_box, to.dim()) > 1) copied += Numel(old_box) - kept;
      if (OuterExtent(new_box, from.dim()) > 1) copied += Numel(new_box) - kept;
      return copied;
    }
    case RedistributeOp::kReduceScatter:
      return OuterExtent(old_box, to.dim()) > 1 ? Numel(old_box) : 0;
    case RedistributeOp::kAllReduce:
      return 0;
    case RedistributeOp::kLocalSlice:
      return Numel(new_box);
    case RedistributeOp::kLocalPartial:
      return Numel(old_box);
  }
  return 0;
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  if (a > std::numeric_limits<int64_t>::max() - b) return std::numeric_limits<int64_t>::max();
  return a + b;
}

// A path in the search, ordered by (bytes, steps, local copies, the steps'
// mesh dims and choices lexicographically). Appending a step adds the same
// amounts to two paths to the same state, so it keeps their order, which is
// what makes Dijkstra exact here.
struct Path {
  int64_t bytes = 0;
  // Elements copied locally (StepCopyElements), summed: the tie-break after
  // the number of steps.
  int64_t copies = 0;
  // (mesh dim, index of the target in that dim's candidates: dst first,
  // then Replicate, then src, then the rest) per step: the final tie-break,
  // lowest mesh dims first.
  std::vector<std::pair<int, int>> order;
  Placements state;
  std::vector<RedistributeStep> steps;
};

bool Before(const Path& a, const Path& b) {
  if (a.bytes != b.bytes) return a.bytes < b.bytes;
  if (a.order.size() != b.order.size()) return a.order.size() < b.order.size();
  if (a.copies != b.copies) return a.copies < b.copies;
  return a.order < b.order;
}

struct PathAfter {
  bool operator()(const Path& a, const Path& b) const { return Before(b, a); }
};

// The wider search costs about states x edges x ranks (each edge's bytes
// come from every sharded coordinate), so it runs while states x ranks stays
// within this budget (about 0.1 s of planning on the development VM, once
// per cache key); beyond it each mesh dim keeps to its src, dst or
// Replicate (at most 3^ndim states). E.g. a 4-d tensor on (4, 4, 4, 4)
// (625 states x 256 ranks) searches everything; on (8, 8, 8, 8) it does not.
constexpr int64_t kFullSearchBudget = int64_t{1} << 20;

// The placements each mesh dim may take in the search, in tie-break order:
// its dst, Replicate, its src, then every Shard(d) and every Partial that
// src or dst uses. Intermediate placements outside {src, dst, Replicate}
// matter: e.g. [S(2), S(2), S(2)] -> [P(avg), S(0), S(2)] on a (4, 3, 2)
// mesh of a [1, 2, 13] tensor is cheapest through a Shard(0) that neither
// end holds on that dim (tests/libmesh/redistribute_plan_test.cc).
std::vector<std::vector<Placement>> SearchCandidates(const Placements& src, const Placements& dst,
                                                     absl::Span<const int64_t> mesh_shape,
                                                     int tensor_rank) {
  std::vector<Placement> everything;
  for (int d = 0; d < tensor_rank; ++d) everything.push_back(Placement::Shard(d));
  for (const Placements* side : {&src, &dst}) {
    for (const Placement& p : *side) {
      if (p.is_partial() &&
          std::find(everything.begin(), everything.end(), p) == everything.end()) {
        everything.push_back(p);
      }
    }
  }
  const int64_t per_dim = static_cast<int64_t>(everything.size()) + 1;  // + Replicate.
  int64_t cost = 1;  // States x ranks, saturating past the budget.
  for (size_t i = 0; i < src.size() && cost <= kFullSearchBudget; ++i) {
    cost *= per_dim;
    cost = std::min(cost, kFullSearchBudget + 1) * std::max<int64_t>(mesh_shape[i], 1);
    cost = std::min(cost, kFullSearchBudget + 1);
  }
  const bool full = cost <= kFullSearchBudget;
  std::vector<std::vector<Placement>> candidates(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    std::vector<Placement>& c = candidates[i];
    auto add = [&](const Placement& p) {
      if (std::find(c.begin(), c.end(), p) == c.end()) c.push_back(p);
    };
    add(dst[i]);
    add(Placement::Replicate());
    add(src[i]);
    if (full) {
      for (const Placement& p : everything) add(p);
    }
  }
  return candidates;
}

}  // namespace

const char* RedistributeOpName(RedistributeOp op) {
  switch (op) {
    case RedistributeOp::kAllGather:
      return "all_gather";
    case RedistributeOp::kAllReduce:
      return "all_reduce";
    case RedistributeOp::kReduceScatter:
      return "reduce_scatter";
    case RedistributeOp::kAllToAll:
      return "all_to_all";
    case RedistributeOp::kLocalSlice:
      return "local_slice";
    case RedistributeOp::kLocalPartial:
      return "local_partial";
  }
  return "unknown";
}

std::string RedistributePlan::ToString() const {
  return absl::StrJoin(steps, "\n", [](std::string* out, const RedistributeStep& step) {
    absl::StrAppend(out, "mesh dim ", step.mesh_dim, ": ", step.from.ToString(), " -> ",
                    step.to.ToString(), "  ", RedistributeOpName(step.op), "  ",
                    step.bytes_per_rank, " B/rank");
  });
}

absl::StatusOr<RedistributePlan> PlanRedistribute(absl::Span<const int64_t> global_shape,
                                                  DType dtype, absl::Span<const int64_t> mesh_shape,
                                                  absl::Span<const Placement> src,
                                                  absl::Span<const Placement> dst) {
  const int tensor_rank = static_cast<int>(global_shape.size());
  if (absl::Status s = ValidatePlacements(src, mesh_shape, tensor_rank); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("source ", s.message()));
  }
  if (absl::Status s = ValidatePlacements(dst, mesh_shape, tensor_rank); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("target ", s.message()));
  }
  const int64_t element_size = static_cast<int64_t>(ElementSize(dtype));
  int64_t tensor_bytes = element_size;
  bool empty = false;
  for (size_t d = 0; d < global_shape.size(); ++d) {
    if (global_shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("global shape ", ShapeString(global_shape),
                                                     ": dim ", d, " has negative size ",
                                                     global_shape[d]));
    }
    empty = empty || global_shape[d] == 0;
    if (global_shape[d] != 0 && tensor_bytes > kMaxTensorBytes / global_shape[d]) {
      tensor_bytes = kMaxTensorBytes + 1;
    } else if (global_shape[d] != 0) {
      tensor_bytes *= global_shape[d];
    }
  }
  if (empty) tensor_bytes = 0;
  if (tensor_bytes > kMaxTensorBytes) {
    return absl::InvalidArgumentError(absl::StrCat("global shape ", ShapeString(global_shape),
                                                   " of ", DTypeName(dtype), " holds more than ",
                                                   kMaxTensorBytes, " bytes; too large to plan"));
  }

  RedistributePlan plan;
  plan.src.assign(src.begin(), src.end());
  plan.dst.assign(dst.begin(), dst.end());
  if (plan.src == plan.dst) return plan;

  const int ndim = static_cast<int>(mesh_shape.size());
  const std::vector<std::vector<Placement>> candidates =
      SearchCandidates(plan.src, plan.dst, mesh_shape, tensor_rank);
  // States are keyed by their printed form.
  absl::flat_hash_set<std::string> settled;
  std::priority_queue<Path, std::vector<Path>, PathAfter> frontier;
  Path start;
  start.state = plan.src;
  frontier.push(std::move(start));
  while (!frontier.empty()) {
    Path path = frontier.top();
    frontier.pop();
    if (!settled.insert(PlacementsToString(path.state)).second) continue;
    if (path.state == plan.dst) {
      plan.steps = std::move(path.steps);
      plan.bytes_per_rank = path.bytes;
      return plan;
    }
    for (int i = 0; i < ndim; ++i) {
      const Placement& from = path.state[i];
      const std::vector<Placement>& targets = candidates[static_cast<size_t>(i)];
      for (int choice = 0; choice < static_cast<int>(targets.size()); ++choice) {
        const Placement& to = targets[static_cast<size_t>(choice)];
        if (to == from) continue;
        const std::optional<RedistributeOp> op = StepKind(from, to);
        if (!op.has_value() || !NestingAllows(path.state, i, from, to)) continue;
        Path next;
        next.state = path.state;
        next.state[i] = to;
        if (settled.contains(PlacementsToString(next.state))) continue;
        if (to.is_partial() && !PartialsCommute(next.state, mesh_shape)) continue;
        RedistributeStep step;
        step.mesh_dim = i;
        step.op = *op;
        step.from = from;
        step.to = to;
        step.before = path.state;
        step.after = next.state;
        step.bytes_per_rank =
            StepBytes(global_shape, element_size, mesh_shape, step.before, step.after, i, step.op);
        next.bytes = SaturatingAdd(path.bytes, step.bytes_per_rank);
        next.copies = SaturatingAdd(
            path.copies,
            StepCopyElements(global_shape, mesh_shape, step.before, step.after, from, to, step.op));
        next.order = path.order;
        next.order.emplace_back(i, choice);
        next.steps = path.steps;
        next.steps.push_back(std::move(step));
        frontier.push(std::move(next));
      }
    }
  }
  // Unreachable for valid placements: Replicate everywhere is reachable from
  // any state (gather the last mesh dim of each sharded tensor dim first),
  // and any target from there (slice left to right).
  return absl::InvalidArgumentError(
      absl::StrCat("no sequence of single-mesh-dim steps turns ", PlacementsToString(src), " into ",
                   PlacementsToString(dst), " on mesh ", ShapeString(mesh_shape)));
}

absl::StatusOr<std::shared_ptr<const RedistributePlan>> RedistributePlanCache::Get(
    absl::Span<const int64_t> global_shape, DType dtype, absl::Span<const int64_t> mesh_shape,
    absl::Span<const Placement> src, absl::Span<const Placement> dst) {
  const std::string key =
      absl::StrCat("mesh", ShapeString(mesh_shape), " global", ShapeString(global_shape), " ",
                   DTypeName(dtype), " ", PlacementsToString(src), " -> ", PlacementsToString(dst));
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      ++hits_;
      return it->second;
    }
    ++misses_;
  }
  // Planned outside the lock: two threads missing on the same key both plan,
  // and the first insert wins (plans are deterministic, so they are equal).
  absl::StatusOr<RedistributePlan> plan =
      PlanRedistribute(global_shape, dtype, mesh_shape, src, dst);
  if (!plan.ok()) return plan.status();
  auto shared = std::make_shared<const RedistributePlan>(*std::move(plan));
  absl::MutexLock lock(&mu_);
  return plans_.emplace(key, std::move(shared)).first->second;
}

int64_t RedistributePlanCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t RedistributePlanCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

}  // namespace mesh
