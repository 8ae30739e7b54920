#include "cli/meshctl.h"

#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cli/admin_client.h"
#include "cli/output.h"
#include "common/version.h"

namespace mesh::cli {
namespace {

struct GlobalOptions {
  std::string coordinator = kDefaultCoordinator;
  double timeout_s = 5.0;
  std::string output = "table";
};

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    return kExitUnreachable;
  }
  return kExitRefused;
}

int ReportError(const GlobalOptions& options, const absl::Status& status, std::ostream& err) {
  err << "meshctl: coordinator " << options.coordinator << ": "
      << absl::StatusCodeToString(status.code()) << ": " << status.message() << "\n";
  return ExitCodeFor(status);
}

// meshctl version: this client's version, and the server's when reachable.
int RunVersion(const GlobalOptions& options, bool client_only, OutputFormat format,
               std::ostream& out, std::ostream& err) {
  nlohmann::json result;
  result["client_version"] = kVersion;
  result["protocol_version"] = kProtocolVersion;
  int code = kExitOk;
  if (!client_only) {
    AdminClient client(MakeChannel(options.coordinator));
    auto info = client.GetServerInfo(absl::Seconds(options.timeout_s));
    if (info.ok()) {
      result["server_version"] = info->version();
      result["server_protocol_version"] = info->protocol_version();
      result["server_host"] = info->hostname();
      result["server_uptime_seconds"] = info->uptime_seconds();
      result["server_features"] =
          std::vector<std::string>(info->features().begin(), info->features().end());
    } else {
      code = ReportError(options, info.status(), err);
    }
  }
  Render(result, format, out);
  return code;
}

// meshctl health: grpc.health.v1 status of the server or one service.
int RunHealth(const GlobalOptions& options, const std::string& service, OutputFormat format,
              std::ostream& out, std::ostream& err) {
  AdminClient client(MakeChannel(options.coordinator));
  auto status = client.CheckHealth(service, absl::Seconds(options.timeout_s));
  if (!status.ok()) return ReportError(options, status.status(), err);
  nlohmann::json result;
  result["coordinator"] = options.coordinator;
  result["service"] = service;
  result["status"] = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status);
  Render(result, format, out);
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk : kExitFailed;
}

}  // namespace

int RunMeshctl(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  GlobalOptions options;
  if (const char* env = std::getenv("MESH_COORDINATOR"); env != nullptr && *env != '\0') {
    options.coordinator = env;
  }

  CLI::App app{"meshctl: submit, watch and manage Mesh jobs", "meshctl"};
  app.require_subcommand(1);
  // Global options may also follow the subcommand: `meshctl health -o json`.
  app.fallthrough();
  app.set_version_flag("--version", kVersion);
  app.add_option("--coordinator", options.coordinator,
                 "Coordinator address host:port (env MESH_COORDINATOR)")
      ->capture_default_str();
  app.add_option("--timeout", options.timeout_s, "Seconds to wait for the coordinator")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  app.add_option("-o,--output", options.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}))
      ->capture_default_str();

  bool client_only = false;
  CLI::App* version = app.add_subcommand("version", "Show client and server versions");
  version->add_flag("--client", client_only, "Do not contact the coordinator");

  std::string service;
  CLI::App* health = app.add_subcommand(
      "health", "Check the coordinator's grpc.health.v1 status (exit 0 when SERVING)");
  health->add_option("--service", service,
                     "Service to ask about, e.g. mesh.v1.AdminService; default: the server");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    app.exit(e, out, err);
    return kExitOk;
  } catch (const CLI::CallForAllHelp& e) {
    app.exit(e, out, err);
    return kExitOk;
  } catch (const CLI::CallForVersion& e) {
    app.exit(e, out, err);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    app.exit(e, out, err);
    return kExitUsage;
  }

  const OutputFormat format = *ParseOutputFormat(options.output);  // Checked above.
  if (version->parsed()) return RunVersion(options, client_only, format, out, err);
  if (health->parsed()) return RunHealth(options, service, format, out, err);
  err << "meshctl: no command given\n";
  return kExitUsage;
}

}  // namespace mesh::cli
