#include "coordinator/rendezvous.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/unique_id_table.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace rendezvous_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

DeviceInfo Gpu(int index) { return DeviceInfo{"cuda", index, "GPU-" + std::to_string(index), ""}; }

// Joins rank r on hosts[r], in the order given by `order`; returns how many
// joins reported completing the world.
int JoinAll(Rendezvous& rdv, const std::vector<std::string>& hosts, const std::vector<int>& order) {
  int completions = 0;
  for (int rank : order) {
    const absl::StatusOr<bool> completed =
        rdv.Join(rank, 100 + rank, hosts[rank], Gpu(rank), /*world_unique_id=*/"");
    EXPECT_THAT(completed, IsOk()) << rank;
    if (completed.ok() && *completed) ++completions;
  }
  return completions;
}

TEST(RendezvousTest, OnlyTheLastJoinCompletesTheWorld) {
  Rendezvous rdv(3);
  EXPECT_EQ(rdv.Join(1, 11, "h", Gpu(1), ""), absl::StatusOr<bool>(false));
  EXPECT_EQ(rdv.Join(0, 10, "h", Gpu(0), ""), absl::StatusOr<bool>(false));
  EXPECT_EQ(rdv.num_joined(), 2);
  EXPECT_FALSE(rdv.complete());
  EXPECT_THAT(rdv.Missing(), ElementsAre(2));
  EXPECT_EQ(rdv.Join(2, 12, "h", Gpu(2), ""), absl::StatusOr<bool>(true));
  EXPECT_TRUE(rdv.complete());
  EXPECT_THAT(rdv.Missing(), IsEmpty());
  // A repeated join completes nothing again.
  EXPECT_EQ(rdv.Join(2, 12, "h", Gpu(2), ""), absl::StatusOr<bool>(false));
}

TEST(RendezvousTest, NodesAreHostsInOrderOfTheirLowestRank) {
  const std::vector<std::string> hosts = {"b", "a", "b", "c", "a", "b"};
  for (const std::vector<int>& order :
       {std::vector<int>{0, 1, 2, 3, 4, 5}, std::vector<int>{5, 3, 1, 4, 2, 0}}) {
    Rendezvous rdv(6);
    EXPECT_EQ(JoinAll(rdv, hosts, order), 1);
    ASSERT_TRUE(rdv.complete());
    EXPECT_EQ(rdv.num_nodes(), 3);
    const int node[] = {0, 1, 0, 2, 1, 0};
    const int local[] = {0, 0, 1, 0, 1, 2};
    const int local_world[] = {3, 2, 3, 1, 2, 3};
    for (int rank = 0; rank < 6; ++rank) {
      const Rendezvous::Placement p = rdv.placement(rank);
      EXPECT_EQ(p.node_rank, node[rank]) << rank;
      EXPECT_EQ(p.local_rank, local[rank]) << rank;
      EXPECT_EQ(p.local_world_size, local_world[rank]) << rank;
    }
  }
}

TEST(RendezvousTest, ARepeatedJoinKeepsTheFirstRecord) {
  Rendezvous rdv(2);
  ASSERT_THAT(rdv.Join(0, 7, "first-host", Gpu(0), ""), IsOk());
  ASSERT_THAT(rdv.Join(0, 8, "second-host", Gpu(1), ""), IsOk());
  EXPECT_TRUE(rdv.joined(0));
  EXPECT_EQ(rdv.incarnation(0), 7u);
  EXPECT_EQ(rdv.host(0), "first-host");
  EXPECT_EQ(rdv.RankName(0), "0 (first-host)");
  EXPECT_EQ(rdv.RankName(1), "1 (not joined)");
}

TEST(RendezvousTest, InvalidJoinsRecordNothing) {
  Rendezvous rdv(2);
  EXPECT_THAT(rdv.Join(1, 1, "", Gpu(1), ""), StatusIs(Code::kInvalidArgument, HasSubstr("host")));
  EXPECT_THAT(rdv.Join(1, 1, "h", Gpu(1), std::string(kUniqueIdBytes, 'x')),
              StatusIs(Code::kInvalidArgument, HasSubstr("only rank 0")));
  EXPECT_THAT(rdv.Join(0, 1, "h", Gpu(0), std::string(kUniqueIdBytes - 1, 'x')),
              StatusIs(Code::kInvalidArgument, HasSubstr("127 bytes")));
  EXPECT_EQ(rdv.num_joined(), 0);
  EXPECT_FALSE(rdv.joined(0));
  EXPECT_FALSE(rdv.joined(1));
}

TEST(RendezvousTest, RankZeroSuppliesTheWorldUniqueId) {
  Rendezvous rdv(2);
  const std::string id(kUniqueIdBytes, '\x01');
  ASSERT_THAT(rdv.Join(0, 1, "h", Gpu(0), id), IsOk());
  ASSERT_THAT(rdv.Join(1, 1, "h", Gpu(1), ""), IsOk());
  EXPECT_EQ(rdv.world_unique_id(), id);
}

TEST(RendezvousTest, DescribeNeedsACompleteWorldAndValidRanks) {
  Rendezvous rdv(3);
  ASSERT_THAT(rdv.Join(0, 1, "a", Gpu(0), ""), IsOk());
  EXPECT_THAT(rdv.Describe({0}), StatusIs(Code::kFailedPrecondition, HasSubstr("1/3")));
  ASSERT_THAT(rdv.Join(1, 1, "b", Gpu(1), ""), IsOk());
  ASSERT_THAT(rdv.Join(2, 1, "a", Gpu(2), ""), IsOk());

  const absl::StatusOr<std::vector<RankDescription>> d = rdv.Describe({2, 0, 1});
  ASSERT_THAT(d, IsOk());
  ASSERT_EQ(d->size(), 3u);
  EXPECT_EQ((*d)[0].rank, 2);
  EXPECT_EQ((*d)[0].host, "a");
  EXPECT_EQ((*d)[0].node_rank, 0);
  EXPECT_EQ((*d)[0].local_rank, 1);
  EXPECT_EQ((*d)[0].device.uuid, "GPU-2");
  EXPECT_EQ((*d)[2].host, "b");
  EXPECT_EQ((*d)[2].node_rank, 1);

  EXPECT_THAT(rdv.Describe({3}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(rdv.Describe({-1}), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(rdv.Describe(std::vector<int>(Rendezvous::kMaxDescribeRanks + 1, 0)),
              StatusIs(Code::kInvalidArgument));
  const absl::StatusOr<std::vector<RankDescription>> many =
      rdv.Describe(std::vector<int>(Rendezvous::kMaxDescribeRanks, 1));
  ASSERT_THAT(many, IsOk());
  EXPECT_EQ(many->size(), Rendezvous::kMaxDescribeRanks);
}

}  // namespace rendezvous_test
}  // namespace mesh::coordinator
