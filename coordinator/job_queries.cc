// JobManager's read side: the job as a proto, GetJob, ListJobs, OwnerOf,
// and those who wait for or watch a job's transitions (WaitJob,
// WatchJobState; job_manager.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_manager_internal.h"

namespace mesh::coordinator {

using ::mesh::v1::JOB_STATE_PENDING;

mesh::v1::Job JobManager::JobProtoLocked(const Job& job, bool with_events) const {
  mesh::v1::Job proto;
  proto.set_id(job.id);
  *proto.mutable_spec() = job.spec;
  proto.set_owner(job.owner);
  job.machine->ToProto(proto);
  if (!with_events) proto.clear_events();
  if (job.placement.has_value()) {
    for (const std::string& node : job.placement->nodes) proto.add_nodes(node);
  }
  for (const mesh::v1::JobResize& resize : job.resizes) *proto.add_resizes() = resize;
  if (with_events && job.spec.restart_policy() == mesh::v1::RESTART_POLICY_IN_PLACE) {
    absl::StatusOr<JobInfo> info = coordination_->GetJob(job.id);
    if (info.ok() && info->generation == job.generation()) {
      for (const MembershipEvent& event : info->membership) {
        mesh::v1::MembershipChange* change = proto.add_membership();
        change->set_epoch(event.epoch);
        change->set_time_unix_ms(absl::ToUnixMillis(event.time));
        change->set_rank(event.rank);
        change->set_kind(event.lost ? mesh::v1::MembershipChange::KIND_LOST
                                    : mesh::v1::MembershipChange::KIND_RETURNED);
        change->set_incarnation(event.incarnation);
        change->set_reason(event.reason);
      }
    }
  }
  return proto;
}

void JobManager::NotifyWatchersLocked(Job& job) {
  if (job.watchers.empty()) return;
  mesh::v1::WatchJobStateResponse message;
  *message.mutable_event() = ToProto(job.machine->events().back());
  *message.mutable_job() = JobProtoLocked(job, /*with_events=*/false);
  const bool terminal = IsTerminal(job.state());
  for (auto& [handle, sink] : job.watchers) {
    sink->Send(message);
    if (terminal) {
      sink->End(absl::OkStatus());
      state_watch_jobs_.erase(handle);
    }
  }
  if (terminal) job.watchers.clear();
}

std::optional<std::string> JobManager::OwnerOf(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  const Job* job = FindJobLocked(std::string(job_id));
  if (job == nullptr) return std::nullopt;
  return job->owner;
}

absl::StatusOr<mesh::v1::Job> JobManager::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const Job* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return JobProtoLocked(*job, /*with_events=*/true);
}

absl::StatusOr<mesh::v1::ListJobsResponse> JobManager::ListJobs(
    const mesh::v1::ListJobsRequest& request) const {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size ", request.page_size(), " is negative"));
  }
  const int limit = request.page_size() == 0
                        ? JobStore::kDefaultPageSize
                        : std::min(request.page_size(), JobStore::kMaxPageSize);
  int64_t before = INT64_MAX;
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &before) || before <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token '", request.page_token(), "' is not one ListJobs returned"));
  }
  std::set<int> states;
  for (int state : request.states()) {
    if (state == mesh::v1::JOB_STATE_UNSPECIFIED || !mesh::v1::JobState_IsValid(state)) {
      return absl::InvalidArgumentError(absl::StrCat("states: ", state, " is not a job state"));
    }
    states.insert(state);
  }
  absl::MutexLock lock(&mu_);
  std::vector<const Job*> matching;
  for (const auto& [id, job] : jobs_) {
    if (job->number >= before) continue;
    if (!states.empty() && !states.contains(job->state())) continue;
    bool labels_match = true;
    for (const auto& [key, value] : request.labels()) {
      auto it = job->spec.labels().find(key);
      if (it == job->spec.labels().end() || it->second != value) labels_match = false;
    }
    if (labels_match) matching.push_back(job.get());
  }
  std::sort(matching.begin(), matching.end(),
            [](const Job* a, const Job* b) { return a->number > b->number; });
  mesh::v1::ListJobsResponse response;
  for (size_t i = 0; i < matching.size() && i < static_cast<size_t>(limit); ++i) {
    *response.add_jobs() = JobProtoLocked(*matching[i], /*with_events=*/false);
  }
  if (matching.size() > static_cast<size_t>(limit)) {
    response.set_next_page_token(absl::StrCat(matching[limit - 1]->number));
  }
  return response;
}

void JobManager::WaitJob(const std::string& job_id, absl::Duration timeout,
                         Callback<mesh::v1::Job> done) {
  absl::StatusOr<mesh::v1::Job> now;
  {
    absl::MutexLock lock(&mu_);
    const Job* job = FindJobLocked(job_id);
    if (shut_down_) {
      now = ShuttingDown();
    } else if (job == nullptr) {
      now = absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    } else if (IsTerminal(job->state())) {
      now = JobProtoLocked(*job, /*with_events=*/true);
    } else {
      if (timeout <= absl::ZeroDuration() || timeout > options_.max_wait) {
        timeout = options_.max_wait;
      }
      auto waiter = std::make_unique<Waiter>();
      waiter->job_id = job_id;
      waiter->deadline = clock_->Now() + timeout;
      waiter->done = std::move(done);
      waiters_.emplace(next_handle_++, std::move(waiter));
      return;
    }
  }
  std::move(done)(std::move(now));
}

absl::StatusOr<uint64_t> JobManager::WatchJobState(const std::string& job_id, bool replay,
                                                   JobStateSink* sink) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return ShuttingDown();
  Job* job = FindJobLocked(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  const uint64_t handle = next_handle_++;
  if (replay) {
    // Each replayed event carries the job as it was right after it, as far
    // as the event says (state, pending reason, generation); the rest is as
    // it is now.
    const mesh::v1::Job proto = JobProtoLocked(*job, /*with_events=*/false);
    for (const JobEventRecord& event : job->machine->events()) {
      mesh::v1::WatchJobStateResponse message;
      *message.mutable_event() = ToProto(event);
      mesh::v1::Job& then = *message.mutable_job();
      then = proto;
      then.set_state(event.to);
      then.set_generation(event.generation);
      then.set_update_time_unix_ms(absl::ToUnixMillis(event.time));
      if (event.to != JOB_STATE_PENDING) then.clear_pending_reason();
      sink->Send(message);
    }
  }
  if (IsTerminal(job->state())) {
    sink->End(absl::OkStatus());
    return handle;
  }
  job->watchers.emplace(handle, sink);
  state_watch_jobs_.emplace(handle, job_id);
  return handle;
}

void JobManager::UnwatchJobState(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  auto it = state_watch_jobs_.find(handle);
  if (it == state_watch_jobs_.end()) return;
  if (Job* job = FindJobLocked(it->second)) job->watchers.erase(handle);
  state_watch_jobs_.erase(it);
}

// Tick's part: WaitJob calls past their deadline get DEADLINE_EXCEEDED.
void JobManager::ExpireWaitersLocked(absl::Time now, Effects& effects) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second->deadline > now) {
      ++it;
      continue;
    }
    effects.Call([done = std::move(it->second->done), id = it->second->job_id]() mutable {
      std::move(done)(
          absl::DeadlineExceededError(absl::StrCat("job ", id, " did not finish within the wait")));
    });
    it = waiters_.erase(it);
  }
}

}  // namespace mesh::coordinator
