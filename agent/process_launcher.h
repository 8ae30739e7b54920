// ProcessLauncher: the agent's seam for starting, signalling and reaping
// worker processes (docs/architecture.md decision 7: workers never outlive their
// agent). Agent logic talks to the interface; unit tests use a fake and never
// fork. PosixProcessLauncher is the real one; docs/agent.md has the contract.
//
// Lifecycle of one launched worker (its pid is also its process group id):
//
//   Launch ──▶ RUNNING ──leader exits──▶ EXITED (on_exit called once)
//                 │                         │ group still has members
//                 │ Terminate(grace)        │ (grandchildren) or pipes open
//                 ▼                         ▼
//              SIGTERM to group ──grace──▶ SIGKILL to group
//                                          │
//            group empty and output drained ──▶ forgotten (pid unknown)
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace mesh::agent {

// The account a worker runs as when it is not the agent's own
// (docs/security.md): set by an agent running as root.
struct WorkerCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  // Supplementary groups (getgrouplist of the account), gid included.
  std::vector<gid_t> groups;
  std::string user;  // the account's name, for messages
  std::string home;  // its home directory (the worker's HOME)
};

struct LaunchSpec {
  // The command, run as is: never through a shell. argv[0] containing '/' is
  // a path; otherwise it is looked up in the PATH of `env` (not the agent's).
  std::vector<std::string> argv;
  // The worker's complete environment, "NAME=value" entries. Nothing is
  // inherited implicitly from the agent: build it with BuildWorkerEnv().
  std::vector<std::string> env;
  // Directory the worker starts in; empty means the agent's own.
  std::string working_dir;
  // Log files for the worker's stdout and stderr (created, or truncated
  // unless append_log is set).
  // What is there already must be a regular file with one link: a symlink,
  // hard link or FIFO (which a worker of the account owning the directory
  // may have planted) is refused, not followed.
  // An empty stderr_log, or one equal to stdout_log, sends stderr to the
  // stdout log (2>&1). An empty stdout_log discards both.
  std::string stdout_log;
  std::string stderr_log;
  // Size cap per log file in bytes; 0 means no cap. When a write would pass
  // the cap the file is renamed to "<path>.1" (replacing an older one) and a
  // fresh file is started, so the newest output is always kept and each
  // stream uses at most 2 x cap bytes of disk.
  int64_t max_log_bytes = 0;
  // Keep what a log file holds already and write after it (a rank started
  // again in the same generation adds to its predecessor's log); the cap
  // counts the bytes already there. Either way the agent writes its log
  // files with O_APPEND, so a predecessor's stragglers still writing to the
  // same file never overwrite the newer output.
  bool append_log = false;
  // Set: the worker runs as this account. Its log files are created with
  // mode 0600 and owned by the account (the agent keeps writing them); the
  // child drops to the account's groups, gid and uid before exec, and then
  // sets its parent-death signal again (a change of credentials clears it).
  // Unset: the agent's own account, log files 0600 owned by the agent.
  std::optional<WorkerCredentials> credentials;
  // Cgroup directories the worker joins before it drops privileges and
  // execs (agent/cgroup.h: GenerationCgroup::CreateRank): the child writes
  // its pid to <dir>/cgroup.procs of each, so it and everything it starts
  // are in them from their first instruction.
  std::vector<std::string> cgroup_dirs;
};

// How a launched process ended: exit_code, signal, core_dumped and
// ToString() ("exit code 3", "signal 9 (Killed)") of an ExitStatus, and the
// pid it had.
struct ExitInfo : ExitStatus {
  pid_t pid = -1;
};

using ExitCallback = std::function<void(const ExitInfo&)>;

// Thread safety: implementations are thread-safe. Exit callbacks run on an
// implementation-owned thread, must not block for long, and may call back
// into the launcher. A callback may run before Launch has returned to its
// caller (a worker that exits at once), so callers that record the pid must
// do so under a lock the callback also takes; an implementation never runs a
// callback on the thread calling Launch, inside Launch.
class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;

  // Starts `spec` in its own session and process group; returns its pid,
  // which is also its process group id and its handle here. `on_exit` is
  // called exactly once when the process exits, and never when Launch fails.
  // Possible errors: INVALID_ARGUMENT (empty argv, NUL bytes, bad env entry);
  // NOT_FOUND (argv[0] or working_dir does not exist; the message names it);
  // PERMISSION_DENIED (argv[0] not executable, working_dir not enterable,
  // by the worker's account when credentials are set; or the agent may not
  // switch to that account);
  // FAILED_PRECONDITION (a log file cannot be opened, argv[0] is not an
  // executable format); INTERNAL (fork, pipe and other system failures).
  virtual absl::StatusOr<pid_t> Launch(const LaunchSpec& spec, ExitCallback on_exit) = 0;

  // Sends `signal` to every process of `pid`'s process group.
  // Possible errors: NOT_FOUND when `pid` is not a process this launcher
  // still tracks or its group has no live member.
  virtual absl::Status Signal(pid_t pid, int signal) = 0;

  // Sends SIGTERM to `pid`'s process group now and SIGKILL to the group
  // `grace` later, unless the group is empty by then. Returns at once. Works
  // after the leader has exited while group members remain.
  // Possible errors: NOT_FOUND when `pid` is not tracked any more.
  virtual absl::Status Terminate(pid_t pid, absl::Duration grace) = 0;
};

// The real launcher, over common/subprocess.h: each worker leads a session
// of its own, gets /dev/null for stdin and dies with the launching thread
// (PR_SET_PDEATHSIG, SIGKILL). One I/O thread serves every worker: it
// watches each worker's pidfd for its exit and copies its stdout/stderr
// pipes into the capped log files (no thread per worker).
//
// The launching thread matters: PR_SET_PDEATHSIG fires when the *thread*
// that forked the worker exits, so call Launch from a thread that lives as
// long as the agent.
//
// Destruction SIGKILLs every tracked process group, reaps the leaders and
// joins the I/O thread; no exit callback runs after it starts.
class PosixProcessLauncher final : public ProcessLauncher {
 public:
  // Exit callbacks run on the I/O thread, after everything the process wrote
  // before exiting is in its log file.
  PosixProcessLauncher();
  ~PosixProcessLauncher() override;

  PosixProcessLauncher(const PosixProcessLauncher&) = delete;
  PosixProcessLauncher& operator=(const PosixProcessLauncher&) = delete;

  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec, ExitCallback on_exit) override;
  absl::Status Signal(pid_t pid, int signal) override;
  absl::Status Terminate(pid_t pid, absl::Duration grace) override;

 private:
  struct LogStream;
  struct Worker;

  void Run();
  void Wake();

  const int wake_fd_;  // eventfd that interrupts the I/O thread's poll.

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<pid_t, std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);

  std::thread io_thread_;  // Last: starts after everything above exists.
};

}  // namespace mesh::agent
