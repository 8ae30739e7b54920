// meshctl logs and wait (job_commands.h): following a job, its logs across
// restarts (LogPrinter, FollowLogs) and its end (WaitForJob), which submit
// does too.

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/job_client.h"
#include "cli/job_commands_internal.h"
#include "cli/job_json.h"
#include "cli/job_spec_file.h"
#include "cli/meshctl.h"
#include "common/duration_format.h"

namespace mesh::cli {
namespace {

// How long one WaitJob call asks the server to hold: short enough that a
// silently dead connection is noticed, long enough to be cheap.
constexpr absl::Duration kWaitSlice = absl::Seconds(30);

// One GetLogs stream of `job_id`, every chunk through `printer`, partial
// lines flushed at the end.
absl::Status PrintLogs(JobClient& client, const std::string& job_id, const std::vector<int>& ranks,
                       int64_t generation, int tail, bool follow, LogPrinter& printer) {
  mesh::v1::GetLogsRequest request;
  request.set_job_id(job_id);
  for (int rank : ranks) request.add_ranks(rank);
  request.set_generation(generation);
  request.set_tail(tail);
  request.set_follow(follow);
  absl::Status status = client.GetLogs(
      request,
      [&](const LogChunk& chunk) {
        printer.OnChunk(chunk);
        return true;
      },
      nullptr);
  printer.FlushAll();
  return status;
}

}  // namespace

absl::StatusOr<Job> FollowLogs(const JobCommandContext& context, JobClient& client,
                               const std::string& job_id, const FollowOptions& options,
                               LogPrinter& printer, std::ostream& err) {
  auto job = client.GetJob(job_id, context.timeout);
  if (!job.ok()) return job.status();
  int64_t generation = options.generation >= 0 ? options.generation : job->generation();
  int tail = options.tail;
  bool warned_unavailable = false;
  for (;;) {
    printer.BeginStream();
    absl::Status status =
        PrintLogs(client, job_id, options.ranks, generation, tail, /*follow=*/true, printer);
    if (absl::IsFailedPrecondition(status)) {
      // Not placed yet: wait for the scheduler, then ask again.
      absl::Status watched = client.WatchJobState(
          job_id, /*replay=*/true,
          [&](const mesh::v1::WatchJobStateResponse& response) {
            const auto& event = response.event();
            if (event.generation() > generation) return false;
            if (event.generation() < generation) return true;
            return event.to() == mesh::v1::JOB_STATE_PENDING ||
                   event.to() == mesh::v1::JOB_STATE_RESTARTING;
          },
          nullptr);
      if (!watched.ok() && !absl::IsCancelled(watched)) return watched;
    } else if (!status.ok() && !absl::IsUnavailable(status)) {
      return status;
    }
    job = client.GetJob(job_id, context.timeout);
    if (!job.ok()) return job.status();
    if (absl::IsUnavailable(status)) {
      // The coordinator answers but a node holding the logs is not
      // connected: the job will restart or fail; keep following.
      if (!warned_unavailable) {
        err << "meshctl: logs of job " << job_id << " generation " << generation
            << " unavailable: " << status.message() << "\n";
        warned_unavailable = true;
      }
      if (!IsTerminal(job->state()) && job->generation() == generation) {
        absl::SleepFor(absl::Seconds(1));
        continue;
      }
    }
    if (options.generation >= 0) {
      if (status.ok() || IsTerminal(job->state())) return job;
      absl::SleepFor(absl::Seconds(1));  // Unreachable logs: ask again, never spinning.
      continue;
    }
    if (job->generation() > generation) {
      generation = job->generation();
      tail = 0;
      warned_unavailable = false;
      err << "--- generation " << generation << " (restart " << job->restarts() << ") ---\n";
      continue;
    }
    if (IsTerminal(job->state())) return job;
    if (status.ok()) {
      // Every selected rank of this generation has ended, but the job has
      // not (other ranks run on). Wait for it to restart or end instead of
      // fetching the same logs again.
      absl::Status watched = client.WatchJobState(
          job_id, /*replay=*/true,
          [&](const mesh::v1::WatchJobStateResponse& response) {
            const auto& event = response.event();
            return event.generation() <= generation && !IsTerminal(event.to());
          },
          nullptr);
      if (watched.ok() || absl::IsCancelled(watched)) continue;
    }
    // The stream broke off, or the job is placed but its logs are not
    // reachable yet: ask again after a pause, so this never spins; the
    // printer skips what it already showed.
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::StatusOr<Job> WaitForJob(const JobCommandContext& context, JobClient& client,
                               const std::string& job_id, absl::Duration limit) {
  const absl::Time deadline =
      limit == absl::ZeroDuration() ? absl::InfiniteFuture() : absl::Now() + limit;
  for (;;) {
    const absl::Duration remaining = deadline - absl::Now();
    if (remaining <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("job ", job_id, " not finished after ", FormatDurationShort(limit)));
    }
    const absl::Duration slice = std::min(remaining, kWaitSlice);
    const absl::Time started = absl::Now();
    auto job = client.WaitJob(job_id, slice, context.timeout);
    if (job.ok() || !absl::IsDeadlineExceeded(job.status())) return job;
    // Not yet. A server that answers at once must not make this spin.
    const absl::Duration elapsed = absl::Now() - started;
    if (elapsed < absl::Milliseconds(100)) {
      absl::SleepFor(std::min(absl::Milliseconds(100) - elapsed, deadline - absl::Now()));
    }
  }
}

std::string ResultLine(const Job& job) {
  std::string line = absl::StrCat("meshctl: job ", job.id(), " ", JobStateName(job.state()));
  if (job.state() == mesh::v1::JOB_STATE_FAILED && job.has_root_cause()) {
    absl::StrAppend(&line, ": ", RootCauseLine(job.root_cause()));
  }
  if (job.state() == mesh::v1::JOB_STATE_CANCELLED && !job.events().empty() &&
      !job.events().rbegin()->reason().empty()) {
    absl::StrAppend(&line, ": ", job.events().rbegin()->reason());
  }
  return line;
}

int RunLogs(const JobCommandContext& context, const Options& o, std::ostream& out,
            std::ostream& err) {
  if (o.generation < -1) return UsageError("logs", "--generation must be >= 0", err);
  JobClient client(context.Channel());
  LogPrinter printer(out, err, !o.no_prefix);
  if (o.follow) {
    FollowOptions follow{o.ranks, o.tail, o.generation};
    auto job = FollowLogs(context, client, o.job_id, follow, printer, err);
    if (!job.ok()) return ReportError(context, job.status(), err);
    return kExitOk;
  }
  absl::Status status =
      PrintLogs(client, o.job_id, o.ranks, o.generation, o.tail, /*follow=*/false, printer);
  if (!status.ok()) return ReportError(context, status, err);
  return kExitOk;
}

int RunWait(const JobCommandContext& context, const Options& o, std::ostream& out,
            std::ostream& err) {
  auto limit = ParseWaitDuration(o.wait_timeout);
  if (!limit.ok())
    return UsageError("wait", absl::StrCat("--timeout: ", limit.status().message()), err);
  JobClient client(context.Channel());
  auto job = WaitForJob(context, client, o.job_id, *limit);
  if (absl::IsDeadlineExceeded(job.status())) {
    // Say where the job is, if the coordinator still answers.
    auto now = client.GetJob(o.job_id, context.timeout);
    err << "meshctl: wait: " << job.status().message();
    if (now.ok()) err << "; it is " << JobStateName(now->state());
    err << "\n";
    return kExitWaitTimeout;
  }
  if (!job.ok()) return ReportError(context, job.status(), err);
  RenderJob(*job, false, context.format, out);
  if (job->state() != mesh::v1::JOB_STATE_SUCCEEDED) err << ResultLine(*job) << "\n";
  return ExitCodeForResult(job->state());
}

}  // namespace mesh::cli
