#include "cli/cluster.h"

#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/cluster_supervisor.h"
#include "cli/meshctl.h"
#include "common/check.h"
#include "common/duration_format.h"
#include "common/errno_text.h"
#include "common/subprocess.h"

namespace mesh::cli {
namespace {

constexpr int kLogTailLines = 15;

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

void ReportUnexpectedExit(const SupervisedChild& child, std::ostream& err) {
  err << "meshctl: " << child.name << " (pid " << child.pid()
      << ") exited unexpectedly: " << child.process.exit_status()->ToString() << "\n";
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

  ChildSupervisor supervisor(stop_fd, config.verbose, err);
  SupervisedChild* coordinator = nullptr;
  std::vector<SupervisedChild*> agents;
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
  auto fail_on = [&](const ChildSupervisor::Event& event) {
    if (event.kind == ChildSupervisor::EventKind::kStop) {
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
    const ChildSupervisor::Event event =
        supervisor.WaitUntil(std::min(port_deadline, absl::Now() + config.poll_interval));
    if (event.kind != ChildSupervisor::EventKind::kTimeout) return fail_on(event);
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
  ChildSupervisor::Event interrupt;
  auto wait = [&](absl::Duration d) {
    interrupt = supervisor.WaitUntil(absl::Now() + d);
    return interrupt.kind == ChildSupervisor::EventKind::kTimeout;
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
    for (SupervisedChild* agent : agents) {
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
    const ChildSupervisor::Event event = supervisor.WaitUntil(absl::Now() + absl::Minutes(1));
    if (event.kind != ChildSupervisor::EventKind::kTimeout) return fail_on(event);
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
  // The local cluster's jobs run as the user who started it, also when that
  // is root (its agents then refuse unowned jobs unless told an account).
  config.job_user = CurrentUserName();
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
