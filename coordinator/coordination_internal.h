// Private to Coordination's implementation files (coordination.cc,
// coordination_rendezvous.cc, coordination_kv.cc, coordination_liveness.cc,
// membership.cc): the records a generation keeps, the pending waits, the
// callbacks a locked section leaves to run after unlocking, and the helpers
// more than one of those files uses. Every field is guarded by
// Coordination's mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "coordinator/barrier_table.h"
#include "coordinator/coordination.h"
#include "coordinator/hang_detector.h"
#include "coordinator/key_waits.h"
#include "coordinator/kv_table.h"
#include "coordinator/liveness.h"
#include "coordinator/rendezvous.h"
#include "coordinator/unique_id_table.h"

namespace mesh::coordinator {

// What every call gets once Shutdown has run.
inline absl::Status UnavailableShutDown() {
  return absl::UnavailableError("coordinator is shutting down");
}

// Callbacks collected under the lock and run after it is released, so that
// a callback may call back into Coordination. Declare before the MutexLock
// so that destruction order runs them after unlock.
class Coordination::Completions {
 public:
  Completions() = default;
  Completions(const Completions&) = delete;
  ~Completions() { Run(); }

  void Add(absl::AnyInvocable<void() &&> fn) { fns_.push_back(std::move(fn)); }

  template <typename T>
  void Complete(Callback<T>& cb, absl::StatusOr<T> result) {
    fns_.push_back([cb = std::move(cb), result = std::move(result)]() mutable {
      std::move(cb)(std::move(result));
    });
  }

 private:
  void Run() {
    // Callbacks run unlocked and use Completions of their own, so nothing
    // is added here while this runs.
    for (auto& fn : fns_) std::move(fn)();
    fns_.clear();
  }

  std::vector<absl::AnyInvocable<void() &&>> fns_;
};

// A pending wait or watch. Lives in waiters_ from registration until it
// ends; its generation outlives it, since ending a generation ends its
// waits first.
struct Coordination::Waiter {
  enum class Kind { kJoin, kKeys, kBarrier, kWatch, kAlive };

  Kind kind = Kind::kJoin;
  Generation* gen = nullptr;
  int rank = 0;
  absl::Duration timeout;          // As clamped; for messages.
  KeySpace space = KeySpace::kKv;  // kKeys.
  KeyWait keys;                    // kKeys.
  std::string barrier;             // kBarrier.
  // The callback of its kind.
  Callback<JoinResult> join_done;
  Callback<std::vector<std::string>> values_done;
  Callback<int> barrier_done;
  WatchCallback watch_done;
  Callback<AliveSet> alive_done;

  void Fail(const absl::Status& status, Completions& done) {
    switch (kind) {
      case Kind::kJoin:
        return done.Complete(join_done, absl::StatusOr<JoinResult>(status));
      case Kind::kKeys:
        return done.Complete(values_done, absl::StatusOr<std::vector<std::string>>(status));
      case Kind::kBarrier:
        return done.Complete(barrier_done, absl::StatusOr<int>(status));
      case Kind::kWatch:
        return done.Complete(watch_done, absl::StatusOr<JobError>(status));
      case Kind::kAlive:
        return done.Complete(alive_done, absl::StatusOr<AliveSet>(status));
    }
  }
};

// One generation of a job: everything a restart throws away.
struct Coordination::Generation {
  Generation(const JobLayout& job_layout, int64_t generation, uint64_t waiter_scope,
             const CoordinationOptions& options)
      : job_id(job_layout.job_id),
        number(generation),
        scope(waiter_scope),
        layout(&job_layout),
        rendezvous(job_layout.world_size),
        liveness(job_layout.world_size, options.heartbeat_timeout),
        hangs(job_layout.world_size, job_layout.hang_timeout),
        kv(options.kv),
        ids(options.kv.max_key_bytes, options.max_unique_ids),
        barriers(job_layout.world_size) {}

  const std::string job_id;
  const int64_t number;
  const uint64_t scope;     // Of its waits in waiters_.
  const JobLayout* layout;  // Owned by the Job, which outlives it.
  Rendezvous rendezvous;
  LivenessTracker liveness;  // Started when the rendezvous completes.
  HangDetector hangs;
  KvTable kv;
  UniqueIdTable ids;
  BarrierTable barriers;
  KeyWaitIndex kv_waits;
  KeyWaitIndex id_waits;
  absl::btree_set<uint64_t> join_waiters;  // Completed together, in order.
  std::optional<JobError> error;           // Set once: the first failure.
  // Ranks the agent saw exit without leaving (RankExited): how.
  std::map<int, std::string> exited;
  std::optional<absl::Time> first_join;  // For the rendezvous duration.
  // Non-empty (one host per rank): ranks may re-attach (AllowReattach).
  std::vector<std::string> reattach_hosts;
  // In-place recovery (membership.cc): lost ranks with why, ascending; the
  // membership epoch, +1 whenever a rank is lost or comes back.
  std::map<int, JobError> lost;
  int64_t epoch = 0;
  // Every loss and return, oldest first; at most kMaxMembershipEvents.
  std::deque<MembershipEvent> membership;
  // The AliveRanks round in progress: each caller's rank and wait.
  struct AliveRound {
    int64_t completed = 0;  // Rounds completed so far.
    std::map<int, uint64_t> arrived;
  };
  AliveRound alive;

  int world_size() const { return layout->world_size; }
  std::string Name() const { return absl::StrCat("job ", job_id, " generation ", number); }
  // `status` with this generation named in front.
  absl::Status Annotate(const absl::Status& status) const {
    return absl::Status(status.code(), absl::StrCat(Name(), ": ", status.message()));
  }

  absl::Status CheckKey(KeySpace space, const std::string& key) const {
    return space == KeySpace::kKv ? kv.CheckKey(key) : ids.CheckKey(key);
  }
  const std::string* Find(KeySpace space, const std::string& key) const {
    return space == KeySpace::kKv ? kv.Find(key) : ids.Find(key);
  }
  KeyWaitIndex& Waits(KeySpace space) { return space == KeySpace::kKv ? kv_waits : id_waits; }
};

struct Coordination::Job {
  JobLayout layout;
  std::unique_ptr<Generation> current;
  // Why the previous generation failed, if it did: a late call of that
  // generation is told the culprit, not only that it is stale.
  std::optional<JobError> previous_error;
};

}  // namespace mesh::coordinator
