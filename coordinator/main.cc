// mesh-coordinator: flags -> CoordinatorConfig -> CoordinatorServer.
//
// Precedence: flag, then MESH_* environment, then --config file, then the
// defaults in CoordinatorConfig (see common/flags.h).
#include <unistd.h>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/duration_format.h"

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics_prometheus.h"
#include "common/security.h"
#include "common/systemd_notify.h"
#include "common/version.h"
#include "common/worker_env_policy.h"
#include "coordinator/coordination.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/replica.h"

namespace {

// Blocks SIGINT and SIGTERM in this thread and every thread it starts later,
// so that they are delivered only to the sigwait() in main.
sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// The replica of an etcd store, with the coordinator's TLS (a standby
// answers the same clients the leader does).
absl::StatusOr<std::unique_ptr<mesh::coordinator::Replica>> StartReplica(
    const mesh::coordinator::CoordinatorConfig& config, const mesh::coordinator::StoreUrl& url,
    const std::string& advertise, absl::Duration lease) {
  mesh::coordinator::ReplicaOptions options;
  options.url = url;
  options.etcd = config.etcd;
  options.listen_host = config.listen_host;
  options.port = config.port;
  options.advertise = advertise;
  options.lease_ttl = lease;
  options.credentials = grpc::InsecureServerCredentials();
  if (config.security.tls.enabled()) {
    auto tls = mesh::security::MakeServerCredentials(config.security.tls);
    if (!tls.ok()) return tls.status();
    options.credentials = *std::move(tls);
  }
  return mesh::coordinator::Replica::Start(std::move(options));
}

// Campaigns until `replica` leads (then fills in config's port and store
// options and returns 0) or a shutdown signal arrives (returns it).
// Possible errors: those of Replica::WaitToLead.
absl::StatusOr<int> WaitToLeadOrSignal(mesh::coordinator::Replica& replica, const sigset_t& signals,
                                       mesh::coordinator::CoordinatorConfig* config) {
  std::atomic<bool> campaigning{true};
  std::atomic<int> received{0};
  std::thread watcher([&] {
    const timespec tick{0, 200 * 1000 * 1000};
    while (campaigning) {
      const int signal_number = sigtimedwait(&signals, nullptr, &tick);
      if (signal_number > 0) {
        received = signal_number;
        replica.Stop();
        return;
      }
    }
  });
  absl::StatusOr<mesh::coordinator::EtcdStoreOptions> led = replica.WaitToLead();
  campaigning = false;
  watcher.join();
  if (received != 0) return received;
  if (!led.ok()) return led.status();
  config->etcd = *std::move(led);
  config->port = replica.port();
  return 0;
}

// A heartbeat must arrive within `timeout - interval` of its schedule. On a
// loaded host a beat can be 100+ ms late (tests/fault/fault_b_cpu_load_test:
// 0.9 s / 1 s failed a healthy rank), so warn when the slack is that thin.
void WarnIfTightHeartbeat(const char* what, absl::Duration interval, absl::Duration timeout) {
  if (timeout - interval >= absl::Milliseconds(500) && timeout >= 2 * interval) return;
  spdlog::warn(
      "{} heartbeat timeout {} leaves only {} after the interval {}: a beat delayed by a busy "
      "host fails a healthy {}; prefer a timeout of at least 2 intervals and 0.5 s more",
      what, mesh::FormatDurationShort(timeout), mesh::FormatDurationShort(timeout - interval),
      mesh::FormatDurationShort(interval), what);
}

}  // namespace

int main(int argc, char** argv) {
  mesh::coordinator::CoordinatorConfig config;
  std::string config_file;
  std::string log_format = "text";
  std::string log_level = "info";
  std::string port_file;
  double shutdown_grace_s = 5.0;
  int metrics_port = -1;  // -1: no /metrics.
  std::string metrics_listen;
  // Durations are taken in seconds (fractions allowed) and converted after
  // parsing; ValidateOptions then checks their relations.
  mesh::coordinator::CoordinationOptions& coordination = config.coordination;
  double heartbeat_interval_s = absl::ToDoubleSeconds(coordination.heartbeat_interval);
  double heartbeat_timeout_s = absl::ToDoubleSeconds(coordination.heartbeat_timeout);
  double default_wait_s = absl::ToDoubleSeconds(coordination.default_wait);
  double max_wait_s = absl::ToDoubleSeconds(coordination.max_wait);
  mesh::coordinator::JobManagerOptions& jobs = config.jobs;
  double node_heartbeat_interval_s = absl::ToDoubleSeconds(jobs.node_heartbeat_interval);
  double node_heartbeat_timeout_s = absl::ToDoubleSeconds(jobs.node_heartbeat_timeout);
  double kill_grace_s = absl::ToDoubleSeconds(jobs.kill_grace);
  double log_attach_timeout_s = absl::ToDoubleSeconds(jobs.log_attach_timeout);

  CLI::App app{"mesh-coordinator: the Mesh cluster coordinator", "mesh-coordinator"};
  app.set_version_flag("--version", mesh::kVersion);
  app.add_option("--config", config_file, "YAML config file (keys are long flag names)")
      ->envname("MESH_CONFIG");
  app.add_option("--listen", config.listen_host, "Address to listen on")
      ->envname("MESH_LISTEN")
      ->capture_default_str();
  app.add_option("--port", config.port, "Port to listen on; 0 picks a free one")
      ->envname("MESH_PORT")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  // Security (docs/security.md). Plaintext must be asked for.
  bool insecure = false;
  mesh::coordinator::CoordinatorSecurity& security = config.security;
  app.add_flag("--insecure", insecure,
               "Serve plaintext with no authentication (a laptop or a trusted network only); "
               "otherwise --tls-cert and --tls-key are required")
      ->envname("MESH_INSECURE");
  app.add_option("--tls-cert", security.tls.cert_file, "PEM certificate chain of the server")
      ->envname("MESH_SERVER_TLS_CERT");
  app.add_option("--tls-key", security.tls.key_file, "PEM private key of --tls-cert")
      ->envname("MESH_SERVER_TLS_KEY");
  app.add_option("--tls-client-ca", security.tls.client_ca_file,
                 "PEM CA bundle; clients must present a certificate it signed (mTLS)")
      ->envname("MESH_TLS_CLIENT_CA");
  app.add_option("--auth-tokens", security.auth.tokens_file,
                 "YAML file of bearer tokens (name, role admin|user|agent, token or "
                 "token_sha256); reloaded when it changes")
      ->envname("MESH_AUTH_TOKENS");
  app.add_option("--worker-token-key", security.auth.worker_token_key_file,
                 "File of the key that signs per-job worker tokens; created when missing "
                 "(default: <state-dir>/worker-token.key)")
      ->envname("MESH_WORKER_TOKEN_KEY");
  app.add_option("--max-message-bytes", config.max_message_bytes,
                 "Largest gRPC message sent or accepted")
      ->envname("MESH_MAX_MESSAGE_BYTES")
      ->check(CLI::Range(4096, 1 << 30))
      ->capture_default_str();
  app.add_option("--metrics-port", metrics_port,
                 "Serve Prometheus /metrics on this port; 0 picks a free one (logged and "
                 "listed in --sd-file); unset: no /metrics")
      ->envname("MESH_METRICS_PORT")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-listen", metrics_listen,
                 "Address /metrics listens on (default: the --listen address)")
      ->envname("MESH_METRICS_LISTEN");
  app.add_option("--sd-file", config.sd_file,
                 "Keep the cluster's scrape targets in this Prometheus file_sd JSON file")
      ->envname("MESH_SD_FILE");
  app.add_option("--port-file", port_file, "Write the bound port to this file once serving")
      ->envname("MESH_PORT_FILE");
  app.add_option("--shutdown-grace", shutdown_grace_s,
                 "Seconds in-flight calls get to finish on SIGTERM")
      ->envname("MESH_SHUTDOWN_GRACE")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--heartbeat-interval", heartbeat_interval_s,
                 "Seconds between a rank's heartbeats (told to ranks when they join)")
      ->envname("MESH_HEARTBEAT_INTERVAL")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", heartbeat_timeout_s,
                 "Seconds of silence after which a rank is declared dead")
      ->envname("MESH_HEARTBEAT_TIMEOUT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rank-heartbeat-rate", coordination.rank_heartbeat_rate,
                 "Heartbeats a second a job's ranks may send in all: a larger job is told a "
                 "longer interval (up to a third of the timeout); 0 = always "
                 "--heartbeat-interval")
      ->envname("MESH_RANK_HEARTBEAT_RATE")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--default-wait", default_wait_s,
                 "Seconds a join, get, barrier or unique-ID wait lasts when the request "
                 "gives no timeout")
      ->envname("MESH_DEFAULT_WAIT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-wait", max_wait_s, "Cap in seconds on any wait a request asks for")
      ->envname("MESH_MAX_WAIT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--kv-max-key-bytes", coordination.kv.max_key_bytes, "Largest KV key")
      ->envname("MESH_KV_MAX_KEY_BYTES")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--kv-max-value-bytes", coordination.kv.max_value_bytes, "Largest KV value")
      ->envname("MESH_KV_MAX_VALUE_BYTES")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--kv-max-total-bytes", coordination.kv.max_total_bytes,
                 "Per job generation: total bytes of keys and values")
      ->envname("MESH_KV_MAX_TOTAL_BYTES")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--kv-max-keys", coordination.kv.max_keys, "Per job generation: key count")
      ->envname("MESH_KV_MAX_KEYS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--state-dir", config.state_dir,
                 "Directory of the durable job and node database (created 0700); empty keeps "
                 "state in memory, lost on restart")
      ->envname("MESH_STATE_DIR");
  app.add_option("--store", config.store,
                 "Where jobs and nodes are stored: sqlite:///path/mesh.db, or "
                 "etcd://host:2379[,host:2379...]/prefix for replicas (docs/ha.md); default: "
                 "<state-dir>/coordinator.db")
      ->envname("MESH_STORE");
  app.add_option("--etcd-ca", config.etcd.ca_file,
                 "CA certificate of the etcd members; turns on TLS to etcd")
      ->envname("MESH_ETCD_CA");
  app.add_option("--etcd-cert", config.etcd.cert_file,
                 "Client certificate for etcd (with --etcd-key)")
      ->envname("MESH_ETCD_CERT");
  app.add_option("--etcd-key", config.etcd.key_file, "Key of --etcd-cert")
      ->envname("MESH_ETCD_KEY");
  double etcd_timeout_s = absl::ToDoubleSeconds(config.etcd.call_timeout);
  app.add_option("--etcd-timeout", etcd_timeout_s,
                 "Seconds each etcd call may take, retries on other members included")
      ->envname("MESH_ETCD_TIMEOUT")
      ->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
  std::string advertise;
  app.add_option("--advertise", advertise,
                 "etcd store: host:port that clients reach this replica at, which standby "
                 "replicas hand out (default: the listen address, or this host's name)")
      ->envname("MESH_ADVERTISE");
  double leader_lease_s = 5;
  app.add_option("--leader-lease", leader_lease_s,
                 "etcd store: seconds after a leader stops renewing (crash, pause) before "
                 "another replica can take over")
      ->envname("MESH_LEADER_LEASE")
      ->check(CLI::Range(1.0, 600.0))
      ->capture_default_str();
  double etcd_connect_timeout_s = absl::ToDoubleSeconds(config.etcd.connect_timeout);
  app.add_option("--etcd-connect-timeout", etcd_connect_timeout_s,
                 "Seconds to wait at start-up for an etcd member to answer")
      ->envname("MESH_ETCD_CONNECT_TIMEOUT")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  std::vector<std::string> allow_job_env;
  app.add_option("--allow-job-env", allow_job_env,
                 "Let job specs set these names although they are refused by default "
                 "(LD_LIBRARY_PATH, LD_PRELOAD, LD_AUDIT, BASH_ENV, ENV); comma-separated")
      ->envname("MESH_ALLOW_JOB_ENV")
      ->delimiter(',');
  app.add_option("--working-dir-root", jobs.spec_limits.working_dir_root,
                 "Absolute directory every job's working_dir must be within")
      ->envname("MESH_WORKING_DIR_ROOT")
      ->capture_default_str();
  app.add_option("--node-heartbeat-interval", node_heartbeat_interval_s,
                 "Seconds between an agent's heartbeats (told to agents when they register; "
                 "longer in a large cluster, see --node-heartbeat-rate)")
      ->envname("MESH_NODE_HEARTBEAT_INTERVAL")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--node-heartbeat-rate", jobs.node_heartbeat_rate,
                 "Node heartbeats a second all agents may send in all: in a larger cluster each "
                 "agent is told a longer interval (up to a third of --node-heartbeat-timeout); "
                 "0 = always --node-heartbeat-interval")
      ->envname("MESH_NODE_HEARTBEAT_RATE")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--node-heartbeat-timeout", node_heartbeat_timeout_s,
                 "Seconds of silence after which a node is LOST and its jobs restart or fail")
      ->envname("MESH_NODE_HEARTBEAT_TIMEOUT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  double node_recovery_grace_s = absl::ToDoubleSeconds(jobs.node_recovery_grace);
  app.add_option("--node-recovery-grace", node_recovery_grace_s,
                 "Seconds after a restart that recovered nodes get, on top of the heartbeat "
                 "timeout, to register again")
      ->envname("MESH_NODE_RECOVERY_GRACE")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--kill-grace", kill_grace_s,
                 "Seconds between SIGTERM and SIGKILL when workers are killed")
      ->envname("MESH_KILL_GRACE")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--log-attach-timeout", log_attach_timeout_s,
                 "Seconds a node gets to start uploading logs for a GetLogs call")
      ->envname("MESH_LOG_ATTACH_TIMEOUT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--scheduler-backfill", jobs.scheduler.backfill,
               "Let queued jobs start ahead of a blocked earlier one when they fit")
      ->envname("MESH_SCHEDULER_BACKFILL")
      ->capture_default_str();
  app.add_option("--max-world-size", jobs.spec_limits.max_world_size,
                 "Largest world size (nodes x nproc_per_node) a job may ask for")
      ->envname("MESH_MAX_WORLD_SIZE")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-env-bytes", jobs.spec_limits.max_env_bytes,
                 "Bytes of a job's environment names and values together")
      ->envname("MESH_MAX_ENV_BYTES")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-argv-bytes", jobs.spec_limits.max_argv_bytes,
                 "Bytes of a job's command and arguments together")
      ->envname("MESH_MAX_ARGV_BYTES")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // The other caps of docs/limits.md; each is inclusive (the limit passes).
  app.add_option("--max-env-vars", jobs.spec_limits.max_env_count,
                 "Variables in a job's environment")
      ->envname("MESH_MAX_ENV_VARS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-argv-count", jobs.spec_limits.max_argv_count,
                 "Elements of a job's command (program and arguments)")
      ->envname("MESH_MAX_ARGV_COUNT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-labels", jobs.spec_limits.max_labels, "Labels on a job")
      ->envname("MESH_MAX_LABELS")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-idempotency-key-bytes", jobs.spec_limits.max_idempotency_key_bytes,
                 "Bytes of a job's idempotency key")
      ->envname("MESH_MAX_IDEMPOTENCY_KEY_BYTES")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-pending-jobs", jobs.max_pending_jobs,
                 "Jobs waiting to be placed at once; a submit beyond gets RESOURCE_EXHAUSTED")
      ->envname("MESH_MAX_PENDING_JOBS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-barriers", coordination.max_barriers,
                 "Per job generation: barriers created")
      ->envname("MESH_MAX_BARRIERS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-unique-ids", coordination.max_unique_ids,
                 "Per job generation: NCCL unique IDs published")
      ->envname("MESH_MAX_UNIQUE_IDS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-keys-per-request", coordination.max_keys_per_request,
                 "Keys in one KvWait, KvMultiGet, KvMultiSet, GetUniqueIds or PublishUniqueIds")
      ->envname("MESH_MAX_KEYS_PER_REQUEST")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
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
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!config_file.empty()) {
    if (absl::Status status = mesh::ApplyConfigFile(app, config_file); !status.ok()) {
      std::fprintf(stderr, "mesh-coordinator: %s\n", std::string(status.message()).c_str());
      return 2;
    }
  }

  jobs.spec_limits.allowed_job_env.insert(allow_job_env.begin(), allow_job_env.end());
  if (absl::Status status = mesh::CheckAllowedJobEnv(jobs.spec_limits.allowed_job_env);
      !status.ok()) {
    std::fprintf(stderr, "mesh-coordinator: %s\n", std::string(status.message()).c_str());
    return 2;
  }
  if (absl::Status status = mesh::coordinator::CheckSecurityFlags(security, insecure);
      !status.ok()) {
    std::fprintf(stderr, "mesh-coordinator: %s\n", std::string(status.message()).c_str());
    return 2;
  }
  // A certificate or key file the flags name but that cannot serve is a bad
  // flag value, so a usage error like any other.
  if (security.tls.enabled()) {
    if (absl::Status status = mesh::security::CheckServerTlsFiles(security.tls); !status.ok()) {
      std::fprintf(stderr, "mesh-coordinator: %s\n", std::string(status.message()).c_str());
      return 2;
    }
  }
  coordination.heartbeat_interval = absl::Seconds(heartbeat_interval_s);
  coordination.heartbeat_timeout = absl::Seconds(heartbeat_timeout_s);
  coordination.default_wait = absl::Seconds(default_wait_s);
  coordination.max_wait = absl::Seconds(max_wait_s);
  if (absl::Status status = mesh::coordinator::ValidateOptions(coordination); !status.ok()) {
    std::fprintf(stderr, "mesh-coordinator: %s\n", std::string(status.message()).c_str());
    return 2;
  }
  jobs.node_heartbeat_interval = absl::Seconds(node_heartbeat_interval_s);
  jobs.node_heartbeat_timeout = absl::Seconds(node_heartbeat_timeout_s);
  jobs.node_recovery_grace = absl::Seconds(node_recovery_grace_s);
  jobs.kill_grace = absl::Seconds(kill_grace_s);
  jobs.log_attach_timeout = absl::Seconds(log_attach_timeout_s);
  // One cap for every wait a request asks for, WaitJob's included.
  jobs.max_wait = coordination.max_wait;
  if (absl::Status status = mesh::coordinator::ValidateJobManagerOptions(jobs); !status.ok()) {
    std::fprintf(stderr, "mesh-coordinator: %s\n", std::string(status.message()).c_str());
    return 2;
  }

  mesh::LogOptions log_options;
  log_options.component = "coordinator";
  log_options.format = *mesh::ParseLogFormat(log_format);  // Checked by IsMember.
  auto level = mesh::ParseLogLevel(log_level);
  if (!level.ok()) {
    std::fprintf(stderr, "mesh-coordinator: %s\n", std::string(level.status().message()).c_str());
    return 2;
  }
  log_options.level = *level;
  mesh::InitLogging(log_options);
  WarnIfTightHeartbeat("rank", coordination.heartbeat_interval, coordination.heartbeat_timeout);
  WarnIfTightHeartbeat("node", jobs.node_heartbeat_interval, jobs.node_heartbeat_timeout);

  // Debian builds Abseil without NDEBUG, which turns on absl::Mutex deadlock
  // detection: a process-wide graph updated on every lock, 8-10% of the
  // coordinator's CPU with tens of thousands of pending calls (gRPC's own
  // mutexes are absl::Mutex). It is a debugging aid; the tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  if (insecure) {
    spdlog::warn(
        "--insecure: plaintext gRPC with no authentication on {}; anyone who can reach it can "
        "submit jobs and read every job's data",
        config.listen_host);
  }
  config.etcd.call_timeout = absl::Seconds(etcd_timeout_s);
  config.etcd.connect_timeout = absl::Seconds(etcd_connect_timeout_s);
  std::optional<mesh::coordinator::StoreUrl> store_url;
  if (!config.store.empty()) {
    // A malformed URL is a usage error, like any bad flag.
    absl::StatusOr<mesh::coordinator::StoreUrl> url =
        mesh::coordinator::ParseStoreUrl(config.store);
    if (!url.ok()) {
      std::fprintf(stderr, "mesh-coordinator: %s\n", std::string(url.status().message()).c_str());
      return 2;
    }
    store_url = *url;
    if (url->kind == mesh::coordinator::StoreUrl::Kind::kEtcd &&
        !security.auth.tokens_file.empty() && security.auth.worker_token_key_file.empty()) {
      // Each replica would make a key of its own, and after a failover the
      // running ranks' worker tokens would not verify.
      std::fprintf(stderr,
                   "mesh-coordinator: --store etcd://... with --auth-tokens needs "
                   "--worker-token-key: a key file every replica reads, so that worker tokens "
                   "verify on whichever replica leads\n");
      return 2;
    }
    spdlog::info("durable state in {}", config.store);
  } else if (config.state_dir.empty()) {
    spdlog::warn(
        "no --state-dir or --store: jobs and nodes are kept in memory only and are lost when "
        "the coordinator stops");
  } else {
    spdlog::info("durable state in {}/coordinator.db", config.state_dir);
  }

  const sigset_t shutdown_signals = BlockShutdownSignals();

  // Metrics first, so the server's managers record from the start and the
  // service-discovery file names the bound port. Declared before the
  // server: destroyed after it, as the managers hold its families.
  mesh::metrics::PrometheusRegistry metrics_registry;
  std::unique_ptr<mesh::metrics::MetricsServer> metrics_server;
  if (metrics_port >= 0) {
    const std::string host = metrics_listen.empty() ? config.listen_host : metrics_listen;
    auto started = mesh::metrics::MetricsServer::Start(host, metrics_port, metrics_registry);
    if (!started.ok()) {
      spdlog::critical("cannot start: {}", started.status().ToString());
      return 1;
    }
    metrics_server = *std::move(started);
    mesh::metrics::AddBuildInfo(metrics_registry, "coordinator");
    config.metrics = &metrics_registry;
    // A wildcard address is not something Prometheus can dial: advertise
    // this host's name instead.
    std::string advertised = host;
    if (host == "0.0.0.0" || host == "::" || host == "[::]") {
      char name[256] = {};
      advertised = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
    }
    config.metrics_target =
        mesh::coordinator::ServiceDiscovery::Target(advertised, metrics_server->port());
    spdlog::info("serving /metrics on {}", config.metrics_target);
  }

  // Leadership (docs/metrics.md, docs/ha.md): a coordinator on SQLite leads
  // alone; a replica on etcd is a standby (0) until elected.
  mesh::metrics::Gauge* leader_gauge = nullptr;
  mesh::metrics::Gauge* term_gauge = nullptr;
  mesh::metrics::Counter* failovers = nullptr;
  if (config.metrics != nullptr) {
    leader_gauge =
        config.metrics
            ->AddGauge("mesh_coordinator_leader",
                       "1 while this coordinator leads (serves); 0 while it is a standby replica.")
            ->Get();
    term_gauge = config.metrics
                     ->AddGauge("mesh_coordinator_leader_term",
                                "The term this replica leads in (the etcd revision of its "
                                "election); 0 when not leading or not on etcd.")
                     ->Get();
    failovers = config.metrics
                    ->AddCounter("mesh_coordinator_failovers_total",
                                 "Times this replica took the leadership over from another "
                                 "replica (etcd store); 0 for the first leader of a store.")
                    ->Get();
  }

  // On an etcd store, a replica: standby until elected (docs/ha.md).
  std::unique_ptr<mesh::coordinator::Replica> replica;
  if (store_url.has_value() && store_url->kind == mesh::coordinator::StoreUrl::Kind::kEtcd) {
    absl::StatusOr<std::unique_ptr<mesh::coordinator::Replica>> started =
        StartReplica(config, *store_url, advertise, absl::Seconds(leader_lease_s));
    if (!started.ok()) {
      spdlog::critical("cannot start: {}", started.status().ToString());
      return 1;
    }
    replica = *std::move(started);
    std::printf("mesh-coordinator listening on %s:%d\n", config.listen_host.c_str(),
                replica->port());
    std::fflush(stdout);
    spdlog::info("standby replica {} campaigning for {}", replica->advertised(),
                 replica->election_key());
    absl::StatusOr<int> signal_number = WaitToLeadOrSignal(*replica, shutdown_signals, &config);
    if (!signal_number.ok()) {
      spdlog::critical("cannot lead: {}", signal_number.status().ToString());
      return 1;
    }
    if (*signal_number != 0) {
      spdlog::info("received {} before leading; stopped", strsignal(*signal_number));
      return 0;
    }
  }

  auto server = mesh::coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) {
    spdlog::critical("cannot start: {}", server.status().ToString());
    return 1;
  }
  static std::atomic<bool> lost_leadership{false};
  if (leader_gauge != nullptr) leader_gauge->Set(1);
  if (replica != nullptr) {
    if (term_gauge != nullptr) term_gauge->Set(static_cast<double>(config.etcd.fence_revision));
    if (failovers != nullptr && replica->took_over()) failovers->Increment();
    replica->KeepLeading([leader_gauge, term_gauge](const std::string& reason) {
      spdlog::critical("lost the leadership: {}; stepping down", reason);
      if (leader_gauge != nullptr) leader_gauge->Set(0);
      if (term_gauge != nullptr) term_gauge->Set(0);
      lost_leadership = true;
      ::kill(::getpid(), SIGTERM);
    });
  }
  if (!port_file.empty()) {
    // Write-then-rename, so a reader never sees a partial file.
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << (*server)->port() << "\n";
    if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      spdlog::error("cannot write port file {}", port_file);
    }
  }
  // The one line of stdout: scripts and tests read the port from it. It
  // names the address as bound (0.0.0.0:PORT for a wildcard listener); the
  // log line adds the one to dial from this machine when that differs.
  const std::string bound = (*server)->bound_address();
  const std::string local = (*server)->address();
  if (replica == nullptr) {  // A replica said so when its standby server started.
    std::printf("mesh-coordinator listening on %s\n", bound.c_str());
    std::fflush(stdout);
  }
  spdlog::info("mesh-coordinator {} serving on {}{} (protocol v{})", mesh::kVersion, bound,
               local == bound ? "" : absl::StrCat(" (on this machine: ", local, ")"),
               mesh::kProtocolVersion);
  // systemd Type=notify and WatchdogSec (no-ops elsewhere). A ping means
  // both managers' locks could be taken: a deadlock stops the pings.
  mesh::systemd::NotifyReady("serving on " + (*server)->address()).IgnoreError();
  auto watchdog = mesh::systemd::WatchdogPinger::StartIfEnabled([&server] {
    (void)(*server)->jobs().stats();  // Each takes its manager's lock.
    (void)(*server)->coordination().PendingWaits();
    return true;
  });

  int signal_number = 0;
  sigwait(&shutdown_signals, &signal_number);
  spdlog::info("received {}, shutting down (grace {} s)", strsignal(signal_number),
               shutdown_grace_s);
  if (watchdog) watchdog->Stop();
  mesh::systemd::NotifyStopping().IgnoreError();
  (*server)->Shutdown(absl::Seconds(shutdown_grace_s));
  if (lost_leadership) {
    spdlog::info("stopped: no longer the leader (exit 3; the supervisor starts a standby)");
    return 3;
  }
  if (replica != nullptr) {
    // The next replica takes over now rather than after the lease's TTL.
    if (absl::Status resigned = replica->Resign(); !resigned.ok()) {
      spdlog::warn("could not resign the leadership ({}); a standby takes over within the lease",
                   resigned.ToString());
    }
  }
  spdlog::info("stopped");
  return 0;
}
