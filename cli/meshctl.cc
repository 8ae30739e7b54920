#include "cli/meshctl.h"

#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cli/admin_client.h"
#include "cli/cluster.h"
#include "cli/coordinator_errors.h"
#include "cli/health_command.h"
#include "cli/job_commands.h"
#include "cli/output.h"
#include "common/client_flags.h"
#include "common/coordinator_targets.h"
#include "common/version.h"

namespace mesh::cli {
namespace {

struct GlobalOptions {
  std::string coordinator = kDefaultCoordinator;
  ClientSecurityFlags security;
  // Made once the flags are parsed.
  std::shared_ptr<grpc::Channel> channel;
  double timeout_s = 5.0;
  std::string output = "table";
};

int ReportError(const GlobalOptions& options, const absl::Status& status, std::ostream& err) {
  err << DescribeCoordinatorError(options.coordinator, status) << "\n";
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
    AdminClient client(options.channel);
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

// meshctl create-job: a bare job record for workers started by hand (or by
// a script), until `meshctl submit` and the agents launch them.
int RunCreateJob(const GlobalOptions& options, const mesh::v1::CreateJobRequest& request,
                 OutputFormat format, std::ostream& out, std::ostream& err) {
  AdminClient client(options.channel);
  auto created = client.CreateJob(request, absl::Seconds(options.timeout_s));
  if (!created.ok()) return ReportError(options, created.status(), err);
  nlohmann::json result;
  result["job_id"] = created->job_id();
  result["generation"] = created->generation();
  result["world_size"] = request.world_size();
  Render(result, format, out);
  return kExitOk;
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
                 "Coordinator address host:port, or the replicas' addresses separated by commas "
                 "(env MESH_COORDINATOR)")
      ->capture_default_str();
  options.security.AddTo(app);
  app.add_option("--timeout", options.timeout_s, "Seconds to wait for the coordinator")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  app.add_option("-o,--output", options.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}))
      ->capture_default_str();

  bool client_only = false;
  CLI::App* version = app.add_subcommand("version", "Show client and server versions");
  version->add_flag("--client", client_only, "Do not contact the coordinator");

  // meshctl health: cli/health_command.h.
  HealthCommand health(app);

  mesh::v1::CreateJobRequest create;
  int world_size = 0;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> dim_names;
  std::string job_id;
  CLI::App* create_job = app.add_subcommand(
      "create-job",
      "Create a bare job record for workers you start yourself (they join with MESH_JOB_ID)");
  create_job->add_option("--world-size", world_size, "Number of ranks")
      ->required()
      ->check(CLI::PositiveNumber);
  create_job->add_option("--job-id", job_id, "Job id; default: the coordinator picks one");
  create_job->add_option("--mesh-shape", mesh_shape, "Mesh shape, outermost first, e.g. 2,2")
      ->delimiter(',');
  create_job->add_option("--dim-names", dim_names, "One name per mesh dim, e.g. dp,tp")
      ->delimiter(',');
  bool in_place = false;
  create_job->add_flag("--in-place", in_place,
                       "In-place recovery: a rank that dies once the world has formed is lost, "
                       "not the job (docs/elastic.md)");

  JobCommands jobs(app);
  // meshctl cluster up: cli/cluster.h.
  std::unique_ptr<ClusterCommands> cluster = AddClusterCommands(app);

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
  if (!cluster->parsed()) {
    absl::StatusOr<security::ClientSecurity> security = options.security.Resolve();
    if (security.ok()) {
      // Several replicas (docs/ha.md): talk to the one that leads.
      absl::StatusOr<std::string> leader = FindLeader(
          SplitCoordinatorTargets(options.coordinator),
          [&](const std::string& target) { return cli::MakeChannel(target, *security); },
          absl::Now() + absl::Seconds(options.timeout_s));
      if (!leader.ok()) {
        err << "meshctl: " << options.coordinator << ": " << leader.status().message() << "\n";
        return leader.status().code() == absl::StatusCode::kUnavailable ? kExitUnreachable
                                                                        : kExitUsage;
      }
      options.coordinator = *leader;
    }
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        security.ok() ? cli::MakeChannel(options.coordinator, *security) : security.status();
    if (!channel.ok()) {
      err << "meshctl: " << channel.status().message() << "\n";
      return kExitUsage;
    }
    options.channel = *std::move(channel);
  }
  if (version->parsed()) return RunVersion(options, client_only, format, out, err);
  if (health.Parsed()) {
    return health.Run(options.channel, options.coordinator, absl::Seconds(options.timeout_s),
                      format, out, err);
  }
  if (cluster->parsed()) return cluster->Run(out, err);
  if (create_job->parsed()) {
    create.set_job_id(job_id);
    create.set_world_size(world_size);
    create.set_in_place(in_place);
    for (int64_t size : mesh_shape) create.add_mesh_shape(size);
    for (const std::string& name : dim_names) create.add_mesh_dim_names(name);
    return RunCreateJob(options, create, format, out, err);
  }
  if (jobs.Parsed()) {
    return jobs.Run(
        {options.coordinator, options.channel, absl::Seconds(options.timeout_s), format}, out, err);
  }
  err << "meshctl: no command given\n";
  return kExitUsage;
}

}  // namespace mesh::cli
