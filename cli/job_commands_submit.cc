// meshctl submit and cancel (job_commands.h): the two job commands that
// change a job. submit builds the spec from the file and the flags, then
// follows the job's logs (or only waits) to its result.

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cli/job_client.h"
#include "cli/job_commands_internal.h"
#include "cli/job_json.h"
#include "cli/job_spec_file.h"
#include "cli/meshctl.h"
#include "cli/output.h"

namespace mesh::cli {

using mesh::v1::JobSpec;

namespace {

// The spec to submit: the file's fields, then each flag given (labels and
// env merge key by key), then argv after `--`.
// Errors: INVALID_ARGUMENT naming the flag, or the file and position.
absl::StatusOr<JobSpec> BuildSpec(const Options& o) {
  JobSpec spec;
  if (!o.file.empty()) {
    auto parsed = ReadJobSpecFile(o.file);
    if (!parsed.ok()) return absl::InvalidArgumentError(parsed.status().message());
    spec = *std::move(parsed);
  }
  auto flag_error = [](absl::string_view flag, const absl::Status& status) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", status.message()));
  };
  if (o.name_opt->count() > 0) spec.set_name(o.name);
  for (const std::string& label : o.labels) {
    auto kv = ParseKeyValue(label);
    if (!kv.ok()) return flag_error("--label", kv.status());
    (*spec.mutable_labels())[kv->first] = kv->second;
  }
  for (const std::string& var : o.env) {
    auto kv = ParseKeyValue(var);
    if (!kv.ok()) return flag_error("--env", kv.status());
    (*spec.mutable_env())[kv->first] = kv->second;
  }
  if (o.workdir_opt->count() > 0) spec.set_working_dir(o.workdir);
  if (o.nodes_opt->count() > 0) {
    auto count = ParseNodeCount(o.node_count);
    if (!count.ok()) return flag_error("--nodes", count.status());
    *spec.mutable_nodes() = *count;
  }
  if (o.nproc_opt->count() > 0) spec.set_nproc_per_node(o.nproc_per_node);
  if (o.gpus_opt->count() > 0) spec.set_gpus_per_proc(o.gpus_per_proc);
  if (o.shape_opt->count() > 0) {
    auto shape = ParseMeshShape(o.mesh_shape);
    if (!shape.ok()) return flag_error("--mesh-shape", shape.status());
    spec.clear_mesh_shape();
    for (int64_t size : *shape) spec.add_mesh_shape(size);
  }
  if (o.dims_opt->count() > 0) {
    spec.clear_mesh_dim_names();
    for (absl::string_view dim : absl::StrSplit(o.dim_names, ',')) {
      spec.add_mesh_dim_names(std::string(dim));
    }
  }
  if (o.restarts_opt->count() > 0) spec.set_max_restarts(o.max_restarts);
  if (o.deadline_opt->count() > 0) {
    auto seconds = ParseDurationSeconds(o.deadline);
    if (!seconds.ok()) return flag_error("--deadline", seconds.status());
    spec.set_deadline_seconds(*seconds);
  }
  if (o.hang_timeout_opt->count() > 0) {
    auto seconds = ParseDurationSeconds(o.hang_timeout);
    if (!seconds.ok()) return flag_error("--hang-timeout", seconds.status());
    if (*seconds == 0) {
      return flag_error("--hang-timeout",
                        absl::InvalidArgumentError("must be positive, e.g. 5m (the default)"));
    }
    spec.set_hang_timeout_seconds(*seconds);
  }
  if (o.memory_opt->count() > 0) {
    auto bytes = ParseByteSize(o.memory_per_proc);
    if (!bytes.ok()) return flag_error("--memory-per-proc", bytes.status());
    spec.set_memory_per_proc_bytes(*bytes);
  }
  if (o.pids_opt->count() > 0) spec.set_max_pids(o.max_pids);
  if (o.on_hang_opt->count() > 0) {
    auto policy = ParseHangPolicy(o.on_hang);
    if (!policy.ok()) return flag_error("--on-hang", policy.status());
    spec.set_on_hang(*policy);
  }
  if (o.grow_opt->count() > 0) {
    if (absl::Status grow = ParseGrow(o.grow, spec); !grow.ok()) return flag_error("--grow", grow);
  }
  if (o.restart_policy_opt->count() > 0) {
    auto policy = ParseRestartPolicy(o.restart_policy);
    if (!policy.ok()) return flag_error("--restart-policy", policy.status());
    spec.set_restart_policy(*policy);
  }
  if (o.in_place_dim_opt->count() > 0) {
    if (absl::Status dim = CheckInPlaceDim(o.in_place_dim); !dim.ok()) {
      return flag_error("--in-place-dim", dim);
    }
    spec.set_in_place_dim(o.in_place_dim);
  }
  if (o.key_opt->count() > 0) spec.set_idempotency_key(o.idempotency_key);
  if (!o.command.empty()) {
    spec.clear_command();
    for (const std::string& arg : o.command) spec.add_command(arg);
  }
  // Validation requires at least one node and one process per node; an
  // omitted count means one, as with torchrun.
  if (!spec.has_nodes()) {
    spec.mutable_nodes()->set_min(1);
    spec.mutable_nodes()->set_max(1);
  }
  if (spec.nproc_per_node() == 0 && o.nproc_opt->count() == 0) spec.set_nproc_per_node(1);
  if (absl::Status env = CheckEnvNames(spec); !env.ok()) return env;
  return spec;
}

}  // namespace

int RunSubmit(const JobCommandContext& context, const Options& o, std::ostream& out,
              std::ostream& err) {
  auto spec = BuildSpec(o);
  if (!spec.ok()) return UsageError("submit", spec.status().message(), err);
  if (spec->command().empty()) {
    return UsageError("submit",
                      "no command to run: give it after `--` (meshctl submit -- python train.py) "
                      "or as `command:` in the spec file",
                      err);
  }
  JobClient client(context.Channel());
  auto submitted = client.SubmitJob(*spec, context.timeout);
  if (!submitted.ok()) return ReportError(context, submitted.status(), err);
  const Job& job = submitted->job();
  if (o.parsable) {
    out << job.id() << "\n";
    return kExitOk;
  }
  if (submitted->deduplicated()) {
    err << "meshctl: idempotency key matched job " << job.id() << "; nothing new was submitted\n";
  }
  if (o.no_wait) {
    if (context.format == OutputFormat::kTable) {
      out << job.id() << "\n";
    } else {
      nlohmann::json json = JobToJson(job, false);
      json["deduplicated"] = submitted->deduplicated();
      Render(json, context.format, out);
    }
    return kExitOk;
  }
  err << "meshctl: submitted job " << job.id()
      << (o.no_logs ? "; waiting for it" : "; following its logs")
      << " (Ctrl-C stops meshctl, not the job)\n";
  absl::StatusOr<Job> final_job;
  if (o.no_logs) {
    final_job = WaitForJob(context, client, job.id(), absl::ZeroDuration());
  } else {
    LogPrinter printer(out, err, /*prefix=*/true);
    final_job = FollowLogs(context, client, job.id(), FollowOptions{}, printer, err);
  }
  if (!final_job.ok()) return ReportError(context, final_job.status(), err);
  if (!IsTerminal(final_job->state())) {
    // FollowLogs returns only terminal jobs; this guards a future change.
    final_job = WaitForJob(context, client, job.id(), absl::ZeroDuration());
    if (!final_job.ok()) return ReportError(context, final_job.status(), err);
  }
  err << ResultLine(*final_job) << "\n";
  if (context.format != OutputFormat::kTable)
    Render(JobToJson(*final_job, false), context.format, out);
  return ExitCodeForResult(final_job->state());
}

int RunCancel(const JobCommandContext& context, const Options& o, std::ostream& out,
              std::ostream& err) {
  JobClient client(context.Channel());
  auto job = client.CancelJob(o.job_id, o.reason, context.timeout);
  if (!job.ok()) return ReportError(context, job.status(), err);
  if (job->state() != mesh::v1::JOB_STATE_CANCELLED) {
    err << "meshctl: job " << job->id() << " is " << JobStateName(job->state())
        << (IsTerminal(job->state()) ? "; nothing to cancel" : "; cancellation requested") << "\n";
  }
  if (context.format == OutputFormat::kTable) {
    out << "job " << job->id() << " " << JobStateName(job->state()) << "\n";
  } else {
    Render(JobToJson(*job, false), context.format, out);
  }
  return kExitOk;
}

}  // namespace mesh::cli
