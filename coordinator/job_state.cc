#include "coordinator/job_state.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/duration_format.h"

namespace mesh::coordinator {
namespace {

using ::mesh::v1::JOB_STATE_CANCELLED;
using ::mesh::v1::JOB_STATE_FAILED;
using ::mesh::v1::JOB_STATE_PENDING;
using ::mesh::v1::JOB_STATE_RESTARTING;
using ::mesh::v1::JOB_STATE_RUNNING;
using ::mesh::v1::JOB_STATE_SCHEDULED;
using ::mesh::v1::JOB_STATE_SUCCEEDED;
using ::mesh::v1::JOB_STATE_UNSPECIFIED;

// The diagram's edges other than the ones every non-terminal state has
// (→ FAILED, → CANCELLED).
bool IsEdge(JobState from, JobState to) {
  switch (from) {
    case JOB_STATE_PENDING:
      return to == JOB_STATE_SCHEDULED;
    case JOB_STATE_SCHEDULED:
      return to == JOB_STATE_RUNNING || to == JOB_STATE_RESTARTING;
    case JOB_STATE_RUNNING:
      return to == JOB_STATE_SUCCEEDED || to == JOB_STATE_RESTARTING;
    case JOB_STATE_RESTARTING:
      return to == JOB_STATE_SCHEDULED || to == JOB_STATE_PENDING;
    default:
      return false;
  }
}

bool IsLive(JobState state) {
  return state == JOB_STATE_PENDING || state == JOB_STATE_SCHEDULED || state == JOB_STATE_RUNNING ||
         state == JOB_STATE_RESTARTING;
}

}  // namespace

std::string JobStateName(JobState state) {
  switch (state) {
    case JOB_STATE_UNSPECIFIED:
      return "UNSPECIFIED";
    case JOB_STATE_PENDING:
      return "PENDING";
    case JOB_STATE_SCHEDULED:
      return "SCHEDULED";
    case JOB_STATE_RUNNING:
      return "RUNNING";
    case JOB_STATE_RESTARTING:
      return "RESTARTING";
    case JOB_STATE_SUCCEEDED:
      return "SUCCEEDED";
    case JOB_STATE_FAILED:
      return "FAILED";
    case JOB_STATE_CANCELLED:
      return "CANCELLED";
    default:
      return absl::StrCat("UNKNOWN(", static_cast<int>(state), ")");
  }
}

bool IsTerminal(JobState state) {
  return state == JOB_STATE_SUCCEEDED || state == JOB_STATE_FAILED || state == JOB_STATE_CANCELLED;
}

absl::Status CheckTransition(JobState from, JobState to) {
  const bool ok =
      IsLive(from) && (to == JOB_STATE_FAILED || to == JOB_STATE_CANCELLED || IsEdge(from, to));
  if (ok) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("cannot go from ", JobStateName(from), " to ", JobStateName(to),
                   IsTerminal(from) ? " (the job has finished)" : ""));
}

mesh::v1::JobStateEvent ToProto(const JobEventRecord& event) {
  mesh::v1::JobStateEvent proto;
  proto.set_time_unix_ms(absl::ToUnixMillis(event.time));
  proto.set_from(event.from);
  proto.set_to(event.to);
  proto.set_reason(event.reason);
  proto.set_generation(event.generation);
  return proto;
}

JobStateMachine::JobStateMachine(std::string job_id, int max_restarts, absl::Duration deadline,
                                 std::string pending_reason, const Clock& clock)
    : job_id_(std::move(job_id)), max_restarts_(max_restarts), deadline_(deadline), clock_(clock) {
  MESH_CHECK(max_restarts >= 0, "max_restarts must be >= 0 (ValidateJobSpec)");
  MESH_CHECK(deadline >= absl::ZeroDuration(), "deadline must be >= 0 (ValidateJobSpec)");
  create_time_ = clock_.Now();
  update_time_ = create_time_;
  state_ = JOB_STATE_PENDING;
  pending_reason_ = std::move(pending_reason);
  events_.push_back(
      JobEventRecord{create_time_, JOB_STATE_UNSPECIFIED, JOB_STATE_PENDING, "submitted", 0});
}

absl::StatusOr<std::unique_ptr<JobStateMachine>> JobStateMachine::Restore(std::string job_id,
                                                                          int max_restarts,
                                                                          absl::Duration deadline,
                                                                          RestoredJobState stored,
                                                                          const Clock& clock) {
  const bool known =
      stored.state == JOB_STATE_PENDING || IsLive(stored.state) || IsTerminal(stored.state);
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job_id, ": cannot restore state ", JobStateName(stored.state)));
  }
  // restarts may exceed generation: an in-place recovery counts a restart
  // without a new generation.
  if (stored.generation < 0 || stored.restarts < 0 || stored.restarts > max_restarts) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": cannot restore generation ",
                                                   stored.generation, " with ", stored.restarts,
                                                   " of ", max_restarts, " restarts"));
  }
  auto machine = std::unique_ptr<JobStateMachine>(
      new JobStateMachine(std::move(job_id), max_restarts, deadline, "", clock));
  machine->state_ = stored.state;
  machine->pending_reason_ =
      stored.state == JOB_STATE_PENDING ? std::move(stored.pending_reason) : std::string();
  machine->generation_ = stored.generation;
  machine->restarts_ = stored.restarts;
  machine->create_time_ = stored.create_time;
  machine->update_time_ = stored.update_time;
  machine->has_root_cause_ = stored.has_root_cause;
  machine->root_cause_ = std::move(stored.root_cause);
  machine->events_ = std::move(stored.events);
  return machine;
}

absl::Status JobStateMachine::Transition(JobState to, std::string reason) {
  if (absl::Status status = CheckTransition(state_, to); !status.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id_, ": ", status.message()));
  }
  update_time_ = clock_.Now();
  events_.push_back(JobEventRecord{update_time_, state_, to, std::move(reason), generation_});
  state_ = to;
  if (to != JOB_STATE_PENDING) pending_reason_.clear();
  return absl::OkStatus();
}

absl::Status JobStateMachine::SetPending(std::string reason) {
  if (state_ == JOB_STATE_PENDING) {
    if (pending_reason_ != reason) {
      pending_reason_ = std::move(reason);
      update_time_ = clock_.Now();
    }
    return absl::OkStatus();
  }
  absl::Status status = Transition(JOB_STATE_PENDING, reason);
  if (status.ok()) pending_reason_ = std::move(reason);
  return status;
}

absl::Status JobStateMachine::Schedule(std::string reason) {
  return Transition(JOB_STATE_SCHEDULED, std::move(reason));
}

absl::Status JobStateMachine::Start(std::string reason) {
  return Transition(JOB_STATE_RUNNING, std::move(reason));
}

absl::Status JobStateMachine::Succeed(std::string reason) {
  return Transition(JOB_STATE_SUCCEEDED, std::move(reason));
}

absl::StatusOr<JobState> JobStateMachine::WorkerFailed(mesh::v1::RootCause cause,
                                                       absl::string_view no_restart) {
  if (cause.generation() < generation_) {
    return absl::AbortedError(absl::StrCat("job ", job_id_, ": failure of generation ",
                                           cause.generation(), " is stale; the job is at ",
                                           generation_));
  }
  if (cause.generation() > generation_) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id_, ": failure of generation ",
                                                   cause.generation(), ", but the job is only at ",
                                                   generation_));
  }
  if (state_ != JOB_STATE_SCHEDULED && state_ != JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id_, ": a worker failure in state ", JobStateName(state_)));
  }
  const bool restart = no_restart.empty() && restarts_ < max_restarts_;
  std::string reason =
      restart ? absl::StrCat(cause.message(), "; restart ", restarts_ + 1, " of ", max_restarts_)
      : !no_restart.empty()
          ? absl::StrCat(cause.message(), "; not restarted: ", no_restart)
          : absl::StrCat(cause.message(), "; no restarts left (max_restarts ", max_restarts_, ")");
  if (restart) {
    // Bump first, so the RESTARTING event carries the new generation.
    ++generation_;
    ++restarts_;
  }
  const absl::Status status =
      Transition(restart ? JOB_STATE_RESTARTING : JOB_STATE_FAILED, std::move(reason));
  MESH_CHECK(status.ok(), "SCHEDULED and RUNNING have both edges");
  root_cause_ = std::move(cause);
  has_root_cause_ = true;
  return state_;
}

absl::Status JobStateMachine::Resize(std::optional<mesh::v1::RootCause> cause, std::string reason) {
  if (cause.has_value() && cause->generation() < generation_) {
    return absl::AbortedError(absl::StrCat("job ", job_id_, ": change of generation ",
                                           cause->generation(), " is stale; the job is at ",
                                           generation_));
  }
  if (cause.has_value() && cause->generation() > generation_) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id_, ": change of generation ",
                                                   cause->generation(), ", but the job is only at ",
                                                   generation_));
  }
  if (state_ != JOB_STATE_SCHEDULED && state_ != JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id_, ": a resize in state ", JobStateName(state_)));
  }
  ++generation_;
  const absl::Status status = Transition(JOB_STATE_RESTARTING, std::move(reason));
  MESH_CHECK(status.ok(), "SCHEDULED and RUNNING both lead to RESTARTING");
  if (cause.has_value()) {
    root_cause_ = *std::move(cause);
    has_root_cause_ = true;
  }
  return absl::OkStatus();
}

absl::Status JobStateMachine::RecoverInPlace(mesh::v1::RootCause cause) {
  if (cause.generation() < generation_) {
    return absl::AbortedError(absl::StrCat("job ", job_id_, ": failure of generation ",
                                           cause.generation(), " is stale; the job is at ",
                                           generation_));
  }
  if (cause.generation() > generation_) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id_, ": failure of generation ",
                                                   cause.generation(), ", but the job is only at ",
                                                   generation_));
  }
  if (state_ != JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id_, ": an in-place recovery in state ", JobStateName(state_)));
  }
  if (restarts_ >= max_restarts_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id_, ": no restarts left for an in-place recovery (max_restarts ",
                     max_restarts_, ")"));
  }
  ++restarts_;
  update_time_ = clock_.Now();
  events_.push_back(
      JobEventRecord{update_time_, state_, state_,
                     absl::StrCat(cause.message(), "; relaunched in place, restart ", restarts_,
                                  " of ", max_restarts_, "; the other ranks carry on"),
                     generation_});
  root_cause_ = std::move(cause);
  has_root_cause_ = true;
  return absl::OkStatus();
}

absl::Status JobStateMachine::Fail(mesh::v1::RootCause cause) {
  cause.set_generation(generation_);
  if (absl::Status status = Transition(JOB_STATE_FAILED, cause.message()); !status.ok()) {
    return status;
  }
  root_cause_ = std::move(cause);
  has_root_cause_ = true;
  return absl::OkStatus();
}

absl::Status JobStateMachine::Cancel(std::string reason) {
  return Transition(JOB_STATE_CANCELLED, std::move(reason));
}

bool JobStateMachine::ExpireIfPastDeadline() {
  if (deadline_ == absl::ZeroDuration() || IsTerminal(state_)) return false;
  if (clock_.Now() < create_time_ + deadline_) return false;
  mesh::v1::RootCause cause;
  cause.set_rank(-1);
  cause.set_message(absl::StrCat("deadline of ", FormatDurationShort(deadline_),
                                 " after submission passed in state ", JobStateName(state_)));
  return Fail(std::move(cause)).ok();
}

void JobStateMachine::ToProto(mesh::v1::Job& job) const {
  job.set_state(state_);
  job.set_pending_reason(pending_reason_);
  job.set_generation(generation_);
  job.set_restarts(restarts_);
  job.set_create_time_unix_ms(absl::ToUnixMillis(create_time_));
  job.set_update_time_unix_ms(absl::ToUnixMillis(update_time_));
  if (has_root_cause_) {
    *job.mutable_root_cause() = root_cause_;
  } else {
    job.clear_root_cause();
  }
  job.clear_events();
  for (const JobEventRecord& event : events_) *job.add_events() = coordinator::ToProto(event);
}

}  // namespace mesh::coordinator
