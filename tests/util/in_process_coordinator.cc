#include "tests/util/in_process_coordinator.h"

#include <utility>

namespace mesh::testing {

coordinator::CoordinatorConfig InProcessCoordinator::DefaultConfig() {
  coordinator::CoordinatorConfig config;
  config.listen_host = "127.0.0.1";
  config.port = 0;
  config.state_dir.clear();
  config.coordination.heartbeat_interval = absl::Milliseconds(100);
  config.coordination.heartbeat_timeout = absl::Seconds(5);
  return config;
}

absl::StatusOr<std::unique_ptr<InProcessCoordinator>> InProcessCoordinator::Start(
    const coordinator::CoordinatorConfig& config) {
  absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> server =
      coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) return server.status();
  return std::unique_ptr<InProcessCoordinator>(new InProcessCoordinator(*std::move(server)));
}

absl::StatusOr<std::unique_ptr<InProcessCoordinator>> InProcessCoordinator::Start(
    absl::Duration heartbeat_interval, absl::Duration heartbeat_timeout) {
  coordinator::CoordinatorConfig config = DefaultConfig();
  config.coordination.heartbeat_interval = heartbeat_interval;
  config.coordination.heartbeat_timeout = heartbeat_timeout;
  return Start(config);
}

InProcessCoordinator::InProcessCoordinator(std::unique_ptr<coordinator::CoordinatorServer> server)
    : server_(std::move(server)), address_(server_->address()), port_(server_->port()) {}

absl::Status InProcessCoordinator::CreateJob(const std::string& job_id, int world_size,
                                             std::vector<int64_t> mesh_shape,
                                             std::vector<std::string> mesh_dim_names) {
  coordinator::JobLayout layout;
  layout.job_id = job_id;
  layout.world_size = world_size;
  layout.mesh_shape = std::move(mesh_shape);
  layout.mesh_dim_names = std::move(mesh_dim_names);
  return coordination().CreateJob(std::move(layout)).status();
}

absl::Status InProcessCoordinator::CreateJob(coordinator::JobLayout layout) {
  return coordination().CreateJob(std::move(layout)).status();
}

bool InProcessCoordinator::JobFailed(const std::string& job_id) const {
  absl::StatusOr<coordinator::JobInfo> job = server_->coordination().GetJob(job_id);
  return job.ok() && job->failed;
}

void InProcessCoordinator::Stop(absl::Duration grace) { server_->Shutdown(grace); }

}  // namespace mesh::testing
