#include "coordinator/rank_placement.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace rank_placement_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

NodeView Node(std::string name, int slots, std::vector<int> gpus = {}) {
  NodeView node;
  node.address = "10.0.0." + name;
  node.name = std::move(name);
  node.slots = slots;
  node.gpus = std::move(gpus);
  return node;
}

// `count` nodes "node-a", "node-b", ... with `slots` slots and GPUs 0..gpus-1.
std::vector<NodeView> Nodes(int count, int slots, int gpus = 0) {
  std::vector<NodeView> nodes;
  for (int i = 0; i < count; ++i) {
    std::vector<int> indices;
    for (int g = 0; g < gpus; ++g) indices.push_back(g);
    nodes.push_back(Node(std::string("node-") + static_cast<char>('a' + i), slots, indices));
  }
  return nodes;
}

JobRequest Job(int nodes, int nproc, std::vector<int64_t> shape = {},
               std::vector<std::string> names = {}, int gpus_per_proc = 0) {
  JobRequest job;
  job.job_id = "j1";
  job.nodes_min = nodes;
  job.nproc_per_node = nproc;
  job.gpus_per_proc = gpus_per_proc;
  job.mesh_shape = std::move(shape);
  job.mesh_dim_names = std::move(names);
  return job;
}

// The groups along `dim` of a row-major mesh of `shape`, computed here from
// coordinates (independently of placement.cc): ranks that agree on every
// other coordinate, in ascending order.
std::vector<std::vector<int>> Groups(const std::vector<int64_t>& shape, int dim) {
  int world = 1;
  for (int64_t size : shape) world *= static_cast<int>(size);
  std::map<std::vector<int64_t>, std::vector<int>> groups;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<int64_t> coord(shape.size());
    int rest = rank;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      coord[d] = rest % shape[d];
      rest /= static_cast<int>(shape[d]);
    }
    coord[dim] = -1;
    groups[coord].push_back(rank);
  }
  std::vector<std::vector<int>> out;
  for (auto& [key, ranks] : groups) out.push_back(ranks);
  std::sort(out.begin(), out.end());
  return out;
}

std::set<std::string> NodesOf(const Placement& placement, const std::vector<int>& group) {
  std::set<std::string> nodes;
  for (int rank : group) nodes.insert(placement.ranks[rank].node);
  return nodes;
}

TEST(PlacementTest, RanksAreContiguousPerNodeAndNodesAreInNameOrder) {
  std::vector<NodeView> nodes = {Node("node-c", 2), Node("node-a", 2), Node("node-b", 3)};
  absl::StatusOr<Placement> placement = PlaceJob(Job(3, 2), nodes);
  ASSERT_THAT(placement, IsOk());
  EXPECT_THAT(placement->nodes, ElementsAre("node-a", "node-b", "node-c"));
  EXPECT_THAT(placement->node_addresses,
              ElementsAre("10.0.0.node-a", "10.0.0.node-b", "10.0.0.node-c"));
  EXPECT_EQ(placement->world_size, 6);
  ASSERT_EQ(placement->ranks.size(), 6u);
  const char* want_node[] = {"node-a", "node-a", "node-b", "node-b", "node-c", "node-c"};
  for (int r = 0; r < 6; ++r) {
    const RankPlacement& rank = placement->ranks[r];
    EXPECT_EQ(rank.rank, r);
    EXPECT_EQ(rank.node, want_node[r]) << "rank " << r;
    EXPECT_EQ(rank.node_rank, r / 2);
    EXPECT_EQ(rank.local_rank, r % 2);
    EXPECT_EQ(rank.local_world_size, 2);
    EXPECT_THAT(rank.gpus, IsEmpty());
  }
  // No mesh asked for: 1-D over the world, which spans whole nodes.
  EXPECT_THAT(placement->mesh_shape, ElementsAre(6));
  EXPECT_THAT(placement->mesh_dim_names, ElementsAre("dim0"));
  EXPECT_EQ(placement->node_local_dims, 0);
  EXPECT_THAT(placement->topology_warning, IsEmpty());
}

TEST(PlacementTest, Mesh2x4On2NodesKeepsTpOnANodeAndDpAcross) {
  absl::StatusOr<Placement> placement = PlaceJob(Job(2, 4, {2, 4}, {"dp", "tp"}), Nodes(2, 4));
  ASSERT_THAT(placement, IsOk());
  // tp (innermost) groups {0..3} and {4..7}: one node each.
  const std::vector<std::vector<int>> tp = Groups({2, 4}, 1);
  ASSERT_THAT(tp, ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(4, 5, 6, 7)));
  EXPECT_EQ(NodesOf(*placement, tp[0]), std::set<std::string>{"node-a"});
  EXPECT_EQ(NodesOf(*placement, tp[1]), std::set<std::string>{"node-b"});
  // dp groups {0,4} ... {3,7}: across both nodes.
  const std::vector<std::vector<int>> dp = Groups({2, 4}, 0);
  ASSERT_THAT(dp[0], ElementsAre(0, 4));
  for (const std::vector<int>& group : dp) {
    EXPECT_EQ(NodesOf(*placement, group), (std::set<std::string>{"node-a", "node-b"}));
  }
  EXPECT_EQ(placement->node_local_dims, 1);
  EXPECT_THAT(placement->topology_warning, IsEmpty());
  EXPECT_THAT(placement->mesh_dim_names, ElementsAre("dp", "tp"));
}

TEST(PlacementTest, Mesh4x2On2NodesKeepsInnermostOnANode) {
  absl::StatusOr<Placement> placement = PlaceJob(Job(2, 4, {4, 2}), Nodes(2, 4));
  ASSERT_THAT(placement, IsOk());
  for (const std::vector<int>& group : Groups({4, 2}, 1)) {
    EXPECT_EQ(NodesOf(*placement, group).size(), 1u) << "group starting " << group[0];
  }
  // The outer dim of 4 ({0,2,4,6}, ...) has to cross the nodes.
  for (const std::vector<int>& group : Groups({4, 2}, 0)) {
    EXPECT_EQ(NodesOf(*placement, group).size(), 2u) << "group starting " << group[0];
  }
  EXPECT_EQ(placement->node_local_dims, 1);
  EXPECT_THAT(placement->topology_warning, IsEmpty());
}

TEST(PlacementTest, Mesh2x2x2On2NodesKeepsTwoInnerDimsOnANode) {
  absl::StatusOr<Placement> placement = PlaceJob(Job(2, 4, {2, 2, 2}), Nodes(2, 4));
  ASSERT_THAT(placement, IsOk());
  for (int dim : {1, 2}) {
    for (const std::vector<int>& group : Groups({2, 2, 2}, dim)) {
      EXPECT_EQ(NodesOf(*placement, group).size(), 1u) << "dim " << dim;
    }
  }
  for (const std::vector<int>& group : Groups({2, 2, 2}, 0)) {
    EXPECT_EQ(NodesOf(*placement, group).size(), 2u);
  }
  EXPECT_EQ(placement->node_local_dims, 2);
  EXPECT_THAT(placement->topology_warning, IsEmpty());
}

TEST(PlacementTest, InnermostDimLargerThanANodeSpansWholeConsecutiveNodes) {
  // tp = 8 over nodes of 4: {0..7} on node-a + node-b, {8..15} on node-c +
  // node-d; no node holds parts of two groups, so there is nothing to warn.
  absl::StatusOr<Placement> placement = PlaceJob(Job(4, 4, {2, 8}, {"dp", "tp"}), Nodes(4, 4));
  ASSERT_THAT(placement, IsOk());
  const std::vector<std::vector<int>> tp = Groups({2, 8}, 1);
  EXPECT_EQ(NodesOf(*placement, tp[0]), (std::set<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(NodesOf(*placement, tp[1]), (std::set<std::string>{"node-c", "node-d"}));
  EXPECT_EQ(placement->node_local_dims, 0);
  EXPECT_THAT(placement->topology_warning, IsEmpty());
}

TEST(PlacementTest, InnermostDimThatDoesNotDivideANodeWarnsAndStaysContiguous) {
  // tp = 3 over nodes of 4: {0,1,2} fits node-a, {3,4,5} straddles a and b.
  absl::StatusOr<Placement> placement = PlaceJob(Job(3, 4, {4, 3}, {"dp", "tp"}), Nodes(3, 4));
  ASSERT_THAT(placement, IsOk());
  for (int r = 0; r < 12; ++r) EXPECT_EQ(placement->ranks[r].node_rank, r / 4);
  EXPECT_EQ(placement->node_local_dims, 0);
  EXPECT_THAT(placement->topology_warning, HasSubstr("mesh dim 'tp' (size 3)"));
  EXPECT_THAT(placement->topology_warning, HasSubstr("nproc_per_node 4"));
  EXPECT_THAT(placement->topology_warning, HasSubstr("ranks 3..5 span nodes node-a..node-b"));
}

TEST(PlacementTest, GpusAreConsecutiveFreeIndicesByLocalRank) {
  // Free GPUs listed out of order and with gaps (1 and 4 are taken).
  std::vector<NodeView> nodes = {Node("b", 2, {7, 3, 0, 5, 2, 6}), Node("a", 2, {0, 1, 2, 3})};
  absl::StatusOr<Placement> placement = PlaceJob(Job(2, 2, {}, {}, 2), nodes);
  ASSERT_THAT(placement, IsOk());
  EXPECT_THAT(placement->ranks[0].gpus, ElementsAre(0, 1));
  EXPECT_THAT(placement->ranks[1].gpus, ElementsAre(2, 3));
  EXPECT_THAT(placement->ranks[2].gpus, ElementsAre(0, 2));
  EXPECT_THAT(placement->ranks[3].gpus, ElementsAre(3, 5));
  EXPECT_EQ(placement->ranks[2].node, "b");
}

TEST(PlacementTest, SameInputInAnyOrderGivesTheSamePlacement) {
  std::vector<NodeView> nodes = Nodes(6, 8, 8);
  const JobRequest job = Job(6, 4, {3, 2, 4}, {"pp", "dp", "tp"}, 2);
  absl::StatusOr<Placement> first = PlaceJob(job, nodes);
  ASSERT_THAT(first, IsOk());
  std::mt19937 rng(42);
  for (int round = 0; round < 20; ++round) {
    std::shuffle(nodes.begin(), nodes.end(), rng);
    for (NodeView& node : nodes) std::shuffle(node.gpus.begin(), node.gpus.end(), rng);
    absl::StatusOr<Placement> again = PlaceJob(job, nodes);
    ASSERT_THAT(again, IsOk());
    EXPECT_EQ(*again, *first) << "round " << round;
  }
}

TEST(PlacementTest, AcceptableNodeCounts) {
  JobRequest job = Job(2, 4);
  job.nodes_max = 4;
  EXPECT_THAT(AcceptableNodeCounts(job), ElementsAre(2, 3, 4));
  job.nodes_max = 0;  // Means nodes_min.
  EXPECT_THAT(AcceptableNodeCounts(job), ElementsAre(2));
  // A mesh fixes the world: 12 ranks / 4 = 3 nodes.
  job.nodes_max = 4;
  job.mesh_shape = {3, 4};
  EXPECT_THAT(AcceptableNodeCounts(job), ElementsAre(3));
  job.nproc_per_node = 0;
  EXPECT_THAT(AcceptableNodeCounts(job), IsEmpty());
}

TEST(PlacementTest, ValidateNamesTheBadField) {
  auto expect_bad = [](JobRequest job, const char* field) {
    EXPECT_THAT(ValidateJobRequest(job), StatusIs(Code::kInvalidArgument, HasSubstr(field)))
        << field;
  };
  JobRequest job = Job(2, 4);
  ASSERT_THAT(ValidateJobRequest(job), IsOk());
  job.job_id = "";
  expect_bad(job, "job_id");
  expect_bad(Job(0, 4), "nodes_min");
  job = Job(3, 4);
  job.nodes_max = 2;
  expect_bad(job, "nodes_max");
  expect_bad(Job(1, 0), "nproc_per_node");
  expect_bad(Job(1, 1, {}, {}, -1), "gpus_per_proc");
  job = Job(1, 1);
  job.nodes_max = kMaxPlacementWorldSize;
  job.nproc_per_node = 2;
  expect_bad(job, "nodes_max");
  expect_bad(Job(2, 4, {2, 0}), "mesh_shape");
  expect_bad(Job(2, 4, {3, 3}), "mesh_shape [3, 3] has 9 ranks");
  expect_bad(Job(2, 4, {2, 4}, {"dp"}), "mesh_dim_names has 1 names for a 2-d mesh");
  expect_bad(Job(2, 4, {2, 4}, {"dp", "dp"}), "'dp' twice");
  expect_bad(Job(2, 4, {2, 4}, {"dp", ""}), "empty name");
  // Names without a shape describe the 1-D default.
  EXPECT_THAT(ValidateJobRequest(Job(2, 4, {}, {"world"})), IsOk());
}

TEST(PlacementTest, RejectsNodesThatCannotTakeTheJob) {
  EXPECT_THAT(PlaceJob(Job(2, 4), Nodes(3, 4)),
              StatusIs(Code::kInvalidArgument, HasSubstr("3 nodes given")));
  std::vector<NodeView> nodes = {Node("x", 4), Node("x", 4)};
  EXPECT_THAT(PlaceJob(Job(2, 4), nodes),
              StatusIs(Code::kInvalidArgument, HasSubstr("'x' given twice")));
  nodes = Nodes(2, 4);
  nodes[1].state = NodeState::kLost;
  EXPECT_THAT(PlaceJob(Job(2, 4), nodes), StatusIs(Code::kInvalidArgument, HasSubstr("LOST")));
  nodes = Nodes(2, 4);
  nodes[0].slots = 3;
  EXPECT_THAT(PlaceJob(Job(2, 4), nodes),
              StatusIs(Code::kInvalidArgument, HasSubstr("'node-a' has 3 slots, not 4")));
  EXPECT_THAT(PlaceJob(Job(2, 4, {}, {}, 1), Nodes(2, 4, 3)),
              StatusIs(Code::kInvalidArgument, HasSubstr("has 3 GPUs, not 4")));
  nodes = {Node("a", 1, {2, 2})};
  EXPECT_THAT(PlaceJob(Job(1, 1, {}, {}, 1), nodes),
              StatusIs(Code::kInvalidArgument, HasSubstr("GPU index twice")));
}

}  // namespace rank_placement_test
}  // namespace mesh::coordinator

namespace mesh::coordinator {
namespace rank_placement_test {

TEST(PlacementCodecTest, RoundTripsAGpuPlacement) {
  std::vector<NodeView> nodes;
  for (const char* name : {"node-b", "node-a"}) {
    NodeView node;
    node.name = name;
    node.address = std::string("10.0.0.") + name[5];
    node.slots = 4;
    node.gpus = {3, 1, 0, 2};
    nodes.push_back(node);
  }
  JobRequest job;
  job.job_id = "job-9";
  job.nodes_min = 2;
  job.nproc_per_node = 2;
  job.gpus_per_proc = 2;
  job.mesh_shape = {2, 2};
  job.mesh_dim_names = {"dp", "tp"};
  auto placement = PlaceJob(job, nodes);
  ASSERT_TRUE(placement.ok()) << placement.status();
  auto decoded = DecodePlacement(EncodePlacement(*placement));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, *placement);
}

TEST(PlacementCodecTest, MalformedBytesAreDataLoss) {
  EXPECT_EQ(DecodePlacement("not json").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodePlacement("{\"version\": 2}").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodePlacement(R"({"version":1,"job_id":"j","nodes":["a"],"node_addresses":["x"],
      "nproc_per_node":1,"world_size":1,"mesh_shape":[1],"mesh_dim_names":["w"],
      "node_local_dims":1,"topology_warning":"","ranks":[{"node_rank":4,"local_rank":0,
      "gpus":[]}]})")
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace rank_placement_test
}  // namespace mesh::coordinator
