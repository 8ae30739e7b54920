#include "tests/util/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mesh::testing {

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv,
                                             const std::vector<std::string>& env) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  // Everything the child needs is prepared before fork(): after it, only
  // async-signal-safe calls are allowed in a multi-threaded parent.
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) env_storage.emplace_back(*e);
  for (const std::string& e : env) env_storage.push_back(e);
  std::vector<char*> envp;
  for (const std::string& e : env_storage) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // The parent died before prctl.
    dup2(fds[1], STDOUT_FILENO);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(fds[1]);
  return Subprocess(pid, fds[0]);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_),
      stdout_fd_(other.stdout_fd_),
      reaped_(other.reaped_),
      buffer_(std::move(other.buffer_)) {
  other.pid_ = -1;
  other.stdout_fd_ = -1;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !reaped_) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("no complete stdout line from pid ", pid_,
                                                      " within ", absl::FormatDuration(timeout),
                                                      "; have '", buffer_, "'"));
    }
    pollfd pfd{stdout_fd_, POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n == 0) return absl::OutOfRangeError("end of stdout");
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("read: ", std::strerror(errno)));
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

void Subprocess::Signal(int signal) {
  if (pid_ > 0 && !reaped_) kill(pid_, signal);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      reaped_ = true;
      return status;
    }
    if (done < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

CommandOutput RunMerged(const std::vector<std::string>& argv, absl::Duration timeout) {
  std::vector<std::string> shell = {"/bin/sh", "-c", "exec \"$@\" 2>&1", "sh"};
  shell.insert(shell.end(), argv.begin(), argv.end());
  CommandOutput result;
  absl::StatusOr<Subprocess> process = Subprocess::Start(shell);
  if (!process.ok()) {
    result.output = std::string(process.status().message());
    return result;
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<std::string> line =
        process->ReadLine(std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    if (!line.ok()) break;
    absl::StrAppend(&result.output, *line, "\n");
  }
  absl::StatusOr<int> status = process->Wait(std::max(deadline - absl::Now(), absl::Seconds(1)));
  if (status.ok() && WIFEXITED(*status)) result.code = WEXITSTATUS(*status);
  return result;  // The destructor kills and reaps a command that overran.
}

}  // namespace mesh::testing
