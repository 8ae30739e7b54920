// Failure semantics of ProcessGroupGloo: abort, a peer that stops or dies,
// gloo timeouts, Work::Wait bounds. Ranks are threads; the transport is real
// TCP on 127.0.0.1.
//
// The time bounds asserted here are not performance checks: each is far
// below the gloo timeout the test configures, so exceeding one means the op
// waited for the timeout (the bug these tests exist to catch) instead of
// failing on the signal.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "mesh/process_group_gloo.h"
#include "process_group_gloo_test_util.h"

namespace mesh {
namespace process_group_gloo_failure_test {

using gloo_test::MakeRanks;
using gloo_test::OnRanks;
using gloo_test::Poisoned;
using gloo_test::Ranks;
using gloo_test::TestOptions;
using ::testing::HasSubstr;

// Much longer than any bound below: an op that fails only at its gloo
// timeout fails these tests.
constexpr absl::Duration kLongTimeout = absl::Seconds(60);
constexpr absl::Duration kPrompt = absl::Seconds(10);

GlooOptions LongTimeoutOptions() {
  GlooOptions options = TestOptions();
  options.group.timeout = kLongTimeout;
  return options;
}

// Every test runs over TCP and over the shared-memory path.
class GlooFailure : public ::testing::TestWithParam<bool> {
 protected:
  GlooOptions With(GlooOptions options) const {
    options.shared_memory = GetParam();
    return options;
  }
};

// Polls until the work leaves PENDING or `limit` passes; returns the time it
// took. Used to show that an op is really blocked before acting on it.
void ExpectStillPending(const ProcessGroup::WorkPtr& work, absl::Duration for_at_least) {
  absl::SleepFor(for_at_least);
  EXPECT_FALSE(work->IsCompleted());
  EXPECT_EQ(work->status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(GlooFailure, AbortFailsTheBlockedOpAndQueuedOpsWithTheReason) {
  // Rank 2 stops participating: it ran one all-reduce with the others, then
  // never issues the second. Ranks 0 and 1 block inside gloo until the
  // runtime (here: the test) aborts their groups with the coordinator's
  // reason.
  const int n = 3;
  auto ranks = MakeRanks(n, With(LongTimeoutOptions()));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_EQ(dynamic_cast<ProcessGroupGloo&>(*(*ranks)->world[0]).uses_shared_memory(), GetParam());
  OnRanks(n, [&](int r) {
    Tensor t = Poisoned(DType::kFloat32, {1 << 16});
    auto first = (*ranks)->world[r]->AllReduce(t, ReduceOp::kSum);
    ASSERT_TRUE(first.ok());
    EXPECT_TRUE((*first)->Wait().ok());
  });

  const absl::Status reason =
      absl::UnavailableError("rank 2 (host-b) died: exit code 137 (SIGKILL)");
  std::vector<Tensor> tensors = {Poisoned(DType::kFloat32, {1 << 16}),
                                 Poisoned(DType::kFloat32, {1 << 16})};
  std::vector<ProcessGroup::WorkPtr> blocked, queued;
  for (int r = 0; r < 2; ++r) {
    auto w = (*ranks)->world[r]->AllReduce(tensors[r], ReduceOp::kSum);
    ASSERT_TRUE(w.ok());
    blocked.push_back(*w);
    auto q = (*ranks)->world[r]->Broadcast(tensors[r], 0);
    ASSERT_TRUE(q.ok());
    queued.push_back(*q);
  }
  ExpectStillPending(blocked[0], absl::Milliseconds(300));
  ExpectStillPending(blocked[1], absl::Milliseconds(10));

  const absl::Time start = absl::Now();
  (*ranks)->world[0]->Abort(reason);
  (*ranks)->world[1]->Abort(reason);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(blocked[r]->Wait(kPrompt), reason) << "rank " << r;
    EXPECT_EQ(queued[r]->Wait(kPrompt), reason) << "rank " << r;
    EXPECT_EQ((*ranks)->world[r]->health(), reason);
  }
  EXPECT_LT(absl::Now() - start, kPrompt);
  // Rank 2's group saw its connections close; its next op fails at once.
  Tensor t = Poisoned(DType::kFloat32, {16});
  auto late = (*ranks)->world[2]->AllReduce(t, ReduceOp::kSum);
  if (late.ok()) {
    const absl::Status s = (*late)->Wait(kPrompt);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  }
}

TEST_P(GlooFailure, OpsAfterAbortFailAtOnceWithTheFirstReason) {
  auto ranks = MakeRanks(2, With(TestOptions()));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ProcessGroup& g = *(*ranks)->world[0];
  const absl::Status reason = absl::AbortedError("job generation 3 was restarted");
  g.Abort(reason);
  g.Abort(absl::InternalError("a later reason is ignored"));
  EXPECT_EQ(g.health(), reason);
  Tensor t = Poisoned(DType::kFloat32, {4});
  Tensor t2 = Poisoned(DType::kFloat32, {8});
  EXPECT_EQ(g.AllReduce(t, ReduceOp::kSum).status(), reason);
  EXPECT_EQ(g.Broadcast(t, 0).status(), reason);
  EXPECT_EQ(g.Reduce(t, 0, ReduceOp::kMax).status(), reason);
  EXPECT_EQ(g.AllGather(t, t2).status(), reason);
  EXPECT_EQ(g.ReduceScatter(t2, t, ReduceOp::kSum).status(), reason);
  EXPECT_EQ(g.AllToAll(t, t).status(), reason);
  EXPECT_EQ(g.Send(t, 1).status(), reason);
  EXPECT_EQ(g.Recv(t, 1).status(), reason);
  EXPECT_EQ(g.Barrier().status(), reason);
  // Bad arguments are still reported as such.
  EXPECT_EQ(g.Broadcast(t, 7).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(GlooFailure, DestroyingAPeerGroupFailsPendingOpsWithUnavailable) {
  // The stand-in for a process death: rank 2 destroys its group (closing
  // its sockets) while ranks 0 and 1 wait in an all-reduce. They fail with
  // UNAVAILABLE long before their 60 s gloo timeout.
  const int n = 3;
  auto ranks = MakeRanks(n, With(LongTimeoutOptions()));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<Tensor> tensors = {Poisoned(DType::kFloat32, {1021}),
                                 Poisoned(DType::kFloat32, {1021})};
  std::vector<ProcessGroup::WorkPtr> works;
  for (int r = 0; r < 2; ++r) {
    auto w = (*ranks)->world[r]->AllReduce(tensors[r], ReduceOp::kSum);
    ASSERT_TRUE(w.ok());
    works.push_back(*w);
  }
  ExpectStillPending(works[0], absl::Milliseconds(300));

  const absl::Time start = absl::Now();
  (*ranks)->world[2].reset();
  (*ranks)->factories[2].reset();
  for (int r = 0; r < 2; ++r) {
    const absl::Status s = works[r]->Wait(kPrompt);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << "rank " << r << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("gloo group 'world'"));
  }
  EXPECT_LT(absl::Now() - start, kPrompt);
}

TEST_P(GlooFailure, AnErrorNamesThePeerRankTheOpWaitedOn) {
  // Two ranks: rank 0 waits in a broadcast from rank 1, which goes away.
  auto ranks = MakeRanks(2, With(LongTimeoutOptions()));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  Tensor t = Poisoned(DType::kInt32, {8});
  auto w = (*ranks)->world[0]->Broadcast(t, 1);
  ASSERT_TRUE(w.ok());
  ExpectStillPending(*w, absl::Milliseconds(200));
  // The factory holds the world group too (World() returns it again).
  (*ranks)->world[1].reset();
  (*ranks)->factories[1].reset();
  const absl::Status s = (*w)->Wait(kPrompt);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("group rank 1 (world rank 1)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("broadcast"));
  // The failure aborted the group: later ops fail synchronously with it.
  EXPECT_EQ((*ranks)->world[0]->health(), s);
  EXPECT_EQ((*ranks)->world[0]->Barrier().status(), s);
}

TEST_P(GlooFailure, WorkAbortAbortsTheGroupAndPeersFailPromptly) {
  auto ranks = MakeRanks(2, With(LongTimeoutOptions()));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  Tensor t0 = Poisoned(DType::kFloat32, {64});
  Tensor t1 = Poisoned(DType::kFloat32, {64});
  // Rank 0 waits for a message rank 1 never sends; rank 1 sits in a
  // barrier rank 0 never joins.
  auto recv = (*ranks)->world[0]->Recv(t0, 1, 5);
  ASSERT_TRUE(recv.ok());
  auto barrier = (*ranks)->world[1]->Barrier();
  ASSERT_TRUE(barrier.ok());
  ExpectStillPending(*recv, absl::Milliseconds(200));

  const absl::Status reason = absl::CancelledError("user cancelled step 41");
  const absl::Time start = absl::Now();
  (*recv)->Abort(reason);
  EXPECT_EQ((*recv)->Wait(kPrompt), reason);
  EXPECT_EQ((*ranks)->world[0]->health(), reason);
  const absl::Status peer = (*barrier)->Wait(kPrompt);
  EXPECT_EQ(peer.code(), absl::StatusCode::kUnavailable) << peer;
  EXPECT_LT(absl::Now() - start, kPrompt);
}

TEST_P(GlooFailure, AnOpPastTheGlooTimeoutFailsWithDeadlineExceeded) {
  GlooOptions options = With(TestOptions());
  options.group.timeout = absl::Seconds(1);
  auto ranks = MakeRanks(2, options);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  Tensor t = Poisoned(DType::kFloat32, {100});
  auto w = (*ranks)->world[0]->AllReduce(t, ReduceOp::kSum);  // Rank 1 never joins.
  ASSERT_TRUE(w.ok());
  const absl::Status s = (*w)->Wait(absl::Seconds(20));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce"));
  // The timeout closed the pairs, so the peer fails fast, not at its own
  // timeout.
  Tensor u = Poisoned(DType::kFloat32, {100});
  auto late = (*ranks)->world[1]->AllReduce(u, ReduceOp::kSum);
  ASSERT_TRUE(late.ok());
  const absl::Status peer = (*late)->Wait(absl::Seconds(20));
  EXPECT_FALSE(peer.ok());
}

TEST_P(GlooFailure, WaitNeverBlocksPastItsTimeout) {
  auto ranks = MakeRanks(2, With(LongTimeoutOptions()));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  Tensor t = Poisoned(DType::kFloat32, {8});
  auto w = (*ranks)->world[0]->AllReduce(t, ReduceOp::kSum);
  ASSERT_TRUE(w.ok());
  for (absl::Duration timeout : {absl::ZeroDuration(), absl::Milliseconds(50)}) {
    const absl::Time start = absl::Now();
    EXPECT_EQ((*w)->Wait(timeout).code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  EXPECT_FALSE((*w)->IsCompleted());
  // The op kept running: the peer's matching op completes both.
  Tensor u = Poisoned(DType::kFloat32, {8});
  auto peer = (*ranks)->world[1]->AllReduce(u, ReduceOp::kSum);
  ASSERT_TRUE(peer.ok());
  EXPECT_TRUE((*peer)->Wait().ok());
  EXPECT_TRUE((*w)->Wait().ok());
  EXPECT_TRUE((*w)->IsCompleted());
  EXPECT_TRUE((*w)->status().ok());
}

INSTANTIATE_TEST_SUITE_P(TcpAndShm, GlooFailure, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "tcp"; });

TEST(GlooFactoryFailure, RendezvousWithAMissingRankTimesOut) {
  GlooOptions options = TestOptions();
  options.group.timeout = absl::Seconds(1);
  auto store = std::make_shared<InMemoryStore>();
  auto factory = GlooProcessGroupFactory::Create(store, 0, 2, options);
  ASSERT_TRUE(factory.ok());
  const absl::Time start = absl::Now();
  auto world = (*factory)->World();  // Rank 1 never shows up.
  EXPECT_EQ(world.status().code(), absl::StatusCode::kDeadlineExceeded) << world.status();
  EXPECT_THAT(std::string(world.status().message()), HasSubstr("rendezvous"));
  EXPECT_LT(absl::Now() - start, kPrompt);
}

TEST(GlooFactoryFailure, AbortAllAbortsEveryGroupAndLaterOnes) {
  auto ranks = MakeRanks(2);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const absl::Status reason = absl::UnavailableError("rank 1 (host-a) missed 3 heartbeats");
  (*ranks)->factories[0]->AbortAll(reason);
  EXPECT_EQ((*ranks)->world[0]->health(), reason);
  EXPECT_EQ((*ranks)->factories[0]->NewGroups({{"late", 0, {0}}}).status(), reason);
}

}  // namespace process_group_gloo_failure_test
}  // namespace mesh
