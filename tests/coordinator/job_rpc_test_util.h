// Helpers for the JobService/NodeService tests: an in-process
// CoordinatorServer on 127.0.0.1:0 with a FakeClock and no ticker, a
// background reader for server streams, and a fake agent (a NodeService
// client played by the test).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/coordinator_server.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::coordinator::testing {

// Every wait in these tests is bounded by this (real time).
constexpr absl::Duration kWait = absl::Seconds(10);

inline std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = kWait) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  return ctx;
}

// Reads a server stream on its own thread. Destruction cancels the call.
template <typename Message>
class StreamReader {
 public:
  using Starter = std::function<std::unique_ptr<grpc::ClientReader<Message>>(grpc::ClientContext*)>;

  explicit StreamReader(const Starter& start, absl::Duration deadline = absl::Seconds(60)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(deadline));
    reader_ = start(&ctx_);
    thread_ = std::thread([this] {
      Message message;
      while (reader_->Read(&message)) {
        absl::MutexLock lock(&mu_);
        messages_.push_back(message);
      }
      grpc::Status status = reader_->Finish();
      absl::MutexLock lock(&mu_);
      status_ = std::move(status);
    });
  }

  ~StreamReader() {
    ctx_.TryCancel();
    thread_.join();
  }

  // The next message; nullopt when the stream ended first or after `timeout`.
  std::optional<Message> Next(absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    const auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return next_ < messages_.size() || status_.has_value();
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (next_ < messages_.size()) return messages_[next_++];
    return std::nullopt;
  }

  // The call's status once it ended; nullopt after `timeout`.
  std::optional<grpc::Status> Status(absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    const auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return status_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
    return status_;
  }

  // Messages not yet returned by Next.
  std::vector<Message> Rest() {
    absl::MutexLock lock(&mu_);
    std::vector<Message> rest(messages_.begin() + next_, messages_.end());
    next_ = messages_.size();
    return rest;
  }

  void Cancel() { ctx_.TryCancel(); }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<Message>> reader_;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<Message> messages_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);
};

// A job spec that passes validation: `nodes` × `nproc` CPU ranks.
inline mesh::v1::JobSpec Spec(int nodes, int nproc, int max_restarts = 0) {
  mesh::v1::JobSpec spec;
  spec.set_name("train");
  spec.add_command("/usr/bin/python3");
  spec.add_command("train.py");
  spec.mutable_nodes()->set_min(nodes);
  spec.set_nproc_per_node(nproc);
  spec.set_max_restarts(max_restarts);
  return spec;
}

class JobRpcTest : public ::testing::Test {
 protected:
  void TearDown() override { StopServer(); }

  void StartServer(const std::string& state_dir = "") {
    CoordinatorConfig config;
    config.port = 0;
    config.clock = &clock_;
    config.run_ticker = false;
    config.state_dir = state_dir;
    if (configure_) configure_(config);
    auto server = CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    jobs_ = mesh::v1::JobService::NewStub(channel_);
    nodes_ = mesh::v1::NodeService::NewStub(channel_);
  }

  void StopServer() {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
    server_.reset();
  }

  absl::StatusOr<mesh::v1::Job> Submit(const mesh::v1::JobSpec& spec) {
    mesh::v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    mesh::v1::SubmitJobResponse response;
    grpc::Status status = jobs_->SubmitJob(Context().get(), request, &response);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    return response.job();
  }

  mesh::v1::Job GetJob(const std::string& id) {
    mesh::v1::GetJobRequest request;
    request.set_job_id(id);
    mesh::v1::GetJobResponse response;
    grpc::Status status = jobs_->GetJob(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.job();
  }

  std::unique_ptr<StreamReader<mesh::v1::WatchJobStateResponse>> WatchState(const std::string& id,
                                                                            bool replay) {
    mesh::v1::WatchJobStateRequest request;
    request.set_job_id(id);
    request.set_replay(replay);
    return std::make_unique<StreamReader<mesh::v1::WatchJobStateResponse>>(
        [this, request](grpc::ClientContext* ctx) { return jobs_->WatchJobState(ctx, request); });
  }

  // A fake agent: registers, watches its orders, reports.
  struct Agent {
    std::string name;
    std::string session;
    std::unique_ptr<StreamReader<mesh::v1::Assignment>> orders;
  };

  std::unique_ptr<Agent> Register(const std::string& name, const std::string& address, int slots) {
    mesh::v1::RegisterNodeRequest request;
    request.set_name(name);
    request.set_address(address);
    request.set_slots(slots);
    request.set_agent_version("test");
    mesh::v1::RegisterNodeResponse response;
    grpc::Status status = nodes_->RegisterNode(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (!status.ok()) return nullptr;
    auto agent = std::make_unique<Agent>();
    agent->name = name;
    agent->session = response.session_id();
    agent->orders = WatchOrders(name, agent->session);
    return agent;
  }

  std::unique_ptr<StreamReader<mesh::v1::Assignment>> WatchOrders(const std::string& name,
                                                                  const std::string& session) {
    mesh::v1::WatchAssignmentsRequest request;
    request.set_name(name);
    request.set_session_id(session);
    return std::make_unique<StreamReader<mesh::v1::Assignment>>(
        [this, request](grpc::ClientContext* ctx) {
          return nodes_->WatchAssignments(ctx, request);
        });
  }

  grpc::Status Started(const Agent& agent, const std::string& job_id, int64_t generation,
                       const std::vector<int>& ranks) {
    mesh::v1::ReportWorkersStartedRequest request;
    request.set_name(agent.name);
    request.set_session_id(agent.session);
    request.set_job_id(job_id);
    request.set_generation(generation);
    for (int rank : ranks) {
      auto* worker = request.add_workers();
      worker->set_job_id(job_id);
      worker->set_generation(generation);
      worker->set_rank(rank);
      worker->set_pid(1000 + rank);
    }
    mesh::v1::ReportWorkersStartedResponse response;
    return nodes_->ReportWorkersStarted(Context().get(), request, &response);
  }

  grpc::Status Exited(const Agent& agent, const std::string& job_id, int64_t generation, int rank,
                      int exit_code) {
    mesh::v1::ReportWorkerExitRequest request;
    request.set_job_id(job_id);
    request.set_generation(generation);
    request.set_rank(rank);
    request.set_exit_code(exit_code);
    return ReportExit(agent, std::move(request));
  }

  // Sends `request` (job, generation, rank, termination, detail...) as
  // `agent`'s report, filling in its name, session and the time.
  grpc::Status ReportExit(const Agent& agent, mesh::v1::ReportWorkerExitRequest request) {
    request.set_name(agent.name);
    request.set_session_id(agent.session);
    request.set_time_unix_ms(absl::ToUnixMillis(clock_.Now()));
    mesh::v1::ReportWorkerExitResponse response;
    return nodes_->ReportWorkerExit(Context().get(), request, &response);
  }

  // Called on the config by each StartServer, after the fields above: a
  // test's own flags (spec limits, --allow-job-env).
  std::function<void(CoordinatorConfig&)> configure_;
  FakeClock clock_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mesh::v1::JobService::Stub> jobs_;
  std::unique_ptr<mesh::v1::NodeService::Stub> nodes_;
};

}  // namespace mesh::coordinator::testing
