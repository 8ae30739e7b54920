#include "coordinator/admin_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "coordinator/job_spec.h"

namespace mesh::coordinator {

grpc::ServerUnaryReactor* AdminServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context, const mesh::v1::GetServerInfoRequest*,
    mesh::v1::GetServerInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::StatusOr<Principal> caller = authz_->Caller(*context); !caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  const ServerInfoSnapshot snapshot = info_->Snapshot();
  response->set_version(snapshot.version);
  response->set_protocol_version(static_cast<uint32_t>(snapshot.protocol_version));
  response->set_start_time_unix_ms(absl::ToUnixMillis(snapshot.start_time));
  response->set_uptime_seconds(absl::ToDoubleSeconds(snapshot.uptime));
  response->set_hostname(snapshot.hostname);
  response->set_pid(snapshot.pid);
  for (const std::string& feature : snapshot.features) response->add_features(feature);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::CreateJob(grpc::CallbackServerContext* context,
                                                      const mesh::v1::CreateJobRequest* request,
                                                      mesh::v1::CreateJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status denied = authz_->JobData(*context, request->job_id()); !denied.ok()) {
    reactor->Finish(ToGrpcStatus(denied));
    return reactor;
  }
  JobLayout layout;
  layout.job_id = request->job_id();
  layout.world_size = request->world_size();
  layout.mesh_shape.assign(request->mesh_shape().begin(), request->mesh_shape().end());
  layout.mesh_dim_names.assign(request->mesh_dim_names().begin(), request->mesh_dim_names().end());
  if (request->hang_timeout_seconds() < 0 ||
      request->hang_timeout_seconds() > kMaxHangTimeoutSeconds) {
    reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "hang_timeout_seconds ", request->hang_timeout_seconds(), " is outside 0..",
        kMaxHangTimeoutSeconds, " (0: the default, ", kDefaultHangTimeoutSeconds, ")"))));
    return reactor;
  }
  if (request->hang_timeout_seconds() > 0) {
    layout.hang_timeout = absl::Seconds(request->hang_timeout_seconds());
  }
  layout.in_place = request->in_place();
  auto job = coordination_->CreateJob(std::move(layout));
  if (job.ok()) {
    response->set_job_id(job->layout.job_id);
    response->set_generation(job->generation);
  }
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

}  // namespace mesh::coordinator
