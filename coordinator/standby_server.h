// StandbyServer: what a coordinator replica serves while another replica
// leads (docs/ha.md). Every RPC, of any service, fails at once with
// UNAVAILABLE, saying where the leader is: in the message ("... the leader
// is at host:port") and in the trailing metadata key "mesh-leader" (empty
// while no replica leads). Clients given several coordinator addresses move
// to the leader on that answer (common/coordinator_targets.h). The standard
// health service reports NOT_SERVING, so that load balancers and readiness
// probes send nothing here.
//
// Thread safety: SetLeader and port() from any thread; Shutdown once.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mesh::coordinator {

// The trailing metadata key that names the leader's address.
inline constexpr char kLeaderMetadataKey[] = "mesh-leader";

class StandbyServer {
 public:
  // Serves on listen_host:port (0: a free port) with `credentials`.
  // Possible errors: UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(
      const std::string& listen_host, int port,
      std::shared_ptr<grpc::ServerCredentials> credentials);
  ~StandbyServer();
  StandbyServer(const StandbyServer&) = delete;
  StandbyServer& operator=(const StandbyServer&) = delete;

  int port() const { return port_; }
  // The leader's address to hand out; "" while none leads.
  void SetLeader(const std::string& address);
  // Stops serving; calls in flight are answered first.
  void Shutdown();

 private:
  class Service;
  StandbyServer() = default;

  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace mesh::coordinator
