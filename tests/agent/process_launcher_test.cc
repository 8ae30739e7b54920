// Integration tests of PosixProcessLauncher: real processes. The test uses a
// shell as the *worker* where convenient; the launcher never adds one.
#include "agent/process_launcher.h"

#include <dirent.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/job_isolation.h"
#include "agent/worker_supervisor.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh::agent {
namespace process_launcher_test {

using ::mesh::testing::IsAlive;
using ::mesh::testing::LiveProcessesInGroup;
using ::mesh::testing::WaitUntil;

using ::testing::ElementsAreArray;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kExitTimeout = absl::Seconds(10);
constexpr char kHelperVar[] = "MESH_LAUNCHER_TEST_AGENT_HELPER";

// Helper mode: the test binary re-executed as a tiny "agent" that launches
// one worker (sleep 60), prints its pid and waits to be killed. Runs before
// gtest's main when the variable is set.
struct AgentHelperMode {
  AgentHelperMode() {
    const char* mode = std::getenv(kHelperVar);
    if (mode == nullptr) return;
    PosixProcessLauncher launcher;
    LaunchSpec spec;
    spec.argv = {"/bin/sleep", "60"};
    auto pid = launcher.Launch(spec, nullptr);
    if (!pid.ok()) {
      std::fprintf(stderr, "helper: %s\n", pid.status().ToString().c_str());
      std::_Exit(1);
    }
    std::printf("%d\n", static_cast<int>(*pid));
    std::fflush(stdout);
    sleep(60);  // Killed by the test long before this.
    std::_Exit(0);
  }
} agent_helper_mode;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

class ProcessLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/mesh-launcher-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    launcher_ = std::make_unique<PosixProcessLauncher>();
  }
  void TearDown() override {
    launcher_.reset();  // kills anything left
    std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }

  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec) {
    return launcher_->Launch(spec, [this](const ExitInfo& exit) {
      absl::MutexLock lock(&mu_);
      exits_[exit.pid] = exit;
      exit_reported_.SignalAll();
    });
  }

  std::optional<ExitInfo> WaitForExit(pid_t pid, absl::Duration timeout = kExitTimeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    while (exits_.count(pid) == 0) {
      if (exit_reported_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) break;
    }
    if (exits_.count(pid) == 0) return std::nullopt;
    return exits_.at(pid);
  }

  // Launches `spec` and waits for its exit. Errors: the launch's, or
  // DEADLINE_EXCEEDED when no exit is reported within kExitTimeout.
  absl::StatusOr<ExitInfo> RunToExit(const LaunchSpec& spec) {
    absl::StatusOr<pid_t> pid = Launch(spec);
    if (!pid.ok()) return pid.status();
    std::optional<ExitInfo> exit = WaitForExit(*pid);
    if (!exit.has_value()) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", *pid, " reported no exit"));
    }
    return *exit;
  }

  LaunchSpec Spec(std::vector<std::string> argv) {
    LaunchSpec spec;
    spec.argv = std::move(argv);
    spec.env = {"PATH=/usr/bin:/bin"};
    spec.stdout_log = dir_ + "/out.log";
    spec.stderr_log = dir_ + "/err.log";
    return spec;
  }

  // Waits until the worker's stdout log contains `text`.
  bool WaitForOutput(const std::string& text) {
    return WaitUntil([&] { return ReadFile(dir_ + "/out.log").find(text) != std::string::npos; },
                     kExitTimeout);
  }

  std::string dir_;
  absl::Mutex mu_;
  std::map<pid_t, ExitInfo> exits_ ABSL_GUARDED_BY(mu_);
  absl::CondVar exit_reported_;  // CondVar, not Await: see WorkerSupervisor
  std::unique_ptr<PosixProcessLauncher> launcher_;
};

TEST_F(ProcessLauncherTest, TrueExitsZero) {
  auto pid = Launch(Spec({"/bin/true"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  auto exit = WaitForExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->pid, *pid);
  EXPECT_TRUE(exit->exited());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_EQ(exit->ToString(), "exit code 0");
}

TEST_F(ProcessLauncherTest, ExitCodeIsReported) {
  auto pid = Launch(Spec({"sh", "-c", "exit 3"}));  // found through the env's PATH
  ASSERT_TRUE(pid.ok()) << pid.status();
  auto exit = WaitForExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 3);
  EXPECT_EQ(exit->signal, 0);
}

TEST_F(ProcessLauncherTest, DeathBySignalIsReportedAsSignal) {
  auto pid = Launch(Spec({"/bin/sleep", "60"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(launcher_->Signal(*pid, SIGKILL).ok());
  auto exit = WaitForExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_FALSE(exit->exited());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_EQ(exit->exit_code, -1);
  EXPECT_THAT(exit->ToString(), HasSubstr("signal 9"));
}

TEST_F(ProcessLauncherTest, ExecFailuresAreClearErrors) {
  auto missing = Launch(Spec({"/nonexistent/worker", "x"}));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/worker"));

  auto not_in_path = Launch(Spec({"mesh-no-such-program"}));
  ASSERT_FALSE(not_in_path.ok());
  EXPECT_EQ(not_in_path.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(not_in_path.status().message(), HasSubstr("mesh-no-such-program"));
  EXPECT_THAT(not_in_path.status().message(), HasSubstr("PATH=/usr/bin:/bin"));

  const std::string not_executable = dir_ + "/script";
  std::ofstream(not_executable) << "#!/bin/sh\n";
  auto denied = Launch(Spec({not_executable}));
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.status().message(), HasSubstr(not_executable));

  LaunchSpec bad_dir = Spec({"/bin/true"});
  bad_dir.working_dir = dir_ + "/missing";
  auto no_dir = Launch(bad_dir);
  ASSERT_FALSE(no_dir.ok());
  EXPECT_EQ(no_dir.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_dir.status().message(), HasSubstr(dir_ + "/missing"));

  EXPECT_EQ(Launch(Spec({})).status().code(), absl::StatusCode::kInvalidArgument);
  LaunchSpec bad_env = Spec({"/bin/true"});
  bad_env.env = {"NOEQUALS"};
  EXPECT_EQ(Launch(bad_env).status().code(), absl::StatusCode::kInvalidArgument);

  // None of these left a process or an exit report behind.
  absl::MutexLock lock(&mu_);
  EXPECT_THAT(exits_, IsEmpty());
}

TEST_F(ProcessLauncherTest, ProgramIsFoundInTheWorkersPath) {
  ASSERT_EQ(mkdir((dir_ + "/bin").c_str(), 0755), 0);
  const std::string program = dir_ + "/bin/hello";
  std::ofstream(program) << "#!/bin/sh\necho hello from $0\n";
  ASSERT_EQ(chmod(program.c_str(), 0755), 0);
  LaunchSpec spec = Spec({"hello"});
  spec.env = {"PATH=/nonexistent:bin"};  // relative: against working_dir
  spec.working_dir = dir_;
  auto exit = RunToExit(spec);
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_EQ(ReadFile(spec.stdout_log), absl::StrCat("hello from ", program, "\n"));
}

TEST_F(ProcessLauncherTest, EnvironmentIsExactlyTheSpec) {
  LaunchSpec spec = Spec({"/usr/bin/env"});
  ::setenv("MESH_LAUNCHER_TEST_AGENT_ONLY", "1", 1);  // must not leak into the worker
  spec.env = {"A=1", "B=two words", "EMPTY="};
  auto exit = RunToExit(spec);
  ASSERT_TRUE(exit.ok()) << exit.status();
  std::vector<std::string> lines =
      absl::StrSplit(ReadFile(spec.stdout_log), '\n', absl::SkipEmpty());
  EXPECT_THAT(lines, ElementsAreArray(spec.env));
}

TEST_F(ProcessLauncherTest, WorkingDirIsHonoured) {
  LaunchSpec spec = Spec({"/bin/pwd", "-P"});
  spec.working_dir = dir_;
  auto exit = RunToExit(spec);
  ASSERT_TRUE(exit.ok()) << exit.status();
  char resolved[PATH_MAX];
  ASSERT_NE(realpath(dir_.c_str(), resolved), nullptr);
  EXPECT_EQ(ReadFile(spec.stdout_log), absl::StrCat(resolved, "\n"));
}

TEST_F(ProcessLauncherTest, StdoutAndStderrLandInTheirLogs) {
  LaunchSpec spec = Spec({"sh", "-c", "echo to-out; echo to-err >&2; echo more-out; exit 0"});
  auto exit = RunToExit(spec);
  ASSERT_TRUE(exit.ok()) << exit.status();
  // Complete as soon as the exit is reported.
  EXPECT_EQ(ReadFile(spec.stdout_log), "to-out\nmore-out\n");
  EXPECT_EQ(ReadFile(spec.stderr_log), "to-err\n");

  LaunchSpec merged = Spec({"sh", "-c", "echo a; echo b >&2"});
  merged.stdout_log = dir_ + "/merged.log";
  merged.stderr_log = "";
  ASSERT_TRUE(RunToExit(merged).ok());
  EXPECT_EQ(ReadFile(merged.stdout_log), "a\nb\n");
}

TEST_F(ProcessLauncherTest, LogCapRotatesAndKeepsTheNewestOutput) {
  constexpr int64_t kCap = 4096;
  // ~82 KB of output, 20 times the cap.
  LaunchSpec spec = Spec({"sh", "-c",
                          "i=0; while [ $i -lt 2000 ]; do "
                          "echo 0123456789012345678901234567890123456789; i=$((i+1)); done; "
                          "echo LAST"});
  spec.max_log_bytes = kCap;
  auto exit = RunToExit(spec);
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 0);
  const int64_t current = FileSize(spec.stdout_log);
  const int64_t previous = FileSize(spec.stdout_log + ".1");
  EXPECT_GT(current, 0);
  EXPECT_LE(current, kCap);
  EXPECT_EQ(previous, kCap);  // rotated exactly at the cap
  // Together they hold the newest output, unbroken, ending with the last line.
  const std::string tail = ReadFile(spec.stdout_log + ".1") + ReadFile(spec.stdout_log);
  EXPECT_THAT(tail, EndsWith("0123456789012345678901234567890123456789\nLAST\n"));
}

TEST_F(ProcessLauncherTest, AppendLogKeepsTheEarlierOutputAndCountsItAgainstTheCap) {
  LaunchSpec first = Spec({"sh", "-c", "echo first"});
  ASSERT_TRUE(RunToExit(first).ok());
  // Without append_log a launch starts its log afresh ...
  ASSERT_TRUE(RunToExit(Spec({"sh", "-c", "echo second"})).ok());
  EXPECT_EQ(ReadFile(first.stdout_log), "second\n");
  // ... with it the new output follows what is there.
  LaunchSpec again = Spec({"sh", "-c", "echo third"});
  again.append_log = true;
  ASSERT_TRUE(RunToExit(again).ok());
  EXPECT_EQ(ReadFile(again.stdout_log), "second\nthird\n");

  // The 13 bytes already there count against the cap: of "fourth\n" only
  // 3 bytes fit under 16, then the file rotates.
  LaunchSpec capped = Spec({"sh", "-c", "echo fourth"});
  capped.append_log = true;
  capped.max_log_bytes = 16;
  ASSERT_TRUE(RunToExit(capped).ok());
  EXPECT_EQ(ReadFile(capped.stdout_log + ".1"), "second\nthird\nfou");
  EXPECT_EQ(ReadFile(capped.stdout_log), "rth\n");
}

TEST_F(ProcessLauncherTest, TerminateSendsSigtermFirst) {
  auto pid = Launch(Spec({"/bin/sleep", "60"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(launcher_->Terminate(*pid, absl::Seconds(30)).ok());
  auto exit = WaitForExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGTERM);
}

TEST_F(ProcessLauncherTest, TerminateKillsAWorkerThatIgnoresSigterm) {
  // The ignored disposition is inherited by sleep, so the whole group ignores TERM.
  auto pid = Launch(Spec({"sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitForOutput("ready"));
  ASSERT_TRUE(launcher_->Terminate(*pid, absl::Milliseconds(300)).ok());
  auto exit = WaitForExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_TRUE(WaitUntil([&] { return LiveProcessesInGroup(*pid).empty(); }, kExitTimeout));
}

TEST_F(ProcessLauncherTest, TerminateLeavesNoGrandchildren) {
  auto pid = Launch(Spec({"sh", "-c", "sleep 60 & sleep 60 & echo ready; wait"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitForOutput("ready"));
  // The scan sees the worker and both grandchildren, in the worker's group.
  EXPECT_TRUE(WaitUntil([&] { return LiveProcessesInGroup(*pid).size() == 3; }, kExitTimeout));
  ASSERT_TRUE(launcher_->Terminate(*pid, absl::Seconds(2)).ok());
  ASSERT_TRUE(WaitForExit(*pid).has_value());
  EXPECT_TRUE(WaitUntil([&] { return LiveProcessesInGroup(*pid).empty(); }, kExitTimeout))
      << LiveProcessesInGroup(*pid).size() << " processes of the group survive";
}

TEST_F(ProcessLauncherTest, TerminateAfterTheLeaderExitedKillsStragglers) {
  auto pid = Launch(Spec({"sh", "-c", "sleep 60 & echo ready"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  auto exit = WaitForExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  ASSERT_EQ(LiveProcessesInGroup(*pid).size(), 1u);  // the orphaned sleep
  ASSERT_TRUE(launcher_->Terminate(*pid, absl::Seconds(2)).ok());
  EXPECT_TRUE(WaitUntil([&] { return LiveProcessesInGroup(*pid).empty(); }, kExitTimeout));
  // Once the group is empty the launcher forgets it.
  EXPECT_TRUE(
      WaitUntil([&] { return launcher_->Signal(*pid, 0).code() == absl::StatusCode::kNotFound; },
                kExitTimeout));
}

TEST_F(ProcessLauncherTest, WorkerGetsItsOwnSession) {
  auto pid = Launch(Spec({"/bin/sleep", "60"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(getpgid(*pid), *pid);
  EXPECT_EQ(getsid(*pid), *pid);
  EXPECT_NE(getsid(*pid), getsid(0));
}

TEST_F(ProcessLauncherTest, DestroyingTheLauncherKillsItsWorkers) {
  auto pid = Launch(Spec({"sh", "-c", "sleep 60 & sleep 60; wait"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitUntil([&] { return LiveProcessesInGroup(*pid).size() == 3; }, kExitTimeout));
  launcher_.reset();
  EXPECT_TRUE(WaitUntil([&] { return LiveProcessesInGroup(*pid).empty(); }, kExitTimeout));
}

TEST_F(ProcessLauncherTest, WorkerDiesWithItsAgent) {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(n, 0);
  exe[n] = '\0';
  auto agent = testing::Subprocess::Start({exe}, {absl::StrCat(kHelperVar, "=1")});
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto line = agent->ReadLine(kExitTimeout);
  ASSERT_TRUE(line.ok()) << line.status();
  pid_t worker = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*line, &worker)) << *line;
  ASSERT_TRUE(IsAlive(worker));

  agent->Signal(SIGKILL);
  ASSERT_TRUE(agent->Wait(kExitTimeout).ok());
  const bool gone = WaitUntil([&] { return !IsAlive(worker); }, absl::Seconds(5));
  if (!gone) kill(worker, SIGKILL);  // never leave it behind
  EXPECT_TRUE(gone) << "worker " << worker << " outlived its agent";
}

// The supervisor over real processes: workers that exit at once (often
// before Launch returns) and a stop of a whole generation.
TEST_F(ProcessLauncherTest, SupervisorOverRealProcesses) {
  absl::Mutex mu;
  std::vector<RankExit> exits;
  auto record = [&](const RankExit& exit) {
    absl::MutexLock lock(&mu);
    exits.push_back(exit);
  };
  {
    WorkerSupervisor quick(launcher_.get(), "job-q", 0, {}, record);
    std::vector<RankLaunch> ranks;
    for (int rank = 0; rank < 4; ++rank) ranks.push_back({rank, Spec({"sh", "-c", "exit 0"})});
    ranks[3].spec = Spec({"/bin/sh", "-c", "kill -SEGV $$"});
    ASSERT_TRUE(quick.Start(ranks).ok());
    ASSERT_TRUE(quick.WaitAllExited(kExitTimeout).ok());
    absl::MutexLock lock(&mu);
    std::string got;
    for (const RankExit& exit : exits)
      absl::StrAppend(&got, exit.rank, ":", exit.exit.ToString(), " ");
    ASSERT_EQ(exits.size(), 4u) << got;
    for (const RankExit& exit : exits) {
      if (exit.rank == 3) {
        EXPECT_EQ(exit.exit.signal, SIGSEGV);
      } else {
        EXPECT_EQ(exit.exit.exit_code, 0) << exit.rank;
      }
    }
    exits.clear();
  }
  SupervisorOptions options;
  options.grace = absl::Milliseconds(200);
  WorkerSupervisor stubborn(launcher_.get(), "job-s", 1, options, record);
  std::vector<RankLaunch> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(
        {rank, Spec({"sh", "-c", "trap '' TERM; sleep 60 & sleep 60 & echo ready; wait"})});
    ranks[rank].spec.stdout_log = absl::StrCat(dir_, "/rank", rank, ".log");
  }
  ASSERT_TRUE(stubborn.Start(ranks).ok());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(WaitUntil(
        [&] {
          return ReadFile(absl::StrCat(dir_, "/rank", rank, ".log")).find("ready") !=
                 std::string::npos;
        },
        kExitTimeout));
  }
  stubborn.Stop();
  ASSERT_TRUE(stubborn.WaitAllExited(kExitTimeout).ok());
  absl::MutexLock lock(&mu);
  ASSERT_EQ(exits.size(), 2u);
  for (const RankExit& exit : exits) {
    EXPECT_TRUE(exit.stopped);
    EXPECT_EQ(exit.exit.signal, SIGKILL);
    EXPECT_TRUE(
        WaitUntil([&] { return LiveProcessesInGroup(exit.exit.pid).empty(); }, kExitTimeout));
  }
}

// ---- Another account ------------------------------------------------------

class CredentialsTest : public ProcessLauncherTest {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "starting workers as another account needs root";
    if (getpwnam("nobody") == nullptr) GTEST_SKIP() << "no account \"nobody\" here";
    ProcessLauncherTest::SetUp();
    ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);  // nobody's cwd may be here
    auto nobody = LookUpAccount("nobody");
    ASSERT_TRUE(nobody.ok()) << nobody.status();
    nobody_ = *nobody;
  }
  WorkerCredentials nobody_;
};

// The numbers after "<key>=" in `text` up to the end of its line, as a set.
std::set<gid_t> NumbersAfter(const std::string& text, const std::string& key) {
  std::set<gid_t> out;
  const size_t at = text.find(key + "=");
  if (at == std::string::npos) return out;
  const size_t from = at + key.size() + 1;
  const std::string line = text.substr(from, text.find('\n', from) - from);
  for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    gid_t id = 0;
    if (absl::SimpleAtoi(word, &id)) out.insert(id);
  }
  return out;
}

// The "Uid:" line of /proc/<pid>/status: real, effective, saved, fs.
std::string UidLineOf(pid_t pid) {
  std::istringstream status(ReadFile(absl::StrCat("/proc/", pid, "/status")));
  for (std::string line; std::getline(status, line);) {
    if (absl::StartsWith(line, "Uid:")) return line;
  }
  return "";
}

TEST_F(CredentialsTest, TheWorkerRunsAsTheAccountWithItsGroupsOnly) {
  LaunchSpec spec =
      Spec({"sh", "-c", "echo uid=$(id -u); echo gid=$(id -g); echo groups=$(id -G)"});
  spec.credentials = nobody_;
  spec.working_dir = dir_;
  auto exit = RunToExit(spec);
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 0);
  const std::string out = ReadFile(dir_ + "/out.log");
  EXPECT_THAT(NumbersAfter(out, "uid"), ::testing::ElementsAre(nobody_.uid)) << out;
  EXPECT_THAT(NumbersAfter(out, "gid"), ::testing::ElementsAre(nobody_.gid)) << out;
  EXPECT_EQ(NumbersAfter(out, "groups"),
            std::set<gid_t>(nobody_.groups.begin(), nobody_.groups.end()))
      << out;
  EXPECT_THAT(ReadFile(dir_ + "/err.log"), IsEmpty());
}

TEST_F(CredentialsTest, LogsAreTheAccountsWithMode0600AlsoAfterRotation) {
  // An earlier run's files, with a looser mode and the agent as owner.
  for (const char* log : {"/out.log", "/out.log.1"}) {
    std::ofstream(dir_ + log) << "old\n";
    ASSERT_EQ(chmod((dir_ + log).c_str(), 0644), 0);
  }
  LaunchSpec spec =
      Spec({"sh", "-c", "i=0; while [ $i -lt 40 ]; do echo line-$i; i=$((i+1)); done"});
  spec.credentials = nobody_;
  spec.max_log_bytes = 64;
  auto exit = RunToExit(spec);
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_THAT(ReadFile(dir_ + "/out.log"), HasSubstr("line-39"));
  EXPECT_THAT(ReadFile(dir_ + "/out.log.1"), HasSubstr("line-3"))
      << "the log did not rotate, so rotation is not tested";
  for (const char* log : {"/out.log", "/out.log.1", "/err.log"}) {
    struct stat st;
    ASSERT_EQ(stat((dir_ + log).c_str(), &st), 0) << log;
    EXPECT_EQ(st.st_uid, nobody_.uid) << log;
    EXPECT_EQ(st.st_gid, nobody_.gid) << log;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << log;
    EXPECT_LE(st.st_size, 64) << log;
  }
}

// The log directory is the account's, so a worker may leave a symlink or a
// hard link where the next run's log goes. The agent, as root, must not
// truncate the target and hand it to the account.
TEST_F(CredentialsTest, APlantedLogLinkIsRefusedAndItsTargetUntouched) {
  const std::string target = dir_ + "/shadow";
  std::ofstream(target) << "root's secret\n";
  ASSERT_EQ(chmod(target.c_str(), 0640), 0);
  const std::string log = dir_ + "/out.log";
  auto refused = [&](const char* what) {
    SCOPED_TRACE(what);
    LaunchSpec spec = Spec({"/bin/true"});
    spec.credentials = nobody_;
    auto pid = Launch(spec);
    EXPECT_EQ(pid.status().code(), absl::StatusCode::kFailedPrecondition) << pid.status();
    EXPECT_THAT(std::string(pid.status().message()), HasSubstr(log));
    EXPECT_EQ(ReadFile(target), "root's secret\n");
    struct stat st;
    ASSERT_EQ(stat(target.c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 0u);
    EXPECT_EQ(st.st_mode & 0777, 0640u);
  };
  ASSERT_EQ(symlink(target.c_str(), log.c_str()), 0);
  refused("symlink");
  ASSERT_EQ(unlink(log.c_str()), 0);
  ASSERT_EQ(link(target.c_str(), log.c_str()), 0);
  refused("hard link");
  ASSERT_EQ(unlink(log.c_str()), 0);
  ASSERT_EQ(mkfifo(log.c_str(), 0600), 0);
  refused("FIFO: refused at once, not a blocked agent");
}

TEST_F(CredentialsTest, ADirectoryTheAccountCannotEnterIsPermissionDeniedNamingIt) {
  const std::string locked = dir_ + "/locked";
  ASSERT_EQ(mkdir(locked.c_str(), 0700), 0);
  LaunchSpec spec = Spec({"/bin/true"});
  spec.credentials = nobody_;
  spec.working_dir = locked;
  auto pid = Launch(spec);
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kPermissionDenied) << pid.status();
  EXPECT_THAT(std::string(pid.status().message()), HasSubstr("as user nobody"));
  EXPECT_THAT(std::string(pid.status().message()), HasSubstr(absl::StrCat("uid ", nobody_.uid)));
  // The agent's own workers may enter it.
  spec.credentials.reset();
  auto own = Launch(spec);
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_TRUE(WaitForExit(*own).has_value());
}

TEST_F(CredentialsTest, TheWorkerStillDiesWithTheThreadThatStartedIt) {
  // The credential change clears the parent-death signal; the launcher sets
  // it again after the drop.
  absl::StatusOr<pid_t> pid;
  absl::Notification launched;
  absl::Notification release;
  std::thread launching([&] {
    LaunchSpec spec = Spec({"/bin/sleep", "30"});
    spec.credentials = nobody_;
    pid = Launch(spec);
    launched.Notify();
    release.WaitForNotification();
  });
  launched.WaitForNotification();
  if (!pid.ok()) {
    release.Notify();
    launching.join();
    FAIL() << pid.status();
  }
  EXPECT_TRUE(IsAlive(*pid));
  EXPECT_EQ(UidLineOf(*pid), absl::StrCat("Uid:\t", nobody_.uid, "\t", nobody_.uid, "\t",
                                          nobody_.uid, "\t", nobody_.uid));
  release.Notify();
  launching.join();
  EXPECT_TRUE(WaitUntil([&] { return !IsAlive(*pid); }, absl::Seconds(3)))
      << "the worker outlived the thread that launched it";
  auto exit = WaitForExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL) << exit->ToString();
}

// ---- Cgroups ------------------------------------------------------------------

TEST_F(ProcessLauncherTest, AMissingCgroupIsAFailedPreconditionNamingIt) {
  LaunchSpec spec = Spec({"/bin/true"});
  spec.cgroup_dirs = {dir_ + "/no-such-cgroup"};
  auto pid = Launch(spec);
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(pid.status().message()),
              HasSubstr(dir_ + "/no-such-cgroup/cgroup.procs"));
}

// A v1 pids cgroup of the test's own, removed with whatever is left in it.
class ScopedPidsCgroup {
 public:
  static constexpr char kRoot[] = "/sys/fs/cgroup/pids";

  // Empty dir() and the reason in why() when none can be made here.
  ScopedPidsCgroup() {
    if (geteuid() != 0) {
      why_ = "making a cgroup needs root";
      return;
    }
    if (access(absl::StrCat(kRoot, "/cgroup.procs").c_str(), W_OK) != 0) {
      why_ = absl::StrCat("no writable v1 pids hierarchy at ", kRoot);
      return;
    }
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string dir =
        absl::StrCat(kRoot, "/mesh-launcher-test-", getpid(), "-", test->name());
    if (mkdir(dir.c_str(), 0755) != 0) {
      why_ = absl::StrCat("cannot make ", dir, ": ", std::strerror(errno));
      return;
    }
    dir_ = dir;
  }
  ~ScopedPidsCgroup() {
    if (dir_.empty()) return;
    const bool removed = WaitUntil(
        [&] {
          std::istringstream procs(ReadFile(dir_ + "/cgroup.procs"));
          for (pid_t pid; procs >> pid;) kill(pid, SIGKILL);
          return rmdir(dir_.c_str()) == 0;
        },
        absl::Seconds(5));
    EXPECT_TRUE(removed) << "cgroup " << dir_ << " left behind: " << std::strerror(errno);
  }
  const std::string& dir() const { return dir_; }
  const std::string& why() const { return why_; }
  // The name under the hierarchy's root, as /proc/<pid>/cgroup shows it.
  std::string path() const { return dir_.substr(std::strlen(kRoot)); }

 private:
  std::string dir_;
  std::string why_;
};

// The worker's line for the pids controller in /proc/<pid>/cgroup.
std::string PidsCgroupOf(pid_t pid) {
  std::istringstream lines(ReadFile(absl::StrCat("/proc/", pid, "/cgroup")));
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "pids") return fields[2];
    }
  }
  return "";
}

TEST_F(ProcessLauncherTest, TheWorkerStartsInsideItsCgroup) {
  ScopedPidsCgroup cgroup;
  if (cgroup.dir().empty()) GTEST_SKIP() << cgroup.why();
  LaunchSpec spec = Spec({"/bin/sleep", "30"});
  spec.cgroup_dirs = {cgroup.dir()};
  auto pid = Launch(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(PidsCgroupOf(*pid), cgroup.path());
  EXPECT_THAT(ReadFile(cgroup.dir() + "/cgroup.procs"), HasSubstr(absl::StrCat(*pid, "\n")));
  EXPECT_NE(PidsCgroupOf(getpid()), cgroup.path()) << "the agent itself must stay outside";
  ASSERT_TRUE(launcher_->Signal(*pid, SIGKILL).ok());
  ASSERT_TRUE(WaitForExit(*pid).has_value());
}

// Joining comes before the drop: the account may not write cgroup.procs.
TEST_F(CredentialsTest, TheAccountsWorkerStartsInsideItsCgroupToo) {
  ScopedPidsCgroup cgroup;
  if (cgroup.dir().empty()) GTEST_SKIP() << cgroup.why();
  LaunchSpec spec = Spec({"/bin/sleep", "30"});
  spec.credentials = nobody_;
  spec.cgroup_dirs = {cgroup.dir()};
  auto pid = Launch(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(PidsCgroupOf(*pid), cgroup.path());
  EXPECT_THAT(UidLineOf(*pid), HasSubstr(absl::StrCat("\t", nobody_.uid)));
  ASSERT_TRUE(launcher_->Signal(*pid, SIGKILL).ok());
  ASSERT_TRUE(WaitForExit(*pid).has_value());
}

}  // namespace process_launcher_test
}  // namespace mesh::agent
