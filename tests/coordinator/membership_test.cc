// Coordination's in-place recovery and AliveRanks (coordinator/coordination.h,
// "In-place recovery"; membership.cc), on a FakeClock: a lost rank leaves
// the membership instead of failing the generation, its waits and the
// barriers that wait for it end at once, a new process may join as it
// again, and every caller of an AliveRanks round gets the same set even
// when ranks die during the round.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/coordination.h"
#include "tests/common/test_metrics.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace membership_test {
namespace {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

constexpr absl::Duration kHeartbeatInterval = absl::Seconds(1);
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(10);
constexpr char kJob[] = "j";

// What a callback was called with; shared with the callback, so a late call
// never writes into a dead frame.
template <typename T>
class Result {
 public:
  Callback<T> Done() {
    return [state = state_](absl::StatusOr<T> result) {
      ++state->calls;
      state->result = std::move(result);
    };
  }
  bool fired() const { return state_->calls > 0; }
  int calls() const { return state_->calls; }
  const absl::StatusOr<T>& get() const { return *state_->result; }

 private:
  struct State {
    int calls = 0;
    std::optional<absl::StatusOr<T>> result;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

std::vector<int> RanksOf(const AliveSet& set) {
  std::vector<int> ranks;
  for (const AliveRank& r : set.ranks) ranks.push_back(r.rank);
  return ranks;
}

class MembershipTest : public ::testing::Test {
 protected:
  MembershipTest() {
    CoordinationOptions options;
    options.heartbeat_interval = kHeartbeatInterval;
    options.heartbeat_timeout = kHeartbeatTimeout;
    coord_ = std::make_unique<Coordination>(&clock_, options, &registry_);
    coord_->SetFailureListener(
        [this](const std::string&, const JobError& error) { failures_.push_back(error); });
  }

  // A job of `world` ranks, one per host, every rank joined.
  void Start(int world, bool in_place = true) {
    world_ = world;
    JobLayout layout;
    layout.job_id = kJob;
    layout.world_size = world;
    layout.in_place = in_place;
    ASSERT_THAT(coord_->CreateJob(std::move(layout)), IsOk());
    incarnations_.assign(world, 0);
    std::vector<Result<JoinResult>> joins(world);
    for (int rank = 0; rank < world; ++rank) {
      incarnations_[rank] = 100 + rank;
      coord_->Join(Args(rank), joins[rank].Done());
    }
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_TRUE(joins[rank].fired()) << rank;
      ASSERT_THAT(joins[rank].get(), IsOk()) << rank;
      EXPECT_EQ(joins[rank].get()->membership_epoch, 0);
    }
  }

  JoinArgs Args(int rank) {
    JoinArgs args;
    args.caller = Me(rank);
    args.host = absl::StrCat("host-", rank);
    return args;
  }

  Caller Me(int rank) const { return Caller{kJob, 0, rank, incarnations_[rank]}; }

  // Every rank in `alive` heartbeats, then the clock moves `step` and ticks.
  void Beat(const std::set<int>& alive, absl::Duration step = kHeartbeatInterval) {
    for (int rank : alive) ASSERT_THAT(coord_->Heartbeat(Me(rank)), IsOk()) << rank;
    clock_.Advance(step);
    coord_->Tick();
  }

  // Lets `rank` fall silent until the coordinator loses it; the others
  // heartbeat throughout.
  void Silence(int rank, std::set<int> alive) {
    alive.erase(rank);
    for (int i = 0; i < 12; ++i) Beat(alive);
  }

  Result<AliveSet> Alive(int rank, absl::Duration timeout = absl::Minutes(1)) {
    Result<AliveSet> result;
    coord_->AliveRanks(Me(rank), timeout, result.Done());
    return result;
  }

  FakeClock clock_;
  metrics::testing::TestRegistry registry_;  // Outlives coord_.
  std::unique_ptr<Coordination> coord_;
  std::vector<JobError> failures_;
  int world_ = 0;
  std::vector<uint64_t> incarnations_;
};

TEST_F(MembershipTest, EveryRankGetsTheSameFullSetWhenNobodyDies) {
  Start(4);
  std::vector<Result<AliveSet>> calls;
  for (int rank = 3; rank >= 0; --rank) {
    calls.push_back(Alive(rank));
    EXPECT_EQ(calls.back().fired(), rank == 0) << "the round waits for every live rank";
  }
  for (const auto& call : calls) {
    ASSERT_THAT(call.get(), IsOk());
    EXPECT_EQ(call.get()->round, 1);
    EXPECT_EQ(call.get()->membership_epoch, 0);
    EXPECT_THAT(RanksOf(*call.get()), ElementsAre(0, 1, 2, 3));
    EXPECT_EQ(call.get()->ranks[2].incarnation, 102u);
  }
  // The next call starts round 2.
  Result<AliveSet> next = Alive(0);
  EXPECT_FALSE(next.fired());
}

TEST_F(MembershipTest, ASilentRankIsLostNotTheGenerationAndTheRoundGoesOnWithoutIt) {
  Start(3);
  Result<AliveSet> a = Alive(0);
  Result<AliveSet> b = Alive(1);
  EXPECT_FALSE(a.fired());

  Silence(2, {0, 1, 2});

  EXPECT_THAT(failures_, IsEmpty()) << "no generation failed";
  ASSERT_TRUE(a.fired());
  ASSERT_TRUE(b.fired());
  ASSERT_THAT(a.get(), IsOk());
  EXPECT_THAT(RanksOf(*a.get()), ElementsAre(0, 1));
  EXPECT_EQ(a.get()->membership_epoch, 1);
  EXPECT_EQ(RanksOf(*b.get()), RanksOf(*a.get()));

  // The survivors' heartbeats tell the epoch and who was lost.
  absl::StatusOr<HeartbeatReply> reply = coord_->Heartbeat(Me(0), {});
  ASSERT_THAT(reply, IsOk());
  EXPECT_FALSE(reply->error.has_value());
  EXPECT_EQ(reply->membership_epoch, 1);
  ASSERT_EQ(reply->lost.size(), 1u);
  EXPECT_EQ(reply->lost[0].rank, 2);
  EXPECT_THAT(reply->lost[0].message, AllOf(HasSubstr("rank 2 (host-2) failed: no heartbeat"),
                                            HasSubstr("carry on in membership epoch 1")));
  // The lost process is fenced out.
  EXPECT_THAT(coord_->Heartbeat(Me(2)), StatusIs(Code::kAborted, HasSubstr("rank 2")));
  EXPECT_THAT(coord_->KvSet(Me(2), "k", "v"), StatusIs(Code::kAborted));
  // The others keep using the generation.
  EXPECT_THAT(coord_->KvSet(Me(1), "k", "v"), IsOk());
}

TEST_F(MembershipTest, ABarrierWaitingForALostRankFailsForEveryoneAtOnceNamingIt) {
  Start(3);
  Result<int> b0;
  Result<int> b1;
  coord_->Barrier(Me(0), "step", {}, absl::Minutes(5), b0.Done());
  coord_->Barrier(Me(1), "step", {}, absl::Minutes(5), b1.Done());
  ASSERT_THAT(coord_->ReportError(Me(2), "CUDA error: an illegal memory access"), IsOk());
  ASSERT_TRUE(b0.fired());
  EXPECT_THAT(b0.get(), StatusIs(Code::kAborted,
                                 AllOf(HasSubstr("barrier 'step'"), HasSubstr("rank 2 (host-2)"),
                                       HasSubstr("illegal memory access"))));
  ASSERT_TRUE(b1.fired());
  EXPECT_EQ(b1.get().status(), b0.get().status());
  // A barrier of the survivors works.
  Result<int> c0;
  Result<int> c1;
  coord_->Barrier(Me(0), "step-2", {0, 1}, absl::Minutes(5), c0.Done());
  coord_->Barrier(Me(1), "step-2", {0, 1}, absl::Minutes(5), c1.Done());
  ASSERT_TRUE(c1.fired());
  EXPECT_THAT(c1.get(), IsOk());
}

TEST_F(MembershipTest, ABarrierOpenedAfterALossThatIncludesTheLostRankFailsAtOnce) {
  Start(3);
  ASSERT_THAT(coord_->RankExited(kJob, 0, 1, "killed by signal 9"), IsOk());
  Result<int> world;
  coord_->Barrier(Me(0), "after", {}, absl::Minutes(5), world.Done());
  ASSERT_TRUE(world.fired()) << "the whole world includes the lost rank";
  EXPECT_THAT(world.get(), StatusIs(Code::kAborted, AllOf(HasSubstr("rank 1 (host-1)"),
                                                          HasSubstr("killed by signal 9"))));
  // Once the rank is back, a barrier of a new name includes it again.
  incarnations_[1] = 999;
  Result<JoinResult> join;
  coord_->Join(Args(1), join.Done());
  ASSERT_THAT(join.get(), IsOk());
  std::vector<Result<int>> again(3);
  for (int rank = 0; rank < 3; ++rank) {
    coord_->Barrier(Me(rank), "after-2", {}, absl::Minutes(5), again[rank].Done());
  }
  ASSERT_TRUE(again[0].fired());
  EXPECT_THAT(again[0].get(), IsOk());
}

TEST_F(MembershipTest, ARankThatLeftMayNotCallAliveRanks) {
  Start(3);
  ASSERT_THAT(coord_->Leave(Me(2)), IsOk());
  EXPECT_THAT(Alive(2).get(), StatusIs(Code::kFailedPrecondition, HasSubstr("has left")));
  Result<AliveSet> a = Alive(0);
  EXPECT_FALSE(a.fired()) << "a gone rank's call must not count for a live one";
  Result<AliveSet> b = Alive(1);
  ASSERT_TRUE(a.fired());
  EXPECT_THAT(RanksOf(*a.get()), ElementsAre(0, 1));
}

TEST_F(MembershipTest, TheLostRanksOwnWaitsEndNamingWhy) {
  Start(2);
  Result<std::string> wait;
  coord_->KvGet(Me(1), "never", /*wait=*/true, absl::Minutes(5), wait.Done());
  Result<JobError> watch;
  ASSERT_THAT(coord_->Watch(Me(1), watch.Done()), IsOk());
  ASSERT_THAT(coord_->RankExited(kJob, 0, 1, "exited with code 3"), IsOk());
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.get(), StatusIs(Code::kAborted, HasSubstr("exited with code 3")));
  ASSERT_TRUE(watch.fired());
  ASSERT_THAT(watch.get(), IsOk());
  EXPECT_EQ(watch.get()->rank, 1);
  EXPECT_THAT(failures_, IsEmpty());
}

TEST_F(MembershipTest, ANewProcessJoinsAsALostRankAndIsBackInTheNextEpoch) {
  Start(3);
  ASSERT_THAT(coord_->RankExited(kJob, 0, 1, "killed by signal 9"), IsOk());
  // The lost process itself may not come back.
  Result<JoinResult> again;
  coord_->Join(Args(1), again.Done());
  EXPECT_THAT(again.get(), StatusIs(Code::kAborted, HasSubstr("killed by signal 9")));

  incarnations_[1] = 555;
  Result<JoinResult> replacement;
  JoinArgs elsewhere = Args(1);
  elsewhere.host = "host-9";  // A replacement node.
  elsewhere.device = DeviceInfo{"cuda", 3, "GPU-new", "0000:af:00.0"};
  coord_->Join(elsewhere, replacement.Done());
  ASSERT_TRUE(replacement.fired()) << "the world has formed: the join completes at once";
  ASSERT_THAT(replacement.get(), IsOk());
  EXPECT_EQ(replacement.get()->rank, 1);
  EXPECT_EQ(replacement.get()->membership_epoch, 2);

  std::vector<Result<AliveSet>> calls;
  for (int rank = 0; rank < 3; ++rank) calls.push_back(Alive(rank));
  ASSERT_THAT(calls[0].get(), IsOk());
  EXPECT_THAT(RanksOf(*calls[0].get()), ElementsAre(0, 1, 2));
  EXPECT_EQ(calls[0].get()->ranks[1].incarnation, 555u);
  EXPECT_EQ(calls[0].get()->membership_epoch, 2);
  // It is described where it runs now; its place in the topology is kept.
  absl::StatusOr<std::vector<RankDescription>> described = coord_->DescribeRanks(Me(0), {1});
  ASSERT_THAT(described, IsOk());
  EXPECT_EQ((*described)[0].host, "host-9");
  EXPECT_EQ((*described)[0].device.uuid, "GPU-new");
  EXPECT_EQ(replacement.get()->node_rank, 1);
  EXPECT_EQ(registry_.CounterValue("mesh_coordinator_ranks_lost_total"), 1);
  EXPECT_EQ(registry_.CounterValue("mesh_coordinator_ranks_returned_total"), 1);
  // It is tracked again: silent, it is lost again, named on its new host.
  Silence(1, {0, 1, 2});
  absl::StatusOr<HeartbeatReply> reply = coord_->Heartbeat(Me(0), {});
  ASSERT_THAT(reply, IsOk());
  EXPECT_EQ(reply->membership_epoch, 3);
  ASSERT_EQ(reply->lost.size(), 1u);
  EXPECT_EQ(reply->lost[0].host, "host-9");
  EXPECT_THAT(failures_, IsEmpty());
}

TEST_F(MembershipTest, ANewProcessOfALiveRankReplacesIt) {
  Start(2);
  Result<AliveSet> waiting = Alive(1);
  const Caller old = Me(1);
  incarnations_[1] = 777;
  Result<JoinResult> join;
  coord_->Join(Args(1), join.Done());
  ASSERT_THAT(join.get(), IsOk());
  EXPECT_EQ(join.get()->membership_epoch, 2);
  EXPECT_THAT(waiting.get(), StatusIs(Code::kAborted, HasSubstr("was replaced")));
  EXPECT_THAT(coord_->Heartbeat(old), StatusIs(Code::kAborted));
  EXPECT_THAT(failures_, IsEmpty());
}

TEST_F(MembershipTest, WithoutInPlaceRecoveryADeathFailsTheGenerationAndTheRound) {
  Start(3, /*in_place=*/false);
  Result<AliveSet> a = Alive(0);
  ASSERT_THAT(coord_->ReportError(Me(2), "boom"), IsOk());
  ASSERT_TRUE(a.fired());
  EXPECT_THAT(a.get(), StatusIs(Code::kAborted, HasSubstr("rank 2 (host-2) failed: boom")));
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0].rank, 2);
}

TEST_F(MembershipTest, ALateRankTimesOutNamingTheMissingOnesAndLeavesTheRound) {
  Start(3);
  Result<AliveSet> a = Alive(0, absl::Seconds(5));
  Result<AliveSet> b = Alive(1, absl::Minutes(1));
  for (int i = 0; i < 6; ++i) Beat({0, 1, 2});
  ASSERT_TRUE(a.fired());
  EXPECT_THAT(a.get(), StatusIs(Code::kDeadlineExceeded,
                                AllOf(HasSubstr("AliveRanks round 1"), HasSubstr("2/3 live ranks"),
                                      HasSubstr("missing ranks 2 (host-2)"))));
  EXPECT_FALSE(b.fired());
  // Rank 0 is no longer in the round: rank 2 alone does not complete it.
  Result<AliveSet> c = Alive(2);
  EXPECT_FALSE(c.fired());
  Result<AliveSet> a2 = Alive(0);
  ASSERT_TRUE(a2.fired());
  EXPECT_THAT(RanksOf(*a2.get()), ElementsAre(0, 1, 2));
}

TEST_F(MembershipTest, ARankThatLeavesIsNoLongerWaitedFor) {
  Start(3);
  Result<AliveSet> a = Alive(0);
  Result<AliveSet> b = Alive(1);
  ASSERT_THAT(coord_->Leave(Me(2)), IsOk());
  ASSERT_TRUE(a.fired());
  EXPECT_THAT(RanksOf(*a.get()), ElementsAre(0, 1));
  EXPECT_EQ(a.get()->membership_epoch, 0) << "leaving is no loss";
}

TEST_F(MembershipTest, BeforeTheWorldHasFormedAliveRanksIsFailedPrecondition) {
  JobLayout layout;
  layout.job_id = kJob;
  layout.world_size = 2;
  layout.in_place = true;
  ASSERT_THAT(coord_->CreateJob(layout), IsOk());
  incarnations_ = {100, 101};
  Result<JoinResult> join;
  coord_->Join(Args(0), join.Done());
  EXPECT_THAT(Alive(0).get(), StatusIs(Code::kFailedPrecondition, HasSubstr("1/2 joined")));
}

TEST_F(MembershipTest, ACallAgainReplacesTheEarlierOne) {
  Start(2);
  Result<AliveSet> first = Alive(0);
  Result<AliveSet> second = Alive(0);
  EXPECT_THAT(first.get(), StatusIs(Code::kAborted, HasSubstr("again")));
  EXPECT_FALSE(second.fired());
  Result<AliveSet> other = Alive(1);
  ASSERT_TRUE(second.fired());
  EXPECT_THAT(RanksOf(*second.get()), ElementsAre(0, 1));
}

// The promise of docs/elastic.md: with ranks dying at random moments during
// the calls, every caller of every round gets the same set, and that set is
// exactly the ranks alive when the round completed. Dead ranks are
// replaced by new processes between rounds.
TEST_F(MembershipTest, FiftyRoundsWithRandomDeathsGiveEveryCallerTheSameSet) {
  constexpr int kWorld = 8;
  Start(kWorld);
  std::mt19937 random(20261127);
  std::set<int> alive;
  for (int rank = 0; rank < kWorld; ++rank) alive.insert(rank);
  uint64_t next_incarnation = 1000;
  int deaths = 0;
  for (int round = 1; round <= 50; ++round) {
    std::vector<int> order(alive.begin(), alive.end());
    std::shuffle(order.begin(), order.end(), random);
    std::map<int, Result<AliveSet>> calls;
    std::set<int> died;
    auto completed = [&calls] {
      return std::any_of(calls.begin(), calls.end(),
                         [](const auto& call) { return call.second.fired(); });
    };
    for (int rank : order) {
      // Deaths after the round has completed belong to the next one.
      if (alive.size() > 2 && !completed() && random() % 4 == 0) {
        // A death at a random moment of the round, by any of the ways a
        // rank is lost; it may have called already.
        const int victim = *std::next(alive.begin(), random() % alive.size());
        switch (random() % 3) {
          case 0:
            ASSERT_THAT(coord_->ReportError(Me(victim), "crashed"), IsOk());
            break;
          case 1:
            ASSERT_THAT(coord_->RankExited(kJob, 0, victim, "killed by signal 9"), IsOk());
            break;
          default:
            Silence(victim, alive);
            break;
        }
        alive.erase(victim);
        died.insert(victim);
        ++deaths;
      }
      if (!alive.contains(rank)) continue;
      calls.emplace(rank, Alive(rank, absl::Hours(1)));
    }
    ASSERT_FALSE(calls.empty());
    std::optional<AliveSet> agreed;
    for (auto& [rank, call] : calls) {
      if (died.contains(rank)) {
        // It called, then died before the round completed.
        ASSERT_TRUE(call.fired()) << rank;
        EXPECT_THAT(call.get(), StatusIs(Code::kAborted)) << rank;
        continue;
      }
      ASSERT_TRUE(call.fired()) << "round " << round << " rank " << rank;
      ASSERT_THAT(call.get(), IsOk()) << "round " << round << " rank " << rank;
      if (!agreed.has_value()) agreed = *call.get();
      EXPECT_EQ(call.get()->round, agreed->round);
      EXPECT_EQ(call.get()->membership_epoch, agreed->membership_epoch);
      EXPECT_EQ(call.get()->ranks, agreed->ranks) << "round " << round << " rank " << rank;
    }
    ASSERT_TRUE(agreed.has_value());
    EXPECT_THAT(RanksOf(*agreed), ::testing::ElementsAreArray(alive)) << "round " << round;
    EXPECT_EQ(agreed->round, round);
    // The dead come back as new processes for the next round.
    for (int rank : died) {
      incarnations_[rank] = ++next_incarnation;
      Result<JoinResult> join;
      coord_->Join(Args(rank), join.Done());
      ASSERT_THAT(join.get(), IsOk());
      alive.insert(rank);
    }
  }
  EXPECT_GT(deaths, 20) << "the seed should kill plenty";
  EXPECT_THAT(failures_, IsEmpty());
}

}  // namespace
}  // namespace membership_test
}  // namespace mesh::coordinator
