// JobStateMachine: the lifecycle of one job — its state, generation, restart
// count, root cause and the event log of every transition.
//
//                     Schedule             Start              Succeed
//   submit ──▶ PENDING ────────▶ SCHEDULED ──────▶ RUNNING ──────────▶ SUCCEEDED
//                ▲  ▲                │    ▲           │
//                │  │     WorkerFailed    │ Schedule  │ WorkerFailed
//                │  │   (restarts left)   │           │ (restarts left)
//                │  │     or Resize  ▼    │           │ or Resize
//                │  └─── SetPending ─ RESTARTING ◀────┘
//                │       (no nodes)     generation+1, restarts+1
//                │                      (Resize: restarts unchanged)
//                │   RUNNING ──RecoverInPlace──▶ RUNNING: restarts+1, same generation
//                │
//   from every non-terminal state:
//     WorkerFailed with no restarts left, Fail, the deadline ──▶ FAILED
//     Cancel ──────────────────────────────────────────────────▶ CANCELLED
//
// SUCCEEDED, FAILED and CANCELLED are terminal: nothing leaves them.
//
// Generations. A job starts at generation 0. Entering RESTARTING bumps it at
// once, so that the coordinator fences the failed generation (its KV scope,
// barriers and late exit reports get ABORTED) before the agents have even
// killed its workers; the relaunch runs as the new generation. A failure is
// reported for a generation; a report for an older one is stale and changes
// nothing. With max_restarts = 2, the third failure fails the job: restarts
// ends at 2 and generation at 2.
//
// Events. Every transition appends an event (time from the injected Clock,
// from, to, reason, generation after it). Submission is the first event,
// UNSPECIFIED → PENDING. A new pending reason for a job that is already
// PENDING is not a transition: it updates pending_reason() only.
//
// Errors common to the transition methods:
//   FAILED_PRECONDITION  the transition is not in the diagram (the message
//                        names the job and both states); nothing changes.
//
// Thread safety: not thread-safe; the job manager that owns it serializes
// access (as Coordination does for its parts). The Clock must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "mesh/v1/job.pb.h"

namespace mesh::coordinator {

using JobState = ::mesh::v1::JobState;

// "PENDING", "RUNNING", ... ("UNSPECIFIED" for 0, "UNKNOWN(n)" otherwise).
std::string JobStateName(JobState state);

// Whether `state` is SUCCEEDED, FAILED or CANCELLED.
bool IsTerminal(JobState state);

// Whether the diagram above has an edge from `from` to `to`.
// Possible errors: FAILED_PRECONDITION naming both states when it has not
// (self-transitions included).
absl::Status CheckTransition(JobState from, JobState to);

// One transition.
struct JobEventRecord {
  absl::Time time;
  JobState from = ::mesh::v1::JOB_STATE_UNSPECIFIED;
  JobState to = ::mesh::v1::JOB_STATE_UNSPECIFIED;
  std::string reason;
  int64_t generation = 0;  // After the transition.
};

// `event` as the wire type.
::mesh::v1::JobStateEvent ToProto(const JobEventRecord& event);

// A job as stored, for rebuilding its state machine after a coordinator
// restart.
struct RestoredJobState {
  JobState state = ::mesh::v1::JOB_STATE_PENDING;
  std::string pending_reason;
  int64_t generation = 0;
  int restarts = 0;
  absl::Time create_time;
  absl::Time update_time;
  bool has_root_cause = false;
  ::mesh::v1::RootCause root_cause;
  std::vector<JobEventRecord> events;  // Oldest first.
};

class JobStateMachine {
 public:
  // A newly submitted job: PENDING with `pending_reason`, generation 0, one
  // event. `max_restarts` >= 0 and `deadline` >= 0 (zero: none) come from a
  // valid spec (programmer error otherwise; checked).
  JobStateMachine(std::string job_id, int max_restarts, absl::Duration deadline,
                  std::string pending_reason, const Clock& clock);

  // A stored job, exactly as it was: no event is added. Possible errors
  // (INVALID_ARGUMENT, naming the job): an UNSPECIFIED or unknown state, a
  // negative generation, restarts outside [0, max_restarts] or above the
  // generation.
  static absl::StatusOr<std::unique_ptr<JobStateMachine>> Restore(std::string job_id,
                                                                  int max_restarts,
                                                                  absl::Duration deadline,
                                                                  RestoredJobState stored,
                                                                  const Clock& clock);

  JobStateMachine(const JobStateMachine&) = delete;
  JobStateMachine& operator=(const JobStateMachine&) = delete;

  // PENDING → PENDING: a new reason, no event. RESTARTING → PENDING: the
  // relaunch waits for nodes.
  absl::Status SetPending(std::string reason);

  // PENDING or RESTARTING → SCHEDULED: every node and rank is assigned.
  absl::Status Schedule(std::string reason);

  // SCHEDULED → RUNNING: every worker of the current generation runs.
  absl::Status Start(std::string reason);

  // RUNNING → SUCCEEDED: every worker exited 0.
  absl::Status Succeed(std::string reason);

  // A worker (or its node) failed. `cause.generation()` names the failed
  // generation; `cause.message()` becomes the event's reason. With restarts
  // left: SCHEDULED or RUNNING → RESTARTING, generation+1, restarts+1.
  // Without, or when `no_restart` gives a reason not to (a hang under
  // on_hang FAIL; it ends the event's reason): → FAILED. Either way
  // root_cause() becomes `cause`. Returns the new state.
  // Possible errors: ABORTED when cause.generation() is older than the
  // current one (a stale report: ignore it); INVALID_ARGUMENT when newer;
  // FAILED_PRECONDITION from any other state (PENDING, RESTARTING, terminal).
  absl::StatusOr<JobState> WorkerFailed(::mesh::v1::RootCause cause,
                                        absl::string_view no_restart = "");

  // A change of the job's membership (docs/elastic.md): SCHEDULED or
  // RUNNING → RESTARTING, generation+1, restarts unchanged, `reason` the
  // event's. `cause` (a lost node), when given, becomes root_cause(); its
  // generation must be the current one.
  // Possible errors: ABORTED when cause->generation() is older (stale);
  // INVALID_ARGUMENT when newer; FAILED_PRECONDITION from any other state.
  absl::Status Resize(std::optional<::mesh::v1::RootCause> cause, std::string reason);

  // A worker of a job with in-place recovery failed (docs/elastic.md) and
  // is relaunched alone: RUNNING stays RUNNING at the same generation,
  // restarts+1, and an event RUNNING → RUNNING records `cause.message()`.
  // root_cause() becomes `cause`.
  // Possible errors: ABORTED when cause.generation() is older (stale);
  // INVALID_ARGUMENT when newer; FAILED_PRECONDITION in any state but
  // RUNNING or with no restarts left (then WorkerFailed decides).
  absl::Status RecoverInPlace(::mesh::v1::RootCause cause);

  // Any non-terminal state → FAILED without a restart (e.g. the job can
  // never be placed). root_cause() becomes `cause`, stamped with the current
  // generation.
  absl::Status Fail(::mesh::v1::RootCause cause);

  // Any non-terminal state → CANCELLED.
  absl::Status Cancel(std::string reason);

  // When the deadline has passed (clock >= create_time + deadline) and the
  // job is not terminal, fails it with a root cause naming the deadline and
  // returns true. Else false. Called from the owner's periodic tick.
  bool ExpireIfPastDeadline();

  const std::string& job_id() const { return job_id_; }
  JobState state() const { return state_; }
  // Empty unless PENDING.
  const std::string& pending_reason() const { return pending_reason_; }
  int64_t generation() const { return generation_; }
  int restarts() const { return restarts_; }
  int max_restarts() const { return max_restarts_; }
  absl::Time create_time() const { return create_time_; }
  absl::Time update_time() const { return update_time_; }
  // The latest failure; has_root_cause() is false until one is recorded.
  bool has_root_cause() const { return has_root_cause_; }
  const ::mesh::v1::RootCause& root_cause() const { return root_cause_; }
  // Oldest first; the first is the submission.
  const std::vector<JobEventRecord>& events() const { return events_; }

  // Fills the state fields of `job` (state, pending reason, generation,
  // restarts, times, root cause, events); leaves id, spec and nodes alone.
  void ToProto(::mesh::v1::Job& job) const;

 private:
  // Checks and records one transition.
  absl::Status Transition(JobState to, std::string reason);

  const std::string job_id_;
  const int max_restarts_;
  const absl::Duration deadline_;
  const Clock& clock_;

  JobState state_ = ::mesh::v1::JOB_STATE_UNSPECIFIED;
  std::string pending_reason_;
  int64_t generation_ = 0;
  int restarts_ = 0;
  absl::Time create_time_;
  absl::Time update_time_;
  bool has_root_cause_ = false;
  ::mesh::v1::RootCause root_cause_;
  std::vector<JobEventRecord> events_;
};

}  // namespace mesh::coordinator
