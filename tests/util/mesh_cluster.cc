#include "tests/util/mesh_cluster.h"

#include <signal.h>
#include <stdlib.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/util/proc.h"

namespace mesh::testing {

namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr char kBanner[] = "mesh-coordinator listening on ";

}  // namespace

std::unique_ptr<grpc::ClientContext> ContextWithDeadline(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

MeshCluster::MeshCluster(MeshClusterBinaries binaries, const std::string& prefix)
    : binaries_(std::move(binaries)) {
  std::string pattern = absl::StrCat("/tmp/", prefix, "-XXXXXX");
  const char* dir = mkdtemp(pattern.data());
  dir_ = dir == nullptr ? "/tmp" : dir;
  state_dir_ = dir_ + "/state";
}

MeshCluster::~MeshCluster() {
  agents_.clear();  // SIGKILL + reap, each.
  coordinator_.reset();
  if (dir_ != "/tmp") std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
}

absl::Status MeshCluster::StartCoordinator(int port, const std::vector<std::string>& extra,
                                           absl::Duration node_timeout) {
  std::vector<std::string> argv = {binaries_.coordinator,
                                   "--insecure",
                                   "--listen",
                                   "127.0.0.1",
                                   "--port",
                                   absl::StrCat(port),
                                   "--state-dir",
                                   state_dir_,
                                   "--node-heartbeat-interval",
                                   "0.2",
                                   "--node-heartbeat-timeout",
                                   absl::StrCat(absl::ToDoubleSeconds(node_timeout)),
                                   "--kill-grace",
                                   "1",
                                   "--shutdown-grace",
                                   "0.5"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv, coordinator_env_);
  if (!process.ok()) return process.status();
  absl::StatusOr<std::string> line = process->ReadLine(kStartTimeout);
  if (!line.ok()) return line.status();
  if (!absl::StartsWith(*line, kBanner)) {
    return absl::FailedPreconditionError(absl::StrCat("coordinator printed: ", *line));
  }
  address_ = line->substr(sizeof(kBanner) - 1);
  port_ = std::stoi(address_.substr(address_.rfind(':') + 1));
  coordinator_ = std::make_unique<Subprocess>(*std::move(process));
  channel_ = NewChannel();
  jobs_ = mesh::v1::JobService::NewStub(channel_);
  workers_ = mesh::v1::WorkerService::NewStub(channel_);
  admin_ = mesh::v1::AdminService::NewStub(channel_);
  return absl::OkStatus();
}

absl::Status MeshCluster::KillCoordinator() {
  if (coordinator_ == nullptr) return absl::OkStatus();
  coordinator_->Signal(SIGKILL);
  absl::StatusOr<int> status = coordinator_->Wait(absl::Seconds(10));
  coordinator_.reset();
  return status.status();
}

pid_t MeshCluster::coordinator_pid() const {
  return coordinator_ == nullptr ? -1 : coordinator_->pid();
}

absl::Status MeshCluster::StartAgent(int i, int slots) {
  absl::StatusOr<Subprocess> process = Subprocess::Start(
      {binaries_.agent, "--coordinator", address_, "--name", absl::StrCat("node-", i), "--address",
       "127.0.0.1", "--slots", absl::StrCat(slots), "--gpus", "none", "--work-dir",
       absl::StrCat(dir_, "/agent-", i), "--grace", "1"});
  if (!process.ok()) return process.status();
  if (static_cast<int>(agents_.size()) <= i) agents_.resize(i + 1);
  agents_[i] = std::make_unique<Subprocess>(*std::move(process));
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> MeshCluster::NewChannel() const {
  grpc::ChannelArguments args;
  // A fresh connection of its own, not one shared with the stubs.
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  return grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
}

int MeshCluster::ReadyNodes() {
  mesh::v1::ListNodesRequest request;
  mesh::v1::ListNodesResponse response;
  if (!jobs_->ListNodes(ContextWithDeadline(absl::Seconds(10)).get(), request, &response).ok()) {
    return -1;
  }
  int ready = 0;
  for (const auto& node : response.nodes()) ready += node.state() == mesh::v1::NODE_STATE_READY;
  return ready;
}

int MeshCluster::NodesSeenSince(absl::Time since) {
  mesh::v1::ListNodesRequest request;
  mesh::v1::ListNodesResponse response;
  if (!jobs_->ListNodes(ContextWithDeadline(absl::Seconds(10)).get(), request, &response).ok()) {
    return -1;
  }
  int seen = 0;
  for (const auto& node : response.nodes()) {
    seen += absl::FromUnixMillis(node.last_seen_unix_ms()) >= since;
  }
  return seen;
}

std::optional<mesh::v1::Job> MeshCluster::GetJob(const std::string& id) {
  mesh::v1::GetJobRequest request;
  request.set_job_id(id);
  mesh::v1::GetJobResponse response;
  if (!jobs_->GetJob(ContextWithDeadline(absl::Seconds(10)).get(), request, &response).ok()) {
    return std::nullopt;
  }
  return response.job();
}

absl::StatusOr<std::vector<mesh::v1::Job>> MeshCluster::ListAllJobs() {
  std::vector<mesh::v1::Job> all;
  mesh::v1::ListJobsRequest request;
  request.set_page_size(37);  // Several pages for a few hundred jobs.
  // Bounded: a page token that never ends is a bug, not a reason to spin.
  for (int page = 0; page < 100'000; ++page) {
    mesh::v1::ListJobsResponse response;
    const grpc::Status status =
        jobs_->ListJobs(ContextWithDeadline(absl::Seconds(10)).get(), request, &response);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    for (auto& job : *response.mutable_jobs()) all.push_back(std::move(job));
    if (response.next_page_token().empty()) return all;
    request.set_page_token(response.next_page_token());
  }
  return absl::InternalError("ListJobs pages never ended");
}

bool MeshCluster::WaitForState(const std::string& id, mesh::v1::JobState state,
                               absl::Duration timeout) {
  return WaitUntil(
      [&] {
        std::optional<mesh::v1::Job> job = GetJob(id);
        return job.has_value() && job->state() == state;
      },
      timeout);
}

absl::StatusOr<mesh::v1::Job> MeshCluster::WaitTerminal(const std::string& id,
                                                        absl::Duration timeout) {
  mesh::v1::WaitJobRequest request;
  request.set_job_id(id);
  request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
  mesh::v1::WaitJobResponse response;
  const grpc::Status status =
      jobs_->WaitJob(ContextWithDeadline(timeout + absl::Seconds(5)).get(), request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  return response.job();
}

}  // namespace mesh::testing
