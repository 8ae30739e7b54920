// ReaperWatchdog: makes "no process of a job survives its agent" hold for
// the workers' children too, even when the agent is killed with SIGKILL.
//
// PR_SET_PDEATHSIG (agent/process_launcher.h) kills each worker when the
// agent dies, but not what the worker forked: those grandchildren are
// orphaned and keep running. The watchdog is a small child process forked at
// agent start-up, before any thread exists, that holds the read end of a
// pipe from the agent. The agent writes each worker's process group id to
// it when the worker starts (and a removal once the group is gone). When the
// pipe reaches EOF, which happens however the agent ends (exit, crash,
// kill -9), the watchdog SIGKILLs every group still recorded and exits.
//
//   agent ──pipe: "+pgid", "-pgid"──▶ watchdog (records groups)
//   agent dies ──▶ EOF ──▶ watchdog: kill(-pgid, SIGKILL) for each ──▶ _exit
//
// The watchdog ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT, so a Ctrl-C
// to the agent's terminal (delivered to the whole foreground group) cannot
// kill it before it has done its work; it has no PDEATHSIG for the same
// reason. It holds no other descriptor of the agent (stdin and stdout are
// /dev/null; stderr is kept for its one error line).
//
// With a kill marker (the agent's MESH_AGENT_INSTANCE entry, agent/
// stray_killer.h), the watchdog then also kills every process whose
// environment holds it: the workers' descendants that left their groups
// (setsid, double forks), which no group kill reaches.
//
// Limits: a group is identified by its id; a group that emptied while the
// agent still recorded it could in principle be reused by an unrelated
// session leader with the same pid before the watchdog fires.
// ReapingLauncher removes groups once they are empty to keep that window
// short. A process that leaves its worker's group (setsid) escapes, as it
// escapes Terminate, unless the kill marker finds it (a process that drops
// its environment escapes that too; only a cgroup contains it).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/process_launcher.h"

namespace mesh::agent {

// Thread safety: Add and Remove are thread-safe. Start must run while the
// process has a single thread (fork copies only the calling thread, and the
// child continues without exec).
class ReaperWatchdog {
 public:
  // Groups the watchdog can record at once; more are refused (Add fails).
  static constexpr int kMaxGroups = 65536;

  // Forks the watchdog. `kill_marker` ("NAME=value"; empty: none): on the
  // agent's death, processes with it in their environment are killed too.
  // `on_agent_death` (may be empty) runs in the watchdog after those kills,
  // with the watchdog single-threaded: the agent kills its jobs' cgroups
  // there (KillAgentCgroups, agent/cgroup.h).
  // Possible errors: INTERNAL when pipe or fork fails.
  static absl::StatusOr<std::unique_ptr<ReaperWatchdog>> Start(
      std::string kill_marker = {}, std::function<void()> on_agent_death = {});

  // Closes the pipe: the watchdog kills the groups still recorded, exits,
  // and is reaped here.
  ~ReaperWatchdog();

  ReaperWatchdog(const ReaperWatchdog&) = delete;
  ReaperWatchdog& operator=(const ReaperWatchdog&) = delete;

  // Records / forgets process group `pgid` (> 1).
  // Possible errors: INVALID_ARGUMENT for pgid <= 1; UNAVAILABLE when the
  // watchdog is gone (the pipe is broken).
  absl::Status Add(pid_t pgid);
  absl::Status Remove(pid_t pgid);

  // The watchdog's pid.
  pid_t pid() const { return pid_; }

 private:
  ReaperWatchdog(pid_t pid, int write_fd) : pid_(pid), write_fd_(write_fd) {}
  absl::Status Send(char op, pid_t pgid);

  const pid_t pid_;
  absl::Mutex mu_;
  int write_fd_ ABSL_GUARDED_BY(mu_);
};

// A ProcessLauncher decorator that records each launched worker's process
// group with a ReaperWatchdog. A group is removed once it is empty: when
// its leader exits and no member is left, or later, checked whenever the
// launcher is used again, for groups whose children outlived the leader.
//
// Thread safety: as ProcessLauncher. `inner` and `watchdog` must outlive it.
class ReapingLauncher final : public ProcessLauncher {
 public:
  ReapingLauncher(ProcessLauncher* inner, ReaperWatchdog* watchdog)
      : inner_(inner), watchdog_(watchdog) {}

  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec, ExitCallback on_exit) override;
  absl::Status Signal(pid_t pid, int signal) override;
  absl::Status Terminate(pid_t pid, absl::Duration grace) override;

 private:
  // Removes the groups in lingering_ that have no member any more.
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ProcessLauncher* const inner_;
  ReaperWatchdog* const watchdog_;
  absl::Mutex mu_;
  // Groups whose leader exited while other members remained.
  std::set<pid_t> lingering_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::agent
