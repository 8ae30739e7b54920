// Test helpers that look at processes through /proc, and a polling wait.
// For integration tests that must prove processes are gone (or alive)
// without relying on the code under test.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mesh::testing {

// Whether `pid` exists and is neither a zombie nor dead (/proc/<pid>/stat).
bool IsAlive(pid_t pid);

// The parent of `pid`; -1 when it is gone.
pid_t ParentOf(pid_t pid);

// Live processes whose process group is `pgid`.
std::vector<pid_t> LiveProcessesInGroup(pid_t pgid);

// Live processes whose environment holds every entry of `entries`
// ("NAME=value"). Processes of other users are skipped (their environment is
// unreadable).
std::vector<pid_t> LiveProcessesWithEnv(const std::vector<std::string>& entries);

// The exit code of a waitpid status, or 128 + the signal that killed it (the
// shell's convention).
int ExitCode(int wait_status);

// The name of this process's effective user: what test agents get as
// --unowned-job-user, so that the jobs of a coordinator without
// authentication run as the test's own user when the agent is root.
std::string CurrentUserName();

// Makes sure the Unix account `name` exists (useradd --system, no home, no
// login shell, when this process is root and it is missing). Returns false,
// with the reason in `why`, when it does not exist and cannot be made. The
// accounts stay for later runs.
bool EnsureTestUser(const std::string& name, std::string* why);

// A fresh directory "/tmp/<prefix>-XXXXXX" (mkdtemp); aborts the test
// binary when it cannot be made (nothing useful can run without it).
std::string MakeTempDir(const std::string& prefix);

// A MakeTempDir folder, removed with all it holds when this is destroyed.
// Not thread-safe; one owner.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix) : path_(MakeTempDir(prefix)) {}
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name.
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  // Writes `contents` to path()/name (created or truncated); returns that
  // path. Aborts the test binary when it cannot.
  std::string Write(const std::string& name, const std::string& contents) const;

 private:
  const std::string path_;
};

// Polls `done` every 20 ms until it returns true (then true) or `timeout`
// has passed (then false, after one last try).
template <typename F>
bool WaitUntil(F done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return done();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace mesh::testing
