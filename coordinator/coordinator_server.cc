#include "coordinator/coordinator_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/retry_pushback.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace mesh::coordinator {
namespace {

std::string JoinHostPort(const std::string& host, int port) {
  // A bare IPv6 literal needs brackets in a gRPC target.
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::Status Validate(const CoordinatorConfig& config) {
  if (config.listen_host.empty()) {
    return absl::InvalidArgumentError("listen host must not be empty");
  }
  if (config.port < 0 || config.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", config.port, " is out of range 0..65535"));
  }
  if (absl::Status s = ValidateOptions(config.coordination); !s.ok()) return s;
  if (absl::Status s = ValidateJobManagerOptions(config.jobs); !s.ok()) return s;
  if (!config.security.auth.tokens_file.empty() && !config.security.tls.enabled()) {
    return absl::InvalidArgumentError(
        "token authentication needs TLS: tokens would cross the network in clear text");
  }
  if (config.max_message_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("max message size ", config.max_message_bytes,
                                                   " is below the 4096-byte minimum"));
  }
  return absl::OkStatus();
}

// Opens the store config.store names; without one, <state_dir>/coordinator.db,
// creating state_dir (mode 0700: the database holds every job's command and
// environment) when missing, or an in-memory store when state_dir is empty.
absl::StatusOr<std::unique_ptr<JobStore>> OpenStore(const CoordinatorConfig& config,
                                                    const Clock* clock) {
  if (!config.store.empty()) {
    absl::StatusOr<StoreUrl> url = ParseStoreUrl(config.store);
    if (!url.ok()) return url.status();
    return OpenJobStore(*url, clock, config.etcd);
  }
  const std::string& state_dir = config.state_dir;
  StoreUrl url;
  if (state_dir.empty()) {
    url.sqlite_path = ":memory:";
    return OpenJobStore(url, clock);
  }
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(state_dir, error);
  if (!fs::exists(status)) {
    const fs::path parent = fs::path(state_dir).parent_path();
    if (!parent.empty()) fs::create_directories(parent, error);
    if (::mkdir(state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create state directory '", state_dir, "': ", std::strerror(errno)));
    }
    spdlog::info("created state directory {}", state_dir);
  } else if (!fs::is_directory(status)) {
    return absl::FailedPreconditionError(
        absl::StrCat("state directory '", state_dir, "' exists and is not a directory"));
  }
  url.sqlite_path = (fs::path(state_dir) / "coordinator.db").string();
  return OpenJobStore(url, clock);
}

JobManagerOptions WithWorkerTokens(JobManagerOptions options, const Authenticator* auth) {
  if (auth != nullptr) {
    options.mint_worker_token = [auth](absl::string_view job_id) {
      return auth->MintWorkerToken(job_id);
    };
    options.unix_account =
        [auth](absl::string_view owner) -> std::optional<JobManagerOptions::UnixAccount> {
      std::optional<Authenticator::UnixAccount> account = auth->UnixAccountOf(owner);
      if (!account.has_value()) return std::nullopt;
      return JobManagerOptions::UnixAccount{account->unix_user, account->allow_root};
    };
  }
  return options;
}

}  // namespace

absl::Status CheckSecurityFlags(const CoordinatorSecurity& security, bool insecure) {
  const bool tokens = !security.auth.tokens_file.empty();
  if (insecure) {
    if (security.tls.enabled() || !security.tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError("--insecure and the --tls-* flags exclude each other");
    }
    if (tokens) {
      return absl::InvalidArgumentError(
          "--auth-tokens needs TLS (--tls-cert, --tls-key): with --insecure the tokens would "
          "cross the network in clear text");
    }
    return absl::OkStatus();
  }
  if (!security.tls.enabled()) {
    return absl::InvalidArgumentError(
        "refusing to serve plaintext: give --tls-cert and --tls-key (docs/security.md), or "
        "--insecure for a laptop or a trusted network");
  }
  if (security.tls.client_ca_file.empty() && !tokens) {
    return absl::InvalidArgumentError(
        "TLS alone authenticates no client: add --tls-client-ca (mTLS), --auth-tokens, or both");
  }
  return absl::OkStatus();
}

CoordinatorServer::CoordinatorServer(const CoordinatorConfig& config, const Clock* clock,
                                     std::unique_ptr<JobStore> store,
                                     std::unique_ptr<Authenticator> authenticator)
    : config_(config),
      clock_(clock),
      server_info_(clock_),
      discovery_(config.sd_file),
      coordination_(clock_, config.coordination, config.metrics),
      store_(std::move(store)),
      authenticator_(std::move(authenticator)),
      jobs_(clock_, store_.get(), &coordination_,
            WithWorkerTokens(config.jobs, authenticator_.get()), config.metrics, &discovery_),
      authz_(authenticator_.get(),
             [this](absl::string_view job_id) { return jobs_.OwnerOf(job_id); }),
      admin_service_(&server_info_, &coordination_, &authz_),
      worker_service_(&coordination_, &authz_),
      job_service_(&jobs_, &authz_),
      node_service_(&jobs_, &authz_) {}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorConfig& config) {
  if (absl::Status status = Validate(config); !status.ok()) return status;

  // Both are process-wide switches that must be set before a builder exists;
  // setting them again is harmless.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  const Clock* clock = config.clock != nullptr ? config.clock : Clock::Real();
  auto store = OpenStore(config, clock);
  if (!store.ok()) return store.status();
  if (config.metrics != nullptr) (*store)->SetMetrics(config.metrics);

  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (config.security.tls.enabled()) {
    auto tls = security::MakeServerCredentials(config.security.tls);
    if (!tls.ok()) return tls.status();
    credentials = *std::move(tls);
  }
  std::unique_ptr<Authenticator> authenticator;
  if (!config.security.auth.tokens_file.empty()) {
    AuthOptions auth = config.security.auth;
    if (auth.worker_token_key_file.empty() && !config.state_dir.empty()) {
      auth.worker_token_key_file =
          (std::filesystem::path(config.state_dir) / "worker-token.key").string();
    }
    auto created = Authenticator::Create(auth);
    if (!created.ok()) return created.status();
    authenticator = *std::move(created);
    spdlog::info("token authentication on: {} tokens from {}", authenticator->token_count(),
                 auth.tokens_file);
    credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenAuthProcessor>(authenticator.get()));
  }

  std::unique_ptr<CoordinatorServer> server(
      new CoordinatorServer(config, clock, *std::move(store), std::move(authenticator)));
  // Recover logs how many jobs and nodes it loaded.
  if (absl::Status status = server->jobs_.Recover(); !status.ok()) {
    // DATA_LOSS names the one job that could not be decoded; the others are
    // loaded, and refusing to start would take them all offline.
    if (status.code() != absl::StatusCode::kDataLoss) return status;
    spdlog::error("recovery: {}", status.ToString());
  }

  grpc::ServerBuilder builder;
  const std::string listen = JoinHostPort(config.listen_host, config.port);
  builder.AddListeningPort(listen, credentials, &server->port_);
  builder.SetMaxReceiveMessageSize(config.max_message_bytes);
  builder.SetMaxSendMessageSize(config.max_message_bytes);
  // gRPC sets SO_REUSEPORT by default, which would let a second coordinator
  // silently share the port with the first. One port, one coordinator.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Waits last minutes with no data on the connection. Ping the client every
  // 30 s so a vanished peer's pending calls end (and free their reactors)
  // instead of lingering until their deadline, and accept client keepalive
  // pings as often as every 10 s: gRPC's default (5 min) answers a client
  // that keeps its long waits alive with GOAWAY "too_many_pings", failing
  // every wait on that connection.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    // The leader's UNAVAILABLE is not retried by clients' channels the way a
    // standby's is (coordinator/retry_pushback.h).
    creators.push_back(std::make_unique<NoClientRetryInterceptorFactory>());
    if (config.metrics != nullptr) {
      creators.push_back(std::make_unique<RpcMetricsInterceptorFactory>(config.metrics));
    }
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  builder.RegisterService(&server->admin_service_);
  builder.RegisterService(&server->worker_service_);
  builder.RegisterService(&server->job_service_);
  builder.RegisterService(&server->node_service_);

  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, ": address in use or not local"));
  }
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(mesh::v1::AdminService::service_full_name(), true);
  health->SetServingStatus(mesh::v1::WorkerService::service_full_name(), true);
  health->SetServingStatus(mesh::v1::JobService::service_full_name(), true);
  health->SetServingStatus(mesh::v1::NodeService::service_full_name(), true);
  // The first service-discovery file: the coordinator, and any agent
  // agents and workers appear as they register and start).
  server->discovery_.SetCoordinator(config.metrics_target);
  if (absl::Status written = server->discovery_.Flush(); !written.ok()) {
    // Not fatal: Prometheus keeps its last targets, and the next change
    // writes again.
    spdlog::error("{}", written.ToString());
  }
  server->coordination_.SetServerLag(server->lag_.get());
  server->jobs_.SetServerLag(server->lag_.get());
  if (config.metrics != nullptr) {
    server->lag_gauge_ =
        config.metrics
            ->AddGauge("mesh_coordinator_server_lag_seconds",
                       "How long a request may wait in the coordinator's own backlog (its probe "
                       "call's wait); liveness adds it to the heartbeat timeouts.")
            ->Get();
    server->stall_seconds_ =
        config.metrics
            ->AddCounter("mesh_coordinator_stall_seconds_total",
                         "Time the coordinator process did not run (paused, starved of CPU), "
                         "which heartbeat silences do not count.")
            ->Get();
  }
  if (config.run_ticker) {
    grpc::ChannelArguments probe_args;
    server->probe_channel_ = server->server_->InProcessChannel(probe_args);
    CoordinatorServer* self = server.get();
    self->ticker_ = std::thread([self] { self->RunTicker(); });
  }
  return server;
}

void CoordinatorServer::RunTicker() {
  // The managers' intervals differ; wake at the smaller one and tick each
  // that is due. Real time, like the waits: with a FakeClock the ticker is
  // off and tests tick by hand.
  const absl::Duration coordination_interval = coordination_.TickInterval();
  const absl::Duration jobs_interval = jobs_.TickInterval();
  // The token file is checked for edits about once a second.
  const absl::Duration auth_interval = absl::Seconds(1);
  const absl::Duration wake = std::min({coordination_interval, jobs_interval, auth_interval});
  // The backlog probe: often enough that the grace follows the backlog
  // within a fraction of any heartbeat timeout.
  const absl::Duration probe_interval = absl::Milliseconds(100);
  absl::Time next_coordination = absl::Now() + coordination_interval;
  absl::Time next_jobs = absl::Now() + jobs_interval;
  absl::Time next_auth = absl::Now() + auth_interval;
  absl::Time next_probe = absl::Now();
  absl::Time last_wake = absl::Now();
  while (!stop_ticker_.WaitForNotificationWithTimeout(wake)) {
    const absl::Time now = absl::Now();
    // Woken late: the process did not run (SIGSTOP, a VM pause, a starved
    // CPU) or this thread was stuck in a Tick; either way the coordinator's
    // delay, which no rank or node is blamed for.
    if (const absl::Duration stall = StallOf(now - last_wake, wake); stall > absl::ZeroDuration()) {
      coordination_.ForgiveStall(stall);
      jobs_.ForgiveStall(stall);
      if (stall_seconds_ != nullptr) stall_seconds_->Increment(absl::ToDoubleSeconds(stall));
    }
    last_wake = now;
    if (now >= next_probe) {
      if (!lag_->probe_pending()) SendLagProbe();
      if (lag_gauge_ != nullptr) lag_gauge_->Set(absl::ToDoubleSeconds(lag_->Grace(now)));
      next_probe = now + probe_interval;
    }
    if (now >= next_coordination) {
      coordination_.Tick();
      next_coordination = now + coordination_interval;
    }
    if (now >= next_jobs) {
      jobs_.Tick();
      next_jobs = now + jobs_interval;
    }
    if (authenticator_ != nullptr && now >= next_auth) {
      ReloadTokens();
      next_auth = now + auth_interval;
    }
  }
}

void CoordinatorServer::SendLagProbe() {
  struct Probe {
    std::unique_ptr<grpc::health::v1::Health::Stub> stub;
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
  };
  auto* probe = new Probe;
  probe->stub = grpc::health::v1::Health::NewStub(probe_channel_);
  // Bounded like every call; a probe that times out counts as answered at
  // its deadline, and the next one measures again.
  probe->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  lag_->ProbeSent(absl::Now());
  probe->stub->async()->Check(&probe->context, &probe->request, &probe->response,
                              [lag = lag_, probe](grpc::Status) {
                                lag->ProbeAnswered(absl::Now());
                                delete probe;
                              });
}

void CoordinatorServer::ReloadTokens() {
  const size_t before = authenticator_->token_count();
  if (absl::Status reloaded = authenticator_->ReloadIfChanged(); !reloaded.ok()) {
    spdlog::error("token file not reloaded, the previous tokens stay in force: {}",
                  reloaded.ToString());
    return;
  }
  const size_t after = authenticator_->token_count();
  if (after != before) spdlog::info("token file reloaded: {} tokens", after);
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

std::string CoordinatorServer::address() const {
  // A wildcard listener is reachable on loopback from this machine.
  std::string host = config_.listen_host;
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::" || host == "[::]") host = "::1";
  return JoinHostPort(host, port_);
}

std::string CoordinatorServer::bound_address() const {
  return JoinHostPort(config_.listen_host, port_);
}

void CoordinatorServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Pending waits and streams end first, with UNAVAILABLE, so that no
  // reactor is left waiting on the managers when gRPC drains. Jobs first:
  // it calls into Coordination (RemoveJob), never the other way round.
  jobs_.Shutdown();
  coordination_.Shutdown();
  stop_ticker_.Notify();
  if (ticker_.joinable()) ticker_.join();
  if (server_ == nullptr) return;
  // Health next, so probes see NOT_SERVING while calls drain.
  server_->GetHealthCheckService()->Shutdown();
  // gRPC deadlines are real time, whatever clock the managers use.
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace));
  server_->Wait();
}

void CoordinatorServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace mesh::coordinator
