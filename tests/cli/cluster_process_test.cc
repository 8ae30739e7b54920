// `meshctl cluster up` with real processes: RunClusterUp in-process with a
// pipe as its Ctrl-C, and the meshctl binary with a real SIGINT. The
// children are tests/cli/fake_cluster_child (see its header), which takes the
// real coordinator and agent command lines.
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cli/cluster.h"
#include "cli/meshctl.h"
#include "tests/util/subprocess.h"

namespace mesh::cli {
namespace cluster_process_test {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr absl::Duration kStartupDeadline = absl::Seconds(20);

// Pids whose parent is `parent`, from /proc.
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // "pid (comm) S ppid ...": comm may contain spaces and parentheses.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    pid_t ppid = 0;
    if (rest >> state >> ppid && ppid == parent) children.push_back(pid);
  }
  return children;
}

// True while `pid` exists and is not a zombie.
bool Alive(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// Polls `condition` every 10 ms until it holds or `timeout` passes.
template <typename F>
bool WaitFor(F condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

pid_t ReadPid(const fs::path& path) {
  std::ifstream in(path);
  pid_t pid = 0;
  in >> pid;
  return pid;
}

class ClusterProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/mesh-cluster-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    base_ = pattern;
    state_ = base_ / "state";
    fs::create_directories(state_);
    ASSERT_EQ(pipe(stop_pipe_), 0);

    config_.coordinator_bin = FAKE_CHILD_BIN;
    config_.agent_bin = FAKE_CHILD_BIN;
    config_.agents = 2;
    config_.slots = 2;
    config_.agent_gpus = {"none", "none"};
    config_.port = 0;
    config_.state_dir = state_.string();
    config_.remove_state_dir = true;
    config_.ready_file = (base_ / "ready").string();
    config_.port_timeout = absl::Seconds(10);
    config_.ready_timeout = absl::Seconds(10);
    config_.grace = absl::Seconds(5);
    config_.poll_interval = absl::Milliseconds(20);
  }

  void TearDown() override {
    close(stop_pipe_[0]);
    close(stop_pipe_[1]);
    std::error_code ec;
    fs::remove_all(base_, ec);
  }

  // Runs RunClusterUp on this thread. `while_up` runs on another thread once
  // the ready file appears (or after kStartupDeadline, with up = false);
  // then that thread presses "Ctrl-C", unless `while_up` returns false.
  template <typename F>
  int Run(F while_up) {
    std::atomic<bool> returned = false;
    std::thread helper([&] {
      WaitFor([&] { return returned || fs::exists(config_.ready_file); }, kStartupDeadline);
      const bool up = fs::exists(config_.ready_file);
      if (up) up_children_ = ChildrenOf(getpid());
      if (while_up(up)) Stop();
    });
    const int code = RunClusterUp(config_, stop_pipe_[0], out_, err_);
    // A failure returns without Ctrl-C; this lets the helper finish.
    returned = true;
    helper.join();
    return code;
  }

  void Stop() { ASSERT_EQ(write(stop_pipe_[1], "x", 1), 1); }

  fs::path base_;
  fs::path state_;
  int stop_pipe_[2] = {-1, -1};
  ClusterConfig config_;
  std::ostringstream out_, err_;
  std::vector<pid_t> up_children_;
};

TEST_F(ClusterProcessTest, CtrlCStopsEveryChildAndRemovesTheStateDir) {
  const int code = Run([](bool up) {
    EXPECT_TRUE(up) << "cluster not up within the deadline";
    return true;
  });
  EXPECT_EQ(code, kExitOk) << err_.str();
  EXPECT_THAT(err_.str(), Not(HasSubstr("SIGKILL"))) << "SIGTERM alone must stop them";
  EXPECT_EQ(up_children_.size(), 3u) << "coordinator + 2 agents while up";
  for (pid_t pid : up_children_) EXPECT_FALSE(Alive(pid)) << pid;
  EXPECT_THAT(ChildrenOf(getpid()), IsEmpty());
  EXPECT_FALSE(fs::exists(state_)) << "temp state dir left behind";
  EXPECT_FALSE(fs::exists(config_.ready_file)) << "stale ready file left behind";
  EXPECT_THAT(out_.str(), HasSubstr("export MESH_COORDINATOR=127.0.0.1:"));
  EXPECT_THAT(out_.str(), HasSubstr("local-0, local-1"));
  EXPECT_THAT(out_.str(), HasSubstr("meshctl submit --nodes 2 --nproc-per-node 2 -- /bin/echo hi"));
}

TEST_F(ClusterProcessTest, ReadyFileHoldsTheCoordinatorAddress) {
  std::string ready;
  const int code = Run([&](bool up) {
    EXPECT_TRUE(up);
    std::ifstream(config_.ready_file) >> ready;
    return true;
  });
  EXPECT_EQ(code, kExitOk) << err_.str();
  EXPECT_TRUE(absl::StartsWith(ready, "127.0.0.1:")) << ready;
  EXPECT_THAT(out_.str(), HasSubstr("coordinator  " + ready));
}

TEST_F(ClusterProcessTest, VerboseCopiesOutputToStderrAndTheLogs) {
  config_.verbose = true;
  config_.remove_state_dir = false;
  const int code = Run([](bool up) {
    EXPECT_TRUE(up);
    return true;
  });
  EXPECT_EQ(code, kExitOk) << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("[local-1] fake agent local-1: registered with 127.0.0.1:"));
  EXPECT_THAT(err_.str(), HasSubstr("[coordinator] mesh-coordinator listening on 127.0.0.1:"));
  // Output written while stopping is copied too.
  EXPECT_THAT(err_.str(), HasSubstr("[local-0] fake agent local-0: stopping on signal 15"));
  std::ifstream log(state_ / "agent-1.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("fake agent local-1: registered"));
  EXPECT_THAT(text, HasSubstr("fake agent local-1: stopping on signal 15"));
  EXPECT_TRUE(fs::exists(state_)) << "a state dir meshctl was told to keep";
}

TEST_F(ClusterProcessTest, AnAgentDyingWhileUpFailsNamingIt) {
  const int code = Run([&](bool up) {
    EXPECT_TRUE(up);
    if (!up) return true;
    const pid_t agent = ReadPid(state_ / "agent-1" / "pid");
    EXPECT_GT(agent, 0);
    if (agent > 0) kill(agent, SIGUSR1);  // The fake exits 3.
    return false;
  });
  EXPECT_EQ(code, kExitFailed);
  EXPECT_THAT(err_.str(), HasSubstr("local-1"));
  EXPECT_THAT(err_.str(), HasSubstr("exited unexpectedly: exit code 3"));
  EXPECT_THAT(err_.str(), HasSubstr("fake agent local-1: exiting 3 as asked"));  // Log tail.
  for (pid_t pid : up_children_) EXPECT_FALSE(Alive(pid)) << pid;
  EXPECT_THAT(ChildrenOf(getpid()), IsEmpty());
  // Kept after a failure: the logs are the evidence.
  EXPECT_TRUE(fs::exists(state_ / "agent-1.log"));
  EXPECT_THAT(err_.str(), HasSubstr("state and logs kept in " + state_.string()));
}

TEST_F(ClusterProcessTest, ACoordinatorFailingAtStartupIsNamed) {
  std::ofstream(state_ / "fake.coordinator-fail") << "";
  const int code = Run([](bool up) {
    EXPECT_FALSE(up);
    return false;
  });
  EXPECT_EQ(code, kExitFailed);
  EXPECT_THAT(err_.str(), HasSubstr("coordinator (pid"));
  EXPECT_THAT(err_.str(), HasSubstr("exit code 4"));
  EXPECT_THAT(err_.str(), HasSubstr("failing at startup as asked"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("export MESH_COORDINATOR")));
  EXPECT_THAT(ChildrenOf(getpid()), IsEmpty());
}

TEST_F(ClusterProcessTest, AChildIgnoringSigtermIsKilledAfterTheGrace) {
  std::ofstream(state_ / "fake.local-0-ignore-term") << "";
  config_.grace = absl::Milliseconds(300);
  const int code = Run([](bool up) {
    EXPECT_TRUE(up);
    return true;
  });
  EXPECT_EQ(code, kExitOk) << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("local-0 (pid"));
  EXPECT_THAT(err_.str(), HasSubstr("sending SIGKILL"));
  for (pid_t pid : up_children_) EXPECT_FALSE(Alive(pid)) << pid;
  EXPECT_THAT(ChildrenOf(getpid()), IsEmpty());
}

TEST_F(ClusterProcessTest, CtrlCWhileWaitingForTheAgentsStopsCleanly) {
  // local-1 never registers, so the readiness wait is what Ctrl-C interrupts.
  std::ofstream(state_ / "fake.local-1-no-register") << "";
  config_.ready_timeout = absl::Seconds(60);
  std::thread stopper([&] {
    EXPECT_TRUE(
        WaitFor([&] { return fs::exists(state_ / "agent-0" / "registered"); }, kStartupDeadline));
    Stop();
  });
  const int code = RunClusterUp(config_, stop_pipe_[0], out_, err_);
  stopper.join();
  EXPECT_EQ(code, kExitOk) << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("stopping"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("export MESH_COORDINATOR")));
  EXPECT_THAT(ChildrenOf(getpid()), IsEmpty());
  EXPECT_FALSE(fs::exists(state_));
}

TEST_F(ClusterProcessTest, AgentsThatNeverRegisterTimeOutNamingThem) {
  std::ofstream(state_ / "fake.local-1-no-register") << "";
  config_.ready_timeout = absl::Milliseconds(500);
  const int code = RunClusterUp(config_, stop_pipe_[0], out_, err_);
  EXPECT_EQ(code, kExitFailed);
  EXPECT_THAT(err_.str(), HasSubstr("1/2 agents READY"));
  EXPECT_THAT(err_.str(), HasSubstr("missing: local-1"));
  EXPECT_THAT(ChildrenOf(getpid()), IsEmpty());
}

// The binary, its signalfd, a real SIGINT and the default temp state dir.
TEST(MeshctlClusterUpTest, SigintStopsEverythingAndRemovesTheTempStateDir) {
  char pattern[] = "/tmp/mesh-cluster-test-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const fs::path tmpdir = pattern;
  auto meshctl = testing::Subprocess::Start(
      {MESHCTL_BIN, "cluster", "up", "--agents", "2", "--slots", "1", "--port", "0",
       "--coordinator-bin", FAKE_CHILD_BIN, "--agent-bin", FAKE_CHILD_BIN},
      {absl::StrCat("TMPDIR=", tmpdir.string())});
  ASSERT_TRUE(meshctl.ok()) << meshctl.status();

  std::string state_dir;
  bool up = false;
  const absl::Time deadline = absl::Now() + kStartupDeadline;
  while (!up) {
    auto line = meshctl->ReadLine(std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    ASSERT_TRUE(line.ok()) << "waiting for the banner: " << line.status();
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(*line), "state")) {
      state_dir = std::string(absl::StripAsciiWhitespace(
          absl::StripPrefix(absl::StripLeadingAsciiWhitespace(*line), "state")));
      state_dir = state_dir.substr(0, state_dir.find(' '));
    }
    up = absl::StartsWith(*line, "Press Ctrl-C");
  }
  EXPECT_TRUE(absl::StartsWith(state_dir, tmpdir.string())) << state_dir;
  EXPECT_TRUE(fs::exists(state_dir));
  const std::vector<pid_t> children = ChildrenOf(meshctl->pid());
  EXPECT_EQ(children.size(), 3u);

  meshctl->Signal(SIGINT);
  auto status = meshctl->Wait(absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  for (pid_t pid : children) EXPECT_FALSE(Alive(pid)) << pid;
  EXPECT_FALSE(fs::exists(state_dir));
  EXPECT_TRUE(fs::is_empty(tmpdir));
  std::error_code ec;
  fs::remove_all(tmpdir, ec);
}

}  // namespace cluster_process_test
}  // namespace mesh::cli
