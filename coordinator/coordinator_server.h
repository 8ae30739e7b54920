// CoordinatorServer: composes the coordinator's managers and serves them
// over gRPC.
//
// Lifecycle:
//
//   Start() ──▶ SERVING ──Shutdown(grace)──▶ STOPPED
//
// Start opens the job store (config.state_dir; in memory when empty),
// recovers the jobs and nodes stored there (JobManager::Recover), binds the
// listening port (port 0 picks a free one; port() returns the one that was
// bound), registers every service plus grpc.health.v1 and server reflection,
// and returns once the server accepts calls.
//
// Services: AdminService and WorkerService over Coordination; JobService and
// NodeService over JobManager (which creates placed jobs in Coordination).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/security.h"
#include "coordinator/admin_service.h"
#include "coordinator/auth.h"
#include "coordinator/auth_grpc.h"
#include "coordinator/coordination.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_service.h"
#include "coordinator/job_store.h"
#include "coordinator/node_service.h"
#include "coordinator/rpc_metrics.h"
#include "coordinator/server_info.h"
#include "coordinator/server_lag.h"
#include "coordinator/service_discovery.h"
#include "coordinator/store_url.h"
#include "coordinator/worker_service.h"

namespace mesh::coordinator {

// Transport security and authentication (docs/security.md).
struct CoordinatorSecurity {
  // TLS (and mTLS with tls.client_ca_file) on the listener; not enabled():
  // plaintext. The mesh-coordinator binary refuses plaintext unless given
  // --insecure; this library leaves that policy to its caller.
  security::ServerTlsOptions tls;
  // Token authentication (coordinator/auth.h) when auth.tokens_file is set;
  // it requires TLS. An empty auth.worker_token_key_file defaults to
  // <state_dir>/worker-token.key (a key in memory without a state_dir).
  AuthOptions auth;
};

struct CoordinatorConfig {
  // Address to listen on. The default serves this machine only; use
  // "0.0.0.0" or "::" to serve the network.
  std::string listen_host = "127.0.0.1";
  // The well-known port; 0 picks a free one, which port() then reports.
  int port = 7450;
  // Largest message the server sends or accepts. Requests above it fail with
  // RESOURCE_EXHAUSTED before they reach any handler.
  int max_message_bytes = 16 * 1024 * 1024;
  // Heartbeats, waits and KV limits of the worker-facing service.
  CoordinationOptions coordination;
  // Directory of the durable state (<state_dir>/coordinator.db), created
  // with mode 0700 when missing. Empty: an in-memory store, so nothing
  // survives a restart (tests and throwaway clusters only).
  std::string state_dir;
  // The job store as a --store URL (coordinator/store_url.h): sqlite:///...
  // or etcd://host:port,.../prefix. Empty: <state_dir>/coordinator.db, or
  // memory without a state_dir.
  std::string store;
  // etcd's TLS files and deadlines, for an etcd:// store.
  EtcdStoreOptions etcd;
  // Spec limits, scheduling, node liveness and kill grace of JobService and
  // NodeService. Must pass ValidateJobManagerOptions.
  JobManagerOptions jobs;
  // Time source for all managers; null means the real clock. Must outlive
  // the server.
  const Clock* clock = nullptr;
  // Run Coordination::Tick and JobManager::Tick on a background thread
  // (deadlines, liveness), each about every its TickInterval().
  // Tests with a FakeClock turn it off and call Tick themselves.
  bool run_ticker = true;
  // Where every manager and the RPC layer record metrics (docs/metrics.md);
  // null records nothing. Borrowed: must outlive the server. The binary
  // passes a PrometheusRegistry served by its own MetricsServer, so this
  // library never depends on prometheus-cpp.
  metrics::Registry* metrics = nullptr;
  // Prometheus file service discovery (docs/metrics.md): the file kept up
  // to date with the cluster's scrape targets; empty: none.
  std::string sd_file;
  // The coordinator's own /metrics as "host:port", listed first in sd_file;
  // empty: not listed.
  std::string metrics_target;
  // TLS and tokens; the default is plaintext with no authentication.
  CoordinatorSecurity security;
};

// The deployment policy of the mesh-coordinator binary (docs/security.md):
// plaintext only when asked for (`insecure`), never together with TLS or
// tokens, and TLS must authenticate clients somehow (mTLS or tokens).
// INVALID_ARGUMENT naming the flags otherwise.
absl::Status CheckSecurityFlags(const CoordinatorSecurity& security, bool insecure);

// Possible errors of Start: INVALID_ARGUMENT for a bad config (tokens
// without TLS included), the errors of MakeServerCredentials and
// Authenticator::Create for unusable certificate, key or token files,
// UNAVAILABLE when the address cannot be bound; FAILED_PRECONDITION when the
// state directory cannot be created or used, and the store's errors
// (OpenJobStore, JobManager::Recover; DATA_LOSS for a corrupt database).
// A stored job that cannot be decoded is logged and skipped (its id is never
// reused); the others are served.
//
// Thread safety: all public methods are thread-safe.
class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorConfig& config);

  // Shuts down with no grace period if Shutdown was not called.
  ~CoordinatorServer();

  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // The bound port.
  int port() const { return port_; }
  // "host:port" that a client on this machine can dial: loopback for a
  // wildcard listener, else the bound address.
  std::string address() const;
  // "host:port" as bound, e.g. "0.0.0.0:7450" for a wildcard listener.
  std::string bound_address() const;

  // Ends every pending wait and stream (Coordination's and the
  // JobManager's) with UNAVAILABLE, marks the health service
  // NOT_SERVING, stops accepting calls, lets in-flight calls finish for up
  // to `grace`, then cancels the rest. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));

  // Blocks until Shutdown has completed.
  void Wait();

  // The worker-facing logic, for tests and in-process tools.
  Coordination& coordination() { return coordination_; }
  // Jobs and nodes, for tests (e.g. Tick with a FakeClock).
  JobManager& jobs() { return jobs_; }
  // The service-discovery targets (written to config.sd_file when set).
  ServiceDiscovery& discovery() { return discovery_; }

 private:
  CoordinatorServer(const CoordinatorConfig& config, const Clock* clock,
                    std::unique_ptr<JobStore> store, std::unique_ptr<Authenticator> authenticator);

  // Runs each manager's Tick about every its TickInterval() until
  // stop_ticker_; forgives the managers a stall when it wakes late, and
  // sends the lag probe (server_lag.h).
  void RunTicker();
  // One health Check through the in-process channel, answered into lag_.
  void SendLagProbe();
  // authenticator_->ReloadIfChanged, logged.
  void ReloadTokens();

  const CoordinatorConfig config_;
  const Clock* const clock_;

  // Managers, in dependency order. They are destroyed in reverse order, after
  // server_ (declared last) has stopped calling into them.
  ServerInfo server_info_;
  ServiceDiscovery discovery_;
  // How far behind the server is; read by both managers' liveness checks.
  // Shared with the probe call's callback, which may run after this object
  // is gone.
  const std::shared_ptr<ServerLag> lag_ = std::make_shared<ServerLag>();
  Coordination coordination_;
  const std::unique_ptr<JobStore> store_;
  // Null: no token authentication.
  const std::unique_ptr<Authenticator> authenticator_;
  JobManager jobs_;  // Uses store_, coordination_, discovery_, authenticator_.
  // Who may do what; asks jobs_ for owners.
  CallAuthorizer authz_;

  // gRPC adapters over the managers above.
  AdminServiceImpl admin_service_;
  WorkerServiceImpl worker_service_;
  JobServiceImpl job_service_;
  NodeServiceImpl node_service_;

  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;

  // Calls coordination_.Tick() and jobs_.Tick(); see RunTicker.
  absl::Notification stop_ticker_;
  std::thread ticker_;
  // The lag probe's channel (in-process, made once serving) and metrics.
  std::shared_ptr<grpc::Channel> probe_channel_;
  metrics::Gauge* lag_gauge_ = nullptr;
  metrics::Counter* stall_seconds_ = nullptr;

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mesh::coordinator
