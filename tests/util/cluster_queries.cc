#include "tests/util/cluster_queries.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "tests/util/proc.h"

namespace mesh::testing {

namespace {

// A client deadline this much past a server-side wait's timeout, so that the
// server's answer (not the client's deadline) ends the call.
constexpr absl::Duration kServerWaitMargin = absl::Seconds(5);

}  // namespace

std::unique_ptr<grpc::ClientContext> ContextWithDeadline(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

absl::StatusOr<mesh::v1::Job> GetJob(mesh::v1::JobService::Stub& jobs, const std::string& id) {
  mesh::v1::GetJobRequest request;
  request.set_job_id(id);
  mesh::v1::GetJobResponse response;
  const grpc::Status status = jobs.GetJob(ContextWithDeadline().get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_job());
}

absl::StatusOr<std::vector<mesh::v1::Job>> ListAllJobs(mesh::v1::JobService::Stub& jobs,
                                                       int page_size) {
  std::vector<mesh::v1::Job> all;
  mesh::v1::ListJobsRequest request;
  request.set_page_size(page_size);
  // Bounded: a page token that never ends is a bug, not a reason to spin.
  for (int page = 0; page < 100'000; ++page) {
    mesh::v1::ListJobsResponse response;
    const grpc::Status status = jobs.ListJobs(ContextWithDeadline().get(), request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    for (auto& job : *response.mutable_jobs()) all.push_back(std::move(job));
    if (response.next_page_token().empty()) return all;
    request.set_page_token(response.next_page_token());
  }
  return absl::InternalError("ListJobs pages never ended");
}

absl::StatusOr<mesh::v1::Job> SubmitJob(mesh::v1::JobService::Stub& jobs,
                                        const mesh::v1::JobSpec& spec) {
  mesh::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  mesh::v1::SubmitJobResponse response;
  const grpc::Status status = jobs.SubmitJob(ContextWithDeadline().get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_job());
}

bool WaitForState(mesh::v1::JobService::Stub& jobs, const std::string& id, mesh::v1::JobState state,
                  absl::Duration timeout) {
  return WaitUntil(
      [&] {
        absl::StatusOr<mesh::v1::Job> job = GetJob(jobs, id);
        return job.ok() && job->state() == state;
      },
      timeout);
}

absl::StatusOr<mesh::v1::Job> WaitTerminal(mesh::v1::JobService::Stub& jobs, const std::string& id,
                                           absl::Duration timeout) {
  mesh::v1::WaitJobRequest request;
  request.set_job_id(id);
  request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
  mesh::v1::WaitJobResponse response;
  const grpc::Status status =
      jobs.WaitJob(ContextWithDeadline(timeout + kServerWaitMargin).get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_job());
}

mesh::v1::JobSpec ShellJobSpec(const std::string& script, int nodes, int nproc,
                               const std::string& marker) {
  mesh::v1::JobSpec spec;
  spec.set_name("sh");
  spec.add_command("/bin/sh");
  spec.add_command("-c");
  spec.add_command(script);
  spec.mutable_nodes()->set_min(nodes);
  spec.set_nproc_per_node(nproc);
  if (!marker.empty()) (*spec.mutable_env())["MARKER"] = marker;
  return spec;
}

absl::StatusOr<std::vector<mesh::v1::Node>> ListNodes(mesh::v1::JobService::Stub& jobs) {
  mesh::v1::ListNodesRequest request;
  mesh::v1::ListNodesResponse response;
  const grpc::Status status = jobs.ListNodes(ContextWithDeadline().get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::vector<mesh::v1::Node>(std::make_move_iterator(response.mutable_nodes()->begin()),
                                     std::make_move_iterator(response.mutable_nodes()->end()));
}

absl::StatusOr<int> CountNodes(mesh::v1::JobService::Stub& jobs,
                               const std::function<bool(const mesh::v1::Node&)>& predicate) {
  absl::StatusOr<std::vector<mesh::v1::Node>> nodes = ListNodes(jobs);
  if (!nodes.ok()) return nodes.status();
  int count = 0;
  for (const mesh::v1::Node& node : *nodes) count += predicate(node) ? 1 : 0;
  return count;
}

absl::StatusOr<int> ReadyNodes(mesh::v1::JobService::Stub& jobs) {
  return CountNodes(
      jobs, [](const mesh::v1::Node& node) { return node.state() == mesh::v1::NODE_STATE_READY; });
}

absl::StatusOr<mesh::v1::Node> GetNode(mesh::v1::JobService::Stub& jobs, const std::string& name) {
  absl::StatusOr<std::vector<mesh::v1::Node>> nodes = ListNodes(jobs);
  if (!nodes.ok()) return nodes.status();
  for (mesh::v1::Node& node : *nodes) {
    if (node.name() == name) return std::move(node);
  }
  return absl::NotFoundError(absl::StrCat("no node \"", name, "\" listed"));
}

bool WaitForNodeState(mesh::v1::JobService::Stub& jobs, const std::string& name,
                      mesh::v1::NodeState state, absl::Duration timeout) {
  return WaitUntil(
      [&] {
        absl::StatusOr<mesh::v1::Node> node = GetNode(jobs, name);
        return node.ok() && node->state() == state;
      },
      timeout);
}

absl::Status CreateBareJob(mesh::v1::AdminService::Stub& admin, const std::string& id,
                           int world_size) {
  mesh::v1::CreateJobRequest request;
  request.set_job_id(id);
  request.set_world_size(world_size);
  mesh::v1::CreateJobResponse response;
  return FromGrpcStatus(admin.CreateJob(ContextWithDeadline().get(), request, &response));
}

mesh::v1::RankContext RankOf(const std::string& job, int rank) {
  mesh::v1::RankContext context;
  context.set_job_id(job);
  context.set_rank(rank);
  context.set_incarnation(100 + rank);
  return context;
}

grpc::Status JoinRank(mesh::v1::WorkerService::Stub& workers, const mesh::v1::RankContext& rank,
                      absl::Duration timeout) {
  mesh::v1::JoinRequest request;
  *request.mutable_context() = rank;
  request.set_host("host-a");
  request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
  mesh::v1::JoinResponse response;
  return workers.Join(ContextWithDeadline(timeout + kServerWaitMargin).get(), request, &response);
}

}  // namespace mesh::testing
