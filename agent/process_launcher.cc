#include "agent/process_launcher.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/errno_text.h"

namespace mesh::agent {
namespace {

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Opens a log file for the agent to write: mode 0600, owned by the worker's
// account when it has one, truncated unless `append`. Always O_APPEND, so
// two streams on one file (a rank started again while its predecessor's
// stragglers still write) never overwrite each other. Returns the fd, or -1
// with errno set; `*size` is the file's size after the open.
//
// The directory belongs to the worker's account, so whatever is at `path`
// may have been put there by a worker: a symlink or hard link to a file of
// root's (which O_TRUNC and fchown would truncate and hand over), or a FIFO
// (which would block the open). Only a regular file with one link is
// accepted, and it is truncated only after that check.
int OpenLogFile(const std::string& path, const std::optional<WorkerCredentials>& owner, bool append,
                int64_t* size) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) return fd;
  auto fail = [fd](int err) {
    close(fd);
    errno = err;
    return -1;
  };
  struct stat st;
  if (fstat(fd, &st) != 0) return fail(errno);
  if (!S_ISREG(st.st_mode)) return fail(EINVAL);
  if (st.st_nlink != 1) return fail(EMLINK);
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) return fail(errno);
  if (!append && ftruncate(fd, 0) != 0) return fail(errno);
  *size = append ? static_cast<int64_t>(st.st_size) : 0;
  // A file left by an earlier run keeps its old mode; O_CREAT's does not apply.
  fchmod(fd, 0600);
  if (owner.has_value() && fchown(fd, owner->uid, owner->gid) != 0) return fail(errno);
  return fd;
}

// What the child does between fork and exec, async-signal-safe: join the
// cgroups (write "0" to each cgroup.procs opened before fork), drop to the
// worker's account, and set the parent-death signal again, which the kernel
// clears when the credentials change. Returns 0 or an errno value.
int JoinCgroupsAndDropPrivileges(const std::vector<int>& cgroup_procs,
                                 const std::optional<WorkerCredentials>& credentials,
                                 pid_t parent) {
  for (int fd : cgroup_procs) {
    if (write(fd, "0", 1) != 1) return errno;
  }
  if (!credentials.has_value()) return 0;
  // Raw system calls: glibc's wrappers broadcast a credential change to
  // every thread it knows of, which takes locks a forked child must not.
  // The child has one thread, and the kernel call changes exactly it.
  if (syscall(SYS_setgroups, credentials->groups.size(), credentials->groups.data()) != 0) {
    return errno;
  }
  if (syscall(SYS_setresgid, credentials->gid, credentials->gid, credentials->gid) != 0) {
    return errno;
  }
  if (syscall(SYS_setresuid, credentials->uid, credentials->uid, credentials->uid) != 0) {
    return errno;
  }
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return errno;
  if (getppid() != parent) _exit(127);  // The agent died while we changed hands.
  return 0;
}

}  // namespace

// One captured output stream: the read end of the worker's pipe and the log
// file it is copied into. Touched only by the I/O thread after Launch (and
// by the destructor after that thread is joined).
struct PosixProcessLauncher::LogStream {
  int pipe_fd = -1;  // read end, O_NONBLOCK; -1 after EOF.
  int file_fd = -1;  // log file; -1 when output is discarded.
  std::string path;
  int64_t size = 0;
  int64_t cap = 0;
  std::optional<WorkerCredentials> owner;  // of the log file

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
    size = 0;
    file_fd = OpenLogFile(path, owner, /*append=*/false, &size);
  }

  void Close() {
    CloseFd(pipe_fd);
    CloseFd(file_fd);
  }
};

struct PosixProcessLauncher::Worker {
  explicit Worker(Subprocess leader) : process(std::move(leader)) {}

  Subprocess process;  // Reaped once the leader has exited.
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
  // Destroying a Worker reaps a leader that is still running.
  for (auto& [pid, worker] : workers_) {
    worker->process.SignalGroup(SIGKILL).IgnoreError();
    for (LogStream& stream : worker->streams) stream.Close();
  }
  workers_.clear();
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
  SpawnOptions options;
  options.argv = spec.argv;
  options.env = spec.env;
  options.working_dir = spec.working_dir;
  options.stdin_to = Redirect::Null();
  options.group = SpawnOptions::Group::kNewSession;
  options.death_signal = SIGKILL;

  // One stream per distinct log file: stderr shares stdout's when not separate.
  const bool discard = spec.stdout_log.empty();
  const bool separate_stderr =
      !discard && !spec.stderr_log.empty() && spec.stderr_log != spec.stdout_log;
  options.stdout_to = discard ? Redirect::Null() : Redirect::Pipe();
  options.stderr_to = discard           ? Redirect::Null()
                      : separate_stderr ? Redirect::Pipe()
                                        : Redirect::Stdout();
  std::vector<std::string> paths;
  if (!discard) paths.push_back(spec.stdout_log);
  if (separate_stderr) paths.push_back(spec.stderr_log);
  std::vector<LogStream> streams;
  auto fail = [&](absl::Status status) {
    for (LogStream& s : streams) s.Close();
    return status;
  };
  for (const std::string& path : paths) {
    LogStream& stream = streams.emplace_back();
    stream.path = path;
    stream.cap = spec.max_log_bytes;
    stream.owner = spec.credentials;
    stream.file_fd = OpenLogFile(path, spec.credentials, spec.append_log, &stream.size);
    if (stream.file_fd < 0) {
      const int err = errno;
      const bool planted = err == ELOOP || err == EINVAL || err == EMLINK;
      return fail(absl::FailedPreconditionError(absl::StrCat(
          "cannot open log file '", path, "': ", ErrnoText(err),
          planted ? " (a log file must be a regular file with one link: not a symlink, hard "
                    "link or FIFO)"
                  : "")));
    }
  }
  // The cgroup.procs files are opened here: the child may only write().
  std::vector<int> cgroup_procs;
  struct CloseAll {
    std::vector<int>& fds;
    ~CloseAll() {
      for (int& fd : fds) CloseFd(fd);
    }
  } close_cgroup_procs{cgroup_procs};
  for (const std::string& dir : spec.cgroup_dirs) {
    const std::string path = absl::StrCat(dir, "/cgroup.procs");
    const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("cannot open '", path, "': ", ErrnoText(errno))));
    }
    cgroup_procs.push_back(fd);
  }
  if (!cgroup_procs.empty() || spec.credentials.has_value()) {
    options.pre_exec = [&cgroup_procs, &spec, parent = getpid()] {
      return JoinCgroupsAndDropPrivileges(cgroup_procs, spec.credentials, parent);
    };
  }

  absl::StatusOr<Subprocess> process = Subprocess::Spawn(options);
  if (!process.ok()) {
    if (spec.credentials.has_value() && absl::IsPermissionDenied(process.status())) {
      return fail(absl::PermissionDeniedError(absl::StrCat("as user ", spec.credentials->user,
                                                           " (uid ", spec.credentials->uid,
                                                           "): ", process.status().message())));
    }
    return fail(process.status());
  }
  const pid_t pid = process->pid();
  if (!discard) streams[0].pipe_fd = process->ReleaseStdout();
  if (separate_stderr) streams[1].pipe_fd = process->ReleaseStderr();
  auto worker = std::make_unique<Worker>(*std::move(process));
  worker->streams = std::move(streams);
  worker->on_exit = std::move(on_exit);
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
  auto it = workers_.find(pid);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no launched process ", pid));
  }
  return it->second->process.SignalGroup(signal);
}

absl::Status PosixProcessLauncher::Terminate(pid_t pid, absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(pid);
    if (it == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("no launched process ", pid));
    }
    Worker& worker = *it->second;
    worker.process.SignalGroup(SIGTERM).IgnoreError();
    const absl::Time at = absl::Now() + grace;
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
        if (worker->process.pidfd() >= 0) fds.push_back({worker->process.pidfd(), POLLIN, 0});
        for (LogStream& s : worker->streams) {
          if (s.pipe_fd >= 0) fds.push_back({s.pipe_fd, POLLIN, 0});
        }
        if (worker->kill_at.has_value()) timeout = std::min(timeout, *worker->kill_at - now);
        if (!worker->process.running()) timeout = std::min(timeout, kLingerCheck);
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
        if (w.process.running()) {
          if (std::optional<ExitStatus> status = w.process.TryWait(); status.has_value()) {
            // Drain again: bytes written just before exit are in the pipe now.
            for (LogStream& s : w.streams) {
              if (s.pipe_fd >= 0 && !s.Drain()) CloseFd(s.pipe_fd), CloseFd(s.file_fd);
            }
            ExitInfo exit;
            static_cast<ExitStatus&>(exit) = *status;
            exit.pid = w.process.pid();
            exits.emplace_back(std::move(w.on_exit), exit);
          }
        }
        if (w.kill_at.has_value() && *w.kill_at <= now) {
          w.process.SignalGroup(SIGKILL).IgnoreError();
          w.kill_at.reset();
        }
        bool streams_open = false;
        for (const LogStream& s : w.streams) streams_open |= s.pipe_fd >= 0;
        // The group id cannot be reused while any member lives, so a group
        // that cannot be signalled any more is gone as a whole.
        if (!w.process.running() && !streams_open && absl::IsNotFound(w.process.SignalGroup(0))) {
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
