#include "libmesh/src/runtime_monitor.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/duration_format.h"

namespace mesh {

Runtime::Monitor::Monitor(std::shared_ptr<internal::CoordinatorClient> client, const JoinInfo& info,
                          absl::Duration rpc_timeout,
                          std::function<void(const absl::Status&)> on_failure,
                          std::shared_ptr<ProgressRegistry> progress)
    : client_(std::move(client)),
      progress_(std::move(progress)),
      rank_(info.rank),
      interval_(info.heartbeat_interval),
      timeout_(info.heartbeat_timeout),
      rpc_timeout_(rpc_timeout),
      on_failure_(std::move(on_failure)) {}

Runtime::Monitor::~Monitor() { Stop(); }

void Runtime::Monitor::StartHeartbeats() {
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
}

absl::Status Runtime::Monitor::StartWatch() {
  absl::StatusOr<std::unique_ptr<internal::JobWatch>> watch = client_->WatchJob();
  if (!watch.ok()) return watch.status();
  {
    absl::MutexLock lock(&mu_);
    watch_ = *std::move(watch);
  }
  watch_thread_ = std::thread([this] { WatchLoop(); });
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return watch_live_ || !watch_status_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&settled), rpc_timeout_)) {
    return absl::DeadlineExceededError(absl::StrCat("WorkerService.WatchJob to ", client_->target(),
                                                    ": no WATCHING event within ",
                                                    FormatDurationShort(rpc_timeout_)));
  }
  return watch_status_;
}

absl::Status Runtime::Monitor::Arm(std::shared_ptr<ProcessGroupFactory> factory) {
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    factory_ = factory;
    armed_ = true;
    error = error_;
  }
  if (!error.ok()) factory->AbortAll(error);
  return error;
}

void Runtime::Monitor::AbortGroupsOfNewlyLost(const std::vector<internal::JobErrorInfo>& lost) {
  std::set<int> now;
  std::vector<int> fresh;
  std::string reason;
  for (const internal::JobErrorInfo& error : lost) {
    now.insert(error.rank);
    if (!lost_.contains(error.rank)) {
      fresh.push_back(error.rank);
      if (reason.empty()) reason = error.message;
    }
  }
  lost_ = std::move(now);
  if (fresh.empty()) return;
  std::shared_ptr<internal::DecoratingProcessGroupFactory> tracked;
  {
    absl::MutexLock lock(&mu_);
    tracked = tracked_;
  }
  if (tracked != nullptr) tracked->AbortGroupsWith(fresh, absl::AbortedError(reason));
}

void Runtime::Monitor::Track(std::shared_ptr<internal::DecoratingProcessGroupFactory> factory) {
  absl::MutexLock lock(&mu_);
  tracked_ = std::move(factory);
}

void Runtime::Monitor::Fail(const absl::Status& error) {
  MESH_CHECK(!error.ok(), "Runtime failure needs an error");
  std::shared_ptr<ProcessGroupFactory> factory;
  bool armed = false;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return;
    error_ = error;
    factory = factory_;
    armed = armed_;
  }
  if (factory != nullptr) factory->AbortAll(error);
  if (armed && on_failure_) on_failure_(error);
}

absl::Status Runtime::Monitor::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

int64_t Runtime::Monitor::membership_epoch() const {
  return membership_epoch_.load(std::memory_order_relaxed);
}

void Runtime::Monitor::Stop() {
  std::shared_ptr<internal::JobWatch> watch;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    watch = watch_;
    wake_.SignalAll();
  }
  if (watch != nullptr) watch->Cancel();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
}

bool Runtime::Monitor::SleepUntil(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (!stopping_ && absl::Now() < deadline) wake_.WaitWithDeadline(&mu_, deadline);
  return !stopping_;
}

bool Runtime::Monitor::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void Runtime::Monitor::HeartbeatLoop() {
  absl::Time last_ok = absl::Now();
  absl::Time next = absl::Now();
  while (SleepUntil(next)) {
    // After a slow call, beat at once but do not try to catch up.
    next = std::max(next + interval_, absl::Now());
    // Bounded by the liveness window: a call slower than that is as good
    // as lost.
    std::vector<GroupProgressReport> groups = progress_->Snapshot();
    // Members go once per group (and again when the coordinator asks):
    // a heartbeat stays O(groups) bytes.
    for (GroupProgressReport& group : groups) {
      if (announced_.contains(group.name)) group.members.clear();
    }
    absl::StatusOr<internal::HeartbeatReplyInfo> reply =
        client_->Heartbeat(groups, std::min(timeout_, rpc_timeout_));
    if (stopping()) return;
    if (reply.ok()) {
      if (reply->error.has_value()) return Fail(absl::AbortedError(reply->error->message));
      membership_epoch_.store(reply->membership_epoch, std::memory_order_relaxed);
      AbortGroupsOfNewlyLost(reply->lost);
      // The names of this beat only: a group that went away and came
      // back under its name (with other members) is announced again.
      announced_.clear();
      if (!reply->send_members) {
        for (const GroupProgressReport& group : groups) announced_.insert(group.name);
      }
      last_ok = absl::Now();
      continue;
    }
    // Transient: the coordinator is unreachable, slow, overloaded, or
    // cancelled the call while shutting down (this thread never cancels).
    const absl::StatusCode code = reply.status().code();
    if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded &&
        code != absl::StatusCode::kResourceExhausted && code != absl::StatusCode::kCancelled) {
      // ABORTED (the generation failed, or a newer process owns this
      // rank), NOT_FOUND, ...: nothing this rank does can succeed now.
      return Fail(reply.status());
    }
    if (absl::Now() - last_ok > timeout_) {
      return Fail(absl::UnavailableError(
          absl::StrCat("rank ", rank_, " lost the coordinator at ", client_->target(),
                       ": no successful heartbeat for ", FormatDurationShort(absl::Now() - last_ok),
                       " (heartbeat timeout ", FormatDurationShort(timeout_),
                       "); last error: ", reply.status().message())));
    }
    // A transient error: retry at the next beat (which is already due if
    // the call itself took a whole interval).
  }
}

void Runtime::Monitor::WatchLoop() {
  std::shared_ptr<internal::JobWatch> watch;
  {
    absl::MutexLock lock(&mu_);
    watch = watch_;
  }
  while (true) {
    absl::StatusOr<std::optional<internal::JobEventInfo>> event = watch->Next();
    std::optional<absl::Status> failure;
    bool done = false;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (!event.ok()) {
        // Before WATCHING this is why the watch could not start. After it,
        // the stream broke (e.g. the coordinator went away): an ABORTED end
        // is the job's failure; otherwise heartbeats carry on watching.
        if (!watch_live_) {
          watch_status_ = event.status();
        } else if (event.status().code() == absl::StatusCode::kAborted) {
          failure = event.status();
        }
        done = true;
      } else if (!event->has_value()) {
        if (!watch_live_) {
          watch_status_ = absl::UnavailableError(absl::StrCat(
              "WorkerService.WatchJob to ", client_->target(), ": stream ended before WATCHING"));
        }
        done = true;
      } else {
        watch_live_ = true;
        if ((*event)->kind == internal::JobEventInfo::kError) {
          failure = absl::AbortedError((*event)->error.message);
        }
      }
    }
    if (failure.has_value()) Fail(*failure);
    if (done) return;
  }
}

}  // namespace mesh
