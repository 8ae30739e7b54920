// Runtime::Monitor: a Runtime's heartbeats, its watch of the job, and the
// job's error. Private to libmesh; mesh/runtime.h declares the class and
// describes the behaviour it gives the Runtime.
//
// Threads: the Monitor owns two.
//   heartbeat thread (StartHeartbeats): a Heartbeat every interval, carrying
//     the progress of the Runtime's groups. It waits on a condition
//     variable, so Stop wakes it at once. A reply that carries the job's
//     error, a final RPC error, or no successful heartbeat for a whole
//     heartbeat timeout fails the job. In-place recovery: a reply that
//     first names a lost rank aborts the tracked factory's groups that
//     include it (AbortGroupsWith), and nothing else.
//   watch thread (StartWatch): reads the WatchJob stream; an ERROR event, or
//     the stream ending ABORTED, fails the job. If the stream breaks
//     otherwise, heartbeats remain as the second path.
// A failure aborts the armed factory's groups (AbortAll) and calls
// on_failure on the thread that saw it (heartbeat, watch, or a caller of
// Fail), with no lock of the Monitor held.
//
//   constructed ──StartHeartbeats, StartWatch──▶ watching ──Arm──▶ armed
//        │                 │                         │               │
//        └─────────────────┴──Fail (first error)─────┴───────────────┴──▶ failed
//   Stop (any state; the destructor too): both threads end; nothing is sent.
//
// Errors: the first failure is the job's error (error()); later ones are
// dropped. It is ABORTED with the coordinator's message for a failed job
// (heartbeat reply, watch event or an ABORTED stream), UNAVAILABLE naming
// the coordinator and the time for a lost coordinator, or a heartbeat's
// final RPC error as it came (NOT_FOUND, PERMISSION_DENIED, ...).
// on_failure is called at most once, and only for a failure after Arm; a
// failure before Arm is what Arm returns.
//
// Thread safety: thread-safe. StartHeartbeats and StartWatch are called
// once each, by the Runtime, before Stop.
//
// Ownership: the Runtime owns the Monitor (std::unique_ptr) and destroys it
// only after Stop returned, or lets the destructor stop it. The Monitor
// shares the coordinator client and the progress registry, and keeps the
// factories given to Arm and Track alive until it is destroyed. The threads
// capture `this`; Stop joins them before any member goes away.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libmesh/src/coordinator_client.h"
#include "libmesh/src/decorating_factory.h"
#include "mesh/process_group.h"
#include "mesh/progress.h"
#include "mesh/runtime.h"

namespace mesh {

class Runtime::Monitor {
 public:
  // `info` gives the rank and the heartbeat interval and timeout; every
  // RPC (and the wait for WATCHING) is bounded by `rpc_timeout`.
  // `on_failure` may be empty.
  Monitor(std::shared_ptr<internal::CoordinatorClient> client, const JoinInfo& info,
          absl::Duration rpc_timeout, std::function<void(const absl::Status&)> on_failure,
          std::shared_ptr<ProgressRegistry> progress);

  // Stop().
  ~Monitor();

  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  // Starts the heartbeat thread; the first beat goes at once.
  void StartHeartbeats();

  // Opens the watch and returns once the coordinator confirmed it
  // (WATCHING), so no error of the job can be missed afterwards.
  // Possible errors: WatchJob's; the stream's status, or UNAVAILABLE, when
  // it ended before WATCHING; DEADLINE_EXCEEDED naming the coordinator when
  // no WATCHING came within rpc_timeout.
  absl::Status StartWatch();

  // Hands over the factory whose groups a failure aborts, and from then on
  // calls on_failure too. Returns the job's error if it failed already
  // (and aborts the factory's groups with it).
  absl::Status Arm(std::shared_ptr<ProcessGroupFactory> factory);

  // The factory whose groups AbortGroupsOfNewlyLost aborts.
  void Track(std::shared_ptr<internal::DecoratingProcessGroupFactory> factory);

  // Records `error` (not OK) as the job's error unless there is one already,
  // and then aborts the armed factory's groups and calls on_failure.
  void Fail(const absl::Status& error);

  // The job's error; OK while it runs.
  absl::Status error() const;

  // The membership epoch of the latest successful heartbeat (0 before).
  int64_t membership_epoch() const;

  // Stops both threads without telling the coordinator anything.
  // Idempotent.
  void Stop();

 private:
  // In-place recovery: the groups that include a rank lost since the last
  // beat can never complete another collective; abort them now, naming the
  // loss, so that nothing waits for the op timeout. A rank that came back
  // and is lost again counts as new. Heartbeat thread only.
  void AbortGroupsOfNewlyLost(const std::vector<internal::JobErrorInfo>& lost);

  // Sleeps until `deadline` or Stop; false once stopping.
  bool SleepUntil(absl::Time deadline);
  bool stopping() const;

  void HeartbeatLoop();
  void WatchLoop();

  const std::shared_ptr<internal::CoordinatorClient> client_;
  const std::shared_ptr<ProgressRegistry> progress_;
  const int rank_;
  const absl::Duration interval_;
  const absl::Duration timeout_;
  const absl::Duration rpc_timeout_;
  const std::function<void(const absl::Status&)> on_failure_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> membership_epoch_{0};
  // The lost ranks of the latest beat (heartbeat thread only).
  std::set<int> lost_;
  std::shared_ptr<internal::DecoratingProcessGroupFactory> tracked_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ProcessGroupFactory> factory_ ABSL_GUARDED_BY(mu_);
  // Set by Arm: Init has succeeded, so failures go to on_failure.
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<internal::JobWatch> watch_ ABSL_GUARDED_BY(mu_);
  bool watch_live_ ABSL_GUARDED_BY(mu_) = false;
  // Why the watch could not start.
  absl::Status watch_status_ ABSL_GUARDED_BY(mu_);

  // Groups whose members the coordinator has; the heartbeat thread's own.
  absl::flat_hash_set<std::string> announced_;

  std::thread heartbeat_thread_;
  std::thread watch_thread_;
};

}  // namespace mesh
