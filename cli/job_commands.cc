// meshctl's job commands (job_commands.h): every command's flags, the
// dispatch to the command that was parsed, and the error and exit-code
// helpers all of them share. The commands themselves are split by group:
//   job_commands_submit.cc  submit and cancel: the commands that change a job
//   job_commands_show.cc    list, status, describe and nodes
//   job_commands_follow.cc  logs and wait: following a job to its end
// Their shared declarations are in job_commands_internal.h.

#include "cli/job_commands.h"

#include <memory>
#include <ostream>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cli/coordinator_errors.h"
#include "cli/job_commands_internal.h"
#include "cli/meshctl.h"

namespace mesh::cli {

int ReportError(const JobCommandContext& context, const absl::Status& status, std::ostream& err) {
  err << DescribeCoordinatorError(context.coordinator, status) << "\n";
  return ExitCodeFor(status);
}

int UsageError(absl::string_view command, absl::string_view message, std::ostream& err) {
  err << "meshctl " << command << ": " << message << "\n";
  return kExitUsage;
}

int ExitCodeForResult(JobState state) {
  switch (state) {
    case mesh::v1::JOB_STATE_SUCCEEDED:
      return kExitOk;
    case mesh::v1::JOB_STATE_CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitFailed;
  }
}

JobCommands::JobCommands(CLI::App& app) : options_(std::make_unique<Options>()) {
  Options& o = *options_;

  o.submit = app.add_subcommand(
      "submit",
      "Submit a job, follow its logs and exit with its result (0 SUCCEEDED, 1 FAILED, "
      "5 CANCELLED)");
  CLI::App* s = o.submit;
  s->add_option("-f,--file", o.file, "Job spec file (YAML or JSON); flags override its fields");
  o.name_opt = s->add_option("--name", o.name, "Job name");
  s->add_option("--label", o.labels, "Label KEY=VALUE (repeatable)")->allow_extra_args(false);
  s->add_option("--env", o.env, "Worker environment variable KEY=VALUE (repeatable)")
      ->allow_extra_args(false);
  o.workdir_opt = s->add_option("--workdir", o.workdir, "Absolute working directory of workers");
  o.nodes_opt = s->add_option("--nodes", o.node_count, "Nodes: N or MIN:MAX (default 1)");
  o.nproc_opt =
      s->add_option("--nproc-per-node", o.nproc_per_node, "Worker processes per node (default 1)");
  o.gpus_opt = s->add_option("--gpus-per-proc", o.gpus_per_proc, "GPUs per process (0: CPU job)");
  o.shape_opt = s->add_option("--mesh-shape", o.mesh_shape,
                              "Device mesh shape, outermost first, e.g. 2,2 or 2,-1");
  o.dims_opt = s->add_option("--dim-names", o.dim_names, "Mesh dimension names, e.g. dp,tp");
  o.restarts_opt =
      s->add_option("--max-restarts", o.max_restarts, "Restarts after a failure before FAILED");
  o.deadline_opt =
      s->add_option("--deadline", o.deadline, "Fail the job after this long: 90s, 10m, 2h");
  o.hang_timeout_opt = s->add_option(
      "--hang-timeout", o.hang_timeout,
      "Diagnose a hang once a rank has waited this long in a collective that another rank never "
      "entered (default 5m; docs/hangs.md)");
  o.on_hang_opt = s->add_option("--on-hang", o.on_hang,
                                "What a diagnosed hang does: restart (default; counts against "
                                "--max-restarts) or fail");
  o.grow_opt = s->add_option("--grow", o.grow,
                             "When a job with --nodes MIN:MAX takes more nodes: never (default), "
                             "on_restart, or after:DURATION at its size (docs/elastic.md)");
  o.restart_policy_opt = s->add_option(
      "--restart-policy", o.restart_policy,
      "What a failed worker does to the others: group (default; the whole job restarts) or "
      "in_place (it is relaunched alone while the others run on; docs/elastic.md)");
  o.in_place_dim_opt = s->add_option(
      "--in-place-dim", o.in_place_dim,
      "With --restart-policy in_place: the mesh dimension the survivors shrink along while a "
      "rank is replaced (default dp)");
  o.memory_opt = s->add_option("--memory-per-proc", o.memory_per_proc,
                               "Memory limit of each worker with what it starts, e.g. 8GiB; over "
                               "it the kernel kills the worker (docs/jobs.md)");
  o.pids_opt = s->add_option("--max-pids", o.max_pids,
                             "Processes and threads each worker may have, itself included");
  o.key_opt = s->add_option("--idempotency-key", o.idempotency_key,
                            "Submitting the same key again returns the first job");
  s->add_flag("--no-wait", o.no_wait, "Print the job id once it is stored, and exit 0");
  s->add_flag("--parsable", o.parsable, "Print only the job id (implies --no-wait)");
  s->add_flag("--no-logs", o.no_logs, "Wait for the result without printing logs");
  s->add_option("command", o.command, "The program and its arguments, after --");

  o.list = app.add_subcommand("list", "List jobs, newest first");
  o.list->add_option("--state", o.states, "Only jobs in this state (repeatable or comma-separated)")
      ->allow_extra_args(false);
  o.list
      ->add_option("-l,--label", o.label_filters,
                   "Only jobs with this label KEY=VALUE (repeatable: all must match)")
      ->allow_extra_args(false);
  o.list->add_option("--limit", o.limit, "Jobs per page (default: the server's, 100)")
      ->check(CLI::Range(0, 1000));
  o.list->add_flag("--all", o.all_pages, "Fetch every page");
  o.list->add_option("--page-token", o.page_token, "Continue a listing from this token");

  o.status = app.add_subcommand("status", "A job's state, generation, nodes and root cause");
  o.status->add_option("job", o.job_id, "Job id")->required();
  o.describe = app.add_subcommand("describe", "Everything about a job: spec, placement, events");
  o.describe->add_option("job", o.job_id, "Job id")->required();

  o.logs = app.add_subcommand("logs", "Print a job's worker output, \"[rank R] \" per line");
  o.logs->add_option("job", o.job_id, "Job id")->required();
  o.logs->add_flag("-f,--follow", o.follow, "Keep printing until the job ends, across restarts");
  o.logs->add_option("--rank", o.ranks, "Only this rank (repeatable or comma-separated)")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->check(CLI::NonNegativeNumber);
  o.logs->add_option("--tail", o.tail, "Start with the last N lines of each rank")
      ->check(CLI::NonNegativeNumber);
  o.logs->add_option("--generation", o.generation,
                     "Only this generation (default: the current one)");
  o.logs->add_flag("--no-prefix", o.no_prefix, "Print lines without the \"[rank R] \" prefix");

  o.cancel = app.add_subcommand("cancel", "Cancel a job and kill its workers");
  o.cancel->add_option("job", o.job_id, "Job id")->required();
  o.cancel->add_option("--reason", o.reason, "Recorded in the job's CANCELLED event");

  o.wait = app.add_subcommand(
      "wait", "Wait for a job to end; exit 0 SUCCEEDED, 1 FAILED, 5 CANCELLED, 6 timed out");
  o.wait->add_option("job", o.job_id, "Job id")->required();
  o.wait
      ->add_option("--timeout", o.wait_timeout,
                   "Give up after this long (90s, 10m, seconds; 0: never)")
      ->capture_default_str();

  o.nodes = app.add_subcommand("nodes", "List the nodes (agents) the coordinator knows");
}

JobCommands::~JobCommands() = default;

bool JobCommands::Parsed() const {
  const Options& o = *options_;
  for (const CLI::App* command :
       {o.submit, o.list, o.status, o.describe, o.logs, o.cancel, o.wait, o.nodes}) {
    if (command->parsed()) return true;
  }
  return false;
}

int JobCommands::Run(const JobCommandContext& context, std::ostream& out, std::ostream& err) {
  const Options& o = *options_;
  if (o.submit->parsed()) return RunSubmit(context, o, out, err);
  if (o.list->parsed()) return RunList(context, o, out, err);
  if (o.status->parsed()) return RunShow(context, o, /*detail=*/false, out, err);
  if (o.describe->parsed()) return RunShow(context, o, /*detail=*/true, out, err);
  if (o.logs->parsed()) return RunLogs(context, o, out, err);
  if (o.cancel->parsed()) return RunCancel(context, o, out, err);
  if (o.wait->parsed()) return RunWait(context, o, out, err);
  if (o.nodes->parsed()) return RunNodes(context, out, err);
  err << "meshctl: no job command given\n";
  return kExitUsage;
}

}  // namespace mesh::cli
