// DeviceMesh over a hand-written fake ProcessGroupFactory that records the
// specs it is given: group membership per dim for 1-D, 2-D and 3-D meshes,
// one NewGroups call per mesh, slicing that creates nothing, and flatten.
#include "mesh/device_mesh.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/libmesh/fake_process_group.h"
#include "tests/util/status_matchers.h"

namespace mesh {
namespace device_mesh_test {

using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::mesh::testing::FakeGroup;

using ::mesh::testing::FakeFactory;

struct RankMesh {
  std::shared_ptr<FakeFactory> factory;
  DeviceMesh mesh;
};

RankMesh MakeMesh(int rank, std::vector<int64_t> shape, std::vector<std::string> names) {
  int world = 1;
  for (int64_t s : shape) world *= static_cast<int>(s);
  auto factory = std::make_shared<FakeFactory>(rank, world);
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Init(factory, shape, names);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return RankMesh{factory, *std::move(mesh)};
}

std::vector<int> Members(const absl::StatusOr<std::shared_ptr<ProcessGroup>>& group) {
  EXPECT_TRUE(group.ok()) << group.status();
  return group.ok() ? (*group)->global_ranks() : std::vector<int>{};
}

TEST(DeviceMeshTest, OneDimensionalMeshUsesTheWorldGroup) {
  RankMesh m = MakeMesh(2, {4}, {"dp"});
  EXPECT_TRUE(m.factory->calls().empty());
  EXPECT_EQ(m.factory->world_calls(), 1);
  absl::StatusOr<std::shared_ptr<ProcessGroup>> group = m.mesh.GetGroup();
  ASSERT_TRUE(group.ok());
  EXPECT_EQ(group->get(), m.factory->World()->get());
  EXPECT_THAT((*group)->global_ranks(), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(*m.mesh.GetLocalRank("dp"), 2);
  EXPECT_THAT(m.mesh.GetCoordinate(), ElementsAre(2));
  EXPECT_EQ(m.mesh.rank(), 2);
  EXPECT_EQ(m.mesh.size(), 4);
}

TEST(DeviceMeshTest, TwoByFourMatchesPyTorchOnEveryRankInOneCall) {
  const std::vector<std::vector<int>> replicate = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  const std::vector<std::vector<int>> shard = {{0, 1, 2, 3}, {4, 5, 6, 7}};
  for (int rank = 0; rank < 8; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    RankMesh m = MakeMesh(rank, {2, 4}, {"replicate", "shard"});
    // Both dims' groups in a single NewGroups call, so an NCCL factory can
    // exchange every unique ID in one round trip.
    const auto calls = m.factory->calls();
    ASSERT_EQ(calls.size(), 1u);
    ASSERT_EQ(calls[0].size(), 2u);
    EXPECT_EQ(calls[0][0].family, "mesh/replicate");
    EXPECT_EQ(calls[0][0].color, rank % 4);
    EXPECT_EQ(calls[0][0].global_ranks, replicate[rank % 4]);
    EXPECT_EQ(calls[0][1].family, "mesh/shard");
    EXPECT_EQ(calls[0][1].color, rank / 4);
    EXPECT_EQ(calls[0][1].global_ranks, shard[rank / 4]);

    EXPECT_EQ(Members(m.mesh.GetGroup("replicate")), replicate[rank % 4]);
    EXPECT_EQ(Members(m.mesh.GetGroup("shard")), shard[rank / 4]);
    EXPECT_EQ(Members(m.mesh.GetGroup(1)), shard[rank / 4]);
    EXPECT_THAT(m.mesh.GetCoordinate(), ElementsAre(rank / 4, rank % 4));
    EXPECT_EQ(*m.mesh.GetLocalRank("replicate"), rank / 4);
    EXPECT_EQ(*m.mesh.GetLocalRank(1), rank % 4);
    EXPECT_EQ((*m.mesh.GetGroup("shard"))->rank(), rank % 4);
    EXPECT_EQ(*m.mesh.Size("shard"), 4);
    EXPECT_EQ(m.mesh.Size(0), 2);
  }
}

// The collective contract of NewGroups, checked across all ranks of a 3-D
// mesh: same families in the same order everywhere, and within a family,
// ranks that share a color list identical members and the colors partition
// the world.
TEST(DeviceMeshTest, ThreeDimensionalSpecsAgreeAcrossRanks) {
  constexpr int kWorld = 12;
  const std::vector<std::string> names = {"pp", "dp", "tp"};
  std::map<std::string, std::map<int, std::vector<int>>> families;
  std::vector<std::string> family_order;
  for (int rank = 0; rank < kWorld; ++rank) {
    RankMesh m = MakeMesh(rank, {2, 3, 2}, names);
    const auto calls = m.factory->calls();
    ASSERT_EQ(calls.size(), 1u);
    ASSERT_EQ(calls[0].size(), 3u);
    std::vector<std::string> order;
    for (const GroupSpec& spec : calls[0]) {
      order.push_back(spec.family);
      auto [it, inserted] = families[spec.family].emplace(spec.color, spec.global_ranks);
      if (!inserted) {
        EXPECT_EQ(it->second, spec.global_ranks) << spec.family;
      }
      EXPECT_THAT(spec.global_ranks, ::testing::Contains(rank));
    }
    if (rank == 0) family_order = order;
    EXPECT_EQ(order, family_order);
    // A rank's group along tp is its neighbour pair, along dp stride 2,
    // along pp stride 6.
    EXPECT_EQ(Members(m.mesh.GetGroup("tp")), (std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}));
    EXPECT_EQ(Members(m.mesh.GetGroup("pp")), (std::vector<int>{rank % 6, rank % 6 + 6}));
    const int dp_base = rank / 6 * 6 + rank % 2;
    EXPECT_EQ(Members(m.mesh.GetGroup("dp")),
              (std::vector<int>{dp_base, dp_base + 2, dp_base + 4}));
  }
  EXPECT_THAT(family_order, ElementsAre("mesh/pp", "mesh/dp", "mesh/tp"));
  const std::map<std::string, size_t> expected_colors = {
      {"mesh/pp", 6}, {"mesh/dp", 4}, {"mesh/tp", 6}};
  for (const auto& [family, colors] : families) {
    EXPECT_EQ(colors.size(), expected_colors.at(family)) << family;
    std::set<int> covered;
    for (const auto& [color, members] : colors) {
      for (int r : members) EXPECT_TRUE(covered.insert(r).second) << family << " rank " << r;
    }
    EXPECT_EQ(covered.size(), static_cast<size_t>(kWorld)) << family;
  }
}

TEST(DeviceMeshTest, SlicingReusesTheRootsGroups) {
  RankMesh m = MakeMesh(5, {2, 2, 2}, {"replicate", "shard", "tp"});
  ASSERT_EQ(m.factory->calls().size(), 1u);

  absl::StatusOr<DeviceMesh> hsdp = m.mesh[{"replicate", "shard"}];
  ASSERT_TRUE(hsdp.ok()) << hsdp.status();
  EXPECT_THAT(hsdp->shape(), ElementsAre(2, 2));
  EXPECT_THAT(hsdp->dim_names(), ElementsAre("replicate", "shard"));
  EXPECT_THAT(hsdp->layout().ranks(), ElementsAre(1, 3, 5, 7));
  EXPECT_THAT(hsdp->GetCoordinate(), ElementsAre(1, 0));
  EXPECT_EQ(hsdp->GetGroup("replicate")->get(), m.mesh.GetGroup("replicate")->get());
  EXPECT_EQ(hsdp->GetGroup("shard")->get(), m.mesh.GetGroup("shard")->get());

  absl::StatusOr<DeviceMesh> shard = (*hsdp)["shard"];
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->GetGroup()->get(), m.mesh.GetGroup("shard")->get());
  absl::StatusOr<DeviceMesh> tp = m.mesh["tp"];
  ASSERT_TRUE(tp.ok());
  EXPECT_EQ(tp->GetGroup()->get(), m.mesh.GetGroup("tp")->get());
  EXPECT_THAT(tp->layout().ranks(), ElementsAre(4, 5));
  EXPECT_EQ(*tp->GetLocalRank(0), 1);
  // Copies share state too.
  DeviceMesh copy = m.mesh;
  EXPECT_EQ(copy.GetGroup("tp")->get(), m.mesh.GetGroup("tp")->get());

  // Nothing above created a group.
  EXPECT_EQ(m.factory->calls().size(), 1u);
}

TEST(DeviceMeshTest, SliceAndGroupErrors) {
  RankMesh m = MakeMesh(0, {2, 2, 2}, {"dp", "tp", "cp"});
  auto expect_invalid = [](const auto& result, const std::string& substring) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(substring));
  };
  expect_invalid(m.mesh["pp"], "no dim 'pp'; its dims are (dp, tp, cp)");
  expect_invalid(m.mesh[{"tp", "dp"}], "in mesh order");
  expect_invalid(m.mesh[{"tp", "tp"}], "distinct");
  expect_invalid(m.mesh.Slice({}), "no device mesh dims");
  expect_invalid((*m.mesh["tp"])["dp"], "no dim 'dp'");
  expect_invalid(m.mesh.GetGroup("pp"), "no dim 'pp'");
  expect_invalid(m.mesh.GetGroup(3), "dim 3 is out of range");
  expect_invalid(m.mesh.GetGroup(-1), "out of range");
  expect_invalid(m.mesh.GetGroup(), "needs a 1-D mesh");
  expect_invalid(m.mesh.GetLocalRank("pp"), "no dim 'pp'");
  expect_invalid(m.mesh.Size("pp"), "no dim 'pp'");

  auto factory = std::make_shared<FakeFactory>(0, 6);
  expect_invalid(DeviceMesh::Init(factory, {2, 2}, {"dp", "tp"}), "world has 6");
  expect_invalid(DeviceMesh::Init(factory, {2, 3}, {"dp", "dp"}), "more than once");
  absl::StatusOr<MeshLayout> layout = MeshLayout::Create({2, 3}, {}, 6);
  ASSERT_TRUE(layout.ok());
  expect_invalid(DeviceMesh::Create(factory, *layout, DeviceMeshOptions{""}), "name");
  EXPECT_TRUE(factory->calls().empty());
}

TEST(DeviceMeshTest, CustomLayoutGroupsFollowTheRankArray) {
  auto factory = std::make_shared<FakeFactory>(2, 4);
  absl::StatusOr<MeshLayout> layout = MeshLayout::FromRanks({2, 2}, {"dp", "tp"}, {0, 2, 1, 3});
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(factory, *layout);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(Members(mesh->GetGroup("tp")), ElementsAre(0, 2));
  EXPECT_THAT(Members(mesh->GetGroup("dp")), ElementsAre(2, 3));
  EXPECT_THAT(mesh->GetCoordinate(), ElementsAre(0, 1));
}

TEST(DeviceMeshTest, MembersOnlyMeshOverLiveRanksNeverUsesTheWorldGroup) {
  // World of 8 as (4, 2) dp x tp; replica dp=1 (ranks 2, 3) is gone.
  auto factory = std::make_shared<FakeFactory>(5, 8);
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::FromMembers({3, 2}, {"dp", "tp"}, {0, 1, 4, 5, 6, 7}, 8);
  ASSERT_TRUE(layout.ok()) << layout.status();
  DeviceMeshOptions options;
  options.name = "elastic1";
  options.members_only = true;
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(factory, *layout, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(Members(mesh->GetGroup("dp")), ElementsAre(1, 5, 7));
  EXPECT_THAT(Members(mesh->GetGroup("tp")), ElementsAre(4, 5));
  EXPECT_THAT(mesh->GetCoordinate(), ElementsAre(1, 1));
  EXPECT_EQ(factory->world_calls(), 0);
  EXPECT_EQ(factory->members_only_calls(), 1);
  // Flattening stays among the members too.
  absl::StatusOr<DeviceMesh> flat = mesh->Flatten();
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_THAT(Members(flat->GetGroup()), ElementsAre(0, 1, 4, 5, 6, 7));
  EXPECT_EQ(factory->members_only_calls(), 2);
  EXPECT_EQ(factory->world_calls(), 0);

  // A members-only layout over every rank in order still builds its own
  // groups: the world group is collective over ranks that may be gone.
  auto whole = std::make_shared<FakeFactory>(1, 2);
  absl::StatusOr<MeshLayout> all = MeshLayout::FromMembers({2}, {"dp"}, {0, 1}, 2);
  ASSERT_TRUE(all.ok());
  ASSERT_TRUE(DeviceMesh::Create(whole, *all, options).ok());
  EXPECT_EQ(whole->world_calls(), 0);
  EXPECT_EQ(whole->members_only_calls(), 1);
}

TEST(DeviceMeshTest, MembersOnlyMeshReusesTheMembersGroupForADimThatSpansIt) {
  auto factory = std::make_shared<FakeFactory>(4, 8);
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> all =
      factory->NewGroupsAmongMembers({GroupSpec{"elastic2/members", 0, {0, 1, 4}}});
  ASSERT_TRUE(all.ok()) << all.status();
  absl::StatusOr<MeshLayout> layout = MeshLayout::FromMembers({3, 1}, {"dp", "tp"}, {0, 1, 4}, 8);
  ASSERT_TRUE(layout.ok());
  DeviceMeshOptions options;
  options.name = "elastic2";
  options.members_only = true;
  options.members_group = (*all)[0];
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(factory, *layout, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->GetGroup("dp")->get(), (*all)[0].get());
  EXPECT_THAT(Members(mesh->GetGroup("tp")), ElementsAre(4));
  // Flattening both dims spans the members too.
  EXPECT_EQ(mesh->Flatten()->GetGroup()->get(), (*all)[0].get());
  EXPECT_EQ(factory->members_only_calls(), 2) << "the members' group and tp";

  // A members group that is not the layout's ranks in order is refused.
  absl::StatusOr<MeshLayout> other = MeshLayout::FromMembers({3, 1}, {"dp", "tp"}, {1, 0, 4}, 8);
  ASSERT_TRUE(other.ok());
  EXPECT_THAT(DeviceMesh::Create(factory, *other, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout order")));
  // ... and so is one without members_only.
  auto whole = std::make_shared<FakeFactory>(1, 3);
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> world =
      whole->NewGroupsAmongMembers({GroupSpec{"m/members", 0, {0, 1, 2}}});
  ASSERT_TRUE(world.ok());
  options.members_only = false;
  options.members_group = (*world)[0];
  EXPECT_THAT(
      DeviceMesh::Create(whole, *MeshLayout::Create({3, 1}, {"dp", "tp"}, 3), options).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs members_only")));
}

TEST(DeviceMeshTest, MembersOnlyErrors) {
  auto factory = std::make_shared<FakeFactory>(2, 8);
  DeviceMeshOptions options;
  options.members_only = true;
  absl::StatusOr<MeshLayout> without_caller = MeshLayout::FromMembers({2}, {"dp"}, {0, 1}, 8);
  ASSERT_TRUE(without_caller.ok());
  EXPECT_THAT(DeviceMesh::Create(factory, *without_caller, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("calling rank 2")));
  // Without members_only a partial layout is still an error.
  absl::StatusOr<MeshLayout> partial = MeshLayout::FromMembers({2}, {"dp"}, {1, 2}, 8);
  ASSERT_TRUE(partial.ok());
  EXPECT_THAT(DeviceMesh::Create(factory, *partial).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the world has 8")));
  EXPECT_THAT(MeshLayout::FromMembers({2}, {"dp"}, {1, 8}, 8).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside a world of 8")));
  EXPECT_THAT(MeshLayout::FromMembers({2}, {"dp"}, {3, 3}, 8).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 3 more than once")));
  EXPECT_THAT(MeshLayout::FromMembers({3}, {"dp"}, {3, 4}, 8).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds 3 ranks")));
}

TEST(DeviceMeshTest, AMembershipMakesEveryGroupWithinIt) {
  // Ranks 0, 1, 4, 5 of 8 as a (2, 2) mesh; rank 4 calls.
  auto factory = std::make_shared<FakeFactory>(4, 8);
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::FromMembers({2, 2}, {"dp", "tp"}, {0, 1, 4, 5}, 8);
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto membership = factory->NewMembership(GroupSpec{"e1/m", 0, {0, 1, 4, 5}}, nullptr);
  ASSERT_TRUE(membership.ok()) << membership.status();
  DeviceMeshOptions options;
  options.name = "e1";
  options.members_only = true;
  options.membership = *membership;
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(factory, *layout, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(factory->within(), std::vector<std::string>{"e1/m"});
  EXPECT_EQ(factory->members_only_calls(), 0);
  // A flattening too: collective among the same members.
  ASSERT_TRUE(mesh->Flatten("all").ok());
  EXPECT_EQ(factory->within(), (std::vector<std::string>{"e1/m", "e1/m"}));
  EXPECT_EQ(factory->members_only_calls(), 0);
}

TEST(DeviceMeshTest, AMembershipNeedsMembersOnlyAndExactlyTheLayoutsRanks) {
  auto factory = std::make_shared<FakeFactory>(1, 4);
  absl::StatusOr<MeshLayout> layout = MeshLayout::FromMembers({2}, {"dp"}, {1, 3}, 4);
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto other = factory->NewMembership(GroupSpec{"e1/m", 0, {0, 1, 3}}, nullptr);
  ASSERT_TRUE(other.ok()) << other.status();
  DeviceMeshOptions options;
  options.members_only = true;
  options.membership = *other;
  EXPECT_THAT(DeviceMesh::Create(factory, *layout, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must hold exactly the layout's ranks")));
  auto same = factory->NewMembership(GroupSpec{"e1/m", 0, {1, 3}}, nullptr);
  ASSERT_TRUE(same.ok()) << same.status();
  // A whole-world mesh without members_only cannot take one either.
  absl::StatusOr<MeshLayout> whole = MeshLayout::Create({4}, {"dp"}, 4);
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto all = factory->NewMembership(GroupSpec{"e1/m", 0, {0, 1, 2, 3}}, nullptr);
  ASSERT_TRUE(all.ok()) << all.status();
  options.membership = *all;
  options.members_only = false;
  EXPECT_THAT(DeviceMesh::Create(factory, *whole, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs members_only")));
  EXPECT_THAT(factory->within(), ::testing::IsEmpty());
  // And the default NewMembership's own checks.
  EXPECT_THAT(factory->NewMembership(GroupSpec{"e2/m", 0, {3, 1}}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ascending")));
  EXPECT_THAT(factory->NewMembership(GroupSpec{"e2/m", 0, {1, 2}}, *same).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2 is not in")));
}

TEST(DeviceMeshTest, FactoryErrorsPropagateAndBadGroupsAreCaught) {
  auto failing = std::make_shared<FakeFactory>(0, 4);
  failing->FailWith(absl::DeadlineExceededError("peers did not show up"));
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Init(failing, {2, 2}, {"dp", "tp"});
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kDeadlineExceeded);

  auto corrupt = std::make_shared<FakeFactory>(0, 4);
  corrupt->CorruptMembers();
  mesh = DeviceMesh::Init(corrupt, {2, 2}, {"dp", "tp"});
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInternal) << mesh.status();
  EXPECT_THAT(std::string(mesh.status().message()), HasSubstr("asked for family 'mesh/dp'"));
}

TEST(DeviceMeshTest, FlattenCreatesOneGroupOnceAndRegistersItsName) {
  for (int rank : {0, 5}) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    RankMesh m = MakeMesh(rank, {2, 2, 2}, {"dp", "tp", "cp"});
    ASSERT_EQ(m.factory->calls().size(), 1u);

    absl::StatusOr<DeviceMesh> dp_tp = (*m.mesh[{"dp", "tp"}]).Flatten();
    ASSERT_TRUE(dp_tp.ok()) << dp_tp.status();
    EXPECT_THAT(dp_tp->dim_names(), ElementsAre("dp_tp"));
    EXPECT_THAT(dp_tp->shape(), ElementsAre(4));
    const std::vector<int> expected =
        rank % 2 == 0 ? std::vector<int>{0, 2, 4, 6} : std::vector<int>{1, 3, 5, 7};
    EXPECT_EQ(Members(dp_tp->GetGroup()), expected);
    EXPECT_EQ(*dp_tp->GetLocalRank("dp_tp"), rank / 2);
    auto calls = m.factory->calls();
    ASSERT_EQ(calls.size(), 2u);
    ASSERT_EQ(calls[1].size(), 1u);
    EXPECT_EQ(calls[1][0].family, "mesh/dp_tp");
    EXPECT_EQ(calls[1][0].color, rank % 2);
    EXPECT_EQ(calls[1][0].global_ranks, expected);

    // Again, under the same or another name: the cached group, no new call.
    absl::StatusOr<DeviceMesh> again = (*m.mesh[{"dp", "tp"}]).Flatten();
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->GetGroup()->get(), dp_tp->GetGroup()->get());
    absl::StatusOr<DeviceMesh> alias = (*m.mesh[{"dp", "tp"}]).Flatten("batch");
    ASSERT_TRUE(alias.ok());
    EXPECT_EQ(alias->GetGroup()->get(), dp_tp->GetGroup()->get());
    EXPECT_EQ(m.factory->calls().size(), 2u);

    // The root can now be sliced by the flattened name, alone or with cp.
    absl::StatusOr<DeviceMesh> sliced = m.mesh["dp_tp"];
    ASSERT_TRUE(sliced.ok()) << sliced.status();
    EXPECT_EQ(sliced->GetGroup()->get(), dp_tp->GetGroup()->get());
    absl::StatusOr<DeviceMesh> two_d = m.mesh[{"dp_tp", "cp"}];
    ASSERT_TRUE(two_d.ok()) << two_d.status();
    EXPECT_THAT(two_d->shape(), ElementsAre(4, 2));
    EXPECT_THAT(two_d->dim_names(), ElementsAre("dp_tp", "cp"));
    EXPECT_EQ(two_d->GetGroup("cp")->get(), m.mesh.GetGroup("cp")->get());
    EXPECT_THAT(two_d->GetCoordinate(), ElementsAre(rank / 2, rank % 2));
    EXPECT_FALSE((m.mesh[{"cp", "dp_tp"}]).ok());
    EXPECT_FALSE((m.mesh[{"dp_tp", "tp"}]).ok());
    // A sub-mesh without both dp and tp cannot slice dp_tp.
    EXPECT_THAT(std::string((*m.mesh[{"tp", "cp"}])["dp_tp"].status().message()),
                HasSubstr("does not cover whole dims"));

    // Flattening everything is the world, in order: no new group.
    absl::StatusOr<DeviceMesh> all = m.mesh.Flatten();
    ASSERT_TRUE(all.ok());
    EXPECT_THAT(all->dim_names(), ElementsAre("dp_tp_cp"));
    EXPECT_EQ(all->GetGroup()->get(), m.factory->World()->get());
    EXPECT_EQ(m.factory->calls().size(), 2u);

    // Name clashes.
    EXPECT_EQ((*m.mesh[{"tp", "cp"}]).Flatten("dp").status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string((*m.mesh[{"tp", "cp"}]).Flatten("dp_tp").status().message()),
                HasSubstr("already taken"));
    EXPECT_EQ(m.factory->calls().size(), 2u);
  }
}

TEST(DeviceMeshTest, FlattenOfNonAdjacentDimsAndOfOneDim) {
  RankMesh m = MakeMesh(3, {2, 2, 2}, {"dp", "tp", "cp"});
  absl::StatusOr<DeviceMesh> dp_cp = (*m.mesh[{"dp", "cp"}]).Flatten();
  ASSERT_TRUE(dp_cp.ok()) << dp_cp.status();
  EXPECT_THAT(Members(dp_cp->GetGroup()), ElementsAre(2, 3, 6, 7));
  EXPECT_EQ(m.factory->calls().size(), 2u);

  // A 1-D mesh flattened under a new name keeps its group.
  absl::StatusOr<DeviceMesh> renamed = (*m.mesh["tp"]).Flatten("model");
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_THAT(renamed->dim_names(), ElementsAre("model"));
  EXPECT_EQ(renamed->GetGroup()->get(), m.mesh.GetGroup("tp")->get());
  EXPECT_EQ(m.factory->calls().size(), 2u);
  absl::StatusOr<DeviceMesh> same = (*m.mesh["tp"]).Flatten();
  ASSERT_TRUE(same.ok());
  EXPECT_THAT(same->dim_names(), ElementsAre("tp"));
}

}  // namespace device_mesh_test
}  // namespace mesh
