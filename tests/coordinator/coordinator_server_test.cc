// CoordinatorServer in-process on 127.0.0.1:0: the services, health,
// reflection, limits, shutdown and garbage on the port.
#include "coordinator/coordinator_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <gtest/gtest.h>

#include "cli/admin_client.h"

namespace mesh::coordinator {
namespace coordinator_server_test {

using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(10);

std::unique_ptr<CoordinatorServer> StartServer(CoordinatorConfig config = {}) {
  config.listen_host = "127.0.0.1";
  config.port = 0;
  auto server = CoordinatorServer::Start(config);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(CoordinatorServer, PortZeroBindsAFreePortAndServes) {
  FakeClock clock;
  CoordinatorConfig config;
  config.clock = &clock;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));

  clock.Advance(absl::Seconds(90));
  cli::AdminClient client(cli::MakeChannel(server->address()));
  auto info = client.GetServerInfo(kTimeout);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->protocol_version(), 1u);
  EXPECT_DOUBLE_EQ(info->uptime_seconds(), 90.0);
  EXPECT_EQ(info->pid(), getpid());
}

TEST(CoordinatorServer, TwoServersGetDifferentPorts) {
  auto a = StartServer();
  auto b = StartServer();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->port(), b->port());
}

TEST(CoordinatorServer, PortInUseIsUnavailable) {
  auto first = StartServer();
  ASSERT_NE(first, nullptr);
  CoordinatorConfig config;
  config.port = first->port();
  auto second = CoordinatorServer::Start(config);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

TEST(CoordinatorServer, BadConfigIsInvalidArgument) {
  CoordinatorConfig bad_port;
  bad_port.port = 70000;
  EXPECT_EQ(CoordinatorServer::Start(bad_port).status().code(), absl::StatusCode::kInvalidArgument);
  CoordinatorConfig tiny;
  tiny.port = 0;
  tiny.max_message_bytes = 10;
  EXPECT_EQ(CoordinatorServer::Start(tiny).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorServer, HealthIsServingForServerAndServices) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  cli::AdminClient client(cli::MakeChannel(server->address()));
  EXPECT_EQ(*client.CheckHealth("", kTimeout), HealthCheckResponse::SERVING);
  EXPECT_EQ(*client.CheckHealth("mesh.v1.AdminService", kTimeout), HealthCheckResponse::SERVING);
  EXPECT_EQ(client.CheckHealth("no.such.Service", kTimeout).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CoordinatorServer, ReflectionListsTheServices) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto channel = cli::MakeChannel(server->address());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);

  auto step = [&](int tag) {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&got, &ok));
    EXPECT_EQ(got, reinterpret_cast<void*>(static_cast<intptr_t>(tag)));
    return ok;
  };
  auto tag = [](int t) { return reinterpret_cast<void*>(static_cast<intptr_t>(t)); };

  call->StartCall(tag(1));
  ASSERT_TRUE(step(1));
  // ServerReflectionRequest{list_services: ""}: field 7, length-delimited.
  const char request_bytes[] = {0x3a, 0x00};
  grpc::Slice slice(request_bytes, sizeof(request_bytes));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, tag(2));
  ASSERT_TRUE(step(2));
  call->WritesDone(tag(3));
  ASSERT_TRUE(step(3));
  grpc::ByteBuffer response;
  call->Read(&response, tag(4));
  ASSERT_TRUE(step(4));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_THAT(bytes, HasSubstr("mesh.v1.AdminService"));
  EXPECT_THAT(bytes, HasSubstr("grpc.health.v1.Health"));

  grpc::Status status;
  call->Finish(&status, tag(5));
  step(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* ignored;
  bool ok;
  while (cq.Next(&ignored, &ok)) {
  }
}

TEST(CoordinatorServer, OversizedRequestIsResourceExhaustedAndServerStaysUp) {
  CoordinatorConfig config;
  config.max_message_bytes = 64 * 1024;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto channel = cli::MakeChannel(server->address());
  auto stub = mesh::v1::AdminService::NewStub(channel);

  // An unknown field makes the otherwise empty request as large as we like.
  mesh::v1::GetServerInfoRequest request;
  request.GetReflection()->MutableUnknownFields(&request)->AddLengthDelimited(
      99, std::string(128 * 1024, 'x'));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  mesh::v1::GetServerInfoResponse response;
  const grpc::Status status = stub->GetServerInfo(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();

  cli::AdminClient client(channel);
  EXPECT_TRUE(client.GetServerInfo(kTimeout).ok());
}

TEST(CoordinatorServer, SurvivesGarbageBytesOnItsPort) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  std::mt19937 rng(1234);
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::string junk = attempt == 0 ? "GET / HTTP/1.1\r\nHost: x\r\n\r\n" : "";
    // A valid HTTP/2 preface followed by garbage frames, then pure noise.
    if (attempt == 1) junk = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    for (int i = 0; i < 64 * 1024; ++i) junk.push_back(static_cast<char>(rng()));
    // The server may close the connection early; a failed send is fine.
    (void)send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    close(fd);
  }
  cli::AdminClient client(cli::MakeChannel(server->address()));
  auto info = client.GetServerInfo(kTimeout);
  EXPECT_TRUE(info.ok()) << info.status();
}

TEST(CoordinatorServer, ShutdownIsIdempotentAndLaterCallsAreUnavailable) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string address = server->address();
  cli::AdminClient client(cli::MakeChannel(address));
  ASSERT_TRUE(client.GetServerInfo(kTimeout).ok());
  server->Shutdown(absl::Seconds(1));
  server->Shutdown(absl::Seconds(1));
  server->Wait();
  auto after = client.GetServerInfo(absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(after.status()) || absl::IsDeadlineExceeded(after.status()))
      << after.status();
}

}  // namespace coordinator_server_test
}  // namespace mesh::coordinator
