#include "agent/process_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/check.h"

namespace mesh::agent {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Moves `fd` to a number >= 3 (keeping O_CLOEXEC), so that the child's
// dup2 onto 0..3 can never clobber another fd it still has to copy. Only an
// agent started with stdin/stdout/stderr closed gets fds below 3.
absl::Status AboveStdio(int& fd) {
  if (fd >= 3) return absl::OkStatus();
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 4);
  if (moved < 0) return absl::InternalError(absl::StrCat("fcntl(F_DUPFD): ", ErrnoText(errno)));
  close(fd);
  fd = moved;
  return absl::OkStatus();
}

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// Resolves argv[0] against the worker's PATH (not the agent's: execvpe would
// search the agent's). Returns it unchanged when it contains a '/'.
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
    // A relative PATH entry is relative to where the worker starts.
    std::string candidate = absl::StrCat(dir.empty() ? absl::string_view(".") : dir, "/", program);
    if (candidate[0] != '/' && !working_dir.empty()) {
      candidate = absl::StrCat(working_dir, "/", candidate);
    }
    if (IsExecutableFile(candidate)) return candidate;
    if (access(candidate.c_str(), F_OK) == 0) exists_somewhere = true;
  }
  if (exists_somewhere) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot execute '", program, "': found in the worker's PATH but not executable"));
  }
  return absl::NotFoundError(
      absl::StrCat("cannot execute '", program, "': not found in the worker's PATH=", path));
}

// What the child reports through the CLOEXEC pipe when it fails before or
// at execve. Nothing arrives when execve succeeds (the pipe closes on exec).
enum class ChildStage : int { kChdir = 1, kExec = 2, kSetup = 3 };
struct ChildError {
  ChildStage stage;
  int err;
};

absl::Status ChildErrorToStatus(const ChildError& e, const LaunchSpec& spec,
                                const std::string& program) {
  std::string what;
  switch (e.stage) {
    case ChildStage::kChdir:
      what = absl::StrCat("cannot enter working_dir '", spec.working_dir, "'");
      break;
    case ChildStage::kExec:
      what = absl::StrCat("cannot execute '", program, "'");
      break;
    case ChildStage::kSetup:
      what = absl::StrCat("cannot set up the process for '", program, "'");
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

[[noreturn]] void ChildFail(int report_fd, ChildStage stage) {
  const ChildError e{stage, errno};
  // Nothing useful can be done if the parent is gone; ignore the result.
  [[maybe_unused]] ssize_t n = write(report_fd, &e, sizeof(e));
  _exit(127);
}

}  // namespace

std::string ExitInfo::ToString() const {
  if (exited()) return absl::StrCat("exit code ", exit_code);
  const char* name = strsignal(signal);
  return absl::StrCat("signal ", signal, " (", name != nullptr ? name : "?", ")",
                      core_dumped ? ", core dumped" : "");
}

// One captured output stream: the read end of the worker's pipe and the log
// file it is copied into. Touched only by the I/O thread after Launch (and
// by the destructor after that thread is joined).
struct PosixProcessLauncher::LogStream {
  int pipe_fd = -1;  // read end, O_NONBLOCK; -1 after EOF.
  int file_fd = -1;  // log file; -1 when output is discarded.
  std::string path;
  int64_t size = 0;
  int64_t cap = 0;

  // Copies what is readable now into the file. Returns false at EOF.
  bool Drain() {
    char buffer[64 * 1024];
    // Bounded, so one chatty worker cannot starve the others.
    for (int round = 0; round < 16; ++round) {
      const ssize_t n = read(pipe_fd, buffer, sizeof(buffer));
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      Append(buffer, static_cast<size_t>(n));
    }
    return true;
  }

  void Append(const char* data, size_t length) {
    if (file_fd < 0) return;
    while (length > 0) {
      if (cap > 0 && size >= cap) Rotate();
      if (file_fd < 0) return;
      size_t chunk = length;
      if (cap > 0) chunk = std::min<size_t>(chunk, static_cast<size_t>(cap - size));
      const ssize_t n = write(file_fd, data, chunk);
      if (n < 0) {
        if (errno == EINTR) continue;
        return;  // Disk full or similar: drop the output rather than block the worker.
      }
      size += n;
      data += n;
      length -= static_cast<size_t>(n);
    }
  }

  void Rotate() {
    close(file_fd);
    rename(path.c_str(), absl::StrCat(path, ".1").c_str());
    file_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size = 0;
  }

  void Close() {
    CloseFd(pipe_fd);
    CloseFd(file_fd);
  }
};

struct PosixProcessLauncher::Worker {
  pid_t pid = -1;
  int pidfd = -1;  // -1 once the leader is reaped.
  bool exited = false;
  std::vector<LogStream> streams;
  std::optional<absl::Time> kill_at;  // pending SIGKILL of the group
  ExitCallback on_exit;
};

PosixProcessLauncher::PosixProcessLauncher() : wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  MESH_CHECK(wake_fd_ >= 0, "eventfd failed");
  io_thread_ = std::thread([this] { Run(); });
}

PosixProcessLauncher::~PosixProcessLauncher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  io_thread_.join();
  // Decision 7: nothing we started outlives us.
  for (auto& [pid, worker] : workers_) {
    kill(-pid, SIGKILL);
    if (!worker->exited) {
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    if (worker->pidfd >= 0) close(worker->pidfd);
    for (LogStream& stream : worker->streams) stream.Close();
  }
  close(wake_fd_);
}

void PosixProcessLauncher::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

absl::StatusOr<pid_t> PosixProcessLauncher::Launch(const LaunchSpec& spec, ExitCallback on_exit) {
  if (spec.argv.empty() || spec.argv[0].empty()) {
    return absl::InvalidArgumentError("LaunchSpec.argv is empty");
  }
  for (const std::string& s : spec.argv) {
    if (s.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError("LaunchSpec.argv contains a NUL byte");
    }
  }
  for (const std::string& e : spec.env) {
    const size_t eq = e.find('=');
    if (eq == 0 || eq == std::string::npos || e.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("LaunchSpec.env entry '", e, "' is not NAME=value"));
    }
  }
  if (spec.working_dir.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("LaunchSpec.working_dir contains a NUL byte");
  }
  absl::StatusOr<std::string> program = ResolveProgram(spec.argv[0], spec.env, spec.working_dir);
  if (!program.ok()) return program.status();

  // Everything the child needs is prepared before fork(): in a
  // multi-threaded parent only async-signal-safe calls are allowed after it.
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* working_dir = spec.working_dir.empty() ? nullptr : spec.working_dir.c_str();

  auto worker = std::make_unique<Worker>();
  // Child-side fds: stdin, stdout, stderr, exec-error report.
  int child_in = -1, child_out = -1, child_err = -1, report_read = -1, report_write = -1;
  auto cleanup = [&] {
    CloseFd(child_in);
    CloseFd(child_out);
    CloseFd(child_err);
    CloseFd(report_read);
    CloseFd(report_write);
    for (LogStream& s : worker->streams) s.Close();
  };
  auto fail = [&](absl::Status status) {
    cleanup();
    return status;
  };

  child_in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (child_in < 0) return fail(absl::InternalError("open(/dev/null): " + ErrnoText(errno)));

  // One stream per distinct log file: stderr shares stdout's when not separate.
  const bool discard = spec.stdout_log.empty();
  const bool separate_stderr =
      !discard && !spec.stderr_log.empty() && spec.stderr_log != spec.stdout_log;
  std::vector<std::string> paths;
  if (!discard) paths.push_back(spec.stdout_log);
  if (separate_stderr) paths.push_back(spec.stderr_log);
  for (const std::string& path : paths) {
    LogStream stream;
    stream.path = path;
    stream.cap = spec.max_log_bytes;
    stream.file_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (stream.file_fd < 0) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("cannot open log file '", path, "': ", ErrnoText(errno))));
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      stream.Close();
      return fail(absl::InternalError("pipe2: " + ErrnoText(errno)));
    }
    stream.pipe_fd = fds[0];
    fcntl(stream.pipe_fd, F_SETFL, O_NONBLOCK);
    worker->streams.push_back(std::move(stream));
    (child_out < 0 ? child_out : child_err) = fds[1];
  }
  if (discard) {
    child_out = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (child_out < 0) return fail(absl::InternalError("open(/dev/null): " + ErrnoText(errno)));
  }
  if (child_err < 0) {
    child_err = fcntl(child_out, F_DUPFD_CLOEXEC, 3);
    if (child_err < 0) return fail(absl::InternalError("fcntl(F_DUPFD): " + ErrnoText(errno)));
  }
  {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return fail(absl::InternalError("pipe2: " + ErrnoText(errno)));
    report_read = fds[0];
    report_write = fds[1];
  }
  for (int* fd : {&child_in, &child_out, &child_err, &report_write}) {
    if (absl::Status s = AboveStdio(*fd); !s.ok()) return fail(s);
  }
  struct rlimit fd_limit;
  const int max_fd = getrlimit(RLIMIT_NOFILE, &fd_limit) == 0 && fd_limit.rlim_cur != RLIM_INFINITY
                         ? static_cast<int>(std::min<rlim_t>(fd_limit.rlim_cur, 1 << 20))
                         : 65536;
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) return fail(absl::InternalError("fork: " + ErrnoText(errno)));
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    if (setsid() < 0) ChildFail(report_write, ChildStage::kSetup);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) ChildFail(report_write, ChildStage::kSetup);
    // The parent may have died between fork and prctl; then no signal will
    // ever come, and we would run as an orphan.
    if (getppid() != parent) _exit(127);
    // Undo what the agent's threads may have set: a blocked mask and ignored
    // signals both survive execve.
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
    }
    if (working_dir != nullptr && chdir(working_dir) != 0) {
      ChildFail(report_write, ChildStage::kChdir);
    }
    if (dup2(child_in, 0) < 0 || dup2(child_out, 1) < 0 || dup2(child_err, 2) < 0) {
      ChildFail(report_write, ChildStage::kSetup);
    }
    int report = report_write;
    if (report != 3) {
      report = dup3(report_write, 3, O_CLOEXEC);
      if (report < 0) ChildFail(report_write, ChildStage::kSetup);
    }
    // Close everything else: the worker must not hold the agent's sockets
    // or other workers' pipes (which would delay their EOF).
    if (syscall(SYS_close_range, 4U, ~0U, 0U) != 0) {
      for (int fd = 4; fd < max_fd; ++fd) close(fd);
    }
    execve(program->c_str(), argv.data(), envp.data());
    ChildFail(report, ChildStage::kExec);
  }

  // Parent.
  CloseFd(child_in);
  CloseFd(child_out);
  CloseFd(child_err);
  CloseFd(report_write);
  ChildError child_error{};
  ssize_t got;
  do {
    got = read(report_read, &child_error, sizeof(child_error));
  } while (got < 0 && errno == EINTR);
  CloseFd(report_read);
  if (got == static_cast<ssize_t>(sizeof(child_error))) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return fail(ChildErrorToStatus(child_error, spec, *program));
  }
  if (got != 0) {
    // A short read means the child died mid-setup (e.g. SIGKILLed). Reap it.
    kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return fail(absl::InternalError(
        absl::StrCat("launch of '", *program, "' failed: lost the child during setup")));
  }

  // The child is our unreaped child, so its pid cannot be reused: pidfd_open
  // cannot race.
  worker->pid = pid;
  worker->on_exit = std::move(on_exit);
  // Through syscall(): glibc 2.36's <sys/pidfd.h> lacks extern "C".
  worker->pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (worker->pidfd < 0) {
    const int err = errno;
    kill(-pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return fail(absl::InternalError("pidfd_open: " + ErrnoText(err)));
  }
  {
    absl::MutexLock lock(&mu_);
    // A tracked pid is an unreaped child or the id of a live group, so the
    // kernel cannot have handed it out again.
    MESH_CHECK(workers_.emplace(pid, std::move(worker)).second, "launched pid already tracked");
  }
  Wake();
  return pid;
}

absl::Status PosixProcessLauncher::Signal(pid_t pid, int signal) {
  absl::MutexLock lock(&mu_);
  if (workers_.find(pid) == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no launched process ", pid));
  }
  if (kill(-pid, signal) != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot signal process group ", pid, ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status PosixProcessLauncher::Terminate(pid_t pid, absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(pid);
    if (it == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("no launched process ", pid));
    }
    kill(-pid, SIGTERM);
    const absl::Time at = absl::Now() + grace;
    Worker& worker = *it->second;
    if (!worker.kill_at.has_value() || at < *worker.kill_at) worker.kill_at = at;
  }
  Wake();
  return absl::OkStatus();
}

void PosixProcessLauncher::Run() {
  // How often a worker whose leader has exited is checked for remaining group
  // members when no pipe or timer would wake us.
  constexpr absl::Duration kLingerCheck = absl::Milliseconds(200);
  std::vector<pollfd> fds;
  std::vector<std::pair<ExitCallback, ExitInfo>> exits;
  while (true) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    absl::Duration timeout = absl::InfiniteDuration();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (auto& [pid, worker] : workers_) {
        if (worker->pidfd >= 0) fds.push_back({worker->pidfd, POLLIN, 0});
        for (LogStream& s : worker->streams) {
          if (s.pipe_fd >= 0) fds.push_back({s.pipe_fd, POLLIN, 0});
        }
        if (worker->kill_at.has_value()) timeout = std::min(timeout, *worker->kill_at - now);
        if (worker->exited) timeout = std::min(timeout, kLingerCheck);
      }
    }
    const int timeout_ms =
        timeout == absl::InfiniteDuration()
            ? -1
            : static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout) + 1));
    const int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) MESH_CHECK(false, "poll failed in the launcher's I/O thread");
    if (fds[0].revents != 0) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &count, sizeof(count));
    }

    exits.clear();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (auto it = workers_.begin(); it != workers_.end();) {
        Worker& w = *it->second;
        // Output first, so the exit is reported after what preceded it.
        for (LogStream& s : w.streams) {
          if (s.pipe_fd >= 0 && !s.Drain()) CloseFd(s.pipe_fd), CloseFd(s.file_fd);
        }
        if (!w.exited) {
          siginfo_t info;
          std::memset(&info, 0, sizeof(info));
          if (waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG) == 0 &&
              info.si_pid == w.pid) {
            // Drain again: bytes written just before exit are in the pipe now.
            for (LogStream& s : w.streams) {
              if (s.pipe_fd >= 0 && !s.Drain()) CloseFd(s.pipe_fd), CloseFd(s.file_fd);
            }
            ExitInfo exit;
            exit.pid = w.pid;
            if (info.si_code == CLD_EXITED) {
              exit.exit_code = info.si_status;
            } else {
              exit.signal = info.si_status;
              exit.core_dumped = info.si_code == CLD_DUMPED;
            }
            exits.emplace_back(std::move(w.on_exit), exit);
            w.exited = true;
            CloseFd(w.pidfd);
          }
        }
        if (w.kill_at.has_value() && *w.kill_at <= now) {
          kill(-w.pid, SIGKILL);
          w.kill_at.reset();
        }
        bool streams_open = false;
        for (const LogStream& s : w.streams) streams_open |= s.pipe_fd >= 0;
        // The group id cannot be reused while any member lives, so a failed
        // kill(-pgid, 0) means the whole group is gone.
        if (w.exited && !streams_open && kill(-w.pid, 0) != 0 && errno == ESRCH) {
          for (LogStream& s : w.streams) s.Close();
          it = workers_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& [callback, exit] : exits) {
      if (callback) callback(exit);
    }
  }
}

}  // namespace mesh::agent
