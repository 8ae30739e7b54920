// GroupProgress and ProgressRegistry with explicit times, and the
// ProgressProcessGroup decorator over a scripted group.
#include "mesh/progress.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/time/time.h"
#include "libmesh/src/progress_group.h"

namespace mesh {
namespace progress_test {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

// A Work whose completion the test sets.
class ScriptedWork final : public Work {
 public:
  using Work::Wait;
  absl::Status Wait(absl::Duration) override {
    return done_ ? absl::OkStatus() : absl::DeadlineExceededError("pending");
  }
  bool IsCompleted() const override { return done_; }
  absl::Status status() const override {
    return done_ ? absl::OkStatus() : absl::FailedPreconditionError("pending");
  }
  void Abort(absl::Status) override { done_ = true; }
  void Finish() { done_ = true; }

 protected:
  absl::Duration default_timeout() const override { return absl::Seconds(1); }

 private:
  std::atomic<bool> done_{false};
};

TEST(CollectiveKindTest, NamesRoundTrip) {
  for (int i = 0; i < kNumCollectiveKinds; ++i) {
    const auto kind = static_cast<CollectiveKind>(i);
    EXPECT_EQ(CollectiveKindFromName(CollectiveKindName(kind)), kind) << i;
  }
  EXPECT_EQ(CollectiveKindName(CollectiveKind::kAllReduce), "all_reduce");
  EXPECT_EQ(CollectiveKindFromName("all_gather_object"), CollectiveKind::kOther);
}

TEST(GroupProgressTest, NumbersOpsAndTracksTheWaitOfTheOldestPendingOne) {
  GroupProgress group("tp", {0, 1}, kT0);
  GroupProgressSnapshot s = group.Snapshot(kT0 + absl::Seconds(5));
  EXPECT_EQ(s.entered, 0u);
  EXPECT_EQ(s.completed, 0u);
  EXPECT_EQ(s.since_completed, absl::Seconds(5));
  EXPECT_EQ(s.waiting, absl::ZeroDuration());

  EXPECT_EQ(group.Enter(CollectiveKind::kAllReduce, kT0 + absl::Seconds(10)), 1u);
  EXPECT_EQ(group.Enter(CollectiveKind::kBroadcast, kT0 + absl::Seconds(11)), 2u);
  s = group.Snapshot(kT0 + absl::Seconds(12));
  EXPECT_EQ(s.entered, 2u);
  EXPECT_EQ(s.completed, 0u);
  EXPECT_EQ(s.pending_kind, CollectiveKind::kAllReduce);
  EXPECT_EQ(s.waiting, absl::Seconds(2));

  // Op 2 completes first: the watermark waits for op 1.
  group.Complete(2, kT0 + absl::Seconds(13));
  EXPECT_EQ(group.Snapshot(kT0 + absl::Seconds(13)).completed, 0u);
  group.Complete(1, kT0 + absl::Seconds(14));
  s = group.Snapshot(kT0 + absl::Seconds(20));
  EXPECT_EQ(s.completed, 2u);
  EXPECT_EQ(s.completed_kind, CollectiveKind::kBroadcast);
  EXPECT_EQ(s.pending_kind, CollectiveKind::kNone);
  EXPECT_EQ(s.since_completed, absl::Seconds(6));

  // Unknown and repeated completions are ignored.
  group.Complete(2, kT0 + absl::Seconds(30));
  group.Complete(99, kT0 + absl::Seconds(30));
  EXPECT_EQ(group.Snapshot(kT0 + absl::Seconds(30)).completed, 2u);
}

TEST(GroupProgressTest, AnOpStartsWhenTheOneBeforeItCompletes) {
  GroupProgress group("world", {0, 1}, kT0);
  group.Enter(CollectiveKind::kAllReduce, kT0);
  group.Enter(CollectiveKind::kAllGather, kT0);
  group.Complete(1, kT0 + absl::Seconds(50));
  const GroupProgressSnapshot s = group.Snapshot(kT0 + absl::Seconds(60));
  EXPECT_EQ(s.pending_kind, CollectiveKind::kAllGather);
  // Entered at 0, started at 50 when op 1 completed.
  EXPECT_EQ(s.waiting, absl::Seconds(10));
}

TEST(GroupProgressTest, SnapshotSeesAnAttachedWorkComplete) {
  GroupProgress group("world", {0, 1}, kT0);
  auto work = std::make_shared<ScriptedWork>();
  const uint64_t seq = group.Enter(CollectiveKind::kAllReduce, kT0);
  group.Attach(seq, work);
  EXPECT_EQ(group.Snapshot(kT0 + absl::Seconds(1)).completed, 0u);
  work->Finish();
  const GroupProgressSnapshot s = group.Snapshot(kT0 + absl::Seconds(2));
  EXPECT_EQ(s.completed, 1u);
  EXPECT_EQ(s.entered, 1u);
  // A released Work leaves the op pending until someone completes it.
  const uint64_t next = group.Enter(CollectiveKind::kBarrier, kT0 + absl::Seconds(3));
  group.Attach(next, std::make_shared<ScriptedWork>());
  EXPECT_EQ(group.Snapshot(kT0 + absl::Seconds(4)).completed, 1u);
}

// NCCL's pattern: issue, Wait (which returns before the GPU is done), drop
// the Work. The group holds the latest op's Work, and its completion
// completes every op before it.
TEST(GroupProgressTest, ADroppedWorkStillCompletesThroughTheLatestOp) {
  GroupProgress group("world", {0, 1}, kT0);
  std::weak_ptr<ScriptedWork> last;
  for (int i = 0; i < 3; ++i) {
    auto work = std::make_shared<ScriptedWork>();
    group.Attach(group.Enter(CollectiveKind::kAllReduce, kT0), work);
    last = work;
  }  // The caller keeps no Work.
  EXPECT_EQ(group.Snapshot(kT0 + absl::Seconds(1)).completed, 0u);
  ASSERT_NE(last.lock(), nullptr) << "the latest op's Work must be held";
  last.lock()->Finish();
  const GroupProgressSnapshot s = group.Snapshot(kT0 + absl::Seconds(2));
  EXPECT_EQ(s.completed, 3u);
  EXPECT_EQ(s.entered, 3u);
  EXPECT_EQ(last.lock(), nullptr) << "a completed op's Work is released";
}

// Issuing threads and a heartbeat-like reader at once: snapshots never go
// backwards, never show more completed than entered, and end exact.
TEST(GroupProgressTest, ConcurrentIssuersAndSnapshotsStayConsistent) {
  GroupProgress group("world", {0, 1});
  constexpr int kThreads = 3;
  constexpr int kOps = 20000;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    uint64_t last_completed = 0;
    uint64_t last_entered = 0;
    while (!done.load()) {
      const GroupProgressSnapshot s = group.Snapshot();
      EXPECT_LE(s.completed, s.entered);
      EXPECT_GE(s.completed, last_completed);
      EXPECT_GE(s.entered, last_entered);
      last_completed = s.completed;
      last_entered = s.entered;
    }
  });
  std::vector<std::thread> issuers;
  for (int t = 0; t < kThreads; ++t) {
    issuers.emplace_back([&] {
      for (int i = 0; i < kOps; ++i) {
        const uint64_t seq = group.Enter(CollectiveKind::kAllReduce);
        auto work = std::make_shared<ScriptedWork>();
        group.Attach(seq, work);
        if (i % 2 == 0) {
          group.Complete(seq);
        } else {
          work->Finish();  // Seen by a Snapshot, or completed below.
          group.Complete(seq);
        }
      }
    });
  }
  for (auto& t : issuers) t.join();
  done.store(true);
  reader.join();
  const GroupProgressSnapshot s = group.Snapshot();
  EXPECT_EQ(s.entered, uint64_t{kThreads} * kOps);
  EXPECT_EQ(s.completed, s.entered);
}

TEST(ProgressRegistryTest, ReportsLiveGroupsInOrderAndForgetsReleasedOnes) {
  ProgressRegistry registry;
  std::shared_ptr<GroupProgress> a = registry.Add("a", {0, 1});
  std::shared_ptr<GroupProgress> b = registry.Add("b", {1});
  a->Enter(CollectiveKind::kAllReduce);
  std::vector<GroupProgressReport> reports = registry.Snapshot();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].name, "a");
  EXPECT_EQ(reports[0].members, (std::vector<int>{0, 1}));
  EXPECT_EQ(reports[0].progress.entered, 1u);
  EXPECT_EQ(reports[1].name, "b");
  a.reset();
  reports = registry.Snapshot();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].name, "b");
}

TEST(ProgressRegistryTest, ANameInUseGetsASuffixAndReportsAreCapped) {
  ProgressRegistry registry;
  std::shared_ptr<GroupProgress> a = registry.Add("world", {0, 1});
  std::shared_ptr<GroupProgress> b = registry.Add("world", {0, 1});
  std::shared_ptr<GroupProgress> c = registry.Add("world", {0});
  EXPECT_EQ(a->name(), "world");
  EXPECT_EQ(b->name(), "world~2");
  EXPECT_EQ(c->name(), "world~3");
  b.reset();
  EXPECT_EQ(registry.Add("world", {1})->name(), "world~2");

  // Over the cap: groups with an op in flight first, then the newest.
  c->Enter(CollectiveKind::kBarrier);
  std::shared_ptr<GroupProgress> d = registry.Add("d", {0});
  std::vector<GroupProgressReport> reports = registry.Snapshot(ProgressNow(), 2);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].name, "world~3");
  EXPECT_EQ(reports[1].name, "d");
}

// A group whose ops complete when the test says, or are refused.
class ScriptedGroup final : public ProcessGroup {
 public:
  ScriptedGroup() : ProcessGroup(0, {0, 1}, "scripted", ProcessGroupOptions{}) {}
  absl::string_view backend() const override { return "scripted"; }
  absl::StatusOr<WorkPtr> AllReduce(Tensor, ReduceOp) override { return Next(); }
  absl::StatusOr<WorkPtr> AllReduce(Tensor, Tensor, ReduceOp) override { return Next(); }
  absl::StatusOr<WorkPtr> Broadcast(Tensor, int) override { return Next(); }
  absl::StatusOr<WorkPtr> Reduce(Tensor, int, ReduceOp) override { return Next(); }
  absl::StatusOr<WorkPtr> AllGather(Tensor, Tensor) override { return Next(); }
  absl::StatusOr<WorkPtr> ReduceScatter(Tensor, Tensor, ReduceOp) override { return Next(); }
  absl::StatusOr<WorkPtr> AllToAll(Tensor, Tensor, std::vector<int64_t>,
                                   std::vector<int64_t>) override {
    return Next();
  }
  absl::StatusOr<WorkPtr> Send(Tensor, int, int) override { return Next(); }
  absl::StatusOr<WorkPtr> Recv(Tensor, int, int) override { return Next(); }
  absl::StatusOr<WorkPtr> Barrier() override { return Next(); }
  void Abort(absl::Status) override {}
  absl::Status health() const override { return absl::OkStatus(); }

  bool refuse = false;
  std::vector<std::shared_ptr<ScriptedWork>> works;

 private:
  absl::StatusOr<WorkPtr> Next() {
    if (refuse) return absl::InvalidArgumentError("refused");
    works.push_back(std::make_shared<ScriptedWork>());
    return WorkPtr(works.back());
  }
};

TEST(ProgressProcessGroupTest, NumbersCollectivesButNotPointToPoint) {
  auto inner = std::make_shared<ScriptedGroup>();
  ProgressRegistry registry;
  internal::ProgressProcessGroup group(inner, registry);
  EXPECT_EQ(&group.Underlying(), inner.get());
  EXPECT_EQ(group.name(), "scripted");

  absl::StatusOr<ProcessGroup::WorkPtr> reduce = group.AllReduce(Tensor(), ReduceOp::kSum);
  ASSERT_TRUE(reduce.ok());
  ASSERT_TRUE(group.Send(Tensor(), 1, 0).ok());
  ASSERT_TRUE(group.Recv(Tensor(), 1, 0).ok());
  absl::StatusOr<ProcessGroup::WorkPtr> barrier = group.Barrier();
  ASSERT_TRUE(barrier.ok());
  GroupProgressSnapshot s = group.progress()->Snapshot();
  EXPECT_EQ(s.entered, 2u);
  EXPECT_EQ(s.completed, 0u);
  EXPECT_EQ(s.pending_kind, CollectiveKind::kAllReduce);

  // The caller sees op 1 complete through the wrapper's Wait.
  inner->works[0]->Finish();
  EXPECT_TRUE((*reduce)->Wait(absl::Seconds(1)).ok());
  s = group.progress()->Snapshot();
  EXPECT_EQ(s.completed, 1u);
  EXPECT_EQ(s.pending_kind, CollectiveKind::kBarrier);
  // Nobody waits for the barrier: the heartbeat's snapshot sees it done.
  inner->works[3]->Finish();
  EXPECT_EQ(group.progress()->Snapshot().completed, 2u);

  // A refused op is numbered (every member counts it) and completed.
  inner->refuse = true;
  EXPECT_FALSE(group.Broadcast(Tensor(), 0).ok());
  s = group.progress()->Snapshot();
  EXPECT_EQ(s.entered, 3u);
  EXPECT_EQ(s.completed, 3u);
  EXPECT_EQ(s.completed_kind, CollectiveKind::kBroadcast);
}

}  // namespace progress_test
}  // namespace mesh
