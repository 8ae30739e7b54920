#include "agent/reaper_watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/stray_killer.h"

namespace mesh::agent {
namespace {

// One record on the pipe: an op byte ('+' or '-') and the group id. 5 bytes,
// far below PIPE_BUF, so concurrent writes never interleave.
constexpr size_t kRecordSize = 1 + sizeof(int32_t);

// The watchdog's whole life. The process was single-threaded when it
// forked (Start's contract), so allocating here is safe; the loop itself
// does not (the vector's capacity is reserved before fork).
[[noreturn]] void RunWatchdog(int read_fd, std::vector<pid_t>& groups,
                              const std::string& kill_marker,
                              const std::function<void()>& on_agent_death) {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) sigaction(sig, &ignore, nullptr);
  const int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, STDIN_FILENO);
    dup2(devnull, STDOUT_FILENO);
  }
  // Every other descriptor of the agent (sockets, the pipe's write end, a
  // test harness's pipes) is closed, so that the watchdog keeps nothing
  // open on its behalf. stderr stays for diagnostics.
  for (int fd = STDERR_FILENO + 1; fd < 65536; ++fd) {
    if (fd != read_fd) close(fd);
  }
  char record[kRecordSize];
  size_t have = 0;
  for (;;) {
    const ssize_t n = read(read_fd, record + have, kRecordSize - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF (or a broken pipe): the agent is gone.
    have += static_cast<size_t>(n);
    if (have < kRecordSize) continue;
    have = 0;
    int32_t pgid = 0;
    std::memcpy(&pgid, record + 1, sizeof(pgid));
    if (record[0] == '+') {
      if (groups.size() < groups.capacity()) groups.push_back(pgid);
    } else {
      for (size_t i = 0; i < groups.size(); ++i) {
        if (groups[i] == pgid) {
          groups[i] = groups.back();
          groups.pop_back();
          break;
        }
      }
    }
  }
  for (pid_t pgid : groups) kill(-pgid, SIGKILL);
  // Then what left the groups: every process carrying the agent's marker.
  if (!kill_marker.empty()) KillProcessesWithEnv({kill_marker});
  // Last, what only the agent's cgroups hold (processes that dropped the
  // marker).
  if (on_agent_death) on_agent_death();
  _exit(0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReaperWatchdog>> ReaperWatchdog::Start(
    std::string kill_marker, std::function<void()> on_agent_death) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  std::vector<pid_t> groups;
  groups.reserve(kMaxGroups);
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(err)));
  }
  if (pid == 0) {
    close(fds[1]);
    RunWatchdog(fds[0], groups, kill_marker, on_agent_death);
  }
  close(fds[0]);
  return std::unique_ptr<ReaperWatchdog>(new ReaperWatchdog(pid, fds[1]));
}

ReaperWatchdog::~ReaperWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    close(write_fd_);
    write_fd_ = -1;
  }
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

absl::Status ReaperWatchdog::Add(pid_t pgid) { return Send('+', pgid); }
absl::Status ReaperWatchdog::Remove(pid_t pgid) { return Send('-', pgid); }

absl::Status ReaperWatchdog::Send(char op, pid_t pgid) {
  if (pgid <= 1) return absl::InvalidArgumentError(absl::StrCat("bad process group ", pgid));
  char record[kRecordSize];
  record[0] = op;
  const int32_t value = pgid;
  std::memcpy(record + 1, &value, sizeof(value));
  absl::MutexLock lock(&mu_);
  for (;;) {
    // MSG_NOSIGNAL does not exist for pipes; the agent ignores SIGPIPE, and
    // a broken pipe shows up as EPIPE here.
    const ssize_t n = write(write_fd_, record, sizeof(record));
    if (n == static_cast<ssize_t>(sizeof(record))) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrCat("reaper watchdog (pid ", pid_, ") is gone: ", std::strerror(errno)));
  }
}

absl::StatusOr<pid_t> ReapingLauncher::Launch(const LaunchSpec& spec, ExitCallback on_exit) {
  // Held across the inner Launch, so the exit callback (which takes mu_ on
  // the launcher's thread) sees the group recorded before it removes it.
  absl::MutexLock lock(&mu_);
  PruneLocked();
  auto wrapped = [this, on_exit = std::move(on_exit)](const ExitInfo& exit) {
    {
      absl::MutexLock lock(&mu_);
      if (kill(-exit.pid, 0) != 0 && errno == ESRCH) {
        watchdog_->Remove(exit.pid).IgnoreError();
      } else {
        lingering_.insert(exit.pid);
      }
      PruneLocked();
    }
    if (on_exit) on_exit(exit);
  };
  absl::StatusOr<pid_t> pid = inner_->Launch(spec, std::move(wrapped));
  if (pid.ok()) {
    // The worker runs already; a failure here (watchdog gone) only weakens
    // the guarantee for its children, so it is not the launch's failure.
    watchdog_->Add(*pid).IgnoreError();
  }
  return pid;
}

absl::Status ReapingLauncher::Signal(pid_t pid, int signal) { return inner_->Signal(pid, signal); }

absl::Status ReapingLauncher::Terminate(pid_t pid, absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    PruneLocked();
  }
  return inner_->Terminate(pid, grace);
}

void ReapingLauncher::PruneLocked() {
  for (auto it = lingering_.begin(); it != lingering_.end();) {
    if (kill(-*it, 0) != 0 && errno == ESRCH) {
      watchdog_->Remove(*it).IgnoreError();
      it = lingering_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace mesh::agent
