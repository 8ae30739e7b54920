#include "tests/util/subprocess.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace mesh::testing {

absl::StatusOr<Subprocess> Subprocess::Spawn(SpawnOptions options) {
  options.stdout_to = Redirect::Pipe();
  if (options.group == SpawnOptions::Group::kInherit) {
    options.group = SpawnOptions::Group::kNewGroup;
  }
  absl::StatusOr<::mesh::Subprocess> process = ::mesh::Subprocess::Spawn(options);
  if (!process.ok()) return process.status();
  return Subprocess(*std::move(process));
}

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv,
                                             const std::vector<std::string>& env) {
  SpawnOptions options;
  options.argv = argv;
  options.env.emplace();
  for (char** e = environ; *e != nullptr; ++e) options.env->emplace_back(*e);
  options.env->insert(options.env->end(), env.begin(), env.end());
  return Spawn(std::move(options));
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const int fd = process_.stdout_fd();
  while (true) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("no complete stdout line from pid ", pid(),
                                                      " within ", absl::FormatDuration(timeout),
                                                      "; have '", buffer_, "'"));
    }
    pollfd pfd{fd, POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n == 0) return absl::OutOfRangeError("end of stdout");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::InternalError(absl::StrCat("read: ", std::strerror(errno)));
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

void Subprocess::Signal(int signal) { process_.Signal(signal).IgnoreError(); }

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  absl::StatusOr<ExitStatus> exit = process_.Wait(timeout);
  if (!exit.ok()) return exit.status();
  return exit->ToWaitStatus();
}

CommandOutput RunMerged(const std::vector<std::string>& argv, absl::Duration timeout) {
  SpawnOptions options;
  options.argv = argv;
  options.stderr_to = Redirect::Stdout();
  CommandOutput result;
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(std::move(options));
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
