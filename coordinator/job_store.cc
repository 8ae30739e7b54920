#include "coordinator/job_store.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace mesh::coordinator {

void JobStore::SetMetrics(metrics::Registry* registry) {
  metrics::Histogram* duration =
      registry
          ->AddHistogram("mesh_coordinator_store_commit_duration_seconds",
                         "Job store commit latency (SQLite: the fsync; etcd: the Txn).", {},
                         metrics::LatencyBuckets())
          ->Get();
  metrics::Counter* failures =
      registry->AddCounter("mesh_coordinator_store_commit_failures_total", "Commits that failed.")
          ->Get();
  absl::MutexLock lock(&stats_mu_);
  commit_duration_ = duration;
  commit_failures_ = failures;
}

JobStoreStats JobStore::stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

void JobStore::RecordCommit(absl::Duration elapsed, bool ok) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  absl::MutexLock lock(&stats_mu_);
  if (ok) {
    ++stats_.commits;
    stats_.commit_seconds_total += seconds;
    stats_.last_commit_seconds = seconds;
    if (commit_duration_ != nullptr) commit_duration_->Observe(seconds);
  } else {
    ++stats_.failed_commits;
    if (commit_failures_ != nullptr) commit_failures_->Increment();
  }
}

namespace job_store {

absl::Status CheckNewJob(const NewJob& job) {
  if (job.state.empty()) return absl::InvalidArgumentError("CreateJob: empty state");
  return absl::OkStatus();
}

absl::Status CheckUpdate(const std::string& id, const JobUpdate& update) {
  if (update.state.has_value() && update.state->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("UpdateJob ", id, ": empty state"));
  }
  return absl::OkStatus();
}

absl::Status CheckNode(const NodeRecord& node) {
  if (node.name.empty()) return absl::InvalidArgumentError("UpsertNode: empty name");
  if (node.state.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("UpsertNode ", node.name, ": empty state"));
  }
  if (node.slots < 0 || node.gpus < 0) {
    return absl::InvalidArgumentError(absl::StrCat("UpsertNode ", node.name, ": slots ", node.slots,
                                                   " and gpus ", node.gpus,
                                                   " must not be negative"));
  }
  return absl::OkStatus();
}

absl::Status CheckNodeState(const std::string& name, const std::string& state) {
  if (state.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("MarkNode ", name, ": empty state"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PageWindow> ParsePage(const JobQuery& query) {
  if (query.limit < 0 || query.limit > JobStore::kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("ListJobs: limit ", query.limit, " is outside 0..", JobStore::kMaxPageSize));
  }
  PageWindow window;
  window.limit = query.limit == 0 ? JobStore::kDefaultPageSize : query.limit;
  if (!query.page_token.empty() &&
      (!absl::SimpleAtoi(query.page_token, &window.after) || window.after < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ListJobs: malformed page token '", query.page_token, "'"));
  }
  return window;
}

std::string PageToken(int64_t number) { return absl::StrCat(number); }

std::string JobId(int64_t number) { return absl::StrCat("job-", number); }

std::optional<int64_t> JobNumber(const std::string& id) {
  absl::string_view digits = id;
  int64_t number = 0;
  // Canonical only: "job-007" is not job-7.
  if (!absl::ConsumePrefix(&digits, "job-") || digits.empty() || digits[0] == '0' ||
      !absl::SimpleAtoi(digits, &number) || number <= 0) {
    return std::nullopt;
  }
  return number;
}

absl::Status ApplyUpdate(const JobUpdate& update, absl::Time now, JobRecord* job, JobEvent* event) {
  if (update.expected_state.has_value() && job->state != *update.expected_state) {
    return absl::AbortedError(absl::StrCat("job ", job->id, ": expected state ",
                                           *update.expected_state, ", but it is ", job->state,
                                           " (version ", job->version, ")"));
  }
  if (update.expected_version.has_value() && job->version != *update.expected_version) {
    return absl::AbortedError(absl::StrCat("job ", job->id, ": expected version ",
                                           *update.expected_version, ", but it is ", job->version,
                                           " (state ", job->state, ")"));
  }
  const std::string from_state = job->state;
  if (update.state.has_value()) job->state = *update.state;
  if (update.pending_reason.has_value()) job->pending_reason = *update.pending_reason;
  if (update.generation.has_value()) job->generation = *update.generation;
  if (update.restarts.has_value()) job->restarts = *update.restarts;
  if (update.root_cause.has_value()) job->root_cause = *update.root_cause;
  if (update.placement.has_value()) job->placement = *update.placement;
  if (update.resizes.has_value()) job->resizes = *update.resizes;
  job->version += 1;
  job->updated_at = ToMicros(now);
  *event = JobEvent{job->id,    job->version,  job->updated_at, from_state,
                    job->state, update.reason, job->generation};
  return absl::OkStatus();
}

JobRecord NewJobRecord(const NewJob& job, int64_t number, absl::Time now) {
  JobRecord record;
  record.id = JobId(number);
  record.idempotency_key = job.idempotency_key;
  record.name = job.name;
  record.state = job.state;
  record.pending_reason = job.pending_reason;
  record.spec = job.spec;
  record.owner = job.owner;
  record.version = 1;
  record.created_at = ToMicros(now);
  record.updated_at = record.created_at;
  return record;
}

absl::Time ToMicros(absl::Time time) { return absl::FromUnixMicros(absl::ToUnixMicros(time)); }

}  // namespace job_store
}  // namespace mesh::coordinator
