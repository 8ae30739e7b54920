// WorkerSupervisor against a fake launcher: no process is ever started.
#include "agent/worker_supervisor.h"

#include <signal.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"

namespace mesh::agent {
namespace worker_supervisor_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Records launches and signals; the test decides when and how each process
// "exits" by calling Exit(), from the test thread (the real launcher uses
// its own thread; the supervisor must not care).
class FakeProcessLauncher final : public ProcessLauncher {
 public:
  struct Terminated {
    pid_t pid;
    absl::Duration grace;
  };

  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec, ExitCallback on_exit) override {
    absl::MutexLock lock(&mu_);
    if (!spec.argv.empty() && spec.argv[0] == "missing") {
      return absl::NotFoundError("cannot execute 'missing': not found");
    }
    const pid_t pid = next_pid_++;
    processes_[pid] = Process{spec, std::move(on_exit)};
    launched_.push_back(pid);
    return pid;
  }

  absl::Status Signal(pid_t pid, int signal) override {
    absl::MutexLock lock(&mu_);
    if (processes_.count(pid) == 0) return absl::NotFoundError("no such process");
    signals_.push_back({pid, signal});
    return absl::OkStatus();
  }

  absl::Status Terminate(pid_t pid, absl::Duration grace) override {
    absl::MutexLock lock(&mu_);
    if (processes_.count(pid) == 0) return absl::NotFoundError("no such process");
    terminated_.push_back({pid, grace});
    return absl::OkStatus();
  }

  // Reports `pid` as exited with `code` (>= 0) or killed by `signal`.
  void Exit(pid_t pid, int code, int signal = 0) {
    ExitCallback callback;
    {
      absl::MutexLock lock(&mu_);
      auto it = processes_.find(pid);
      ASSERT_NE(it, processes_.end());
      callback = std::move(it->second.on_exit);
      processes_.erase(it);
    }
    ExitInfo exit;
    exit.pid = pid;
    exit.exit_code = signal == 0 ? code : -1;
    exit.signal = signal;
    if (callback) callback(exit);
  }

  std::vector<pid_t> launched() {
    absl::MutexLock lock(&mu_);
    return launched_;
  }
  std::vector<Terminated> terminated() {
    absl::MutexLock lock(&mu_);
    return terminated_;
  }
  LaunchSpec spec(pid_t pid) {
    absl::MutexLock lock(&mu_);
    return processes_.at(pid).spec;
  }

 private:
  struct Process {
    LaunchSpec spec;
    ExitCallback on_exit;
  };
  absl::Mutex mu_;
  pid_t next_pid_ ABSL_GUARDED_BY(mu_) = 1000;
  std::map<pid_t, Process> processes_ ABSL_GUARDED_BY(mu_);
  std::vector<pid_t> launched_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<pid_t, int>> signals_ ABSL_GUARDED_BY(mu_);
  std::vector<Terminated> terminated_ ABSL_GUARDED_BY(mu_);
};

std::vector<RankLaunch> Ranks(std::vector<int> ranks) {
  std::vector<RankLaunch> out;
  for (int rank : ranks) {
    RankLaunch r;
    r.rank = rank;
    r.spec.argv = {"/bin/worker", std::to_string(rank)};
    out.push_back(r);
  }
  return out;
}

class WorkerSupervisorTest : public ::testing::Test {
 protected:
  std::unique_ptr<WorkerSupervisor> MakeSupervisor() {
    SupervisorOptions options;
    options.grace = absl::Seconds(3);
    return std::make_unique<WorkerSupervisor>(&launcher_, "job-7", 4, options,
                                              [this](const RankExit& exit) {
                                                absl::MutexLock lock(&mu_);
                                                exits_.push_back(exit);
                                              });
  }
  std::vector<RankExit> exits() {
    absl::MutexLock lock(&mu_);
    return exits_;
  }

  FakeProcessLauncher launcher_;
  absl::Mutex mu_;
  std::vector<RankExit> exits_ ABSL_GUARDED_BY(mu_);
};

TEST_F(WorkerSupervisorTest, ReportsEachExitWithItsRank) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Ranks({4, 5})).ok());
  const std::vector<pid_t> pids = launcher_.launched();
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_THAT(launcher_.spec(pids[1]).argv, ElementsAre("/bin/worker", "5"));
  EXPECT_EQ(supervisor->running(), 2);

  launcher_.Exit(pids[1], 0, SIGSEGV);
  launcher_.Exit(pids[0], 3);
  const std::vector<RankExit> got = exits();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].rank, 5);
  EXPECT_EQ(got[0].exit.signal, SIGSEGV);
  EXPECT_EQ(got[0].job_id, "job-7");
  EXPECT_EQ(got[0].generation, 4);
  EXPECT_FALSE(got[0].stopped);
  EXPECT_EQ(got[1].rank, 4);
  EXPECT_EQ(got[1].exit.exit_code, 3);
  EXPECT_EQ(supervisor->running(), 0);
  EXPECT_TRUE(supervisor->WaitAllExited(absl::ZeroDuration()).ok());
  // Nothing was terminated: the workers ended on their own.
  EXPECT_THAT(launcher_.terminated(), IsEmpty());
}

TEST_F(WorkerSupervisorTest, StopTerminatesEveryRunningWorkerWithTheGrace) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Ranks({0, 1, 2})).ok());
  const std::vector<pid_t> pids = launcher_.launched();
  launcher_.Exit(pids[0], 0);  // already done before the cancel
  supervisor->Stop();
  const auto terminated = launcher_.terminated();
  ASSERT_EQ(terminated.size(), 2u);
  EXPECT_EQ(terminated[0].pid, pids[1]);
  EXPECT_EQ(terminated[1].pid, pids[2]);
  EXPECT_EQ(terminated[0].grace, absl::Seconds(3));

  auto wait = supervisor->WaitAllExited(absl::Milliseconds(10));
  EXPECT_EQ(wait.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(wait.message(), HasSubstr("job-7 generation 4: 2 worker(s) still running"));
  EXPECT_THAT(wait.message(), HasSubstr("ranks 1, 2"));

  launcher_.Exit(pids[1], 0, SIGTERM);
  launcher_.Exit(pids[2], 0, SIGKILL);
  const std::vector<RankExit> got = exits();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got[0].stopped);
  EXPECT_TRUE(got[1].stopped);
  EXPECT_TRUE(got[2].stopped);
  EXPECT_TRUE(supervisor->WaitAllExited(absl::ZeroDuration()).ok());

  supervisor->Stop();  // idempotent, nothing left to terminate
  EXPECT_EQ(launcher_.terminated().size(), 2u);
}

TEST_F(WorkerSupervisorTest, ExitCallbackMayStopTheOthers) {
  // The agent's reaction to a failure: stop the rest of the generation.
  std::unique_ptr<WorkerSupervisor> supervisor;
  SupervisorOptions options;
  supervisor = std::make_unique<WorkerSupervisor>(&launcher_, "job-7", 0, options,
                                                  [&](const RankExit& exit) {
                                                    if (exit.exit.exit_code != 0)
                                                      supervisor->Stop();
                                                  });
  ASSERT_TRUE(supervisor->Start(Ranks({0, 1})).ok());
  const std::vector<pid_t> pids = launcher_.launched();
  launcher_.Exit(pids[0], 1);
  ASSERT_EQ(launcher_.terminated().size(), 1u);
  EXPECT_EQ(launcher_.terminated()[0].pid, pids[1]);
}

TEST_F(WorkerSupervisorTest, LaunchFailureStopsTheRanksAlreadyStarted) {
  auto supervisor = MakeSupervisor();
  std::vector<RankLaunch> ranks = Ranks({0, 1, 2});
  ranks[2].spec.argv = {"missing"};
  absl::Status status = supervisor->Start(ranks);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("job job-7 generation 4 rank 2: cannot execute"));
  const auto terminated = launcher_.terminated();
  ASSERT_EQ(terminated.size(), 2u);
  EXPECT_EQ(supervisor->running(), 2);  // until their exits arrive
  EXPECT_EQ(supervisor->Start(Ranks({0})).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerSupervisorTest, BadStarts) {
  auto supervisor = MakeSupervisor();
  EXPECT_EQ(supervisor->Start({}).code(), absl::StatusCode::kInvalidArgument);
  absl::Status twice = supervisor->Start(Ranks({1, 1}));
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(), HasSubstr("rank 1 is listed twice"));
  EXPECT_THAT(launcher_.launched(), IsEmpty());
  ASSERT_TRUE(supervisor->Start(Ranks({0})).ok());
  EXPECT_EQ(supervisor->Start(Ranks({1})).code(), absl::StatusCode::kFailedPrecondition);

  auto stopped = MakeSupervisor();
  stopped->Stop();
  EXPECT_EQ(stopped->Start(Ranks({0})).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerSupervisorTest, DestructionStopsWorkersAndSilencesLaterExits) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Ranks({0})).ok());
  const pid_t pid = launcher_.launched()[0];
  supervisor.reset();
  ASSERT_EQ(launcher_.terminated().size(), 1u);
  EXPECT_EQ(launcher_.terminated()[0].pid, pid);
  launcher_.Exit(pid, 0, SIGTERM);  // arrives after the supervisor is gone
  EXPECT_THAT(exits(), IsEmpty());
}

// --- Relaunch: one rank started again inside a running supervisor. ---

RankLaunch OneRank(int rank, std::string program = "/bin/worker") {
  RankLaunch r;
  r.rank = rank;
  r.spec.argv = {std::move(program), "again"};
  return r;
}

TEST_F(WorkerSupervisorTest, RelaunchStartsAnExitedRankAgainAndReportsItsExit) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Ranks({0, 1})).ok());
  const std::vector<pid_t> first = launcher_.launched();
  launcher_.Exit(first[1], 1);
  EXPECT_EQ(supervisor->running(), 1);

  absl::StatusOr<pid_t> pid = supervisor->Relaunch(OneRank(1));
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_THAT(launcher_.launched(), ElementsAre(first[0], first[1], *pid));
  EXPECT_THAT(launcher_.spec(*pid).argv, ElementsAre("/bin/worker", "again"));
  EXPECT_EQ(supervisor->running(), 2);

  launcher_.Exit(*pid, 3);
  const std::vector<RankExit> got = exits();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].rank, 1);
  EXPECT_EQ(got[1].exit.pid, *pid);
  EXPECT_EQ(got[1].exit.exit_code, 3);
  EXPECT_EQ(got[1].generation, 4);
  EXPECT_FALSE(got[1].stopped);
  EXPECT_EQ(supervisor->running(), 1);
  // And again, as often as the rank exits.
  ASSERT_TRUE(supervisor->Relaunch(OneRank(1)).ok());
  EXPECT_EQ(supervisor->running(), 2);
}

TEST_F(WorkerSupervisorTest, RelaunchAfterEveryWorkerExitedRunsAgainAndIsWaitedFor) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Ranks({0, 1})).ok());
  for (pid_t pid : launcher_.launched()) launcher_.Exit(pid, 1);
  ASSERT_TRUE(supervisor->WaitAllExited(absl::ZeroDuration()).ok());

  absl::StatusOr<pid_t> pid = supervisor->Relaunch(OneRank(0));
  ASSERT_TRUE(pid.ok()) << pid.status();
  const absl::Status wait = supervisor->WaitAllExited(absl::Milliseconds(10));
  EXPECT_EQ(wait.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(wait.message(), HasSubstr("1 worker(s) still running"));
  EXPECT_THAT(wait.message(), HasSubstr("ranks 0"));
  launcher_.Exit(*pid, 0);
  EXPECT_TRUE(supervisor->WaitAllExited(absl::ZeroDuration()).ok());
  EXPECT_EQ(exits().size(), 3u);
}

TEST_F(WorkerSupervisorTest, StopTerminatesARelaunchedRank) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Ranks({0, 1})).ok());
  const std::vector<pid_t> first = launcher_.launched();
  launcher_.Exit(first[0], 1);
  absl::StatusOr<pid_t> pid = supervisor->Relaunch(OneRank(0));
  ASSERT_TRUE(pid.ok()) << pid.status();

  supervisor->Stop();
  const auto terminated = launcher_.terminated();
  ASSERT_EQ(terminated.size(), 2u);
  EXPECT_EQ(terminated[0].pid, *pid);  // rank 0's new process
  EXPECT_EQ(terminated[0].grace, absl::Seconds(3));
  EXPECT_EQ(terminated[1].pid, first[1]);
  launcher_.Exit(*pid, 0, SIGTERM);
  launcher_.Exit(first[1], 0, SIGTERM);
  const std::vector<RankExit> got = exits();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1].rank, 0);
  EXPECT_TRUE(got[1].stopped);
  EXPECT_TRUE(supervisor->WaitAllExited(absl::ZeroDuration()).ok());
}

TEST_F(WorkerSupervisorTest, RelaunchIsRefusedAfterStopForARunningRankAndForAnUnknownRank) {
  auto supervisor = MakeSupervisor();
  // Before Start every rank is unknown.
  EXPECT_EQ(supervisor->Relaunch(OneRank(0)).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(supervisor->Start(Ranks({0, 1})).ok());
  const std::vector<pid_t> first = launcher_.launched();

  const absl::Status running = supervisor->Relaunch(OneRank(1)).status();
  EXPECT_EQ(running.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(running.message(), HasSubstr("job job-7 generation 4 rank 1 still runs"));

  const absl::Status unknown = supervisor->Relaunch(OneRank(7)).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("rank 7 was never launched"));

  launcher_.Exit(first[1], 1);
  supervisor->Stop();
  const absl::Status stopped = supervisor->Relaunch(OneRank(1)).status();
  EXPECT_EQ(stopped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stopped.message(), HasSubstr("supervisor already stopped"));
  // Nothing was launched by the refused calls.
  EXPECT_EQ(launcher_.launched().size(), 2u);
}

TEST_F(WorkerSupervisorTest, ARelaunchThatCannotStartLeavesTheRankExitedAndTheOthersAlone) {
  auto supervisor = MakeSupervisor();
  ASSERT_TRUE(supervisor->Start(Ranks({0, 1})).ok());
  const std::vector<pid_t> first = launcher_.launched();
  launcher_.Exit(first[1], 1);

  const absl::Status failed = supervisor->Relaunch(OneRank(1, "missing")).status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(failed.message(), HasSubstr("job job-7 generation 4 rank 1: cannot execute"));
  EXPECT_EQ(supervisor->running(), 1);
  EXPECT_THAT(launcher_.terminated(), IsEmpty());  // rank 0 keeps running
  // The rank may be tried again.
  EXPECT_TRUE(supervisor->Relaunch(OneRank(1)).ok());
  EXPECT_EQ(supervisor->running(), 2);
}

}  // namespace worker_supervisor_test
}  // namespace mesh::agent
