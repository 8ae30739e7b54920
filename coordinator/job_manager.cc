// JobManager's job lifecycle: construction, Submit, scheduling passes,
// LAUNCH and KILL orders, failures and restarts, the end of a job, Cancel,
// and the clock (Tick) and Shutdown. Recovery, node sessions, queries and
// watches, worker reports and logs live in their own files (see
// job_manager_internal.h).
#include "coordinator/job_manager.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/util/message_differencer.h>
#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/duration_format.h"
#include "common/heartbeat_spread.h"
#include "coordinator/job_manager_internal.h"

namespace mesh::coordinator {

using ::mesh::v1::Assignment;
using ::mesh::v1::JOB_STATE_CANCELLED;
using ::mesh::v1::JOB_STATE_FAILED;
using ::mesh::v1::JOB_STATE_PENDING;
using ::mesh::v1::JOB_STATE_RESTARTING;
using ::mesh::v1::JOB_STATE_RUNNING;
using ::mesh::v1::JOB_STATE_SCHEDULED;
using ::mesh::v1::JOB_STATE_SUCCEEDED;
using ::mesh::v1::JobSpec;
using ::mesh::v1::RootCause;

namespace {

bool IsLiveState(JobState state) {
  return state == JOB_STATE_PENDING || state == JOB_STATE_SCHEDULED || state == JOB_STATE_RUNNING ||
         state == JOB_STATE_RESTARTING;
}

// MASTER_PORT for torch's env:// rendezvous: derived from the job and
// generation (FNV-1a), in 20000..49999, so every node computes the same one
// and a restart gets a fresh port.
int MasterPort(const std::string& job_id, int64_t generation) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : job_id) hash = (hash ^ c) * 1099511628211ull;
  hash = (hash ^ static_cast<uint64_t>(generation)) * 1099511628211ull;
  return 20000 + static_cast<int>(hash % 30000);
}

}  // namespace

int64_t JobNumber(const std::string& id) {
  int64_t number = 0;
  if (absl::StartsWith(id, "job-") && absl::SimpleAtoi(id.substr(4), &number)) return number;
  return 0;
}

absl::Status ValidateJobManagerOptions(const JobManagerOptions& options) {
  if (absl::Status status = ValidateJobSpecLimits(options.spec_limits); !status.ok()) {
    return status;
  }
  auto positive = [](absl::Duration d, const char* name) -> absl::Status {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be positive, not ", FormatDurationShort(d)));
    }
    return absl::OkStatus();
  };
  for (auto [d, name] : {std::pair{options.node_heartbeat_interval, "node_heartbeat_interval"},
                         std::pair{options.node_heartbeat_timeout, "node_heartbeat_timeout"},
                         std::pair{options.max_wait, "max_wait"},
                         std::pair{options.log_attach_timeout, "log_attach_timeout"}}) {
    if (absl::Status status = positive(d, name); !status.ok()) return status;
  }
  if (absl::Status s = CheckHeartbeatRate(options.node_heartbeat_rate, "node_heartbeat_rate");
      !s.ok()) {
    return s;
  }
  if (options.kill_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kill_grace must not be negative");
  }
  if (options.node_recovery_grace < absl::ZeroDuration() ||
      options.node_recovery_grace == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_recovery_grace must be finite and not negative, not ",
                     FormatDurationShort(options.node_recovery_grace)));
  }
  if (options.max_pending_jobs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_pending_jobs must be positive, not ", options.max_pending_jobs));
  }
  if (options.node_heartbeat_timeout <= options.node_heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node_heartbeat_timeout (", FormatDurationShort(options.node_heartbeat_timeout),
        ") must be longer than node_heartbeat_interval (",
        FormatDurationShort(options.node_heartbeat_interval), ")"));
  }
  return absl::OkStatus();
}

JobManager::JobManager(const Clock* clock, JobStore* store, Coordination* coordination,
                       JobManagerOptions options, metrics::Registry* metrics,
                       ServiceDiscovery* discovery)
    : clock_(clock),
      store_(store),
      coordination_(coordination),
      options_(std::move(options)),
      metrics_(metrics != nullptr ? *metrics : metrics::NoopRegistry()),
      discovery_(discovery),
      scheduler_(options_.scheduler),
      log_relay_(clock, options_.log_attach_timeout) {
  MESH_CHECK(clock_ != nullptr && store_ != nullptr && coordination_ != nullptr,
             "JobManager needs a clock, a store and a coordination");
  const absl::Status valid = ValidateJobManagerOptions(options_);
  MESH_CHECK(valid.ok(), std::string(valid.message()).c_str());
  // A listener call already under way on another thread when this manager
  // is destroyed finishes first (the token's mutex); later ones do nothing.
  listener_token_ = std::make_shared<ListenerToken>();
  {
    absl::MutexLock lock(&listener_token_->mu);
    listener_token_->manager = this;
  }
  coordination_->SetFailureListener(
      [token = listener_token_](const std::string& job_id, const JobError& error) {
        absl::MutexLock lock(&token->mu);
        if (token->manager != nullptr) token->manager->GenerationFailed(job_id, error);
      });
}

JobManager::~JobManager() {
  coordination_->SetFailureListener(nullptr);
  {
    absl::MutexLock lock(&listener_token_->mu);
    listener_token_->manager = nullptr;
  }
  Shutdown();
}

void JobManager::GenerationFailed(const std::string& job_id, const JobError& error) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    Job* job = FindJobLocked(job_id);
    if (job == nullptr || !job->holds || error.generation != job->generation()) return;
    RootCause cause;
    cause.set_rank(error.rank);
    if (error.rank >= 0 && error.rank < job->placement->world_size) {
      cause.set_node(job->placement->ranks[error.rank].node);
    }
    cause.set_host(error.host);
    cause.set_generation(error.generation);
    cause.set_hang(error.hang);
    cause.set_message(error.rank < 0 ? error.message
                      : error.hang   ? absl::StrCat("rank ", error.rank, " (node ", cause.node(),
                                                    ") hung: ", error.reason)
                                     : absl::StrCat("rank ", error.rank, " (node ", cause.node(),
                                                    ") failed: ", error.reason));
    const bool fail_now = error.hang && job->spec.on_hang() == v1::HANG_POLICY_FAIL;
    FailJobLocked(*job, std::move(cause), effects, fail_now ? "on_hang is FAIL" : "");
    while (effects.TakeReschedule()) ScheduleLocked(effects);
  }
  effects.Run();
}

absl::Duration JobManager::TickInterval() const {
  return std::min(absl::Milliseconds(100), options_.node_heartbeat_interval);
}

JobManagerStats JobManager::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

// ---- Helpers ------------------------------------------------------------------------------

void JobManager::FlushDiscoveryLater(Effects& effects) {
  if (discovery_ == nullptr) return;
  effects.Call([discovery = discovery_] {
    if (absl::Status status = discovery->Flush(); !status.ok()) {
      spdlog::error("{}", status.ToString());
    }
  });
}

JobManager::Job* JobManager::FindJobLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const JobManager::Job* JobManager::FindJobLocked(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

JobUpdate JobManager::UpdateOfLocked(const Job& job) const {
  const JobStateMachine& machine = *job.machine;
  JobUpdate update;
  update.expected_version = job.version;
  update.state = JobStateName(machine.state());
  update.pending_reason = machine.pending_reason();
  update.generation = machine.generation();
  update.restarts = machine.restarts();
  update.root_cause = machine.has_root_cause() ? machine.root_cause().SerializeAsString() : "";
  update.placement = job.placement.has_value() ? EncodePlacement(*job.placement) : "";
  update.resizes = EncodeResizes(job.resizes);
  update.reason = machine.events().empty() ? "" : machine.events().back().reason;
  return update;
}

absl::Status JobManager::PersistLocked(Job& job) {
  const JobStateMachine& machine = *job.machine;
  absl::StatusOr<JobRecord> stored = store_->UpdateJob(job.id, UpdateOfLocked(job));
  if (!stored.ok()) {
    ++stats_.store_failures;
    spdlog::error("job {}: cannot store state {}: {}", job.id, JobStateName(machine.state()),
                  stored.status().ToString());
    // The version may have moved if the commit failed after a write we do
    // not know of; re-read it so the next write can succeed.
    if (absl::StatusOr<JobRecord> current = store_->GetJob(job.id); current.ok()) {
      job.version = current->version;
    }
    CountJobLocked(job);
    return stored.status();
  }
  job.version = stored->version;
  CountJobLocked(job);
  return absl::OkStatus();
}

// SCHEDULED → RUNNING once every rank runs (or has already exited 0).
void JobManager::MaybeStartLocked(Job& job, Effects& effects) {
  if (job.state() != JOB_STATE_SCHEDULED) return;
  const bool all = std::all_of(job.ranks.begin(), job.ranks.end(), [](Job::Rank r) {
    return r == Job::Rank::kRunning || r == Job::Rank::kSucceeded;
  });
  if (!all) return;
  (void)job.machine->Start(absl::StrCat("all ", job.ranks.size(), " ranks are running"));
  AfterTransitionLocked(job, effects);
}

// Persists and announces the transition just made.
void JobManager::AfterTransitionLocked(Job& job, Effects& effects) {
  (void)PersistLocked(job);  // Logged and counted; see "Durability".
  NotifyWatchersLocked(job);
  if (IsTerminal(job.state())) FinishJobLocked(job, effects);
}

void JobManager::SendLocked(Node& node, const Assignment& order) {
  if (node.sink != nullptr) {
    node.sink->Send(order);
  } else if (!node.session_id.empty() && order.action() == Assignment::ACTION_KILL) {
    // Registered, stream not (yet) open: deliver when it opens. LAUNCH is
    // recomputed then, and a node without a session is told what to kill
    // when it registers again.
    node.pending.push_back(order);
  }
}

Assignment JobManager::KillOrder(const std::string& job_id, int64_t generation,
                                 const std::string& reason) const {
  Assignment order;
  order.set_action(Assignment::ACTION_KILL);
  order.set_job_id(job_id);
  order.set_generation(generation);
  order.set_grace_period_seconds(absl::ToDoubleSeconds(options_.kill_grace));
  order.set_reason(reason);
  return order;
}

void JobManager::SendKillLocked(const Job& job, const std::string& node_name, int64_t generation,
                                const std::string& reason) {
  auto it = nodes_.find(node_name);
  if (it == nodes_.end()) return;
  SendLocked(*it->second, KillOrder(job.id, generation, reason));
}

void JobManager::SendLaunchLocked(Job& job, Node& node) {
  if (node.sink == nullptr || !job.placement.has_value()) return;
  const Placement& placement = *job.placement;
  Assignment order;
  order.set_action(Assignment::ACTION_LAUNCH);
  order.set_job_id(job.id);
  order.set_generation(job.generation());
  for (const RankPlacement& rank : placement.ranks) {
    if (rank.node != node.name || job.ranks[rank.rank] != Job::Rank::kLaunching) continue;
    mesh::v1::RankLaunch* launch = order.add_ranks();
    launch->set_rank(rank.rank);
    launch->set_local_rank(rank.local_rank);
    for (int gpu : rank.gpus) launch->add_gpus(gpu);
    order.set_node_rank(rank.node_rank);
  }
  if (order.ranks().empty()) return;
  for (const std::string& arg : job.spec.command()) order.add_command(arg);
  order.set_working_dir(job.spec.working_dir());
  *order.mutable_env() = job.spec.env();
  order.set_world_size(placement.world_size);
  order.set_num_nodes(static_cast<int32_t>(placement.nodes.size()));
  order.set_local_world_size(placement.nproc_per_node);
  order.set_master_addr(placement.node_addresses.empty() ? "" : placement.node_addresses[0]);
  order.set_master_port(MasterPort(job.id, job.generation()));
  order.set_restart_count(job.machine->restarts());
  order.set_max_restarts(job.machine->max_restarts());
  order.set_gpu_job(job.spec.gpus_per_proc() > 0);
  order.set_reason(absl::StrCat("generation ", job.generation()));
  if (options_.mint_worker_token) order.set_worker_token(options_.mint_worker_token(job.id));
  order.set_owner(job.owner);
  if (options_.unix_account && !job.owner.empty()) {
    if (std::optional<JobManagerOptions::UnixAccount> account = options_.unix_account(job.owner)) {
      order.set_unix_user(account->unix_user);
      order.set_allow_root(account->allow_root);
    }
  }
  order.set_memory_per_proc_bytes(job.spec.memory_per_proc_bytes());
  order.set_max_pids(job.spec.max_pids());
  // Every rank of a RUNNING job was started: a rank to launch now replaces
  // one that failed (in-place recovery), except on a node that takes over a
  // lost node's ranks, which starts the generation.
  order.set_replace(job.state() == mesh::v1::JOB_STATE_RUNNING &&
                    !job.replacement_nodes.contains(node.name));
  if (order.replace())
    order.set_reason(absl::StrCat("generation ", job.generation(), ": in place"));
  node.sink->Send(order);
}

void JobManager::LaunchLocked(Job& job, Effects& effects) {
  (void)effects;
  MESH_CHECK(job.placement.has_value(), "launch without a placement");
  const Placement& placement = *job.placement;
  job.ranks.assign(placement.world_size, Job::Rank::kLaunching);
  job.pids.assign(placement.world_size, 0);
  job.gone_at.clear();
  job.unaccounted_deadline = absl::InfiniteFuture();
  job.replacement_nodes.clear();
  job.left_generation.clear();
  // Workers rendezvous in Coordination at the job's generation.
  auto info = coordination_->GetJob(job.id);
  if (info.ok() && info->generation != job.generation()) {
    if (info->generation < job.generation() && info->layout.world_size == placement.world_size) {
      while (info.ok() && info->generation < job.generation()) {
        if (!coordination_->BumpGeneration(job.id, "the job restarted").ok()) break;
        info = coordination_->GetJob(job.id);
      }
    } else {
      (void)coordination_->RemoveJob(job.id, "the job was placed again");
      info = absl::NotFoundError("removed");
    }
  }
  if (!info.ok()) {
    JobLayout layout;
    layout.job_id = job.id;
    layout.world_size = placement.world_size;
    layout.mesh_shape = placement.mesh_shape;
    layout.mesh_dim_names = placement.mesh_dim_names;
    layout.hang_timeout = HangTimeout(job.spec);
    layout.in_place = job.spec.restart_policy() == mesh::v1::RESTART_POLICY_IN_PLACE;
    layout.in_place_dim = layout.in_place ? job.spec.in_place_dim() : std::string();
    if (auto created = coordination_->CreateJob(layout, job.generation()); !created.ok()) {
      spdlog::error("job {}: cannot create its rendezvous: {}", job.id,
                    created.status().ToString());
    }
  }
  for (const std::string& name : placement.nodes) {
    auto it = nodes_.find(name);
    if (it != nodes_.end()) SendLaunchLocked(job, *it->second);
  }
}

void JobManager::FinishJobLocked(Job& job, Effects& effects) {
  const JobState state = job.state();
  CountJobLocked(job);
  metrics_.finished->WithLabels({JobStateName(state)})->Increment();
  if (discovery_ != nullptr) {
    discovery_->RemoveJob(job.id);
    FlushDiscoveryLater(effects);
  }
  switch (state) {
    case JOB_STATE_SUCCEEDED:
      ++stats_.jobs_succeeded;
      break;
    case JOB_STATE_FAILED:
      ++stats_.jobs_failed;
      break;
    case JOB_STATE_CANCELLED:
      ++stats_.jobs_cancelled;
      break;
    default:
      break;
  }
  if (job.holds) {
    const std::string reason = absl::StrCat("job ", JobStateName(state));
    for (const std::string& node : job.placement->nodes) {
      SendKillLocked(job, node, job.generation(), reason);
    }
    (void)scheduler_.Release(job.id);
    job.holds = false;
    effects.Reschedule();
  }
  job.ranks.clear();
  job.pids.clear();
  job.unaccounted_deadline = absl::InfiniteFuture();
  (void)coordination_->RemoveJob(job.id, absl::StrCat("the job is ", JobStateName(state)));
  // Waiters learn the outcome after unlock.
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second->job_id != job.id) {
      ++it;
      continue;
    }
    effects.Call([done = std::move(it->second->done),
                  proto = JobProtoLocked(job, /*with_events=*/true)]() mutable {
      std::move(done)(std::move(proto));
    });
    it = waiters_.erase(it);
  }
}

// A worker or node of the job failed: restart or fail.
void JobManager::FailJobLocked(Job& job, RootCause cause, Effects& effects,
                               absl::string_view no_restart) {
  const std::string message = cause.message();
  absl::StatusOr<JobState> next = job.machine->WorkerFailed(std::move(cause), no_restart);
  if (!next.ok()) {
    if (absl::IsAborted(next.status())) ++stats_.stale_reports;
    spdlog::info("job {}: ignoring a failure: {}", job.id, next.status().ToString());
    return;
  }
  spdlog::warn("job {}: {}", job.id, job.machine->events().back().reason);
  if (*next == JOB_STATE_FAILED) {
    AfterTransitionLocked(job, effects);
    return;
  }
  // RESTARTING: the generation is already bumped.
  ++stats_.restarts;
  metrics_.restarts->Increment();
  RelaunchLocked(job, message, effects);
}

void JobManager::RelaunchLocked(Job& job, const std::string& why, Effects& effects) {
  if (discovery_ != nullptr) {
    discovery_->RemoveJob(job.id);  // The old generation's workers.
    FlushDiscoveryLater(effects);
  }
  (void)PersistLocked(job);
  NotifyWatchersLocked(job);
  const int64_t failed = job.generation() - 1;
  for (const std::string& node : job.placement->nodes) {
    SendKillLocked(job, node, failed, absl::StrCat("restart: ", why));
  }
  (void)coordination_->BumpGeneration(job.id, absl::StrCat("restart: ", why));
  std::vector<std::string> missing;
  for (const std::string& name : job.placement->nodes) {
    auto it = nodes_.find(name);
    if (it == nodes_.end() || !it->second->ready) missing.push_back(name);
  }
  const int nodes_now = static_cast<int>(job.placement->nodes.size());
  if (job.node_cap == 0) job.node_cap = NodeCapLocked(job);
  job.replace_reason = why;
  if (missing.empty() && job.node_cap <= nodes_now) {
    (void)job.machine->Schedule(
        absl::StrCat("relaunching generation ", job.generation(), " on the same nodes"));
    (void)PersistLocked(job);
    NotifyWatchersLocked(job);
    LaunchLocked(job, effects);
    return;
  }
  // Some node is gone, or the job may grow: give everything back and be
  // placed again.
  (void)scheduler_.Release(job.id);
  job.holds = false;
  job.ranks.clear();
  job.pids.clear();
  (void)coordination_->RemoveJob(job.id, "the job must be placed again");
  (void)job.machine->SetPending(
      missing.empty()
          ? absl::StrCat("waiting to be placed again on up to ", job.node_cap, " nodes")
          : absl::StrCat("waiting to be placed again: node ", absl::StrJoin(missing, ", "),
                         missing.size() == 1 ? " is" : " are", " lost"));
  (void)PersistLocked(job);
  NotifyWatchersLocked(job);
  effects.Reschedule();
}

std::vector<NodeView> JobManager::NodeViewsLocked() const {
  std::vector<NodeView> views;
  for (const auto& [name, node] : nodes_) {
    NodeView view;
    view.name = name;
    view.address = node->address;
    view.slots = node->slots;
    for (const auto& gpu : node->gpus) view.gpus.push_back(gpu.index());
    view.state = node->ready && !node->session_id.empty() ? NodeState::kReady : NodeState::kLost;
    views.push_back(std::move(view));
  }
  return views;
}

JobRequest JobManager::RequestOfLocked(const Job& job) const {
  JobRequest request;
  request.job_id = job.id;
  request.sequence = job.number;
  request.nodes_min = job.spec.nodes().min();
  request.nodes_max = job.spec.nodes().max();
  if (job.node_cap > 0) {
    request.nodes_max = std::max(request.nodes_min, std::min(request.nodes_max, job.node_cap));
  }
  request.nproc_per_node = job.spec.nproc_per_node();
  request.gpus_per_proc = job.spec.gpus_per_proc();
  const auto& shape = job.spec.mesh_shape();
  if (std::find(shape.begin(), shape.end(), -1) == shape.end()) {
    request.mesh_shape.assign(shape.begin(), shape.end());
    request.mesh_dim_names.assign(job.spec.mesh_dim_names().begin(),
                                  job.spec.mesh_dim_names().end());
  }
  return request;
}

void JobManager::ScheduleLocked(Effects& effects) {
  std::vector<JobRequest> pending;
  for (const auto& [id, job] : jobs_) {
    if (job->state() == JOB_STATE_PENDING) pending.push_back(RequestOfLocked(*job));
  }
  if (pending.empty()) return;
  absl::StatusOr<SchedulePassResult> pass = scheduler_.Schedule(NodeViewsLocked(), pending);
  if (!pass.ok()) {
    spdlog::error("scheduling pass failed: {}", pass.status().ToString());
    return;
  }
  for (const PendingJob& waiting : pass->pending) {
    if (Job* job = FindJobLocked(waiting.job_id)) (void)job->machine->SetPending(waiting.reason);
  }
  for (const RejectedJob& rejected : pass->rejected) {
    Job* job = FindJobLocked(rejected.job_id);
    if (job == nullptr) continue;
    RootCause cause;
    cause.set_rank(-1);
    cause.set_message(absl::StrCat("cannot be placed: ", rejected.status.message()));
    (void)job->machine->Fail(std::move(cause));
    AfterTransitionLocked(*job, effects);
  }
  for (Placement& placement : pass->placements) {
    Job* job = FindJobLocked(placement.job_id);
    if (job == nullptr) continue;
    // Resolve a -1 mesh dimension now that the node count is known.
    absl::StatusOr<std::vector<int64_t>> shape =
        ResolveMeshShape(job->spec, static_cast<int>(placement.nodes.size()));
    if (!shape.ok()) {
      (void)scheduler_.Release(job->id);
      RootCause cause;
      cause.set_rank(-1);
      cause.set_message(absl::StrCat("cannot be placed on ", placement.nodes.size(),
                                     " nodes: ", shape.status().message()));
      (void)job->machine->Fail(std::move(cause));
      AfterTransitionLocked(*job, effects);
      continue;
    }
    placement.mesh_shape = *shape;
    placement.mesh_dim_names.assign(job->spec.mesh_dim_names().begin(),
                                    job->spec.mesh_dim_names().end());
    const std::string reason = absl::StrCat(
        "placed on ", absl::StrJoin(placement.nodes, ", "), " (", placement.world_size, " ranks)",
        placement.topology_warning.empty() ? "" : "; ", placement.topology_warning);
    const std::string resized = PlacedLocked(*job, std::move(placement));
    job->holds = true;
    (void)job->machine->Schedule(resized.empty() ? reason : absl::StrCat(reason, "; ", resized));
    (void)PersistLocked(*job);
    NotifyWatchersLocked(*job);
    LaunchLocked(*job, effects);
  }
}

// ---- Submit and Cancel ----------------------------------------------------------------------

absl::StatusOr<mesh::v1::SubmitJobResponse> JobManager::Submit(JobSpec spec, std::string owner) {
  if (absl::Status valid = ValidateJobSpec(spec, options_.spec_limits); !valid.ok()) return valid;
  NormalizeJobSpec(options_.spec_limits, spec);
  Effects effects;
  mesh::v1::SubmitJobResponse response;
  {
    absl::MutexLock lock(&mu_);
    recovered_or_used_ = true;
    if (shut_down_) return ShuttingDown();
    // The queue cap. Counted here rather than kept as a counter: submits are
    // rare next to worker calls, and a count cannot drift from the states.
    int64_t pending = 0;
    bool resubmit = false;
    for (const auto& [id, job] : jobs_) {
      pending += job->machine->state() == JOB_STATE_PENDING;
      resubmit |=
          !spec.idempotency_key().empty() && job->spec.idempotency_key() == spec.idempotency_key();
    }
    if (pending >= options_.max_pending_jobs && !resubmit) {
      return absl::ResourceExhaustedError(
          absl::StrCat(pending, " jobs are pending, the limit of ", options_.max_pending_jobs,
                       "; submit again once some have started or ended"));
    }
    NewJob record;
    record.idempotency_key = spec.idempotency_key();
    record.name = spec.name();
    record.state = JobStateName(JOB_STATE_PENDING);
    record.pending_reason = "waiting for the scheduler";
    record.reason = "submitted";
    record.owner = owner;
    if (!spec.SerializeToString(&record.spec)) {
      return absl::InternalError("cannot serialize the job spec");
    }
    absl::StatusOr<CreateJobResult> created = store_->CreateJob(record);
    if (!created.ok()) return created.status();
    if (created->existed) {
      Job* existing = FindJobLocked(created->job.id);
      if (existing == nullptr) {
        return absl::InternalError(
            absl::StrCat("idempotency key names job ", created->job.id, ", which is not loaded"));
      }
      if (existing->owner != owner) {
        return absl::AlreadyExistsError(absl::StrCat("idempotency key '", spec.idempotency_key(),
                                                     "' was used by another owner"));
      }
      if (!google::protobuf::util::MessageDifferencer::Equals(existing->spec, spec)) {
        return absl::AlreadyExistsError(absl::StrCat("idempotency key '", spec.idempotency_key(),
                                                     "' was used for job ", existing->id,
                                                     " with a different spec"));
      }
      *response.mutable_job() = JobProtoLocked(*existing, /*with_events=*/false);
      response.set_deduplicated(true);
      return response;
    }
    auto job = std::make_unique<Job>();
    job->id = created->job.id;
    job->number = JobNumber(job->id);
    job->version = created->job.version;
    job->spec = std::move(spec);
    job->owner = std::move(owner);
    job->machine = std::make_unique<JobStateMachine>(job->id, job->spec.max_restarts(),
                                                     absl::Seconds(job->spec.deadline_seconds()),
                                                     record.pending_reason, *clock_);
    Job& ref = *job;
    CountJobLocked(*job);
    jobs_.emplace(ref.id, std::move(job));
    ++stats_.jobs_submitted;
    spdlog::info("job {} submitted: {} nodes x {} procs, command {}", ref.id,
                 ref.spec.nodes().min(), ref.spec.nproc_per_node(),
                 absl::StrJoin(ref.spec.command(), " "));
    ScheduleLocked(effects);
    while (effects.TakeReschedule()) ScheduleLocked(effects);
    *response.mutable_job() = JobProtoLocked(ref, /*with_events=*/false);
  }
  effects.Run();
  return response;
}

absl::StatusOr<mesh::v1::Job> JobManager::Cancel(const std::string& job_id,
                                                 const std::string& reason) {
  Effects effects;
  mesh::v1::Job proto;
  {
    absl::MutexLock lock(&mu_);
    recovered_or_used_ = true;
    if (shut_down_) return ShuttingDown();
    Job* job = FindJobLocked(job_id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    if (IsTerminal(job->state())) return JobProtoLocked(*job, /*with_events=*/true);
    // Commit first: the cancel is acknowledged only once it is durable.
    // The whole current state, as PersistLocked writes it, but CANCELLED.
    JobUpdate update = UpdateOfLocked(*job);
    update.state = JobStateName(JOB_STATE_CANCELLED);
    update.pending_reason = "";
    update.reason = reason.empty() ? "cancelled" : absl::StrCat("cancelled: ", reason);
    absl::StatusOr<JobRecord> stored = store_->UpdateJob(job->id, update);
    if (!stored.ok()) return stored.status();
    job->version = stored->version;
    MESH_CHECK(job->machine->Cancel(update.reason).ok(), "every live state can be cancelled");
    CountJobLocked(*job);
    spdlog::info("job {} cancelled{}{}", job->id, reason.empty() ? "" : ": ", reason);
    NotifyWatchersLocked(*job);
    FinishJobLocked(*job, effects);
    while (effects.TakeReschedule()) ScheduleLocked(effects);
    proto = JobProtoLocked(*job, /*with_events=*/true);
  }
  effects.Run();
  return proto;
}

// ---- Time and shutdown ----------------------------------------------------------------------

void JobManager::Tick() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    const absl::Time now = clock_->Now();
    ExpireSilentNodesLocked(now, effects);
    for (auto& [id, job] : jobs_) {
      if (job->holds && job->unaccounted_deadline <= now) {
        // Only ranks whose own deadline passed; the others keep theirs.
        job->unaccounted_deadline = absl::InfiniteFuture();
        for (size_t rank = 0; rank < job->ranks.size(); ++rank) {
          const bool relaunching = job->ranks[rank] == Job::Rank::kLaunching &&
                                   job->state() == mesh::v1::JOB_STATE_RUNNING;
          if (job->ranks[rank] != Job::Rank::kUnaccounted && !relaunching) continue;
          if (job->gone_at[rank] > now) {
            job->unaccounted_deadline = std::min(job->unaccounted_deadline, job->gone_at[rank]);
            continue;
          }
          const RankPlacement& placed = job->placement->ranks[rank];
          RootCause cause;
          cause.set_rank(static_cast<int>(rank));
          cause.set_node(placed.node);
          if (auto node = nodes_.find(placed.node); node != nodes_.end()) {
            cause.set_host(node->second->address);
          }
          cause.set_generation(job->generation());
          cause.set_message(
              relaunching
                  ? absl::StrCat("rank ", rank, " (node ", placed.node,
                                 ") was relaunched in place, but its agent did not report it "
                                 "started within ",
                                 FormatDurationShort(InPlaceStartTimeout()))
                  : absl::StrCat("rank ", rank, " (node ", placed.node,
                                 ") is gone: its agent did not report it running or "
                                 "exited after reconnecting"));
          FailJobLocked(*job, std::move(cause), effects);
          break;
        }
      }
      if (IsLiveState(job->state()) && job->machine->ExpireIfPastDeadline()) {
        spdlog::warn("job {}: {}", id, job->machine->events().back().reason);
        AfterTransitionLocked(*job, effects);
      }
    }
    ExpireWaitersLocked(now, effects);
    log_relay_.ExpireAttachDeadlines();
    GrowJobsLocked(now, effects);
    while (effects.TakeReschedule()) ScheduleLocked(effects);
  }
  effects.Run();
}

void JobManager::Shutdown() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& [id, job] : jobs_) {
      for (auto& [handle, sink] : job->watchers) sink->End(ShuttingDown());
      job->watchers.clear();
    }
    state_watch_jobs_.clear();
    for (auto& [name, node] : nodes_) {
      if (node->sink != nullptr) node->sink->End(ShuttingDown());
      node->sink = nullptr;
      node->stream = 0;
    }
    assignment_streams_.clear();
    log_relay_.Shutdown(ShuttingDown());
    for (auto& [handle, waiter] : waiters_) {
      effects.Call([done = std::move(waiter->done)]() mutable { std::move(done)(ShuttingDown()); });
    }
    waiters_.clear();
  }
  effects.Run();
}

}  // namespace mesh::coordinator
