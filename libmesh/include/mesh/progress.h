// Collective progress: what each process group of this rank is doing, so
// that the coordinator can tell a hang from a long computation and name the
// rank that never arrived (docs/hangs.md).
//
//   GroupProgress     one group's collectives, numbered in issue order
//                     (1, 2, ...), with the state of the ones in flight.
//   ProgressRegistry  every live group of a Runtime; the heartbeat thread
//                     takes a compact summary of it (one entry per group,
//                     never per op) and sends it with each heartbeat.
//
// Every member of a group issues the group's collectives in the same order
// (the contract of torch.distributed and of ProcessGroup), so op #n of one
// rank is op #n of every other member. Point-to-point ops (Send/Recv) are not
// numbered: they involve two members, and counting them would desynchronize
// the numbering of the others.
//
// States of one op:
//
//   ENTERED ──every earlier op of the group completed──▶ STARTED ──▶ COMPLETED
//
// A group runs its ops in issue order (Gloo on one device thread, NCCL on one
// stream), so an op starts when it was entered and every op before it has
// completed, and when an op completes every earlier one has too. An op that
// failed counts as completed: the group is aborted then, and the failure is
// reported as such.
//
// Nobody may look at an op when it completes: NCCL's Work::Wait returns
// before the GPU is done, and callers often drop the Work right after. So
// the group holds the Work of its latest op (until the next op or its
// completion replaces it) and Snapshot asks it: once it has completed, so
// has every op before it. Older ops' Works are held weakly and asked too.
//
// Times: ProgressNow(), a coarse monotonic clock (a few milliseconds of
// resolution, a few nanoseconds a read). Only differences of its values mean
// anything; hang timeouts are minutes.
//
// Cost (mesh-bench progress): Enter, Attach and Complete each take a
// spinlock held for a few instructions (the issuing thread's, and now and
// then the heartbeat thread's); Enter and Complete read the coarse clock.
// Snapshot polls the oldest pending ops of the group (through the Work
// attached to each) outside the lock, and never blocks.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mesh/work.h"

namespace mesh {

// The clock of collective progress: CLOCK_MONOTONIC_COARSE as an absl::Time
// (not a wall time: compare values only with each other).
absl::Time ProgressNow();

namespace internal {

// A test-and-set lock for GroupProgress: it is held for a few instructions,
// by the thread issuing collectives and now and then by the heartbeat
// thread, where absl::Mutex's bookkeeping would cost as much as the rest of
// the tracking. Waiters yield.
class ABSL_LOCKABLE ProgressSpinLock {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION();
  void Unlock() ABSL_UNLOCK_FUNCTION() { held_.clear(std::memory_order_release); }

 private:
  std::atomic_flag held_;
};

class ABSL_SCOPED_LOCKABLE ProgressSpinLockHolder {
 public:
  explicit ProgressSpinLockHolder(ProgressSpinLock* lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(lock)
      : lock_(lock) {
    lock_->Lock();
  }
  ~ProgressSpinLockHolder() ABSL_UNLOCK_FUNCTION() { lock_->Unlock(); }
  ProgressSpinLockHolder(const ProgressSpinLockHolder&) = delete;
  ProgressSpinLockHolder& operator=(const ProgressSpinLockHolder&) = delete;

 private:
  ProgressSpinLock* const lock_;
};

}  // namespace internal

// The collectives a group numbers. kOther is for a caller's own kinds (the
// torch hook's "all_gather_object", say) that have no entry here.
enum class CollectiveKind : uint8_t {
  kNone = 0,
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kOther,
};
inline constexpr int kNumCollectiveKinds = 9;

// "none", "all_reduce", "broadcast", "reduce", "all_gather",
// "reduce_scatter", "all_to_all", "barrier", "other".
absl::string_view CollectiveKindName(CollectiveKind kind);
// The inverse of CollectiveKindName; kOther for a name it does not know.
CollectiveKind CollectiveKindFromName(absl::string_view name);

// One group's progress as of one instant.
struct GroupProgressSnapshot {
  // The last op entered, 0 when none yet.
  uint64_t entered = 0;
  // Every op up to and including this one has completed; 0 when none has.
  uint64_t completed = 0;
  // The kind of op #completed + 1, when entered > completed (the op this
  // rank waits in); kNone otherwise.
  CollectiveKind pending_kind = CollectiveKind::kNone;
  // The kind of op #completed; kNone when completed == 0.
  CollectiveKind completed_kind = CollectiveKind::kNone;
  // How long op #completed + 1 has been STARTED, when entered > completed;
  // zero otherwise.
  absl::Duration waiting = absl::ZeroDuration();
  // How long ago op #completed completed (since the group was made, when
  // completed == 0).
  absl::Duration since_completed = absl::ZeroDuration();
};

class GroupProgress {
 public:
  // `name` as ProcessGroup::name() ("world", "mesh0/tp/1"); `members` the
  // world ranks of the group in group-rank order. `now` is when it was made.
  GroupProgress(std::string name, std::vector<int> members, absl::Time now = ProgressNow());

  GroupProgress(const GroupProgress&) = delete;
  GroupProgress& operator=(const GroupProgress&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<int>& members() const { return members_; }

  // This rank issued the group's next collective; returns its number.
  uint64_t Enter(CollectiveKind kind, absl::Time now = ProgressNow());

  // `work`, the backend's handle of op `seq`, lets Snapshot see the op
  // complete when nobody waits for it. Optional. Held until a later op is
  // attached or the op completes when `seq` is the latest op entered,
  // weakly otherwise. A seq that is not pending is ignored.
  void Attach(uint64_t seq, std::shared_ptr<Work> work);

  // Op `seq` completed (or failed). Ops may complete in any order; the
  // watermark (`completed`) advances over every contiguous completed op.
  // Idempotent; an unknown or already completed seq is ignored.
  void Complete(uint64_t seq, absl::Time now = ProgressNow());

  // The state as of `now`. First asks the Work of the oldest pending op, if
  // attached and still alive, whether it has completed (Work::IsCompleted,
  // which never blocks; asked outside the lock), and so on while they have.
  GroupProgressSnapshot Snapshot(absl::Time now = ProgressNow());

 private:
  struct Op {
    uint64_t seq = 0;
    CollectiveKind kind = CollectiveKind::kNone;
    absl::Time entered;
    bool done = false;
    std::weak_ptr<Work> work;
  };
  // Pops the completed ops at the front, advancing the watermark.
  void AdvanceLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every pending op up to `seq` completed (ops complete in order). Returns
  // the latest op's Work if it was released, for the caller to drop after
  // unlocking.
  std::shared_ptr<Work> CompleteThroughLocked(uint64_t seq, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const std::vector<int> members_;

  internal::ProgressSpinLock mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  CollectiveKind completed_kind_ ABSL_GUARDED_BY(mu_) = CollectiveKind::kNone;
  // When op #completed_ completed (the group's creation before any).
  absl::Time completed_at_ ABSL_GUARDED_BY(mu_);
  // Ops entered and not yet below the watermark, oldest first.
  std::deque<Op> pending_ ABSL_GUARDED_BY(mu_);
  // The Work of the latest attached op, and its seq (0: none).
  std::shared_ptr<Work> latest_work_ ABSL_GUARDED_BY(mu_);
  uint64_t latest_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

// One group of a ProgressRegistry summary.
struct GroupProgressReport {
  std::string name;
  std::vector<int> members;
  GroupProgressSnapshot progress;
};

class ProgressRegistry {
 public:
  ProgressRegistry() = default;
  ProgressRegistry(const ProgressRegistry&) = delete;
  ProgressRegistry& operator=(const ProgressRegistry&) = delete;

  // Tracks a new group. The registry holds it weakly: it is reported while
  // someone (the group decorator, a torch hook) holds the returned pointer.
  // Names are unique among live groups: a name already in use gets "~2",
  // "~3", ... appended (the first free one), the same on every rank as long
  // as ranks make their groups in the same order.
  std::shared_ptr<GroupProgress> Add(std::string name, std::vector<int> members);

  // A summary of every live group, in the order they were added; forgets
  // the ones released since. At most `max_groups`: groups with an op in
  // flight first (those are the ones a hang involves), then the most
  // recently added.
  std::vector<GroupProgressReport> Snapshot(absl::Time now = ProgressNow(),
                                            size_t max_groups = kMaxReportedGroups);

  // What a heartbeat carries at most (worker.proto's limit).
  static constexpr size_t kMaxReportedGroups = 4096;

 private:
  absl::Mutex mu_;
  std::vector<std::weak_ptr<GroupProgress>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh
