// Transport security for every Mesh gRPC endpoint: TLS and mTLS credentials
// for servers and clients, bearer tokens for clients, and the one place that
// turns "which files and flags were given" into gRPC credentials.
//
// Server side (the coordinator):
//   - TLS: a certificate chain and its private key (PEM files).
//   - mTLS: add a client CA (PEM). Clients must then present a certificate
//     that chains to it, or the handshake fails.
//   - The files are watched (grpc::experimental::FileWatcherCertificateProvider)
//     and reloaded when they change, every `refresh_interval`, so
//     certificates rotate without a restart. New handshakes use the new
//     files; established connections keep theirs.
//
// Client side (meshctl, mesh-agent, libmesh workers, benchmarks):
//   - TLS: the CA that signed the server's certificate (PEM file).
//   - mTLS: add the client's own certificate chain and key (PEM files);
//     they are watched and reloaded like the server's.
//   - A bearer token, sent as "authorization: Bearer <token>" on every call
//     (composite channel credentials). gRPC refuses to send call credentials
//     over a channel without TLS, so a token requires a CA; asking for a
//     token without one is INVALID_ARGUMENT rather than a silent leak.
//   - Without a CA the channel is plaintext (InsecureChannelCredentials):
//     the server decides whether it accepts that (coordinator --insecure).
//
// The same settings reach worker processes through the environment
// (ClientSecurityFromEnv): the agent passes its CA, client certificate and
// the job's worker token down as MESH_TLS_CA, MESH_TLS_CERT, MESH_TLS_KEY,
// MESH_TLS_SERVER_NAME and MESH_TOKEN.
//
// Errors: INVALID_ARGUMENT for inconsistent options (a key without a
// certificate, a token without a CA); NOT_FOUND / PERMISSION_DENIED when a
// named file cannot be read at creation time (checked up front, so a typo is
// reported at start-up and not as a handshake failure later).
//
// Thread safety: the functions are thread-safe; the returned credentials are
// gRPC objects, safe to share between threads and channels.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::security {

// Environment variables of ClientSecurityFromEnv (and what the agent sets
// for its workers).
inline constexpr char kEnvTlsCa[] = "MESH_TLS_CA";
inline constexpr char kEnvTlsCert[] = "MESH_TLS_CERT";
inline constexpr char kEnvTlsKey[] = "MESH_TLS_KEY";
inline constexpr char kEnvTlsServerName[] = "MESH_TLS_SERVER_NAME";
inline constexpr char kEnvToken[] = "MESH_TOKEN";
inline constexpr char kEnvTokenFile[] = "MESH_TOKEN_FILE";

struct ServerTlsOptions {
  // PEM certificate chain and private key of the server. Both empty: no TLS.
  std::string cert_file;
  std::string key_file;
  // PEM CA bundle. Non-empty: clients must present a certificate signed by
  // it (mTLS); the handshake fails otherwise.
  std::string client_ca_file;
  // How often the files are checked for changes.
  absl::Duration refresh_interval = absl::Seconds(10);

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// Checks what MakeServerCredentials checks, without building credentials:
// that the files are given together, readable, hold PEM blocks of the
// expected kind, and that the key matches the certificate. Errors as
// MakeServerCredentials'.
absl::Status CheckServerTlsFiles(const ServerTlsOptions& options);

// TLS server credentials for `options` (which must be enabled()).
// INVALID_ARGUMENT when only one of cert_file/key_file is set, or
// client_ca_file is set without them; NOT_FOUND/PERMISSION_DENIED when a
// file cannot be read; INVALID_ARGUMENT when a file holds no PEM block of
// the expected kind.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options);

struct ClientSecurity {
  // PEM CA bundle that verifies the server. Empty: plaintext.
  std::string ca_file;
  // PEM certificate chain and key presented to the server (mTLS); both or
  // neither, and only with ca_file.
  std::string cert_file;
  std::string key_file;
  // Name checked against the server certificate instead of the target's
  // host (e.g. the certificate says "mesh-coordinator" and the target is an
  // IP address). Empty: the target's host.
  std::string server_name;
  // Bearer token sent with every call; requires ca_file.
  std::string token;
  // How often cert_file/key_file/ca_file are checked for changes.
  absl::Duration refresh_interval = absl::Seconds(10);

  bool tls() const { return !ca_file.empty(); }
};

// Checks the combination and that every named file is readable. Errors as
// in the header comment.
absl::Status ValidateClientSecurity(const ClientSecurity& security);

// Channel credentials for `security` (validated first).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& security);

// MakeChannelCredentials, then grpc::CreateCustomChannel(target, creds,
// args), with GRPC_SSL_TARGET_NAME_OVERRIDE_ARG set from server_name.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ClientSecurity& security,
                                                           grpc::ChannelArguments args = {});

// Reads a token file: its content with surrounding whitespace removed.
// NOT_FOUND/PERMISSION_DENIED when unreadable; INVALID_ARGUMENT when empty
// or when it holds more than one line.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// ClientSecurity from the environment: MESH_TLS_CA, MESH_TLS_CERT,
// MESH_TLS_KEY, MESH_TLS_SERVER_NAME, and MESH_TOKEN or (when MESH_TOKEN is
// unset) the file named by MESH_TOKEN_FILE. Unset variables leave their
// fields empty. Errors of ReadTokenFile. Does not validate.
absl::StatusOr<ClientSecurity> ClientSecurityFromEnv();

// The variables that carry `security` to a child process (the inverse of
// ClientSecurityFromEnv; the token is passed by value as MESH_TOKEN). Empty
// fields are left out. Relative file paths are made absolute against this
// process's working directory: the child usually starts in another one (an
// agent's workers run in their job's directory).
std::map<std::string, std::string> ClientSecurityEnv(const ClientSecurity& security);

}  // namespace mesh::security
