// Over 800 lines on purpose: Coordination's behaviour, one section per
// concern (jobs, join, the KV store and its limits, fencing, barriers,
// ranks exiting without Leave, unique IDs, liveness), all on one fixture
// with a fake clock and callback capture defined at the top.

#include "coordinator/coordination.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace coordination_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr absl::Duration kHeartbeatInterval = absl::Seconds(1);
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(10);

// Matches text that mentions `n` as a number of its own: not as part of
// another number, nor as either side of a "k/n" count.
::testing::Matcher<const std::string&> MentionsNumber(int n) {
  return ContainsRegex(absl::StrCat("(^|[^0-9/])", n, "([^0-9/]|$)"));
}

// ---- Callback capture ----------------------------------------------------------

// Records what a callback was called with, and how often. The state is shared
// with the callback, so a callback that runs late (say from ~Coordination)
// never writes into a dead stack frame.
template <typename R>
class Captured {
 public:
  absl::AnyInvocable<void(R) &&> Callback() {
    return [state = state_](R result) {
      ++state->calls;
      state->result = std::move(result);
    };
  }

  bool fired() const { return state_->result.has_value(); }
  int calls() const { return state_->calls; }
  // Requires fired().
  const R& result() const { return *state_->result; }

 private:
  struct State {
    std::optional<R> result;
    int calls = 0;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

template <typename T>
using CapturedOr = Captured<absl::StatusOr<T>>;

std::string Id128(char fill) {
  std::string id(128, fill);
  id[0] = '\0';  // Unique IDs are binary.
  id[127] = '\xff';
  return id;
}

// ---- Fixture ---------------------------------------------------------------------

class CoordinationTest : public ::testing::Test {
 protected:
  CoordinationTest() { Recreate(TestOptions()); }

  static CoordinationOptions TestOptions() {
    CoordinationOptions options;
    options.heartbeat_interval = kHeartbeatInterval;
    options.heartbeat_timeout = kHeartbeatTimeout;
    return options;
  }

  void Recreate(const CoordinationOptions& options) {
    ASSERT_THAT(ValidateOptions(options), IsOk());
    coord_.reset();
    coord_ = std::make_unique<Coordination>(&clock_, options);
  }

  Coordination& coord() { return *coord_; }

  static uint64_t Incarnation(int rank, int64_t generation) {
    return 1000 * static_cast<uint64_t>(generation + 1) + static_cast<uint64_t>(rank);
  }

  static Caller Rank(const std::string& job, int rank, int64_t generation = 0) {
    return Caller{job, generation, rank, Incarnation(rank, generation)};
  }

  static JoinArgs Args(const std::string& job, int rank, const std::string& host,
                       int64_t generation = 0, absl::Duration timeout = absl::ZeroDuration()) {
    JoinArgs args;
    args.caller = Rank(job, rank, generation);
    args.host = host;
    args.device = DeviceInfo{"cuda", rank % 8, absl::StrCat("GPU-", rank), "0000:3b:00.0"};
    args.timeout = timeout;
    return args;
  }

  absl::StatusOr<JobInfo> Create(const std::string& job, int world, std::vector<int64_t> shape = {},
                                 std::vector<std::string> names = {}) {
    JobLayout layout;
    layout.job_id = job;
    layout.world_size = world;
    layout.mesh_shape = std::move(shape);
    layout.mesh_dim_names = std::move(names);
    return coord_->CreateJob(std::move(layout));
  }

  // Joins one rank per host (rank i on hosts[i]) to `generation` and returns
  // their results; adds a test failure when any join does not succeed.
  std::vector<JoinResult> JoinAll(const std::string& job, const std::vector<std::string>& hosts,
                                  int64_t generation = 0) {
    std::vector<CapturedOr<JoinResult>> joins(hosts.size());
    for (size_t rank = 0; rank < hosts.size(); ++rank) {
      coord_->Join(Args(job, static_cast<int>(rank), hosts[rank], generation),
                   joins[rank].Callback());
    }
    std::vector<JoinResult> results;
    for (size_t rank = 0; rank < hosts.size(); ++rank) {
      if (!joins[rank].fired()) {
        ADD_FAILURE() << "join of rank " << rank << " did not complete";
        continue;
      }
      if (!joins[rank].result().ok()) {
        ADD_FAILURE() << "join of rank " << rank << ": " << joins[rank].result().status();
        continue;
      }
      results.push_back(*joins[rank].result());
    }
    return results;
  }

  // Creates `job` with one rank per host and joins them all.
  std::vector<JoinResult> StartJob(const std::string& job, const std::vector<std::string>& hosts) {
    const absl::StatusOr<JobInfo> info = Create(job, static_cast<int>(hosts.size()));
    EXPECT_THAT(info, IsOk());
    return JoinAll(job, hosts);
  }

  // A KvGet with wait=false, which must complete at once.
  absl::StatusOr<std::string> TryGet(const Caller& caller, const std::string& key) {
    CapturedOr<std::string> get;
    coord_->KvGet(caller, key, /*wait=*/false, absl::ZeroDuration(), get.Callback());
    if (!get.fired()) return absl::InternalError("KvGet(wait=false) did not complete at once");
    return get.result();
  }

  // Advances time by `total` in one-second steps; after each step, Tick()s
  // and then heartbeats every caller in `alive`.
  void Run(absl::Duration total, const std::vector<Caller>& alive = {}) {
    for (absl::Duration done = absl::ZeroDuration(); done < total; done += absl::Seconds(1)) {
      Step(alive);
    }
  }

  // Like Run, but stops as soon as `pred` holds. Returns whether it held.
  template <typename Pred>
  bool RunUntil(Pred pred, absl::Duration limit, const std::vector<Caller>& alive = {}) {
    for (absl::Duration done = absl::ZeroDuration(); done < limit; done += absl::Seconds(1)) {
      if (pred()) return true;
      Step(alive);
    }
    return pred();
  }

  void Step(const std::vector<Caller>& alive) {
    clock_.Advance(absl::Seconds(1));
    coord_->Tick();
    for (const Caller& caller : alive) {
      EXPECT_THAT(coord_->Heartbeat(caller), IsOk()) << "rank " << caller.rank;
    }
  }

  FakeClock clock_;
  std::unique_ptr<Coordination> coord_;
};

// ---- Options -----------------------------------------------------------------------

TEST_F(CoordinationTest, ValidateOptionsAcceptsDefaultsAndNamesTheBadField) {
  EXPECT_THAT(ValidateOptions(CoordinationOptions()), IsOk());
  EXPECT_THAT(ValidateOptions(TestOptions()), IsOk());

  CoordinationOptions no_interval = TestOptions();
  no_interval.heartbeat_interval = absl::ZeroDuration();
  EXPECT_THAT(ValidateOptions(no_interval),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("heartbeat_interval")));

  CoordinationOptions negative_timeout = TestOptions();
  negative_timeout.heartbeat_timeout = absl::Seconds(-1);
  EXPECT_THAT(ValidateOptions(negative_timeout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("heartbeat_timeout")));
}

TEST(RankHeartbeatIntervalTest, GrowsWithTheJobWithinAThirdOfTheTimeout) {
  const CoordinationOptions defaults;  // 1 s, 10 s, 8192 a second.
  EXPECT_EQ(RankHeartbeatInterval(defaults, 1), absl::Seconds(1));
  EXPECT_EQ(RankHeartbeatInterval(defaults, 8192), absl::Seconds(1));
  EXPECT_EQ(RankHeartbeatInterval(defaults, 16384), absl::Seconds(2));
  EXPECT_EQ(RankHeartbeatInterval(defaults, 65536), absl::Seconds(10) / 3);
  EXPECT_EQ(RankHeartbeatInterval(defaults, 1 << 20), absl::Seconds(10) / 3);

  CoordinationOptions off = defaults;
  off.rank_heartbeat_rate = 0;
  EXPECT_EQ(RankHeartbeatInterval(off, 1 << 20), absl::Seconds(1));

  // Never shorter than the configured interval, even where that exceeds a
  // third of the timeout.
  CoordinationOptions slow = defaults;
  slow.heartbeat_interval = absl::Seconds(4);
  EXPECT_EQ(RankHeartbeatInterval(slow, 1), absl::Seconds(4));
  EXPECT_EQ(RankHeartbeatInterval(slow, 1 << 20), absl::Seconds(4));
}

TEST(RankHeartbeatIntervalTest, ValidateOptionsRefusesABadRate) {
  for (double rate : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    CoordinationOptions options;
    options.rank_heartbeat_rate = rate;
    EXPECT_THAT(ValidateOptions(options),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank_heartbeat_rate")))
        << rate;
  }
  CoordinationOptions off;
  off.rank_heartbeat_rate = 0;
  EXPECT_THAT(ValidateOptions(off), IsOk());
}

// A job's Join replies carry its interval.
TEST_F(CoordinationTest, JoinRepliesCarryTheJobsHeartbeatInterval) {
  CoordinationOptions options = TestOptions();
  options.heartbeat_interval = absl::Seconds(1);
  options.heartbeat_timeout = absl::Seconds(30);
  options.rank_heartbeat_rate = 1;  // 2 ranks: 2 s.
  Recreate(options);
  const std::vector<JoinResult> joined = StartJob("job", {"h", "h"});
  ASSERT_EQ(joined.size(), 2u);
  for (const JoinResult& r : joined) {
    EXPECT_EQ(r.heartbeat_interval, absl::Seconds(2));
    EXPECT_EQ(r.heartbeat_timeout, absl::Seconds(30));
  }
}

TEST_F(CoordinationTest, BarrierUniqueIdAndPerRequestCapsLeaveStateUnchanged) {
  CoordinationOptions options = TestOptions();
  options.max_barriers = 1;
  options.max_unique_ids = 1;
  options.max_keys_per_request = 2;
  options.kv.max_key_bytes = 8;
  for (int64_t CoordinationOptions::*field :
       {&CoordinationOptions::max_barriers, &CoordinationOptions::max_unique_ids,
        &CoordinationOptions::max_keys_per_request}) {
    CoordinationOptions bad = options;
    bad.*field = 0;
    EXPECT_THAT(ValidateOptions(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  }
  Recreate(options);
  StartJob("job", {"h"});
  const Caller r0 = Rank("job", 0);
  CapturedOr<int> first, second, long_name;
  coord().Barrier(r0, "b", {}, absl::Seconds(5), first.Callback());
  ASSERT_TRUE(first.fired());
  EXPECT_THAT(first.result(), IsOk());
  coord().Barrier(r0, "c", {}, absl::Seconds(5), second.Callback());
  ASSERT_TRUE(second.fired());
  EXPECT_THAT(second.result(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("limit of 1")));
  coord().Barrier(r0, "123456789", {}, absl::Seconds(5), long_name.Callback());
  ASSERT_TRUE(long_name.fired());
  EXPECT_THAT(long_name.result(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("limit of 8")));

  ASSERT_THAT(coord().PublishUniqueIds(r0, {{"g", Id128('a')}}), IsOk());
  EXPECT_THAT(coord().PublishUniqueIds(r0, {{"h", Id128('b')}}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("limit of 1")));

  EXPECT_THAT(coord().KvMultiSet(r0, {{"a", "1"}, {"b", "2"}, {"c", "3"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("limit of 2")));
  EXPECT_EQ(coord().KvNumKeys(r0)->num_keys, 0);
  Captured<absl::Status> wait;
  coord().KvWait(r0, {"a", "b", "c"}, absl::Seconds(5), wait.Callback());
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, TickIntervalIsPositive) {
  EXPECT_GT(coord().TickInterval(), absl::ZeroDuration());
}

// ---- Jobs --------------------------------------------------------------------------

TEST_F(CoordinationTest, CreateJobRejectsABadWorldSize) {
  EXPECT_THAT(Create("job", 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Create("job", -4), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(coord().GetJob("job"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CoordinationTest, CreateJobRejectsAShapeWhoseProductIsNotTheWorldSize) {
  EXPECT_THAT(Create("job", 4, {2, 3}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Create("job", 4, {8}), StatusIs(absl::StatusCode::kInvalidArgument));
  // The product matches, but dimensions must be positive.
  EXPECT_THAT(Create("job", 4, {-2, -2}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Create("job", 4, {4, 1}), IsOk());
}

TEST_F(CoordinationTest, CreateJobRejectsBadDimNames) {
  EXPECT_THAT(Create("job", 4, {2, 2}, {"dp", "dp"}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Create("job", 4, {2, 2}, {"dp"}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Create("job", 4, {2, 2}, {"dp", ""}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Create("job", 4, {2, 2}, {"dp", "tp", "pp"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(coord().GetJob("job"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CoordinationTest, CreateJobRejectsBadJobIds) {
  for (const std::string& bad : {std::string("has space"), std::string("a/b"), std::string("tab\t"),
                                 std::string("caf\xc3\xa9"), std::string(129, 'x')}) {
    EXPECT_THAT(Create(bad, 2), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_THAT(Create(std::string(128, 'x'), 2), IsOk());
  EXPECT_THAT(Create("Az09._-", 2), IsOk());
}

TEST_F(CoordinationTest, CreateJobRejectsAnIdInUse) {
  ASSERT_THAT(Create("job", 2), IsOk());
  EXPECT_THAT(Create("job", 4), StatusIs(absl::StatusCode::kAlreadyExists));
  // The original job is untouched.
  const absl::StatusOr<JobInfo> info = coord().GetJob("job");
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->layout.world_size, 2);
}

TEST_F(CoordinationTest, CreateJobNormalizesShapeAndNames) {
  const absl::StatusOr<JobInfo> flat = Create("flat", 4);
  ASSERT_THAT(flat, IsOk());
  EXPECT_EQ(flat->layout.job_id, "flat");
  EXPECT_EQ(flat->layout.world_size, 4);
  EXPECT_THAT(flat->layout.mesh_shape, ElementsAre(4));
  EXPECT_THAT(flat->layout.mesh_dim_names, ElementsAre("dim0"));
  EXPECT_EQ(flat->generation, 0);
  EXPECT_FALSE(flat->failed);

  const absl::StatusOr<JobInfo> grid = Create("grid", 6, {2, 3});
  ASSERT_THAT(grid, IsOk());
  EXPECT_THAT(grid->layout.mesh_shape, ElementsAre(2, 3));
  EXPECT_THAT(grid->layout.mesh_dim_names, ElementsAre("dim0", "dim1"));

  const absl::StatusOr<JobInfo> named = Create("named", 6, {3, 2}, {"dp", "tp"});
  ASSERT_THAT(named, IsOk());
  EXPECT_THAT(named->layout.mesh_dim_names, ElementsAre("dp", "tp"));

  // GetJob returns the normalized layout too.
  const absl::StatusOr<JobInfo> got = coord().GetJob("grid");
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(got->layout.mesh_shape, ElementsAre(2, 3));
  EXPECT_THAT(got->layout.mesh_dim_names, ElementsAre("dim0", "dim1"));
}

TEST_F(CoordinationTest, CreateJobPicksAValidUniqueIdWhenNoneIsGiven) {
  const absl::StatusOr<JobInfo> first = Create("", 2);
  const absl::StatusOr<JobInfo> second = Create("", 2);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  EXPECT_THAT(first->layout.job_id, ::testing::MatchesRegex("[A-Za-z0-9._-]+"));
  EXPECT_LE(first->layout.job_id.size(), 128u);
  EXPECT_NE(first->layout.job_id, second->layout.job_id);
  EXPECT_THAT(coord().GetJob(first->layout.job_id), IsOk());
}

TEST_F(CoordinationTest, GetJobAndBumpGenerationOfAnUnknownJobAreNotFound) {
  EXPECT_THAT(coord().GetJob("nope"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(coord().BumpGeneration("nope", "why"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CoordinationTest, BumpGenerationAdvancesTheGenerationAndClearsAFailure) {
  StartJob("job", {"host-a", "host-b"});
  ASSERT_THAT(coord().ReportError(Rank("job", 1), "boom"), IsOk());
  absl::StatusOr<JobInfo> info = coord().GetJob("job");
  ASSERT_THAT(info, IsOk());
  EXPECT_TRUE(info->failed);

  EXPECT_EQ(coord().BumpGeneration("job", "restart"), absl::StatusOr<int64_t>(1));
  info = coord().GetJob("job");
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 1);
  EXPECT_FALSE(info->failed);
  EXPECT_EQ(coord().BumpGeneration("job", "again"), absl::StatusOr<int64_t>(2));
}

// ---- Join ----------------------------------------------------------------------------

TEST_F(CoordinationTest, JoinCompletesOnlyOnceTheWholeWorldHasJoined) {
  ASSERT_THAT(Create("job", 3), IsOk());
  std::vector<CapturedOr<JoinResult>> joins(3);
  coord().Join(Args("job", 2, "h"), joins[2].Callback());
  coord().Join(Args("job", 0, "h"), joins[0].Callback());
  EXPECT_FALSE(joins[0].fired());
  EXPECT_FALSE(joins[2].fired());
  EXPECT_EQ(coord().PendingWaits(), 2u);

  coord().Join(Args("job", 1, "h"), joins[1].Callback());
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(joins[rank].fired()) << rank;
    EXPECT_EQ(joins[rank].calls(), 1);
    ASSERT_THAT(joins[rank].result(), IsOk());
    EXPECT_EQ(joins[rank].result()->rank, rank);
    EXPECT_EQ(joins[rank].result()->world_size, 3);
  }
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, JoinReportsTheLayoutAndTheNodeTopology) {
  ASSERT_THAT(Create("job", 6, {2, 3}, {"dp", "tp"}), IsOk());
  // Hosts are ordered by their lowest rank, not by name: host-b (rank 0) is
  // node 0, host-a (rank 1) node 1, host-c (rank 3) node 2.
  const std::vector<std::string> hosts = {"host-b", "host-a", "host-b",
                                          "host-c", "host-a", "host-b"};
  const std::vector<JoinResult> results = JoinAll("job", hosts);
  ASSERT_EQ(results.size(), 6u);

  struct Expected {
    int local_rank, local_world_size, node_rank;
  };
  const std::vector<Expected> expected = {{0, 3, 0}, {0, 2, 1}, {1, 3, 0},
                                          {0, 1, 2}, {1, 2, 1}, {2, 3, 0}};
  for (int rank = 0; rank < 6; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const JoinResult& r = results[rank];
    EXPECT_EQ(r.rank, rank);
    EXPECT_EQ(r.world_size, 6);
    EXPECT_EQ(r.local_rank, expected[rank].local_rank);
    EXPECT_EQ(r.local_world_size, expected[rank].local_world_size);
    EXPECT_EQ(r.node_rank, expected[rank].node_rank);
    EXPECT_EQ(r.num_nodes, 3);
    EXPECT_THAT(r.mesh_shape, ElementsAre(2, 3));
    EXPECT_THAT(r.mesh_dim_names, ElementsAre("dp", "tp"));
    EXPECT_EQ(r.generation, 0);
    EXPECT_THAT(r.nccl_unique_id, IsEmpty());
    EXPECT_EQ(r.heartbeat_interval, kHeartbeatInterval);
    EXPECT_EQ(r.heartbeat_timeout, kHeartbeatTimeout);
  }
}

TEST_F(CoordinationTest, DescribeRanksReturnsJoinedRanksInTheOrderGiven) {
  ASSERT_THAT(Create("job", 3), IsOk());
  JoinAll("job", {"host-b", "host-a", "host-b"});
  const absl::StatusOr<std::vector<RankDescription>> ranks =
      coord().DescribeRanks(Rank("job", 0), {2, 1, 0});
  ASSERT_THAT(ranks, IsOk());
  ASSERT_EQ(ranks->size(), 3u);
  EXPECT_EQ((*ranks)[0].rank, 2);
  EXPECT_EQ((*ranks)[0].host, "host-b");
  EXPECT_EQ((*ranks)[0].node_rank, 0);
  EXPECT_EQ((*ranks)[0].local_rank, 1);
  EXPECT_EQ((*ranks)[0].device.uuid, "GPU-2");
  EXPECT_EQ((*ranks)[0].device.kind, "cuda");
  EXPECT_EQ((*ranks)[1].rank, 1);
  EXPECT_EQ((*ranks)[1].host, "host-a");
  EXPECT_EQ((*ranks)[1].node_rank, 1);
  EXPECT_EQ((*ranks)[1].local_rank, 0);
  EXPECT_EQ((*ranks)[2].rank, 0);
  EXPECT_EQ((*ranks)[2].node_rank, 0);

  EXPECT_THAT(coord().DescribeRanks(Rank("job", 0), {3}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(coord().DescribeRanks(Rank("job", 0), std::vector<int>(4097, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CoordinationTest, DescribeRanksOfARankThatHasNotJoinedIsAFailedPrecondition) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> join;
  coord().Join(Args("job", 0, "h"), join.Callback());
  EXPECT_THAT(coord().DescribeRanks(Rank("job", 0), {1}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(CoordinationTest, JoinGivesRankZerosUniqueIdToEveryRank) {
  ASSERT_THAT(Create("job", 3), IsOk());
  const std::string id = Id128('n');
  std::vector<CapturedOr<JoinResult>> joins(3);
  coord().Join(Args("job", 1, "h"), joins[1].Callback());
  JoinArgs args0 = Args("job", 0, "h");
  args0.nccl_unique_id = id;
  coord().Join(std::move(args0), joins[0].Callback());
  coord().Join(Args("job", 2, "h"), joins[2].Callback());
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(joins[rank].fired()) << rank;
    ASSERT_THAT(joins[rank].result(), IsOk());
    EXPECT_EQ(joins[rank].result()->nccl_unique_id, id) << rank;
  }
}

TEST_F(CoordinationTest, JoinRejectsAUniqueIdThatIsNot128Bytes) {
  ASSERT_THAT(Create("job", 2), IsOk());
  for (const size_t size : {size_t{1}, size_t{127}, size_t{129}}) {
    JoinArgs args = Args("job", 0, "h");
    args.nccl_unique_id = std::string(size, 'x');
    CapturedOr<JoinResult> join;
    coord().Join(std::move(args), join.Callback());
    ASSERT_TRUE(join.fired()) << size;
    EXPECT_THAT(join.result(), StatusIs(absl::StatusCode::kInvalidArgument)) << size;
  }
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, JoinRejectsAUniqueIdFromARankOtherThanZero) {
  ASSERT_THAT(Create("job", 2), IsOk());
  JoinArgs args = Args("job", 1, "h");
  args.nccl_unique_id = Id128('n');
  CapturedOr<JoinResult> join;
  coord().Join(std::move(args), join.Callback());
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CoordinationTest, JoinRejectsAnEmptyHost) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> join;
  coord().Join(Args("job", 0, ""), join.Callback());
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CoordinationTest, RejoinWithTheSameIncarnationAfterCompletionReturnsAtOnce) {
  ASSERT_THAT(Create("job", 2), IsOk());
  const std::vector<JoinResult> first = JoinAll("job", {"host-a", "host-b"});
  ASSERT_EQ(first.size(), 2u);

  CapturedOr<JoinResult> again;
  coord().Join(Args("job", 1, "host-b"), again.Callback());
  ASSERT_TRUE(again.fired());
  ASSERT_THAT(again.result(), IsOk());
  EXPECT_EQ(again.result()->rank, 1);
  EXPECT_EQ(again.result()->world_size, 2);
  EXPECT_EQ(again.result()->node_rank, first[1].node_rank);
  EXPECT_EQ(again.result()->generation, 0);
}

TEST_F(CoordinationTest, RejoinWithTheSameIncarnationWhileWaitingWaitsAgain) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> first, second, other;
  coord().Join(Args("job", 0, "h"), first.Callback());
  coord().Join(Args("job", 0, "h"), second.Callback());
  EXPECT_FALSE(second.fired());
  coord().Join(Args("job", 1, "h"), other.Callback());
  ASSERT_TRUE(second.fired());
  EXPECT_THAT(second.result(), IsOk());
  ASSERT_TRUE(other.fired());
  EXPECT_THAT(other.result(), IsOk());
  // Every callback runs exactly once, whatever it got.
  EXPECT_TRUE(first.fired());
  EXPECT_EQ(first.calls(), 1);
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

// A restarted process picks a new incarnation, which fences out its stale
// predecessor (worker.proto's RankContext.incarnation): the newer process
// wins. Before the world forms it simply takes the rank.
TEST_F(CoordinationTest, NewerIncarnationTakesTheRankBeforeTheWorldForms) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> old_join;
  coord().Join(Args("job", 0, "old-host"), old_join.Callback());
  Captured<absl::StatusOr<JobError>> old_watch;
  ASSERT_THAT(coord().Watch(Rank("job", 0), old_watch.Callback()), IsOk());

  JoinArgs newer = Args("job", 0, "new-host");
  newer.caller.incarnation = 999;
  CapturedOr<JoinResult> new_join;
  coord().Join(std::move(newer), new_join.Callback());
  // The older process's waits end at once, saying why.
  ASSERT_TRUE(old_join.fired());
  EXPECT_THAT(old_join.result(), StatusIs(absl::StatusCode::kAborted,
                                          HasSubstr("superseded by a newer process (incarnation "
                                                    "999)")));
  ASSERT_TRUE(old_watch.fired());
  EXPECT_THAT(old_watch.result(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_FALSE(new_join.fired());

  coord().Join(Args("job", 1, "h1"), CapturedOr<JoinResult>().Callback());
  ASSERT_TRUE(new_join.fired());
  ASSERT_THAT(new_join.result(), IsOk());
  // The topology is the newer process's.
  Caller current = Rank("job", 0);
  current.incarnation = 999;
  auto described = coord().DescribeRanks(current, {0});
  ASSERT_THAT(described, IsOk());
  EXPECT_EQ((*described)[0].host, "new-host");
  // The older process is fenced out of everything; the newer one works.
  EXPECT_THAT(coord().KvSet(Rank("job", 0), "k", "old"),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("is fenced out")));
  EXPECT_THAT(coord().Heartbeat(Rank("job", 0)), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(coord().KvSet(current, "k", "new"), IsOk());
  EXPECT_THAT(coord().Heartbeat(current), IsOk());
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

// A superseded process stays stale: it may not join again and take the rank
// back from its successor, and what it did before it was replaced (here, an
// arrival at a barrier) does not count for the rank.
TEST_F(CoordinationTest, ASupersededProcessCannotRejoinAndItsBarrierArrivalIsWithdrawn) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> old_join;
  coord().Join(Args("job", 0, "h0"), old_join.Callback());
  // The older process arrives at a barrier from another thread while its
  // Join waits for rank 1.
  CapturedOr<int> old_barrier;
  coord().Barrier(Rank("job", 0), "sync", {}, absl::Seconds(30), old_barrier.Callback());

  JoinArgs newer = Args("job", 0, "h0");
  newer.caller.incarnation = 999;
  CapturedOr<JoinResult> new_join;
  coord().Join(std::move(newer), new_join.Callback());
  ASSERT_TRUE(old_join.fired());
  ASSERT_TRUE(old_barrier.fired());
  EXPECT_THAT(old_barrier.result(), StatusIs(absl::StatusCode::kAborted));

  // The older process tries to join again: refused, the newer one keeps
  // the rank.
  CapturedOr<JoinResult> rejoin;
  coord().Join(Args("job", 0, "h0"), rejoin.Callback());
  ASSERT_TRUE(rejoin.fired());
  EXPECT_THAT(rejoin.result(), StatusIs(absl::StatusCode::kAborted, HasSubstr("superseded")));
  EXPECT_FALSE(new_join.fired());

  coord().Join(Args("job", 1, "h1"), CapturedOr<JoinResult>().Callback());
  ASSERT_TRUE(new_join.fired());
  ASSERT_THAT(new_join.result(), IsOk());

  // Rank 1 at the barrier does not complete it: rank 0's old arrival was
  // withdrawn, and only the newer process's own arrival completes it.
  Caller current = Rank("job", 0);
  current.incarnation = 999;
  CapturedOr<int> b1, b0;
  coord().Barrier(Rank("job", 1), "sync", {}, absl::Seconds(30), b1.Callback());
  EXPECT_FALSE(b1.fired());
  coord().Barrier(current, "sync", {}, absl::Seconds(30), b0.Callback());
  ASSERT_TRUE(b1.fired());
  EXPECT_THAT(b1.result(), IsOk());
  ASSERT_TRUE(b0.fired());
  EXPECT_THAT(b0.result(), IsOk());
}

TEST_F(CoordinationTest, AMalformedJoinOfANewerIncarnationDisplacesNobody) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> old_join;
  coord().Join(Args("job", 0, "h0"), old_join.Callback());
  JoinArgs bad = Args("job", 0, /*host=*/"");
  bad.caller.incarnation = 999;
  CapturedOr<JoinResult> rejected;
  coord().Join(std::move(bad), rejected.Callback());
  ASSERT_TRUE(rejected.fired());
  EXPECT_THAT(rejected.result(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(old_join.fired()) << "the process that holds rank 0 keeps waiting";
  coord().Join(Args("job", 1, "h1"), CapturedOr<JoinResult>().Callback());
  ASSERT_TRUE(old_join.fired());
  EXPECT_THAT(old_join.result(), IsOk());
}

// Once the world has formed, every peer's groups hold the older process, so
// a newer one ends the generation, naming the rank (XLA's coordination
// service does the same unless told to let a new incarnation reconnect).
TEST_F(CoordinationTest, NewerIncarnationAfterTheWorldFormedFailsTheGenerationNamingIt) {
  ASSERT_THAT(Create("job", 2), IsOk());
  std::vector<JobError> failures;
  coord().SetFailureListener(
      [&failures](const std::string&, const JobError& error) { failures.push_back(error); });
  JoinAll("job", {"h0", "h1"});
  Captured<absl::StatusOr<JobError>> peer_watch;
  ASSERT_THAT(coord().Watch(Rank("job", 0), peer_watch.Callback()), IsOk());

  JoinArgs restarted = Args("job", 1, "h1");
  restarted.caller.incarnation = 999;
  CapturedOr<JoinResult> join;
  coord().Join(std::move(restarted), join.Callback());
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), StatusIs(absl::StatusCode::kAborted,
                                      HasSubstr("rank 1 (h1) failed: was restarted: a new process "
                                                "(incarnation 999)")));
  // Every rank hears of it, with the culprit named.
  ASSERT_TRUE(peer_watch.fired());
  ASSERT_THAT(peer_watch.result(), IsOk());
  EXPECT_EQ(peer_watch.result()->rank, 1);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].rank, 1);
  // The older process of rank 1 is fenced out, not told it may go on.
  EXPECT_THAT(coord().Heartbeat(Rank("job", 1)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("is fenced out")));
  EXPECT_THAT(coord().KvSet(Rank("job", 1), "k", "v"), StatusIs(absl::StatusCode::kAborted));
}

TEST_F(CoordinationTest, JoinOfAnOldGenerationIsAborted) {
  ASSERT_THAT(Create("job", 2), IsOk());
  ASSERT_THAT(coord().BumpGeneration("job", "restart"), IsOk());
  CapturedOr<JoinResult> join;
  coord().Join(Args("job", 0, "h", /*generation=*/0), join.Callback());
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), StatusIs(absl::StatusCode::kAborted));
}

TEST_F(CoordinationTest, JoinOfAnUnknownJobIsNotFound) {
  CapturedOr<JoinResult> join;
  coord().Join(Args("nope", 0, "h"), join.Callback());
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CoordinationTest, JoinWithARankOutOfRangeIsInvalid) {
  ASSERT_THAT(Create("job", 2), IsOk());
  for (const int rank : {-1, 2, 100}) {
    CapturedOr<JoinResult> join;
    coord().Join(Args("job", rank, "h"), join.Callback());
    ASSERT_TRUE(join.fired()) << rank;
    EXPECT_THAT(join.result(), StatusIs(absl::StatusCode::kInvalidArgument)) << rank;
  }
}

TEST_F(CoordinationTest, JoinOfAFutureGenerationIsAFailedPrecondition) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> join;
  coord().Join(Args("job", 0, "h", /*generation=*/1), join.Callback());
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(CoordinationTest, JoinTimesOutWithTheCountAndTheMissingRanks) {
  ASSERT_THAT(Create("job", 5), IsOk());
  std::vector<CapturedOr<JoinResult>> joins(3);
  const std::vector<int> joining = {0, 1, 3};
  for (size_t i = 0; i < joining.size(); ++i) {
    coord().Join(Args("job", joining[i], "host", 0, absl::Seconds(5)), joins[i].Callback());
  }
  clock_.Advance(absl::Seconds(4));
  coord().Tick();
  for (const auto& join : joins) EXPECT_FALSE(join.fired());

  clock_.Advance(absl::Seconds(2));
  coord().Tick();
  for (const auto& join : joins) {
    ASSERT_TRUE(join.fired());
    EXPECT_THAT(join.result(),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         AllOf(HasSubstr("3/5"), MentionsNumber(2), MentionsNumber(4))));
  }
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, JoinAfterBumpGenerationStartsAFreshRendezvous) {
  StartJob("job", {"host-a", "host-b"});
  ASSERT_THAT(coord().BumpGeneration("job", "resize"), IsOk());
  CapturedOr<JoinResult> join;
  coord().Join(Args("job", 0, "host-a", /*generation=*/1), join.Callback());
  // Rank 1 of generation 0 does not count for generation 1.
  EXPECT_FALSE(join.fired());
  const std::vector<JoinResult> results = JoinAll("job", {"host-a", "host-b"}, 1);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].generation, 1);
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), IsOk());
}

// ---- Key-value store ---------------------------------------------------------------

TEST_F(CoordinationTest, KvSetThenGet) {
  StartJob("job", {"h", "h"});
  ASSERT_THAT(coord().KvSet(Rank("job", 0), "key", std::string("va\0lue", 6)), IsOk());
  EXPECT_EQ(TryGet(Rank("job", 1), "key"), absl::StatusOr<std::string>(std::string("va\0lue", 6)));
  ASSERT_THAT(coord().KvSet(Rank("job", 1), "key", "new"), IsOk());
  EXPECT_EQ(TryGet(Rank("job", 0), "key"), absl::StatusOr<std::string>("new"));
  ASSERT_THAT(coord().KvSet(Rank("job", 1), "empty", ""), IsOk());
  EXPECT_EQ(TryGet(Rank("job", 0), "empty"), absl::StatusOr<std::string>(""));
}

TEST_F(CoordinationTest, KvTryGetOfAnAbsentKeyIsNotFound) {
  StartJob("job", {"h", "h"});
  EXPECT_THAT(TryGet(Rank("job", 0), "absent"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, KvBlockingGetCompletesWhenTheKeyIsSet) {
  StartJob("job", {"h", "h", "h"});
  CapturedOr<std::string> get0, get2;
  coord().KvGet(Rank("job", 0), "key", /*wait=*/true, absl::Seconds(30), get0.Callback());
  coord().KvGet(Rank("job", 2), "key", /*wait=*/true, absl::Seconds(30), get2.Callback());
  EXPECT_FALSE(get0.fired());
  EXPECT_EQ(coord().PendingWaits(), 2u);
  ASSERT_THAT(coord().KvSet(Rank("job", 1), "other", "x"), IsOk());
  EXPECT_FALSE(get0.fired());
  ASSERT_THAT(coord().KvSet(Rank("job", 1), "key", "value"), IsOk());
  ASSERT_TRUE(get0.fired());
  ASSERT_TRUE(get2.fired());
  EXPECT_EQ(get0.result(), absl::StatusOr<std::string>("value"));
  EXPECT_EQ(get2.result(), absl::StatusOr<std::string>("value"));
  EXPECT_EQ(coord().PendingWaits(), 0u);

  // A blocking get of a present key completes at once.
  CapturedOr<std::string> get1;
  coord().KvGet(Rank("job", 1), "key", /*wait=*/true, absl::Seconds(30), get1.Callback());
  ASSERT_TRUE(get1.fired());
  EXPECT_EQ(get1.result(), absl::StatusOr<std::string>("value"));
}

TEST_F(CoordinationTest, KvGetTimesOut) {
  StartJob("job", {"h", "h"});
  CapturedOr<std::string> get;
  coord().KvGet(Rank("job", 0), "key", /*wait=*/true, absl::Seconds(5), get.Callback());
  clock_.Advance(absl::Seconds(4));
  coord().Tick();
  EXPECT_FALSE(get.fired());
  clock_.Advance(absl::Seconds(2));
  coord().Tick();
  ASSERT_TRUE(get.fired());
  EXPECT_THAT(get.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(coord().PendingWaits(), 0u);
  // A later set does not run the callback again.
  ASSERT_THAT(coord().KvSet(Rank("job", 1), "key", "v"), IsOk());
  EXPECT_EQ(get.calls(), 1);
}

TEST_F(CoordinationTest, WaitsWithoutATimeoutUseTheDefaultAndAreCappedByTheMaximum) {
  CoordinationOptions options = TestOptions();
  options.default_wait = absl::Seconds(30);
  options.max_wait = absl::Seconds(60);
  Recreate(options);
  StartJob("job", {"h", "h"});
  const std::vector<Caller> alive = {Rank("job", 0), Rank("job", 1)};

  CapturedOr<std::string> defaulted, capped;
  coord().KvGet(Rank("job", 0), "a", /*wait=*/true, absl::ZeroDuration(), defaulted.Callback());
  coord().KvGet(Rank("job", 1), "b", /*wait=*/true, absl::Minutes(10), capped.Callback());
  Run(absl::Seconds(29), alive);
  EXPECT_FALSE(defaulted.fired());
  Run(absl::Seconds(2), alive);
  ASSERT_TRUE(defaulted.fired());
  EXPECT_THAT(defaulted.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  Run(absl::Seconds(27), alive);  // t = 58s
  EXPECT_FALSE(capped.fired());
  Run(absl::Seconds(3), alive);  // t = 61s
  ASSERT_TRUE(capped.fired());
  EXPECT_THAT(capped.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(CoordinationTest, KvAddCountsFromZeroAndReturnsTheNewValue) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  CapturedOr<std::string> waiting;
  coord().KvGet(Rank("job", 1), "n", /*wait=*/true, absl::Seconds(30), waiting.Callback());
  EXPECT_EQ(coord().KvAdd(r0, "n", 5), absl::StatusOr<int64_t>(5));
  ASSERT_TRUE(waiting.fired());
  EXPECT_EQ(waiting.result(), absl::StatusOr<std::string>("5"));
  EXPECT_EQ(coord().KvAdd(Rank("job", 1), "n", -7), absl::StatusOr<int64_t>(-2));
  EXPECT_EQ(TryGet(r0, "n"), absl::StatusOr<std::string>("-2"));
  EXPECT_EQ(coord().KvAdd(r0, "n", 0), absl::StatusOr<int64_t>(-2));

  ASSERT_THAT(coord().KvSet(r0, "set", "40"), IsOk());
  EXPECT_EQ(coord().KvAdd(r0, "set", 2), absl::StatusOr<int64_t>(42));
}

TEST_F(CoordinationTest, KvAddOfANonIntegerValueOrAnOverflowIsInvalid) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  for (const std::string& bad : {std::string("abc"), std::string("12x"), std::string("1.5"),
                                 std::string("99999999999999999999")}) {
    ASSERT_THAT(coord().KvSet(r0, "k", bad), IsOk());
    EXPECT_THAT(coord().KvAdd(r0, "k", 1), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_EQ(TryGet(r0, "k"), absl::StatusOr<std::string>(bad));
  }
  const std::string max = std::to_string(std::numeric_limits<int64_t>::max());
  ASSERT_THAT(coord().KvSet(r0, "max", max), IsOk());
  EXPECT_THAT(coord().KvAdd(r0, "max", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(TryGet(r0, "max"), absl::StatusOr<std::string>(max));
}

TEST_F(CoordinationTest, KvCompareSetWithNoExpectedValueSwapsOnlyAnAbsentKey) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  CapturedOr<std::string> waiting;
  coord().KvGet(Rank("job", 1), "k", /*wait=*/true, absl::Seconds(30), waiting.Callback());

  absl::StatusOr<CompareSetResult> result = coord().KvCompareSet(r0, "k", std::nullopt, "first");
  ASSERT_THAT(result, IsOk());
  EXPECT_TRUE(result->swapped);
  EXPECT_TRUE(result->present);
  EXPECT_EQ(result->value, "first");
  ASSERT_TRUE(waiting.fired());
  EXPECT_EQ(waiting.result(), absl::StatusOr<std::string>("first"));

  result = coord().KvCompareSet(Rank("job", 1), "k", std::nullopt, "second");
  ASSERT_THAT(result, IsOk());
  EXPECT_FALSE(result->swapped);
  EXPECT_TRUE(result->present);
  EXPECT_EQ(result->value, "first");
  EXPECT_EQ(TryGet(r0, "k"), absl::StatusOr<std::string>("first"));
}

TEST_F(CoordinationTest, KvCompareSetSwapsOnlyOnTheExpectedValue) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  ASSERT_THAT(coord().KvSet(r0, "k", "v1"), IsOk());

  absl::StatusOr<CompareSetResult> result = coord().KvCompareSet(r0, "k", "wrong", "v2");
  ASSERT_THAT(result, IsOk());
  EXPECT_FALSE(result->swapped);
  EXPECT_TRUE(result->present);
  EXPECT_EQ(result->value, "v1");
  EXPECT_EQ(TryGet(r0, "k"), absl::StatusOr<std::string>("v1"));

  result = coord().KvCompareSet(r0, "k", "v1", "v2");
  ASSERT_THAT(result, IsOk());
  EXPECT_TRUE(result->swapped);
  EXPECT_TRUE(result->present);
  EXPECT_EQ(result->value, "v2");
  EXPECT_EQ(TryGet(r0, "k"), absl::StatusOr<std::string>("v2"));

  // Expecting a value of an absent key does not create it.
  result = coord().KvCompareSet(r0, "absent", "v1", "v2");
  ASSERT_THAT(result, IsOk());
  EXPECT_FALSE(result->swapped);
  EXPECT_FALSE(result->present);
  EXPECT_THAT(TryGet(r0, "absent"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CoordinationTest, KvDeleteRemovesAKeyOrAPrefixAndCounts) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  for (const char* key : {"a", "a/1", "a/2", "b"}) ASSERT_THAT(coord().KvSet(r0, key, "v"), IsOk());

  EXPECT_EQ(coord().KvDelete(r0, "a", /*prefix=*/false), absl::StatusOr<int64_t>(1));
  EXPECT_THAT(TryGet(r0, "a"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(TryGet(r0, "a/1"), IsOk());
  EXPECT_EQ(coord().KvDelete(r0, "a", /*prefix=*/false), absl::StatusOr<int64_t>(0));
  EXPECT_EQ(coord().KvDelete(r0, "a/", /*prefix=*/true), absl::StatusOr<int64_t>(2));
  EXPECT_THAT(TryGet(r0, "a/1"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(TryGet(r0, "a/2"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(coord().KvDelete(r0, "zzz", /*prefix=*/true), absl::StatusOr<int64_t>(0));
  EXPECT_EQ(TryGet(r0, "b"), absl::StatusOr<std::string>("v"));
  const absl::StatusOr<KvStats> stats = coord().KvNumKeys(r0);
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->num_keys, 1);
  EXPECT_EQ(stats->total_bytes, 2);
}

TEST_F(CoordinationTest, KvListPagesThroughAPrefix) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  for (const char* key : {"b/1", "a/3", "ab", "a/1", "a/2"}) {
    ASSERT_THAT(coord().KvSet(r0, key, "v"), IsOk());
  }

  absl::StatusOr<KvListResult> list = coord().KvList(r0, "a/", "", 2);
  ASSERT_THAT(list, IsOk());
  EXPECT_THAT(list->keys, ElementsAre("a/1", "a/2"));
  EXPECT_TRUE(list->truncated);

  list = coord().KvList(r0, "a/", "a/2", 2);
  ASSERT_THAT(list, IsOk());
  EXPECT_THAT(list->keys, ElementsAre("a/3"));
  EXPECT_FALSE(list->truncated);

  list = coord().KvList(r0, "a/", "", 3);
  ASSERT_THAT(list, IsOk());
  EXPECT_THAT(list->keys, ElementsAre("a/1", "a/2", "a/3"));
  EXPECT_FALSE(list->truncated);

  list = coord().KvList(r0, "a", "", 0);
  ASSERT_THAT(list, IsOk());
  EXPECT_THAT(list->keys, ElementsAre("a/1", "a/2", "a/3", "ab"));
  EXPECT_FALSE(list->truncated);

  list = coord().KvList(r0, "", "", 0);
  ASSERT_THAT(list, IsOk());
  EXPECT_THAT(list->keys, ElementsAre("a/1", "a/2", "a/3", "ab", "b/1"));

  list = coord().KvList(r0, "zz", "", 10);
  ASSERT_THAT(list, IsOk());
  EXPECT_THAT(list->keys, IsEmpty());
  EXPECT_FALSE(list->truncated);

  EXPECT_THAT(coord().KvList(r0, "", "", -1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(coord().KvList(r0, "", "", 10001), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CoordinationTest, KvNumKeysCountsKeysAndBytes) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  absl::StatusOr<KvStats> stats = coord().KvNumKeys(r0);
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->num_keys, 0);
  EXPECT_EQ(stats->total_bytes, 0);

  ASSERT_THAT(coord().KvSet(r0, "ab", "cde"), IsOk());
  ASSERT_THAT(coord().KvSet(r0, "x", ""), IsOk());
  stats = coord().KvNumKeys(Rank("job", 1));
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->num_keys, 2);
  EXPECT_EQ(stats->total_bytes, 2 + 3 + 1 + 0);

  ASSERT_THAT(coord().KvSet(r0, "ab", "c"), IsOk());
  stats = coord().KvNumKeys(r0);
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->num_keys, 2);
  EXPECT_EQ(stats->total_bytes, 2 + 1 + 1 + 0);
}

TEST_F(CoordinationTest, KvWaitCompletesOnlyOnceEveryKeyIsSet) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  Captured<absl::Status> wait;
  coord().KvWait(Rank("job", 1), {"x", "y"}, absl::Seconds(30), wait.Callback());
  EXPECT_FALSE(wait.fired());
  ASSERT_THAT(coord().KvSet(r0, "x", "1"), IsOk());
  EXPECT_FALSE(wait.fired());
  ASSERT_THAT(coord().KvSet(r0, "y", "2"), IsOk());
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), IsOk());
  EXPECT_EQ(wait.calls(), 1);

  Captured<absl::Status> already;
  coord().KvWait(Rank("job", 1), {"y", "x"}, absl::Seconds(30), already.Callback());
  ASSERT_TRUE(already.fired());
  EXPECT_THAT(already.result(), IsOk());
}

TEST_F(CoordinationTest, KvWaitTimesOut) {
  StartJob("job", {"h", "h"});
  ASSERT_THAT(coord().KvSet(Rank("job", 0), "x", "1"), IsOk());
  Captured<absl::Status> wait;
  coord().KvWait(Rank("job", 1), {"x", "y"}, absl::Seconds(5), wait.Callback());
  clock_.Advance(absl::Seconds(6));
  coord().Tick();
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(CoordinationTest, KvMultiGetReturnsValuesInKeyOrder) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  ASSERT_THAT(coord().KvSet(r0, "a", "1"), IsOk());
  ASSERT_THAT(coord().KvSet(r0, "b", "2"), IsOk());

  CapturedOr<std::vector<std::string>> now;
  coord().KvMultiGet(Rank("job", 1), {"b", "a"}, /*wait=*/false, absl::ZeroDuration(),
                     now.Callback());
  ASSERT_TRUE(now.fired());
  ASSERT_THAT(now.result(), IsOk());
  EXPECT_THAT(*now.result(), ElementsAre("2", "1"));

  CapturedOr<std::vector<std::string>> missing;
  coord().KvMultiGet(Rank("job", 1), {"a", "zz"}, /*wait=*/false, absl::ZeroDuration(),
                     missing.Callback());
  ASSERT_TRUE(missing.fired());
  EXPECT_THAT(missing.result(), StatusIs(absl::StatusCode::kNotFound));

  CapturedOr<std::vector<std::string>> waiting;
  coord().KvMultiGet(Rank("job", 1), {"a", "c"}, /*wait=*/true, absl::Seconds(30),
                     waiting.Callback());
  EXPECT_FALSE(waiting.fired());
  ASSERT_THAT(coord().KvSet(r0, "c", "3"), IsOk());
  ASSERT_TRUE(waiting.fired());
  ASSERT_THAT(waiting.result(), IsOk());
  EXPECT_THAT(*waiting.result(), ElementsAre("1", "3"));
}

TEST_F(CoordinationTest, KvMultiSetSetsEveryEntryAndWakesWaiters) {
  StartJob("job", {"h", "h"});
  Captured<absl::Status> wait;
  coord().KvWait(Rank("job", 1), {"x", "y"}, absl::Seconds(30), wait.Callback());
  ASSERT_THAT(coord().KvMultiSet(Rank("job", 0), {{"x", "1"}, {"y", "2"}}), IsOk());
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), IsOk());
  EXPECT_EQ(TryGet(Rank("job", 1), "x"), absl::StatusOr<std::string>("1"));
  EXPECT_EQ(TryGet(Rank("job", 1), "y"), absl::StatusOr<std::string>("2"));
}

// ---- Key-value limits ----------------------------------------------------------------

class CoordinationKvLimitsTest : public CoordinationTest {
 protected:
  CoordinationKvLimitsTest() {
    CoordinationOptions options = TestOptions();
    options.kv.max_key_bytes = 8;
    options.kv.max_value_bytes = 16;
    options.kv.max_total_bytes = 40;
    options.kv.max_keys = 3;
    Recreate(options);
    StartJob("job", {"h", "h"});
  }

  absl::StatusOr<KvStats> Stats() { return coord().KvNumKeys(r0_); }

  const Caller r0_ = Rank("job", 0);
};

TEST_F(CoordinationKvLimitsTest, AKeyTooLongIsRejected) {
  EXPECT_THAT(coord().KvSet(r0_, "123456789", "v"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(TryGet(r0_, "123456789"), Not(IsOk()));
  EXPECT_THAT(coord().KvSet(r0_, "12345678", "v"), IsOk());
  EXPECT_THAT(coord().KvAdd(r0_, "123456789", 1), StatusIs(absl::StatusCode::kResourceExhausted));
  const absl::StatusOr<KvStats> stats = Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->num_keys, 1);
}

TEST_F(CoordinationKvLimitsTest, AValueTooLongIsRejectedAndTheOldValueKept) {
  ASSERT_THAT(coord().KvSet(r0_, "k", "old"), IsOk());
  EXPECT_THAT(coord().KvSet(r0_, "k", std::string(17, 'v')),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(TryGet(r0_, "k"), absl::StatusOr<std::string>("old"));
  EXPECT_THAT(coord().KvCompareSet(r0_, "k", "old", std::string(17, 'v')),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(TryGet(r0_, "k"), absl::StatusOr<std::string>("old"));
  EXPECT_THAT(coord().KvSet(r0_, "k", std::string(16, 'v')), IsOk());
  EXPECT_EQ(TryGet(r0_, "k"), absl::StatusOr<std::string>(std::string(16, 'v')));
}

TEST_F(CoordinationKvLimitsTest, TotalBytesOverQuotaAreRejectedAndDataKept) {
  const std::string big_a(16, 'a'), big_b(16, 'b');
  ASSERT_THAT(coord().KvSet(r0_, "a", big_a), IsOk());  // 17 bytes
  ASSERT_THAT(coord().KvSet(r0_, "b", big_b), IsOk());  // 34 bytes
  EXPECT_THAT(coord().KvSet(r0_, "c", "1234567"),       // would be 42 > 40
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(TryGet(r0_, "a"), absl::StatusOr<std::string>(big_a));
  EXPECT_EQ(TryGet(r0_, "b"), absl::StatusOr<std::string>(big_b));
  EXPECT_THAT(TryGet(r0_, "c"), StatusIs(absl::StatusCode::kNotFound));
  absl::StatusOr<KvStats> stats = Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->num_keys, 2);
  EXPECT_EQ(stats->total_bytes, 34);

  ASSERT_THAT(coord().KvSet(r0_, "c", "123"), IsOk());  // 38 bytes
  // Growing an existing value over the quota fails and keeps the old value.
  EXPECT_THAT(coord().KvSet(r0_, "c", "12345678"),  // would be 43
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(TryGet(r0_, "c"), absl::StatusOr<std::string>("123"));
  stats = Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->total_bytes, 38);
  // Replacing a value by one of the same size is fine at the quota.
  EXPECT_THAT(coord().KvSet(r0_, "a", big_b), IsOk());
}

TEST_F(CoordinationKvLimitsTest, KeyCountOverQuotaIsRejectedAndDataKept) {
  for (const char* key : {"a", "b", "c"}) ASSERT_THAT(coord().KvSet(r0_, key, "1"), IsOk());
  EXPECT_THAT(coord().KvSet(r0_, "d", "1"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(coord().KvAdd(r0_, "e", 1), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(coord().KvCompareSet(r0_, "f", std::nullopt, "1"),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(TryGet(r0_, "d"), StatusIs(absl::StatusCode::kNotFound));
  for (const char* key : {"a", "b", "c"}) {
    EXPECT_EQ(TryGet(r0_, key), absl::StatusOr<std::string>("1")) << key;
  }
  // Overwriting an existing key does not add one.
  EXPECT_THAT(coord().KvSet(r0_, "a", "2"), IsOk());
  // Deleting makes room again.
  ASSERT_EQ(coord().KvDelete(r0_, "b", false), absl::StatusOr<int64_t>(1));
  EXPECT_THAT(coord().KvSet(r0_, "d", "1"), IsOk());
}

TEST_F(CoordinationKvLimitsTest, KvMultiSetIsAllOrNothing) {
  ASSERT_THAT(coord().KvSet(r0_, "a", "old"), IsOk());
  // One value too long.
  EXPECT_THAT(coord().KvMultiSet(r0_, {{"a", "new"}, {"b", "x"}, {"c", std::string(17, 'v')}}),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(TryGet(r0_, "a"), absl::StatusOr<std::string>("old"));
  EXPECT_THAT(TryGet(r0_, "b"), StatusIs(absl::StatusCode::kNotFound));
  // Too many keys together.
  EXPECT_THAT(coord().KvMultiSet(r0_, {{"b", "x"}, {"c", "x"}, {"d", "x"}}),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(TryGet(r0_, "b"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(TryGet(r0_, "c"), StatusIs(absl::StatusCode::kNotFound));
  absl::StatusOr<KvStats> stats = Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->num_keys, 1);
  EXPECT_EQ(stats->total_bytes, 4);

  EXPECT_THAT(coord().KvMultiSet(r0_, {{"a", "new"}, {"b", "x"}}), IsOk());
  EXPECT_EQ(TryGet(r0_, "a"), absl::StatusOr<std::string>("new"));
  EXPECT_EQ(TryGet(r0_, "b"), absl::StatusOr<std::string>("x"));
}

TEST_F(CoordinationKvLimitsTest, LimitErrorsNameTheJobAndGeneration) {
  EXPECT_THAT(coord().KvSet(r0_, "k", std::string(17, 'v')),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("job job generation 0")));
  for (const char* key : {"a", "b", "c"}) ASSERT_THAT(coord().KvAdd(r0_, key, 1), IsOk());
  EXPECT_THAT(coord().KvAdd(r0_, "d", 1),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("job job generation 0")));
}

TEST_F(CoordinationTest, AMultiKeyWaitSeesAKeyDeletedWhileItWaits) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0), r1 = Rank("job", 1);
  CapturedOr<std::vector<std::string>> multi;
  coord().KvMultiGet(r1, {"a", "b"}, /*wait=*/true, absl::Minutes(1), multi.Callback());
  ASSERT_THAT(coord().KvSet(r0, "a", "1"), IsOk());
  ASSERT_EQ(coord().KvDelete(r0, "a", /*prefix=*/false), absl::StatusOr<int64_t>(1));
  ASSERT_THAT(coord().KvSet(r0, "b", "2"), IsOk());
  EXPECT_FALSE(multi.fired()) << "completed although key 'a' is gone";
  ASSERT_THAT(coord().KvSet(r0, "a", "3"), IsOk());
  ASSERT_TRUE(multi.fired());
  ASSERT_THAT(multi.result(), IsOk());
  EXPECT_THAT(*multi.result(), ElementsAre("3", "2"));
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, KvKeysAndUniqueIdKeysAreSeparate) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0), r1 = Rank("job", 1);
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(r1, {"world"}, absl::Minutes(1), ids.Callback());
  CapturedOr<std::string> get;
  coord().KvGet(r1, "nccl", /*wait=*/true, absl::Minutes(1), get.Callback());

  ASSERT_THAT(coord().KvSet(r0, "world", "not an ID"), IsOk());
  ASSERT_THAT(coord().PublishUniqueIds(r0, {{"nccl", Id128('n')}}), IsOk());
  EXPECT_FALSE(ids.fired());
  EXPECT_FALSE(get.fired());

  ASSERT_THAT(coord().PublishUniqueIds(r0, {{"world", Id128('w')}}), IsOk());
  ASSERT_TRUE(ids.fired());
  ASSERT_THAT(ids.result(), IsOk());
  EXPECT_THAT(*ids.result(), ElementsAre(Id128('w')));
  ASSERT_THAT(coord().KvSet(r0, "nccl", "kv"), IsOk());
  ASSERT_TRUE(get.fired());
  EXPECT_EQ(get.result(), absl::StatusOr<std::string>("kv"));
}

TEST_F(CoordinationTest, KeyWaitsTimeOutNamingTheirMissingKeys) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0), r1 = Rank("job", 1);
  ASSERT_THAT(coord().KvSet(r0, "here", "v"), IsOk());
  CapturedOr<std::vector<std::string>> multi;
  coord().KvMultiGet(r1, {"here", "gone"}, /*wait=*/true, absl::Seconds(5), multi.Callback());
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(r1, {"world"}, absl::Seconds(5), ids.Callback());
  clock_.Advance(absl::Seconds(6));
  coord().Tick();
  ASSERT_TRUE(multi.fired());
  EXPECT_THAT(multi.result(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("'gone'"), Not(HasSubstr("'here'")), HasSubstr("set"))));
  ASSERT_TRUE(ids.fired());
  EXPECT_THAT(ids.result(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     AllOf(HasSubstr("'world'"), HasSubstr("published"))));
  // A key set after the wait timed out wakes nothing stale.
  ASSERT_THAT(coord().KvSet(r0, "gone", "late"), IsOk());
  EXPECT_EQ(multi.calls(), 1);
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

// ---- Fencing -----------------------------------------------------------------------------

TEST_F(CoordinationTest, OperationsOfARankThatHasNotJoinedAreAFailedPrecondition) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> join;
  coord().Join(Args("job", 0, "h"), join.Callback());
  const Caller r1 = Rank("job", 1);

  EXPECT_THAT(coord().KvSet(r1, "k", "v"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(TryGet(r1, "k"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(coord().KvAdd(r1, "k", 1), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(coord().KvNumKeys(r1), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(coord().Heartbeat(r1), StatusIs(absl::StatusCode::kFailedPrecondition));
  CapturedOr<int> barrier;
  coord().Barrier(r1, "b", {}, absl::Seconds(5), barrier.Callback());
  ASSERT_TRUE(barrier.fired());
  EXPECT_THAT(barrier.result(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(coord().PublishUniqueIds(r1, {{"g", Id128('a')}}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(CoordinationTest, OperationsOfAStaleIncarnationAreAborted) {
  StartJob("job", {"h", "h"});
  Caller stale = Rank("job", 0);
  stale.incarnation = 999;

  EXPECT_THAT(coord().KvSet(stale, "k", "v"), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(TryGet(stale, "k"), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(coord().KvDelete(stale, "k", false), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(coord().Heartbeat(stale), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(coord().ReportError(stale, "x"), StatusIs(absl::StatusCode::kAborted));
  CapturedOr<int> barrier;
  coord().Barrier(stale, "b", {}, absl::Seconds(5), barrier.Callback());
  ASSERT_TRUE(barrier.fired());
  EXPECT_THAT(barrier.result(), StatusIs(absl::StatusCode::kAborted));
  // The stale process changed nothing.
  EXPECT_THAT(TryGet(Rank("job", 1), "k"), StatusIs(absl::StatusCode::kNotFound));
  const absl::StatusOr<JobInfo> info = coord().GetJob("job");
  ASSERT_THAT(info, IsOk());
  EXPECT_FALSE(info->failed);
}

TEST_F(CoordinationTest, OperationsApplyTheCommonFencingRules) {
  StartJob("job", {"h", "h"});
  EXPECT_THAT(coord().KvSet(Rank("nope", 0), "k", "v"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(coord().KvSet(Rank("job", 2), "k", "v"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(coord().KvSet(Rank("job", -1), "k", "v"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(coord().KvSet(Rank("job", 0, /*generation=*/1), "k", "v"),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(coord().BumpGeneration("job", "restart"), IsOk());
  EXPECT_THAT(coord().KvSet(Rank("job", 0, /*generation=*/0), "k", "v"),
              StatusIs(absl::StatusCode::kAborted));
}

TEST_F(CoordinationTest, KvIsScopedToTheGeneration) {
  StartJob("job", {"h", "h"});
  ASSERT_THAT(coord().KvSet(Rank("job", 0), "old", "v"), IsOk());
  CapturedOr<std::string> get;
  coord().KvGet(Rank("job", 1), "never", /*wait=*/true, absl::Minutes(1), get.Callback());
  Captured<absl::Status> wait;
  coord().KvWait(Rank("job", 0), {"never"}, absl::Minutes(1), wait.Callback());
  CapturedOr<std::vector<std::string>> multi;
  coord().KvMultiGet(Rank("job", 0), {"old", "never"}, /*wait=*/true, absl::Minutes(1),
                     multi.Callback());

  ASSERT_EQ(coord().BumpGeneration("job", "operator restart"), absl::StatusOr<int64_t>(1));
  ASSERT_TRUE(get.fired());
  EXPECT_THAT(get.result(), StatusIs(absl::StatusCode::kAborted, HasSubstr("operator restart")));
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), StatusIs(absl::StatusCode::kAborted));
  ASSERT_TRUE(multi.fired());
  EXPECT_THAT(multi.result(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(coord().PendingWaits(), 0u);

  JoinAll("job", {"h", "h"}, 1);
  EXPECT_THAT(TryGet(Rank("job", 0, 1), "old"), StatusIs(absl::StatusCode::kNotFound));
  const absl::StatusOr<KvStats> stats = coord().KvNumKeys(Rank("job", 1, 1));
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->num_keys, 0);
  // And the old generation can no longer read or write.
  EXPECT_THAT(TryGet(Rank("job", 0, 0), "old"), StatusIs(absl::StatusCode::kAborted));
}

// ---- Barriers --------------------------------------------------------------------------

TEST_F(CoordinationTest, BarrierCompletesForEveryoneOnceAllHaveArrived) {
  StartJob("job", {"h", "h", "h"});
  std::vector<CapturedOr<int>> barriers(3);
  coord().Barrier(Rank("job", 2), "sync", {}, absl::Seconds(30), barriers[2].Callback());
  coord().Barrier(Rank("job", 0), "sync", {}, absl::Seconds(30), barriers[0].Callback());
  EXPECT_FALSE(barriers[0].fired());
  EXPECT_FALSE(barriers[2].fired());
  EXPECT_EQ(coord().PendingWaits(), 2u);
  coord().Barrier(Rank("job", 1), "sync", {}, absl::Seconds(30), barriers[1].Callback());
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(barriers[rank].fired()) << rank;
    EXPECT_EQ(barriers[rank].result(), absl::StatusOr<int>(3)) << rank;
    EXPECT_EQ(barriers[rank].calls(), 1);
  }
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, BarrierOfASubset) {
  StartJob("job", {"h", "h", "h", "h"});
  CapturedOr<int> b1, b3;
  coord().Barrier(Rank("job", 3), "pair", {1, 3}, absl::Seconds(30), b3.Callback());
  EXPECT_FALSE(b3.fired());
  coord().Barrier(Rank("job", 1), "pair", {1, 3}, absl::Seconds(30), b1.Callback());
  ASSERT_TRUE(b1.fired());
  ASSERT_TRUE(b3.fired());
  EXPECT_EQ(b1.result(), absl::StatusOr<int>(2));
  EXPECT_EQ(b3.result(), absl::StatusOr<int>(2));
}

TEST_F(CoordinationTest, BarrierNamesAreIndependent) {
  StartJob("job", {"h", "h"});
  CapturedOr<int> a0, b1;
  coord().Barrier(Rank("job", 0), "a", {}, absl::Seconds(30), a0.Callback());
  coord().Barrier(Rank("job", 1), "b", {}, absl::Seconds(30), b1.Callback());
  EXPECT_FALSE(a0.fired());
  EXPECT_FALSE(b1.fired());
}

TEST_F(CoordinationTest, BarrierTimesOutNamingTheMissingRanksAndHosts) {
  StartJob("job", {"host-a", "host-b", "host-c", "host-d"});
  std::vector<CapturedOr<int>> barriers(4);
  for (const int rank : {0, 1, 3}) {
    // Only the first caller's timeout counts.
    const absl::Duration timeout = rank == 0 ? absl::Seconds(5) : absl::Minutes(1);
    coord().Barrier(Rank("job", rank), "sync", {}, timeout, barriers[rank].Callback());
  }
  clock_.Advance(absl::Seconds(4));
  coord().Tick();
  EXPECT_FALSE(barriers[0].fired());
  clock_.Advance(absl::Seconds(2));
  coord().Tick();
  for (const int rank : {0, 1, 3}) {
    ASSERT_TRUE(barriers[rank].fired()) << rank;
    EXPECT_THAT(barriers[rank].result(),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         AllOf(HasSubstr("3/4"), MentionsNumber(2), HasSubstr("host-c"))))
        << rank;
  }
  EXPECT_FALSE(barriers[2].fired());
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, BarrierWithMismatchedParticipantsFailsForEveryone) {
  StartJob("job", {"h", "h", "h"});
  CapturedOr<int> b0, b1;
  coord().Barrier(Rank("job", 0), "sync", {0, 1, 2}, absl::Seconds(30), b0.Callback());
  coord().Barrier(Rank("job", 1), "sync", {0, 1}, absl::Seconds(30), b1.Callback());
  ASSERT_TRUE(b1.fired());
  EXPECT_THAT(b1.result(), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_TRUE(b0.fired());
  EXPECT_THAT(b0.result(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, BarrierCallerOutsideTheParticipantsIsInvalid) {
  StartJob("job", {"h", "h", "h"});
  CapturedOr<int> outsider;
  coord().Barrier(Rank("job", 2), "pair", {0, 1}, absl::Seconds(30), outsider.Callback());
  ASSERT_TRUE(outsider.fired());
  EXPECT_THAT(outsider.result(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CoordinationTest, BarrierWithBadRanksIsInvalid) {
  StartJob("job", {"h", "h", "h"});
  CapturedOr<int> bad;
  coord().Barrier(Rank("job", 0), "bad", {0, 3}, absl::Seconds(30), bad.Callback());
  ASSERT_TRUE(bad.fired());
  EXPECT_THAT(bad.result(), StatusIs(absl::StatusCode::kInvalidArgument));
  CapturedOr<int> negative;
  coord().Barrier(Rank("job", 0), "negative", {-1, 0}, absl::Seconds(30), negative.Callback());
  ASSERT_TRUE(negative.fired());
  EXPECT_THAT(negative.result(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CoordinationTest, BarrierLateCallerGetsTheCachedResult) {
  StartJob("job", {"h", "h", "h"});
  CapturedOr<int> b0, b1;
  coord().Barrier(Rank("job", 0), "pair", {0, 1}, absl::Seconds(30), b0.Callback());
  coord().Barrier(Rank("job", 1), "pair", {0, 1}, absl::Seconds(30), b1.Callback());
  ASSERT_TRUE(b0.fired());
  ASSERT_EQ(b0.result(), absl::StatusOr<int>(2));

  CapturedOr<int> late;
  coord().Barrier(Rank("job", 0), "pair", {0, 1}, absl::Seconds(30), late.Callback());
  ASSERT_TRUE(late.fired());
  EXPECT_EQ(late.result(), absl::StatusOr<int>(2));
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, BarrierFailsPromptlyWhenAParticipantDies) {
  StartJob("job", {"host-a", "host-b", "host-c"});
  const std::vector<Caller> alive = {Rank("job", 0), Rank("job", 1)};
  CapturedOr<int> b0, b1;
  coord().Barrier(Rank("job", 0), "sync", {}, absl::Minutes(5), b0.Callback());
  coord().Barrier(Rank("job", 1), "sync", {}, absl::Minutes(5), b1.Callback());
  // Rank 2 never heartbeats; its death must end the barrier long before the
  // barrier's own five minutes.
  EXPECT_TRUE(RunUntil([&] { return b0.fired(); }, kHeartbeatTimeout + absl::Seconds(5), alive));
  ASSERT_TRUE(b0.fired());
  ASSERT_TRUE(b1.fired());
  for (const auto* b : {&b0, &b1}) {
    EXPECT_THAT(b->result(), StatusIs(absl::StatusCode::kAborted,
                                      AllOf(HasSubstr("host-c"), MentionsNumber(2))));
  }
}

TEST_F(CoordinationTest, BarrierFailsAtOnceWhenAParticipantReportsAnError) {
  StartJob("job", {"host-a", "host-b", "host-c"});
  CapturedOr<int> b0, b1;
  coord().Barrier(Rank("job", 0), "sync", {}, absl::Minutes(5), b0.Callback());
  coord().Barrier(Rank("job", 1), "sync", {}, absl::Minutes(5), b1.Callback());
  ASSERT_THAT(coord().ReportError(Rank("job", 2), "NCCL watchdog"), IsOk());
  ASSERT_TRUE(b0.fired());
  ASSERT_TRUE(b1.fired());
  for (const auto* b : {&b0, &b1}) {
    EXPECT_THAT(b->result(), StatusIs(absl::StatusCode::kAborted,
                                      AllOf(HasSubstr("host-c"), HasSubstr("NCCL watchdog"),
                                            MentionsNumber(2))));
  }
}

TEST_F(CoordinationTest, BarrierFailsWhenAParticipantLeavesBeforeArriving) {
  StartJob("job", {"h", "h", "h"});
  CapturedOr<int> b0;
  coord().Barrier(Rank("job", 0), "pair", {0, 1}, absl::Minutes(5), b0.Callback());
  EXPECT_FALSE(b0.fired());
  ASSERT_THAT(coord().Leave(Rank("job", 1)), IsOk());
  ASSERT_TRUE(b0.fired());
  EXPECT_THAT(b0.result(), StatusIs(absl::StatusCode::kFailedPrecondition));
  // A clean leave is not a failure of the generation.
  const absl::StatusOr<JobInfo> info = coord().GetJob("job");
  ASSERT_THAT(info, IsOk());
  EXPECT_FALSE(info->failed);
}

// ---- A rank that exits without leaving (RankExited) ------------------------------------------

constexpr char kExit0[] = "exited with code 0 before the job finished";

TEST_F(CoordinationTest, RankExitedFailsAWaitingBarrierAtOnceNamingTheRankHostAndExit) {
  StartJob("job", {"host-a", "host-b", "host-c"});
  CapturedOr<int> b0, b2;
  coord().Barrier(Rank("job", 0), "step", {}, absl::Minutes(5), b0.Callback());
  coord().Barrier(Rank("job", 2), "step", {}, absl::Minutes(5), b2.Callback());
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(Rank("job", 0), watch.Callback()), IsOk());
  EXPECT_FALSE(b0.fired());

  ASSERT_THAT(coord().RankExited("job", 0, 1, kExit0), IsOk());
  // No clock advanced: at once, not at the barrier's deadline.
  for (auto* barrier : {&b0, &b2}) {
    ASSERT_TRUE(barrier->fired());
    EXPECT_THAT(barrier->result(),
                StatusIs(absl::StatusCode::kAborted,
                         AllOf(HasSubstr("rank 1 (host-b)"), HasSubstr(kExit0))));
  }
  ASSERT_TRUE(watch.fired());
  ASSERT_THAT(watch.result(), IsOk());
  EXPECT_EQ(watch.result()->rank, 1);
  EXPECT_EQ(watch.result()->host, "host-b");
  EXPECT_EQ(watch.result()->reason, kExit0);
  const absl::StatusOr<JobInfo> info = coord().GetJob("job");
  ASSERT_THAT(info, IsOk());
  EXPECT_TRUE(info->failed);
}

TEST_F(CoordinationTest, RankExitedFailsAKeyWaitAndAJoinWait) {
  // A key wait: the exited rank would have set it.
  StartJob("kv", {"h0", "h1"});
  CapturedOr<std::string> get;
  coord().KvGet(Rank("kv", 0), "from-rank-1", /*wait=*/true, absl::Minutes(5), get.Callback());
  ASSERT_THAT(coord().RankExited("kv", 0, 1, kExit0), IsOk());
  ASSERT_TRUE(get.fired());
  EXPECT_THAT(get.result(), StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 1 (h1)")));

  // A join wait: the rank exited before joining, so it never will.
  JobLayout layout;
  layout.job_id = "join";
  layout.world_size = 2;
  ASSERT_THAT(coord().CreateJob(layout), IsOk());
  CapturedOr<JoinResult> joined;
  coord().Join(Args("join", 0, "h0", 0, absl::Minutes(5)), joined.Callback());
  ASSERT_FALSE(joined.fired());
  ASSERT_THAT(coord().RankExited("join", 0, 1, kExit0), IsOk());
  ASSERT_TRUE(joined.fired());
  EXPECT_THAT(joined.result(),
              StatusIs(absl::StatusCode::kAborted, AllOf(HasSubstr("rank 1"), HasSubstr(kExit0))));
}

TEST_F(CoordinationTest, RankExitedWithNobodyWaitingIsNamedWhenItsHeartbeatsStop) {
  StartJob("job", {"host-a", "host-b"});
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(Rank("job", 0), watch.Callback()), IsOk());
  // Rank 0 is busy, not waiting: nothing fails yet (it may be finishing).
  ASSERT_THAT(coord().RankExited("job", 0, 1, kExit0), IsOk());
  EXPECT_FALSE(watch.fired());
  // Rank 1 never heartbeats again: the liveness timeout names the exit.
  Run(2 * kHeartbeatTimeout, {Rank("job", 0)});
  ASSERT_TRUE(watch.fired());
  ASSERT_THAT(watch.result(), IsOk());
  EXPECT_EQ(watch.result()->rank, 1);
  EXPECT_EQ(watch.result()->reason, kExit0);
}

TEST_F(CoordinationTest, AWaitParkedAfterARankExitedFailsAtOnce) {
  StartJob("job", {"host-a", "host-b", "host-c"});
  // Nobody waits yet: the generation runs on.
  ASSERT_THAT(coord().RankExited("job", 0, 1, kExit0), IsOk());
  ASSERT_FALSE(coord().GetJob("job")->failed);
  // A barrier that completes at once (rank 1 not in it) is fine.
  CapturedOr<int> pair;
  coord().Barrier(Rank("job", 0), "pair", {0}, absl::Minutes(5), pair.Callback());
  ASSERT_TRUE(pair.fired());
  EXPECT_THAT(pair.result(), IsOk());
  // A wait that would park instead fails at once, naming rank 1.
  CapturedOr<int> world;
  coord().Barrier(Rank("job", 0), "world", {}, absl::Minutes(5), world.Callback());
  ASSERT_TRUE(world.fired());
  EXPECT_THAT(world.result(), StatusIs(absl::StatusCode::kAborted,
                                       AllOf(HasSubstr("rank 1 (host-b)"), HasSubstr(kExit0))));
  EXPECT_TRUE(coord().GetJob("job")->failed);
}

TEST_F(CoordinationTest, RankExitedAfterLeaveOrWithoutRendezvousOrLateIsANoOp) {
  StartJob("job", {"h", "h"});
  CapturedOr<int> b0;
  ASSERT_THAT(coord().Leave(Rank("job", 1)), IsOk());
  coord().Barrier(Rank("job", 0), "solo", {0}, absl::Minutes(5), b0.Callback());
  ASSERT_TRUE(b0.fired());
  CapturedOr<std::string> get;
  coord().KvGet(Rank("job", 0), "k", /*wait=*/true, absl::Minutes(5), get.Callback());
  // Left cleanly: the exit is what was expected.
  ASSERT_THAT(coord().RankExited("job", 0, 1, kExit0), IsOk());
  EXPECT_FALSE(get.fired());
  // A stale generation, an unknown job: late reports, ignored.
  ASSERT_THAT(coord().RankExited("job", 7, 0, kExit0), IsOk());
  ASSERT_THAT(coord().RankExited("nope", 0, 0, kExit0), IsOk());
  EXPECT_FALSE(get.fired());
  EXPECT_THAT(coord().RankExited("job", 0, 2, kExit0),
              StatusIs(absl::StatusCode::kInvalidArgument));

  // Nobody joined (workers that do not use rendezvous): nothing to fail.
  JobLayout layout;
  layout.job_id = "plain";
  layout.world_size = 2;
  ASSERT_THAT(coord().CreateJob(layout), IsOk());
  ASSERT_THAT(coord().RankExited("plain", 0, 0, kExit0), IsOk());
  const absl::StatusOr<JobInfo> info = coord().GetJob("plain");
  ASSERT_THAT(info, IsOk());
  EXPECT_FALSE(info->failed);
  EXPECT_FALSE(coord().GetJob("job")->failed);
}

TEST_F(CoordinationTest, ALateCallAfterTheFailedJobWasRemovedOrRestartedNamesTheCulprit) {
  // Removed after its generation failed: ABORTED with the failure, not
  // NOT_FOUND, for that generation.
  StartJob("job", {"host-a", "host-b"});
  ASSERT_THAT(coord().ReportError(Rank("job", 1), "CUDA error: out of memory"), IsOk());
  ASSERT_THAT(coord().RemoveJob("job", "the job is FAILED"), IsOk());
  CapturedOr<int> late;
  coord().Barrier(Rank("job", 0), "step", {}, absl::Minutes(5), late.Callback());
  ASSERT_TRUE(late.fired());
  EXPECT_THAT(late.result(),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("rank 1 (host-b)"), HasSubstr("out of memory"))));
  EXPECT_THAT(coord().KvSet(Rank("job", 1, /*generation=*/3), "k", "v"),
              StatusIs(absl::StatusCode::kNotFound));
  // Re-created at the next generation: a late call of the failed one is
  // still told why.
  JobLayout layout;
  layout.job_id = "job";
  layout.world_size = 2;
  ASSERT_THAT(coord().CreateJob(layout, /*generation=*/1), IsOk());
  EXPECT_THAT(coord().KvSet(Rank("job", 0), "k", "v"),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("out of memory")));

  // Restarted (BumpGeneration) after a failure: the same.
  StartJob("bumped", {"host-a", "host-b"});
  ASSERT_THAT(coord().ReportError(Rank("bumped", 0), "disk on fire"), IsOk());
  ASSERT_THAT(coord().BumpGeneration("bumped", "restart"), IsOk());
  EXPECT_THAT(coord().KvSet(Rank("bumped", 1), "k", "v"),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("rank 0 (host-a)"), HasSubstr("disk on fire"))));

  // Removed without a failure: unknown, as before.
  StartJob("done", {"h"});
  ASSERT_THAT(coord().RemoveJob("done", "the job is SUCCEEDED"), IsOk());
  EXPECT_THAT(coord().KvSet(Rank("done", 0), "k", "v"), StatusIs(absl::StatusCode::kNotFound));
}

// ---- Unique IDs ------------------------------------------------------------------------------

TEST_F(CoordinationTest, UniqueIdsArePublishedAndReturnedInKeyOrder) {
  StartJob("job", {"h", "h"});
  const std::string world = Id128('w'), pp = Id128('p');
  ASSERT_THAT(coord().PublishUniqueIds(Rank("job", 0), {{"world", world}, {"pp0", pp}}), IsOk());
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("job", 1), {"pp0", "world"}, absl::Seconds(30), ids.Callback());
  ASSERT_TRUE(ids.fired());
  ASSERT_THAT(ids.result(), IsOk());
  EXPECT_THAT(*ids.result(), ElementsAre(pp, world));
}

TEST_F(CoordinationTest, GetUniqueIdsWaitsUntilEveryIdIsPublished) {
  StartJob("job", {"h", "h"});
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("job", 1), {"a", "b"}, absl::Seconds(30), ids.Callback());
  EXPECT_FALSE(ids.fired());
  ASSERT_THAT(coord().PublishUniqueIds(Rank("job", 0), {{"b", Id128('b')}}), IsOk());
  EXPECT_FALSE(ids.fired());
  ASSERT_THAT(coord().PublishUniqueIds(Rank("job", 0), {{"a", Id128('a')}}), IsOk());
  ASSERT_TRUE(ids.fired());
  ASSERT_THAT(ids.result(), IsOk());
  EXPECT_THAT(*ids.result(), ElementsAre(Id128('a'), Id128('b')));
}

TEST_F(CoordinationTest, GetUniqueIdsTimesOut) {
  StartJob("job", {"h", "h"});
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("job", 1), {"a"}, absl::Seconds(5), ids.Callback());
  clock_.Advance(absl::Seconds(6));
  coord().Tick();
  ASSERT_TRUE(ids.fired());
  EXPECT_THAT(ids.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(CoordinationTest, PublishUniqueIdsRejectsTheWrongSize) {
  StartJob("job", {"h", "h"});
  for (const size_t size : {size_t{0}, size_t{127}, size_t{129}}) {
    EXPECT_THAT(coord().PublishUniqueIds(Rank("job", 0), {{"g", std::string(size, 'x')}}),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << size;
  }
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("job", 1), {"g"}, absl::Seconds(5), ids.Callback());
  EXPECT_FALSE(ids.fired());
}

TEST_F(CoordinationTest, RepublishingTheSameIdIsANoOpButADifferentOneIsRejected) {
  StartJob("job", {"h", "h"});
  const std::string id = Id128('a');
  ASSERT_THAT(coord().PublishUniqueIds(Rank("job", 0), {{"g", id}}), IsOk());
  EXPECT_THAT(coord().PublishUniqueIds(Rank("job", 1), {{"g", id}}), IsOk());
  EXPECT_THAT(coord().PublishUniqueIds(Rank("job", 1), {{"g", Id128('b')}}),
              StatusIs(absl::StatusCode::kAlreadyExists));
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("job", 1), {"g"}, absl::Seconds(5), ids.Callback());
  ASSERT_TRUE(ids.fired());
  ASSERT_THAT(ids.result(), IsOk());
  EXPECT_THAT(*ids.result(), ElementsAre(id));
}

TEST_F(CoordinationTest, ANewGenerationNeverSeesAnOldUniqueId) {
  StartJob("job", {"h", "h"});
  ASSERT_THAT(coord().PublishUniqueIds(Rank("job", 0), {{"world", Id128('o')}}), IsOk());
  ASSERT_THAT(coord().BumpGeneration("job", "restart"), IsOk());
  JoinAll("job", {"h", "h"}, 1);
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("job", 1, 1), {"world"}, absl::Seconds(5), ids.Callback());
  EXPECT_FALSE(ids.fired());
  clock_.Advance(absl::Seconds(6));
  coord().Tick();
  ASSERT_TRUE(ids.fired());
  EXPECT_THAT(ids.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  // The new generation may publish its own ID under the same key.
  EXPECT_THAT(coord().PublishUniqueIds(Rank("job", 0, 1), {{"world", Id128('n')}}), IsOk());
}

TEST_F(CoordinationTest, PublishUniqueIdsIsAllOrNothing) {
  StartJob("job", {"h", "h"});
  const Caller r0 = Rank("job", 0);
  // One key with two different IDs in one call.
  EXPECT_THAT(coord().PublishUniqueIds(r0, {{"g", Id128('a')}, {"g", Id128('b')}}),
              StatusIs(absl::StatusCode::kAlreadyExists));
  // A good ID next to a bad one.
  EXPECT_THAT(coord().PublishUniqueIds(r0, {{"h", Id128('h')}, {"bad", "short"}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("job", 1), {"g"}, absl::Seconds(5), ids.Callback());
  CapturedOr<std::vector<std::string>> h;
  coord().GetUniqueIds(Rank("job", 1), {"h"}, absl::Seconds(5), h.Callback());
  EXPECT_FALSE(ids.fired());
  EXPECT_FALSE(h.fired());
}

// ---- Liveness and errors ---------------------------------------------------------------

TEST_F(CoordinationTest, ASilentRankIsDeclaredDeadAndFailsTheGeneration) {
  StartJob("train", {"host-a", "host-b", "host-c"});
  const Caller r0 = Rank("train", 0), r1 = Rank("train", 1), r2 = Rank("train", 2);
  std::vector<Captured<absl::StatusOr<JobError>>> watches(3);
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_THAT(coord().Watch(Rank("train", rank), watches[rank].Callback()), IsOk());
  }
  CapturedOr<std::string> get;
  coord().KvGet(r0, "never", /*wait=*/true, absl::Minutes(1), get.Callback());
  Captured<absl::Status> wait;
  coord().KvWait(r1, {"never"}, absl::Minutes(1), wait.Callback());
  CapturedOr<int> barrier;
  coord().Barrier(r1, "sync", {}, absl::Minutes(1), barrier.Callback());
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(r0, {"world"}, absl::Minutes(1), ids.Callback());
  EXPECT_EQ(coord().PendingWaits(), 7u);

  // Ranks 0 and 1 keep heartbeating; rank 2 goes silent.
  Run(absl::Seconds(9), {r0, r1});
  EXPECT_FALSE(watches[0].fired()) << "declared dead before the heartbeat timeout";
  EXPECT_FALSE(get.fired());
  ASSERT_TRUE(RunUntil([&] { return watches[0].fired(); }, absl::Seconds(6), {r0, r1}))
      << "rank 2 was not declared dead within the heartbeat timeout + 5s";

  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(absl::StrCat("watch of rank ", rank));
    ASSERT_TRUE(watches[rank].fired());
    EXPECT_EQ(watches[rank].calls(), 1);
    ASSERT_THAT(watches[rank].result(), IsOk());
    const JobError& error = *watches[rank].result();
    EXPECT_EQ(error.rank, 2);
    EXPECT_EQ(error.host, "host-c");
    EXPECT_EQ(error.generation, 0);
    EXPECT_THAT(error.reason, Not(IsEmpty()));
    EXPECT_THAT(error.message, AllOf(HasSubstr("host-c"), MentionsNumber(2)));
  }
  // Every pending wait ended at once with ABORTED naming the culprit.
  const auto names_culprit =
      StatusIs(absl::StatusCode::kAborted, AllOf(HasSubstr("host-c"), MentionsNumber(2)));
  ASSERT_TRUE(get.fired());
  EXPECT_THAT(get.result(), names_culprit);
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), names_culprit);
  ASSERT_TRUE(barrier.fired());
  EXPECT_THAT(barrier.result(), names_culprit);
  ASSERT_TRUE(ids.fired());
  EXPECT_THAT(ids.result(), names_culprit);
  EXPECT_EQ(coord().PendingWaits(), 0u);

  // The survivors learn of it through Heartbeat, which itself succeeds.
  for (const Caller& caller : {r0, r1}) {
    const absl::StatusOr<std::optional<JobError>> beat = coord().Heartbeat(caller);
    ASSERT_THAT(beat, IsOk());
    ASSERT_TRUE(beat->has_value());
    EXPECT_EQ((*beat)->rank, 2);
    EXPECT_EQ((*beat)->host, "host-c");
  }
  // Later operations are ABORTED with the error's message.
  EXPECT_THAT(coord().KvSet(r0, "k", "v"), names_culprit);
  CapturedOr<int> late_barrier;
  coord().Barrier(r0, "later", {}, absl::Minutes(1), late_barrier.Callback());
  ASSERT_TRUE(late_barrier.fired());
  EXPECT_THAT(late_barrier.result(), names_culprit);

  const absl::StatusOr<JobInfo> info = coord().GetJob("train");
  ASSERT_THAT(info, IsOk());
  EXPECT_TRUE(info->failed);
}

TEST_F(CoordinationTest, HeartbeatsWithinTheTimeoutNeverCauseAFalsePositive) {
  StartJob("job", {"host-a", "host-b"});
  const std::vector<Caller> ranks = {Rank("job", 0), Rank("job", 1)};
  std::vector<Captured<absl::StatusOr<JobError>>> watches(2);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_THAT(coord().Watch(ranks[rank], watches[rank].Callback()), IsOk());
  }
  // Heartbeat every 9s (0.9x the timeout) for 30 periods, ticking every second.
  for (int period = 0; period < 30; ++period) {
    Run(absl::Seconds(9));
    for (const Caller& caller : ranks) {
      const absl::StatusOr<std::optional<JobError>> beat = coord().Heartbeat(caller);
      ASSERT_THAT(beat, IsOk());
      ASSERT_FALSE(beat->has_value())
          << "false positive in period " << period << ": " << (*beat)->message;
    }
  }
  EXPECT_FALSE(watches[0].fired());
  EXPECT_FALSE(watches[1].fired());
  const absl::StatusOr<JobInfo> info = coord().GetJob("job");
  ASSERT_THAT(info, IsOk());
  EXPECT_FALSE(info->failed);
}

// ---- The coordinator's own delays (server_lag.h) ---------------------------------------

TEST_F(CoordinationTest, TheServersOwnBacklogIsNotBlamedOnASilentRank) {
  StartJob("job", {"host-a", "host-b"});
  const Caller r0 = Rank("job", 0), r1 = Rank("job", 1);
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(r0, watch.Callback()), IsOk());
  ServerLag lag;
  coord().SetServerLag(&lag);

  // The server's probe has waited since now: so may rank 1's heartbeats.
  lag.ProbeSent(clock_.Now());
  Run(absl::Seconds(15), {r0});
  EXPECT_FALSE(watch.fired()) << "rank 1 blamed for 15 s of the server's own backlog";

  // The backlog clears (a probe answered at once) and rank 1 is still
  // silent: now it is dead.
  lag.ProbeAnswered(clock_.Now());
  lag.ProbeSent(clock_.Now());
  lag.ProbeAnswered(clock_.Now());
  ASSERT_TRUE(RunUntil([&] { return watch.fired(); }, absl::Seconds(2), {r0}));
  ASSERT_THAT(watch.result(), IsOk());
  EXPECT_EQ(watch.result()->rank, 1);
  EXPECT_THAT(watch.result()->reason, HasSubstr("no heartbeat for"));
}

TEST_F(CoordinationTest, TheBacklogGraceIsCappedAtOneMoreTimeout) {
  StartJob("job", {"host-a", "host-b"});
  const Caller r0 = Rank("job", 0);
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(r0, watch.Callback()), IsOk());
  ServerLag lag;
  coord().SetServerLag(&lag);
  lag.ProbeSent(clock_.Now());  // Never answered: a server stuck for good.
  Run(absl::Seconds(19), {r0});
  EXPECT_FALSE(watch.fired());
  // Silent for more than twice the timeout: dead whatever the backlog.
  ASSERT_TRUE(RunUntil([&] { return watch.fired(); }, absl::Seconds(3), {r0}));
  EXPECT_EQ(watch.result()->rank, 1);
}

TEST_F(CoordinationTest, AStallOfTheCoordinatorDoesNotCountTowardsSilence) {
  StartJob("job", {"host-a", "host-b"});
  const Caller r0 = Rank("job", 0), r1 = Rank("job", 1);
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(r0, watch.Callback()), IsOk());
  Run(absl::Seconds(5), {r0, r1});
  // The process stops for 30 s (SIGSTOP): no tick, no heartbeat processed.
  // When it runs again, the ticker finds the stall and forgives it before
  // the next liveness check.
  clock_.Advance(absl::Seconds(30));
  coord().ForgiveStall(absl::Seconds(30));
  coord().Tick();
  EXPECT_FALSE(watch.fired()) << "a rank blamed for the coordinator's pause";
  // Forgiving is not forgetting: rank 1, silent from now on, dies on time.
  Run(absl::Seconds(9), {r0});
  EXPECT_FALSE(watch.fired());
  ASSERT_TRUE(RunUntil([&] { return watch.fired(); }, absl::Seconds(3), {r0}));
  EXPECT_EQ(watch.result()->rank, 1);
}

// ---- Hang diagnosis ------------------------------------------------------------------

TEST_F(CoordinationTest, ARankThatNeverEntersTheCollectiveFailsTheGenerationAsAHang) {
  JobLayout layout;
  layout.job_id = "job";
  layout.world_size = 2;
  layout.hang_timeout = absl::Seconds(30);
  ASSERT_THAT(coord().CreateJob(layout), IsOk());
  JoinAll("job", {"host-a", "host-b"});
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(Rank("job", 0), watch.Callback()), IsOk());

  // Rank 0 waits in all_reduce #6; rank 1 is alive (it heartbeats) but
  // stays after #5.
  GroupProgressReport waiting;
  waiting.name = "world";
  waiting.members = {0, 1};
  waiting.entered = 6;
  waiting.completed = 5;
  waiting.pending_kind = v1::COLLECTIVE_KIND_ALL_REDUCE;
  waiting.completed_kind = v1::COLLECTIVE_KIND_ALL_REDUCE;
  GroupProgressReport idle = waiting;
  idle.entered = 5;
  idle.pending_kind = v1::COLLECTIVE_KIND_UNSPECIFIED;

  absl::Duration waited = absl::ZeroDuration();
  for (int second = 1; second <= 40 && !watch.fired(); ++second) {
    clock_.Advance(absl::Seconds(1));
    waited += absl::Seconds(1);
    waiting.waiting = waited;
    idle.since_completed = waited;
    ASSERT_THAT(coord().Heartbeat(Rank("job", 0), {waiting}), IsOk());
    ASSERT_THAT(coord().Heartbeat(Rank("job", 1), {idle}), IsOk());
    // Members go once; later reports leave them out.
    waiting.members.clear();
    idle.members.clear();
    coord().Tick();
    if (second < 30) {
      ASSERT_FALSE(watch.fired()) << "diagnosed after only " << second << " s";
    }
  }
  ASSERT_TRUE(watch.fired());
  ASSERT_THAT(watch.result(), IsOk());
  const JobError& error = *watch.result();
  EXPECT_TRUE(error.hang);
  EXPECT_EQ(error.rank, 1);
  EXPECT_EQ(error.host, "host-b");
  EXPECT_THAT(error.message, HasSubstr("rank 1 (host-b) failed: hang in group 'world'"));
  EXPECT_THAT(error.message, HasSubstr("rank 0 has waited 30 s in all_reduce #6"));
  EXPECT_THAT(error.message, HasSubstr("last: all_reduce #5"));

  // The failed generation's heartbeats now carry the error.
  const absl::StatusOr<HeartbeatReply> beat = coord().Heartbeat(Rank("job", 1), {});
  ASSERT_THAT(beat, IsOk());
  ASSERT_TRUE(beat->error.has_value());
  EXPECT_TRUE(beat->error->hang);
}

TEST_F(CoordinationTest, HeartbeatProgressWithoutKnownMembersAsksForThem) {
  StartJob("job", {"host-a", "host-b"});
  GroupProgressReport report;
  report.name = "world";
  absl::StatusOr<HeartbeatReply> beat = coord().Heartbeat(Rank("job", 0), {report});
  ASSERT_THAT(beat, IsOk());
  EXPECT_TRUE(beat->send_members);
  report.members = {0, 1};
  beat = coord().Heartbeat(Rank("job", 0), {report});
  ASSERT_THAT(beat, IsOk());
  EXPECT_FALSE(beat->send_members);

  std::vector<GroupProgressReport> too_many(HangDetector::kMaxGroupsPerReport + 1, report);
  EXPECT_THAT(coord().Heartbeat(Rank("job", 0), too_many),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("groups")));
}

TEST_F(CoordinationTest, LivenessStartsOnceTheWorldIsComplete) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> j0, j1;
  coord().Join(Args("job", 0, "host-a"), j0.Callback());
  // A slow rendezvous: rank 0 waits in Join, without heartbeating, for
  // longer than the heartbeat timeout.
  Run(3 * kHeartbeatTimeout);
  EXPECT_FALSE(j0.fired());
  coord().Join(Args("job", 1, "host-b"), j1.Callback());
  ASSERT_TRUE(j0.fired());
  ASSERT_THAT(j0.result(), IsOk());
  ASSERT_THAT(j1.result(), IsOk());
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(Rank("job", 1), watch.Callback()), IsOk());
  // Waiting in Join was not silence: nobody is dead right after completion.
  Run(absl::Seconds(5));
  EXPECT_FALSE(watch.fired());
  // But from completion on, silence counts.
  EXPECT_TRUE(RunUntil([&] { return watch.fired(); }, absl::Seconds(15)));
}

TEST_F(CoordinationTest, ConcurrentCallsAreSafe) {
  StartJob("job", {"h", "h", "h", "h"});
  constexpr int kAddsPerThread = 2000;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([this, rank] {
      const Caller caller = Rank("job", rank);
      for (int i = 0; i < kAddsPerThread; ++i) {
        EXPECT_THAT(coord().KvAdd(caller, "counter", 1), IsOk());
        EXPECT_THAT(coord().KvSet(caller, absl::StrCat("r", rank, "/", i % 10), "v"), IsOk());
        EXPECT_THAT(coord().Heartbeat(caller), IsOk());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(TryGet(Rank("job", 0), "counter"),
            absl::StatusOr<std::string>(std::to_string(4 * kAddsPerThread)));
  const absl::StatusOr<KvStats> stats = coord().KvNumKeys(Rank("job", 0));
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->num_keys, 1 + 4 * 10);
}

TEST_F(CoordinationTest, LeaveIsNotAnError) {
  StartJob("job", {"host-a", "host-b"});
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(Rank("job", 0), watch.Callback()), IsOk());
  ASSERT_THAT(coord().Leave(Rank("job", 1)), IsOk());
  // Rank 1 stops heartbeating; well past the timeout nothing fails.
  Run(3 * kHeartbeatTimeout, {Rank("job", 0)});
  EXPECT_FALSE(watch.fired());
  const absl::StatusOr<std::optional<JobError>> beat = coord().Heartbeat(Rank("job", 0));
  ASSERT_THAT(beat, IsOk());
  EXPECT_FALSE(beat->has_value());
  const absl::StatusOr<JobInfo> info = coord().GetJob("job");
  ASSERT_THAT(info, IsOk());
  EXPECT_FALSE(info->failed);
}

TEST_F(CoordinationTest, ReportErrorNamesTheRankHostAndReason) {
  StartJob("job", {"host-a", "host-b", "host-c"});
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(Rank("job", 0), watch.Callback()), IsOk());
  ASSERT_THAT(coord().ReportError(Rank("job", 1), "CUDA error: out of memory"), IsOk());

  ASSERT_TRUE(watch.fired());
  ASSERT_THAT(watch.result(), IsOk());
  EXPECT_EQ(watch.result()->rank, 1);
  EXPECT_EQ(watch.result()->host, "host-b");
  EXPECT_THAT(watch.result()->reason, HasSubstr("CUDA error: out of memory"));
  EXPECT_EQ(watch.result()->generation, 0);
  EXPECT_THAT(
      watch.result()->message,
      AllOf(HasSubstr("host-b"), HasSubstr("CUDA error: out of memory"), MentionsNumber(1)));

  const absl::StatusOr<std::optional<JobError>> beat = coord().Heartbeat(Rank("job", 2));
  ASSERT_THAT(beat, IsOk());
  ASSERT_TRUE(beat->has_value());
  EXPECT_EQ((*beat)->rank, 1);
  EXPECT_EQ((*beat)->host, "host-b");
  EXPECT_EQ((*beat)->message, watch.result()->message);
}

TEST_F(CoordinationTest, ASecondReportErrorDoesNotReplaceTheFirst) {
  StartJob("job", {"host-a", "host-b", "host-c"});
  ASSERT_THAT(coord().ReportError(Rank("job", 1), "first"), IsOk());
  // The second report is a no-op: whether it returns OK or the ABORTED of a
  // failed generation, it must not change the error.
  const absl::Status second = coord().ReportError(Rank("job", 2), "second");
  EXPECT_TRUE(second.ok() || absl::IsAborted(second)) << second;

  const absl::StatusOr<std::optional<JobError>> beat = coord().Heartbeat(Rank("job", 0));
  ASSERT_THAT(beat, IsOk());
  ASSERT_TRUE(beat->has_value());
  EXPECT_EQ((*beat)->rank, 1);
  EXPECT_EQ((*beat)->host, "host-b");
  EXPECT_THAT((*beat)->reason, HasSubstr("first"));
  EXPECT_THAT((*beat)->message, Not(HasSubstr("second")));
}

TEST_F(CoordinationTest, ReportErrorEndsPendingJoinsAtOnce) {
  ASSERT_THAT(Create("job", 3), IsOk());
  CapturedOr<JoinResult> j0, j1;
  coord().Join(Args("job", 0, "host-a"), j0.Callback());
  coord().Join(Args("job", 1, "host-b"), j1.Callback());
  ASSERT_THAT(coord().ReportError(Rank("job", 0), "bad driver"), IsOk());
  ASSERT_TRUE(j0.fired());
  ASSERT_TRUE(j1.fired());
  EXPECT_THAT(j1.result(), StatusIs(absl::StatusCode::kAborted,
                                    AllOf(HasSubstr("bad driver"), HasSubstr("host-a"))));
  EXPECT_THAT(j0.result(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(coord().PendingWaits(), 0u);
  // A join that arrives after the failure is ABORTED too.
  CapturedOr<JoinResult> j2;
  coord().Join(Args("job", 2, "host-c"), j2.Callback());
  ASSERT_TRUE(j2.fired());
  EXPECT_THAT(j2.result(), StatusIs(absl::StatusCode::kAborted, HasSubstr("bad driver")));
}

// ---- Watch ----------------------------------------------------------------------------------

TEST_F(CoordinationTest, WatchAppliesTheCommonFencingRules) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> join;
  coord().Join(Args("job", 0, "h"), join.Callback());
  Captured<absl::StatusOr<JobError>> watch;
  // Rank 1 has not joined: "everything but Join" requires a joined rank.
  EXPECT_THAT(coord().Watch(Rank("job", 1), watch.Callback()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  Caller stale = Rank("job", 0);
  stale.incarnation = 999;
  EXPECT_THAT(coord().Watch(stale, watch.Callback()), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(coord().Watch(Rank("nope", 0), watch.Callback()),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(coord().Watch(Rank("job", 5), watch.Callback()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(coord().Watch(Rank("job", 0, /*generation=*/1), watch.Callback()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(watch.fired());
  EXPECT_EQ(coord().PendingWaits(), 1u);  // Only the join.
}

TEST_F(CoordinationTest, WatchAfterAFailureFiresAtOnce) {
  StartJob("job", {"host-a", "host-b"});
  ASSERT_THAT(coord().ReportError(Rank("job", 1), "boom"), IsOk());
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(Rank("job", 0), watch.Callback()), IsOk());
  ASSERT_TRUE(watch.fired());
  ASSERT_THAT(watch.result(), IsOk());
  EXPECT_EQ(watch.result()->rank, 1);
  EXPECT_EQ(watch.result()->host, "host-b");
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, UnwatchPreventsTheCallback) {
  StartJob("job", {"h", "h"});
  Captured<absl::StatusOr<JobError>> dropped, kept;
  const absl::StatusOr<uint64_t> handle = coord().Watch(Rank("job", 0), dropped.Callback());
  ASSERT_THAT(handle, IsOk());
  const absl::StatusOr<uint64_t> kept_handle = coord().Watch(Rank("job", 1), kept.Callback());
  ASSERT_THAT(kept_handle, IsOk());
  EXPECT_NE(*handle, *kept_handle);
  EXPECT_EQ(coord().PendingWaits(), 2u);

  EXPECT_TRUE(coord().Unwatch(*handle));
  EXPECT_EQ(coord().PendingWaits(), 1u);
  EXPECT_FALSE(coord().Unwatch(*handle));
  ASSERT_THAT(coord().ReportError(Rank("job", 1), "boom"), IsOk());
  EXPECT_FALSE(dropped.fired());
  EXPECT_TRUE(kept.fired());
  // A watch whose callback ran cannot be dropped.
  EXPECT_FALSE(coord().Unwatch(*kept_handle));
}

TEST_F(CoordinationTest, UnwatchNeverDropsAWaitThatIsNotAWatch) {
  StartJob("job", {"h", "h"});
  Captured<absl::StatusOr<JobError>> watch;
  const absl::StatusOr<uint64_t> handle = coord().Watch(Rank("job", 0), watch.Callback());
  ASSERT_THAT(handle, IsOk());
  CapturedOr<std::string> get;
  coord().KvGet(Rank("job", 1), "k", /*wait=*/true, absl::Minutes(1), get.Callback());
  CapturedOr<int> barrier;
  coord().Barrier(Rank("job", 1), "sync", {}, absl::Minutes(1), barrier.Callback());
  ASSERT_EQ(coord().PendingWaits(), 3u);
  // Whatever ids the other waits have, no handle but the watch's drops one.
  for (uint64_t other = 0; other < *handle + 100; ++other) {
    if (other == *handle) continue;
    EXPECT_FALSE(coord().Unwatch(other)) << other;
  }
  EXPECT_EQ(coord().PendingWaits(), 3u);
  EXPECT_TRUE(coord().Unwatch(*handle));
  EXPECT_EQ(coord().PendingWaits(), 2u);
  EXPECT_FALSE(get.fired());
  EXPECT_FALSE(barrier.fired());
}

TEST_F(CoordinationTest, BumpGenerationEndsWatchesAndWaitsWithAborted) {
  StartJob("job", {"h", "h"});
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(Rank("job", 0), watch.Callback()), IsOk());
  CapturedOr<int> barrier;
  coord().Barrier(Rank("job", 1), "sync", {}, absl::Minutes(1), barrier.Callback());
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("job", 1), {"world"}, absl::Minutes(1), ids.Callback());

  ASSERT_THAT(coord().BumpGeneration("job", "scale down"), IsOk());
  ASSERT_TRUE(watch.fired());
  EXPECT_THAT(watch.result(), StatusIs(absl::StatusCode::kAborted, HasSubstr("scale down")));
  ASSERT_TRUE(barrier.fired());
  EXPECT_THAT(barrier.result(), StatusIs(absl::StatusCode::kAborted, HasSubstr("scale down")));
  ASSERT_TRUE(ids.fired());
  EXPECT_THAT(ids.result(), StatusIs(absl::StatusCode::kAborted, HasSubstr("scale down")));
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, BumpGenerationEndsPendingJoinsWithAborted) {
  ASSERT_THAT(Create("job", 2), IsOk());
  CapturedOr<JoinResult> join;
  coord().Join(Args("job", 0, "h"), join.Callback());
  ASSERT_THAT(coord().BumpGeneration("job", "resize"), IsOk());
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), StatusIs(absl::StatusCode::kAborted, HasSubstr("resize")));
}

TEST_F(CoordinationTest, CreateJobAtAStoredGenerationFencesOlderCallers) {
  JobLayout layout;
  layout.job_id = "job";
  layout.world_size = 1;
  auto info = coord().CreateJob(layout, 3);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 3);
  EXPECT_EQ(coord().GetJob("job")->generation, 3);
  JobLayout negative;
  negative.job_id = "neg";
  negative.world_size = 1;
  EXPECT_THAT(coord().CreateJob(negative, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

TEST_F(CoordinationTest, RemoveJobEndsWaitsAndForgetsTheJob) {
  StartJob("job", {"h", "h"});
  CapturedOr<int> barrier;
  coord().Barrier(Rank("job", 1), "sync", {}, absl::Minutes(1), barrier.Callback());
  ASSERT_THAT(coord().RemoveJob("job", "job finished"), IsOk());
  ASSERT_TRUE(barrier.fired());
  EXPECT_THAT(barrier.result(), StatusIs(absl::StatusCode::kAborted, HasSubstr("job finished")));
  EXPECT_EQ(coord().PendingWaits(), 0u);
  EXPECT_THAT(coord().GetJob("job"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(coord().RemoveJob("job", "again"), StatusIs(absl::StatusCode::kNotFound));
  // The id can be used again.
  EXPECT_THAT(Create("job", 2), IsOk());
}

// ---- Callbacks, shutdown, pending waits --------------------------------------------------

TEST_F(CoordinationTest, CallbacksMayCallBackIntoCoordination) {
  StartJob("job", {"h", "h"});
  Coordination* coordination = &coord();
  auto nested = std::make_shared<std::optional<absl::Status>>();
  coord().KvGet(Rank("job", 0), "ping", /*wait=*/true, absl::Minutes(1),
                [coordination, nested](absl::StatusOr<std::string> value) {
                  *nested = coordination->KvSet(Rank("job", 0), "pong", value.value_or("?"));
                });
  ASSERT_THAT(coord().KvSet(Rank("job", 1), "ping", "hello"), IsOk());
  ASSERT_TRUE(nested->has_value());
  EXPECT_THAT(**nested, IsOk());
  EXPECT_EQ(TryGet(Rank("job", 1), "pong"), absl::StatusOr<std::string>("hello"));

  // Also when the completion comes from Tick().
  auto from_tick = std::make_shared<std::optional<absl::Status>>();
  coord().KvGet(Rank("job", 0), "never", /*wait=*/true, absl::Seconds(1),
                [coordination, from_tick](absl::StatusOr<std::string>) {
                  *from_tick = coordination->KvSet(Rank("job", 0), "timed-out", "1");
                });
  clock_.Advance(absl::Seconds(2));
  coord().Tick();
  ASSERT_TRUE(from_tick->has_value());
  EXPECT_THAT(**from_tick, IsOk());
}

TEST_F(CoordinationTest, ShutdownEndsEveryPendingWaitWithUnavailable) {
  StartJob("a", {"h", "h", "h"});
  ASSERT_THAT(Create("b", 2), IsOk());
  CapturedOr<JoinResult> join;
  coord().Join(Args("b", 0, "h"), join.Callback());
  CapturedOr<std::string> get;
  coord().KvGet(Rank("a", 0), "k", /*wait=*/true, absl::Minutes(1), get.Callback());
  Captured<absl::Status> wait;
  coord().KvWait(Rank("a", 1), {"w"}, absl::Minutes(1), wait.Callback());
  CapturedOr<std::vector<std::string>> multi;
  coord().KvMultiGet(Rank("a", 1), {"m"}, /*wait=*/true, absl::Minutes(1), multi.Callback());
  CapturedOr<int> barrier;
  coord().Barrier(Rank("a", 2), "sync", {}, absl::Minutes(1), barrier.Callback());
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("a", 0), {"u"}, absl::Minutes(1), ids.Callback());
  Captured<absl::StatusOr<JobError>> watch;
  ASSERT_THAT(coord().Watch(Rank("a", 0), watch.Callback()), IsOk());
  EXPECT_EQ(coord().PendingWaits(), 7u);

  coord().Shutdown();
  const auto unavailable = StatusIs(absl::StatusCode::kUnavailable);
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), unavailable);
  ASSERT_TRUE(get.fired());
  EXPECT_THAT(get.result(), unavailable);
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), unavailable);
  ASSERT_TRUE(multi.fired());
  EXPECT_THAT(multi.result(), unavailable);
  ASSERT_TRUE(barrier.fired());
  EXPECT_THAT(barrier.result(), unavailable);
  ASSERT_TRUE(ids.fired());
  EXPECT_THAT(ids.result(), unavailable);
  ASSERT_TRUE(watch.fired());
  EXPECT_THAT(watch.result(), unavailable);
  EXPECT_EQ(coord().PendingWaits(), 0u);

  // Idempotent, and nothing runs twice.
  coord().Shutdown();
  coord().Tick();
  EXPECT_EQ(join.calls(), 1);
  EXPECT_EQ(watch.calls(), 1);
}

TEST_F(CoordinationTest, CallsAfterShutdownAreUnavailable) {
  StartJob("a", {"h", "h"});
  coord().Shutdown();
  const auto unavailable = StatusIs(absl::StatusCode::kUnavailable);
  EXPECT_THAT(Create("new", 2), unavailable);
  EXPECT_THAT(coord().BumpGeneration("a", "x"), unavailable);
  EXPECT_THAT(coord().KvSet(Rank("a", 0), "k", "v"), unavailable);
  EXPECT_THAT(TryGet(Rank("a", 0), "k"), unavailable);
  EXPECT_THAT(coord().KvAdd(Rank("a", 0), "k", 1), unavailable);
  EXPECT_THAT(coord().Heartbeat(Rank("a", 0)), unavailable);
  EXPECT_THAT(coord().ReportError(Rank("a", 0), "x"), unavailable);
  EXPECT_THAT(coord().Leave(Rank("a", 0)), unavailable);
  EXPECT_THAT(coord().PublishUniqueIds(Rank("a", 0), {{"g", Id128('g')}}), unavailable);
  Captured<absl::StatusOr<JobError>> watch;
  EXPECT_THAT(coord().Watch(Rank("a", 0), watch.Callback()), unavailable);

  CapturedOr<JoinResult> join;
  coord().Join(Args("a", 0, "h"), join.Callback());
  ASSERT_TRUE(join.fired());
  EXPECT_THAT(join.result(), unavailable);
  CapturedOr<std::string> get;
  coord().KvGet(Rank("a", 0), "k", /*wait=*/true, absl::Minutes(1), get.Callback());
  ASSERT_TRUE(get.fired());
  EXPECT_THAT(get.result(), unavailable);
  CapturedOr<int> barrier;
  coord().Barrier(Rank("a", 0), "sync", {}, absl::Minutes(1), barrier.Callback());
  ASSERT_TRUE(barrier.fired());
  EXPECT_THAT(barrier.result(), unavailable);
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(Rank("a", 0), {"u"}, absl::Minutes(1), ids.Callback());
  ASSERT_TRUE(ids.fired());
  EXPECT_THAT(ids.result(), unavailable);
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

TEST_F(CoordinationTest, PendingWaitsCountsWaitsAndWatches) {
  ASSERT_THAT(Create("job", 2), IsOk());
  EXPECT_EQ(coord().PendingWaits(), 0u);
  CapturedOr<JoinResult> j0, j1;
  coord().Join(Args("job", 0, "h"), j0.Callback());
  EXPECT_EQ(coord().PendingWaits(), 1u);
  coord().Join(Args("job", 1, "h"), j1.Callback());
  EXPECT_EQ(coord().PendingWaits(), 0u);

  const Caller r0 = Rank("job", 0), r1 = Rank("job", 1);
  CapturedOr<std::string> get;
  coord().KvGet(r0, "k", /*wait=*/true, absl::Minutes(1), get.Callback());
  EXPECT_EQ(coord().PendingWaits(), 1u);
  Captured<absl::Status> wait;
  coord().KvWait(r1, {"w"}, absl::Minutes(1), wait.Callback());
  EXPECT_EQ(coord().PendingWaits(), 2u);
  Captured<absl::StatusOr<JobError>> watch;
  const absl::StatusOr<uint64_t> handle = coord().Watch(r0, watch.Callback());
  ASSERT_THAT(handle, IsOk());
  EXPECT_EQ(coord().PendingWaits(), 3u);
  CapturedOr<int> b0, b1;
  coord().Barrier(r0, "sync", {}, absl::Minutes(1), b0.Callback());
  EXPECT_EQ(coord().PendingWaits(), 4u);
  CapturedOr<std::vector<std::string>> ids;
  coord().GetUniqueIds(r1, {"u"}, absl::Minutes(1), ids.Callback());
  EXPECT_EQ(coord().PendingWaits(), 5u);

  // Completions that do not wait do not count.
  CapturedOr<std::string> try_get;
  coord().KvGet(r0, "absent", /*wait=*/false, absl::ZeroDuration(), try_get.Callback());
  EXPECT_EQ(coord().PendingWaits(), 5u);

  ASSERT_THAT(coord().KvSet(r1, "k", "v"), IsOk());
  EXPECT_EQ(coord().PendingWaits(), 4u);
  EXPECT_TRUE(coord().Unwatch(*handle));
  EXPECT_EQ(coord().PendingWaits(), 3u);
  coord().Barrier(r1, "sync", {}, absl::Minutes(1), b1.Callback());
  EXPECT_EQ(coord().PendingWaits(), 2u);
  ASSERT_THAT(coord().PublishUniqueIds(r0, {{"u", Id128('u')}}), IsOk());
  EXPECT_EQ(coord().PendingWaits(), 1u);
  clock_.Advance(absl::Minutes(1) + absl::Seconds(1));
  // Keep the ranks alive across the long step; only the wait's deadline passes.
  ASSERT_THAT(coord().Heartbeat(r0), IsOk());
  ASSERT_THAT(coord().Heartbeat(r1), IsOk());
  coord().Tick();
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(coord().PendingWaits(), 0u);
}

// ---- Re-attaching after a coordinator restart or failover ---------------------------------

TEST_F(CoordinationTest, RanksOfAnAdoptedGenerationReattachOnTheirFirstCall) {
  ASSERT_THAT(Create("job", 2), IsOk());
  // Without AllowReattach, a rank that never joined is refused.
  EXPECT_THAT(coord().Heartbeat(Rank("job", 0)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("has not joined")));
  ASSERT_THAT(coord().AllowReattach("job", 0, {"node-a", "node-b"}), IsOk());
  // Rank 0 comes back with a heartbeat, rank 1 with a KV call: both are in
  // the generation again, with the incarnations they call with.
  EXPECT_THAT(coord().Heartbeat(Rank("job", 0)), IsOk());
  EXPECT_THAT(coord().KvSet(Rank("job", 1), "k", "v"), IsOk());
  absl::StatusOr<std::string> value = TryGet(Rank("job", 0), "k");
  ASSERT_THAT(value, IsOk());
  EXPECT_EQ(*value, "v");
  absl::StatusOr<std::vector<RankDescription>> ranks =
      coord().DescribeRanks(Rank("job", 0), {0, 1});
  ASSERT_THAT(ranks, IsOk());
  EXPECT_EQ((*ranks)[0].host, "node-a");
  EXPECT_EQ((*ranks)[1].host, "node-b");
  // The world is formed again, so liveness runs: a rank that goes silent
  // fails the generation, naming it.
  Run(kHeartbeatTimeout + absl::Seconds(2), {Rank("job", 0)});
  absl::StatusOr<std::optional<JobError>> beat = coord().Heartbeat(Rank("job", 0));
  ASSERT_THAT(beat, IsOk());
  ASSERT_TRUE(beat->has_value());
  EXPECT_EQ((*beat)->rank, 1);
}

TEST_F(CoordinationTest, ReattachingKeepsTheFencingRules) {
  ASSERT_THAT(Create("job", 2), IsOk());
  ASSERT_THAT(coord().AllowReattach("job", 0, {"node-a", "node-b"}), IsOk());
  ASSERT_THAT(coord().Heartbeat(Rank("job", 0)), IsOk());
  // Another process as rank 0 is fenced out: the one that re-attached
  // holds the rank.
  Caller other = Rank("job", 0);
  other.incarnation += 7;
  EXPECT_THAT(coord().Heartbeat(other), StatusIs(absl::StatusCode::kAborted));
  // A generation the job is not at is refused as before.
  EXPECT_THAT(coord().Heartbeat(Rank("job", 1, /*generation=*/1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("does not exist yet")));
}

TEST_F(CoordinationTest, AllowReattachChecksItsArguments) {
  ASSERT_THAT(Create("job", 2), IsOk());
  EXPECT_THAT(coord().AllowReattach("nope", 0, {"a", "b"}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(coord().AllowReattach("job", 3, {"a", "b"}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("generation 0")));
  EXPECT_THAT(coord().AllowReattach("job", 0, {"a"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one host per rank")));
  EXPECT_THAT(coord().AllowReattach("job", 0, {"a", ""}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace coordination_test
}  // namespace mesh::coordinator
