// StrayKiller with real processes: descendants that left their worker's
// process group (setsid) are found by their environment and killed, and
// nothing else is.
#include "agent/stray_killer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/util/proc.h"

namespace mesh::agent {
namespace stray_killer_test {

using ::mesh::testing::LiveProcessesWithEnv;
using ::mesh::testing::WaitUntil;

constexpr absl::Duration kTimeout = absl::Seconds(10);

// Runs `script` with /bin/sh and `env` ("K=V") in a process group of its
// own; returns the shell's pid. The caller reaps it.
pid_t Spawn(const std::string& script, const std::vector<std::string>& env) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    std::vector<std::string> entries = {"PATH=/usr/bin:/bin"};
    entries.insert(entries.end(), env.begin(), env.end());
    std::vector<char*> envp;
    for (std::string& e : entries) envp.push_back(e.data());
    envp.push_back(nullptr);
    execle("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr), envp.data());
    _exit(127);
  }
  return pid;
}

class StrayKillerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    // Whatever a failing test left behind.
    for (pid_t pid : LiveProcessesWithEnv({"STRAY_TEST=" + tag_})) kill(pid, SIGKILL);
    for (pid_t pid : shells_) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

  pid_t Start(const std::string& script, std::vector<std::string> env) {
    env.push_back("STRAY_TEST=" + tag_);
    const pid_t pid = Spawn(script, env);
    shells_.push_back(pid);
    return pid;
  }

  const std::string tag_ = absl::StrCat(getpid(), ".", absl::ToUnixNanos(absl::Now()));
  std::vector<pid_t> shells_;
};

TEST_F(StrayKillerTest, KillsSetsidDescendantsOfOneGenerationOnly) {
  const std::string instance = NewAgentInstance("node-a");
  const std::string marker = absl::StrCat(kAgentInstanceVariable, "=", instance);
  // Generation 0: setsid'd descendants (one double-forked), as a worker
  // that daemonizes would leave them; generation 1 and another agent's
  // worker of the same job: must survive.
  Start("setsid sleep 60 & ( setsid sh -c 'sleep 60 & wait' & ); wait",
        {marker, "MESH_JOB_ID=job-a", "MESH_GENERATION=0"});
  Start("setsid sleep 60 & wait", {marker, "MESH_JOB_ID=job-a", "MESH_GENERATION=1"});
  Start("setsid sleep 60 & wait",
        {absl::StrCat(kAgentInstanceVariable, "=other"), "MESH_JOB_ID=job-a", "MESH_GENERATION=0"});
  auto gen0 = [&] { return LiveProcessesWithEnv({marker, "MESH_GENERATION=0"}); };
  auto others = [&] { return LiveProcessesWithEnv({"STRAY_TEST=" + tag_}).size() - gen0().size(); };
  ASSERT_TRUE(WaitUntil([&] { return gen0().size() == 4 && others() == 4; }, kTimeout))
      << gen0().size() << " " << others();

  ProcStrayKiller strays(instance);
  EXPECT_GE(strays.KillStrays("job-a", 0), 4);
  EXPECT_TRUE(WaitUntil([&] { return gen0().empty(); }, kTimeout)) << gen0().size() << " left";
  EXPECT_EQ(others(), 4u);
  EXPECT_EQ(strays.KillStrays("job-b", 1), 0);  // No such job: nothing.
  EXPECT_EQ(others(), 4u);
}

TEST_F(StrayKillerTest, NoEntriesMatchNothing) { EXPECT_EQ(KillProcessesWithEnv({}), 0); }

TEST(NewAgentInstance, IsUniquePerCall) {
  const std::string a = NewAgentInstance("node-a");
  EXPECT_THAT(a, ::testing::StartsWith(absl::StrCat("node-a.", getpid(), ".")));
  EXPECT_NE(a, NewAgentInstance("node-a"));
}

}  // namespace stray_killer_test
}  // namespace mesh::agent
