#include "agent/report_outbox.h"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace mesh::agent {
namespace {

// Errors worth retrying as they are; anything else means the coordinator
// refuses the report and will keep refusing it.
bool IsTransient(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

}  // namespace

ReportOutbox::ReportOutbox(const AgentConfig* config, NodeClient* client,
                           SessionErrorCallback on_session_error)
    : config_(*config), client_(client), on_session_error_(std::move(on_session_error)) {}

ReportOutbox::~ReportOutbox() { Stop(); }

void ReportOutbox::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ReportOutbox::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void ReportOutbox::Enqueue(v1::ReportWorkersStartedRequest report) {
  absl::MutexLock lock(&mu_);
  Report r;
  r.started = std::move(report);
  EnqueueLocked(std::move(r));
}

void ReportOutbox::Enqueue(v1::ReportWorkerExitRequest report) {
  absl::MutexLock lock(&mu_);
  Report r;
  r.exit = std::move(report);
  EnqueueLocked(std::move(r));
}

bool ReportOutbox::EnqueueExitUnlessQueued(const v1::ReportWorkerExitRequest& report) {
  absl::MutexLock lock(&mu_);
  const bool queued = std::any_of(queue_.begin(), queue_.end(), [&](const Report& r) {
    return r.exit.has_value() && r.exit->job_id() == report.job_id() &&
           r.exit->generation() == report.generation() && r.exit->rank() == report.rank();
  });
  if (queued) return false;
  Report r;
  r.exit = report;
  EnqueueLocked(std::move(r));
  return true;
}

void ReportOutbox::EnqueueLocked(Report report) {
  report.id = next_id_++;
  queue_.push_back(std::move(report));
  changed_.SignalAll();
}

void ReportOutbox::SessionUp(uint64_t epoch, const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  session_up_ = true;
  epoch_ = epoch;
  session_id_ = session_id;
  changed_.SignalAll();
}

void ReportOutbox::SessionDown(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (epoch != epoch_) return;
  session_up_ = false;
  changed_.SignalAll();
}

size_t ReportOutbox::size() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

bool ReportOutbox::SleepUnlessStopping(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), duration);
  return !stopping_;
}

absl::Status ReportOutbox::Send(const Report& report, const std::string& session_id) {
  if (report.started.has_value()) {
    v1::ReportWorkersStartedRequest request = *report.started;
    request.set_name(config_.name);
    request.set_session_id(session_id);
    return client_->ReportWorkersStarted(request, config_.rpc_timeout);
  }
  v1::ReportWorkerExitRequest request = *report.exit;
  request.set_name(config_.name);
  request.set_session_id(session_id);
  return client_->ReportWorkerExit(request, config_.rpc_timeout);
}

void ReportOutbox::Loop() {
  absl::Duration backoff = config_.backoff_initial;
  for (;;) {
    Report report;
    uint64_t epoch = 0;
    std::string session;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && (queue_.empty() || !session_up_)) changed_.Wait(&mu_);
      if (stopping_) return;
      // Only this thread removes reports, so the head stays the head.
      report = queue_.front();
      epoch = epoch_;
      session = session_id_;
    }
    const absl::Status status = Send(report, session);
    const char* what = report.started.has_value() ? "ReportWorkersStarted" : "ReportWorkerExit";
    if (status.ok() || !(IsSessionError(status) || IsTransient(status))) {
      if (!status.ok()) {
        spdlog::error("coordinator refused {} ({}); dropping it", what, status.ToString());
      }
      absl::MutexLock lock(&mu_);
      if (!queue_.empty() && queue_.front().id == report.id) queue_.pop_front();
      backoff = config_.backoff_initial;
      continue;
    }
    if (IsSessionError(status)) {
      on_session_error_(epoch, absl::StrCat(what, ": ", status.ToString()));
      absl::MutexLock lock(&mu_);
      while (!stopping_ && epoch_ == epoch) changed_.Wait(&mu_);
      continue;
    }
    spdlog::debug("{} failed ({}); retrying", what, status.ToString());
    if (!SleepUnlessStopping(backoff)) return;
    backoff = std::min(backoff * 2, config_.backoff_max);
  }
}

}  // namespace mesh::agent
