// FakeLauncher: a ProcessLauncher for Agent unit tests that never forks.
// It records launches and terminations; a process exits when the test says
// so (Exit) or on Terminate, and exits are delivered on the fake's own
// thread, as the real launcher does (never on a caller's thread: a caller
// may hold the supervisor's lock).
//
// Thread safety: thread-safe. Ownership: must outlive whatever it launched
// for (declare it before the Agent).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/process_launcher.h"

namespace mesh::agent::testing {

class FakeLauncher final : public ProcessLauncher {
 public:
  struct Proc {
    LaunchSpec spec;
    ExitCallback on_exit;
    bool alive = true;
    std::optional<absl::Duration> terminated;
  };

  FakeLauncher() : thread_([this] { Deliver(); }) {}
  ~FakeLauncher() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec, ExitCallback on_exit) override {
    absl::MutexLock lock(&mu_);
    if (fail_launch_.has_value()) return *fail_launch_;
    const pid_t pid = next_pid_++;
    Proc& proc = procs_[pid];
    proc.spec = spec;
    proc.on_exit = std::move(on_exit);
    events_.push_back(absl::StrCat("launch ", pid));
    return pid;
  }
  absl::Status Signal(pid_t pid, int) override {
    absl::MutexLock lock(&mu_);
    return procs_.count(pid) ? absl::OkStatus() : absl::NotFoundError("no such pid");
  }
  absl::Status Terminate(pid_t pid, absl::Duration grace) override {
    absl::MutexLock lock(&mu_);
    auto it = procs_.find(pid);
    if (it == procs_.end() || !it->second.alive) return absl::NotFoundError("not running");
    events_.push_back(absl::StrCat("terminate ", pid));
    it->second.terminated = grace;
    ExitLocked(pid, -1, SIGTERM);
    return absl::OkStatus();
  }

  // Makes `pid` exit with `code` (signal 0) or by `signal`.
  void Exit(pid_t pid, int code, int signal = 0) {
    absl::MutexLock lock(&mu_);
    ExitLocked(pid, code, signal);
  }
  void FailLaunches(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_launch_ = status;
  }
  std::map<pid_t, Proc> procs() const {
    absl::MutexLock lock(&mu_);
    return procs_;
  }
  std::vector<std::string> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  size_t launched() const {
    absl::MutexLock lock(&mu_);
    return procs_.size();
  }

 private:
  void ExitLocked(pid_t pid, int code, int signal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Proc& proc = procs_.at(pid);
    if (!proc.alive) return;
    proc.alive = false;
    ExitInfo info;
    info.pid = pid;
    info.exit_code = signal == 0 ? code : -1;
    info.signal = signal;
    pending_.emplace_back(proc.on_exit, info);
  }
  // Runs callbacks outside mu_ and never on a caller's thread (a caller
  // may hold the supervisor's lock, as with the real launcher).
  void Deliver() {
    for (;;) {
      std::deque<std::pair<ExitCallback, ExitInfo>> batch;
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(
                                 +[](FakeLauncher* f) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return f->stopping_ || !f->pending_.empty();
                                 },
                                 this),
                             absl::Milliseconds(50));
        if (stopping_ && pending_.empty()) return;
        batch.swap(pending_);
      }
      for (auto& [callback, info] : batch) {
        if (callback) callback(info);
      }
    }
  }

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  pid_t next_pid_ ABSL_GUARDED_BY(mu_) = 1000;
  std::map<pid_t, Proc> procs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> fail_launch_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<ExitCallback, ExitInfo>> pending_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last
};

// The value of `name` in a launched process's environment ("NAME=value"),
// or "" when it is not set.
inline std::string EnvValue(const LaunchSpec& spec, const std::string& name) {
  for (const std::string& entry : spec.env) {
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  }
  return "";
}

}  // namespace mesh::agent::testing
