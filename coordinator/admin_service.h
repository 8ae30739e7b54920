// gRPC adapter for mesh.v1.AdminService (callback API).
#pragma once

#include "coordinator/server_info.h"
#include "mesh/v1/admin.grpc.pb.h"

namespace mesh::coordinator {

// Thread safety: thread-safe; gRPC calls it from its own threads.
class AdminServiceImpl final : public mesh::v1::AdminService::CallbackService {
 public:
  // `info` must outlive this service.
  explicit AdminServiceImpl(const ServerInfo* info) : info_(info) {}

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const mesh::v1::GetServerInfoRequest* request,
                                          mesh::v1::GetServerInfoResponse* response) override;

 private:
  const ServerInfo* const info_;
};

}  // namespace mesh::coordinator
