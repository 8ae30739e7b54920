#include "agent/agent_main.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/cgroup.h"
#include "agent/host_info.h"
#include "agent/job_isolation.h"
#include "agent/nvml.h"
#include "agent/process_launcher.h"
#include "agent/reaper_watchdog.h"
#include "agent/stray_killer.h"
#include "agent/worker_env.h"
#include "agent/worker_env_file.h"
#include "common/client_flags.h"
#include "common/coordinator_targets.h"
#include "common/duration_format.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics_prometheus.h"
#include "common/systemd_notify.h"
#include "common/version.h"
#include "common/worker_env_policy.h"

namespace mesh::agent {
namespace {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "mesh-agent: %s\n", message.c_str());
  return kAgentExitUsage;
}

// "host:port" with a non-empty host and a port in 1..65535; the host may be
// a bracketed IPv6 literal.
bool ValidEndpoint(const std::string& endpoint, std::string* host) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int port = 0;
  if (!absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return false;
  }
  *host = endpoint.substr(0, colon);
  return true;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1" || host == "[::1]";
}

// Whether --gpus asks for NVML discovery / for none.
bool GpusAuto(const std::string& gpus) { return absl::AsciiStrToLower(gpus) == "auto"; }
bool GpusNone(const std::string& gpus) {
  const std::string lower = absl::AsciiStrToLower(gpus);
  return lower.empty() || lower == "none";
}

// "FIRST-LAST" (or one port "P") within 1..65535, FIRST <= LAST.
bool ParsePortRange(const std::string& text, int* first, int* last) {
  const size_t dash = text.find('-');
  const std::string a = text.substr(0, dash);
  const std::string b = dash == std::string::npos ? a : text.substr(dash + 1);
  return absl::SimpleAtoi(a, first) && absl::SimpleAtoi(b, last) && *first >= 1 &&
         *first <= *last && *last <= 65535;
}

// Blocks SIGINT and SIGTERM in this thread and every thread started later,
// so that they reach only the sigwait() below.
sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

}  // namespace

int RunAgentMain(int argc, const char* const* argv) {
  const char* env_coordinator = std::getenv("MESH_COORDINATOR");
  std::string coordinator = env_coordinator != nullptr ? env_coordinator : "127.0.0.1:7450";
  std::string name;
  std::string address;
  int slots = 0;
  std::string gpus = "auto";
  std::string work_dir;
  int64_t log_max_bytes = int64_t{64} << 20;
  double grace_s = 10.0;
  bool discover = false;
  std::string config_file;
  std::string log_format = "text";
  std::string log_level = "info";
  int metrics_port = -1;
  std::string metrics_listen = "0.0.0.0";
  std::string worker_metrics_ports;
  bool run_as_owner = true;
  std::string unowned_job_user;
  std::string cgroups_mode = "auto";
  std::string cgroup_parent;
  std::string cgroup_v1_root = "/sys/fs/cgroup";
  std::string cgroup_v2_root = "/sys/fs/cgroup";
  std::string gpu_device_dir = "/dev";
  std::string worker_env_file;
  std::vector<std::string> allow_job_env;

  CLI::App app{"mesh-agent: runs and supervises a node's Mesh workers", "mesh-agent"};
  app.set_version_flag("--version", kVersion);
  app.add_option("--config", config_file, "YAML config file (keys are long flag names)")
      ->envname("MESH_AGENT_CONFIG");
  app.add_option("--coordinator", coordinator,
                 "Coordinator host:port, or the replicas' addresses separated by commas")
      ->envname("MESH_COORDINATOR")
      ->capture_default_str();
  ClientSecurityFlags security_flags;
  security_flags.AddTo(app);
  app.add_option("--name", name, "Node name; default: the host name")->envname("MESH_AGENT_NAME");
  app.add_option("--address", address,
                 "Address of this node for other nodes' workers (MASTER_ADDR); default: "
                 "127.0.0.1 when the coordinator is on loopback, else the host name")
      ->envname("MESH_AGENT_ADDRESS");
  app.add_option("--slots", slots, "Worker processes at once; 0: one per CPU")
      ->envname("MESH_AGENT_SLOTS")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--gpus", gpus, "auto (NVML), none, or a list such as 0,1 or 0-3")
      ->envname("MESH_AGENT_GPUS")
      ->capture_default_str();
  app.add_option("--work-dir", work_dir,
                 "Directory for job logs; default: $TMPDIR/mesh-agent-<name>")
      ->envname("MESH_AGENT_WORK_DIR");
  app.add_option("--log-max-bytes", log_max_bytes,
                 "Per-rank log cap; beyond it the log rotates to <log>.1")
      ->envname("MESH_AGENT_LOG_MAX_BYTES")
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--grace", grace_s, "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->envname("MESH_AGENT_GRACE")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--metrics-port", metrics_port,
                 "Serve Prometheus /metrics on this port (0: a free one); -1: none")
      ->envname("MESH_AGENT_METRICS_PORT")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  app.add_option("--metrics-listen", metrics_listen, "Address the /metrics server binds")
      ->envname("MESH_AGENT_METRICS_LISTEN")
      ->capture_default_str();
  app.add_option("--worker-metrics-ports", worker_metrics_ports,
                 "Ports for workers' /metrics, e.g. 9500-9599 (each worker gets a free one as "
                 "MESH_METRICS_PORT); default: workers expose no metrics")
      ->envname("MESH_AGENT_WORKER_METRICS_PORTS");
  app.add_option("--run-as-owner", run_as_owner,
                 "As root: run each job's workers as its owner's Unix account (the coordinator's "
                 "token file maps principals to accounts); false: as the agent's own user")
      ->envname("MESH_AGENT_RUN_AS_OWNER")
      ->capture_default_str();
  app.add_option("--unowned-job-user", unowned_job_user,
                 "As root: the account for jobs that have no owner (a coordinator without "
                 "authentication); default: such jobs are refused")
      ->envname("MESH_AGENT_UNOWNED_JOB_USER");
  app.add_option("--cgroups", cgroups_mode,
                 "One cgroup per job: auto (v2, else v1, else none), v1, v2, or none")
      ->envname("MESH_AGENT_CGROUPS")
      ->check(CLI::IsMember({"auto", "v1", "v2", "none"}))
      ->capture_default_str();
  app.add_option("--cgroup-parent", cgroup_parent,
                 "Cgroup under which the agent makes its jobs' cgroups; default: its own")
      ->envname("MESH_AGENT_CGROUP_PARENT");
  app.add_option("--cgroup-v1-root", cgroup_v1_root, "Where the v1 hierarchies are mounted")
      ->envname("MESH_AGENT_CGROUP_V1_ROOT")
      ->capture_default_str();
  app.add_option("--cgroup-v2-root", cgroup_v2_root,
                 "Where the v2 hierarchy is mounted (/sys/fs/cgroup/unified on hybrid hosts)")
      ->envname("MESH_AGENT_CGROUP_V2_ROOT")
      ->capture_default_str();
  app.add_option("--gpu-device-dir", gpu_device_dir,
                 "Directory of the NVIDIA device nodes, for GPU confinement")
      ->envname("MESH_AGENT_GPU_DEVICE_DIR")
      ->capture_default_str();
  app.add_option("--worker-env-file", worker_env_file,
                 "File of NAME=VALUE lines every worker on this node gets (NCCL_SOCKET_IFNAME, "
                 "proxies, LD_LIBRARY_PATH; docs/agent.md)")
      ->envname("MESH_AGENT_WORKER_ENV_FILE");
  app.add_option("--allow-job-env", allow_job_env,
                 "Let job specs set these names on this node although they are refused by "
                 "default (LD_LIBRARY_PATH, LD_PRELOAD, LD_AUDIT, BASH_ENV, ENV); comma-separated")
      ->envname("MESH_AGENT_ALLOW_JOB_ENV")
      ->delimiter(',');
  bool rank_relay = true;
  std::string relay_socket;
  app.add_option("--rank-relay", rank_relay,
                 "Serve the workers' rendezvous, heartbeat and KV calls on a Unix socket and "
                 "forward them to the coordinator, one call per node where the ranks would make "
                 "one each (docs/rendezvous.md); false: workers call the coordinator directly")
      ->envname("MESH_AGENT_RANK_RELAY")
      ->capture_default_str();
  app.add_option("--relay-socket", relay_socket,
                 "Path of the rank relay's Unix socket (at most 107 bytes); default: "
                 "<work-dir>/relay.sock")
      ->envname("MESH_AGENT_RELAY_SOCKET");
  app.add_flag("--discover", discover, "Print what this host offers as JSON and exit");
  app.add_option("--log-format", log_format, "text or json")
      ->envname("MESH_LOG_FORMAT")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->envname("MESH_LOG_LEVEL")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other parse error is a usage error.
    return app.exit(e) == 0 ? kAgentExitOk : kAgentExitUsage;
  }
  if (!config_file.empty()) {
    if (absl::Status s = ApplyConfigFile(app, config_file); !s.ok()) {
      return UsageError(std::string(s.message()));
    }
  }
  // One address, or the replicas' (docs/ha.md); the first decides loopback.
  std::string coordinator_host;
  const std::vector<std::string> coordinator_targets = SplitCoordinatorTargets(coordinator);
  if (coordinator_targets.empty()) return UsageError("--coordinator is empty");
  for (auto it = coordinator_targets.rbegin(); it != coordinator_targets.rend(); ++it) {
    if (!ValidEndpoint(*it, &coordinator_host)) {
      return UsageError(absl::StrCat("--coordinator '", *it, "' is not host:port"));
    }
  }
  HostOptions host_options;
  host_options.hostname = name;
  host_options.slots = slots;
  if (!GpusAuto(gpus) && !GpusNone(gpus)) host_options.gpus = gpus;
  absl::StatusOr<HostInfo> host = DiscoverHost(host_options);
  if (!host.ok()) return UsageError(absl::StrCat("--gpus: ", host.status().message()));
  auto level = ParseLogLevel(log_level);
  if (!level.ok()) return UsageError(std::string(level.status().message()));
  int worker_port_first = 0;
  int worker_port_last = 0;
  if (!worker_metrics_ports.empty() &&
      !ParsePortRange(worker_metrics_ports, &worker_port_first, &worker_port_last)) {
    return UsageError(absl::StrCat("--worker-metrics-ports '", worker_metrics_ports,
                                   "' is not a port range FIRST-LAST within 1..65535"));
  }
  if (metrics_listen.empty()) return UsageError("--metrics-listen is empty");

  if (discover) {
    if (GpusAuto(gpus)) {
      auto found = DiscoverNvmlGpus();
      if (found.ok()) {
        for (const GpuDevice& gpu : *found) host->gpus.push_back(gpu.index);
      } else {
        std::fprintf(stderr, "mesh-agent: NVML: %s\n",
                     std::string(found.status().message()).c_str());
      }
    }
    std::printf("%s\n", HostInfoToJson(*host).c_str());
    return kAgentExitOk;
  }

  AgentConfig config;
  config.coordinator = coordinator;
  absl::StatusOr<security::ClientSecurity> security = security_flags.Resolve();
  if (!security.ok()) return UsageError(std::string(security.status().message()));
  config.security = *std::move(security);
  config.name = host->hostname;
  config.address = !address.empty()               ? address
                   : IsLoopback(coordinator_host) ? "127.0.0.1"
                                                  : host->hostname;
  config.slots = host->slots;
  if (work_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    work_dir =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/mesh-agent-", config.name);
  }
  config.work_dir = work_dir;
  config.log_max_bytes = log_max_bytes;
  config.grace = absl::Seconds(grace_s);
  config.base_env = InheritedBaseEnv();
  config.worker_metrics_port_first = worker_port_first;
  config.worker_metrics_port_last = worker_port_last;
  config.instance = NewAgentInstance(config.name);
  config.rank_relay = rank_relay;
  config.relay_socket = relay_socket;
  config.allowed_job_env.insert(allow_job_env.begin(), allow_job_env.end());
  if (absl::Status s = CheckAllowedJobEnv(config.allowed_job_env); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  if (!worker_env_file.empty()) {
    absl::StatusOr<EnvEntries> entries = ReadWorkerEnvFile(worker_env_file);
    if (!entries.ok()) {
      return UsageError(absl::StrCat("--worker-env-file: ", entries.status().message()));
    }
    config.operator_env = *std::move(entries);
  }

  LogOptions log_options;
  log_options.component = "agent";
  log_options.format = *ParseLogFormat(log_format);  // checked by IsMember
  log_options.level = *level;
  log_options.host = config.name;
  InitLogging(log_options);

  // Before any thread: the watchdog is forked, and a fork copies only the
  // calling thread. Writes to it after it died must not kill the agent.
  signal(SIGPIPE, SIG_IGN);
  const sigset_t shutdown_signals = BlockShutdownSignals();
  CgroupOptions cgroup_options;
  cgroup_options.mode = cgroups_mode == "v1"     ? CgroupOptions::Mode::kV1
                        : cgroups_mode == "v2"   ? CgroupOptions::Mode::kV2
                        : cgroups_mode == "none" ? CgroupOptions::Mode::kNone
                                                 : CgroupOptions::Mode::kAuto;
  cgroup_options.v1_root = cgroup_v1_root;
  cgroup_options.v2_root = cgroup_v2_root;
  cgroup_options.parent = cgroup_parent;
  cgroup_options.agent_name = config.name;
  // The cgroups before the watchdog: on v2 the agent may move itself into a
  // leaf of its own cgroup (to enable controllers for its jobs), and the
  // watchdog, forked after, follows it there.
  std::unique_ptr<CgroupManager> cgroups;
  std::string no_cgroups_reason;  // Why there are none, in auto mode.
  if (absl::StatusOr<std::unique_ptr<CgroupManager>> made = CgroupManager::Create(cgroup_options);
      made.ok()) {
    cgroups = *std::move(made);
  } else if (cgroup_options.mode == CgroupOptions::Mode::kAuto) {
    spdlog::warn("no cgroups for jobs: {}", std::string(made.status().message()));
    no_cgroups_reason = absl::StrCat("not usable: ", made.status().message());
  } else {
    spdlog::critical("--cgroups={}: {}", cgroups_mode, std::string(made.status().message()));
    return kAgentExitFailed;
  }
  // When the agent dies, the watchdog also kills what is left in its jobs'
  // cgroups: processes that left their groups and dropped the marker.
  absl::StatusOr<std::unique_ptr<ReaperWatchdog>> watchdog = ReaperWatchdog::Start(
      absl::StrCat(kAgentInstanceVariable, "=", config.instance),
      [cgroup_options, agent = getpid()] { KillAgentCgroups(cgroup_options, agent); });
  if (!watchdog.ok()) {
    spdlog::critical("cannot start the reaper watchdog: {}", watchdog.status().ToString());
    return kAgentExitFailed;
  }

  if (GpusAuto(gpus)) {
    auto found = DiscoverNvmlGpus();
    if (found.ok()) {
      config.gpus = std::move(*found);
    } else {
      spdlog::warn("NVML: {}; offering no GPUs", std::string(found.status().message()));
    }
  } else {
    // Explicit ordinals; NVML adds model, UUID and memory when it knows them.
    auto known = DiscoverNvmlGpus();
    for (int index : host->gpus) {
      GpuDevice gpu;
      gpu.index = index;
      if (known.ok()) {
        for (const GpuDevice& k : *known) {
          if (k.index == index) gpu = k;
        }
      }
      config.gpus.push_back(gpu);
    }
  }

  // The registry outlives the agent (declared first); the server is started
  // before the agent so that the registration carries its bound port.
  metrics::PrometheusRegistry registry;
  metrics::AddBuildInfo(registry, "agent");
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> server =
        metrics::MetricsServer::Start(metrics_listen, metrics_port, registry);
    if (!server.ok()) {
      spdlog::critical("cannot serve metrics on {}:{}: {}", metrics_listen, metrics_port,
                       server.status().ToString());
      return kAgentExitFailed;
    }
    metrics_server = *std::move(server);
    config.metrics_port = metrics_server->port();
    spdlog::info("serving metrics on http://{}:{}/metrics", metrics_listen, config.metrics_port);
  }

  // Job isolation (docs/security.md): workers under their owners' accounts
  // when the agent is root, in the cgroups made above.
  JobIsolationOptions isolation_options;
  isolation_options.run_as_owner = run_as_owner;
  isolation_options.unowned_job_user = unowned_job_user;
  isolation_options.gpu_device_dir = gpu_device_dir;
  isolation_options.no_cgroups_reason = no_cgroups_reason;
  isolation_options.gpus = config.gpus;
  isolation_options.allowed_job_env.assign(config.allowed_job_env.begin(),
                                           config.allowed_job_env.end());
  absl::StatusOr<std::unique_ptr<JobIsolation>> isolation =
      JobIsolation::Create(isolation_options, cgroups.get());
  if (!isolation.ok()) return UsageError(std::string(isolation.status().message()));
  config.isolation = (*isolation)->Describe();
  // Per-job GPU usage (mesh_agent_job_gpu_*): one NVML session, held open.
  std::shared_ptr<NvmlSampler> nvml = NvmlSampler::Open();
  if (nvml != nullptr && !config.gpus.empty()) {
    config.gpu_usage = [nvml] { return nvml->Sample(); };
  }
  if ((*isolation)->runs_as_owner()) {
    spdlog::info("isolation: {}", config.isolation.users());
  } else {
    spdlog::warn("isolation: {}", config.isolation.users());
  }
  spdlog::info("isolation: cgroups {}; stopped jobs are killed by {}", config.isolation.cgroups(),
               config.isolation.kill_mechanism());

  // Declared in teardown order: the agent stops its workers, then the
  // launcher kills what is left, then the watchdog's pipe closes.
  PosixProcessLauncher posix_launcher;
  ReapingLauncher launcher(&posix_launcher, watchdog->get());
  ProcStrayKiller strays(config.instance);
  Agent agent(config, &launcher, &registry, &strays, isolation->get());
  if (absl::Status s = agent.Start(); !s.ok()) {
    spdlog::critical("cannot start: {}", s.ToString());
    return kAgentExitFailed;
  }
  spdlog::info("mesh-agent {} as {} (address {}, {} slots, {} GPUs, work dir {}), coordinator {}",
               kVersion, config.name, config.address, config.slots, config.gpus.size(),
               config.work_dir, config.coordinator);
  // systemd Type=notify and WatchdogSec (no-ops elsewhere): ready once
  // running (registration retries on its own, and a coordinator outage must
  // not restart the agent); a ping means the agent's lock could be taken.
  systemd::NotifyReady("running; coordinator " + config.coordinator).IgnoreError();
  auto sd_watchdog = systemd::WatchdogPinger::StartIfEnabled([&agent] {
    (void)agent.registrations();
    return true;
  });

  int signal_number = 0;
  sigwait(&shutdown_signals, &signal_number);
  spdlog::info("received {}, stopping workers (grace {})", strsignal(signal_number),
               FormatDurationShort(config.grace));
  if (sd_watchdog) sd_watchdog->Stop();
  systemd::NotifyStopping().IgnoreError();
  agent.Shutdown();
  spdlog::info("stopped");
  return kAgentExitOk;
}

}  // namespace mesh::agent
