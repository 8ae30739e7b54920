#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/errno_text.h"

extern char** environ;

namespace mesh {
namespace {

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Moves `fd` to a number >= 4 when it is below 3 (keeping O_CLOEXEC), so
// that the child's dup2 onto 0..3 can never clobber another fd it still has
// to copy. Only a parent started with stdin/stdout/stderr closed gets fds
// below 3.
absl::Status AboveStdio(int& fd) {
  if (fd < 0 || fd >= 3) return absl::OkStatus();
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 4);
  if (moved < 0) return absl::InternalError(absl::StrCat("fcntl(F_DUPFD): ", ErrnoText(errno)));
  close(fd);
  fd = moved;
  return absl::OkStatus();
}

// Resolves argv[0] against the child's PATH (execvpe would search the
// parent's, and is not async-signal-safe). Returns it unchanged when it
// contains a '/'.
absl::StatusOr<std::string> ResolveProgram(const std::string& program,
                                           const std::vector<std::string>& env,
                                           const std::string& working_dir) {
  if (absl::StrContains(program, '/')) return program;
  std::string path = "/usr/local/bin:/usr/bin:/bin";  // glibc's default
  for (const std::string& entry : env) {
    if (absl::StartsWith(entry, "PATH=")) path = entry.substr(5);
  }
  bool exists_somewhere = false;
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    // A relative PATH entry is relative to where the child starts.
    std::string candidate = absl::StrCat(dir.empty() ? absl::string_view(".") : dir, "/", program);
    if (candidate[0] != '/' && !working_dir.empty()) {
      candidate = absl::StrCat(working_dir, "/", candidate);
    }
    if (IsExecutableFile(candidate)) return candidate;
    if (access(candidate.c_str(), F_OK) == 0) exists_somewhere = true;
  }
  if (exists_somewhere) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot execute '", program, "': found in PATH but not executable"));
  }
  return absl::NotFoundError(
      absl::StrCat("cannot execute '", program, "': not found in PATH=", path));
}

absl::Status Validate(const SpawnOptions& options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return absl::InvalidArgumentError("Subprocess: argv is empty");
  }
  for (const std::string& s : options.argv) {
    if (s.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError("Subprocess: argv contains a NUL byte");
    }
  }
  if (options.env.has_value()) {
    for (const std::string& e : *options.env) {
      const size_t eq = e.find('=');
      if (eq == 0 || eq == std::string::npos || e.find('\0') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("Subprocess: env entry '", e, "' is not NAME=value"));
      }
    }
  }
  if (options.working_dir.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("Subprocess: working_dir contains a NUL byte");
  }
  if (options.stdin_to.kind == Redirect::Kind::kPipe ||
      options.stdin_to.kind == Redirect::Kind::kStdout ||
      options.stdout_to.kind == Redirect::Kind::kStdout) {
    return absl::InvalidArgumentError(
        "Subprocess: Pipe() is for stdout and stderr only, Stdout() for stderr only");
  }
  for (const Redirect* r : {&options.stdin_to, &options.stdout_to, &options.stderr_to}) {
    if (r->kind == Redirect::Kind::kFd && r->fd < 0) {
      return absl::InvalidArgumentError("Subprocess: Redirect::Fd needs an open fd");
    }
  }
  return absl::OkStatus();
}

// The fds one Spawn opens, closed on every path out of it. `child` are the
// fds that become the child's 0, 1 and 2 (-1: inherited, or for stderr,
// a copy of stdout), `pipe` the parent's read ends.
struct SpawnFds {
  std::array<int, 3> child = {-1, -1, -1};
  std::array<int, 3> pipe = {-1, -1, -1};
  int report_read = -1;
  int report_write = -1;

  ~SpawnFds() {
    for (int& fd : child) CloseFd(fd);
    for (int& fd : pipe) CloseFd(fd);
    CloseFd(report_read);
    CloseFd(report_write);
  }

  // Opens what stream `index` (0, 1, 2) of the child is redirected to.
  absl::Status Open(int index, const Redirect& redirect) {
    const char* const kNames[] = {"stdin", "stdout", "stderr"};
    const int file_flags = index == 0 ? O_RDONLY : O_WRONLY | O_CREAT | O_TRUNC | O_APPEND;
    int& fd = child[index];
    switch (redirect.kind) {
      case Redirect::Kind::kInherit:
      case Redirect::Kind::kStdout:
        return absl::OkStatus();
      case Redirect::Kind::kNull:
        fd = open("/dev/null", (index == 0 ? O_RDONLY : O_WRONLY) | O_CLOEXEC);
        if (fd < 0) return absl::InternalError("open(/dev/null): " + ErrnoText(errno));
        break;
      case Redirect::Kind::kFile:
        fd = open(redirect.path.c_str(), file_flags | O_CLOEXEC, 0644);
        if (fd < 0) {
          return absl::FailedPreconditionError(absl::StrCat("cannot open '", redirect.path,
                                                            "' for the child's ", kNames[index],
                                                            ": ", ErrnoText(errno)));
        }
        break;
      case Redirect::Kind::kFd:
        fd = fcntl(redirect.fd, F_DUPFD_CLOEXEC, 4);
        if (fd < 0) return absl::InternalError("fcntl(F_DUPFD): " + ErrnoText(errno));
        break;
      case Redirect::Kind::kPipe: {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2: " + ErrnoText(errno));
        pipe[index] = fds[0];
        fd = fds[1];
        fcntl(pipe[index], F_SETFL, O_NONBLOCK);
        break;
      }
    }
    return AboveStdio(fd);
  }
};

// What the child reports through the CLOEXEC pipe when it fails before or
// at execve. Nothing arrives when execve succeeds (the pipe closes on exec).
enum class ChildStage : int { kChdir = 1, kExec = 2, kSetup = 3, kPreExec = 4 };
struct ChildError {
  ChildStage stage;
  int err;
};

absl::Status ChildErrorToStatus(const ChildError& e, const SpawnOptions& options,
                                const std::string& program) {
  std::string what;
  switch (e.stage) {
    case ChildStage::kChdir:
      what = absl::StrCat("cannot enter working_dir '", options.working_dir, "'");
      break;
    case ChildStage::kExec:
      what = absl::StrCat("cannot execute '", program, "'");
      break;
    case ChildStage::kSetup:
      what = absl::StrCat("cannot set up the process for '", program, "'");
      break;
    case ChildStage::kPreExec:
      what = absl::StrCat("the pre-exec step for '", program, "' failed");
      break;
  }
  const std::string message = absl::StrCat(what, ": ", ErrnoText(e.err));
  switch (e.err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOEXEC:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

[[noreturn]] void ChildFail(int report_fd, ChildStage stage, int err) {
  const ChildError e{stage, err};
  // Nothing useful can be done if the parent is gone; ignore the result.
  [[maybe_unused]] ssize_t n = write(report_fd, &e, sizeof(e));
  _exit(127);
}

// Reaps `pid`, blocking.
int ReapBlocking(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string ExitStatus::ToString() const {
  if (exited()) return absl::StrCat("exit code ", exit_code);
  const char* name = strsignal(signal);
  return absl::StrCat("signal ", signal, " (", name != nullptr ? name : "?", ")",
                      core_dumped ? ", core dumped" : "");
}

ExitStatus ExitStatus::FromWaitStatus(int wait_status) {
  ExitStatus status;
  if (WIFEXITED(wait_status)) {
    status.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    status.signal = WTERMSIG(wait_status);
    status.core_dumped = WCOREDUMP(wait_status);
  }
  return status;
}

int ExitStatus::ToWaitStatus() const {
  if (exited()) return W_EXITCODE(exit_code & 0xff, 0);
  return W_EXITCODE(0, signal) | (core_dumped ? WCOREFLAG : 0);
}

absl::StatusOr<Subprocess> Subprocess::Spawn(const SpawnOptions& options) {
  if (absl::Status s = Validate(options); !s.ok()) return s;

  std::vector<std::string> env_storage;
  if (!options.env.has_value()) {
    for (char** e = environ; *e != nullptr; ++e) env_storage.emplace_back(*e);
  }
  const std::vector<std::string>& env = options.env.has_value() ? *options.env : env_storage;
  absl::StatusOr<std::string> program = ResolveProgram(options.argv[0], env, options.working_dir);
  if (!program.ok()) return program.status();

  // Everything the child needs is prepared before fork(): in a
  // multi-threaded parent only async-signal-safe calls are allowed after it.
  std::vector<char*> argv;
  for (const std::string& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* working_dir = options.working_dir.empty() ? nullptr : options.working_dir.c_str();
  const bool stderr_to_stdout = options.stderr_to.kind == Redirect::Kind::kStdout;
  const std::function<int()>* pre_exec = options.pre_exec ? &options.pre_exec : nullptr;
  const SpawnOptions::Group group = options.group;
  const int death_signal = options.death_signal;

  SpawnFds fds;
  const Redirect* redirects[] = {&options.stdin_to, &options.stdout_to, &options.stderr_to};
  for (int i = 0; i < 3; ++i) {
    if (absl::Status s = fds.Open(i, *redirects[i]); !s.ok()) return s;
  }
  {
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) return absl::InternalError("pipe2: " + ErrnoText(errno));
    fds.report_read = report[0];
    fds.report_write = report[1];
    if (absl::Status s = AboveStdio(fds.report_write); !s.ok()) return s;
  }
  const std::array<int, 3> child_fds = fds.child;
  const int report_write = fds.report_write;
  struct rlimit fd_limit;
  const int max_fd = getrlimit(RLIMIT_NOFILE, &fd_limit) == 0 && fd_limit.rlim_cur != RLIM_INFINITY
                         ? static_cast<int>(std::min<rlim_t>(fd_limit.rlim_cur, 1 << 20))
                         : 65536;
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork: " + ErrnoText(errno));
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    if (group == SpawnOptions::Group::kNewSession && setsid() < 0) {
      ChildFail(report_write, ChildStage::kSetup, errno);
    }
    if (group == SpawnOptions::Group::kNewGroup && setpgid(0, 0) != 0) {
      ChildFail(report_write, ChildStage::kSetup, errno);
    }
    if (death_signal != 0) {
      if (prctl(PR_SET_PDEATHSIG, death_signal) != 0) {
        ChildFail(report_write, ChildStage::kSetup, errno);
      }
      // The parent may have died between fork and prctl; then no signal
      // will ever come, and the child would run as an orphan.
      if (getppid() != parent) _exit(127);
    }
    // Undo what the parent's threads may have set: ignored signals and a
    // blocked mask both survive execve. The dispositions first, so that no
    // signal unblocked here runs one of the parent's handlers in the child.
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig == SIGKILL || sig == SIGSTOP) continue;
      if (sigaction(sig, &dfl, nullptr) != 0 && errno == EINVAL) {
        // glibc keeps its own signals below SIGRTMIN (32 and 33) from
        // sigaction(); one the parent inherited as ignored would stay
        // ignored across execve and break the new program's glibc. The
        // kernel call takes an all-zero action as SIG_DFL with no flags and
        // an empty mask, whatever the architecture's field order.
        const unsigned long zero_action[8] = {};
        syscall(SYS_rt_sigaction, sig, zero_action, nullptr, (NSIG - 1) / 8);
      }
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (pre_exec != nullptr) {
      if (const int err = (*pre_exec)(); err != 0) {
        ChildFail(report_write, ChildStage::kPreExec, err);
      }
    }
    if (working_dir != nullptr && chdir(working_dir) != 0) {
      ChildFail(report_write, ChildStage::kChdir, errno);
    }
    for (int i = 0; i < 3; ++i) {
      if (child_fds[i] >= 0 && dup2(child_fds[i], i) < 0) {
        ChildFail(report_write, ChildStage::kSetup, errno);
      }
    }
    if (stderr_to_stdout && dup2(1, 2) < 0) ChildFail(report_write, ChildStage::kSetup, errno);
    int report = report_write;
    if (report != 3) {
      report = dup3(report_write, 3, O_CLOEXEC);
      if (report < 0) ChildFail(report_write, ChildStage::kSetup, errno);
    }
    // Close everything else: the child must not hold the parent's sockets
    // or other children's pipes (which would delay their EOF).
    if (syscall(SYS_close_range, 4U, ~0U, 0U) != 0) {
      for (int fd = 4; fd < max_fd; ++fd) close(fd);
    }
    execve(program->c_str(), argv.data(), envp.data());
    ChildFail(report, ChildStage::kExec, errno);
  }

  // Parent.
  for (int& fd : fds.child) CloseFd(fd);
  CloseFd(fds.report_write);
  ChildError child_error{};
  ssize_t got;
  do {
    got = read(fds.report_read, &child_error, sizeof(child_error));
  } while (got < 0 && errno == EINTR);
  if (got == static_cast<ssize_t>(sizeof(child_error))) {
    ReapBlocking(pid);
    return ChildErrorToStatus(child_error, options, *program);
  }
  if (got != 0) {
    // A short read means the child died mid-setup (e.g. SIGKILLed). Reap it.
    kill(pid, SIGKILL);
    ReapBlocking(pid);
    return absl::InternalError(
        absl::StrCat("start of '", *program, "' failed: lost the child during setup"));
  }
  const bool leads_group = group != SpawnOptions::Group::kInherit;
  // The child is our unreaped child, so its pid cannot be reused:
  // pidfd_open cannot race. Through syscall(): glibc 2.36's <sys/pidfd.h>
  // lacks extern "C".
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    const int err = errno;
    if (leads_group) kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    ReapBlocking(pid);
    return absl::InternalError("pidfd_open (Linux >= 5.3 is required): " + ErrnoText(err));
  }
  Subprocess process(pid, pidfd, leads_group, fds.pipe[1], fds.pipe[2]);
  fds.pipe[1] = fds.pipe[2] = -1;
  return process;
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_),
      pidfd_(other.pidfd_),
      leads_group_(other.leads_group_),
      stdout_fd_(other.stdout_fd_),
      stderr_fd_(other.stderr_fd_),
      exit_(other.exit_) {
  other.pid_ = -1;
  other.pidfd_ = -1;
  other.stdout_fd_ = -1;
  other.stderr_fd_ = -1;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && running()) {
    KillAll();
    ReapBlocking(pid_);
  }
  CloseFd(pidfd_);
  CloseFd(stdout_fd_);
  CloseFd(stderr_fd_);
}

int Subprocess::ReleaseStdout() { return std::exchange(stdout_fd_, -1); }
int Subprocess::ReleaseStderr() { return std::exchange(stderr_fd_, -1); }

void Subprocess::KillAll() {
  if (leads_group_) kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
}

std::optional<ExitStatus> Subprocess::TryWait() {
  if (!running() || pid_ <= 0) return exit_;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return std::nullopt;
  // r < 0 (ECHILD) means someone else reaped it, e.g. SIGCHLD set to
  // SIG_IGN against the contract: it has exited, status unknown.
  exit_ = r == pid_ ? ExitStatus::FromWaitStatus(status) : ExitStatus{};
  CloseFd(pidfd_);
  return exit_;
}

absl::StatusOr<ExitStatus> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (std::optional<ExitStatus> done = TryWait(); done.has_value()) return *done;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    // Rounded up, so a sub-millisecond remainder does not spin; bounded, so
    // an infinite timeout fits an int.
    const int64_t ms = std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60'000);
    pollfd fd = {pidfd_, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(ms)) < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", ErrnoText(errno)));
    }
  }
}

absl::Status Subprocess::Signal(int signal) {
  if (!running()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot signal pid ", pid_, ": it has been reaped"));
  }
  if (kill(pid_, signal) != 0) {
    return absl::InternalError(absl::StrCat("kill(", pid_, "): ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status Subprocess::SignalGroup(int signal) {
  if (!leads_group_) {
    return absl::FailedPreconditionError(
        absl::StrCat("pid ", pid_, " does not lead a process group"));
  }
  if (kill(-pid_, signal) == 0) return absl::OkStatus();
  const int err = errno;
  const std::string message =
      absl::StrCat("cannot signal process group ", pid_, ": ", ErrnoText(err));
  switch (err) {
    case ESRCH:
      return absl::NotFoundError(message);
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EINVAL:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<ExitStatus> Subprocess::Terminate(absl::Duration grace) {
  if (!running()) return *exit_;
  if (leads_group_) {
    kill(-pid_, SIGTERM);
  } else {
    kill(pid_, SIGTERM);
  }
  absl::StatusOr<ExitStatus> exit = Wait(grace);
  if (exit.ok() || !absl::IsDeadlineExceeded(exit.status())) return exit;
  KillAll();
  // SIGKILL cannot be caught; the bound only guards against a process stuck
  // in the kernel (D state).
  return Wait(absl::Seconds(10));
}

}  // namespace mesh
