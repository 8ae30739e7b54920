// Coordination's core (coordination.h): options and metrics, construction,
// jobs and their generations, and fencing (ResolveLocked), which every
// worker call goes through. The rest of the class is split by concern, one
// section of coordination.h each, all under the one mutex:
//   coordination_rendezvous.cc  Join, superseding a rank, barriers
//   coordination_kv.cc          key waits, the KV store, unique IDs
//   coordination_liveness.cc    heartbeats, errors, watches, Tick, shutdown
//   membership.cc               in-place recovery and AliveRanks
// Each table's logic lives in its own file (kv_table, barrier_table,
// rendezvous, unique_id_table, liveness); these files do the locking,
// fencing and waking around them.

#include "coordinator/coordination.h"

#include "coordinator/coordination_internal.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/duration_format.h"
#include "common/heartbeat_spread.h"

namespace mesh::coordinator {

absl::Status ValidateOptions(const CoordinationOptions& o) {
  if (o.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_interval must be positive");
  }
  if (o.heartbeat_timeout <= o.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_timeout (", FormatDurationShort(o.heartbeat_timeout),
        ") must exceed heartbeat_interval (", FormatDurationShort(o.heartbeat_interval), ")"));
  }
  if (absl::Status s = CheckHeartbeatRate(o.rank_heartbeat_rate, "rank_heartbeat_rate"); !s.ok()) {
    return s;
  }
  if (o.default_wait <= absl::ZeroDuration() || o.max_wait < o.default_wait) {
    return absl::InvalidArgumentError("need 0 < default_wait <= max_wait");
  }
  for (auto [value, name] :
       {std::pair{o.max_barriers, "max_barriers"}, std::pair{o.max_unique_ids, "max_unique_ids"},
        std::pair{o.max_keys_per_request, "max_keys_per_request"}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be positive, not ", value));
    }
  }
  return ValidateKvLimits(o.kv);
}

absl::Duration RankHeartbeatInterval(const CoordinationOptions& o, int world_size) {
  return SpreadHeartbeatInterval(world_size, o.rank_heartbeat_rate, o.heartbeat_interval,
                                 o.heartbeat_timeout);
}

Coordination::Metrics::Metrics(metrics::Registry& registry)
    : kv_operations(registry.AddCounter("mesh_coordinator_kv_operations_total",
                                        "KV calls, by operation.", {"op"})),
      kv_set(kv_operations->WithLabels({"set"})),
      kv_get(kv_operations->WithLabels({"get"})),
      kv_add(kv_operations->WithLabels({"add"})),
      kv_compare_set(kv_operations->WithLabels({"compare_set"})),
      kv_delete(kv_operations->WithLabels({"delete"})),
      kv_list(kv_operations->WithLabels({"list"})),
      kv_wait(kv_operations->WithLabels({"wait"})),
      kv_multi_get(kv_operations->WithLabels({"multi_get"})),
      kv_multi_set(kv_operations->WithLabels({"multi_set"})),
      kv_keys(registry
                  .AddGauge("mesh_coordinator_kv_keys",
                            "Keys stored in the KV store, all live generations.")
                  ->Get()),
      kv_bytes(registry
                   .AddGauge("mesh_coordinator_kv_bytes",
                             "Bytes of keys and values stored in the KV store.")
                   ->Get()),
      rendezvous_duration(
          registry
              .AddHistogram("mesh_coordinator_rendezvous_duration_seconds",
                            "From a generation's first Join to its rendezvous completing.", {},
                            metrics::LatencyBuckets())
              ->Get()),
      barrier_wait(registry
                       .AddHistogram("mesh_coordinator_barrier_wait_seconds",
                                     "From a barrier's first arrival to its release.", {},
                                     metrics::LatencyBuckets())
                       ->Get()),
      barrier_timeouts(registry
                           .AddCounter("mesh_coordinator_barrier_timeouts_total",
                                       "Barriers that ended with DEADLINE_EXCEEDED.")
                           ->Get()),
      unique_ids(registry
                     .AddCounter("mesh_coordinator_unique_ids_brokered_total",
                                 "Unique IDs (NCCL) published.")
                     ->Get()),
      pending_waits(registry
                        .AddGauge("mesh_coordinator_pending_waits",
                                  "Worker calls waiting (joins, gets, barriers, ID waits, "
                                  "watches).")
                        ->Get()),
      hangs(registry
                .AddCounter("mesh_coordinator_hangs_total",
                            "Job generations failed because their collectives hung (a rank "
                            "waited past the hang timeout in a collective another rank never "
                            "entered).")
                ->Get()),
      ranks_lost(registry
                     .AddCounter("mesh_coordinator_ranks_lost_total",
                                 "Ranks lost by jobs with in-place recovery: their generations "
                                 "went on without them (docs/elastic.md).")
                     ->Get()),
      ranks_returned(registry
                         .AddCounter("mesh_coordinator_ranks_returned_total",
                                     "New processes that joined as a lost rank of a job with "
                                     "in-place recovery.")
                         ->Get()) {}

Coordination::Coordination(const Clock* clock, CoordinationOptions options,
                           metrics::Registry* metrics)
    : clock_(clock),
      options_(std::move(options)),
      metrics_(metrics != nullptr ? *metrics : metrics::NoopRegistry()) {
  const absl::Status valid = ValidateOptions(options_);
  MESH_CHECK(valid.ok(), std::string(valid.message()).c_str());
  next_liveness_check_ = clock_->Now();
}

Coordination::~Coordination() { Shutdown(); }

absl::Duration Coordination::ClampTimeout(absl::Duration timeout) const {
  if (timeout <= absl::ZeroDuration()) return options_.default_wait;
  return std::min(timeout, options_.max_wait);
}

// ---- Jobs -------------------------------------------------------------------

std::unique_ptr<Coordination::Generation> Coordination::NewGenerationLocked(const Job& job,
                                                                            int64_t number) {
  return std::make_unique<Generation>(job.layout, number, waiters_.ReserveId(), options_);
}

absl::StatusOr<JobInfo> Coordination::CreateJob(JobLayout layout, int64_t generation) {
  if (absl::Status s = NormalizeJobLayout(layout); !s.ok()) return s;
  if (generation < 0) {
    return absl::InvalidArgumentError(absl::StrCat("generation ", generation, " is negative"));
  }
  absl::MutexLock lock(&mu_);
  if (shut_down_) return UnavailableShutDown();
  if (layout.job_id.empty()) {
    do {
      layout.job_id = absl::StrCat("adhoc-", next_job_number_++);
    } while (jobs_.contains(layout.job_id));
  } else if (!IsValidJobId(layout.job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id '", layout.job_id, "' must be 1-128 characters of [A-Za-z0-9._-]"));
  }
  if (jobs_.contains(layout.job_id)) {
    return absl::AlreadyExistsError(absl::StrCat("job ", layout.job_id, " already exists"));
  }
  auto job = std::make_unique<Job>();
  job->layout = std::move(layout);
  job->current = NewGenerationLocked(*job, generation);
  // Re-created (placed again after a failure): the failure stays known to
  // late callers of its generation, now through the job.
  if (auto failed = failed_removed_.find(job->layout.job_id); failed != failed_removed_.end()) {
    job->previous_error = std::move(failed->second);
    failed_removed_.erase(failed);
  }
  JobInfo info;
  info.layout = job->layout;
  info.generation = generation;
  jobs_.emplace(job->layout.job_id, std::move(job));
  return info;
}

absl::StatusOr<JobInfo> Coordination::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  const Generation& gen = *it->second->current;
  JobInfo info;
  info.layout = it->second->layout;
  info.generation = gen.number;
  info.failed = gen.error.has_value();
  info.membership_epoch = gen.epoch;
  info.membership.assign(gen.membership.begin(), gen.membership.end());
  return info;
}

absl::Status Coordination::RemoveJob(const std::string& job_id, const std::string& reason) {
  Completions done;
  std::unique_ptr<Job> removed;  // Destroyed after unlock, with what it holds.
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  EndGenerationLocked(
      *it->second->current,
      absl::AbortedError(absl::StrCat(it->second->current->Name(), " was removed: ", reason)),
      /*error=*/nullptr, done);
  if (const std::optional<JobError>& error = it->second->current->error; error.has_value()) {
    // A rank that calls in after its job failed and ended (a peer's exit
    // ended the job before this rank's next call) learns why, like the
    // ranks that were waiting: ABORTED naming the culprit, not NOT_FOUND.
    // Bounded by the deque (an id may be in it twice when its job was
    // re-created and failed again; evicting the older entry then forgets the
    // newer failure early, which only costs a late caller the detail).
    while (failed_removed_order_.size() >= kMaxFailedRemoved) {
      failed_removed_.erase(failed_removed_order_.front());
      failed_removed_order_.pop_front();
    }
    failed_removed_.insert_or_assign(job_id, *error);
    failed_removed_order_.push_back(job_id);
  }
  removed = std::move(it->second);
  jobs_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Coordination::BumpGeneration(const std::string& job_id,
                                                     const std::string& reason) {
  Completions done;
  std::unique_ptr<Generation> old;  // Destroyed after unlock, with what it holds.
  absl::MutexLock lock(&mu_);
  if (shut_down_) return UnavailableShutDown();
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  Job& job = *it->second;
  const int64_t next = job.current->number + 1;
  EndGenerationLocked(
      *job.current,
      absl::AbortedError(
          absl::StrCat(job.current->Name(), " was superseded by generation ", next, ": ", reason)),
      /*error=*/nullptr, done);
  job.previous_error = job.current->error;
  old = std::exchange(job.current, NewGenerationLocked(job, next));
  return next;
}

// ---- Fencing ------------------------------------------------------------------

absl::StatusOr<Coordination::Generation*> Coordination::ResolveLocked(const Caller& caller,
                                                                      bool require_joined,
                                                                      bool allow_failed,
                                                                      bool check_incarnation) {
  if (shut_down_) return UnavailableShutDown();
  if (caller.job_id.empty()) {
    return absl::InvalidArgumentError(
        "the request names no job: its RankContext (job_id, generation, rank, incarnation) is "
        "missing or has an empty job_id");
  }
  auto it = jobs_.find(caller.job_id);
  if (it == jobs_.end()) {
    auto failed = failed_removed_.find(caller.job_id);
    if (failed != failed_removed_.end() && failed->second.generation == caller.generation) {
      return absl::AbortedError(failed->second.message);
    }
    return absl::NotFoundError(absl::StrCat("unknown job '", caller.job_id, "'"));
  }
  Generation& gen = *it->second->current;
  if (const std::optional<JobError>& previous = it->second->previous_error;
      previous.has_value() && previous->generation == caller.generation) {
    return absl::AbortedError(previous->message);
  }
  if (caller.generation < gen.number) {
    return absl::AbortedError(absl::StrCat("job ", caller.job_id, ": generation ",
                                           caller.generation,
                                           " is stale; the job is at generation ", gen.number));
  }
  if (caller.generation > gen.number) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", caller.job_id, ": generation ", caller.generation,
                     " does not exist yet; the job is at generation ", gen.number));
  }
  if (caller.rank < 0 || caller.rank >= gen.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(gen.Name(), ": rank ", caller.rank, " is outside 0..", gen.world_size() - 1));
  }
  bool joined = gen.rendezvous.joined(caller.rank);
  if (!joined && require_joined && ReattachLocked(gen, caller)) joined = true;
  if (check_incarnation && joined &&
      gen.rendezvous.incarnation(caller.rank) != caller.incarnation) {
    return absl::AbortedError(absl::StrCat(
        gen.Name(), ": rank ", caller.rank, " is held by incarnation ",
        gen.rendezvous.incarnation(caller.rank), "; this process (incarnation ", caller.incarnation,
        ") is fenced out: a newer process joined as this rank, or this one never did"));
  }
  if (gen.error.has_value() && !allow_failed) return absl::AbortedError(gen.error->message);
  if (require_joined && joined) {
    if (auto lost = gen.lost.find(caller.rank); lost != gen.lost.end()) {
      return absl::AbortedError(lost->second.message);
    }
  }
  if (require_joined && !joined) {
    return absl::FailedPreconditionError(
        absl::StrCat(gen.Name(), ": rank ", caller.rank, " has not joined"));
  }
  return &gen;
}

bool Coordination::ReattachLocked(Generation& gen, const Caller& caller) {
  // Not while anyone waits in Join: a rank joining afresh means the world
  // is forming anew, and then every rank must join.
  if (gen.reattach_hosts.empty() || gen.error.has_value() || !gen.join_waiters.empty() ||
      gen.rendezvous.superseded(caller.rank, caller.incarnation)) {
    return false;
  }
  absl::StatusOr<bool> completed =
      gen.rendezvous.Join(caller.rank, caller.incarnation, gen.reattach_hosts[caller.rank],
                          DeviceInfo{}, /*world_unique_id=*/"");
  if (!completed.ok()) return false;
  spdlog::info("{}: rank {} re-attached (incarnation {})", gen.Name(), caller.rank,
               caller.incarnation);
  if (*completed) gen.liveness.Start(clock_->Now());
  return true;
}

absl::Status Coordination::AllowReattach(const std::string& job_id, int64_t generation,
                                         std::vector<std::string> hosts) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  Generation& gen = *it->second->current;
  if (gen.number != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is at generation ", gen.number, ", not ", generation));
  }
  if (static_cast<int>(hosts.size()) != gen.world_size() ||
      absl::c_any_of(hosts, [](const std::string& h) { return h.empty(); })) {
    return absl::InvalidArgumentError(absl::StrCat(
        gen.Name(), ": re-attaching needs one host per rank (", gen.world_size(), ")"));
  }
  gen.reattach_hosts = std::move(hosts);
  return absl::OkStatus();
}

uint64_t Coordination::AddWaiterLocked(Generation& gen, absl::Time deadline, Waiter waiter) {
  waiter.gen = &gen;
  return waiters_.Add(gen.scope, deadline, std::move(waiter));
}

}  // namespace mesh::coordinator
