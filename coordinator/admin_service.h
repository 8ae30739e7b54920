// gRPC adapter for mesh.v1.AdminService (callback API).
#pragma once

#include "coordinator/auth_grpc.h"
#include "coordinator/coordination.h"
#include "coordinator/server_info.h"
#include "mesh/v1/admin.grpc.pb.h"

namespace mesh::coordinator {

// Thread safety: thread-safe; gRPC calls it from its own threads.
class AdminServiceImpl final : public mesh::v1::AdminService::CallbackService {
 public:
  // `info`, `coordination` and `authz` must outlive this service. Any
  // authenticated caller may read the server info; CreateJob is a job-data
  // call (coordinator/auth.h).
  AdminServiceImpl(const ServerInfo* info, Coordination* coordination, const CallAuthorizer* authz)
      : info_(info), coordination_(coordination), authz_(authz) {}

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const mesh::v1::GetServerInfoRequest* request,
                                          mesh::v1::GetServerInfoResponse* response) override;

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const mesh::v1::CreateJobRequest* request,
                                      mesh::v1::CreateJobResponse* response) override;

 private:
  const ServerInfo* const info_;
  Coordination* const coordination_;
  const CallAuthorizer* const authz_;
};

}  // namespace mesh::coordinator
