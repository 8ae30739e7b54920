// ReaperWatchdog with real processes: a worker's children die with the
// agent, however the agent dies.
#include "agent/reaper_watchdog.h"

#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/process_launcher.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh::agent {
namespace reaper_watchdog_test {

using ::mesh::testing::IsAlive;
using ::mesh::testing::LiveProcessesInGroup;
using ::mesh::testing::WaitUntil;

constexpr absl::Duration kTimeout = absl::Seconds(10);
constexpr char kHelperVar[] = "MESH_REAPER_TEST_AGENT";
constexpr char kDirVar[] = "MESH_REAPER_TEST_DIR";
// A worker that forks a grandchild, writes its pid, and waits.
constexpr char kWorkerScript[] = "sleep 60 & echo $! > \"$1\"; wait";

// Helper mode: the test binary re-executed as a stand-in agent. It forks
// the watchdog first (no thread exists yet), launches one worker through a
// ReapingLauncher, prints "<worker pid> <watchdog pid>" and waits to be
// killed. With the variable set to "forget" it removes the worker's group
// from the watchdog right away (the control case).
struct AgentHelperMode {
  AgentHelperMode() {
    const char* mode = std::getenv(kHelperVar);
    if (mode == nullptr) return;
    auto watchdog = ReaperWatchdog::Start();
    if (!watchdog.ok()) {
      std::fprintf(stderr, "helper: %s\n", watchdog.status().ToString().c_str());
      std::_Exit(1);
    }
    PosixProcessLauncher posix;
    ReapingLauncher launcher(&posix, watchdog->get());
    LaunchSpec spec;
    const std::string pid_file = absl::StrCat(std::getenv(kDirVar), "/grandchild");
    spec.argv = {"/bin/sh", "-c", kWorkerScript, "sh", pid_file};
    spec.env = {"PATH=/usr/bin:/bin"};
    auto pid = launcher.Launch(spec, nullptr);
    if (!pid.ok()) {
      std::fprintf(stderr, "helper: %s\n", pid.status().ToString().c_str());
      std::_Exit(1);
    }
    if (std::string(mode) == "forget") (*watchdog)->Remove(*pid).IgnoreError();
    std::printf("%d %d\n", static_cast<int>(*pid), static_cast<int>((*watchdog)->pid()));
    std::fflush(stdout);
    sleep(60);  // killed by the test long before this
    std::_Exit(0);
  }
} agent_helper_mode;

// The pid the worker script wrote, once it is there.
pid_t ReadPidFile(const std::string& path) {
  pid_t pid = 0;
  WaitUntil(
      [&] {
        std::ifstream in(path);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid) && pid > 0;
      },
      kTimeout);
  return pid;
}

class ReaperWatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/mesh-reaper-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override {
    for (pid_t pid : cleanup_) kill(pid, SIGKILL);  // never leave one behind
    std::filesystem::remove_all(dir_);
  }

  struct StandIn {
    testing::Subprocess agent;
    pid_t worker = 0;
    pid_t watchdog = 0;
    pid_t grandchild = 0;
  };

  // Starts the stand-in agent in `mode` and waits until its worker's
  // grandchild runs.
  absl::StatusOr<StandIn> StartStandIn(const std::string& mode) {
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return absl::InternalError("readlink /proc/self/exe");
    exe[n] = '\0';
    auto agent = testing::Subprocess::Start(
        {exe}, {absl::StrCat(kHelperVar, "=", mode), absl::StrCat(kDirVar, "=", dir_)});
    if (!agent.ok()) return agent.status();
    auto line = agent->ReadLine(kTimeout);
    if (!line.ok()) return line.status();
    std::vector<std::string> fields = absl::StrSplit(*line, ' ');
    StandIn s{std::move(*agent)};
    if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &s.worker) ||
        !absl::SimpleAtoi(fields[1], &s.watchdog)) {
      return absl::InternalError("bad helper line: " + *line);
    }
    s.grandchild = ReadPidFile(dir_ + "/grandchild");
    cleanup_ = {s.worker, s.grandchild};
    return s;
  }

  std::string dir_;
  std::vector<pid_t> cleanup_;
};

TEST_F(ReaperWatchdogTest, KillOfTheAgentKillsTheWorkersChildren) {
  auto s = StartStandIn("keep");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_GT(s->grandchild, 0);
  ASSERT_TRUE(IsAlive(s->worker));
  ASSERT_TRUE(IsAlive(s->grandchild));
  ASSERT_TRUE(IsAlive(s->watchdog));

  s->agent.Signal(SIGKILL);
  ASSERT_TRUE(s->agent.Wait(kTimeout).ok());
  EXPECT_TRUE(WaitUntil([&] { return !IsAlive(s->worker); }, kTimeout)) << "worker survived";
  EXPECT_TRUE(WaitUntil([&] { return !IsAlive(s->grandchild); }, kTimeout))
      << "grandchild " << s->grandchild << " outlived its agent";
  EXPECT_TRUE(WaitUntil([&] { return !IsAlive(s->watchdog); }, kTimeout))
      << "the watchdog outlived its agent";
}

// Control: without the group recorded, the grandchild is orphaned and lives
// on, so the test above tests the watchdog and not PDEATHSIG.
TEST_F(ReaperWatchdogTest, AForgottenGroupIsLeftAlone) {
  auto s = StartStandIn("forget");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_GT(s->grandchild, 0);
  s->agent.Signal(SIGKILL);
  ASSERT_TRUE(s->agent.Wait(kTimeout).ok());
  ASSERT_TRUE(WaitUntil([&] { return !IsAlive(s->watchdog); }, kTimeout));
  ASSERT_TRUE(WaitUntil([&] { return !IsAlive(s->worker); }, kTimeout));
  EXPECT_TRUE(IsAlive(s->grandchild));
}

// In this process: destroying the watchdog (a clean agent exit) kills the
// groups still recorded, and only those.
TEST_F(ReaperWatchdogTest, DestructionKillsRecordedGroupsOnly) {
  auto watchdog = ReaperWatchdog::Start();
  ASSERT_TRUE(watchdog.ok()) << watchdog.status();
  // Subprocess puts each child in its own process group.
  auto kept = testing::Subprocess::Start({"/bin/sh", "-c", "sleep 60 & echo $!; wait"});
  auto removed = testing::Subprocess::Start({"/bin/sh", "-c", "sleep 60 & echo $!; wait"});
  ASSERT_TRUE(kept.ok() && removed.ok());
  auto kept_child = kept->ReadLine(kTimeout);
  auto removed_child = removed->ReadLine(kTimeout);
  ASSERT_TRUE(kept_child.ok() && removed_child.ok());
  pid_t kept_grandchild = 0, removed_grandchild = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*kept_child, &kept_grandchild));
  ASSERT_TRUE(absl::SimpleAtoi(*removed_child, &removed_grandchild));
  cleanup_ = {kept_grandchild, removed_grandchild};
  ASSERT_TRUE((*watchdog)->Add(kept->pid()).ok());
  ASSERT_TRUE((*watchdog)->Add(removed->pid()).ok());
  ASSERT_TRUE((*watchdog)->Remove(removed->pid()).ok());
  EXPECT_EQ((*watchdog)->Add(1).code(), absl::StatusCode::kInvalidArgument);
  watchdog->reset();
  EXPECT_TRUE(kept->Wait(kTimeout).ok());
  EXPECT_TRUE(WaitUntil([&] { return !IsAlive(kept_grandchild); }, kTimeout));
  EXPECT_TRUE(IsAlive(removed->pid()));
  EXPECT_TRUE(IsAlive(removed_grandchild));
}

}  // namespace reaper_watchdog_test
}  // namespace mesh::agent
