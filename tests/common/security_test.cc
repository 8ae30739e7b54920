// common/security.h end to end: real gRPC servers on 127.0.0.1:0 with the
// credentials it makes, real calls (each with a deadline) from channels it
// makes, certificates from tests/util/test_pki.h (the openssl CLI).
#include "common/security.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "tests/util/test_pki.h"

namespace mesh::security {
namespace security_test {

using ::mesh::testing::TestPki;
using ::testing::HasSubstr;

constexpr absl::Duration kCallTimeout = absl::Seconds(5);
constexpr absl::Duration kReloadTimeout = absl::Seconds(20);

// GetServerInfo answers "security-test" and records what the server saw of
// the caller: its authorization header and its certificate's common name.
class RecordingAdminService final : public mesh::v1::AdminService::CallbackService {
 public:
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const mesh::v1::GetServerInfoRequest*,
                                          mesh::v1::GetServerInfoResponse* response) override {
    std::string authorization;
    const auto& metadata = context->client_metadata();
    if (auto it = metadata.find("authorization"); it != metadata.end()) {
      authorization.assign(it->second.data(), it->second.size());
    }
    std::string common_name;
    if (std::shared_ptr<const grpc::AuthContext> auth = context->auth_context()) {
      for (const grpc::string_ref& value : auth->FindPropertyValues("x509_common_name")) {
        common_name.assign(value.data(), value.size());
      }
    }
    {
      absl::MutexLock lock(&mu_);
      last_authorization_ = authorization;
      last_common_name_ = common_name;
    }
    response->set_version("security-test");
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  std::string last_authorization() {
    absl::MutexLock lock(&mu_);
    return last_authorization_;
  }
  std::string last_common_name() {
    absl::MutexLock lock(&mu_);
    return last_common_name_;
  }

 private:
  absl::Mutex mu_;
  std::string last_authorization_ ABSL_GUARDED_BY(mu_);
  std::string last_common_name_ ABSL_GUARDED_BY(mu_);
};

// A server on 127.0.0.1:0 with `credentials`; shut down (with a deadline)
// when destroyed.
class TestServer {
 public:
  explicit TestServer(std::shared_ptr<grpc::ServerCredentials> credentials) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", std::move(credentials), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~TestServer() {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  }

  bool ok() const { return server_ != nullptr && port_ > 0; }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  RecordingAdminService& service() { return service_; }

 private:
  RecordingAdminService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = mesh::v1::AdminService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  mesh::v1::GetServerInfoRequest request;
  mesh::v1::GetServerInfoResponse response;
  grpc::Status status = stub->GetServerInfo(&context, request, &response);
  if (status.ok() && response.version() != "security-test") {
    return grpc::Status(grpc::StatusCode::INTERNAL, "unexpected reply " + response.version());
  }
  return status;
}

// Call over a fresh channel made by MakeChannel.
grpc::Status CallWith(const std::string& target, const ClientSecurity& security) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(target, security);
  if (!channel.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "MakeChannel: " + channel.status().ToString());
  }
  return Call(*channel);
}

// Calls `call` until it succeeds or `timeout` has passed; returns the last
// status. 100 ms between tries keeps gRPC's log of failed handshakes short.
template <typename F>
grpc::Status RetryUntilOk(F call, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  grpc::Status status = call();
  while (!status.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    status = call();
  }
  return status;
}

std::string Describe(const grpc::Status& status) {
  return absl::StrCat("code ", status.error_code(), ": ", status.error_message());
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Replaces `path` with `from`'s content in one rename, so that the file
// watcher never reads half a file.
void ReplaceFile(const std::string& from, const std::string& path) {
  const std::string temp = path + ".tmp";
  WriteFile(temp, ReadFile(from));
  ASSERT_EQ(::rename(temp.c_str(), path.c_str()), 0) << path;
}

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    Set(value);
  }
  ~ScopedEnv() { Set(old_); }

 private:
  void Set(const std::optional<std::string>& value) {
    if (value.has_value()) {
      ::setenv(name_, value->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  const char* name_;
  std::optional<std::string> old_;
};

class SecurityTest : public ::testing::Test {
 protected:
  // One PKI for the whole suite: it is read-only for the tests (the reload
  // test copies what it overwrites).
  static void SetUpTestSuite() {
    if (!mesh::testing::HaveOpenssl()) return;
    std::string tmpl = ::testing::TempDir() + "security_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    suite_dir_ = new std::string(tmpl);
    absl::StatusOr<TestPki> pki = mesh::testing::MakeTestPki(*suite_dir_ + "/pki");
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = new TestPki(*pki);
  }
  static void TearDownTestSuite() {
    if (suite_dir_ != nullptr) std::filesystem::remove_all(*suite_dir_);
    delete suite_dir_;
    delete pki_;
    suite_dir_ = nullptr;
    pki_ = nullptr;
  }

  void SetUp() override {
    if (!mesh::testing::HaveOpenssl()) {
      GTEST_SKIP() << "the openssl binary is not on PATH; it makes the test certificates";
    }
    ASSERT_NE(pki_, nullptr) << "MakeTestPki failed in SetUpTestSuite";
    dir_ = absl::StrCat(*suite_dir_, "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }

  const TestPki& pki() const { return *pki_; }

  std::unique_ptr<TestServer> StartServer(const ServerTlsOptions& options) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        MakeServerCredentials(options);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    if (!credentials.ok()) return nullptr;
    auto server = std::make_unique<TestServer>(*credentials);
    EXPECT_TRUE(server->ok());
    return server;
  }
  ServerTlsOptions Tls() const {
    ServerTlsOptions options;
    options.cert_file = pki().server_cert;
    options.key_file = pki().server_key;
    return options;
  }
  ServerTlsOptions Mtls() const {
    ServerTlsOptions options = Tls();
    options.client_ca_file = pki().ca_cert;
    return options;
  }
  ClientSecurity Client(const std::string& ca) const {
    ClientSecurity security;
    security.ca_file = ca;
    return security;
  }
  ClientSecurity Client(const std::string& ca, const std::string& cert,
                        const std::string& key) const {
    ClientSecurity security = Client(ca);
    security.cert_file = cert;
    security.key_file = key;
    return security;
  }

  static std::string* suite_dir_;
  static TestPki* pki_;
  std::string dir_;
};

std::string* SecurityTest::suite_dir_ = nullptr;
TestPki* SecurityTest::pki_ = nullptr;

// ---- TLS --------------------------------------------------------------------------

TEST_F(SecurityTest, TlsClientWithTheRightCaSucceeds) {
  auto server = StartServer(Tls());
  ASSERT_NE(server, nullptr);
  grpc::Status status = CallWith(server->target(), Client(pki().ca_cert));
  EXPECT_TRUE(status.ok()) << Describe(status);
  // No client certificate was asked for.
  EXPECT_EQ(server->service().last_common_name(), "");
}

TEST_F(SecurityTest, TlsClientWithAnotherCaFailsTheHandshake) {
  auto server = StartServer(Tls());
  ASSERT_NE(server, nullptr);
  grpc::Status status = CallWith(server->target(), Client(pki().other_ca_cert));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
}

TEST_F(SecurityTest, PlaintextClientToTlsServerFails) {
  auto server = StartServer(Tls());
  ASSERT_NE(server, nullptr);
  grpc::Status status = CallWith(server->target(), ClientSecurity{});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
}

TEST_F(SecurityTest, TlsClientToPlaintextServerFails) {
  TestServer server(grpc::InsecureServerCredentials());
  ASSERT_TRUE(server.ok());
  EXPECT_TRUE(CallWith(server.target(), ClientSecurity{}).ok());
  grpc::Status status = CallWith(server.target(), Client(pki().ca_cert));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
}

TEST_F(SecurityTest, ServerNameOverridesTheTargetHost) {
  auto server = StartServer(Tls());
  ASSERT_NE(server, nullptr);
  ClientSecurity security = Client(pki().ca_cert);
  security.server_name = "localhost";  // in the certificate's SAN
  grpc::Status status = CallWith(server->target(), security);
  EXPECT_TRUE(status.ok()) << Describe(status);

  // A name the certificate does not hold fails, although the chain is good:
  // the host name is checked, not only the CA.
  security.server_name = "mesh-coordinator.example";
  status = CallWith(server->target(), security);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
}

// ---- mTLS -------------------------------------------------------------------------

TEST_F(SecurityTest, MtlsClientWithTheRightCertificateSucceeds) {
  auto server = StartServer(Mtls());
  ASSERT_NE(server, nullptr);
  grpc::Status status =
      CallWith(server->target(), Client(pki().ca_cert, pki().client_cert, pki().client_key));
  EXPECT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(server->service().last_common_name(), "mesh-test-client");
}

TEST_F(SecurityTest, MtlsClientWithoutACertificateFails) {
  auto server = StartServer(Mtls());
  ASSERT_NE(server, nullptr);
  grpc::Status status = CallWith(server->target(), Client(pki().ca_cert));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
}

TEST_F(SecurityTest, MtlsClientCertificateFromAnotherCaFails) {
  auto server = StartServer(Mtls());
  ASSERT_NE(server, nullptr);
  grpc::Status status = CallWith(
      server->target(), Client(pki().ca_cert, pki().other_client_cert, pki().other_client_key));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
}

TEST_F(SecurityTest, MtlsExpiredClientCertificateFails) {
  auto server = StartServer(Mtls());
  ASSERT_NE(server, nullptr);
  grpc::Status status = CallWith(
      server->target(), Client(pki().ca_cert, pki().expired_client_cert, pki().expired_client_key));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
}

// ---- Token ------------------------------------------------------------------------

TEST_F(SecurityTest, TokenArrivesAsBearerAuthorization) {
  auto server = StartServer(Tls());
  ASSERT_NE(server, nullptr);
  ClientSecurity security = Client(pki().ca_cert);
  security.token = "s3cr3t-token.value";
  grpc::Status status = CallWith(server->target(), security);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(server->service().last_authorization(), "Bearer s3cr3t-token.value");

  // And none without a token.
  status = CallWith(server->target(), Client(pki().ca_cert));
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(server->service().last_authorization(), "");
}

TEST_F(SecurityTest, TokenWithMtls) {
  auto server = StartServer(Mtls());
  ASSERT_NE(server, nullptr);
  ClientSecurity security = Client(pki().ca_cert, pki().client_cert, pki().client_key);
  security.token = "worker-token";
  grpc::Status status = CallWith(server->target(), security);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(server->service().last_authorization(), "Bearer worker-token");
  EXPECT_EQ(server->service().last_common_name(), "mesh-test-client");
}

TEST_F(SecurityTest, TokenWithoutCaIsInvalidArgument) {
  ClientSecurity security;
  security.token = "t";
  EXPECT_EQ(ValidateClientSecurity(security).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeChannelCredentials(security).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel("127.0.0.1:1", security);
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(channel.status().message(), HasSubstr("token"));
}

TEST_F(SecurityTest, TokenThatCannotBeAHeaderValueIsInvalidArgument) {
  ClientSecurity security = Client(pki().ca_cert);
  security.token = "two\nlines";
  EXPECT_EQ(ValidateClientSecurity(security).code(), absl::StatusCode::kInvalidArgument);
  security.token = "with space";
  EXPECT_EQ(ValidateClientSecurity(security).code(), absl::StatusCode::kInvalidArgument);
}

// ---- Reload -----------------------------------------------------------------------

TEST_F(SecurityTest, ServerPicksUpRotatedCertificates) {
  const std::string cert = dir_ + "/server.pem";
  const std::string key = dir_ + "/server.key";
  ReplaceFile(pki().server_cert, cert);
  ReplaceFile(pki().server_key, key);
  ServerTlsOptions options;
  options.cert_file = cert;
  options.key_file = key;
  options.refresh_interval = absl::Seconds(1);
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  grpc::Status status = CallWith(server->target(), Client(pki().ca_cert));
  ASSERT_TRUE(status.ok()) << Describe(status);
  status = CallWith(server->target(), Client(pki().other_ca_cert));
  ASSERT_FALSE(status.ok());

  // Two renames are not one atomic step: a refresh in between may see a key
  // that does not match the certificate, which the next refresh corrects.
  ReplaceFile(pki().other_server_key, key);
  ReplaceFile(pki().other_server_cert, cert);
  status = RetryUntilOk([&] { return CallWith(server->target(), Client(pki().other_ca_cert)); },
                        kReloadTimeout);
  EXPECT_TRUE(status.ok()) << "a channel trusting the second CA still fails after "
                           << kReloadTimeout << ": " << Describe(status);
  // New handshakes no longer get the old certificate.
  status = CallWith(server->target(), Client(pki().ca_cert));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
}

TEST_F(SecurityTest, ClientPicksUpARotatedCa) {
  auto server = StartServer(Tls());
  ASSERT_NE(server, nullptr);
  const std::string ca = dir_ + "/ca.pem";
  ReplaceFile(pki().other_ca_cert, ca);
  ClientSecurity security = Client(ca);
  security.refresh_interval = absl::Seconds(1);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(security);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto channel = [&] { return grpc::CreateChannel(server->target(), *credentials); };
  ASSERT_FALSE(Call(channel()).ok());

  // Same credentials object, new channels: the CA file is re-read.
  ReplaceFile(pki().ca_cert, ca);
  grpc::Status status = RetryUntilOk([&] { return Call(channel()); }, kReloadTimeout);
  EXPECT_TRUE(status.ok()) << "a channel from the same credentials still fails after "
                           << kReloadTimeout << ": " << Describe(status);
}

// ---- Validation -------------------------------------------------------------------

TEST_F(SecurityTest, ServerOptionsValidation) {
  const std::string not_pem = dir_ + "/not_pem.txt";
  WriteFile(not_pem, "hello, I am not a certificate\n");
  const std::string missing = dir_ + "/missing.pem";

  auto code = [](const ServerTlsOptions& options) {
    return MakeServerCredentials(options).status().code();
  };
  ServerTlsOptions options;
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument) << "nothing given";

  options = Tls();
  options.cert_file.clear();
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument) << "key without cert";
  options = Tls();
  options.key_file.clear();
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument) << "cert without key";
  options = ServerTlsOptions{};
  options.client_ca_file = pki().ca_cert;
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument) << "client CA alone";

  options = Tls();
  options.cert_file = missing;
  absl::Status status = MakeServerCredentials(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr(missing));
  options = Tls();
  options.key_file = missing;
  EXPECT_EQ(code(options), absl::StatusCode::kNotFound);
  options = Mtls();
  options.client_ca_file = missing;
  EXPECT_EQ(code(options), absl::StatusCode::kNotFound);

  options = Tls();
  options.cert_file = not_pem;
  status = MakeServerCredentials(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(not_pem));
  options = Tls();
  options.key_file = not_pem;
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);
  options = Tls();  // swapped: a key is no certificate and the other way round
  std::swap(options.cert_file, options.key_file);
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);
  options = Mtls();
  options.client_ca_file = not_pem;
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);
  options = Tls();
  options.cert_file = dir_;  // a directory
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(MakeServerCredentials(Tls()).ok());
  EXPECT_TRUE(MakeServerCredentials(Mtls()).ok());
}

// gRPC itself would accept these and fail every handshake later.
TEST_F(SecurityTest, BrokenOrMismatchedPemIsInvalidArgument) {
  const std::string garbage = dir_ + "/garbage.pem";
  WriteFile(garbage, "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n");
  const std::string garbage_key = dir_ + "/garbage.key";
  WriteFile(garbage_key, "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n");

  ServerTlsOptions options = Tls();
  options.key_file = pki().other_server_key;  // a real key, of another certificate
  absl::Status status = MakeServerCredentials(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("does not belong"));
  options = Tls();
  options.cert_file = garbage;
  EXPECT_EQ(MakeServerCredentials(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Tls();
  options.key_file = garbage_key;
  EXPECT_EQ(MakeServerCredentials(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Mtls();
  options.client_ca_file = garbage;
  EXPECT_EQ(MakeServerCredentials(options).status().code(), absl::StatusCode::kInvalidArgument);

  status = ValidateClientSecurity(Client(pki().ca_cert, pki().client_cert, pki().other_client_key));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("does not belong"));
  EXPECT_EQ(ValidateClientSecurity(Client(garbage)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateClientSecurity(Client(pki().ca_cert, garbage, pki().client_key)).code(),
            absl::StatusCode::kInvalidArgument);

  // The error queue is left clean: a good server and client still work.
  auto server = StartServer(Mtls());
  ASSERT_NE(server, nullptr);
  grpc::Status call =
      CallWith(server->target(), Client(pki().ca_cert, pki().client_cert, pki().client_key));
  EXPECT_TRUE(call.ok()) << Describe(call);
}

TEST_F(SecurityTest, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  const std::string cert = dir_ + "/unreadable.pem";
  ReplaceFile(pki().server_cert, cert);
  ASSERT_EQ(::chmod(cert.c_str(), 0), 0);
  ServerTlsOptions options = Tls();
  options.cert_file = cert;
  EXPECT_EQ(MakeServerCredentials(options).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ValidateClientSecurity(Client(cert)).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(SecurityTest, ClientOptionsValidation) {
  const std::string not_pem = dir_ + "/not_pem.txt";
  WriteFile(not_pem, "-----BEGIN SOMETHING ELSE-----\n");
  const std::string missing = dir_ + "/missing.pem";

  EXPECT_TRUE(ValidateClientSecurity(ClientSecurity{}).ok());
  EXPECT_TRUE(ValidateClientSecurity(Client(pki().ca_cert)).ok());
  EXPECT_TRUE(
      ValidateClientSecurity(Client(pki().ca_cert, pki().client_cert, pki().client_key)).ok());

  auto code = [](const ClientSecurity& security) {
    return ValidateClientSecurity(security).code();
  };
  EXPECT_EQ(code(Client(pki().ca_cert, "", pki().client_key)), absl::StatusCode::kInvalidArgument)
      << "key without cert";
  EXPECT_EQ(code(Client(pki().ca_cert, pki().client_cert, "")), absl::StatusCode::kInvalidArgument)
      << "cert without key";
  EXPECT_EQ(code(Client("", pki().client_cert, pki().client_key)),
            absl::StatusCode::kInvalidArgument)
      << "mTLS without CA";
  ClientSecurity name_only;
  name_only.server_name = "localhost";
  EXPECT_EQ(code(name_only), absl::StatusCode::kInvalidArgument) << "server name without CA";

  EXPECT_EQ(code(Client(missing)), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(Client(pki().ca_cert, missing, pki().client_key)), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(Client(pki().ca_cert, pki().client_cert, missing)), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(Client(not_pem)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Client(pki().ca_cert, not_pem, pki().client_key)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Client(pki().ca_cert, pki().client_cert, not_pem)),
            absl::StatusCode::kInvalidArgument);

  // MakeChannelCredentials and MakeChannel validate first.
  EXPECT_EQ(MakeChannelCredentials(Client(missing)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MakeChannel("127.0.0.1:1", Client(not_pem)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Token files and the environment ----------------------------------------------

TEST_F(SecurityTest, ReadTokenFile) {
  const std::string path = dir_ + "/token";
  WriteFile(path, "  abc.def-123\n");
  absl::StatusOr<std::string> token = ReadTokenFile(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "abc.def-123");

  WriteFile(path, "abc\r\n");
  token = ReadTokenFile(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "abc");

  WriteFile(path, "first\nsecond\n");
  EXPECT_EQ(ReadTokenFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  WriteFile(path, " \n\t\n");
  EXPECT_EQ(ReadTokenFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadTokenFile(dir_ + "/no-such-token").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SecurityTest, ClientSecurityFromEnvReadsEveryVariable) {
  ScopedEnv ca(kEnvTlsCa, "/etc/mesh/ca.pem");
  ScopedEnv cert(kEnvTlsCert, "/etc/mesh/client.pem");
  ScopedEnv key(kEnvTlsKey, "/etc/mesh/client.key");
  ScopedEnv name(kEnvTlsServerName, "mesh-coordinator");
  ScopedEnv token(kEnvToken, "tok-1");
  ScopedEnv token_file(kEnvTokenFile, std::nullopt);
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromEnv();
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_EQ(security->ca_file, "/etc/mesh/ca.pem");
  EXPECT_EQ(security->cert_file, "/etc/mesh/client.pem");
  EXPECT_EQ(security->key_file, "/etc/mesh/client.key");
  EXPECT_EQ(security->server_name, "mesh-coordinator");
  EXPECT_EQ(security->token, "tok-1");
}

TEST_F(SecurityTest, ClientSecurityFromEnvWithNothingSet) {
  ScopedEnv ca(kEnvTlsCa, std::nullopt);
  ScopedEnv cert(kEnvTlsCert, std::nullopt);
  ScopedEnv key(kEnvTlsKey, std::nullopt);
  ScopedEnv name(kEnvTlsServerName, std::nullopt);
  ScopedEnv token(kEnvToken, std::nullopt);
  ScopedEnv token_file(kEnvTokenFile, std::nullopt);
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromEnv();
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_FALSE(security->tls());
  EXPECT_EQ(security->cert_file, "");
  EXPECT_EQ(security->key_file, "");
  EXPECT_EQ(security->server_name, "");
  EXPECT_EQ(security->token, "");
  EXPECT_TRUE(ClientSecurityEnv(*security).empty());
}

TEST_F(SecurityTest, ClientSecurityEnvRoundTrip) {
  ClientSecurity original = Client(pki().ca_cert, pki().client_cert, pki().client_key);
  original.server_name = "localhost";
  original.token = "round-trip";
  const std::map<std::string, std::string> env = ClientSecurityEnv(original);
  EXPECT_EQ(env, (std::map<std::string, std::string>{{kEnvTlsCa, pki().ca_cert},
                                                     {kEnvTlsCert, pki().client_cert},
                                                     {kEnvTlsKey, pki().client_key},
                                                     {kEnvTlsServerName, "localhost"},
                                                     {kEnvToken, "round-trip"}}));

  auto value = [&env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  ScopedEnv ca(kEnvTlsCa, value(kEnvTlsCa));
  ScopedEnv cert(kEnvTlsCert, value(kEnvTlsCert));
  ScopedEnv key(kEnvTlsKey, value(kEnvTlsKey));
  ScopedEnv name(kEnvTlsServerName, value(kEnvTlsServerName));
  ScopedEnv token(kEnvToken, value(kEnvToken));
  ScopedEnv token_file(kEnvTokenFile, std::nullopt);
  absl::StatusOr<ClientSecurity> back = ClientSecurityFromEnv();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ca_file, original.ca_file);
  EXPECT_EQ(back->cert_file, original.cert_file);
  EXPECT_EQ(back->key_file, original.key_file);
  EXPECT_EQ(back->server_name, original.server_name);
  EXPECT_EQ(back->token, original.token);

  // What a worker would do with it: a working mTLS + token channel.
  auto server = StartServer(Mtls());
  ASSERT_NE(server, nullptr);
  grpc::Status status = CallWith(server->target(), *back);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(server->service().last_authorization(), "Bearer round-trip");
}

// Regression: an agent started with relative --tls-* paths passed them to
// its workers as they were, and the workers, which start in their job's
// directory, could not find them.
TEST_F(SecurityTest, ClientSecurityEnvMakesRelativePathsAbsolute) {
  ClientSecurity relative;
  relative.ca_file = "certs/ca.pem";
  relative.cert_file = "client.pem";
  relative.key_file = "/etc/mesh/client.key";
  const std::string cwd = std::filesystem::current_path().string();
  const std::map<std::string, std::string> env = ClientSecurityEnv(relative);
  EXPECT_EQ(env.at(kEnvTlsCa), cwd + "/certs/ca.pem");
  EXPECT_EQ(env.at(kEnvTlsCert), cwd + "/client.pem");
  EXPECT_EQ(env.at(kEnvTlsKey), "/etc/mesh/client.key");
}

TEST_F(SecurityTest, TokenFileFromEnv) {
  const std::string path = dir_ + "/token";
  WriteFile(path, "from-file\n");
  ScopedEnv ca(kEnvTlsCa, std::nullopt);
  ScopedEnv token(kEnvToken, std::nullopt);
  ScopedEnv token_file(kEnvTokenFile, path);
  absl::StatusOr<ClientSecurity> security = ClientSecurityFromEnv();
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_EQ(security->token, "from-file");

  {
    // MESH_TOKEN wins over MESH_TOKEN_FILE.
    ScopedEnv direct(kEnvToken, "direct");
    security = ClientSecurityFromEnv();
    ASSERT_TRUE(security.ok()) << security.status();
    EXPECT_EQ(security->token, "direct");
  }

  WriteFile(path, "line one\nline two\n");
  EXPECT_EQ(ClientSecurityFromEnv().status().code(), absl::StatusCode::kInvalidArgument);
  ScopedEnv missing(kEnvTokenFile, dir_ + "/no-such-token");
  EXPECT_EQ(ClientSecurityFromEnv().status().code(), absl::StatusCode::kNotFound);
}

}  // namespace security_test
}  // namespace mesh::security
