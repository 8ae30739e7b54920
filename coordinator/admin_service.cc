#include "coordinator/admin_service.h"

#include "absl/time/time.h"

namespace mesh::coordinator {

grpc::ServerUnaryReactor* AdminServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context, const mesh::v1::GetServerInfoRequest*,
    mesh::v1::GetServerInfoResponse* response) {
  const ServerInfoSnapshot snapshot = info_->Snapshot();
  response->set_version(snapshot.version);
  response->set_protocol_version(static_cast<uint32_t>(snapshot.protocol_version));
  response->set_start_time_unix_ms(absl::ToUnixMillis(snapshot.start_time));
  response->set_uptime_seconds(absl::ToDoubleSeconds(snapshot.uptime));
  response->set_hostname(snapshot.hostname);
  response->set_pid(snapshot.pid);
  for (const std::string& feature : snapshot.features) response->add_features(feature);

  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace mesh::coordinator
