#include "cli/health_command.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cli/admin_client.h"
#include "cli/meshctl.h"

namespace mesh::cli {

struct HealthCommand::Options {
  std::string service;
};

HealthCommand::HealthCommand(CLI::App& app) : options_(std::make_unique<Options>()) {
  command_ = app.add_subcommand(
      "health", "Check the coordinator's grpc.health.v1 status (exit 0 when SERVING)");
  command_->add_option("--service", options_->service,
                       "Service to ask about, e.g. mesh.v1.AdminService; default: the server");
}

HealthCommand::~HealthCommand() = default;

bool HealthCommand::Parsed() const { return command_->parsed(); }

int HealthCommand::Run(std::shared_ptr<grpc::Channel> channel, const std::string& coordinator,
                       absl::Duration timeout, OutputFormat format, std::ostream& out,
                       std::ostream& err) {
  AdminClient client(std::move(channel));
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
