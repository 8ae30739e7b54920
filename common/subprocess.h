// Subprocess: the one fork/exec of the code base. Starts a program with an
// explicit argv, environment, working directory, standard streams, process
// group and parent-death signal, and owns the child until it is reaped.
//
// Contract:
//   - Errors are absl::Status. Spawn returns only once the child has
//     exec'd: a failure before or at execve (no such program, a working
//     directory that does not exist, a failed pre-exec step) comes back to
//     the parent through a close-on-exec pipe, with its errno, as a Status.
//     A missing program is NOT_FOUND from Spawn, never a child that exits
//     with 127.
//   - Between fork and execve the child calls only async-signal-safe
//     functions: everything it needs (argv, envp, the resolved program path,
//     open file descriptors) is prepared before fork, so a multi-threaded
//     parent (gRPC, the agent's I/O thread) is safe. A pre-exec hook is held
//     to the same rule.
//   - The child gets only file descriptors 0, 1 and 2; every other one is
//     closed before execve, whether or not it is close-on-exec. Signal
//     dispositions are reset to SIG_DFL and the signal mask is cleared,
//     since an ignored signal and a blocked mask both survive execve.
//   - With a death signal set (the default, SIGKILL), the child gets it when
//     the parent *thread* that called Spawn exits (PR_SET_PDEATHSIG), so no
//     child outlives its parent even when the parent is SIGKILLed; call
//     Spawn from a thread that lives as long as the child should. A parent
//     that died between fork and prctl is detected, and the child exits.
//   - Ownership: a Subprocess owns its child, its pidfd and the parent ends
//     of its pipes. Destroying one whose child is unreaped SIGKILLs the
//     child (its whole group when it leads one) and reaps it, so nothing is
//     left behind by an early return. The parent must not ignore SIGCHLD
//     (the kernel would then reap the child and its status would be lost).
//   - Thread safety: Spawn may be called from any thread. One Subprocess is
//     not thread-safe: one owner, or the owner's lock, per object.
//
// Lifecycle:
//
//   Spawn ──exec ok──▶ RUNNING ──TryWait / Wait sees the exit──▶ REAPED
//     │                  │  Signal, SignalGroup            (exit_status(),
//     │ exec failed       │  Terminate(grace): SIGTERM,       pidfd() == -1)
//     ▼                  │  grace, SIGKILL, reap ───────────▶
//   error Status (the child was reaped)
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh {

// How a child ended.
struct ExitStatus {
  // Exit status when it exited normally, else -1.
  int exit_code = -1;
  // Terminating signal when it was killed by one, else 0.
  int signal = 0;
  bool core_dumped = false;

  bool exited() const { return signal == 0; }
  bool success() const { return exited() && exit_code == 0; }
  // "exit code 3", "signal 9 (Killed)", "signal 11 (Segmentation fault), core dumped".
  std::string ToString() const;

  // From a waitpid() status; and back, for callers that use the W* macros.
  static ExitStatus FromWaitStatus(int wait_status);
  int ToWaitStatus() const;
};

// Where one of the child's standard streams goes.
struct Redirect {
  enum class Kind {
    kInherit,  // The parent's own fd.
    kNull,     // /dev/null.
    kFile,     // `path`: opened for reading (stdin), or created, truncated
               // and opened for appending (stdout, stderr) with mode 0644.
    kFd,       // A duplicate of `fd`, which stays the caller's.
    kPipe,     // stdout/stderr only: a pipe whose read end the Subprocess
               // holds (non-blocking, close-on-exec).
    kStdout,   // stderr only: wherever stdout goes (2>&1).
  };
  Kind kind = Kind::kInherit;
  std::string path;
  int fd = -1;

  static Redirect Inherit() { return {}; }
  static Redirect Null() { return {Kind::kNull, "", -1}; }
  static Redirect File(std::string path) { return {Kind::kFile, std::move(path), -1}; }
  static Redirect Fd(int fd) { return {Kind::kFd, "", fd}; }
  static Redirect Pipe() { return {Kind::kPipe, "", -1}; }
  static Redirect Stdout() { return {Kind::kStdout, "", -1}; }
};

struct SpawnOptions {
  // The command, run as is, never through a shell. argv[0] containing a '/'
  // is a path (relative to the parent's working directory); otherwise it is
  // looked up in the PATH of `env` (or of the parent, when `env` is unset),
  // with relative PATH entries taken relative to `working_dir`.
  std::vector<std::string> argv;
  // The child's complete environment, "NAME=value" entries; unset: a copy
  // of the parent's environment at the time of Spawn.
  std::optional<std::vector<std::string>> env;
  // Directory the child starts in; empty: the parent's.
  std::string working_dir;

  Redirect stdin_to = Redirect::Inherit();
  Redirect stdout_to = Redirect::Inherit();
  Redirect stderr_to = Redirect::Inherit();

  enum class Group {
    kInherit,     // Stays in the parent's process group (a terminal's
                  // Ctrl-C reaches it too).
    kNewGroup,    // setpgid(0, 0): leads a group of its own.
    kNewSession,  // setsid(): leads a session and a group, no terminal.
  };
  Group group = Group::kInherit;

  // Sent to the child when the spawning thread exits; 0: none.
  int death_signal = SIGKILL;

  // Runs in the child after the group, death signal and signal reset, and
  // before chdir, the redirections and the closing of other fds: the place
  // for privileged steps such as dropping credentials or joining a cgroup.
  // Must be async-signal-safe (no allocation, no locks). Returns 0, or an
  // errno value that makes Spawn fail without exec'ing.
  std::function<int()> pre_exec;
};

// True for a regular file this process may execute: what Spawn looks for
// in PATH.
bool IsExecutableFile(const std::string& path);

class Subprocess {
 public:
  // Starts `options.argv`. Returns once the child has exec'd.
  // Possible errors: INVALID_ARGUMENT (empty argv, a NUL byte, an env entry
  // that is not NAME=value, a redirection a stream does not support);
  // NOT_FOUND (the program or working_dir does not exist; the message names
  // it, and the PATH searched); PERMISSION_DENIED (not executable, not
  // enterable, or a pre-exec step's EPERM/EACCES); FAILED_PRECONDITION (a
  // redirection file cannot be opened, the program is not an executable
  // format); INTERNAL (fork, pipe and other system failures).
  static absl::StatusOr<Subprocess> Spawn(const SpawnOptions& options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  Subprocess(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Readable (POLLIN) once the child has exited; -1 after it was reaped.
  // For callers that poll() many children together; then call TryWait.
  int pidfd() const { return pidfd_; }
  bool leads_group() const { return leads_group_; }
  bool running() const { return !exit_.has_value(); }
  // Set once reaped.
  const std::optional<ExitStatus>& exit_status() const { return exit_; }

  // Read ends of Redirect::Pipe streams (-1 otherwise). Owned by this
  // object unless released; a released fd is the caller's to close.
  int stdout_fd() const { return stdout_fd_; }
  int stderr_fd() const { return stderr_fd_; }
  int ReleaseStdout();
  int ReleaseStderr();

  // Reaps the child if it has exited, without blocking.
  std::optional<ExitStatus> TryWait();

  // Waits up to `timeout` for the child to exit, and reaps it.
  // Possible errors: DEADLINE_EXCEEDED when it is still running;
  // INTERNAL when poll or waitpid fails.
  absl::StatusOr<ExitStatus> Wait(absl::Duration timeout = absl::InfiniteDuration());

  // Sends `signal` to the child alone.
  // Possible errors: FAILED_PRECONDITION once it has been reaped (its pid
  // may belong to another process by then).
  absl::Status Signal(int signal);

  // Sends `signal` to every process of the child's group. Also works after
  // the leader was reaped while members remain (a group id is not reused
  // while the group has a member).
  // Possible errors: FAILED_PRECONDITION when the child does not lead a
  // group (Group::kInherit); NOT_FOUND when the group has no live member;
  // PERMISSION_DENIED, INVALID_ARGUMENT (a bad signal) as kill(2) reports.
  absl::Status SignalGroup(int signal);

  // SIGTERM to the child (to its group when it leads one), SIGKILL to the
  // same after `grace` if the child is still running, then reaps it.
  // Possible errors: as Wait, when it survives SIGKILL for 10 s (a process
  // stuck in the kernel).
  absl::StatusOr<ExitStatus> Terminate(absl::Duration grace);

 private:
  Subprocess(pid_t pid, int pidfd, bool leads_group, int stdout_fd, int stderr_fd)
      : pid_(pid),
        pidfd_(pidfd),
        leads_group_(leads_group),
        stdout_fd_(stdout_fd),
        stderr_fd_(stderr_fd) {}

  // SIGKILL to the group or the child, whichever it is.
  void KillAll();

  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool leads_group_ = false;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  std::optional<ExitStatus> exit_;
};

}  // namespace mesh
