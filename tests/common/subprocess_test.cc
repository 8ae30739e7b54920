// Tests of common/subprocess.h over real processes. Shells stand in for
// children where convenient; Subprocess itself never adds one.
#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/util/proc.h"
#include "tests/util/status_matchers.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace subprocess_test {

using ::mesh::testing::IsAlive;
using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::mesh::testing::WaitUntil;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(10);
constexpr char kParentVar[] = "MESH_SUBPROCESS_TEST_PARENT";

// Parent mode: the test binary re-executed as a stand-in parent that spawns
// `sleep 60` with the default death signal, prints its pid and waits to be
// killed. Runs before gtest's main when the variable is set.
struct ParentMode {
  ParentMode() {
    if (std::getenv(kParentVar) == nullptr) return;
    SpawnOptions options;
    options.argv = {"/bin/sleep", "60"};
    absl::StatusOr<Subprocess> child = Subprocess::Spawn(options);
    if (!child.ok()) {
      std::fprintf(stderr, "parent mode: %s\n", child.status().ToString().c_str());
      std::_Exit(1);
    }
    std::printf("%d\n", static_cast<int>(child->pid()));
    std::fflush(stdout);
    sleep(60);  // Killed by the test long before this.
    std::_Exit(0);
  }
} parent_mode;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Everything readable from `fd` until EOF, bounded by kTimeout; "" for -1.
std::string ReadToEof(int fd) {
  std::string text;
  if (fd < 0) return text;
  const absl::Time deadline = absl::Now() + kTimeout;
  char buffer[4096];
  while (absl::Now() < deadline) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      absl::SleepFor(absl::Milliseconds(5));  // Non-blocking: EAGAIN.
      continue;
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

class SubprocessTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("mesh-subprocess-test"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `script` run by /bin/sh with stdout to a pipe.
  static SpawnOptions Shell(const std::string& script) {
    SpawnOptions options;
    options.argv = {"/bin/sh", "-c", script};
    options.stdout_to = Redirect::Pipe();
    return options;
  }

  // The stdout of `script` and how it ended.
  static std::pair<std::string, ExitStatus> Run(SpawnOptions options) {
    absl::StatusOr<Subprocess> child = Subprocess::Spawn(options);
    EXPECT_THAT(child, IsOk());
    if (!child.ok()) return {};
    std::string out = ReadToEof(child->stdout_fd());
    absl::StatusOr<ExitStatus> exit = child->Wait(kTimeout);
    EXPECT_THAT(exit, IsOk());
    return {out, exit.ok() ? *exit : ExitStatus{}};
  }

  std::string dir_;
};

TEST_F(SubprocessTest, ExecFailuresAreReportedAsErrors) {
  SpawnOptions options;
  options.argv = {"/nonexistent/program", "x"};
  EXPECT_THAT(Subprocess::Spawn(options),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/program")));

  options.argv = {"mesh-no-such-program"};
  options.env = std::vector<std::string>{"PATH=/usr/bin:/bin"};
  EXPECT_THAT(
      Subprocess::Spawn(options),
      StatusIs(absl::StatusCode::kNotFound, ::testing::AllOf(HasSubstr("mesh-no-such-program"),
                                                             HasSubstr("PATH=/usr/bin:/bin"))));

  const std::string not_executable = dir_ + "/script";
  std::ofstream(not_executable) << "#!/bin/sh\n";
  options.argv = {not_executable};
  EXPECT_THAT(Subprocess::Spawn(options),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr(not_executable)));

  // Executable, but no #! and not ELF: execve itself fails (ENOEXEC).
  const std::string garbage = dir_ + "/garbage";
  std::ofstream(garbage) << "\x7f\x01\x02\x03 not a program";
  ASSERT_EQ(chmod(garbage.c_str(), 0755), 0);
  options.argv = {garbage};
  EXPECT_THAT(Subprocess::Spawn(options),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(garbage)));

  options.argv = {"/bin/true"};
  options.working_dir = dir_ + "/missing";
  EXPECT_THAT(Subprocess::Spawn(options),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir_ + "/missing")));

  EXPECT_THAT(Subprocess::Spawn(SpawnOptions{}), StatusIs(absl::StatusCode::kInvalidArgument));
  SpawnOptions bad_env;
  bad_env.argv = {"/bin/true"};
  bad_env.env = std::vector<std::string>{"NOEQUALS"};
  EXPECT_THAT(Subprocess::Spawn(bad_env), StatusIs(absl::StatusCode::kInvalidArgument));
  SpawnOptions bad_file;
  bad_file.argv = {"/bin/true"};
  bad_file.stdout_to = Redirect::File(dir_ + "/missing/out.log");
  EXPECT_THAT(Subprocess::Spawn(bad_file),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/missing/out.log")));

  // None of the failed starts left a child to reap.
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST_F(SubprocessTest, ExitCodesAndSignalsAreReported) {
  auto [out, exited] = Run(Shell("exit 3"));
  EXPECT_TRUE(exited.exited());
  EXPECT_EQ(exited.exit_code, 3);
  EXPECT_FALSE(exited.success());
  EXPECT_EQ(exited.ToString(), "exit code 3");
  EXPECT_TRUE(WIFEXITED(exited.ToWaitStatus()));
  EXPECT_EQ(WEXITSTATUS(exited.ToWaitStatus()), 3);

  SpawnOptions options;
  options.argv = {"/bin/sleep", "60"};
  absl::StatusOr<Subprocess> child = Subprocess::Spawn(options);
  ASSERT_THAT(child, IsOk());
  EXPECT_TRUE(child->running());
  ASSERT_THAT(child->Signal(SIGKILL), IsOk());
  absl::StatusOr<ExitStatus> killed = child->Wait(kTimeout);
  ASSERT_THAT(killed, IsOk());
  EXPECT_FALSE(killed->exited());
  EXPECT_EQ(killed->signal, SIGKILL);
  EXPECT_EQ(killed->exit_code, -1);
  EXPECT_THAT(killed->ToString(), HasSubstr("signal 9"));
  EXPECT_TRUE(WIFSIGNALED(killed->ToWaitStatus()));
  EXPECT_EQ(WTERMSIG(killed->ToWaitStatus()), SIGKILL);
  EXPECT_FALSE(child->running());
  EXPECT_EQ(child->pidfd(), -1);
  EXPECT_THAT(child->Signal(SIGTERM), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(SubprocessTest, WaitHonoursItsDeadlineAndTerminateEscalates) {
  // Ignores SIGTERM (and so does its sleep), so only SIGKILL stops it.
  SpawnOptions options = Shell("trap '' TERM; echo ready; exec sleep 60");
  absl::StatusOr<Subprocess> child = Subprocess::Spawn(options);
  ASSERT_THAT(child, IsOk());
  ASSERT_TRUE(WaitUntil(
      [&] {
        char c;
        return read(child->stdout_fd(), &c, 1) == 1;
      },
      kTimeout));

  const absl::Time start = absl::Now();
  EXPECT_THAT(child->Wait(absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("still running")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_TRUE(child->running());

  absl::StatusOr<ExitStatus> exit = child->Terminate(absl::Milliseconds(200));
  ASSERT_THAT(exit, IsOk());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_FALSE(child->running());
}

TEST_F(SubprocessTest, TheChildDiesWithItsParent) {
  // The stand-in parent is this binary; its child is `sleep 60`.
  std::string exe = std::filesystem::read_symlink("/proc/self/exe");
  absl::StatusOr<testing::Subprocess> parent =
      testing::Subprocess::Start({exe}, {absl::StrCat(kParentVar, "=1")});
  ASSERT_THAT(parent, IsOk());
  absl::StatusOr<std::string> line = parent->ReadLine(kTimeout);
  ASSERT_THAT(line, IsOk());
  pid_t child = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*line, &child)) << *line;
  ASSERT_TRUE(IsAlive(child));

  parent->Signal(SIGKILL);
  ASSERT_THAT(parent->Wait(kTimeout), IsOk());
  EXPECT_TRUE(WaitUntil([&] { return !IsAlive(child); }, kTimeout))
      << "pid " << child << " outlived its parent";
}

TEST_F(SubprocessTest, EnvironmentWorkingDirAndRedirections) {
  ::setenv("MESH_SUBPROCESS_TEST_PARENT_ONLY", "1", 1);
  SpawnOptions options;
  options.argv = {"sh", "-c",  // Found through the given PATH.
                  "echo \"foo=$FOO parent=$MESH_SUBPROCESS_TEST_PARENT_ONLY\"; pwd; "
                  "echo oops >&2; read line; echo \"stdin=$line\""};
  options.env = std::vector<std::string>{"PATH=/usr/bin:/bin", "FOO=bar"};
  options.working_dir = dir_;
  const std::string input = dir_ + "/in.txt";
  std::ofstream(input) << "from a file\n";
  options.stdin_to = Redirect::File(input);
  options.stdout_to = Redirect::File(dir_ + "/out.log");
  options.stderr_to = Redirect::File(dir_ + "/err.log");
  auto [unused, exit] = Run(options);
  EXPECT_TRUE(exit.success()) << exit.ToString();
  const std::string canonical_dir = std::filesystem::canonical(dir_).string();
  EXPECT_EQ(ReadFile(dir_ + "/out.log"),
            absl::StrCat("foo=bar parent=\n", canonical_dir, "\nstdin=from a file\n"));
  EXPECT_EQ(ReadFile(dir_ + "/err.log"), "oops\n");

  // No env given: the parent's, as it is at Spawn.
  auto [inherited, inherited_exit] = Run(Shell("echo $MESH_SUBPROCESS_TEST_PARENT_ONLY"));
  EXPECT_EQ(inherited, "1\n");
  ::unsetenv("MESH_SUBPROCESS_TEST_PARENT_ONLY");

  // 2>&1 into one pipe; stdin from /dev/null reads nothing.
  SpawnOptions merged = Shell("echo out; echo err >&2; cat; echo done");
  merged.stderr_to = Redirect::Stdout();
  merged.stdin_to = Redirect::Null();
  auto [both, merged_exit] = Run(merged);
  EXPECT_EQ(both, "out\nerr\ndone\n");

  // A caller's fd, duplicated: the caller still owns and can read it.
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  SpawnOptions to_fd;
  to_fd.argv = {"/bin/echo", "through an fd"};
  to_fd.stdout_to = Redirect::Fd(fds[1]);
  auto [none, fd_exit] = Run(to_fd);
  close(fds[1]);
  EXPECT_EQ(ReadToEof(fds[0]), "through an fd\n");
  close(fds[0]);
}

TEST_F(SubprocessTest, TheChildGetsOnlyStdioAndDefaultSignals) {
  // An fd without O_CLOEXEC, and a signal ignored and one blocked here.
  const int leaked = open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 3);
  struct sigaction ignore = {}, old_action = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGUSR1, &ignore, &old_action), 0);
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR2);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &block, &old_mask), 0);

  // Builtins only: the shell must not fork while /proc/$$/status is read,
  // since a shell blocks its signals around a fork, and that mask would be
  // read instead of the one it was given.
  auto [out, exit] = Run(Shell(absl::StrCat(
      "if [ -e /proc/$$/fd/", leaked, " ]; then echo fd open; else echo fd closed; fi; ",
      "while read -r line; do case $line in SigIgn*|SigBlk*) echo \"$line\";; esac; done "
      "< /proc/$$/status")));

  close(leaked);
  sigaction(SIGUSR1, &old_action, nullptr);
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  EXPECT_THAT(out, HasSubstr("fd closed"));
  EXPECT_THAT(out, HasSubstr("SigBlk:\t0000000000000000"));
  // No standard signal (1 to 31) ignored. Signals 32 and 33 belong to the C
  // library, which may set them up itself, so they are not checked.
  const size_t at = out.find("SigIgn:\t");
  ASSERT_NE(at, std::string::npos) << out;
  uint64_t ignored = 0;
  ASSERT_TRUE(absl::SimpleHexAtoi(out.substr(at + 8, 16), &ignored)) << out;
  EXPECT_EQ(ignored & ((uint64_t{1} << 31) - 1), 0u) << out;
}

TEST_F(SubprocessTest, ProcessGroupsAndSessions) {
  SpawnOptions options = Shell("sleep 60 & echo $!; wait");
  options.group = SpawnOptions::Group::kNewGroup;
  absl::StatusOr<Subprocess> group = Subprocess::Spawn(options);
  ASSERT_THAT(group, IsOk());
  EXPECT_TRUE(group->leads_group());
  EXPECT_EQ(getpgid(group->pid()), group->pid());
  std::string pid_text;
  ASSERT_TRUE(WaitUntil(
      [&] {
        char c;
        while (read(group->stdout_fd(), &c, 1) == 1) {
          if (c == '\n') return true;
          pid_text.push_back(c);
        }
        return false;
      },
      kTimeout));
  pid_t grandchild = 0;
  ASSERT_TRUE(absl::SimpleAtoi(pid_text, &grandchild)) << pid_text;
  ASSERT_TRUE(IsAlive(grandchild));

  ASSERT_THAT(group->SignalGroup(SIGKILL), IsOk());
  absl::StatusOr<ExitStatus> exit = group->Wait(kTimeout);
  ASSERT_THAT(exit, IsOk());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_TRUE(WaitUntil([&] { return !IsAlive(grandchild); }, kTimeout));
  EXPECT_TRUE(WaitUntil([&] { return !group->SignalGroup(0).ok(); }, kTimeout));
  EXPECT_THAT(group->SignalGroup(0), StatusIs(absl::StatusCode::kNotFound));

  options = Shell("exec sleep 60");
  options.group = SpawnOptions::Group::kNewSession;
  absl::StatusOr<Subprocess> session = Subprocess::Spawn(options);
  ASSERT_THAT(session, IsOk());
  EXPECT_EQ(getsid(session->pid()), session->pid());
  EXPECT_EQ(getpgid(session->pid()), session->pid());

  options.group = SpawnOptions::Group::kInherit;
  absl::StatusOr<Subprocess> same = Subprocess::Spawn(options);
  ASSERT_THAT(same, IsOk());
  EXPECT_FALSE(same->leads_group());
  EXPECT_EQ(getpgid(same->pid()), getpgrp());
  EXPECT_THAT(same->SignalGroup(SIGKILL), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(SubprocessTest, DestructionKillsAndReapsTheChild) {
  pid_t pid = -1;
  {
    SpawnOptions options = Shell("exec sleep 60");
    options.group = SpawnOptions::Group::kNewGroup;
    absl::StatusOr<Subprocess> child = Subprocess::Spawn(options);
    ASSERT_THAT(child, IsOk());
    pid = child->pid();
    // Moved out of the StatusOr: the moved-from object owns nothing.
    Subprocess owner = *std::move(child);
  }
  // Reaped, not a zombie: the pid is gone.
  EXPECT_EQ(kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST_F(SubprocessTest, PreExecHookRunsInTheChildAndCanFailTheStart) {
  SpawnOptions options = Shell("umask");
  options.pre_exec = [] {
    umask(077);
    return 0;
  };
  auto [out, exit] = Run(options);
  EXPECT_EQ(out, "0077\n");

  options.pre_exec = [] { return EPERM; };
  EXPECT_THAT(Subprocess::Spawn(options),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("pre-exec")));
}

}  // namespace subprocess_test
}  // namespace mesh
