#include "coordinator/job_state.h"

#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/time.h"
#include "common/clock.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace job_state_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::mesh::v1::JOB_STATE_CANCELLED;
using ::mesh::v1::JOB_STATE_FAILED;
using ::mesh::v1::JOB_STATE_PENDING;
using ::mesh::v1::JOB_STATE_RESTARTING;
using ::mesh::v1::JOB_STATE_RUNNING;
using ::mesh::v1::JOB_STATE_SCHEDULED;
using ::mesh::v1::JOB_STATE_SUCCEEDED;
using ::mesh::v1::JOB_STATE_UNSPECIFIED;
using ::mesh::v1::RootCause;
using ::testing::HasSubstr;
using Code = absl::StatusCode;

constexpr JobState kAll[] = {JOB_STATE_UNSPECIFIED, JOB_STATE_PENDING,    JOB_STATE_SCHEDULED,
                             JOB_STATE_RUNNING,     JOB_STATE_RESTARTING, JOB_STATE_SUCCEEDED,
                             JOB_STATE_FAILED,      JOB_STATE_CANCELLED};

// The diagram in job_state.h, written out edge by edge.
bool Legal(JobState from, JobState to) {
  const std::vector<std::pair<JobState, JobState>> edges = {
      {JOB_STATE_PENDING, JOB_STATE_SCHEDULED},    {JOB_STATE_PENDING, JOB_STATE_FAILED},
      {JOB_STATE_PENDING, JOB_STATE_CANCELLED},    {JOB_STATE_SCHEDULED, JOB_STATE_RUNNING},
      {JOB_STATE_SCHEDULED, JOB_STATE_RESTARTING}, {JOB_STATE_SCHEDULED, JOB_STATE_FAILED},
      {JOB_STATE_SCHEDULED, JOB_STATE_CANCELLED},  {JOB_STATE_RUNNING, JOB_STATE_SUCCEEDED},
      {JOB_STATE_RUNNING, JOB_STATE_RESTARTING},   {JOB_STATE_RUNNING, JOB_STATE_FAILED},
      {JOB_STATE_RUNNING, JOB_STATE_CANCELLED},    {JOB_STATE_RESTARTING, JOB_STATE_SCHEDULED},
      {JOB_STATE_RESTARTING, JOB_STATE_PENDING},   {JOB_STATE_RESTARTING, JOB_STATE_FAILED},
      {JOB_STATE_RESTARTING, JOB_STATE_CANCELLED},
  };
  for (const auto& [a, b] : edges) {
    if (a == from && b == to) return true;
  }
  return false;
}

TEST(JobStateTest, EveryPairOfStates) {
  int legal = 0;
  for (JobState from : kAll) {
    for (JobState to : kAll) {
      const absl::Status status = CheckTransition(from, to);
      if (Legal(from, to)) {
        ++legal;
        EXPECT_THAT(status, IsOk()) << JobStateName(from) << " -> " << JobStateName(to);
      } else {
        EXPECT_THAT(status, StatusIs(Code::kFailedPrecondition,
                                     HasSubstr(absl::StrCat("from ", JobStateName(from), " to ",
                                                            JobStateName(to)))))
            << JobStateName(from) << " -> " << JobStateName(to);
      }
    }
  }
  EXPECT_EQ(legal, 15);
}

TEST(JobStateTest, TerminalStates) {
  for (JobState state : kAll) {
    const bool terminal =
        state == JOB_STATE_SUCCEEDED || state == JOB_STATE_FAILED || state == JOB_STATE_CANCELLED;
    EXPECT_EQ(IsTerminal(state), terminal) << JobStateName(state);
  }
  EXPECT_EQ(JobStateName(static_cast<JobState>(42)), "UNKNOWN(42)");
}

class JobStateMachineTest : public ::testing::Test {
 protected:
  RootCause Exit(int rank, int code, int64_t generation) {
    RootCause cause;
    cause.set_rank(rank);
    cause.set_node("node-b");
    cause.set_generation(generation);
    cause.set_exit_code(code);
    cause.set_message(absl::StrCat("rank ", rank, " (node node-b) exited with code ", code));
    return cause;
  }

  FakeClock clock_;
};

TEST_F(JobStateMachineTest, SubmissionIsTheFirstEvent) {
  const absl::Time t0 = clock_.Now();
  JobStateMachine job("j1", 0, absl::ZeroDuration(), "waiting for 2 nodes", clock_);
  EXPECT_EQ(job.state(), JOB_STATE_PENDING);
  EXPECT_EQ(job.pending_reason(), "waiting for 2 nodes");
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.create_time(), t0);
  ASSERT_EQ(job.events().size(), 1u);
  EXPECT_EQ(job.events()[0].from, JOB_STATE_UNSPECIFIED);
  EXPECT_EQ(job.events()[0].to, JOB_STATE_PENDING);
  EXPECT_EQ(job.events()[0].time, t0);
  EXPECT_FALSE(job.has_root_cause());
}

TEST_F(JobStateMachineTest, HappyPathEventsCarryClockTimes) {
  const absl::Time t0 = clock_.Now();
  JobStateMachine job("j1", 0, absl::ZeroDuration(), "", clock_);
  clock_.Advance(absl::Seconds(1));
  ASSERT_THAT(job.Schedule("placed on node-a, node-b"), IsOk());
  clock_.Advance(absl::Seconds(2));
  ASSERT_THAT(job.Start("8/8 workers running"), IsOk());
  clock_.Advance(absl::Seconds(3));
  ASSERT_THAT(job.Succeed("8/8 workers exited 0"), IsOk());

  EXPECT_EQ(job.state(), JOB_STATE_SUCCEEDED);
  const auto& events = job.events();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[1].time, t0 + absl::Seconds(1));
  EXPECT_EQ(events[1].from, JOB_STATE_PENDING);
  EXPECT_EQ(events[1].to, JOB_STATE_SCHEDULED);
  EXPECT_EQ(events[1].reason, "placed on node-a, node-b");
  EXPECT_EQ(events[2].time, t0 + absl::Seconds(3));
  EXPECT_EQ(events[2].to, JOB_STATE_RUNNING);
  EXPECT_EQ(events[3].time, t0 + absl::Seconds(6));
  EXPECT_EQ(events[3].to, JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.update_time(), t0 + absl::Seconds(6));
  EXPECT_EQ(job.create_time(), t0);

  mesh::v1::Job proto;
  job.ToProto(proto);
  EXPECT_EQ(proto.state(), JOB_STATE_SUCCEEDED);
  ASSERT_EQ(proto.events_size(), 4);
  EXPECT_EQ(proto.events(3).time_unix_ms(), absl::ToUnixMillis(t0 + absl::Seconds(6)));
  EXPECT_EQ(proto.create_time_unix_ms(), absl::ToUnixMillis(t0));
  EXPECT_FALSE(proto.has_root_cause());
}

TEST_F(JobStateMachineTest, IllegalCallsChangeNothing) {
  JobStateMachine job("j1", 1, absl::ZeroDuration(), "", clock_);
  EXPECT_THAT(job.Start(""), StatusIs(Code::kFailedPrecondition,
                                      HasSubstr("job j1: cannot go from PENDING to RUNNING")));
  EXPECT_THAT(job.Succeed(""), StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(job.WorkerFailed(Exit(0, 1, 0)), StatusIs(Code::kFailedPrecondition));
  EXPECT_EQ(job.state(), JOB_STATE_PENDING);
  EXPECT_EQ(job.events().size(), 1u);
  EXPECT_EQ(job.restarts(), 0);
}

TEST_F(JobStateMachineTest, ResizeBumpsTheGenerationButNotTheRestarts) {
  JobStateMachine job("j1", 0, absl::ZeroDuration(), "", clock_);
  // Not placed yet: nothing to resize.
  EXPECT_THAT(job.Resize(std::nullopt, "grow"), StatusIs(Code::kFailedPrecondition));
  ASSERT_THAT(job.Schedule(""), IsOk());
  ASSERT_THAT(job.Start(""), IsOk());

  mesh::v1::RootCause lost;
  lost.set_rank(-1);
  lost.set_node("n3");
  lost.set_generation(0);
  ASSERT_THAT(job.Resize(lost, "node n3 lost; placing again"), IsOk());
  EXPECT_EQ(job.state(), JOB_STATE_RESTARTING);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 0) << "max_restarts 0, and still restarted";
  EXPECT_EQ(job.events().back().reason, "node n3 lost; placing again");
  EXPECT_EQ(job.events().back().generation, 1);
  ASSERT_TRUE(job.has_root_cause());
  EXPECT_EQ(job.root_cause().node(), "n3");

  // Only from SCHEDULED or RUNNING, and never for another generation.
  EXPECT_THAT(job.Resize(std::nullopt, "again"), StatusIs(Code::kFailedPrecondition));
  ASSERT_THAT(job.Schedule("placed again"), IsOk());
  EXPECT_THAT(job.Resize(lost, "stale"), StatusIs(Code::kAborted));
  lost.set_generation(5);
  EXPECT_THAT(job.Resize(lost, "future"), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(job.generation(), 1);

  // Without a cause (growing), the root cause stays.
  ASSERT_THAT(job.Start(""), IsOk());
  ASSERT_THAT(job.Resize(std::nullopt, "grow"), IsOk());
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.root_cause().node(), "n3");
  EXPECT_EQ(job.restarts(), 0);
}

TEST_F(JobStateMachineTest, PendingReasonUpdatesWithoutEvents) {
  JobStateMachine job("j1", 0, absl::ZeroDuration(), "a", clock_);
  clock_.Advance(absl::Seconds(1));
  ASSERT_THAT(job.SetPending("b"), IsOk());
  EXPECT_EQ(job.pending_reason(), "b");
  EXPECT_EQ(job.events().size(), 1u);
  EXPECT_EQ(job.update_time(), clock_.Now());
  ASSERT_THAT(job.Schedule(""), IsOk());
  EXPECT_EQ(job.pending_reason(), "");
  EXPECT_THAT(job.SetPending("c"), StatusIs(Code::kFailedPrecondition));
}

TEST_F(JobStateMachineTest, RestartAccountingThenFailedWithRootCause) {
  JobStateMachine job("j1", 2, absl::ZeroDuration(), "", clock_);
  ASSERT_THAT(job.Schedule(""), IsOk());
  ASSERT_THAT(job.Start(""), IsOk());

  // Failure 1: restart 1, generation 1.
  absl::StatusOr<JobState> next = job.WorkerFailed(Exit(3, 1, 0));
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(*next, JOB_STATE_RESTARTING);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.events().back().generation, 1);
  EXPECT_THAT(job.events().back().reason, HasSubstr("restart 1 of 2"));
  ASSERT_TRUE(job.has_root_cause());
  EXPECT_EQ(job.root_cause().rank(), 3);
  EXPECT_EQ(job.root_cause().generation(), 0);

  // Another rank of generation 0 dies while restarting: stale.
  EXPECT_THAT(job.WorkerFailed(Exit(5, 9, 0)), StatusIs(Code::kAborted));
  EXPECT_EQ(job.root_cause().rank(), 3);
  // A report from the future is a bug in the caller.
  EXPECT_THAT(job.WorkerFailed(Exit(5, 9, 7)), StatusIs(Code::kInvalidArgument));

  // Relaunch: RESTARTING → SCHEDULED → RUNNING.
  ASSERT_THAT(job.Schedule("relaunch"), IsOk());
  // Failure 2 during launch (SCHEDULED): restart 2, generation 2.
  next = job.WorkerFailed(Exit(0, 127, 1));
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(*next, JOB_STATE_RESTARTING);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.restarts(), 2);

  // No nodes for the relaunch: back to PENDING, then on.
  ASSERT_THAT(job.SetPending("waiting for 2 nodes; 1 available"), IsOk());
  EXPECT_EQ(job.pending_reason(), "waiting for 2 nodes; 1 available");
  ASSERT_THAT(job.Schedule(""), IsOk());
  ASSERT_THAT(job.Start(""), IsOk());

  // Failure 3: no restarts left.
  RootCause signal;
  signal.set_rank(6);
  signal.set_node("node-b");
  signal.set_generation(2);
  signal.set_signal(9);
  signal.set_message("rank 6 (node node-b) killed by signal 9 (SIGKILL)");
  next = job.WorkerFailed(signal);
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(*next, JOB_STATE_FAILED);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_EQ(job.root_cause().rank(), 6);
  EXPECT_EQ(job.root_cause().signal(), 9);
  EXPECT_EQ(job.root_cause().generation(), 2);
  EXPECT_THAT(job.events().back().reason,
              HasSubstr("killed by signal 9 (SIGKILL); no restarts left (max_restarts 2)"));

  // Terminal: nothing moves it.
  EXPECT_THAT(job.Cancel("late"), StatusIs(Code::kFailedPrecondition, HasSubstr("finished")));
  EXPECT_THAT(job.Schedule(""), StatusIs(Code::kFailedPrecondition));

  mesh::v1::Job proto;
  job.ToProto(proto);
  EXPECT_EQ(proto.restarts(), 2);
  EXPECT_EQ(proto.root_cause().rank(), 6);
  EXPECT_EQ(proto.events_size(), static_cast<int>(job.events().size()));
}

TEST_F(JobStateMachineTest, ZeroRestartsFailsOnFirstFailure) {
  JobStateMachine job("j1", 0, absl::ZeroDuration(), "", clock_);
  ASSERT_THAT(job.Schedule(""), IsOk());
  ASSERT_THAT(job.Start(""), IsOk());
  EXPECT_EQ(job.WorkerFailed(Exit(1, 2, 0)).value(), JOB_STATE_FAILED);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.root_cause().exit_code(), 2);
}

TEST_F(JobStateMachineTest, CancelFromEveryNonTerminalState) {
  // PENDING, SCHEDULED, RUNNING, RESTARTING.
  for (int steps = 0; steps < 4; ++steps) {
    JobStateMachine job("j1", 1, absl::ZeroDuration(), "", clock_);
    if (steps >= 1) {
      ASSERT_THAT(job.Schedule(""), IsOk());
    }
    if (steps >= 2) {
      ASSERT_THAT(job.Start(""), IsOk());
    }
    if (steps >= 3) {
      ASSERT_THAT(job.WorkerFailed(Exit(0, 1, 0)), IsOk());
    }
    const JobState before = job.state();
    clock_.Advance(absl::Seconds(1));
    ASSERT_THAT(job.Cancel("by user"), IsOk()) << JobStateName(before);
    EXPECT_EQ(job.state(), JOB_STATE_CANCELLED);
    EXPECT_EQ(job.events().back().from, before);
    EXPECT_EQ(job.events().back().reason, "by user");
    EXPECT_EQ(job.events().back().time, clock_.Now());
    EXPECT_THAT(job.Cancel("again"), StatusIs(Code::kFailedPrecondition));
  }
}

TEST_F(JobStateMachineTest, RecoverInPlaceCountsARestartAndStaysRunning) {
  JobStateMachine job("j1", 2, absl::ZeroDuration(), "", clock_);
  ASSERT_THAT(job.Schedule(""), IsOk());
  ASSERT_THAT(job.Start(""), IsOk());
  const size_t events = job.events().size();
  clock_.Advance(absl::Seconds(4));

  ASSERT_THAT(job.RecoverInPlace(Exit(1, 1, 0)), IsOk());
  EXPECT_EQ(job.state(), JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.update_time(), clock_.Now());
  ASSERT_EQ(job.events().size(), events + 1);
  const JobEventRecord& event = job.events().back();
  EXPECT_EQ(event.from, JOB_STATE_RUNNING);
  EXPECT_EQ(event.to, JOB_STATE_RUNNING);
  EXPECT_EQ(event.generation, 0);
  EXPECT_EQ(event.time, clock_.Now());
  EXPECT_THAT(event.reason, HasSubstr("rank 1 (node node-b) exited with code 1; relaunched in "
                                      "place, restart 1 of 2"));
  ASSERT_TRUE(job.has_root_cause());
  EXPECT_EQ(job.root_cause().rank(), 1);
  EXPECT_EQ(job.root_cause().generation(), 0);

  // The second uses the last restart; then none is left, nothing changes,
  // and WorkerFailed fails the job.
  ASSERT_THAT(job.RecoverInPlace(Exit(3, 9, 0)), IsOk());
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_THAT(job.events().back().reason, HasSubstr("restart 2 of 2"));
  EXPECT_THAT(job.RecoverInPlace(Exit(2, 1, 0)),
              StatusIs(Code::kFailedPrecondition, HasSubstr("no restarts left")));
  EXPECT_EQ(job.state(), JOB_STATE_RUNNING);
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_EQ(job.events().size(), events + 2);
  EXPECT_EQ(job.root_cause().rank(), 3);
  EXPECT_EQ(job.WorkerFailed(Exit(2, 1, 0)).value(), JOB_STATE_FAILED);
  EXPECT_EQ(job.generation(), 0);

  mesh::v1::Job proto;
  job.ToProto(proto);
  EXPECT_EQ(proto.restarts(), 2);
  EXPECT_EQ(proto.generation(), 0);
}

TEST_F(JobStateMachineTest, RecoverInPlaceOnlyForTheCurrentGenerationWhileRunning) {
  JobStateMachine job("j1", 3, absl::ZeroDuration(), "", clock_);
  // Not running yet.
  EXPECT_THAT(job.RecoverInPlace(Exit(1, 1, 0)), StatusIs(Code::kFailedPrecondition));
  ASSERT_THAT(job.Schedule(""), IsOk());
  EXPECT_THAT(job.RecoverInPlace(Exit(1, 1, 0)),
              StatusIs(Code::kFailedPrecondition, HasSubstr("SCHEDULED")));
  EXPECT_EQ(job.state(), JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_FALSE(job.has_root_cause());

  // Generation 1, RUNNING.
  ASSERT_THAT(job.Start(""), IsOk());
  ASSERT_THAT(job.WorkerFailed(Exit(0, 1, 0)), IsOk());
  EXPECT_THAT(job.RecoverInPlace(Exit(1, 1, 1)),
              StatusIs(Code::kFailedPrecondition, HasSubstr("RESTARTING")));
  ASSERT_THAT(job.Schedule(""), IsOk());
  ASSERT_THAT(job.Start(""), IsOk());
  const size_t events = job.events().size();

  EXPECT_THAT(job.RecoverInPlace(Exit(1, 1, 0)),
              StatusIs(Code::kAborted, HasSubstr("failure of generation 0 is stale")));
  EXPECT_THAT(job.RecoverInPlace(Exit(1, 1, 2)), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(job.state(), JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.events().size(), events);
  EXPECT_EQ(job.root_cause().generation(), 0);

  // Terminal: never.
  ASSERT_THAT(job.Cancel("by user"), IsOk());
  EXPECT_THAT(job.RecoverInPlace(Exit(1, 1, 1)), StatusIs(Code::kFailedPrecondition));
  EXPECT_EQ(job.restarts(), 1);
}

TEST_F(JobStateMachineTest, FailWithoutRestart) {
  JobStateMachine job("j1", 5, absl::ZeroDuration(), "", clock_);
  RootCause lost;
  lost.set_rank(-1);
  lost.set_node("node-c");
  lost.set_message("node node-c lost: no heartbeat for 30s");
  ASSERT_THAT(job.Fail(lost), IsOk());
  EXPECT_EQ(job.state(), JOB_STATE_FAILED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.root_cause().node(), "node-c");
  EXPECT_EQ(job.events().back().reason, "node node-c lost: no heartbeat for 30s");
  EXPECT_THAT(job.Fail(lost), StatusIs(Code::kFailedPrecondition));
}

TEST_F(JobStateMachineTest, Deadline) {
  const absl::Time t0 = clock_.Now();
  JobStateMachine job("j1", 0, absl::Seconds(10), "", clock_);
  ASSERT_THAT(job.Schedule(""), IsOk());
  clock_.Advance(absl::Seconds(9));
  EXPECT_FALSE(job.ExpireIfPastDeadline());
  EXPECT_EQ(job.state(), JOB_STATE_SCHEDULED);
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(job.ExpireIfPastDeadline());
  EXPECT_EQ(job.state(), JOB_STATE_FAILED);
  EXPECT_EQ(job.events().back().time, t0 + absl::Seconds(10));
  EXPECT_EQ(job.root_cause().rank(), -1);
  EXPECT_THAT(job.root_cause().message(), HasSubstr("deadline of 10 s"));
  EXPECT_FALSE(job.ExpireIfPastDeadline());

  JobStateMachine forever("j2", 0, absl::ZeroDuration(), "", clock_);
  clock_.Advance(absl::Hours(1000));
  EXPECT_FALSE(forever.ExpireIfPastDeadline());
  EXPECT_EQ(forever.state(), JOB_STATE_PENDING);
}

}  // namespace job_state_test
}  // namespace mesh::coordinator

namespace mesh::coordinator {
namespace job_state_test {

TEST(JobStateRestoreTest, RestoresExactlyAndGoesOn) {
  FakeClock clock;
  RestoredJobState stored;
  stored.state = ::mesh::v1::JOB_STATE_RUNNING;
  stored.pending_reason = "ignored outside PENDING";
  stored.generation = 2;
  stored.restarts = 2;
  stored.create_time = clock.Now() - absl::Minutes(5);
  stored.update_time = clock.Now() - absl::Minutes(1);
  stored.has_root_cause = true;
  stored.root_cause.set_rank(3);
  stored.root_cause.set_generation(1);
  stored.events.push_back(JobEventRecord{stored.create_time, ::mesh::v1::JOB_STATE_UNSPECIFIED,
                                         ::mesh::v1::JOB_STATE_PENDING, "submitted", 0});
  auto machine =
      JobStateMachine::Restore("job-7", 3, absl::ZeroDuration(), std::move(stored), clock);
  ASSERT_TRUE(machine.ok()) << machine.status();
  JobStateMachine& job = **machine;
  EXPECT_EQ(job.state(), ::mesh::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.pending_reason(), "");
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_EQ(job.create_time(), clock.Now() - absl::Minutes(5));
  EXPECT_EQ(job.events().size(), 1u);  // Nothing added.
  ASSERT_TRUE(job.has_root_cause());
  EXPECT_EQ(job.root_cause().rank(), 3);

  // The restored job goes on from where it was: one restart left.
  ::mesh::v1::RootCause cause;
  cause.set_rank(0);
  cause.set_generation(2);
  auto next = job.WorkerFailed(cause);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, ::mesh::v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(job.generation(), 3);
  EXPECT_EQ(job.events().size(), 2u);
}

TEST(JobStateRestoreTest, RejectsImpossibleRecords) {
  FakeClock clock;
  RestoredJobState unspecified;
  unspecified.state = ::mesh::v1::JOB_STATE_UNSPECIFIED;
  EXPECT_EQ(
      JobStateMachine::Restore("j", 1, absl::ZeroDuration(), unspecified, clock).status().code(),
      absl::StatusCode::kInvalidArgument);
  RestoredJobState too_many;
  too_many.generation = 5;
  too_many.restarts = 2;
  EXPECT_EQ(JobStateMachine::Restore("j", 1, absl::ZeroDuration(), too_many, clock).status().code(),
            absl::StatusCode::kInvalidArgument);
  RestoredJobState negative;
  negative.generation = -1;
  EXPECT_EQ(JobStateMachine::Restore("j", 1, absl::ZeroDuration(), negative, clock).status().code(),
            absl::StatusCode::kInvalidArgument);
  negative.generation = 0;
  negative.restarts = -1;
  EXPECT_EQ(JobStateMachine::Restore("j", 1, absl::ZeroDuration(), negative, clock).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// In-place recoveries count restarts without a new generation.
TEST(JobStateRestoreTest, AcceptsMoreRestartsThanGenerations) {
  FakeClock clock;
  RestoredJobState stored;
  stored.state = ::mesh::v1::JOB_STATE_RUNNING;
  stored.generation = 0;
  stored.restarts = 1;
  auto machine = JobStateMachine::Restore("j", 2, absl::ZeroDuration(), std::move(stored), clock);
  ASSERT_TRUE(machine.ok()) << machine.status();
  JobStateMachine& job = **machine;
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 1);

  // It goes on: the last restart in place, then none.
  ::mesh::v1::RootCause cause;
  cause.set_rank(2);
  cause.set_generation(0);
  ASSERT_THAT(job.RecoverInPlace(cause), IsOk());
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_THAT(job.RecoverInPlace(cause), StatusIs(absl::StatusCode::kFailedPrecondition));

  // Still bounded by max_restarts.
  RestoredJobState too_many;
  too_many.state = ::mesh::v1::JOB_STATE_RUNNING;
  too_many.generation = 0;
  too_many.restarts = 3;
  EXPECT_THAT(JobStateMachine::Restore("j", 2, absl::ZeroDuration(), too_many, clock).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 of 2 restarts")));
}

}  // namespace job_state_test
}  // namespace mesh::coordinator
