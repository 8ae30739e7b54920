#include "cli/cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <CLI/CLI.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/admin_client.h"
#include "cli/meshctl.h"
#include "common/check.h"
#include "common/duration_format.h"
#include "common/grpc_status.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::cli {
namespace {

constexpr int kLogTailLines = 15;

std::string ErrnoText(int err) { return std::strerror(err); }

std::string WaitStatusText(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return absl::StrCat("signal ", sig, " (", name != nullptr ? name : "?", ")");
  }
  return absl::StrCat("wait status ", status);
}

// The last `lines` lines of the file at `path` (at most 8 KiB of it).
std::string LogTail(const std::string& path, int lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - 8192);
  in.seekg(start);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> all = absl::StrSplit(text, '\n');
  if (!all.empty() && all.back().empty()) all.pop_back();
  if (start > 0 && !all.empty()) all.erase(all.begin());  // Likely a partial line.
  const size_t first = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  std::string out;
  for (size_t i = first; i < all.size(); ++i) absl::StrAppend(&out, "    ", all[i], "\n");
  return out;
}

// Write-then-rename, so a reader never sees a partial file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream file(tmp, std::ios::trunc);
    file << content;
    file.flush();
    if (!file) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

// One supervised process: the coordinator or an agent.
struct Child {
  std::string name;  // "coordinator", "local-0", ...
  std::string log_path;
  pid_t pid = -1;
  int pidfd = -1;    // Readable once the process has exited; -1 after reaping.
  int pipe_fd = -1;  // --verbose: read end of its stdout+stderr; -1 otherwise.
  int log_fd = -1;   // --verbose: the log file meshctl copies the pipe into.
  std::string partial_line;
  bool reaped = false;
  int wait_status = 0;

  bool running() const { return pid > 0 && !reaped; }
};

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// The supervisor: starts children, waits on their pidfds, the stop fd and
// (with --verbose) their output pipes in one poll(), and stops them.
// Thread safety: none; one thread, the one that forks.
class Supervisor {
 public:
  enum class EventKind { kTimeout, kStop, kExited };
  struct Event {
    EventKind kind = EventKind::kTimeout;
    Child* child = nullptr;  // kExited
  };

  Supervisor(int stop_fd, bool verbose, std::ostream& err)
      : stop_fd_(stop_fd), verbose_(verbose), err_(err) {}

  ~Supervisor() {
    // Every return path of RunClusterUp stops the children first; this is
    // the backstop that keeps decision 7 ("nothing outlives us") on a bug.
    for (auto& child : children_) {
      if (child->running()) {
        kill(child->pid, SIGKILL);
        int status = 0;
        while (waitpid(child->pid, &status, 0) < 0 && errno == EINTR) {
        }
      }
      CloseFd(child->pidfd);
      CloseFd(child->pipe_fd);
      CloseFd(child->log_fd);
    }
  }

  // Starts `argv` with stdout and stderr going to `log_path`.
  absl::StatusOr<Child*> Start(const std::string& name, const std::vector<std::string>& argv,
                               const std::string& log_path) {
    auto child = std::make_unique<Child>();
    child->name = name;
    child->log_path = log_path;

    int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open log file ", log_path, ": ", ErrnoText(errno)));
    }
    int out_fd = log_fd;
    if (verbose_) {
      int fds[2];
      if (pipe2(fds, O_CLOEXEC) != 0) {
        close(log_fd);
        return absl::InternalError("pipe2: " + ErrnoText(errno));
      }
      fcntl(fds[0], F_SETFL, O_NONBLOCK);
      child->pipe_fd = fds[0];
      child->log_fd = log_fd;
      out_fd = fds[1];
    }
    const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    // Prepared before fork: after it, only async-signal-safe calls.
    std::vector<char*> c_argv;
    for (const std::string& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
    c_argv.push_back(nullptr);
    const std::string exec_error = absl::StrCat("meshctl: cannot execute ", argv[0], ": ");
    const pid_t parent = getpid();

    const pid_t pid = fork();
    if (pid < 0) {
      const int e = errno;
      if (out_fd != log_fd) close(out_fd);
      if (!verbose_) close(log_fd);
      if (null_fd >= 0) close(null_fd);
      CloseFd(child->pipe_fd);
      CloseFd(child->log_fd);
      return absl::InternalError("fork: " + ErrnoText(e));
    }
    if (pid == 0) {
      // Never outlive meshctl, even when it is SIGKILLed; and it may have
      // died between fork and prctl, when no signal would ever come.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);
      // meshctl blocks SIGINT/SIGTERM for its signalfd, and a shell may have
      // set SIGINT to SIG_IGN for a background job; both survive execve.
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int sig : {SIGINT, SIGTERM, SIGQUIT, SIGPIPE, SIGHUP, SIGCHLD}) signal(sig, SIG_DFL);
      if (null_fd >= 0) dup2(null_fd, 0);
      dup2(out_fd, 1);
      dup2(out_fd, 2);
      // Nothing else of meshctl's: sockets, other children's pipes.
      syscall(SYS_close_range, 3U, ~0U, 0U);
      execv(c_argv[0], c_argv.data());
      const int e = errno;
      [[maybe_unused]] ssize_t n = write(2, exec_error.data(), exec_error.size());
      // strerrorname_np returns a static string: safe after fork, unlike
      // strerror.
      const char* text = strerrorname_np(e);
      if (text != nullptr) n = write(2, text, strlen(text));
      n = write(2, "\n", 1);
      _exit(127);
    }
    if (out_fd != log_fd) close(out_fd);
    if (!verbose_) close(log_fd);
    if (null_fd >= 0) close(null_fd);
    child->pid = pid;
    // Our unreaped child: its pid cannot be reused, so pidfd_open cannot race.
    child->pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    MESH_CHECK(child->pidfd >= 0, "pidfd_open failed (Linux >= 5.3 is required)");
    children_.push_back(std::move(child));
    return children_.back().get();
  }

  // Waits until `deadline` for the stop fd, a child's exit, or (with
  // `watch_stop` false) only for exits. Output pipes are copied meanwhile.
  Event WaitUntil(absl::Time deadline, bool watch_stop = true) {
    while (true) {
      std::vector<pollfd> fds;
      std::vector<Child*> owners;  // parallel to fds; null for stop_fd.
      if (watch_stop && stop_fd_ >= 0) {
        fds.push_back({stop_fd_, POLLIN, 0});
        owners.push_back(nullptr);
      }
      for (auto& child : children_) {
        if (child->pidfd >= 0) {
          fds.push_back({child->pidfd, POLLIN, 0});
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
        Child* child = owners[i];
        if (fds[i].fd == child->pidfd && Reap(*child)) {
          // Its last words, before anyone reads its log.
          if (child->pipe_fd >= 0) CopyOutput(*child);
          return {EventKind::kExited, child};
        }
      }
    }
  }

  // SIGTERM to each running child of `group`, SIGKILL to those still
  // running after `grace`; returns once all of them are reaped.
  void Stop(const std::vector<Child*>& group, absl::Duration grace) {
    for (Child* child : group) {
      if (child->running()) kill(child->pid, SIGTERM);
    }
    const absl::Time kill_at = absl::Now() + grace;
    while (AnyRunning(group) && absl::Now() < kill_at) WaitUntil(kill_at, /*watch_stop=*/false);
    for (Child* child : group) {
      if (!child->running()) continue;
      err_ << "meshctl: " << child->name << " (pid " << child->pid << ") did not stop within "
           << FormatDurationShort(grace) << " of SIGTERM; sending SIGKILL\n";
      kill(child->pid, SIGKILL);
    }
    // SIGKILL cannot be caught; the bound only guards against a process
    // stuck in the kernel (D state).
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (AnyRunning(group) && absl::Now() < give_up) WaitUntil(give_up, /*watch_stop=*/false);
    for (Child* child : group) {
      if (child->running()) {
        err_ << "meshctl: " << child->name << " (pid " << child->pid
             << ") survived SIGKILL for 10 s; leaving it\n";
      }
      if (child->pipe_fd >= 0) CopyOutput(*child);  // Whatever is left.
    }
  }

  const std::vector<std::unique_ptr<Child>>& children() const { return children_; }

 private:
  static bool AnyRunning(const std::vector<Child*>& group) {
    return std::any_of(group.begin(), group.end(), [](Child* c) { return c->running(); });
  }

  // Reaps `child` if it has exited; true when it did.
  bool Reap(Child& child) {
    int status = 0;
    pid_t r;
    do {
      r = waitpid(child.pid, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return false;
    child.reaped = true;
    child.wait_status = status;
    CloseFd(child.pidfd);
    return true;
  }

  // --verbose: copies what the child wrote to its log and, line by line
  // with its name as a prefix, to `err_`.
  void CopyOutput(Child& child) {
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

  const int stop_fd_;
  const bool verbose_;
  std::ostream& err_;
  std::vector<std::unique_ptr<Child>> children_;
};

class GrpcNodeLister final : public NodeLister {
 public:
  explicit GrpcNodeLister(const std::string& address)
      : stub_(mesh::v1::JobService::NewStub(MakeChannel(address))) {}

  absl::StatusOr<mesh::v1::ListNodesResponse> ListNodes(absl::Duration timeout) override {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    mesh::v1::ListNodesResponse response;
    const grpc::Status status = stub_->ListNodes(&context, {}, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

 private:
  std::unique_ptr<mesh::v1::JobService::Stub> stub_;
};

}  // namespace

// ---------------------------------------------------------------------------
// Binaries.
// ---------------------------------------------------------------------------

std::vector<std::string> BinaryCandidates(const std::string& name, const std::string& component_dir,
                                          const std::string& self_dir,
                                          const std::string& path_env) {
  std::vector<std::string> candidates;
  if (!self_dir.empty()) {
    candidates.push_back(absl::StrCat(self_dir, "/", name));
    candidates.push_back(
        std::filesystem::path(absl::StrCat(self_dir, "/../", component_dir, "/", name))
            .lexically_normal()
            .string());
  }
  for (absl::string_view dir : absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
    candidates.push_back(absl::StrCat(dir, "/", name));
  }
  return candidates;
}

absl::StatusOr<std::string> FindBinary(const std::string& name, const std::string& flag_value,
                                       const std::string& flag_name,
                                       const std::vector<std::string>& candidates,
                                       absl::FunctionRef<bool(const std::string&)> is_executable) {
  if (!flag_value.empty()) {
    if (is_executable(flag_value)) return flag_value;
    return absl::NotFoundError(
        absl::StrCat(flag_name, " ", flag_value, ": not an executable file"));
  }
  for (const std::string& candidate : candidates) {
    if (is_executable(candidate)) return candidate;
  }
  // The first few places are the informative ones (next to meshctl, the
  // build tree); the rest of a long PATH is summarized.
  constexpr size_t kShown = 4;
  std::string places =
      candidates.empty()
          ? std::string("nowhere (executable dir unknown, PATH empty)")
          : absl::StrJoin(candidates.begin(),
                          candidates.begin() + std::min(kShown, candidates.size()), ", ");
  if (candidates.size() > kShown) {
    absl::StrAppend(&places, " and ", candidates.size() - kShown, " more PATH entries");
  }
  return absl::NotFoundError(absl::StrCat("cannot find ", name, "; looked in ", places,
                                          ". Build it (cmake --build build --target ", name,
                                          ") or pass ", flag_name, " PATH"));
}

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string SelfExeDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().string();
}

// ---------------------------------------------------------------------------
// Command lines.
// ---------------------------------------------------------------------------

std::string AgentName(int index) { return absl::StrCat("local-", index); }

std::string CoordinatorPortFile(const ClusterConfig& config) {
  return config.state_dir + "/coordinator.port";
}

std::string TargetsFile(const ClusterConfig& config) {
  return config.state_dir + "/prometheus-targets.json";
}

std::vector<std::string> CoordinatorArgv(const ClusterConfig& config) {
  // A local cluster listens on loopback only; plaintext must be asked for.
  std::vector<std::string> argv = {config.coordinator_bin,
                                   "--insecure",
                                   "--listen",
                                   "127.0.0.1",
                                   "--port",
                                   absl::StrCat(config.port),
                                   "--port-file",
                                   CoordinatorPortFile(config),
                                   "--state-dir",
                                   config.state_dir + "/coordinator"};
  if (config.metrics) {
    argv.insert(argv.end(), {"--metrics-port", "0", "--sd-file", TargetsFile(config)});
  }
  return argv;
}

std::vector<std::string> AgentArgv(const ClusterConfig& config, int index,
                                   const std::string& coordinator_address) {
  MESH_CHECK(index >= 0 && index < static_cast<int>(config.agent_gpus.size()),
             "agent_gpus has no entry for this agent");
  std::vector<std::string> argv = {config.agent_bin,
                                   "--coordinator",
                                   coordinator_address,
                                   "--name",
                                   AgentName(index),
                                   "--address",
                                   "127.0.0.1",
                                   "--slots",
                                   absl::StrCat(config.slots),
                                   "--gpus",
                                   config.agent_gpus[index],
                                   "--work-dir",
                                   absl::StrCat(config.state_dir, "/agent-", index)};
  if (config.metrics) argv.insert(argv.end(), {"--metrics-port", "0"});
  return argv;
}

int DefaultSlots(int cpus, int agents) {
  if (agents < 1) return 1;
  return std::max(1, cpus / agents);
}

absl::StatusOr<std::vector<std::string>> SplitGpus(const std::string& gpus, int agents) {
  if (agents < 1) return absl::InvalidArgumentError("--agents must be at least 1");
  if (gpus == "none" || gpus == "auto") return std::vector<std::string>(agents, gpus);
  std::vector<std::string> ordinals;
  std::set<int> seen;
  for (absl::string_view part : absl::StrSplit(gpus, ',')) {
    int ordinal = -1;
    if (!absl::SimpleAtoi(part, &ordinal) || ordinal < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus ", gpus, ": expected none, auto or GPU ordinals like 0,1 (bad: '", part, "')"));
    }
    if (!seen.insert(ordinal).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus ", gpus, ": ordinal ", ordinal, " appears twice"));
    }
    ordinals.push_back(absl::StrCat(ordinal));
  }
  if (ordinals.size() % agents != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--gpus ", gpus, ": ", ordinals.size(),
                                                   " GPUs cannot be split evenly among ", agents,
                                                   " agents"));
  }
  const size_t each = ordinals.size() / agents;
  std::vector<std::string> result;
  for (int i = 0; i < agents; ++i) {
    result.push_back(
        absl::StrJoin(ordinals.begin() + i * each, ordinals.begin() + (i + 1) * each, ","));
  }
  return result;
}

// ---------------------------------------------------------------------------
// Readiness.
// ---------------------------------------------------------------------------

std::unique_ptr<NodeLister> MakeGrpcNodeLister(const std::string& address) {
  return std::make_unique<GrpcNodeLister>(address);
}

std::vector<std::string> MissingReadyNodes(const mesh::v1::ListNodesResponse& nodes,
                                           const std::vector<std::string>& expected) {
  std::set<std::string> ready;
  for (const mesh::v1::Node& node : nodes.nodes()) {
    if (node.state() == mesh::v1::NODE_STATE_READY) ready.insert(node.name());
  }
  std::vector<std::string> missing;
  for (const std::string& name : expected) {
    if (!ready.contains(name)) missing.push_back(name);
  }
  return missing;
}

absl::Status WaitUntilNodesReady(NodeLister& lister, const std::vector<std::string>& expected,
                                 absl::Time deadline, absl::Duration poll_interval,
                                 const Clock& clock, absl::FunctionRef<bool(absl::Duration)> wait) {
  std::vector<std::string> missing = expected;
  absl::Status last_error = absl::OkStatus();
  while (true) {
    const absl::Duration left = deadline - clock.Now();
    if (left > absl::ZeroDuration()) {
      auto nodes = lister.ListNodes(std::min(left, absl::Seconds(2)));
      if (nodes.ok()) {
        missing = MissingReadyNodes(*nodes, expected);
        if (missing.empty()) return absl::OkStatus();
        last_error = absl::OkStatus();
      } else if (absl::IsUnimplemented(nodes.status())) {
        return nodes.status();
      } else {
        last_error = nodes.status();
      }
    }
    if (clock.Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          expected.size() - missing.size(), "/", expected.size(),
          " agents READY when the deadline passed; missing: ", absl::StrJoin(missing, ", "),
          last_error.ok() ? ""
                          : absl::StrCat(" (last ListNodes error: ", last_error.ToString(), ")")));
    }
    if (!wait(std::min(poll_interval, deadline - clock.Now()))) {
      return absl::CancelledError("stopped while waiting for the agents");
    }
  }
}

// ---------------------------------------------------------------------------
// RunClusterUp.
// ---------------------------------------------------------------------------

namespace {

// How a wait in RunClusterUp ended, when it did not succeed.
enum class Outcome { kReady, kStopped, kFailed };

void ReportUnexpectedExit(const Child& child, std::ostream& err) {
  err << "meshctl: " << child.name << " (pid " << child.pid
      << ") exited unexpectedly: " << WaitStatusText(child.wait_status) << "\n";
  const std::string tail = LogTail(child.log_path, kLogTailLines);
  if (tail.empty()) {
    err << "  its log " << child.log_path << " is empty\n";
  } else {
    err << "  last lines of " << child.log_path << ":\n" << tail;
  }
}

}  // namespace

int RunClusterUp(const ClusterConfig& config, int stop_fd, std::ostream& out, std::ostream& err) {
  MESH_CHECK(static_cast<int>(config.agent_gpus.size()) == config.agents,
             "agent_gpus must have one entry per agent");
  std::error_code ec;
  std::filesystem::create_directories(config.state_dir + "/coordinator", ec);
  for (int i = 0; i < config.agents && !ec; ++i) {
    std::filesystem::create_directories(absl::StrCat(config.state_dir, "/agent-", i), ec);
  }
  if (ec) {
    err << "meshctl: cannot create directories under " << config.state_dir << ": " << ec.message()
        << "\n";
    return kExitFailed;
  }
  // A port file left by an earlier run in a kept state dir would be read as
  // this coordinator's.
  const std::string port_file = CoordinatorPortFile(config);
  std::filesystem::remove(port_file, ec);

  Supervisor supervisor(stop_fd, config.verbose, err);
  Child* coordinator = nullptr;
  std::vector<Child*> agents;
  bool ready_file_written = false;

  // Stops everything (agents first: they may still report to the
  // coordinator while stopping their workers) and cleans up. The state dir
  // goes only after a clean stop; after a failure its logs are evidence.
  auto finish = [&](int code) {
    supervisor.Stop(agents, config.grace);
    if (coordinator != nullptr) supervisor.Stop({coordinator}, config.grace);
    for (const auto& child : supervisor.children()) {
      if (child->running()) code = kExitFailed;  // Survived SIGKILL; already reported.
    }
    if (ready_file_written) std::filesystem::remove(config.ready_file, ec);
    if (code == kExitOk && config.remove_state_dir) {
      std::filesystem::remove_all(config.state_dir, ec);
      if (ec) {
        err << "meshctl: cannot remove " << config.state_dir << ": " << ec.message() << "\n";
      }
    } else if (code != kExitOk) {
      err << "meshctl: state and logs kept in " << config.state_dir << "\n";
    }
    out << (code == kExitOk ? "cluster stopped\n" : "");
    out.flush();
    return code;
  };
  // A wait's event that is not a timeout ends the startup.
  auto fail_on = [&](const Supervisor::Event& event) {
    if (event.kind == Supervisor::EventKind::kStop) {
      err << "meshctl: stopping\n";
      return finish(kExitOk);
    }
    ReportUnexpectedExit(*event.child, err);
    return finish(kExitFailed);
  };

  // 1. The coordinator, and its port.
  {
    auto started = supervisor.Start("coordinator", CoordinatorArgv(config),
                                    config.state_dir + "/coordinator.log");
    if (!started.ok()) {
      err << "meshctl: cannot start " << config.coordinator_bin << ": " << started.status() << "\n";
      return finish(kExitFailed);
    }
    coordinator = *started;
  }
  int port = 0;
  const absl::Time port_deadline = absl::Now() + config.port_timeout;
  while (true) {
    std::ifstream in(port_file);
    std::string text;
    if (in && std::getline(in, text) && absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) &&
        port > 0) {
      break;
    }
    if (absl::Now() >= port_deadline) {
      err << "meshctl: the coordinator did not write " << port_file << " within "
          << FormatDurationShort(config.port_timeout) << "; its log:\n"
          << LogTail(coordinator->log_path, kLogTailLines);
      return finish(kExitFailed);
    }
    const Supervisor::Event event =
        supervisor.WaitUntil(std::min(port_deadline, absl::Now() + config.poll_interval));
    if (event.kind != Supervisor::EventKind::kTimeout) return fail_on(event);
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);

  // 2. The agents.
  std::vector<std::string> names;
  for (int i = 0; i < config.agents; ++i) {
    names.push_back(AgentName(i));
    auto started = supervisor.Start(names.back(), AgentArgv(config, i, address),
                                    absl::StrCat(config.state_dir, "/agent-", i, ".log"));
    if (!started.ok()) {
      err << "meshctl: cannot start " << config.agent_bin << ": " << started.status() << "\n";
      return finish(kExitFailed);
    }
    agents.push_back(*started);
  }

  // 3. Until every agent is READY.
  Supervisor::Event interrupt;
  auto wait = [&](absl::Duration d) {
    interrupt = supervisor.WaitUntil(absl::Now() + d);
    return interrupt.kind == Supervisor::EventKind::kTimeout;
  };
  std::unique_ptr<NodeLister> lister = MakeGrpcNodeLister(address);
  absl::Status ready = WaitUntilNodesReady(*lister, names, absl::Now() + config.ready_timeout,
                                           config.poll_interval, *Clock::Real(), wait);
  // Closes the connection: an open client connection makes a gRPC server's
  // graceful shutdown wait out its whole grace when the cluster stops.
  lister.reset();
  if (absl::IsCancelled(ready)) return fail_on(interrupt);
  if (absl::IsUnimplemented(ready)) {
    // A coordinator without JobService: it serves (it wrote its port file)
    // but cannot tell whether the agents registered.
    err << "meshctl: warning: the coordinator does not implement JobService.ListNodes; "
           "not waiting for the agents to register\n";
  } else if (!ready.ok()) {
    err << "meshctl: the agents did not all register: " << ready.message() << "\n";
    for (Child* agent : agents) {
      err << "  " << agent->name << " log " << agent->log_path << ":\n"
          << LogTail(agent->log_path, 5);
    }
    return finish(kExitFailed);
  }

  // 4. Up.
  const bool same_gpus =
      std::all_of(config.agent_gpus.begin(), config.agent_gpus.end(),
                  [&](const std::string& g) { return g == config.agent_gpus[0]; });
  const std::string gpus_text =
      same_gpus ? config.agent_gpus[0] : absl::StrJoin(config.agent_gpus, " | ");
  out << "Mesh local cluster is up\n"
      << "  coordinator  " << address << "  (log " << coordinator->log_path << ")\n"
      << "  agents       " << absl::StrJoin(names, ", ") << "  (" << config.slots
      << (config.slots == 1 ? " slot" : " slots") << " each, gpus " << gpus_text << "; logs "
      << config.state_dir << "/agent-<i>.log)\n"
      << "  state        " << config.state_dir
      << (config.remove_state_dir ? "  (removed on exit)" : "") << "\n"
      << (config.metrics ? absl::StrCat("  metrics      Prometheus file_sd targets in ",
                                        TargetsFile(config), "\n")
                         : std::string())
      << "\n"
      << "  export MESH_COORDINATOR=" << address << "\n"
      << "  meshctl submit --nodes " << config.agents << " --nproc-per-node " << config.slots
      << " -- /bin/echo hi\n\n"
      << "Press Ctrl-C to stop.\n";
  out.flush();
  if (!config.ready_file.empty()) {
    if (absl::Status s = WriteFileAtomically(config.ready_file, address + "\n"); !s.ok()) {
      err << "meshctl: --ready-file: " << s.message() << "\n";
      return finish(kExitFailed);
    }
    ready_file_written = true;
  }

  // 5. Supervise until Ctrl-C or a child's exit. The wait is bounded only
  // so that poll's timeout stays small; each round re-arms it.
  while (true) {
    const Supervisor::Event event = supervisor.WaitUntil(absl::Now() + absl::Minutes(1));
    if (event.kind != Supervisor::EventKind::kTimeout) return fail_on(event);
  }
}

// ---------------------------------------------------------------------------
// The command.
// ---------------------------------------------------------------------------

namespace {

// SIGINT and SIGTERM as a readable fd for the duration of a `cluster up`.
class ShutdownSignals {
 public:
  ShutdownSignals() {
    // A shell starts a background job (`meshctl cluster up &` in a script)
    // with SIGINT ignored, and an ignored signal never reaches a signalfd:
    // `kill -INT` from that script must still stop the cluster.
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    // An inherited SIG_IGN for SIGCHLD would make the kernel reap the
    // children itself, and their exit statuses would be lost.
    signal(SIGCHLD, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    // Before any thread exists (gRPC's come later), so all inherit the mask.
    pthread_sigmask(SIG_BLOCK, &set, &old_mask_);
    fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  }
  ~ShutdownSignals() {
    if (fd_ >= 0) close(fd_);
    // Consume what arrived, so restoring the mask does not deliver it with
    // its default action (termination) after a clean stop.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    const struct timespec zero = {0, 0};
    while (sigtimedwait(&set, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  int fd() const { return fd_; }

 private:
  sigset_t old_mask_;
  int fd_ = -1;
};

std::string MakeTempStateDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/mesh-cluster-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

class ClusterCommandsImpl final : public ClusterCommands {
 public:
  explicit ClusterCommandsImpl(CLI::App& app) {
    cluster_ = app.add_subcommand("cluster", "A local cluster for trying Mesh on one machine");
    cluster_->require_subcommand(1);
    up_ = cluster_->add_subcommand(
        "up", "Start a coordinator and N agents in the foreground; Ctrl-C stops them all");
    up_->add_option("--agents", flags_.agents, "Number of local agents (local-0, local-1, ...)")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
    up_->add_option("--slots", flags_.slots,
                    "Worker slots per agent; default: CPU count / agents, at least 1")
        ->check(CLI::Range(1, 4096));
    up_->add_option("--gpus", flags_.gpus,
                    "none, auto (every agent offers every GPU) or ordinals split among the "
                    "agents, e.g. 0,1,2,3")
        ->capture_default_str();
    up_->add_option("--port", flags_.port, "Coordinator port; 0 picks a free one")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    up_->add_option("--state-dir", flags_.state_dir,
                    "Directory for the coordinator's database, agents' work dirs and logs; "
                    "default: a new temp dir, removed on a clean exit");
    up_->add_flag("--keep-state", flags_.keep_state, "Keep the default temp state dir on exit");
    up_->add_option("--coordinator-bin", flags_.coordinator_bin,
                    "mesh-coordinator to run; default: next to meshctl, the build tree, PATH");
    up_->add_option("--agent-bin", flags_.agent_bin,
                    "mesh-agent to run; default: next to meshctl, the build tree, PATH");
    up_->add_option("--ready-file", flags_.ready_file,
                    "Write the coordinator address here once every agent is READY");
    up_->add_flag("-v,--verbose", flags_.verbose,
                  "Also show the children's output on stderr (it always goes to the logs)");
    up_->add_flag("--metrics", flags_.metrics,
                  "Serve /metrics from the coordinator and agents, with Prometheus file service "
                  "discovery in <state-dir>/prometheus-targets.json");
    up_->add_option("--grace", flags_.grace_s, "Seconds between SIGTERM and SIGKILL on stop")
        ->check(CLI::Range(0.0, 600.0))
        ->capture_default_str();
    up_->add_option("--ready-timeout", flags_.ready_timeout_s,
                    "Seconds to wait for the agents to register")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str();
  }

  bool parsed() const override { return up_->parsed(); }
  int Run(std::ostream& out, std::ostream& err) override {
    return RunClusterUpCommand(flags_, out, err);
  }

 private:
  ClusterUpFlags flags_;
  CLI::App* cluster_ = nullptr;
  CLI::App* up_ = nullptr;
};

}  // namespace

std::unique_ptr<ClusterCommands> AddClusterCommands(CLI::App& app) {
  return std::make_unique<ClusterCommandsImpl>(app);
}

int RunClusterUpCommand(const ClusterUpFlags& flags, std::ostream& out, std::ostream& err) {
  ClusterConfig config;
  config.agents = flags.agents;
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  config.slots = flags.slots > 0 ? flags.slots : DefaultSlots(cpus, flags.agents);
  auto gpus = SplitGpus(flags.gpus, flags.agents);
  if (!gpus.ok()) {
    err << "meshctl: " << gpus.status().message() << "\n";
    return kExitUsage;
  }
  config.agent_gpus = *std::move(gpus);
  config.port = flags.port;
  config.ready_file = flags.ready_file;
  config.verbose = flags.verbose;
  config.metrics = flags.metrics;
  config.grace = absl::Seconds(flags.grace_s);
  config.ready_timeout = absl::Seconds(flags.ready_timeout_s);

  const std::string self_dir = SelfExeDir();
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env != nullptr ? path_env : "";
  auto coordinator_bin = FindBinary(
      kCoordinatorBinary, flags.coordinator_bin, "--coordinator-bin",
      BinaryCandidates(kCoordinatorBinary, "coordinator", self_dir, path), IsExecutableFile);
  auto agent_bin =
      FindBinary(kAgentBinary, flags.agent_bin, "--agent-bin",
                 BinaryCandidates(kAgentBinary, "agent", self_dir, path), IsExecutableFile);
  for (const auto* found : {&coordinator_bin, &agent_bin}) {
    if (!found->ok()) {
      err << "meshctl: " << found->status().message() << "\n";
      return kExitFailed;
    }
  }
  // Absolute, since the children get no shell and the paths end up in logs.
  config.coordinator_bin = std::filesystem::absolute(*coordinator_bin).lexically_normal().string();
  config.agent_bin = std::filesystem::absolute(*agent_bin).lexically_normal().string();

  if (flags.state_dir.empty()) {
    config.state_dir = MakeTempStateDir();
    if (config.state_dir.empty()) {
      err << "meshctl: cannot create a temp state dir: " << ErrnoText(errno) << "\n";
      return kExitFailed;
    }
    config.remove_state_dir = !flags.keep_state;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(flags.state_dir, ec);
    if (ec) {
      err << "meshctl: --state-dir " << flags.state_dir << ": " << ec.message() << "\n";
      return kExitFailed;
    }
    config.state_dir = std::filesystem::absolute(flags.state_dir).lexically_normal().string();
  }

  ShutdownSignals signals;
  if (signals.fd() < 0) {
    err << "meshctl: signalfd: " << ErrnoText(errno) << "\n";
    return kExitFailed;
  }
  return RunClusterUp(config, signals.fd(), out, err);
}

}  // namespace mesh::cli
