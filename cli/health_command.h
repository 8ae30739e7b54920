// meshctl health: one grpc.health.v1 Check against the coordinator, with a
// deadline, for people, scripts and probes (Docker HEALTHCHECK, Kubernetes
// exec probes, which cannot speak TLS themselves; deploy/, docs/deploy.md).
//
//   meshctl [--coordinator host:port] [--timeout s] health [--service NAME]
//           [--tls-ca FILE [--tls-cert FILE --tls-key FILE]
//            [--tls-server-name NAME] [--token-file FILE]]
//
// The TLS flags also come from MESH_TLS_CA, MESH_TLS_CERT, MESH_TLS_KEY,
// MESH_TLS_SERVER_NAME, MESH_TOKEN_FILE, and the token from MESH_TOKEN (the
// names of common/security.h, shared with mesh-agent).
//
// Exit codes (cli/meshctl.h): 0 SERVING; 1 any other serving status
// (NOT_SERVING while the coordinator drains on shutdown); 2 usage error,
// including inconsistent or unreadable TLS files; 3 unreachable (includes a
// failed TLS handshake) or deadline exceeded; 4 refused (NOT_FOUND for an
// unknown --service, UNAUTHENTICATED, ...). Probes treat every non-zero
// code as unhealthy.
//
// Thread safety: as RunMeshctl; a HealthCommand belongs to one parse.
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/output.h"
#include "common/security.h"

namespace CLI {
class App;
}  // namespace CLI

namespace mesh::cli {

// The channel `meshctl health` checks over. Without security.ca_file: a
// plaintext channel. With it: TLS verified against that CA, the client
// certificate when both cert_file and key_file are set (mTLS), the server
// name override, and security.token as a bearer token.
//
// Possible errors: INVALID_ARGUMENT for an inconsistent combination (a key
// without a certificate, a certificate or token without a CA); NOT_FOUND
// when a named file cannot be read. Checked before dialing, so a typo is
// reported as such and not as a handshake failure.
//
// This is the one place to switch to common/security.h's MakeChannel once
// that exists; its contract is the same.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeHealthChannel(
    const std::string& target, const security::ClientSecurity& security);

class HealthCommand {
 public:
  // Adds the "health" subcommand to `app`, which must outlive this object.
  explicit HealthCommand(CLI::App& app);
  ~HealthCommand();

  // True when the parsed command line named `health`.
  bool Parsed() const;

  // Runs the check against `coordinator` with deadline `timeout`; returns
  // meshctl's exit code (above).
  int Run(const std::string& coordinator, absl::Duration timeout, OutputFormat format,
          std::ostream& out, std::ostream& err);

  struct Options;  // The parsed flags (health_command.cc).

 private:
  CLI::App* command_;
  std::unique_ptr<Options> options_;
};

}  // namespace mesh::cli
