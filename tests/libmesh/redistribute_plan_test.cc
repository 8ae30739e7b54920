// PlanRedistribute: the op and the exact bytes per rank of every single-dim
// transition (expected values worked out by hand from the chunk sizes), the
// nesting rule, optimality against every one-dim-at-a-time order and against
// an independent Bellman-Ford on random cases, errors, ToString and the cache.
#include "mesh/redistribute_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace mesh {
namespace redistribute_plan_test {

using ::testing::HasSubstr;
using Shape = std::vector<int64_t>;

const Placement R = Placement::Replicate();
Placement S(int d) { return Placement::Shard(d); }
Placement P(ReduceOp op = ReduceOp::kSum) { return Placement::Partial(op); }

RedistributePlan MustPlan(const Shape& global, DType dtype, const Shape& mesh,
                          const Placements& src, const Placements& dst) {
  absl::StatusOr<RedistributePlan> plan = PlanRedistribute(global, dtype, mesh, src, dst);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : RedistributePlan{};
}

// ---- An independent reference ---------------------------------------------

int64_t RanksOf(const Shape& mesh) {
  int64_t n = 1;
  for (int64_t m : mesh) n *= m;
  return n;
}

Shape CoordinateOf(const Shape& mesh, int64_t rank) {
  Shape c(mesh.size());
  for (int i = static_cast<int>(mesh.size()) - 1; i >= 0; --i) {
    c[i] = rank % mesh[i];
    rank /= mesh[i];
  }
  return c;
}

LocalLayout LayoutAt(const Shape& global, const Shape& mesh, const Placements& placements,
                     const Shape& coordinate) {
  absl::StatusOr<LocalLayout> layout = ComputeLocalLayout(global, mesh, placements, coordinate);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return layout.ok() ? *layout : LocalLayout{};
}

int64_t Numel(const LocalLayout& layout) {
  int64_t n = 1;
  for (int64_t s : layout.shape) n *= s;
  return n;
}

// Elements of `a` that `b` also holds, counted one by one.
int64_t CountShared(const LocalLayout& a, const LocalLayout& b) {
  const int64_t n = Numel(a);
  int64_t shared = 0;
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e;
    bool inside = true;
    for (int d = static_cast<int>(a.shape.size()) - 1; d >= 0; --d) {
      const int64_t index = a.offset[d] + rest % a.shape[d];
      rest /= a.shape[d];
      inside = inside && index >= b.offset[d] && index < b.offset[d] + b.shape[d];
    }
    shared += inside ? 1 : 0;
  }
  return shared;
}

std::optional<RedistributeOp> KindOf(const Placement& from, const Placement& to) {
  if (from == to) return std::nullopt;
  if (from.is_shard() && to.is_replicate()) return RedistributeOp::kAllGather;
  if (from.is_partial() && to.is_replicate()) return RedistributeOp::kAllReduce;
  if (from.is_partial() && to.is_shard()) return RedistributeOp::kReduceScatter;
  if (from.is_shard() && to.is_shard()) return RedistributeOp::kAllToAll;
  if (from.is_replicate() && to.is_shard()) return RedistributeOp::kLocalSlice;
  if (from.is_replicate() && to.is_partial()) return RedistributeOp::kLocalPartial;
  return std::nullopt;
}

// The nesting rule, spelled out: no later mesh dim may shard a tensor dim
// that this step gathers, slices, scatters or re-shards.
// Independent of the planner: whether the Partials of `state` commute (sum
// with avg; min, max, prod each only with itself).
bool PartialsCommute(const Placements& state) {
  std::optional<ReduceOp> family;
  for (const Placement& p : state) {
    if (!p.is_partial()) continue;
    const ReduceOp f = p.op() == ReduceOp::kAvg ? ReduceOp::kSum : p.op();
    if (family.has_value() && *family != f) return false;
    family = f;
  }
  return true;
}

bool StepIsValid(const Placements& before, int mesh_dim, const Placement& to) {
  const Placement& from = before[mesh_dim];
  if (!KindOf(from, to).has_value()) return false;
  Placements after = before;
  after[mesh_dim] = to;
  if (!PartialsCommute(before) || !PartialsCommute(after)) return false;
  std::vector<int> touched;
  if (from.is_shard()) touched.push_back(from.dim());
  if (to.is_shard()) touched.push_back(to.dim());
  for (size_t j = mesh_dim + 1; j < before.size(); ++j) {
    for (int d : touched) {
      if (before[j].is_shard(d)) return false;
    }
  }
  return true;
}

// Bytes the busiest rank receives, from the layouts alone: a gather receives
// its peers' shards; an all_to_all what its new
// box has beyond its old one; a reduce_scatter k-1 copies of its new box; an
// all_reduce 2 (k-1)/k of its box, rounded up.
int64_t ReferenceBytes(const Shape& global, DType dtype, const Shape& mesh,
                       const Placements& before, int mesh_dim, const Placement& to) {
  Placements after = before;
  after[mesh_dim] = to;
  const RedistributeOp op = *KindOf(before[mesh_dim], to);
  const int64_t k = mesh[mesh_dim];
  const int64_t es = static_cast<int64_t>(ElementSize(dtype));
  int64_t busiest = 0;
  for (int64_t rank = 0; rank < RanksOf(mesh); ++rank) {
    const Shape c = CoordinateOf(mesh, rank);
    const LocalLayout old_box = LayoutAt(global, mesh, before, c);
    const LocalLayout new_box = LayoutAt(global, mesh, after, c);
    int64_t bytes = 0;
    switch (op) {
      case RedistributeOp::kAllGather: {
        Shape peer = c;
        for (int64_t p = 0; p < k; ++p) {
          peer[mesh_dim] = p;
          if (p != c[mesh_dim]) bytes += Numel(LayoutAt(global, mesh, before, peer)) * es;
        }
        break;
      }
      case RedistributeOp::kAllReduce:
        bytes = (2 * (k - 1) * Numel(old_box) * es + k - 1) / k;
        break;
      case RedistributeOp::kReduceScatter:
        bytes = (k - 1) * Numel(new_box) * es;
        break;
      case RedistributeOp::kAllToAll:
        bytes = (Numel(new_box) - CountShared(new_box, old_box)) * es;
        break;
      case RedistributeOp::kLocalSlice:
      case RedistributeOp::kLocalPartial:
        break;
    }
    busiest = std::max(busiest, bytes);
  }
  return busiest;
}

// Checks a plan step by step: it chains src to dst, each step changes one
// mesh dim with the table's op and obeys nesting, and its bytes are the
// reference's. Returns the plan's total.
int64_t CheckPlan(const RedistributePlan& plan, const Shape& global, DType dtype,
                  const Shape& mesh) {
  Placements state = plan.src;
  int64_t total = 0;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const RedistributeStep& step = plan.steps[s];
    SCOPED_TRACE(testing::Message() << "step " << s << " of\n" << plan.ToString());
    EXPECT_EQ(step.before, state);
    EXPECT_EQ(step.from, state[step.mesh_dim]);
    EXPECT_TRUE(StepIsValid(state, step.mesh_dim, step.to));
    EXPECT_EQ(KindOf(step.from, step.to), std::optional<RedistributeOp>(step.op));
    state[step.mesh_dim] = step.to;
    EXPECT_EQ(step.after, state);
    EXPECT_EQ(step.bytes_per_rank,
              ReferenceBytes(global, dtype, mesh, step.before, step.mesh_dim, step.to));
    total += step.bytes_per_rank;
  }
  EXPECT_EQ(state, plan.dst);
  EXPECT_EQ(total, plan.bytes_per_rank);
  return total;
}

// ---- Single-dim transitions, by hand -----------------------------------------

struct Case {
  std::string name;
  Shape global;
  DType dtype;
  Shape mesh;
  Placements src;
  Placements dst;
  std::vector<RedistributeOp> ops;
  int64_t bytes;  // Worked out by hand from the chunk sizes.
};

using Op = RedistributeOp;

std::vector<Case> HandCases() {
  const DType f32 = DType::kFloat32;
  const Shape m4 = {4};
  const Shape g75 = {7, 5};  // Rows 2, 2, 2, 1 over 4; cols 2, 2, 1, 0.
  const Shape m23 = {2, 3};
  const Shape g57 = {5, 7};  // Rows 3 | 2 over 2; cols 3, 3, 1 over 3.
  return {
      // Rank 3 holds 1 row of 5 and receives the other 6: 30 floats.
      {"1d_S0_to_R", g75, f32, m4, {S(0)}, {R}, {Op::kAllGather}, 120},
      // Rank 3 holds no column and receives all 5 x 7.
      {"1d_S1_to_R", g75, f32, m4, {S(1)}, {R}, {Op::kAllGather}, 140},
      // 35 floats = 140 B; 2 * 3 / 4 of it = 210.
      {"1d_P_to_R", g75, f32, m4, {P()}, {R}, {Op::kAllReduce}, 210},
      // Own chunk after: at most 2 rows x 5 = 40 B; three peers send it.
      {"1d_P_to_S0", g75, f32, m4, {P()}, {S(0)}, {Op::kReduceScatter}, 120},
      // Straight to S(1) the own chunk is 7 rows x 2 cols = 56 B, three
      // times (168 B): 5 columns chunk unevenly (2, 2, 1, 0). Reducing onto
      // the rows (2, 2, 2, 1: 3 x 40 B) and then swapping (40 B) is cheaper.
      {"1d_Pavg_to_S1",
       g75,
       f32,
       m4,
       {P(ReduceOp::kAvg)},
       {S(1)},
       {Op::kReduceScatter, Op::kAllToAll},
       160},
      // Evenly, the single reduce_scatter: own chunk 8 rows x 2 cols, thrice.
      {"1d_Pavg_to_S1_even",
       {8, 8},
       f32,
       m4,
       {P(ReduceOp::kAvg)},
       {S(1)},
       {Op::kReduceScatter},
       3 * 8 * 2 * 4},
      // New shard 7 x c_r, old 2/2/2/1 rows x 5: ranks 0, 1 miss 14 - 4.
      {"1d_S0_to_S1", g75, f32, m4, {S(0)}, {S(1)}, {Op::kAllToAll}, 40},
      // New shard r_r x 5, old 7 x c_r: rank 2 misses 10 - 2 = 8 floats.
      {"1d_S1_to_S0", g75, f32, m4, {S(1)}, {S(0)}, {Op::kAllToAll}, 32},
      {"1d_R_to_S0", g75, f32, m4, {R}, {S(0)}, {Op::kLocalSlice}, 0},
      {"1d_R_to_P", g75, f32, m4, {R}, {P(ReduceOp::kMax)}, {Op::kLocalPartial}, 0},
      // Shard -> Partial goes through Replicate.
      {"1d_S0_to_P", g75, f32, m4, {S(0)}, {P()}, {Op::kAllGather, Op::kLocalPartial}, 120},
      // Partial(sum) -> Partial(max) too.
      {"1d_Psum_to_Pmax",
       g75,
       f32,
       m4,
       {P()},
       {P(ReduceOp::kMax)},
       {Op::kAllReduce, Op::kLocalPartial},
       210},
      // Fewer elements than ranks: 1, 1, 1, 0 doubles; rank 3 receives 3.
      {"1d_small_S0_to_R", {3}, DType::kFloat64, m4, {S(0)}, {R}, {Op::kAllGather}, 24},
      // A mesh dim of 1: nothing moves, but the step is still there.
      {"1d_size1_S0_to_R", {6}, f32, {1}, {S(0)}, {R}, {Op::kAllGather}, 0},
      // Nothing to do.
      {"1d_same", g75, f32, m4, {S(1)}, {S(1)}, {}, 0},

      // Mesh dim 0 of (2, 3): rank with 2 rows receives 3 x 7 floats.
      {"2d_dim0_S0_to_R", g57, f32, m23, {S(0), R}, {R, R}, {Op::kAllGather}, 84},
      // Mesh dim 1 inside row block 0 (3 rows): col 6 receives 3 x 6 floats.
      {"2d_dim1_S1_to_R", g57, f32, m23, {S(0), S(1)}, {S(0), R}, {Op::kAllGather}, 72},
      // Mesh dim 0 gathers cols (4 | 3) of 2-row blocks while dim 1 shards
      // rows: (1, 0) receives 2 x 4 floats.
      {"2d_dim0_S1_to_R_under_S0", g57, f32, m23, {S(1), S(0)}, {R, S(0)}, {Op::kAllGather}, 32},
      // Local 5 x 3 = 60 B; 2 * 1 / 2 of it.
      {"2d_dim0_P_to_R", g57, f32, m23, {P(), S(1)}, {R, S(1)}, {Op::kAllReduce}, 60},
      // Own chunk 3 rows x 3 cols = 36 B, twice.
      {"2d_dim1_P_to_S1", g57, f32, m23, {S(0), P()}, {S(0), S(1)}, {Op::kReduceScatter}, 72},
      // Within row block 0: new row 2 (7) minus old col 6 overlap (1).
      {"2d_dim1_S1_to_S0", g57, f32, m23, {S(0), S(1)}, {S(0), S(0)}, {Op::kAllToAll}, 24},
      // Dim 0: rank 1's new 5 x 3 minus old rows 3-4 x cols 4-6 (6): 9.
      {"2d_dim0_S0_to_S1", g57, f32, m23, {S(0), R}, {S(1), R}, {Op::kAllToAll}, 36},
      {"2d_dim0_R_to_S1", g57, f32, m23, {R, R}, {S(1), R}, {Op::kLocalSlice}, 0},
      {"2d_dim1_R_to_S0_nested", g57, f32, m23, {S(0), R}, {S(0), S(0)}, {Op::kLocalSlice}, 0},
      {"2d_dim0_R_to_P", g57, f32, m23, {R, S(0)}, {P(), S(0)}, {Op::kLocalPartial}, 0},
  };
}

TEST(RedistributePlanTest, SingleDimTransitionsHaveTheTableOpAndExactBytes) {
  for (const Case& c : HandCases()) {
    SCOPED_TRACE(c.name);
    const RedistributePlan plan = MustPlan(c.global, c.dtype, c.mesh, c.src, c.dst);
    std::vector<RedistributeOp> ops;
    for (const RedistributeStep& step : plan.steps) ops.push_back(step.op);
    EXPECT_EQ(ops, c.ops) << plan.ToString();
    EXPECT_EQ(plan.bytes_per_rank, c.bytes) << plan.ToString();
    EXPECT_EQ(plan.src, c.src);
    EXPECT_EQ(plan.dst, c.dst);
    CheckPlan(plan, c.global, c.dtype, c.mesh);
  }
}

TEST(RedistributePlanTest, ShardToShardIsOneAllToAllNeverAGather) {
  for (const Shape& mesh : {Shape{2}, Shape{4}, Shape{3}}) {
    for (const Shape& global : {Shape{8, 8}, Shape{7, 5}, Shape{1, 9}, Shape{0, 3}}) {
      const RedistributePlan plan = MustPlan(global, DType::kFloat32, mesh, {S(0)}, {S(1)});
      ASSERT_EQ(plan.steps.size(), 1u) << plan.ToString();
      EXPECT_EQ(plan.steps[0].op, RedistributeOp::kAllToAll);
    }
  }
  // [8, 8] on 4: each rank keeps 2 x 2 of its new 8 x 2 and receives 12
  // floats; a gather would receive 48.
  EXPECT_EQ(MustPlan({8, 8}, DType::kFloat32, {4}, {S(0)}, {S(1)}).bytes_per_rank, 48);
  const RedistributePlan two_d = MustPlan({8, 8}, DType::kFloat32, {2, 2}, {R, S(0)}, {R, S(1)});
  ASSERT_EQ(two_d.steps.size(), 1u);
  EXPECT_EQ(two_d.steps[0].op, RedistributeOp::kAllToAll);
  EXPECT_EQ(two_d.steps[0].mesh_dim, 1);
}

TEST(RedistributePlanTest, ReplicateToShardOrPartialIsFree) {
  for (const Placements& dst : {Placements{S(0), S(1)}, Placements{S(1), S(1)},
                                Placements{P(), S(0)}, Placements{P(ReduceOp::kAvg), P()}}) {
    const RedistributePlan plan = MustPlan({9, 4}, DType::kFloat32, {2, 3}, {R, R}, dst);
    EXPECT_EQ(plan.bytes_per_rank, 0) << PlacementsToString(dst);
    EXPECT_EQ(plan.steps.size(), 2u);
    for (const RedistributeStep& step : plan.steps) {
      EXPECT_TRUE(step.op == RedistributeOp::kLocalSlice ||
                  step.op == RedistributeOp::kLocalPartial);
    }
    CheckPlan(plan, {9, 4}, DType::kFloat32, {2, 3});
  }
}

TEST(RedistributePlanTest, NestingForcesADetour) {
  // [S0, S0] -> [R, S0]: mesh dim 0 cannot gather while dim 1 shards dim 0
  // inside its chunks, so dim 1 gathers first, dim 0 gathers, dim 1 slices.
  const RedistributePlan plan = MustPlan({5}, DType::kFloat32, {2, 2}, {S(0), S(0)}, {R, S(0)});
  CheckPlan(plan, {5}, DType::kFloat32, {2, 2});
  ASSERT_EQ(plan.steps.size(), 3u) << plan.ToString();
  EXPECT_EQ(plan.steps[0].mesh_dim, 1);
  EXPECT_EQ(plan.steps[0].op, RedistributeOp::kAllGather);
  EXPECT_EQ(plan.steps[1].mesh_dim, 0);
  EXPECT_EQ(plan.steps[1].op, RedistributeOp::kAllGather);
  EXPECT_EQ(plan.steps[2].mesh_dim, 1);
  EXPECT_EQ(plan.steps[2].op, RedistributeOp::kLocalSlice);
  // Dim 1 gathers [2 | 1] and [1 | 1]: 2 floats at most; dim 0 then
  // gathers [3 | 2]: 3 floats.
  EXPECT_EQ(plan.bytes_per_rank, 4 * (2 + 3));

  // And the way back: slicing dim 0 under a sharded dim 1 is no local op.
  const RedistributePlan back = MustPlan({5}, DType::kFloat32, {2, 2}, {R, S(0)}, {S(0), S(0)});
  CheckPlan(back, {5}, DType::kFloat32, {2, 2});
  EXPECT_GE(back.steps.size(), 3u);

  // Swapping nested shards: each direct step is blocked at some point.
  for (const auto& [src, dst] :
       std::vector<std::pair<Placements, Placements>>{{{S(0), S(1)}, {S(1), S(0)}},
                                                      {{S(0), S(0)}, {S(1), S(1)}},
                                                      {{S(0), S(0), S(0)}, {R, R, S(0)}},
                                                      {{P(), S(0)}, {S(0), S(0)}},
                                                      {{S(1), S(0)}, {S(0), P()}}}) {
    const Shape mesh = src.size() == 3 ? Shape{2, 2, 2} : Shape{2, 3};
    SCOPED_TRACE(PlacementsToString(src) + " -> " + PlacementsToString(dst));
    CheckPlan(MustPlan({7, 6}, DType::kFloat32, mesh, src, dst), {7, 6}, DType::kFloat32, mesh);
  }
  // P -> S(0) on mesh dim 0 while dim 1 shards dim 0 would be a
  // reduce_scatter under a nested shard: it must not be the first step.
  const RedistributePlan rs = MustPlan({8}, DType::kFloat32, {2, 2}, {P(), S(0)}, {S(0), S(0)});
  ASSERT_FALSE(rs.steps.empty());
  EXPECT_FALSE(rs.steps[0].mesh_dim == 0 && rs.steps[0].op == RedistributeOp::kReduceScatter);
}

// ---- Random cases: never worse than any one-dim-at-a-time order, and equal
// ---- to an independent shortest path --------------------------------------

// The cheapest total over every order of the mesh dims in which each dim
// moves straight to its target (through Replicate where the table demands),
// or nullopt when nesting blocks every order.
std::optional<int64_t> BestDimOrder(const Shape& global, DType dtype, const Shape& mesh,
                                    const Placements& src, const Placements& dst) {
  std::vector<int> dims;
  for (size_t i = 0; i < mesh.size(); ++i) {
    if (src[i] != dst[i]) dims.push_back(static_cast<int>(i));
  }
  std::optional<int64_t> best;
  do {
    Placements state = src;
    int64_t total = 0;
    bool valid = true;
    for (int i : dims) {
      std::vector<Placement> hops;
      if (KindOf(state[i], dst[i]).has_value()) {
        hops = {dst[i]};
      } else {
        hops = {R, dst[i]};
      }
      for (const Placement& to : hops) {
        if (!StepIsValid(state, i, to)) {
          valid = false;
          break;
        }
        total += ReferenceBytes(global, dtype, mesh, state, i, to);
        state[i] = to;
      }
      if (!valid) break;
    }
    if (valid && (!best.has_value() || total < *best)) best = total;
  } while (std::next_permutation(dims.begin(), dims.end()));
  return best;
}

// Bellman-Ford over every state where each mesh dim holds its src, dst or
// Replicate, with the reference costs.
int64_t ShortestPath(const Shape& global, DType dtype, const Shape& mesh, const Placements& src,
                     const Placements& dst) {
  std::vector<Placements> states = {Placements()};
  for (size_t i = 0; i < mesh.size(); ++i) {
    std::vector<Placements> grown;
    for (const Placements& s : states) {
      for (const Placement& p : {src[i], dst[i], R}) {
        Placements t = s;
        t.push_back(p);
        if (std::find(grown.begin(), grown.end(), t) == grown.end()) grown.push_back(t);
      }
    }
    states = grown;
  }
  struct Edge {
    std::string from;
    std::string to;
    int64_t cost;
  };
  std::vector<Edge> edges;
  for (const Placements& s : states) {
    for (size_t i = 0; i < mesh.size(); ++i) {
      for (const Placement& to : {dst[i], R}) {
        if (!StepIsValid(s, static_cast<int>(i), to)) continue;
        Placements t = s;
        t[i] = to;
        edges.push_back({PlacementsToString(s), PlacementsToString(t),
                         ReferenceBytes(global, dtype, mesh, s, static_cast<int>(i), to)});
      }
    }
  }
  const int64_t inf = std::numeric_limits<int64_t>::max();
  std::map<std::string, int64_t> dist;
  for (const Placements& s : states) dist[PlacementsToString(s)] = inf;
  dist[PlacementsToString(src)] = 0;
  for (size_t round = 0; round < states.size(); ++round) {
    for (const Edge& e : edges) {
      if (dist[e.from] == inf) continue;
      dist[e.to] = std::min(dist[e.to], dist[e.from] + e.cost);
    }
  }
  return dist[PlacementsToString(dst)];
}

// Dijkstra over every state a search could reach: each mesh dim holds any
// Shard(d) of the tensor's dims, Replicate, or a Partial of an op that src
// or dst uses, and any table step is an edge. Written independently of the
// planner (which searches the same space on meshes this small), so the two
// must agree on the cheapest total.
int64_t UnrestrictedShortestPath(const Shape& global, DType dtype, const Shape& mesh,
                                 const Placements& src, const Placements& dst) {
  std::vector<Placement> choices = {R};
  for (size_t d = 0; d < global.size(); ++d) choices.push_back(S(static_cast<int>(d)));
  for (const Placements* side : {&src, &dst}) {
    for (const Placement& p : *side) {
      if (p.is_partial() && std::find(choices.begin(), choices.end(), p) == choices.end()) {
        choices.push_back(p);
      }
    }
  }
  using Entry = std::pair<int64_t, Placements>;
  auto later = [](const Entry& a, const Entry& b) { return a.first > b.first; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> frontier(later);
  std::map<std::string, int64_t> settled;
  frontier.push({0, src});
  while (!frontier.empty()) {
    auto [cost, state] = frontier.top();
    frontier.pop();
    if (!settled.emplace(PlacementsToString(state), cost).second) continue;
    if (state == dst) return cost;
    for (size_t i = 0; i < mesh.size(); ++i) {
      for (const Placement& to : choices) {
        if (to == state[i] || !StepIsValid(state, static_cast<int>(i), to)) continue;
        Placements next = state;
        next[i] = to;
        if (settled.count(PlacementsToString(next)) > 0) continue;
        frontier.push(
            {cost + ReferenceBytes(global, dtype, mesh, state, static_cast<int>(i), to), next});
      }
    }
  }
  return std::numeric_limits<int64_t>::max();
}

TEST(RedistributePlanTest, RandomPlansAreValidOptimalAndBeatEveryDimOrder) {
  const uint32_t seed = 61106;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int64_t sizes[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 13};
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt8};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  int with_order = 0;
  int strictly_better = 0;
  const int iterations = 3000;
  for (int iteration = 0; iteration < iterations; ++iteration) {
    const int rank = uniform(1, 3);
    Shape global(rank);
    for (int64_t& g : global) g = sizes[uniform(0, 10)];
    const int ndim = uniform(1, 3);
    Shape mesh(ndim);
    for (int64_t& m : mesh) m = uniform(1, 4);
    const DType dtype = dtypes[uniform(0, 3)];
    auto random_placements = [&] {
      Placements p(ndim);
      for (Placement& x : p) {
        const int pick = uniform(0, 4);
        x = pick == 0 ? R : pick == 1 ? P(ops[uniform(0, 2)]) : S(uniform(0, rank - 1));
      }
      return p;
    };
    Placements src = random_placements();
    while (!PartialsCommute(src)) src = random_placements();
    Placements dst = random_placements();
    while (!PartialsCommute(dst)) dst = random_placements();
    SCOPED_TRACE(testing::Message()
                 << "iteration " << iteration << ": global " << testing::PrintToString(global)
                 << " mesh " << testing::PrintToString(mesh) << " " << DTypeName(dtype) << " "
                 << PlacementsToString(src) << " -> " << PlacementsToString(dst));
    const RedistributePlan plan = MustPlan(global, dtype, mesh, src, dst);
    const int64_t total = CheckPlan(plan, global, dtype, mesh);
    ASSERT_FALSE(HasFailure());
    EXPECT_LE(total, ShortestPath(global, dtype, mesh, src, dst)) << plan.ToString();
    EXPECT_EQ(total, UnrestrictedShortestPath(global, dtype, mesh, src, dst)) << plan.ToString();
    const std::optional<int64_t> order = BestDimOrder(global, dtype, mesh, src, dst);
    if (order.has_value()) {
      ++with_order;
      EXPECT_LE(total, *order) << plan.ToString();
      strictly_better += total < *order ? 1 : 0;
    }
    if (src == dst) {
      EXPECT_TRUE(plan.steps.empty());
    }
    ASSERT_FALSE(HasFailure());
  }
  std::printf("%d/%d cases had a valid dim order; the plan beat the best one in %d\n", with_order,
              iterations, strictly_better);
  // The comparison must actually have happened in most cases.
  EXPECT_GT(with_order, iterations / 2);
}

// Partial on two mesh dims: reduce-scatter over one, all-reduce the half
// over the other, all-gather back (the hierarchical all-reduce), instead of
// two full all-reduces.
TEST(RedistributePlanTest, PartialOnTwoDimsIsTheHierarchicalAllReduce) {
  const RedistributePlan plan = MustPlan({1024}, DType::kFloat32, {2, 4}, {P(), P()}, {R, R});
  std::vector<RedistributeOp> ops;
  for (const RedistributeStep& step : plan.steps) ops.push_back(step.op);
  EXPECT_THAT(ops, ::testing::ElementsAre(RedistributeOp::kReduceScatter,
                                          RedistributeOp::kAllReduce, RedistributeOp::kAllGather))
      << plan.ToString();
  // Two all-reduces: 2 (1/2) 4 KiB + 2 (3/4) 4 KiB = 10 KiB. Reduce-scatter
  // over the 4-way dim (3 x 1 KiB), all-reduce 1 KiB over the 2-way dim
  // (1 KiB), all-gather over the 4-way dim (3 KiB): 7 KiB.
  EXPECT_EQ(plan.bytes_per_rank, 7 * 1024) << plan.ToString();
  CheckPlan(plan, {1024}, DType::kFloat32, {2, 4});
}

// On a large mesh the search keeps each mesh dim to its src, dst or
// Replicate (planning time; redistribute_plan.cc). (The reference checks of
// the random test walk every rank per step, too slow for 4096 ranks; the
// narrow space itself is what the planner searched before, checked there.)
TEST(RedistributePlanTest, LargeMeshesSearchTheNarrowSpace) {
  const Shape mesh = {8, 8, 8, 8};  // 4096 ranks.
  const Shape global = {64, 48, 32, 16};
  for (const auto& [src, dst] : std::vector<std::pair<Placements, Placements>>{
           {{S(0), S(1), S(2), S(3)}, {S(3), S(2), S(1), S(0)}},
           {{P(), S(0), S(1), R}, {R, S(1), S(0), S(2)}},
           {{S(0), S(0), S(0), S(0)}, {R, R, R, R}}}) {
    SCOPED_TRACE(PlacementsToString(src) + " -> " + PlacementsToString(dst));
    const RedistributePlan plan = MustPlan(global, DType::kFloat32, mesh, src, dst);
    ASSERT_FALSE(plan.steps.empty());
    Placements state = src;
    for (const RedistributeStep& step : plan.steps) {
      EXPECT_EQ(step.before, state) << plan.ToString();
      EXPECT_TRUE(StepIsValid(state, step.mesh_dim, step.to)) << plan.ToString();
      state = step.after;
      // Narrow space: every dim is at its src, dst or Replicate throughout.
      for (size_t i = 0; i < mesh.size(); ++i) {
        EXPECT_TRUE(state[i] == src[i] || state[i] == dst[i] || state[i] == R) << plan.ToString();
      }
    }
    EXPECT_EQ(state, dst) << plan.ToString();
  }
}

TEST(RedistributePlanTest, TiesPreferFewerStepsThenLowerMeshDims) {
  // Two independent free slices: dim 0 first.
  const RedistributePlan plan = MustPlan({4, 4}, DType::kFloat32, {2, 2}, {R, R}, {S(0), S(1)});
  ASSERT_EQ(plan.steps.size(), 2u);
  EXPECT_EQ(plan.steps[0].mesh_dim, 0);
  EXPECT_EQ(plan.steps[1].mesh_dim, 1);
  // Nested shards of one dim: nesting makes the inner mesh dim go first.
  const RedistributePlan gather = MustPlan({4}, DType::kFloat32, {2, 2}, {S(0), S(0)}, {R, R});
  ASSERT_EQ(gather.steps.size(), 2u) << gather.ToString();
  EXPECT_EQ(gather.steps[0].mesh_dim, 1);
  // Two all-gathers of the same bytes and steps: the fewer local copies go
  // first (mesh dim 1's column blocks unpack a quarter of the tensor).
  const RedistributePlan two = MustPlan({4, 4}, DType::kFloat32, {2, 2}, {S(0), S(1)}, {R, R});
  ASSERT_EQ(two.steps.size(), 2u) << two.ToString();
  EXPECT_EQ(two.steps[0].mesh_dim, 1) << two.ToString();
  // Deterministic: the same inputs give the same plan.
  EXPECT_EQ(MustPlan({4, 4}, DType::kFloat32, {2, 2}, {S(0), S(1)}, {R, R}).ToString(),
            two.ToString());
}

TEST(RedistributePlanTest, TiesThenPreferFewerLocalCopies) {
  // Both orders receive the same bytes in two all_gathers. Mesh dim 0 first
  // would leave mesh dim 1's column blocks to unpack into the full [8, 8]
  // (32 elements); mesh dim 1 first unpacks them into [4, 8] (16), then
  // mesh dim 0's row blocks land contiguously.
  const RedistributePlan plan = MustPlan({8, 8}, DType::kFloat32, {2, 2}, {S(0), S(1)}, {R, R});
  ASSERT_EQ(plan.steps.size(), 2u) << plan.ToString();
  EXPECT_EQ(plan.steps[0].mesh_dim, 1) << plan.ToString();
  EXPECT_EQ(plan.steps[1].mesh_dim, 0) << plan.ToString();
  EXPECT_EQ(plan.bytes_per_rank, (16 + 32) * 4);
  // Sharding the same way the other way round: [S(1), S(0)] has mesh dim 0
  // on the columns, so mesh dim 0 goes first.
  const RedistributePlan swapped = MustPlan({8, 8}, DType::kFloat32, {2, 2}, {S(1), S(0)}, {R, R});
  ASSERT_EQ(swapped.steps.size(), 2u) << swapped.ToString();
  EXPECT_EQ(swapped.steps[0].mesh_dim, 0) << swapped.ToString();
  // Copies only break ties: a cheaper order in bytes still wins (the
  // example's [S(0), R] -> [R, S(1)] slices first).
  const RedistributePlan example = MustPlan({8, 6}, DType::kFloat32, {2, 2}, {S(0), R}, {R, S(1)});
  ASSERT_EQ(example.steps.size(), 2u) << example.ToString();
  EXPECT_EQ(example.steps[0].op, RedistributeOp::kLocalSlice);
  EXPECT_EQ(example.bytes_per_rank, 48);
}

TEST(RedistributePlanTest, Errors) {
  auto expect_invalid = [](const absl::StatusOr<RedistributePlan>& plan,
                           const std::string& substring) {
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(substring));
  };
  const DType f32 = DType::kFloat32;
  expect_invalid(PlanRedistribute(Shape{4}, f32, Shape{2, 2}, {S(0)}, {R, R}), "source");
  expect_invalid(PlanRedistribute(Shape{4}, f32, Shape{2, 2}, {R, R}, {S(0), S(1)}), "target");
  expect_invalid(PlanRedistribute(Shape{4}, f32, Shape{2, 2}, {R, R}, {S(0), S(1)}), "mesh dim 1");
  expect_invalid(PlanRedistribute(Shape{-1}, f32, Shape{2}, {R}, {S(0)}), "negative size -1");
  expect_invalid(PlanRedistribute(Shape{4}, f32, Shape{0}, {R}, {S(0)}), "size 0");
  expect_invalid(PlanRedistribute(Shape{4}, f32, Shape{2}, {P(static_cast<ReduceOp>(9))}, {R}),
                 "unknown reduce op");
  const int64_t big = int64_t{1} << 40;
  expect_invalid(PlanRedistribute(Shape{big, big}, f32, Shape{2}, {S(0)}, {R}), "too large");
  // An empty tensor with huge other dims is fine and free.
  absl::StatusOr<RedistributePlan> empty =
      PlanRedistribute(Shape{big, 0, big}, f32, Shape{2}, {S(0)}, {R});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->bytes_per_rank, 0);
}

TEST(RedistributePlanTest, ToStringAndOpNames) {
  EXPECT_STREQ(RedistributeOpName(RedistributeOp::kAllGather), "all_gather");
  EXPECT_STREQ(RedistributeOpName(RedistributeOp::kAllReduce), "all_reduce");
  EXPECT_STREQ(RedistributeOpName(RedistributeOp::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(RedistributeOpName(RedistributeOp::kAllToAll), "all_to_all");
  EXPECT_STREQ(RedistributeOpName(RedistributeOp::kLocalSlice), "local_slice");
  EXPECT_STREQ(RedistributeOpName(RedistributeOp::kLocalPartial), "local_partial");

  EXPECT_EQ(MustPlan({7, 5}, DType::kFloat32, {4}, {S(0)}, {R}).ToString(),
            "mesh dim 0: S(0) -> R  all_gather  120 B/rank");
  EXPECT_EQ(MustPlan({7, 5}, DType::kFloat32, {4}, {S(0)}, {P()}).ToString(),
            "mesh dim 0: S(0) -> R  all_gather  120 B/rank\n"
            "mesh dim 0: R -> P(sum)  local_partial  0 B/rank");
  EXPECT_EQ(MustPlan({7, 5}, DType::kFloat32, {4}, {S(0)}, {S(0)}).ToString(), "");
}

TEST(RedistributePlanCacheTest, HitsMissesAndSharing) {
  RedistributePlanCache cache;
  const Shape global = {7, 5};
  const Shape mesh = {4};
  auto first = cache.Get(global, DType::kFloat32, mesh, {S(0)}, {R});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(cache.hits(), 0);
  EXPECT_EQ(cache.misses(), 1);
  auto second = cache.Get(global, DType::kFloat32, mesh, {S(0)}, {R});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->get(), first->get());
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ((*second)->bytes_per_rank, 120);

  // Every input is part of the key.
  ASSERT_TRUE(cache.Get(global, DType::kFloat64, mesh, {S(0)}, {R}).ok());
  ASSERT_TRUE(cache.Get({7, 6}, DType::kFloat32, mesh, {S(0)}, {R}).ok());
  ASSERT_TRUE(cache.Get(global, DType::kFloat32, {2}, {S(0)}, {R}).ok());
  ASSERT_TRUE(cache.Get(global, DType::kFloat32, mesh, {S(1)}, {R}).ok());
  ASSERT_TRUE(cache.Get(global, DType::kFloat32, mesh, {S(0)}, {P()}).ok());
  auto avg = cache.Get(global, DType::kFloat32, mesh, {S(0)}, {P(ReduceOp::kAvg)});
  ASSERT_TRUE(avg.ok());
  EXPECT_EQ((*avg)->dst[0], P(ReduceOp::kAvg));
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 7);
  EXPECT_EQ((*cache.Get(global, DType::kFloat64, mesh, {S(0)}, {R}))->bytes_per_rank, 240);
  EXPECT_EQ(cache.hits(), 2);

  // Errors are returned, not cached.
  for (int i = 0; i < 2; ++i) {
    auto bad = cache.Get(global, DType::kFloat32, mesh, {S(2)}, {R});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(cache.hits(), 2);
  EXPECT_EQ(cache.misses(), 9);
}

TEST(RedistributePlanCacheTest, ConcurrentGetsShareOnePlan) {
  RedistributePlanCache cache;
  constexpr int kThreads = 8;
  std::vector<std::shared_ptr<const RedistributePlan>> keep(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto plan = cache.Get({9, 9}, DType::kFloat32, {2, 2}, {S(0), S(1)}, {S(1), R});
        if (!plan.ok()) return;
        keep[t] = *plan;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_NE(keep[t], nullptr);
    EXPECT_EQ(keep[t].get(), keep[0].get());
  }
  EXPECT_EQ(cache.hits() + cache.misses(), kThreads * 50);
  EXPECT_GE(cache.misses(), 1);
}

}  // namespace redistribute_plan_test
}  // namespace mesh

namespace mesh {
namespace redistribute_plan_test {

// A 5-dim mesh of 1024 ranks: 3^5 states, each step costed over the ranks
// whose layouts it can tell apart. Checks the plan, not the time.
TEST(RedistributePlanTest, FiveDimMesh) {
  const Shape global = {64, 48, 30};
  const Shape mesh = {4, 4, 4, 4, 4};
  const Placements src = {S(0), S(1), P(), S(0), R};
  const Placements dst = {R, S(0), S(1), P(ReduceOp::kMax), S(2)};
  const RedistributePlan plan = MustPlan(global, DType::kBFloat16, mesh, src, dst);
  std::printf("%s\n", plan.ToString().c_str());
  EXPECT_EQ(plan.steps.empty(), false);
  Placements state = src;
  for (const RedistributeStep& step : plan.steps) {
    EXPECT_TRUE(StepIsValid(state, step.mesh_dim, step.to)) << plan.ToString();
    state[step.mesh_dim] = step.to;
  }
  EXPECT_EQ(state, dst);
}

}  // namespace redistribute_plan_test
}  // namespace mesh
