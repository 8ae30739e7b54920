// NodeService through a real in-process CoordinatorServer on 127.0.0.1:0,
// the test playing the agent: sessions, the order stream, and the GetLogs ↔
// UploadLogs relay (including a reader that leaves and one that is too slow).
#include "coordinator/node_service.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/job_service.h"
#include "tests/coordinator/job_rpc_test_util.h"

namespace mesh::coordinator::testing {
namespace node_service_test {

using namespace mesh::v1;  // NOLINT
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

class NodeServiceTest : public JobRpcTest {
 protected:
  void SetUp() override { StartServer(); }

  // A registered node running a 1 × 2 job (ranks 0 and 1, RUNNING).
  void StartJob() {
    agent_ = Register("node-a", "10.0.0.5", 4);
    ASSERT_NE(agent_, nullptr);
    auto job = Submit(Spec(1, 2));
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->id();
    auto launch = agent_->orders->Next();
    ASSERT_TRUE(launch.has_value());
    ASSERT_EQ(launch->action(), Assignment::ACTION_LAUNCH);
    ASSERT_TRUE(Started(*agent_, job_id_, 0, {0, 1}).ok());
  }

  std::unique_ptr<StreamReader<LogChunk>> GetLogs(const std::string& job_id) {
    GetLogsRequest request;
    request.set_job_id(job_id);
    request.set_generation(-1);
    return std::make_unique<StreamReader<LogChunk>>(
        [this, request](grpc::ClientContext* ctx) { return jobs_->GetLogs(ctx, request); });
  }

  // The agent's side of one UploadLogs call.
  struct Upload {
    std::unique_ptr<grpc::ClientContext> ctx = Context();
    UploadLogsResponse response;
    std::unique_ptr<grpc::ClientWriter<UploadLogsRequest>> writer;
  };
  std::unique_ptr<Upload> OpenUpload() {
    auto upload = std::make_unique<Upload>();
    upload->writer = nodes_->UploadLogs(upload->ctx.get(), &upload->response);
    return upload;
  }
  UploadLogsRequest Message(const Assignment& order, int rank, const std::string& data, bool eof) {
    UploadLogsRequest message;
    message.set_name(agent_->name);
    message.set_session_id(agent_->session);
    message.set_job_id(order.job_id());
    message.set_log_request_id(order.log_request_id());
    LogChunk* chunk = message.mutable_chunk();
    chunk->set_rank(rank);
    chunk->set_generation(order.generation());
    chunk->set_stream(LogChunk::STREAM_STDOUT);
    chunk->set_data(data);
    chunk->set_eof(eof);
    return message;
  }

  std::unique_ptr<Agent> agent_;
  std::string job_id_;
};

TEST_F(NodeServiceTest, StaleSessionIsAborted) {
  StartJob();
  const std::string old_session = agent_->session;
  // The agent restarts: a new registration takes the name over.
  auto again = Register("node-a", "10.0.0.5", 4);
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again->session, old_session);

  NodeHeartbeatRequest heartbeat;
  heartbeat.set_name("node-a");
  heartbeat.set_session_id(old_session);
  NodeHeartbeatResponse ok;
  EXPECT_EQ(nodes_->NodeHeartbeat(Context().get(), heartbeat, &ok).error_code(),
            grpc::StatusCode::ABORTED);
  heartbeat.set_session_id(again->session);
  EXPECT_TRUE(nodes_->NodeHeartbeat(Context().get(), heartbeat, &ok).ok());
  heartbeat.set_name("node-z");
  EXPECT_EQ(nodes_->NodeHeartbeat(Context().get(), heartbeat, &ok).error_code(),
            grpc::StatusCode::NOT_FOUND);

  EXPECT_EQ(Exited(*agent_, job_id_, 0, 0, 0).error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(Started(*agent_, job_id_, 0, {0}).error_code(), grpc::StatusCode::ABORTED);
  auto stale_orders = WatchOrders("node-a", old_session);
  auto status = stale_orders->Status();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::ABORTED);
}

// With 1 heartbeat a second planned for all agents, a 2 s interval and a
// 15 s timeout: up to 2 nodes get 2 s, 3 nodes 3 s, and from 5 on a third
// of the timeout. Each RegisterNode and NodeHeartbeat reply says the
// interval for the nodes known at that moment.
class NodeHeartbeatRateTest : public JobRpcTest {
 protected:
  void SetUp() override {
    configure_ = [](CoordinatorConfig& config) {
      config.jobs.node_heartbeat_interval = absl::Seconds(2);
      config.jobs.node_heartbeat_timeout = absl::Seconds(15);
      config.jobs.node_heartbeat_rate = 1;
    };
    StartServer();
  }

  // The interval a heartbeat of `agent` is told.
  double Beat(const Agent& agent) {
    NodeHeartbeatRequest heartbeat;
    heartbeat.set_name(agent.name);
    heartbeat.set_session_id(agent.session);
    NodeHeartbeatResponse reply;
    const grpc::Status status = nodes_->NodeHeartbeat(Context().get(), heartbeat, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return reply.heartbeat_interval_seconds();
  }

  double RegisteredInterval(const std::string& name) {
    RegisterNodeRequest request;
    request.set_name(name);
    request.set_address("10.0.0.9");
    request.set_slots(1);
    RegisterNodeResponse response;
    const grpc::Status status = nodes_->RegisterNode(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_DOUBLE_EQ(response.heartbeat_timeout_seconds(), 15);
    return response.heartbeat_interval_seconds();
  }
};

TEST_F(NodeHeartbeatRateTest, AgentsAreToldALongerIntervalAsTheClusterGrows) {
  auto first = Register("node-1", "10.0.0.1", 1);
  ASSERT_NE(first, nullptr);
  EXPECT_DOUBLE_EQ(Beat(*first), 2);
  EXPECT_DOUBLE_EQ(RegisteredInterval("node-2"), 2);
  EXPECT_DOUBLE_EQ(RegisteredInterval("node-3"), 3);
  // The first node, registered at 2 s, hears of the growth in its next reply.
  EXPECT_DOUBLE_EQ(Beat(*first), 3);
  EXPECT_DOUBLE_EQ(RegisteredInterval("node-4"), 4);
  EXPECT_DOUBLE_EQ(RegisteredInterval("node-5"), 5);
  EXPECT_DOUBLE_EQ(RegisteredInterval("node-6"), 5);  // Capped: a third of 15 s.
  EXPECT_DOUBLE_EQ(Beat(*first), 5);
}

TEST_F(NodeServiceTest, BadRegistrationIsInvalidArgument) {
  RegisterNodeRequest request;
  request.set_name("node-a");
  request.set_address("10.0.0.5");
  request.set_slots(0);
  RegisterNodeResponse response;
  grpc::Status status = nodes_->RegisterNode(Context().get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("slots"));
}

TEST_F(NodeServiceTest, NewerOrderStreamReplacesTheOlderOne) {
  StartJob();
  auto newer = WatchOrders(agent_->name, agent_->session);
  auto status = agent_->orders->Status();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::ABORTED);
  // The newer stream gets the orders from now on.
  CancelJobRequest cancel;
  cancel.set_job_id(job_id_);
  CancelJobResponse cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), cancel, &cancelled).ok());
  std::optional<Assignment> order;
  do {
    order = newer->Next();
  } while (order.has_value() && order->action() != Assignment::ACTION_KILL);
  ASSERT_TRUE(order.has_value());
  EXPECT_EQ(order->job_id(), job_id_);
}

TEST_F(NodeServiceTest, GetLogsIsRelayedFromTheAgentsUpload) {
  StartJob();
  auto logs = GetLogs(job_id_);
  auto order = agent_->orders->Next();
  ASSERT_TRUE(order.has_value());
  ASSERT_EQ(order->action(), Assignment::ACTION_UPLOAD_LOGS);
  EXPECT_EQ(order->job_id(), job_id_);
  EXPECT_FALSE(order->log_request_id().empty());

  auto upload = OpenUpload();
  ASSERT_TRUE(upload->writer->Write(Message(*order, 0, "hello from 0\n", false)));
  ASSERT_TRUE(upload->writer->Write(Message(*order, 1, "hello from 1\n", true)));
  ASSERT_TRUE(upload->writer->Write(Message(*order, 0, "bye\n", true)));
  ASSERT_TRUE(upload->writer->WritesDone());
  grpc::Status uploaded = upload->writer->Finish();
  // The manager ends the request, and aborts its uploads, as soon as the
  // last eof arrives, which may beat the agent's half-close (OK).
  EXPECT_TRUE(uploaded.ok() || uploaded.error_code() == grpc::StatusCode::CANCELLED)
      << uploaded.error_message();

  auto status = logs->Status();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  std::vector<std::string> data;
  for (const LogChunk& chunk : logs->Rest()) {
    data.push_back(std::to_string(chunk.rank()) + ":" + chunk.data() + (chunk.eof() ? "$" : ""));
  }
  EXPECT_THAT(data, UnorderedElementsAre("0:hello from 0\n", "1:hello from 1\n$", "0:bye\n$"));
}

TEST_F(NodeServiceTest, ReaderThatLeavesEndsTheUpload) {
  StartJob();
  auto logs = GetLogs(job_id_);
  auto order = agent_->orders->Next();
  ASSERT_TRUE(order.has_value());
  ASSERT_EQ(order->action(), Assignment::ACTION_UPLOAD_LOGS);
  auto upload = OpenUpload();
  ASSERT_TRUE(upload->writer->Write(Message(*order, 0, "line\n", false)));
  auto first = logs->Next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->data(), "line\n");

  logs->Cancel();
  // The server ends the upload call on its own: no WritesDone from the agent.
  grpc::Status uploaded = upload->writer->Finish();
  EXPECT_FALSE(uploaded.ok());
  EXPECT_NE(uploaded.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << "the server never ended the upload: " << uploaded.error_message();
}

TEST_F(NodeServiceTest, GetLogsOfAJobNeverPlacedIsFailedPrecondition) {
  auto job = Submit(Spec(1, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  auto logs = GetLogs(job->id());
  auto status = logs->Status();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status->error_message();
  auto unknown = GetLogs("job-404");
  status = unknown->Status();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(NodeServiceTest, UploadForAnUnknownRequestFails) {
  StartJob();
  auto upload = OpenUpload();
  Assignment fake;
  fake.set_job_id(job_id_);
  fake.set_log_request_id("no-such-request");
  upload->writer->Write(Message(fake, 0, "x\n", true));
  grpc::Status status = upload->writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
}

TEST_F(NodeServiceTest, TooSlowAReaderGetsResourceExhausted) {
  StartJob();
  // A reader that reads nothing until the upload is done.
  GetLogsRequest request;
  request.set_job_id(job_id_);
  request.set_generation(-1);
  auto ctx = Context(absl::Seconds(60));
  auto reader = jobs_->GetLogs(ctx.get(), request);

  auto order = agent_->orders->Next();
  ASSERT_TRUE(order.has_value());
  ASSERT_EQ(order->action(), Assignment::ACTION_UPLOAD_LOGS);
  auto upload = OpenUpload();
  const std::string line(1 << 20, 'x');
  const size_t chunks = (JobServiceImpl::kMaxQueuedLogBytes >> 20) + 8;
  size_t written = 0;
  while (written < chunks && upload->writer->Write(Message(*order, 0, line + "\n", false))) {
    ++written;
  }
  // Whether the upload ends OK (its half-close arrived first) or aborted
  // depends on timing; either way it ends.
  upload->writer->WritesDone();
  grpc::Status uploaded = upload->writer->Finish();
  EXPECT_NE(uploaded.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GT(written, JobServiceImpl::kMaxQueuedLogBytes >> 20);

  LogChunk chunk;
  size_t read = 0;
  while (reader->Read(&chunk)) ++read;
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("use --tail"));
  EXPECT_LT(read, written);
}

}  // namespace node_service_test
}  // namespace mesh::coordinator::testing
