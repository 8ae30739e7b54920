// meshctl health (cli/health_command.h) in-process: against a real
// coordinator on 127.0.0.1:0, and against bare gRPC servers that serve the
// standard health service NOT_SERVING, or over TLS with a bearer-token check.
#include "cli/health_command.h"

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "cli/meshctl.h"
#include "coordinator/coordinator_server.h"
#include "tests/cli/run_meshctl.h"
#include "tests/util/in_process_coordinator.h"

namespace mesh::cli {
namespace health_command_test {

using ::testing::HasSubstr;

// Test-only PKI (P-256, valid for 100 years from 2025): a CA and a server
// certificate for DNS name "mesh-coordinator" that it signed. Never used
// outside this test.
constexpr char kCaPem[] = R"pem(-----BEGIN CERTIFICATE-----
MIIBhjCCASugAwIBAgIUN9FF9+Y/Opc6+9QOmUq2AmOr8qowCgYIKoZIzj0EAwIw
FzEVMBMGA1UEAwwMbWVzaC10ZXN0LWNhMCAXDTI2MTEyMjA3MzAxNloYDzIxMjYx
MDI5MDczMDE2WjAXMRUwEwYDVQQDDAxtZXNoLXRlc3QtY2EwWTATBgcqhkjOPQIB
BggqhkjOPQMBBwNCAASL/9qUX90bbpqGHrX7t5nlJ27WYvn4MYwtygHSDi/w35dL
rwUp2XuHK+Dzzb66bKslW4a/LqHgNHUdlTXhnWfbo1MwUTAdBgNVHQ4EFgQUOIEf
/wvMufYfezCzRM5AhLsOa5kwHwYDVR0jBBgwFoAUOIEf/wvMufYfezCzRM5AhLsO
a5kwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNJADBGAiEAv1/V8YjUABNj
hwBE7+uOv6btQS9HqN9cNEdqVLR0I90CIQClttw0LJsQAXTkSTGF4WyZngGtbe8H
xyS0pHTkv0t8+w==
-----END CERTIFICATE-----
)pem";
constexpr char kServerCertPem[] = R"pem(-----BEGIN CERTIFICATE-----
MIIBxDCCAWqgAwIBAgIUbtJMAqBxBiHUPJ16UB7+AYo6JCswCgYIKoZIzj0EAwIw
FzEVMBMGA1UEAwwMbWVzaC10ZXN0LWNhMCAXDTI2MTEyMjA3MzAxNloYDzIxMjYx
MDI5MDczMDE2WjAbMRkwFwYDVQQDDBBtZXNoLWNvb3JkaW5hdG9yMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAERtFWtRS2RxI8yiIYzHnGWv2V6KQv/Tf8L/5XwkUo
RWbYyGUDBlD1+CY/M5fbQin4P6SljbjKs+i3FLWZh3s1pKOBjTCBijAbBgNVHREE
FDASghBtZXNoLWNvb3JkaW5hdG9yMAkGA1UdEwQCMAAwCwYDVR0PBAQDAgeAMBMG
A1UdJQQMMAoGCCsGAQUFBwMBMB0GA1UdDgQWBBSPCQ8kzd+uUmIcFhw9p97sAmdc
qTAfBgNVHSMEGDAWgBQ4gR//C8y59h97MLNEzkCEuw5rmTAKBggqhkjOPQQDAgNI
ADBFAiEAlQna2B8UUaUifgy0DD7iGPYfNjTstM7qTHJm1aoB1lACIAjVIWUtVNp3
chNSXeuRyb8Q2oJOvvMcxSJ59H45j+Yb
-----END CERTIFICATE-----
)pem";
constexpr char kServerKeyPem[] = R"pem(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgu4aSBNzMOtP1dRXS
TB0PIjMy6B63ARoB+wVO2m6PCDGhRANCAARG0Va1FLZHEjzKIhjMecZa/ZXopC/9
N/wv/lfCRShFZtjIZQMGUPX4Jj8zl9tCKfg/pKWNuMqz6LcUtZmHezWk
-----END PRIVATE KEY-----
)pem";
constexpr char kToken[] = "s3cret-health-token";

// Writes `content` to a fresh file in the test's temp directory.
std::string WriteTemp(const std::string& name, const std::string& content) {
  const char* base = getenv("TEST_TMPDIR");
  const std::string path =
      absl::StrCat(base != nullptr ? base : "/tmp", "/mesh-health-", getpid(), "-", name);
  std::ofstream(path) << content;
  return path;
}

// Accepts only calls that carry "authorization: Bearer <kToken>".
class TokenChecker : public grpc::AuthMetadataProcessor {
 public:
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    auto it = metadata.find("authorization");
    if (it != metadata.end() &&
        std::string(it->second.data(), it->second.size()) == absl::StrCat("Bearer ", kToken)) {
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong token");
  }
};

// A gRPC server with only the default health service, on 127.0.0.1:0.
struct HealthOnlyServer {
  explicit HealthOnlyServer(std::shared_ptr<grpc::ServerCredentials> credentials) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", std::move(credentials), &port);
    server = builder.BuildAndStart();
  }
  ~HealthOnlyServer() { server->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }

  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

class HealthCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"MESH_COORDINATOR", "MESH_TLS_CA", "MESH_TLS_CERT", "MESH_TLS_KEY",
                             "MESH_TLS_SERVER_NAME", "MESH_TOKEN", "MESH_TOKEN_FILE"}) {
      unsetenv(name);
    }
    ca_ = WriteTemp("ca.pem", kCaPem);
  }

  std::unique_ptr<HealthOnlyServer> StartTlsServer() {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({kServerKeyPem, kServerCertPem});
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(ssl);
    credentials->SetAuthMetadataProcessor(std::make_shared<TokenChecker>());
    auto server = std::make_unique<HealthOnlyServer>(credentials);
    EXPECT_NE(server->server, nullptr);
    return server;
  }

  std::string ca_;
};

TEST_F(HealthCommandTest, ServingCoordinatorIsExit0) {
  auto server = mesh::testing::InProcessCoordinator::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const Result r =
      Meshctl({"--coordinator", (*server)->address(), "--timeout", "5", "health", "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["status"], "SERVING");
  EXPECT_EQ(json["coordinator"], (*server)->address());
  // One of the coordinator's services by name.
  EXPECT_EQ(
      Meshctl({"--coordinator", (*server)->address(), "health", "--service", "mesh.v1.JobService"})
          .code,
      kExitOk);
  // Once it is shut down the probe fails: unreachable.
  const std::string address = (*server)->address();
  (*server)->Stop(absl::ZeroDuration());
  EXPECT_EQ(Meshctl({"--coordinator", address, "--timeout", "1", "health"}).code, kExitUnreachable);
}

TEST_F(HealthCommandTest, NotServingIsExit1) {
  HealthOnlyServer server(grpc::InsecureServerCredentials());
  ASSERT_NE(server.server, nullptr);
  server.server->GetHealthCheckService()->SetServingStatus(false);
  const Result r = Meshctl({"--coordinator", server.address(), "health"});
  EXPECT_EQ(r.code, kExitFailed) << r.err;
  EXPECT_THAT(r.out, HasSubstr("NOT_SERVING"));
}

TEST_F(HealthCommandTest, TlsWithCaServerNameAndTokenIsServing) {
  auto server = StartTlsServer();
  const std::string token_file = WriteTemp("token", absl::StrCat(kToken, "\n"));
  const Result r = Meshctl({"--coordinator", server->address(), "health", "--tls-ca", ca_,
                            "--tls-server-name", "mesh-coordinator", "--token-file", token_file});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SERVING"));

  // The same from the environment, the token by value.
  setenv("MESH_TLS_CA", ca_.c_str(), 1);
  setenv("MESH_TLS_SERVER_NAME", "mesh-coordinator", 1);
  setenv("MESH_TOKEN", kToken, 1);
  const Result from_env = Meshctl({"--coordinator", server->address(), "health"});
  EXPECT_EQ(from_env.code, kExitOk) << from_env.err;
}

TEST_F(HealthCommandTest, TlsFailuresAreUnhealthy) {
  auto server = StartTlsServer();
  const std::string address = server->address();
  // Plaintext against TLS: no handshake, unreachable.
  EXPECT_EQ(Meshctl({"--coordinator", address, "--timeout", "2", "health"}).code, kExitUnreachable);
  // The certificate names mesh-coordinator, not 127.0.0.1.
  EXPECT_EQ(Meshctl({"--coordinator", address, "--timeout", "2", "health", "--tls-ca", ca_}).code,
            kExitUnreachable);
  // A wrong token is refused by the server.
  setenv("MESH_TOKEN", "wrong", 1);
  const Result wrong = Meshctl({"--coordinator", address, "health", "--tls-ca", ca_,
                                "--tls-server-name", "mesh-coordinator"});
  unsetenv("MESH_TOKEN");
  EXPECT_EQ(wrong.code, kExitRefused) << wrong.err;
  EXPECT_THAT(wrong.err, HasSubstr("UNAUTHENTICATED"));
}

TEST_F(HealthCommandTest, InconsistentOrMissingTlsFilesAreUsageErrors) {
  const std::string unused = "127.0.0.1:1";
  const Result no_key =
      Meshctl({"--coordinator", unused, "health", "--tls-ca", ca_, "--tls-cert", ca_});
  EXPECT_EQ(no_key.code, kExitUsage);
  EXPECT_THAT(no_key.err, HasSubstr("--tls-key"));

  const Result cert_without_ca =
      Meshctl({"--coordinator", unused, "health", "--tls-cert", ca_, "--tls-key", ca_});
  EXPECT_EQ(cert_without_ca.code, kExitUsage);
  EXPECT_THAT(cert_without_ca.err, HasSubstr("--tls-ca"));

  setenv("MESH_TOKEN", kToken, 1);
  const Result token_without_ca = Meshctl({"--coordinator", unused, "health"});
  unsetenv("MESH_TOKEN");
  EXPECT_EQ(token_without_ca.code, kExitUsage);
  EXPECT_THAT(token_without_ca.err, HasSubstr("plaintext"));

  const Result missing_ca =
      Meshctl({"--coordinator", unused, "health", "--tls-ca", "/nonexistent/ca.pem"});
  EXPECT_EQ(missing_ca.code, kExitUsage);
  EXPECT_THAT(missing_ca.err, HasSubstr("/nonexistent/ca.pem"));

  const Result missing_token = Meshctl(
      {"--coordinator", unused, "health", "--tls-ca", ca_, "--token-file", "/nonexistent/t"});
  EXPECT_EQ(missing_token.code, kExitUsage);
  EXPECT_THAT(missing_token.err, HasSubstr("/nonexistent/t"));
}

}  // namespace health_command_test
}  // namespace mesh::cli
