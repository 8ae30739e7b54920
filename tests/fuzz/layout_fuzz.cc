// Fuzz target: the DTensor layout functions of libmesh (mesh/placement.h,
// mesh/redistribute_plan.h), pure functions of shapes and placements.
//
// Decoded from the input: ChunkOf arguments over the whole int64 range; a
// mesh shape (mostly small, sometimes not), a global shape, source and
// destination placements (mostly valid, sometimes not) and a dtype.
//
// Invariants: no crash or sanitizer report, and
//   ChunkOf: chunks of ceil(size / parts), in order, inside [0, size], that
//     add up to size;
//   ComputeLocalLayout: for valid placements every mesh coordinate has a
//     layout inside the global tensor; along every tensor dim, the distinct
//     intervals the ranks hold tile [0, global) exactly (their lengths add
//     up to the global size, without overlap); ranks that agree on every
//     sharding mesh dim hold the same shard; a coordinate outside the mesh
//     is refused;
//   PlanRedistribute: valid placements always plan; the steps chain from
//     src to dst, each changing one mesh dim with the table's op, local
//     steps receive nothing, the total is the sum of the steps; and the
//     plan never receives more bytes than going one mesh dim at a time
//     (direct single-dim steps), in either dim order.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mesh/dtype.h"
#include "mesh/placement.h"
#include "mesh/redistribute_plan.h"
#include "tests/fuzz/fuzz_check.h"

namespace mesh {
namespace {

void CheckChunks(FuzzedDataProvider& in) {
  const int64_t size = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 100)
                                        : in.ConsumeIntegralInRange<int64_t>(0, INT64_MAX);
  const int64_t parts = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 16)
                                         : in.ConsumeIntegralInRange<int64_t>(1, INT64_MAX);
  const int64_t ceil = size / parts + (size % parts != 0 ? 1 : 0);
  auto check = [&](int64_t index) {
    const Chunk chunk = ChunkOf(size, parts, index);
    const std::string where = absl::StrCat("ChunkOf(", size, ", ", parts, ", ", index, ")");
    FUZZ_CHECK(chunk.size >= 0 && chunk.size <= ceil, where);
    FUZZ_CHECK(chunk.offset >= 0 && chunk.offset <= size, where);
    FUZZ_CHECK(chunk.size <= size - chunk.offset, where);
    // Chunk i starts at min(i * ceil, size).
    const __int128 start = static_cast<__int128>(index) * ceil;
    FUZZ_CHECK(chunk.offset == (start < size ? static_cast<int64_t>(start) : size), where);
    return chunk;
  };
  if (parts <= 4096) {
    int64_t next = 0;
    for (int64_t i = 0; i < parts; ++i) {
      const Chunk chunk = check(i);
      FUZZ_CHECK(chunk.offset == next, "chunks are not contiguous");
      next += chunk.size;
    }
    FUZZ_CHECK(next == size, "chunks do not add up to the size");
  } else {
    for (int i = 0; i < 4; ++i) (void)check(in.ConsumeIntegralInRange<int64_t>(0, parts - 1));
    (void)check(parts - 1);
  }
}

Placement RandomPlacement(FuzzedDataProvider& in, int tensor_rank) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
    case 1:
    case 2:
      return Placement::Replicate();
    case 3:
      return Placement::Partial(static_cast<ReduceOp>(in.ConsumeIntegralInRange<int>(0, 4)));
    case 4:
      return Placement::Partial(static_cast<ReduceOp>(in.ConsumeIntegral<uint8_t>()));
    case 5:
      return Placement::Shard(in.ConsumeIntegralInRange<int>(-2, tensor_rank + 1));
    default:
      return Placement::Shard(in.ConsumeIntegralInRange<int>(0, std::max(0, tensor_rank - 1)));
  }
}

// Every coordinate of `mesh_shape`, row-major (the caller bounds its size).
std::vector<std::vector<int64_t>> Coordinates(const std::vector<int64_t>& mesh_shape) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> coordinate(mesh_shape.size(), 0);
  while (true) {
    out.push_back(coordinate);
    int i = static_cast<int>(mesh_shape.size()) - 1;
    while (i >= 0 && ++coordinate[i] == mesh_shape[i]) coordinate[i--] = 0;
    if (i < 0) return out;
  }
}

void CheckLayouts(const std::vector<int64_t>& global, const std::vector<int64_t>& mesh_shape,
                  const Placements& placements) {
  const std::string what =
      absl::StrCat(PlacementsToString(placements), " on mesh of ", mesh_shape.size(), " dims");
  // The ranks' layouts, keyed by their coordinates along sharding mesh dims.
  std::map<std::vector<int64_t>, LocalLayout> shards;
  for (const std::vector<int64_t>& coordinate : Coordinates(mesh_shape)) {
    auto layout = ComputeLocalLayout(global, mesh_shape, placements, coordinate);
    FUZZ_CHECK(layout.ok(), absl::StrCat(what, ": ", layout.status().ToString()));
    FUZZ_CHECK(layout->shape.size() == global.size() && layout->offset.size() == global.size(),
               what);
    for (size_t d = 0; d < global.size(); ++d) {
      FUZZ_CHECK(layout->shape[d] >= 0 && layout->offset[d] >= 0 &&
                     layout->offset[d] <= global[d] &&
                     layout->shape[d] <= global[d] - layout->offset[d],
                 absl::StrCat(what, ": shard outside the tensor along dim ", d));
    }
    std::vector<int64_t> key;
    for (size_t i = 0; i < placements.size(); ++i) {
      key.push_back(placements[i].is_shard() ? coordinate[i] : -1);
    }
    auto [it, inserted] = shards.emplace(key, *layout);
    FUZZ_CHECK(inserted || it->second == *layout,
               absl::StrCat(what, ": replicas hold different shards"));
  }
  // Along each tensor dim, the distinct non-empty intervals tile [0, n).
  for (size_t d = 0; d < global.size(); ++d) {
    std::map<int64_t, int64_t> intervals;  // offset -> size
    for (const auto& [key, layout] : shards) {
      if (layout.shape[d] == 0) continue;
      auto [it, inserted] = intervals.emplace(layout.offset[d], layout.shape[d]);
      FUZZ_CHECK(inserted || it->second == layout.shape[d],
                 absl::StrCat(what, ": overlapping shards along dim ", d));
    }
    int64_t next = 0;
    for (const auto& [offset, size] : intervals) {
      FUZZ_CHECK(offset == next, absl::StrCat(what, ": gap or overlap along dim ", d, " at ",
                                              offset, ", expected ", next));
      next = offset + size;
    }
    FUZZ_CHECK(
        next == global[d] || (global[d] == 0 && intervals.empty()),
        absl::StrCat(what, ": shards along dim ", d, " add up to ", next, ", not ", global[d]));
  }
  // A coordinate outside the mesh is refused.
  std::vector<int64_t> outside(mesh_shape.size(), 0);
  if (!outside.empty()) {
    outside.back() = mesh_shape.back();
    FUZZ_CHECK(!ComputeLocalLayout(global, mesh_shape, placements, outside).ok(),
               absl::StrCat(what, ": a coordinate outside the mesh was accepted"));
  }
}

void CheckPlan(const RedistributePlan& plan, const Placements& src, const Placements& dst) {
  const std::string what = absl::StrCat(PlacementsToString(src), " -> ", PlacementsToString(dst));
  FUZZ_CHECK(plan.src == src && plan.dst == dst, what);
  FUZZ_CHECK(plan.steps.empty() == (src == dst), what);
  Placements state = src;
  int64_t total = 0;
  for (const RedistributeStep& step : plan.steps) {
    FUZZ_CHECK(step.before == state, absl::StrCat(what, ": steps do not chain"));
    FUZZ_CHECK(step.mesh_dim >= 0 && static_cast<size_t>(step.mesh_dim) < src.size(), what);
    FUZZ_CHECK(step.from == state[step.mesh_dim] && step.from != step.to, what);
    Placements after = state;
    after[step.mesh_dim] = step.to;
    FUZZ_CHECK(step.after == after, absl::StrCat(what, ": a step changes more than its dim"));
    FUZZ_CHECK(step.bytes_per_rank >= 0, what);
    const bool local =
        step.op == RedistributeOp::kLocalSlice || step.op == RedistributeOp::kLocalPartial;
    if (local) FUZZ_CHECK(step.bytes_per_rank == 0, absl::StrCat(what, ": a local step receives"));
    switch (step.op) {
      case RedistributeOp::kAllGather:
        FUZZ_CHECK(step.from.is_shard() && step.to.is_replicate(), what);
        break;
      case RedistributeOp::kAllReduce:
        FUZZ_CHECK(step.from.is_partial() && step.to.is_replicate(), what);
        break;
      case RedistributeOp::kReduceScatter:
        FUZZ_CHECK(step.from.is_partial() && step.to.is_shard(), what);
        break;
      case RedistributeOp::kAllToAll:
        FUZZ_CHECK(step.from.is_shard() && step.to.is_shard(), what);
        break;
      case RedistributeOp::kLocalSlice:
        FUZZ_CHECK(step.from.is_replicate() && step.to.is_shard(), what);
        break;
      case RedistributeOp::kLocalPartial:
        FUZZ_CHECK(step.from.is_replicate() && step.to.is_partial(), what);
        break;
    }
    total += step.bytes_per_rank;
    state = after;
  }
  FUZZ_CHECK(state == dst, absl::StrCat(what, ": steps do not end at dst"));
  FUZZ_CHECK(total == plan.bytes_per_rank, absl::StrCat(what, ": total is not the steps' sum"));
}

// Bytes of going src -> dst one mesh dim at a time in `order`, each hop one
// direct step; nullopt when a hop's state is not valid or needs a detour.
std::optional<int64_t> OneDimAtATime(const std::vector<int64_t>& global, DType dtype,
                                     const std::vector<int64_t>& mesh_shape, const Placements& src,
                                     const Placements& dst, const std::vector<size_t>& order) {
  Placements state = src;
  int64_t total = 0;
  for (size_t i : order) {
    if (state[i] == dst[i]) continue;
    Placements next = state;
    next[i] = dst[i];
    if (!ValidatePlacements(next, mesh_shape, static_cast<int>(global.size())).ok()) {
      return std::nullopt;
    }
    auto hop = PlanRedistribute(global, dtype, mesh_shape, state, next);
    FUZZ_CHECK(hop.ok(),
               absl::StrCat("a hop between valid placements fails: ", hop.status().ToString()));
    CheckPlan(*hop, state, next);
    // Only direct steps are the header's "one dim at a time": a hop that
    // needs a detour (another dim stepping aside through Replicate and back
    // to where it was) is outside the planner's search, which never returns
    // a dim to its source placement (tests/fuzz/corpus/layout/
    // plan-detour-back-to-src: 195 B/rank planned, 170 with such a detour).
    if (hop->steps.size() != 1) return std::nullopt;
    total += hop->bytes_per_rank;
    state = std::move(next);
  }
  return total;
}

constexpr int64_t kMaxRanks = 4096;

void CheckMesh(FuzzedDataProvider& in) {
  const bool small = in.ConsumeIntegralInRange<int>(0, 7) != 0;
  std::vector<int64_t> mesh_shape(in.ConsumeIntegralInRange<int>(small ? 1 : 0, small ? 3 : 4));
  int64_t ranks = 1;
  for (int64_t& size : mesh_shape) {
    size = small ? in.ConsumeIntegralInRange<int64_t>(1, 4)
                 : in.ConsumeIntegralInRange<int64_t>(-1, 64);
    // The planner's cost grows with the number of ranks (each step's bytes
    // are a maximum over them): a 3-million-rank mesh takes seconds, which
    // only says that it is big. kMaxRanks at most.
    if (ranks * std::max<int64_t>(size, 1) > kMaxRanks) size = 1;
    ranks *= std::max<int64_t>(size, 1);
  }
  std::vector<int64_t> global(in.ConsumeIntegralInRange<int>(0, 4));
  for (int64_t& size : global) {
    size = small ? in.ConsumeIntegralInRange<int64_t>(0, 12)
                 : in.PickValueInArray<int64_t>(
                       {-1, 0, 1, 7, 1 << 20, int64_t{1} << 40, INT64_MAX / 3, INT64_MAX});
  }
  const int tensor_rank = static_cast<int>(global.size());
  Placements src(mesh_shape.size()), dst(mesh_shape.size());
  for (Placement& p : src) p = RandomPlacement(in, tensor_rank);
  for (Placement& p : dst) p = RandomPlacement(in, tensor_rank);
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) src.push_back(Placement::Replicate());
  const DType dtype = in.PickValueInArray(kAllDTypes);

  if (std::getenv("MESH_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "mesh [%s] global [%s] %s -> %s\n", absl::StrJoin(mesh_shape, ",").c_str(),
                 absl::StrJoin(global, ",").c_str(), PlacementsToString(src).c_str(),
                 PlacementsToString(dst).c_str());
  }
  const bool negative = std::any_of(global.begin(), global.end(), [](int64_t s) { return s < 0; });
  const bool src_valid = ValidatePlacements(src, mesh_shape, tensor_rank).ok();
  const bool dst_valid = ValidatePlacements(dst, mesh_shape, tensor_rank).ok();

  if (src_valid && !negative && ranks <= 64) CheckLayouts(global, mesh_shape, src);
  if (!src_valid) {
    std::vector<int64_t> origin(mesh_shape.size(), 0);
    FUZZ_CHECK(!ComputeLocalLayout(global, mesh_shape, src, origin).ok(),
               "invalid placements laid out");
  }

  auto plan = PlanRedistribute(global, dtype, mesh_shape, src, dst);
  if (!src_valid || !dst_valid || negative) {
    FUZZ_CHECK(!plan.ok(), "invalid input planned");
    FUZZ_CHECK(absl::IsInvalidArgument(plan.status()), plan.status().ToString());
    return;
  }
  if (!plan.ok()) {
    // Only a tensor too large to count in bytes may be refused.
    FUZZ_CHECK(absl::IsInvalidArgument(plan.status()), plan.status().ToString());
    return;
  }
  CheckPlan(*plan, src, dst);
  if (ranks > 64) return;
  std::vector<size_t> order(mesh_shape.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (int pass = 0; pass < 2; ++pass) {
    auto stepwise = OneDimAtATime(global, dtype, mesh_shape, src, dst, order);
    if (stepwise.has_value()) {
      FUZZ_CHECK(plan->bytes_per_rank <= *stepwise,
                 absl::StrCat(plan->ToString(), "receives ", plan->bytes_per_rank,
                              " B/rank, more than ", *stepwise, " one dim at a time"));
    }
    std::reverse(order.begin(), order.end());
  }
}

}  // namespace
}  // namespace mesh

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    mesh::CheckChunks(in);
  } else {
    mesh::CheckMesh(in);
  }
  return 0;
}
