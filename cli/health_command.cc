#include "cli/health_command.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cli/admin_client.h"
#include "cli/meshctl.h"

namespace mesh::cli {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " file '", path, "'"));
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

absl::Status Validate(const security::ClientSecurity& s) {
  if (s.cert_file.empty() != s.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both (mTLS) or neither");
  }
  if (!s.tls() && !s.cert_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert/--tls-key need --tls-ca (the server's CA)");
  }
  if (!s.tls() && !s.token.empty()) {
    // gRPC would refuse to send it; saying so beats a confusing failure.
    return absl::InvalidArgumentError(
        "a token (MESH_TOKEN or --token-file) needs --tls-ca: tokens are never sent in "
        "plaintext");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeHealthChannel(
    const std::string& target, const security::ClientSecurity& security) {
  if (absl::Status s = Validate(security); !s.ok()) return s;
  if (!security.tls()) return MakeChannel(target);
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadFile("--tls-ca", security.ca_file);
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *std::move(ca);
  if (!security.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile("--tls-cert", security.cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile("--tls-key", security.key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (!security.token.empty()) {
    credentials = grpc::CompositeChannelCredentials(credentials,
                                                    grpc::AccessTokenCredentials(security.token));
  }
  grpc::ChannelArguments args;
  if (!security.server_name.empty()) {
    args.SetSslTargetNameOverride(security.server_name);
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

struct HealthCommand::Options {
  std::string service;
  security::ClientSecurity security;
  std::string token_file;
};

HealthCommand::HealthCommand(CLI::App& app) : options_(std::make_unique<Options>()) {
  command_ = app.add_subcommand(
      "health", "Check the coordinator's grpc.health.v1 status (exit 0 when SERVING)");
  command_->add_option("--service", options_->service,
                       "Service to ask about, e.g. mesh.v1.AdminService; default: the server");
  command_
      ->add_option("--tls-ca", options_->security.ca_file,
                   "PEM CA that signed the coordinator's certificate; enables TLS")
      ->envname("MESH_TLS_CA");
  command_
      ->add_option("--tls-cert", options_->security.cert_file,
                   "PEM client certificate for mTLS (with --tls-key)")
      ->envname("MESH_TLS_CERT");
  command_->add_option("--tls-key", options_->security.key_file, "PEM key of --tls-cert")
      ->envname("MESH_TLS_KEY");
  command_
      ->add_option("--tls-server-name", options_->security.server_name,
                   "Name to expect in the coordinator's certificate instead of the host")
      ->envname("MESH_TLS_SERVER_NAME");
  command_
      ->add_option("--token-file", options_->token_file,
                   "File holding a bearer token (else env MESH_TOKEN)")
      ->envname("MESH_TOKEN_FILE");
}

HealthCommand::~HealthCommand() = default;

bool HealthCommand::Parsed() const { return command_->parsed(); }

int HealthCommand::Run(const std::string& coordinator, absl::Duration timeout, OutputFormat format,
                       std::ostream& out, std::ostream& err) {
  security::ClientSecurity security = options_->security;
  if (!options_->token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFile("--token-file", options_->token_file);
    if (!token.ok()) {
      err << "meshctl health: " << token.status().message() << "\n";
      return kExitUsage;
    }
    security.token = std::string(absl::StripAsciiWhitespace(*token));
  } else if (const char* env = std::getenv("MESH_TOKEN"); env != nullptr) {
    security.token = env;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeHealthChannel(coordinator, security);
  if (!channel.ok()) {
    err << "meshctl health: " << channel.status().message() << "\n";
    return kExitUsage;
  }
  AdminClient client(*std::move(channel));
  auto status = client.CheckHealth(options_->service, timeout);
  if (!status.ok()) {
    err << "meshctl: coordinator " << coordinator << ": "
        << absl::StatusCodeToString(status.status().code()) << ": " << status.status().message()
        << "\n";
    return absl::IsUnavailable(status.status()) || absl::IsDeadlineExceeded(status.status())
               ? kExitUnreachable
               : kExitRefused;
  }
  nlohmann::json result;
  result["coordinator"] = coordinator;
  result["service"] = options_->service;
  result["status"] = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status);
  Render(result, format, out);
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk : kExitFailed;
}

}  // namespace mesh::cli
