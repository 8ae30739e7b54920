// MeshLayout: construction, validation, coordinates, groups, slicing and
// flattening, against PyTorch's DeviceMesh conventions.
#include "mesh/mesh_layout.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace mesh {
namespace mesh_layout_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Groups = std::vector<std::vector<int>>;

MeshLayout Make(std::vector<int64_t> shape, std::vector<std::string> names) {
  int64_t world = 1;
  for (int64_t s : shape) world *= s;
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::Create(std::move(shape), std::move(names), static_cast<int>(world));
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

void ExpectInvalid(const absl::StatusOr<MeshLayout>& layout, const std::string& substring) {
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument) << layout.status();
  EXPECT_THAT(std::string(layout.status().message()), HasSubstr(substring));
}

TEST(MeshLayoutTest, TwoByFourMatchesPyTorchGroups) {
  // The seeds' HSDP example: init_device_mesh("cuda", (2, 4),
  // mesh_dim_names=("replicate", "shard")).
  const MeshLayout mesh = Make({2, 4}, {"replicate", "shard"});
  EXPECT_EQ(mesh.ndim(), 2);
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_THAT(mesh.ranks(), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(mesh.Groups(0), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.Groups(1), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.Groups({0, 1}), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));

  absl::StatusOr<MeshGroup> replicate = mesh.GroupOf({0}, 6);
  ASSERT_TRUE(replicate.ok()) << replicate.status();
  EXPECT_EQ(replicate->color, 2);
  EXPECT_THAT(replicate->ranks, ElementsAre(2, 6));
  absl::StatusOr<MeshGroup> shard = mesh.GroupOf({1}, 6);
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->color, 1);
  EXPECT_THAT(shard->ranks, ElementsAre(4, 5, 6, 7));

  absl::StatusOr<std::vector<int64_t>> coordinate = mesh.Coordinate(6);
  ASSERT_TRUE(coordinate.ok());
  EXPECT_THAT(*coordinate, ElementsAre(1, 2));
  EXPECT_EQ(*mesh.RankAt({1, 2}), 6);
  EXPECT_EQ(*mesh.DimIndex("shard"), 1);
}

TEST(MeshLayoutTest, OneDimensionalMeshIsTheWorld) {
  const MeshLayout mesh = Make({5}, {});
  EXPECT_THAT(mesh.dim_names(), ElementsAre("dim0"));
  EXPECT_EQ(mesh.Groups(0), (Groups{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(mesh.GroupOf({0}, 3)->color, 0);
  EXPECT_THAT(*mesh.Coordinate(3), ElementsAre(3));
}

TEST(MeshLayoutTest, ThreeDimensionalGroupsAndColors) {
  const MeshLayout mesh = Make({2, 2, 2}, {"replicate", "shard", "tp"});
  EXPECT_EQ(mesh.Groups(0), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.Groups(1), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.Groups(2), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.Groups({0, 2}), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(mesh.Groups({0, 1}), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // GroupOf agrees with Groups on every rank and dim set: the color indexes
  // the family and the rank is a member.
  const std::vector<std::vector<int>> dim_sets = {{0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (const auto& dims : dim_sets) {
    const Groups all = mesh.Groups(dims);
    for (int r = 0; r < 8; ++r) {
      absl::StatusOr<MeshGroup> group = mesh.GroupOf(dims, r);
      ASSERT_TRUE(group.ok());
      ASSERT_LT(group->color, static_cast<int>(all.size()));
      EXPECT_EQ(group->ranks, all[group->color]);
      EXPECT_THAT(group->ranks, ::testing::Contains(r));
    }
  }
}

TEST(MeshLayoutTest, GroupsOfEveryDimPartitionTheLayout) {
  std::mt19937 rng(7);
  const std::vector<std::vector<int64_t>> shapes = {{1},    {7},       {3, 5},
                                                    {1, 4}, {2, 3, 4}, {2, 1, 3, 2}};
  for (const auto& shape : shapes) {
    int world = 1;
    for (int64_t s : shape) world *= static_cast<int>(s);
    std::vector<int> ranks(world);
    std::iota(ranks.begin(), ranks.end(), 0);
    std::shuffle(ranks.begin(), ranks.end(), rng);
    absl::StatusOr<MeshLayout> mesh = MeshLayout::FromRanks(shape, {}, ranks);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    for (int d = 0; d < mesh->ndim(); ++d) {
      const Groups groups = mesh->Groups(d);
      ASSERT_EQ(static_cast<int64_t>(groups.size()) * shape[d], world);
      std::set<int> covered;
      for (const auto& group : groups) {
        ASSERT_EQ(static_cast<int64_t>(group.size()), shape[d]);
        // Members differ only in coordinate d, which counts 0, 1, 2, ...
        const std::vector<int64_t> first = *mesh->Coordinate(group[0]);
        for (size_t i = 0; i < group.size(); ++i) {
          std::vector<int64_t> c = *mesh->Coordinate(group[i]);
          EXPECT_EQ(c[d], static_cast<int64_t>(i));
          c[d] = first[d];
          EXPECT_EQ(c, first);
          covered.insert(group[i]);
        }
      }
      EXPECT_EQ(covered.size(), static_cast<size_t>(world));
    }
    for (int r = 0; r < world; ++r) EXPECT_EQ(*mesh->RankAt(*mesh->Coordinate(r)), r);
  }
}

TEST(MeshLayoutTest, CustomRankArray) {
  // Hosts hold ranks {0,1} and {2,3}, but the user wants tp across hosts.
  absl::StatusOr<MeshLayout> mesh = MeshLayout::FromRanks({2, 2}, {"dp", "tp"}, {0, 2, 1, 3});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->Groups(1), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh->Groups(0), (Groups{{0, 1}, {2, 3}}));
  EXPECT_THAT(*mesh->Coordinate(2), ElementsAre(0, 1));
}

TEST(MeshLayoutTest, ValidationErrorsAreInvalidArgumentAndSayWhy) {
  ExpectInvalid(MeshLayout::Create({2, 4}, {"dp", "tp"}, 6), "holds 8 ranks but the world has 6");
  ExpectInvalid(MeshLayout::Create({}, {}, 1), "at least one dim");
  ExpectInvalid(MeshLayout::Create({2, 0}, {}, 0), "dim 1 has size 0");
  ExpectInvalid(MeshLayout::Create({-2, -4}, {}, 8), "dim 0 has size -2");
  ExpectInvalid(MeshLayout::Create({2, 4}, {"dp"}, 8), "2 dims but 1 dim names");
  ExpectInvalid(MeshLayout::Create({2, 4}, {"dp", "dp"}, 8), "'dp' appears more than once");
  ExpectInvalid(MeshLayout::Create({2, 4}, {"dp", ""}, 8), "dim 1 has an empty name");
  ExpectInvalid(MeshLayout::Create({65536, 65536}, {}, 1), "more than 2^31-1");
  ExpectInvalid(MeshLayout::FromRanks({2, 2}, {}, {0, 1, 2}), "rank array has 3");
  ExpectInvalid(MeshLayout::FromRanks({2, 2}, {}, {0, 1, 1, 3}), "rank 1 appears more than once");
  ExpectInvalid(MeshLayout::FromRanks({2, 2}, {}, {0, 1, 2, 4}), "entry 3 is 4, out of range");
  ExpectInvalid(MeshLayout::FromRanks({2, 2}, {}, {0, -1, 2, 3}), "entry 1 is -1");

  const MeshLayout mesh = Make({2, 4}, {"dp", "tp"});
  EXPECT_EQ(mesh.DimIndex("pp").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mesh.DimIndex("pp").status().message()),
              HasSubstr("no dim 'pp'; its dims are (dp, tp)"));
  EXPECT_EQ(mesh.Coordinate(8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.Coordinate(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.RankAt({2, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.RankAt({0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.GroupOf({1, 0}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.GroupOf({2}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.GroupOf({}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.GroupOf({0}, 9).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MeshLayoutTest, SliceKeepsNamedDimsThroughTheRank) {
  const MeshLayout mesh = Make({2, 2, 2}, {"replicate", "shard", "tp"});
  const std::vector<std::string> hsdp_names = {"replicate", "shard"};
  absl::StatusOr<MeshLayout> hsdp = mesh.Slice(hsdp_names, 5);
  ASSERT_TRUE(hsdp.ok()) << hsdp.status();
  EXPECT_THAT(hsdp->shape(), ElementsAre(2, 2));
  EXPECT_THAT(hsdp->dim_names(), ElementsAre("replicate", "shard"));
  EXPECT_THAT(hsdp->ranks(), ElementsAre(1, 3, 5, 7));
  // The slice's groups are the parent's groups through its ranks.
  EXPECT_EQ(hsdp->Groups(0), (Groups{{1, 5}, {3, 7}}));
  EXPECT_EQ(hsdp->Groups(1), (Groups{{1, 3}, {5, 7}}));
  EXPECT_THAT(*hsdp->Coordinate(5), ElementsAre(1, 0));

  const std::vector<std::string> tp_name = {"tp"};
  absl::StatusOr<MeshLayout> tp = mesh.Slice(tp_name, 5);
  ASSERT_TRUE(tp.ok());
  EXPECT_THAT(tp->ranks(), ElementsAre(4, 5));
  // Slicing a slice gives what slicing the parent does.
  const std::vector<std::string> shard_name = {"shard"};
  EXPECT_EQ(*hsdp->Slice(shard_name, 5), *mesh.Slice(shard_name, 5));

  const std::vector<std::string> reversed = {"tp", "replicate"};
  ExpectInvalid(mesh.Slice(reversed, 0), "in mesh order");
  const std::vector<std::string> twice = {"tp", "tp"};
  ExpectInvalid(mesh.Slice(twice, 0), "distinct");
  const std::vector<std::string> unknown = {"pp"};
  ExpectInvalid(mesh.Slice(unknown, 0), "no dim 'pp'");
  ExpectInvalid(mesh.Slice(std::vector<std::string>{}, 0), "no mesh dim names");
}

TEST(MeshLayoutTest, FlattenMergesAdjacentDims) {
  const MeshLayout mesh = Make({2, 2, 2}, {"dp", "tp", "cp"});
  const std::vector<std::string> dp_tp = {"dp", "tp"};
  absl::StatusOr<MeshLayout> flat = mesh.Flatten(dp_tp);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_THAT(flat->shape(), ElementsAre(4, 2));
  EXPECT_THAT(flat->dim_names(), ElementsAre("dp_tp", "cp"));
  EXPECT_EQ(flat->ranks(), mesh.ranks());
  // The flattened dim's groups are the parent's groups over both dims.
  EXPECT_EQ(flat->Groups(0), mesh.Groups({0, 1}));

  const std::vector<std::string> tp_cp = {"tp", "cp"};
  absl::StatusOr<MeshLayout> named = mesh.Flatten(tp_cp, "inner");
  ASSERT_TRUE(named.ok());
  EXPECT_THAT(named->dim_names(), ElementsAre("dp", "inner"));
  EXPECT_EQ(named->Groups(1), mesh.Groups({1, 2}));

  const std::vector<std::string> all = {"dp", "tp", "cp"};
  EXPECT_THAT(mesh.Flatten(all)->shape(), ElementsAre(8));
  EXPECT_THAT(mesh.Flatten(all)->dim_names(), ElementsAre("dp_tp_cp"));

  const std::vector<std::string> gap = {"dp", "cp"};
  ExpectInvalid(mesh.Flatten(gap), "not adjacent");
  ExpectInvalid(mesh.Flatten(dp_tp, "cp"), "keeps a dim of that name");
  const std::vector<std::string> reversed = {"tp", "dp"};
  ExpectInvalid(mesh.Flatten(reversed), "mesh order");
}

TEST(MeshLayoutTest, DebugStringIsBounded) {
  EXPECT_EQ(Make({2, 2}, {"dp", "tp"}).DebugString(),
            "MeshLayout(shape=(2, 2), dim_names=(dp, tp), ranks=[0, 1, 2, 3])");
  EXPECT_THAT(Make({100}, {}).DebugString(), HasSubstr("... (100 ranks)"));
}

}  // namespace mesh_layout_test
}  // namespace mesh
