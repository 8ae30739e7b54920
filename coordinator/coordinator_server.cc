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
  if (config.max_message_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("max message size ", config.max_message_bytes,
                                                   " is below the 4096-byte minimum"));
  }
  return absl::OkStatus();
}

// Opens <state_dir>/coordinator.db, creating state_dir (mode 0700: the
// database holds every job's command and environment) when missing; or an
// in-memory store when state_dir is empty.
absl::StatusOr<std::unique_ptr<JobStore>> OpenStore(const std::string& state_dir,
                                                    const Clock* clock) {
  if (state_dir.empty()) return JobStore::Open(":memory:", clock);
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
  return JobStore::Open((fs::path(state_dir) / "coordinator.db").string(), clock);
}

}  // namespace

CoordinatorServer::CoordinatorServer(const CoordinatorConfig& config, const Clock* clock,
                                     std::unique_ptr<JobStore> store)
    : config_(config),
      clock_(clock),
      server_info_(clock_),
      discovery_(config.sd_file),
      coordination_(clock_, config.coordination, config.metrics),
      store_(std::move(store)),
      jobs_(clock_, store_.get(), &coordination_, config.jobs, config.metrics, &discovery_),
      admin_service_(&server_info_, &coordination_),
      worker_service_(&coordination_),
      job_service_(&jobs_),
      node_service_(&jobs_) {}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorConfig& config) {
  if (absl::Status status = Validate(config); !status.ok()) return status;

  // Both are process-wide switches that must be set before a builder exists;
  // setting them again is harmless.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  const Clock* clock = config.clock != nullptr ? config.clock : Clock::Real();
  auto store = OpenStore(config.state_dir, clock);
  if (!store.ok()) return store.status();
  if (config.metrics != nullptr) (*store)->SetMetrics(config.metrics);
  std::unique_ptr<CoordinatorServer> server(
      new CoordinatorServer(config, clock, *std::move(store)));
  // Recover logs how many jobs and nodes it loaded.
  if (absl::Status status = server->jobs_.Recover(); !status.ok()) {
    // DATA_LOSS names the one job that could not be decoded; the others are
    // loaded, and refusing to start would take them all offline.
    if (status.code() != absl::StatusCode::kDataLoss) return status;
    spdlog::error("recovery: {}", status.ToString());
  }

  grpc::ServerBuilder builder;
  const std::string listen = JoinHostPort(config.listen_host, config.port);
  // Plaintext for now; TLS/mTLS arrive with the security work (docs/deployment.md).
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &server->port_);
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
  if (config.metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(std::make_unique<RpcMetricsInterceptorFactory>(config.metrics));
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
  if (config.run_ticker) {
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
  const absl::Duration wake = std::min(coordination_interval, jobs_interval);
  absl::Time next_coordination = absl::Now() + coordination_interval;
  absl::Time next_jobs = absl::Now() + jobs_interval;
  while (!stop_ticker_.WaitForNotificationWithTimeout(wake)) {
    const absl::Time now = absl::Now();
    if (now >= next_coordination) {
      coordination_.Tick();
      next_coordination = now + coordination_interval;
    }
    if (now >= next_jobs) {
      jobs_.Tick();
      next_jobs = now + jobs_interval;
    }
  }
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

std::string CoordinatorServer::address() const {
  // A wildcard listener is reachable on loopback from this machine.
  std::string host = config_.listen_host;
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::" || host == "[::]") host = "::1";
  return JoinHostPort(host, port_);
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
