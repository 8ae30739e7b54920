#include "cli/cluster_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ostream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/duration_format.h"

namespace mesh::cli {
namespace {

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

bool AnyRunning(const std::vector<SupervisedChild*>& group) {
  return std::any_of(group.begin(), group.end(),
                     [](const SupervisedChild* c) { return c->running(); });
}

}  // namespace

ChildSupervisor::ChildSupervisor(int stop_fd, bool verbose, std::ostream& err)
    : stop_fd_(stop_fd), verbose_(verbose), err_(err) {}

ChildSupervisor::~ChildSupervisor() {
  // Destroying each Subprocess SIGKILLs and reaps a child still running.
  for (auto& child : children_) {
    CloseFd(child->pipe_fd);
    CloseFd(child->log_fd);
  }
}

absl::StatusOr<SupervisedChild*> ChildSupervisor::Start(const std::string& name,
                                                        const std::vector<std::string>& argv,
                                                        const std::string& log_path) {
  SpawnOptions options;
  options.argv = argv;
  options.stdin_to = Redirect::Null();
  options.stderr_to = Redirect::Stdout();
  // Never outlive meshctl, even when it is SIGKILLed.
  options.death_signal = SIGTERM;
  int log_fd = -1;
  if (verbose_) {
    // meshctl copies the child's output into the log itself.
    log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open log file ", log_path, ": ", std::strerror(errno)));
    }
    options.stdout_to = Redirect::Pipe();
  } else {
    options.stdout_to = Redirect::File(log_path);
  }
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(options);
  if (!process.ok()) {
    CloseFd(log_fd);
    return process.status();
  }
  auto child = std::make_unique<SupervisedChild>(name, log_path, *std::move(process));
  child->log_fd = log_fd;
  child->pipe_fd = child->process.ReleaseStdout();
  children_.push_back(std::move(child));
  return children_.back().get();
}

ChildSupervisor::Event ChildSupervisor::WaitUntil(absl::Time deadline, bool watch_stop) {
  while (true) {
    std::vector<pollfd> fds;
    std::vector<SupervisedChild*> owners;  // parallel to fds; null for stop_fd.
    if (watch_stop && stop_fd_ >= 0) {
      fds.push_back({stop_fd_, POLLIN, 0});
      owners.push_back(nullptr);
    }
    for (auto& child : children_) {
      if (child->process.pidfd() >= 0) {
        fds.push_back({child->process.pidfd(), POLLIN, 0});
        owners.push_back(child.get());
      }
      if (child->pipe_fd >= 0) {
        fds.push_back({child->pipe_fd, POLLIN, 0});
        owners.push_back(child.get());
      }
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return {};
    // Rounded up, so a sub-millisecond remainder does not spin.
    const int64_t ms = std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60'000);
    const int n = poll(fds.data(), fds.size(), static_cast<int>(ms));
    if (n < 0) {
      if (errno == EINTR) continue;
      MESH_CHECK(false, "poll failed");
    }
    if (n == 0) continue;  // Re-checks the deadline.
    // Output first, so that a child's last words reach the log before it
    // is reported.
    for (size_t i = 0; i < fds.size(); ++i) {
      if (owners[i] != nullptr && fds[i].fd == owners[i]->pipe_fd && fds[i].revents != 0) {
        CopyOutput(*owners[i]);
      }
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (owners[i] == nullptr) return {EventKind::kStop, nullptr};
      SupervisedChild* child = owners[i];
      // The pidfd is -1 once reaped, so this also skips a child whose pipe
      // shared the poll round with its pidfd.
      if (fds[i].fd == child->process.pidfd() && child->process.TryWait().has_value()) {
        // Its last words, before anyone reads its log.
        if (child->pipe_fd >= 0) CopyOutput(*child);
        return {EventKind::kExited, child};
      }
    }
  }
}

void ChildSupervisor::Stop(const std::vector<SupervisedChild*>& group, absl::Duration grace) {
  for (SupervisedChild* child : group) {
    if (child->running()) child->process.Signal(SIGTERM).IgnoreError();
  }
  const absl::Time kill_at = absl::Now() + grace;
  while (AnyRunning(group) && absl::Now() < kill_at) WaitUntil(kill_at, /*watch_stop=*/false);
  for (SupervisedChild* child : group) {
    if (!child->running()) continue;
    err_ << "meshctl: " << child->name << " (pid " << child->pid() << ") did not stop within "
         << FormatDurationShort(grace) << " of SIGTERM; sending SIGKILL\n";
    child->process.Signal(SIGKILL).IgnoreError();
  }
  // SIGKILL cannot be caught; the bound only guards against a process stuck
  // in the kernel (D state).
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (AnyRunning(group) && absl::Now() < give_up) WaitUntil(give_up, /*watch_stop=*/false);
  for (SupervisedChild* child : group) {
    if (child->running()) {
      err_ << "meshctl: " << child->name << " (pid " << child->pid()
           << ") survived SIGKILL for 10 s; leaving it\n";
    }
    if (child->pipe_fd >= 0) CopyOutput(*child);  // Whatever is left.
  }
}

void ChildSupervisor::CopyOutput(SupervisedChild& child) {
  char buffer[16 * 1024];
  for (int round = 0; round < 16; ++round) {  // Bounded: one chatty child cannot starve.
    const ssize_t n = read(child.pipe_fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: nothing more now.
    if (n == 0) {       // EOF: the child and everything it started are gone.
      if (!child.partial_line.empty()) {
        err_ << "[" << child.name << "] " << child.partial_line << "\n";
        child.partial_line.clear();
      }
      err_.flush();
      CloseFd(child.pipe_fd);
      CloseFd(child.log_fd);
      return;
    }
    [[maybe_unused]] ssize_t w = write(child.log_fd, buffer, static_cast<size_t>(n));
    child.partial_line.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = child.partial_line.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      err_ << "[" << child.name << "] "
           << std::string_view(child.partial_line).substr(start, nl + 1 - start);
    }
    child.partial_line.erase(0, start);
    err_.flush();
  }
}

}  // namespace mesh::cli
