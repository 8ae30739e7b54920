#include "coordinator/standby_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace mesh::coordinator {

class StandbyServer::Service final : public grpc::CallbackGenericService {
 public:
  void SetLeader(const std::string& address) {
    absl::MutexLock lock(&mu_);
    leader_ = address;
  }

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    std::string leader;
    {
      absl::MutexLock lock(&mu_);
      leader = leader_;
    }
    context->AddTrailingMetadata(kLeaderMetadataKey, leader);
    const std::string message =
        leader.empty()
            ? "this mesh-coordinator is a standby replica and no replica leads right now; "
              "retry shortly"
            : absl::StrCat("this mesh-coordinator is a standby replica; the leader is at ", leader);
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(grpc::Status status) { Finish(std::move(status)); }
      void OnDone() override { delete this; }
    };
    return new Reactor(grpc::Status(grpc::StatusCode::UNAVAILABLE, message));
  }

 private:
  absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    const std::string& listen_host, int port,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  // Process-wide, before any builder: the standard health service.
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<StandbyServer> server(new StandbyServer());
  server->service_ = std::make_unique<Service>();
  grpc::ServerBuilder builder;
  const std::string host = listen_host.find(':') != std::string::npos && listen_host[0] != '['
                               ? absl::StrCat("[", listen_host, "]")
                               : listen_host;
  builder.AddListeningPort(absl::StrCat(host, ":", port), std::move(credentials), &server->port_);
  builder.RegisterCallbackGenericService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("standby replica: cannot listen on ", host, ":", port));
  }
  if (grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  return server;
}

StandbyServer::~StandbyServer() { Shutdown(); }

void StandbyServer::SetLeader(const std::string& address) { service_->SetLeader(address); }

void StandbyServer::Shutdown() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }
}

}  // namespace mesh::coordinator
