// gRPC adapter for mesh.v1.AdminService (callback API).
#pragma once

#include "coordinator/coordination.h"
#include "coordinator/server_info.h"
#include "mesh/v1/admin.grpc.pb.h"

namespace mesh::coordinator {

// Thread safety: thread-safe; gRPC calls it from its own threads.
class AdminServiceImpl final : public mesh::v1::AdminService::CallbackService {
 public:
  // `info` and `coordination` must outlive this service.
  AdminServiceImpl(const ServerInfo* info, Coordination* coordination)
      : info_(info), coordination_(coordination) {}

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const mesh::v1::GetServerInfoRequest* request,
                                          mesh::v1::GetServerInfoResponse* response) override;

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const mesh::v1::CreateJobRequest* request,
                                      mesh::v1::CreateJobResponse* response) override;

 private:
  const ServerInfo* const info_;
  Coordination* const coordination_;
};

}  // namespace mesh::coordinator
