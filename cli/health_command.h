// meshctl health: one grpc.health.v1 Check against the coordinator, with a
// deadline, for people, scripts and probes (Docker HEALTHCHECK, Kubernetes
// exec probes, which cannot speak TLS themselves; deploy/, docs/deploy.md).
//
//   meshctl [--coordinator host:port] [--timeout s] [security flags] health
//           [--service NAME]
//
// The security flags are meshctl's global ones (common/client_flags.h), so a
// probe passes the same --tls-ca/--tls-cert/--tls-key/--token-file (or
// MESH_* variables) as any other command.
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

#include "absl/time/time.h"
#include "cli/output.h"

namespace CLI {
class App;
}  // namespace CLI

namespace mesh::cli {

class HealthCommand {
 public:
  // Adds the "health" subcommand to `app`, which must outlive this object.
  explicit HealthCommand(CLI::App& app);
  ~HealthCommand();

  // True when the parsed command line named `health`.
  bool Parsed() const;

  // Runs the check over `channel` (to `coordinator`, named in messages)
  // with deadline `timeout`; returns meshctl's exit code (above).
  int Run(std::shared_ptr<grpc::Channel> channel, const std::string& coordinator,
          absl::Duration timeout, OutputFormat format, std::ostream& out, std::ostream& err);

  struct Options;  // The parsed flags (health_command.cc).

 private:
  CLI::App* command_;
  std::unique_ptr<Options> options_;
};

}  // namespace mesh::cli
