// Adversarial input on a real mesh-coordinator's port: raw TCP
// garbage, an HTTP/2 preface followed by garbage, half-open connections, an
// oversized message through a real stub, a deeply nested protobuf, and
// malformed protobufs sent with grpc::GenericStub to every real method.
// After each, the process is alive and a normal call (GetServerInfo and the
// health service) succeeds: bad bytes cost their sender a failed call or a
// closed connection, never the server. Each test starts its own coordinator
// (--insecure, port 0; the port is learnt from its banner).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/admin_client.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/job.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace garbage_input_test {

using ::mesh::testing::Subprocess;
using ::testing::StartsWith;

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr absl::Duration kCallTimeout = absl::Seconds(10);
constexpr char kBanner[] = "mesh-coordinator listening on ";
constexpr int kMaxMessageBytes = 64 << 10;
constexpr char kHttp2Preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

class GarbageInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto process =
        Subprocess::Start({MESH_COORDINATOR_BIN, "--insecure", "--port", "0", "--shutdown-grace",
                           "0.5", "--max-message-bytes", std::to_string(kMaxMessageBytes)});
    ASSERT_TRUE(process.ok()) << process.status();
    process_ = std::make_unique<Subprocess>(*std::move(process));
    auto line = process_->ReadLine(kStartTimeout);
    ASSERT_TRUE(line.ok()) << line.status();
    ASSERT_THAT(*line, StartsWith(kBanner));
    address_ = line->substr(sizeof(kBanner) - 1);
    const size_t colon = address_.rfind(':');
    ASSERT_NE(colon, std::string::npos);
    ASSERT_TRUE(absl::SimpleAtoi(address_.substr(colon + 1), &port_)) << address_;
    channel_ = cli::MakeChannel(address_);
    ExpectServing("at start");
  }

  void TearDown() override {
    if (process_ == nullptr) return;
    process_->Signal(SIGTERM);
    auto status = process_->Wait(absl::Seconds(20));
    ASSERT_TRUE(status.ok()) << "the coordinator did not stop on SIGTERM: " << status.status();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "the coordinator exited with wait status " << *status;
  }

  // The process is alive, and serves a normal call and a health check.
  void ExpectServing(absl::string_view after) {
    auto exited = process_->Wait(absl::ZeroDuration());
    ASSERT_FALSE(exited.ok()) << "the coordinator died after " << after << " (wait status "
                              << *exited << ")";
    cli::AdminClient client(channel_);
    auto info = client.GetServerInfo(kCallTimeout);
    ASSERT_TRUE(info.ok()) << "after " << after << ": " << info.status();
    EXPECT_EQ(info->pid(), process_->pid());
    auto health = client.CheckHealth("", kCallTimeout);
    ASSERT_TRUE(health.ok()) << "after " << after << ": " << health.status();
    EXPECT_EQ(*health, grpc::health::v1::HealthCheckResponse::SERVING);
  }

  // A TCP connection to the coordinator; -1 (with a test failure) if none.
  int Connect() {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ADD_FAILURE() << "connect: " << strerror(errno);
      close(fd);
      return -1;
    }
    return fd;
  }

  // Writes what the peer takes (it may close the connection half-way, which
  // is a fine answer to garbage).
  static void SendAll(int fd, absl::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
  }

  // Reads until the server closes the connection or `timeout` passes;
  // returns whether it closed.
  static bool DrainUntilClosed(int fd, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    char buffer[4096];
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      pollfd p{fd, POLLIN, 0};
      const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
      if (ready <= 0) continue;
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) return true;
    }
  }

  // One unary call of `method` with raw request bytes through GenericStub.
  grpc::Status RawCall(const std::string& method, const std::string& bytes) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(3)));
    grpc::Slice slice(bytes.data(), bytes.size());
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::Status result;
    absl::Notification done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&](grpc::Status status) {
                     result = std::move(status);
                     done.Notify();
                   });
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      context.TryCancel();
      done.WaitForNotification();
      ADD_FAILURE() << method << ": no answer within 30 s";
    }
    return result;
  }

  std::unique_ptr<Subprocess> process_;
  std::string address_;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::mt19937_64 random_{20261122};
};

std::string RandomBytes(std::mt19937_64& random, size_t size) {
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random() & 0xff);
  return bytes;
}

std::string Varint(uint64_t value) {
  std::string out;
  do {
    uint8_t byte = value & 0x7f;
    value >>= 7;
    if (value != 0) byte |= 0x80;
    out.push_back(static_cast<char>(byte));
  } while (value != 0);
  return out;
}

// Tag of field `number` with wire type `type`, as a varint.
std::string Tag(uint32_t number, uint32_t type) { return Varint((uint64_t{number} << 3) | type); }

// 10,000 levels of an unknown group field (wire type 3 ... 4).
std::string NestedGroups(int depth) {
  std::string out;
  for (int i = 0; i < depth; ++i) out += Tag(999, 3);
  for (int i = 0; i < depth; ++i) out += Tag(999, 4);
  return out;
}

// 10,000 levels of length-delimited fields, each the whole of the next:
// field 1 of JoinRequest (its RankContext) then unknown field 15 inside.
std::string NestedLengthDelimited(int depth) {
  std::string inner;
  for (int i = 0; i < depth; ++i)
    inner = Tag(i == depth - 1 ? 1 : 15, 2) + Varint(inner.size()) + inner;
  return inner;
}

// Malformed encodings of every kind the parser must refuse.
std::vector<std::pair<std::string, std::string>> MalformedMessages(std::mt19937_64& random) {
  std::vector<std::pair<std::string, std::string>> out = {
      {"truncated varint", Tag(1, 0) + "\xff\xff\xff"},
      {"eleven-byte varint", Tag(1, 0) + std::string(10, '\xff') + "\x01"},
      {"length past the end", Tag(1, 2) + Varint(1000) + "abc"},
      {"negative length", Tag(1, 2) + Varint(0xffffffffffffffffull) + "x"},
      {"wire type 6", Tag(1, 6) + "x"},
      {"wire type 7", Tag(2, 7)},
      {"field number 0", Tag(0, 0) + "\x01"},
      {"end group without start", Tag(5, 4)},
      {"unterminated group", Tag(5, 3) + Tag(1, 0) + "\x01"},
      {"mismatched group end", Tag(5, 3) + Tag(6, 4)},
      {"string that is not UTF-8", Tag(1, 2) + Varint(4) + Tag(1, 2) + Varint(2) + "\xc3\x28"},
      {"nested groups", NestedGroups(10'000)},
      {"nested length-delimited", NestedLengthDelimited(10'000)},
  };
  for (int i = 0; i < 8; ++i)
    out.emplace_back(absl::StrCat("random ", i), RandomBytes(random, 1 + random() % 512));
  return out;
}

TEST_F(GarbageInputTest, RandomBytesOnRawConnections) {
  for (int i = 0; i < 16; ++i) {
    const int fd = Connect();
    ASSERT_GE(fd, 0);
    SendAll(fd, RandomBytes(random_, 1 + random_() % (32 << 10)));
    // Garbage is not HTTP/2: the server hangs up.
    EXPECT_TRUE(DrainUntilClosed(fd, absl::Seconds(20))) << "connection " << i << " kept open";
    close(fd);
  }
  ExpectServing("random bytes");
}

TEST_F(GarbageInputTest, Http2PrefaceThenGarbage) {
  for (int i = 0; i < 16; ++i) {
    const int fd = Connect();
    ASSERT_GE(fd, 0);
    std::string bytes = kHttp2Preface;
    if (i % 2 == 0) {
      // An empty SETTINGS frame first, so the garbage lands in frame parsing.
      bytes += std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
    }
    if (i % 4 == 1) {
      // A HEADERS frame header claiming 16 MiB, then too little payload.
      bytes += std::string("\xff\xff\xff\x01\x04\x00\x00\x00\x01", 9);
    }
    bytes += RandomBytes(random_, 1 + random_() % 4096);
    SendAll(fd, bytes);
    // Either the server closes, or it waits for the rest of a frame; both
    // are fine as long as it keeps serving others.
    (void)DrainUntilClosed(fd, absl::Milliseconds(500));
    close(fd);
  }
  ExpectServing("an HTTP/2 preface followed by garbage");
}

TEST_F(GarbageInputTest, HalfOpenConnectionsDoNotBlockOthers) {
  std::vector<int> fds;
  for (int i = 0; i < 64; ++i) {
    const int fd = Connect();
    ASSERT_GE(fd, 0);
    switch (i % 4) {
      case 0:
        break;  // Silent.
      case 1:
        SendAll(fd, absl::string_view(kHttp2Preface, 10));
        break;  // Half a preface.
      case 2:
        SendAll(fd, kHttp2Preface);
        break;  // Preface, no SETTINGS.
      case 3:
        shutdown(fd, SHUT_WR);
        break;  // Half-closed.
    }
    fds.push_back(fd);
  }
  ExpectServing("64 half-open connections (still open)");
  for (int fd : fds) close(fd);
  ExpectServing("64 half-open connections (closed)");
}

TEST_F(GarbageInputTest, OversizedMessageIsRefused) {
  auto worker = v1::WorkerService::NewStub(channel_);
  v1::KvSetRequest request;
  request.mutable_context()->set_job_id("nope");
  request.set_key("k");
  request.set_value(std::string(kMaxMessageBytes * 4, 'x'));
  v1::KvSetResponse response;
  grpc::ClientContext context;
  context.set_deadline(Deadline(kCallTimeout));
  const grpc::Status status = worker->KvSet(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  ExpectServing("an oversized message");

  // The same through JobService, whose spec is the biggest request.
  auto jobs = v1::JobService::NewStub(channel_);
  v1::SubmitJobRequest submit;
  for (int i = 0; i < 1000; ++i) submit.mutable_spec()->add_command(std::string(256, 'a'));
  v1::SubmitJobResponse submitted;
  grpc::ClientContext submit_context;
  submit_context.set_deadline(Deadline(kCallTimeout));
  const grpc::Status submit_status = jobs->SubmitJob(&submit_context, submit, &submitted);
  EXPECT_EQ(submit_status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << submit_status.error_message();
  ExpectServing("an oversized SubmitJob");
}

TEST_F(GarbageInputTest, DeeplyNestedJoinRequest) {
  for (const auto& [what, bytes] :
       {std::pair<std::string, std::string>{"nested groups", NestedGroups(10'000)},
        {"nested length-delimited", NestedLengthDelimited(10'000)}}) {
    ASSERT_LT(bytes.size(), static_cast<size_t>(kMaxMessageBytes)) << what;
    const grpc::Status status = RawCall("/mesh.v1.WorkerService/Join", bytes);
    // Refused at parsing (or, were it accepted, as a Join of no job): never
    // a crash, and never a success.
    EXPECT_FALSE(status.ok()) << what;
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << what << ": " << status.error_message();
    ExpectServing(what);
  }
}

// Every method of every service, each with every malformed message.
TEST_F(GarbageInputTest, MalformedProtobufsOnEveryMethod) {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  // Link the generated services so their descriptors are in the pool.
  (void)v1::WorkerService::service_full_name();
  (void)v1::AdminService::service_full_name();
  (void)v1::JobService::service_full_name();
  (void)v1::NodeService::service_full_name();
  const auto messages = MalformedMessages(random_);
  int calls = 0;
  for (const char* name : {"mesh.v1.WorkerService", "mesh.v1.AdminService", "mesh.v1.JobService",
                           "mesh.v1.NodeService"}) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int m = 0; m < service->method_count(); ++m) {
      const std::string method = absl::StrCat("/", name, "/", service->method(m)->name());
      for (const auto& [what, bytes] : messages) {
        const grpc::Status status = RawCall(method, bytes);
        // The server answers every call (an error, or for a method whose
        // fields all happen to parse, whatever the logic says), and never
        // with UNAVAILABLE, which would mean it went away.
        EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE)
            << method << " with " << what << ": " << status.error_message();
        ++calls;
      }
    }
    ExpectServing(absl::StrCat("malformed messages on every method of ", name));
  }
  EXPECT_GT(calls, 100);
  // An unknown method and an empty one on top.
  EXPECT_EQ(RawCall("/mesh.v1.WorkerService/NoSuchMethod", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  ExpectServing("an unknown method");
}

}  // namespace garbage_input_test
}  // namespace mesh
