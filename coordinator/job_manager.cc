#include "coordinator/job_manager.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <random>
#include <utility>

#include <google/protobuf/util/message_differencer.h>
#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/duration_format.h"

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

absl::Status Unavailable() { return absl::UnavailableError("the coordinator is shutting down"); }

// "READY"/"LOST" in the store; the proto enum on the wire.
constexpr const char* kNodeReady = "READY";
constexpr const char* kNodeLost = "LOST";

absl::StatusOr<JobState> ParseJobState(const std::string& name) {
  for (int value = mesh::v1::JobState_MIN; value <= mesh::v1::JobState_MAX; ++value) {
    const auto state = static_cast<JobState>(value);
    if (mesh::v1::JobState_IsValid(value) && JobStateName(state) == name) return state;
  }
  return absl::DataLossError(absl::StrCat("unknown job state '", name, "'"));
}

bool IsLiveState(JobState state) {
  return state == JOB_STATE_PENDING || state == JOB_STATE_SCHEDULED || state == JOB_STATE_RUNNING ||
         state == JOB_STATE_RESTARTING;
}

// Node names follow job ids: [A-Za-z0-9._-]{1,128}.
bool IsValidNodeName(const std::string& name) { return IsValidJobId(name); }

std::string NewSessionId() {
  static thread_local std::mt19937_64 random(std::random_device{}());
  return absl::StrCat(absl::Hex(random(), absl::kZeroPad16), absl::Hex(random(), absl::kZeroPad16));
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

const char* SignalName(int signal) {
  switch (signal) {
    case 1:
      return "SIGHUP";
    case 2:
      return "SIGINT";
    case 3:
      return "SIGQUIT";
    case 4:
      return "SIGILL";
    case 6:
      return "SIGABRT";
    case 7:
      return "SIGBUS";
    case 8:
      return "SIGFPE";
    case 9:
      return "SIGKILL";
    case 11:
      return "SIGSEGV";
    case 13:
      return "SIGPIPE";
    case 14:
      return "SIGALRM";
    case 15:
      return "SIGTERM";
    default:
      return "";
  }
}

std::string DescribeSignal(int signal) {
  const char* name = SignalName(signal);
  return *name ? absl::StrCat(signal, " (", name, ")") : absl::StrCat(signal);
}

int64_t JobNumber(const std::string& id) {
  int64_t number = 0;
  if (absl::StartsWith(id, "job-") && absl::SimpleAtoi(id.substr(4), &number)) return number;
  return 0;
}

}  // namespace

// ---- Records ------------------------------------------------------------------------------

struct JobManager::Job {
  enum class Rank { kLaunching, kRunning, kSucceeded, kUnaccounted };

  std::string id;
  int64_t number = 0;  // Submission order.
  JobSpec spec;
  std::string owner;  // The submitting principal; empty: none.
  std::unique_ptr<JobStateMachine> machine;
  int64_t version = 0;  // The store version this process last wrote or read.
  // The latest placement; kept after the job ends so its logs can be found.
  std::optional<Placement> placement;
  bool holds = false;  // The placement is held in scheduler_.
  // Per rank of the current generation, while placed.
  std::vector<Rank> ranks;
  // For each kUnaccounted rank, when it is declared gone; the earliest of
  // them in unaccounted_deadline (InfiniteFuture: none).
  std::vector<absl::Time> gone_at;
  absl::Time unaccounted_deadline = absl::InfiniteFuture();

  void MarkUnaccounted(int rank, absl::Time deadline) {
    if (gone_at.size() != ranks.size()) gone_at.assign(ranks.size(), absl::InfiniteFuture());
    if (ranks[rank] != Rank::kUnaccounted) gone_at[rank] = deadline;
    ranks[rank] = Rank::kUnaccounted;
    unaccounted_deadline = std::min(unaccounted_deadline, gone_at[rank]);
  }
  std::map<uint64_t, JobStateSink*> watchers;
  // The state counted in mesh_coordinator_jobs; nullopt: not counted yet.
  std::optional<JobState> counted;

  JobState state() const { return machine->state(); }
  int64_t generation() const { return machine->generation(); }
};

struct JobManager::Node {
  std::string name;
  std::string address;
  int slots = 0;
  std::vector<mesh::v1::NodeGpu> gpus;
  std::string agent_version;
  bool ready = true;       // READY; false: LOST.
  std::string session_id;  // Empty until the agent registers (again).
  absl::Time last_seen;
  // Silence counts from max(last_seen, this): after Recover, the end of the
  // recovery grace.
  absl::Time silence_from = absl::InfinitePast();
  uint64_t stream = 0;  // Handle of the open WatchAssignments, or 0.
  AssignmentSink* sink = nullptr;
  std::vector<Assignment> pending;      // Delivered when the stream opens.
  int metrics_port = 0;                 // The agent's /metrics; 0: none.
  metrics::Gauge* heartbeat = nullptr;  // Its last-heartbeat gauge.
};

struct JobManager::LogRequest {
  uint64_t handle = 0;
  std::string job_id;
  int64_t generation = 0;
  LogSink* sink = nullptr;
  // Ranks each node still owes an eof for.
  std::map<std::string, std::set<int>> left;
  std::map<std::string, uint64_t> uploads;  // Node → attached upload.
  absl::Time attach_deadline;
};

struct JobManager::Upload {
  uint64_t request = 0;
  std::string node;
  UploadControl* control = nullptr;
};

struct JobManager::Waiter {
  std::string job_id;
  absl::Time deadline;
  Callback<mesh::v1::Job> done;
};

// What a locked section leaves to do after unlocking: callbacks to run, and
// whether a scheduling pass is due (run before unlocking, by Finish).
class JobManager::Effects {
 public:
  void Call(absl::AnyInvocable<void() &&> call) { calls_.push_back(std::move(call)); }
  void Reschedule() { reschedule_ = true; }
  bool TakeReschedule() { return std::exchange(reschedule_, false); }

  // Runs the callbacks; call with no lock held.
  void Run() {
    for (auto& call : calls_) std::move(call)();
    calls_.clear();
  }

 private:
  std::vector<absl::AnyInvocable<void() &&>> calls_;
  bool reschedule_ = false;
};

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

namespace {
constexpr JobState kAllJobStates[] = {JOB_STATE_PENDING,    JOB_STATE_SCHEDULED, JOB_STATE_RUNNING,
                                      JOB_STATE_RESTARTING, JOB_STATE_SUCCEEDED, JOB_STATE_FAILED,
                                      JOB_STATE_CANCELLED};
}  // namespace

JobManager::Metrics::Metrics(metrics::Registry& registry)
    : jobs(registry.AddGauge("mesh_coordinator_jobs", "Jobs in each state.", {"state"})),
      finished(registry.AddCounter("mesh_coordinator_jobs_finished_total",
                                   "Jobs that reached a terminal state.", {"state"})),
      restarts(registry
                   .AddCounter("mesh_coordinator_job_restarts_total",
                               "Restarts of any job (a worker or node failed with restarts left).")
                   ->Get()),
      nodes_ready(registry.AddGauge("mesh_coordinator_nodes", "Nodes in each state.", {"state"})
                      ->WithLabels({"READY"})),
      nodes_lost(registry.AddGauge("mesh_coordinator_nodes", "Nodes in each state.", {"state"})
                     ->WithLabels({"LOST"})),
      node_heartbeat(registry.AddGauge("mesh_coordinator_node_last_heartbeat_timestamp_seconds",
                                       "Unix time of the last heartbeat (or call) of each node.",
                                       {"node"})) {
  // Every state shows, at 0, from the start: a dashboard can tell "none"
  // from "not exported".
  for (JobState state : kAllJobStates) jobs->WithLabels({JobStateName(state)});
  for (JobState state : {JOB_STATE_SUCCEEDED, JOB_STATE_FAILED, JOB_STATE_CANCELLED}) {
    finished->WithLabels({JobStateName(state)});
  }
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
      scheduler_(options_.scheduler) {
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
    cause.set_message(error.rank >= 0 ? absl::StrCat("rank ", error.rank, " (node ", cause.node(),
                                                     ") failed: ", error.reason)
                                      : error.message);
    FailJobLocked(*job, std::move(cause), effects);
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

void JobManager::CountJobLocked(Job& job) {
  const JobState state = job.state();
  if (job.counted == state) return;
  if (job.counted.has_value()) metrics_.jobs->WithLabels({JobStateName(*job.counted)})->Decrement();
  metrics_.jobs->WithLabels({JobStateName(state)})->Increment();
  job.counted = state;
}

void JobManager::CountNodesLocked() {
  int ready = 0;
  for (const auto& [name, node] : nodes_) ready += node->ready ? 1 : 0;
  metrics_.nodes_ready->Set(ready);
  metrics_.nodes_lost->Set(static_cast<double>(nodes_.size()) - ready);
}

void JobManager::SeenLocked(Node& node, absl::Time now) {
  node.last_seen = now;
  node.silence_from = absl::InfinitePast();  // Heard from: the recovery grace is over.
  if (node.heartbeat == nullptr) node.heartbeat = metrics_.node_heartbeat->WithLabels({node.name});
  node.heartbeat->Set(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
}

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

absl::StatusOr<JobManager::Node*> JobManager::SessionNodeLocked(const std::string& name,
                                                                const std::string& session_id) {
  if (shut_down_) return Unavailable();
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown node '", name, "': register first"));
  }
  Node& node = *it->second;
  if (node.session_id.empty() || node.session_id != session_id) {
    return absl::AbortedError(
        absl::StrCat("node ", name, ": session ", session_id, " is not current",
                     node.ready ? " (the node registered again)" : " (the node was marked lost)",
                     "; register again"));
  }
  return &node;
}

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
  return proto;
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
  node.sink->Send(order);
}

void JobManager::LaunchLocked(Job& job, Effects& effects) {
  (void)effects;
  MESH_CHECK(job.placement.has_value(), "launch without a placement");
  const Placement& placement = *job.placement;
  job.ranks.assign(placement.world_size, Job::Rank::kLaunching);
  job.unaccounted_deadline = absl::InfiniteFuture();
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
void JobManager::FailJobLocked(Job& job, RootCause cause, Effects& effects) {
  const std::string message = cause.message();
  absl::StatusOr<JobState> next = job.machine->WorkerFailed(std::move(cause));
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
  // RESTARTING: the generation is already bumped. Kill the failed one.
  ++stats_.restarts;
  metrics_.restarts->Increment();
  if (discovery_ != nullptr) {
    discovery_->RemoveJob(job.id);  // The old generation's workers.
    FlushDiscoveryLater(effects);
  }
  (void)PersistLocked(job);
  NotifyWatchersLocked(job);
  const int64_t failed = job.generation() - 1;
  for (const std::string& node : job.placement->nodes) {
    SendKillLocked(job, node, failed, absl::StrCat("restart: ", message));
  }
  (void)coordination_->BumpGeneration(job.id, absl::StrCat("restart: ", message));
  std::vector<std::string> missing;
  for (const std::string& name : job.placement->nodes) {
    auto it = nodes_.find(name);
    if (it == nodes_.end() || !it->second->ready) missing.push_back(name);
  }
  if (missing.empty()) {
    (void)job.machine->Schedule(
        absl::StrCat("relaunching generation ", job.generation(), " on the same nodes"));
    (void)PersistLocked(job);
    NotifyWatchersLocked(job);
    LaunchLocked(job, effects);
    return;
  }
  // Some node is gone: give everything back and wait to be placed again.
  (void)scheduler_.Release(job.id);
  job.holds = false;
  job.ranks.clear();
  (void)coordination_->RemoveJob(job.id, "the job must be placed again");
  (void)job.machine->SetPending(
      absl::StrCat("waiting to be placed again: node ", absl::StrJoin(missing, ", "), " is lost"));
  (void)PersistLocked(job);
  NotifyWatchersLocked(job);
  effects.Reschedule();
}

void JobManager::ScheduleLocked(Effects& effects) {
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
  std::vector<JobRequest> pending;
  for (const auto& [id, job] : jobs_) {
    if (job->state() != JOB_STATE_PENDING) continue;
    JobRequest request;
    request.job_id = id;
    request.sequence = job->number;
    request.nodes_min = job->spec.nodes().min();
    request.nodes_max = job->spec.nodes().max();
    request.nproc_per_node = job->spec.nproc_per_node();
    request.gpus_per_proc = job->spec.gpus_per_proc();
    const auto& shape = job->spec.mesh_shape();
    if (std::find(shape.begin(), shape.end(), -1) == shape.end()) {
      request.mesh_shape.assign(shape.begin(), shape.end());
      request.mesh_dim_names.assign(job->spec.mesh_dim_names().begin(),
                                    job->spec.mesh_dim_names().end());
    }
    pending.push_back(std::move(request));
  }
  if (pending.empty()) return;
  absl::StatusOr<SchedulePassResult> pass = scheduler_.Schedule(views, pending);
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
    job->placement = std::move(placement);
    job->holds = true;
    (void)job->machine->Schedule(reason);
    (void)PersistLocked(*job);
    NotifyWatchersLocked(*job);
    LaunchLocked(*job, effects);
  }
}

// ---- Recovery ----------------------------------------------------------------------------

absl::Status JobManager::Recover() {
  Effects effects;
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (recovered_or_used_) {
      return absl::FailedPreconditionError("Recover must be the first call, and only once");
    }
    recovered_or_used_ = true;
    if (shut_down_) return Unavailable();
    const absl::Time now = clock_->Now();

    absl::StatusOr<std::vector<NodeRecord>> nodes = store_->ListNodes();
    if (!nodes.ok()) return nodes.status();
    for (const NodeRecord& record : *nodes) {
      auto node = std::make_unique<Node>();
      node->name = record.name;
      node->address = record.address;
      node->slots = static_cast<int>(record.slots);
      mesh::v1::RegisterNodeRequest info;
      if (!record.labels.empty() && info.ParseFromString(record.labels)) {
        node->gpus.assign(info.gpus().begin(), info.gpus().end());
        node->agent_version = info.agent_version();
        node->metrics_port = info.metrics_port();
      }
      // Every node gets the recovery grace and one heartbeat timeout to come
      // back.
      node->ready = true;
      node->last_seen = now;
      node->silence_from = now + options_.node_recovery_grace;
      nodes_.emplace(record.name, std::move(node));
    }

    std::vector<JobRecord> records;
    JobQuery query;
    query.limit = JobStore::kMaxPageSize;
    for (;;) {
      absl::StatusOr<JobPage> page = store_->ListJobs(query);
      if (!page.ok()) return page.status();
      for (JobRecord& record : page->jobs) records.push_back(std::move(record));
      if (page->next_page_token.empty()) break;
      query.page_token = page->next_page_token;
    }
    for (JobRecord& record : records) {
      absl::Status loaded = [&]() -> absl::Status {
        auto job = std::make_unique<Job>();
        job->id = record.id;
        job->number = JobNumber(record.id);
        job->version = record.version;
        job->owner = record.owner;
        if (!job->spec.ParseFromString(record.spec)) {
          return absl::DataLossError(absl::StrCat("job ", record.id, ": unreadable spec"));
        }
        absl::StatusOr<JobState> state = ParseJobState(record.state);
        if (!state.ok()) return state.status();
        RestoredJobState stored;
        stored.state = *state;
        stored.pending_reason = record.pending_reason;
        stored.generation = record.generation;
        stored.restarts = static_cast<int>(record.restarts);
        stored.create_time = record.created_at;
        stored.update_time = record.updated_at;
        if (!record.root_cause.empty()) {
          if (!stored.root_cause.ParseFromString(record.root_cause)) {
            return absl::DataLossError(absl::StrCat("job ", record.id, ": unreadable root cause"));
          }
          stored.has_root_cause = true;
        }
        absl::StatusOr<std::vector<JobEvent>> events = store_->ListEvents(record.id);
        if (!events.ok()) return events.status();
        for (const JobEvent& event : *events) {
          JobEventRecord restored;
          restored.time = event.time;
          if (!event.from_state.empty()) {
            absl::StatusOr<JobState> from = ParseJobState(event.from_state);
            if (from.ok()) restored.from = *from;
          }
          absl::StatusOr<JobState> to = ParseJobState(event.to_state);
          if (to.ok()) restored.to = *to;
          restored.reason = event.reason;
          restored.generation = event.generation;
          stored.events.push_back(std::move(restored));
        }
        auto machine = JobStateMachine::Restore(record.id, job->spec.max_restarts(),
                                                absl::Seconds(job->spec.deadline_seconds()),
                                                std::move(stored), *clock_);
        if (!machine.ok()) return machine.status();
        job->machine = *std::move(machine);
        if (!record.placement.empty()) {
          absl::StatusOr<Placement> placement = DecodePlacement(record.placement);
          if (!placement.ok()) {
            return absl::DataLossError(
                absl::StrCat("job ", record.id, ": ", placement.status().message()));
          }
          job->placement = *std::move(placement);
        }
        jobs_.emplace(job->id, std::move(job));
        return absl::OkStatus();
      }();
      if (!loaded.ok()) {
        spdlog::error("recovery: {}", loaded.ToString());
        if (result.ok()) result = loaded;
      }
    }

    // Placed live jobs hold their nodes again and wait for their agents.
    int placed = 0;
    for (auto& [id, job] : jobs_) {
      const JobState state = job->state();
      if (state != JOB_STATE_SCHEDULED && state != JOB_STATE_RUNNING &&
          state != JOB_STATE_RESTARTING) {
        continue;
      }
      if (!job->placement.has_value()) {
        RootCause cause;
        cause.set_rank(-1);
        cause.set_message("its placement was lost in a coordinator restart");
        (void)job->machine->Fail(std::move(cause));
        AfterTransitionLocked(*job, effects);
        continue;
      }
      if (absl::Status adopted = scheduler_.Adopt(*job->placement); !adopted.ok()) {
        spdlog::error("recovery: job {}: {}", id, adopted.ToString());
      }
      job->holds = true;
      ++placed;
      if (state == JOB_STATE_RESTARTING) {
        // The coordinator stopped between the restart and the relaunch.
        (void)job->machine->Schedule(
            absl::StrCat("relaunching generation ", job->generation(), " after a restart"));
        (void)PersistLocked(*job);
        LaunchLocked(*job, effects);
        continue;
      }
      LaunchLocked(*job, effects);  // Creates the rendezvous; no node is connected yet.
      // SCHEDULED: not every rank had reported running, and a LAUNCH order
      // may have died with the old process before it reached its agent. Its
      // ranks stay "launching": each node's LAUNCH is sent again when its
      // agent opens its assignment stream (an agent ignores a LAUNCH of a
      // generation it has already launched, and lists what it runs when it
      // registers, which marks those ranks running first). A node that never
      // comes back is lost after its heartbeat timeout, failing the job.
      if (state == JOB_STATE_SCHEDULED) continue;
      for (int rank = 0; rank < job->placement->world_size; ++rank) {
        job->MarkUnaccounted(rank,
                             now + options_.node_recovery_grace + options_.node_heartbeat_timeout);
      }
    }
    spdlog::info("recovered {} jobs ({} placed) and {} nodes from {}", jobs_.size(), placed,
                 nodes_.size(), store_->path());
    for (auto& [id, job] : jobs_) CountJobLocked(*job);
    CountNodesLocked();
    ScheduleLocked(effects);
    while (effects.TakeReschedule()) ScheduleLocked(effects);
  }
  effects.Run();
  return result;
}

// ---- JobService -----------------------------------------------------------------------------

absl::StatusOr<mesh::v1::SubmitJobResponse> JobManager::Submit(JobSpec spec, std::string owner) {
  if (absl::Status valid = ValidateJobSpec(spec, options_.spec_limits); !valid.ok()) return valid;
  NormalizeJobSpec(options_.spec_limits, spec);
  Effects effects;
  mesh::v1::SubmitJobResponse response;
  {
    absl::MutexLock lock(&mu_);
    recovered_or_used_ = true;
    if (shut_down_) return Unavailable();
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

absl::StatusOr<mesh::v1::Job> JobManager::Cancel(const std::string& job_id,
                                                 const std::string& reason) {
  Effects effects;
  mesh::v1::Job proto;
  {
    absl::MutexLock lock(&mu_);
    recovered_or_used_ = true;
    if (shut_down_) return Unavailable();
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

void JobManager::WaitJob(const std::string& job_id, absl::Duration timeout,
                         Callback<mesh::v1::Job> done) {
  absl::StatusOr<mesh::v1::Job> now;
  {
    absl::MutexLock lock(&mu_);
    const Job* job = FindJobLocked(job_id);
    if (shut_down_) {
      now = Unavailable();
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
  if (shut_down_) return Unavailable();
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

std::vector<mesh::v1::Node> JobManager::ListNodes() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::pair<int, int>> used;  // Node → slots, GPUs held.
  std::map<std::string, std::vector<std::string>> jobs_on;
  for (const auto& [id, job] : jobs_) {
    if (!job->holds) continue;
    for (const RankPlacement& rank : job->placement->ranks) {
      used[rank.node].first += 1;
      used[rank.node].second += static_cast<int>(rank.gpus.size());
    }
    for (const std::string& node : job->placement->nodes) jobs_on[node].push_back(id);
  }
  std::vector<mesh::v1::Node> out;
  for (const auto& [name, node] : nodes_) {
    mesh::v1::Node proto;
    proto.set_name(name);
    proto.set_address(node->address);
    proto.set_state(node->ready ? mesh::v1::NODE_STATE_READY : mesh::v1::NODE_STATE_LOST);
    proto.set_slots(node->slots);
    proto.set_free_slots(std::max(0, node->slots - used[name].first));
    for (const auto& gpu : node->gpus) *proto.add_gpus() = gpu;
    proto.set_free_gpus(std::max(0, static_cast<int>(node->gpus.size()) - used[name].second));
    proto.set_agent_version(node->agent_version);
    proto.set_last_seen_unix_ms(absl::ToUnixMillis(node->last_seen));
    proto.set_metrics_port(node->metrics_port);
    for (const std::string& id : jobs_on[name]) proto.add_jobs(id);
    out.push_back(std::move(proto));
  }
  return out;
}

// ---- Logs -------------------------------------------------------------------------------------

absl::StatusOr<uint64_t> JobManager::StartLogs(const mesh::v1::GetLogsRequest& request,
                                               LogSink* sink) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return Unavailable();
  Job* job = FindJobLocked(request.job_id());
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " not found"));
  }
  if (!job->placement.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job->id, " has not been placed yet (",
                                                      JobStateName(job->state()),
                                                      "): no node holds its logs"));
  }
  const Placement& placement = *job->placement;
  const int64_t generation = request.generation() == -1 ? job->generation() : request.generation();
  if (generation < 0 || generation > job->generation()) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation ", request.generation(), " is not -1 or 0..", job->generation()));
  }
  if (request.tail() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tail ", request.tail(), " is negative"));
  }
  std::vector<int> ranks(request.ranks().begin(), request.ranks().end());
  if (ranks.empty()) {
    for (int r = 0; r < placement.world_size; ++r) ranks.push_back(r);
  }
  auto log_request = std::make_unique<LogRequest>();
  for (int rank : ranks) {
    if (rank < 0 || rank >= placement.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " is outside the world of ", placement.world_size));
    }
    log_request->left[placement.ranks[rank].node].insert(rank);
  }
  for (const auto& [name, node_ranks] : log_request->left) {
    auto it = nodes_.find(name);
    if (it == nodes_.end() || it->second->sink == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("node ", name, " holding rank ", *node_ranks.begin(), " is not connected"));
    }
  }
  const uint64_t handle = next_handle_++;
  log_request->handle = handle;
  log_request->job_id = job->id;
  log_request->generation = generation;
  log_request->sink = sink;
  log_request->attach_deadline = clock_->Now() + options_.log_attach_timeout;
  for (const auto& [name, node_ranks] : log_request->left) {
    Assignment order;
    order.set_action(Assignment::ACTION_UPLOAD_LOGS);
    order.set_job_id(job->id);
    order.set_generation(generation);
    order.set_log_request_id(absl::StrCat("logs-", handle));
    for (int rank : node_ranks) order.add_log_ranks(rank);
    order.set_log_tail(request.tail());
    order.set_log_follow(request.follow());
    SendLocked(*nodes_.at(name), order);
  }
  log_requests_.emplace(handle, std::move(log_request));
  return handle;
}

void JobManager::EndLogRequestLocked(LogRequest& request, const absl::Status& status) {
  if (request.sink != nullptr) {
    request.sink->End(status);
    request.sink = nullptr;
  }
  for (const auto& [node, upload_handle] : request.uploads) {
    // An upload that delivered every rank ends by itself; only the others
    // are cut short.
    auto left = request.left.find(node);
    if (left == request.left.end() || left->second.empty()) continue;
    auto it = uploads_.find(upload_handle);
    if (it != uploads_.end() && it->second->control != nullptr) {
      it->second->control->Abort(absl::CancelledError("the log request has ended"));
      it->second->control = nullptr;
    }
  }
  log_requests_.erase(request.handle);  // Destroys `request`.
}

void JobManager::CancelLogs(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  auto it = log_requests_.find(handle);
  if (it == log_requests_.end()) return;
  it->second->sink = nullptr;  // Its owner went away: no End.
  EndLogRequestLocked(*it->second, absl::CancelledError("cancelled"));
}

absl::StatusOr<uint64_t> JobManager::AttachUpload(const std::string& name,
                                                  const std::string& session_id,
                                                  const std::string& log_request_id,
                                                  UploadControl* control) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> node = SessionNodeLocked(name, session_id);
  if (!node.ok()) return node.status();
  uint64_t request_handle = 0;
  if (!absl::StartsWith(log_request_id, "logs-") ||
      !absl::SimpleAtoi(log_request_id.substr(5), &request_handle)) {
    return absl::NotFoundError(absl::StrCat("unknown log request '", log_request_id, "'"));
  }
  auto it = log_requests_.find(request_handle);
  if (it == log_requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("log request '", log_request_id, "' has ended or never existed"));
  }
  LogRequest& request = *it->second;
  if (!request.left.contains(name) || request.uploads.contains(name)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "log request '", log_request_id, "' did not ask node ", name, " (or it already attached)"));
  }
  const uint64_t handle = next_handle_++;
  auto upload = std::make_unique<Upload>();
  upload->request = request_handle;
  upload->node = name;
  upload->control = control;
  uploads_.emplace(handle, std::move(upload));
  request.uploads.emplace(name, handle);
  return handle;
}

absl::Status JobManager::UploadChunk(uint64_t upload_handle, const mesh::v1::LogChunk& chunk) {
  absl::MutexLock lock(&mu_);
  auto up = uploads_.find(upload_handle);
  if (up == uploads_.end()) return absl::CancelledError("the upload has ended");
  auto it = log_requests_.find(up->second->request);
  if (it == log_requests_.end()) return absl::CancelledError("the log request has ended");
  LogRequest& request = *it->second;
  std::set<int>& left = request.left[up->second->node];
  if (!left.contains(chunk.rank())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", chunk.rank(), " was not asked of node ",
                                                   up->second->node, " or has already ended"));
  }
  if (request.sink != nullptr) request.sink->Send(chunk);
  if (chunk.eof()) {
    left.erase(chunk.rank());
    bool done = true;
    for (const auto& [node, ranks] : request.left) done = done && ranks.empty();
    if (done) EndLogRequestLocked(request, absl::OkStatus());
  }
  return absl::OkStatus();
}

void JobManager::UploadEnded(uint64_t upload_handle, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  auto up = uploads_.find(upload_handle);
  if (up == uploads_.end()) return;
  const std::string node = up->second->node;
  const uint64_t request_handle = up->second->request;
  uploads_.erase(up);
  auto it = log_requests_.find(request_handle);
  if (it == log_requests_.end()) return;
  LogRequest& request = *it->second;
  const std::set<int>& left = request.left[node];
  if (!left.empty()) {
    EndLogRequestLocked(request,
                        absl::UnavailableError(absl::StrCat(
                            "node ", node, " ended its log upload before rank ", *left.begin(),
                            " was complete", status.ok() ? "" : ": ", status.message())));
  }
}

// ---- NodeService ----------------------------------------------------------------------------

absl::StatusOr<mesh::v1::RegisterNodeResponse> JobManager::RegisterNode(
    const mesh::v1::RegisterNodeRequest& request) {
  const std::string& name = request.name();
  if (!IsValidNodeName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("name '", name, "' must be 1-128 characters of [A-Za-z0-9._-]"));
  }
  if (request.address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("node ", name, ": empty address"));
  }
  if (request.slots() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", name, ": slots ", request.slots(), " must be >= 1"));
  }
  std::set<int> indices;
  for (const auto& gpu : request.gpus()) {
    if (gpu.index() < 0 || !indices.insert(gpu.index()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", name, ": GPU index ", gpu.index(), " is negative or repeated"));
    }
  }
  Effects effects;
  mesh::v1::RegisterNodeResponse response;
  {
    absl::MutexLock lock(&mu_);
    recovered_or_used_ = true;
    if (shut_down_) return Unavailable();
    const absl::Time now = clock_->Now();
    mesh::v1::RegisterNodeRequest info;  // What the store keeps besides the columns.
    *info.mutable_gpus() = request.gpus();
    info.set_agent_version(request.agent_version());
    info.set_metrics_port(request.metrics_port());
    NodeRecord record;
    record.name = name;
    record.address = request.address();
    record.slots = request.slots();
    record.gpus = request.gpus_size();
    record.state = kNodeReady;
    record.last_seen = now;
    record.labels = info.SerializeAsString();
    if (absl::Status stored = store_->UpsertNode(record); !stored.ok()) return stored;

    std::unique_ptr<Node>& slot = nodes_[name];
    if (slot == nullptr) slot = std::make_unique<Node>();
    Node& node = *slot;
    if (node.sink != nullptr) {
      node.sink->End(absl::AbortedError(absl::StrCat("node ", name, " registered again")));
      assignment_streams_.erase(node.stream);
      node.sink = nullptr;
      node.stream = 0;
    }
    const bool was_lost = !node.ready;
    node.name = name;
    node.address = request.address();
    node.slots = request.slots();
    node.gpus.assign(request.gpus().begin(), request.gpus().end());
    node.agent_version = request.agent_version();
    node.ready = true;
    node.session_id = NewSessionId();
    SeenLocked(node, now);
    node.pending.clear();
    node.metrics_port = request.metrics_port();
    CountNodesLocked();
    if (discovery_ != nullptr) {
      // A re-registration replaces what the node ran before; the running
      // list below adds back the workers that still serve metrics.
      discovery_->RemoveNode(name);
      if (node.metrics_port > 0) {
        discovery_->SetAgent(name, ServiceDiscovery::Target(node.address, node.metrics_port));
      }
      FlushDiscoveryLater(effects);
    }
    spdlog::info("node {} registered{}: {} at {}, {} slots, {} GPUs, {} running workers", name,
                 was_lost ? " again after being lost" : "", request.agent_version(),
                 request.address(), request.slots(), request.gpus_size(), request.running_size());

    // Reconcile what the agent runs with what should run there.
    std::set<std::pair<std::string, int64_t>> killed;
    std::map<std::string, std::set<int>> running_here;
    for (const auto& worker : request.running()) {
      Job* job = FindJobLocked(worker.job_id());
      const bool current = job != nullptr && job->holds &&
                           worker.generation() == job->generation() && worker.rank() >= 0 &&
                           worker.rank() < static_cast<int>(job->ranks.size()) &&
                           job->placement->ranks[worker.rank()].node == name;
      if (current) {
        running_here[job->id].insert(worker.rank());
        if (discovery_ != nullptr && worker.metrics_port() > 0) {
          discovery_->SetWorker(job->id, worker.rank(), name,
                                ServiceDiscovery::Target(node.address, worker.metrics_port()));
        }
        continue;
      }
      if (killed.insert({worker.job_id(), worker.generation()}).second) {
        node.pending.push_back(
            KillOrder(worker.job_id(), worker.generation(), "not placed on this node any more"));
      }
    }
    for (auto& [id, job] : jobs_) {
      if (!job->holds) continue;
      const std::set<int>& running = running_here[id];
      bool all_running = true;
      for (const RankPlacement& rank : job->placement->ranks) {
        Job::Rank& status = job->ranks[rank.rank];
        if (rank.node == name) {
          if (running.contains(rank.rank)) {
            if (status != Job::Rank::kSucceeded) status = Job::Rank::kRunning;
          } else if (status == Job::Rank::kRunning || status == Job::Rank::kUnaccounted) {
            // Gone, or exited with a report still on its way: wait for it.
            job->MarkUnaccounted(rank.rank, now + options_.node_heartbeat_timeout);
          }
        }
        all_running =
            all_running && (status == Job::Rank::kRunning || status == Job::Rank::kSucceeded);
      }
      if (all_running) MaybeStartLocked(*job, effects);
    }
    effects.Reschedule();
    while (effects.TakeReschedule()) ScheduleLocked(effects);
    response.set_session_id(node.session_id);
    response.set_heartbeat_interval_seconds(
        absl::ToDoubleSeconds(options_.node_heartbeat_interval));
    response.set_heartbeat_timeout_seconds(absl::ToDoubleSeconds(options_.node_heartbeat_timeout));
  }
  effects.Run();
  return response;
}

absl::Status JobManager::NodeHeartbeat(const std::string& name, const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> node = SessionNodeLocked(name, session_id);
  if (!node.ok()) return node.status();
  SeenLocked(**node, clock_->Now());
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> JobManager::WatchAssignments(const std::string& name,
                                                      const std::string& session_id,
                                                      AssignmentSink* sink) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> found = SessionNodeLocked(name, session_id);
  if (!found.ok()) return found.status();
  Node& node = **found;
  if (node.sink != nullptr) {
    node.sink->End(absl::AbortedError(
        absl::StrCat("node ", name, ": a newer WatchAssignments replaced this one")));
    assignment_streams_.erase(node.stream);
  }
  const uint64_t handle = next_handle_++;
  node.stream = handle;
  node.sink = sink;
  SeenLocked(node, clock_->Now());
  assignment_streams_.emplace(handle, name);
  for (const Assignment& order : node.pending) sink->Send(order);
  node.pending.clear();
  for (auto& [id, job] : jobs_) {
    if (job->holds) SendLaunchLocked(*job, node);
  }
  return handle;
}

void JobManager::UnwatchAssignments(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  auto it = assignment_streams_.find(handle);
  if (it == assignment_streams_.end()) return;
  auto node = nodes_.find(it->second);
  if (node != nodes_.end() && node->second->stream == handle) {
    node->second->sink = nullptr;
    node->second->stream = 0;
  }
  assignment_streams_.erase(it);
}

absl::Status JobManager::ReportWorkersStarted(
    const mesh::v1::ReportWorkersStartedRequest& request) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Node*> node = SessionNodeLocked(request.name(), request.session_id());
    if (!node.ok()) return node.status();
    SeenLocked(**node, clock_->Now());
    Job* job = FindJobLocked(request.job_id());
    if (job == nullptr || !job->holds || request.generation() != job->generation()) {
      if (job != nullptr && request.generation() < job->generation()) ++stats_.stale_reports;
      return absl::OkStatus();
    }
    for (const auto& worker : request.workers()) {
      if (worker.rank() < 0 || worker.rank() >= static_cast<int>(job->ranks.size()) ||
          job->placement->ranks[worker.rank()].node != request.name()) {
        return absl::InvalidArgumentError(absl::StrCat("job ", job->id, ": rank ", worker.rank(),
                                                       " is not placed on node ", request.name()));
      }
    }
    for (const auto& worker : request.workers()) {
      Job::Rank& status = job->ranks[worker.rank()];
      if (status != Job::Rank::kSucceeded) status = Job::Rank::kRunning;
      if (discovery_ != nullptr && worker.metrics_port() > 0) {
        discovery_->SetWorker(job->id, worker.rank(), request.name(),
                              ServiceDiscovery::Target((*node)->address, worker.metrics_port()));
        FlushDiscoveryLater(effects);
      }
    }
    MaybeStartLocked(*job, effects);
    while (effects.TakeReschedule()) ScheduleLocked(effects);
  }
  effects.Run();
  return absl::OkStatus();
}

absl::Status JobManager::ReportWorkerExit(const mesh::v1::ReportWorkerExitRequest& request) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Node*> found = SessionNodeLocked(request.name(), request.session_id());
    if (!found.ok()) return found.status();
    Node& node = **found;
    SeenLocked(node, clock_->Now());
    Job* job = FindJobLocked(request.job_id());
    if (job == nullptr || !job->holds || request.generation() != job->generation()) {
      if (job != nullptr && request.generation() < job->generation()) ++stats_.stale_reports;
      return absl::OkStatus();
    }
    const int rank = request.rank();
    if (rank < 0 || rank >= static_cast<int>(job->ranks.size()) ||
        job->placement->ranks[rank].node != node.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", job->id, ": rank ", rank, " is not placed on node ", node.name));
    }
    using Termination = mesh::v1::ReportWorkerExitRequest::TerminationCase;
    const Termination how = request.termination_case();
    if (discovery_ != nullptr) {
      discovery_->RemoveWorker(job->id, rank);
      FlushDiscoveryLater(effects);
    }
    if (how == Termination::kExitCode && request.exit_code() == 0) {
      job->ranks[rank] = Job::Rank::kSucceeded;
      const bool all = std::all_of(job->ranks.begin(), job->ranks.end(),
                                   [](Job::Rank r) { return r == Job::Rank::kSucceeded; });
      if (all) {
        if (job->state() == JOB_STATE_SCHEDULED) {
          (void)job->machine->Start("every rank ran");
          (void)PersistLocked(*job);
          NotifyWatchersLocked(*job);
        }
        (void)job->machine->Succeed(absl::StrCat("all ", job->ranks.size(), " ranks exited 0"));
        spdlog::info("job {} succeeded", job->id);
        AfterTransitionLocked(*job, effects);
      } else {
        // Peers still run and may be waiting for this rank (a barrier, a
        // key): unless it left its rendezvous cleanly, Coordination ends
        // their waits now, naming it, instead of at their deadlines. After
        // unlock: the failure listener calls back into this manager.
        effects.Call(
            [coordination = coordination_, id = job->id, generation = request.generation(), rank] {
              (void)coordination->RankExited(
                  id, generation, rank,
                  "exited with code 0 before the job finished (without leaving: no "
                  "Runtime::Shutdown)");
            });
      }
    } else {
      RootCause cause;
      cause.set_rank(rank);
      cause.set_node(node.name);
      cause.set_host(node.address);
      cause.set_generation(request.generation());
      const std::string who = absl::StrCat("rank ", rank, " (node ", node.name, ")");
      switch (how) {
        case Termination::kExitCode:
          cause.set_exit_code(request.exit_code());
          cause.set_message(absl::StrCat(who, " exited with code ", request.exit_code()));
          break;
        case Termination::kSignal:
          cause.set_signal(request.signal());
          cause.set_message(
              absl::StrCat(who, " was killed by signal ", DescribeSignal(request.signal())));
          break;
        case Termination::kLaunchError:
          cause.set_message(absl::StrCat(who, " could not be started: ", request.launch_error()));
          break;
        default:
          return absl::InvalidArgumentError(
              "ReportWorkerExit needs an exit_code, a signal or a launch_error");
      }
      FailJobLocked(*job, std::move(cause), effects);
    }
    while (effects.TakeReschedule()) ScheduleLocked(effects);
  }
  effects.Run();
  return absl::OkStatus();
}

// ---- Time and shutdown ----------------------------------------------------------------------

void JobManager::NodeLostLocked(Node& node, const std::string& why, Effects& effects) {
  node.ready = false;
  node.session_id.clear();
  ++stats_.nodes_lost;
  CountNodesLocked();
  if (discovery_ != nullptr) {
    discovery_->RemoveNode(node.name);
    FlushDiscoveryLater(effects);
  }
  spdlog::warn("node {} lost: {}", node.name, why);
  if (absl::Status marked = store_->MarkNode(node.name, kNodeLost); !marked.ok()) {
    spdlog::error("node {}: cannot store LOST: {}", node.name, marked.ToString());
  }
  if (node.sink != nullptr) {
    node.sink->End(absl::AbortedError(
        absl::StrCat("node ", node.name, " was marked lost: ", why, "; register again")));
    assignment_streams_.erase(node.stream);
    node.sink = nullptr;
    node.stream = 0;
  }
  for (auto& [id, job] : jobs_) {
    if (!job->holds) continue;
    const auto& nodes = job->placement->nodes;
    if (std::find(nodes.begin(), nodes.end(), node.name) == nodes.end()) continue;
    RootCause cause;
    cause.set_rank(-1);
    cause.set_node(node.name);
    cause.set_host(node.address);
    cause.set_generation(job->generation());
    cause.set_message(absl::StrCat("node ", node.name, " lost: ", why));
    FailJobLocked(*job, std::move(cause), effects);
  }
  // Log requests waiting on it cannot complete.
  std::vector<uint64_t> broken;
  for (const auto& [handle, request] : log_requests_) {
    auto left = request->left.find(node.name);
    if (left != request->left.end() && !left->second.empty()) broken.push_back(handle);
  }
  for (uint64_t handle : broken) {
    EndLogRequestLocked(*log_requests_.at(handle),
                        absl::UnavailableError(absl::StrCat("node ", node.name, " was lost")));
  }
  effects.Reschedule();
}

void JobManager::Tick() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    const absl::Time now = clock_->Now();
    for (auto& [name, node] : nodes_) {
      if (node->ready &&
          now - std::max(node->last_seen, node->silence_from) > options_.node_heartbeat_timeout) {
        NodeLostLocked(
            *node,
            absl::StrCat("no heartbeat for ", FormatDurationShort(absl::Trunc(
                                                  now - node->last_seen, absl::Milliseconds(100)))),
            effects);
      }
    }
    for (auto& [id, job] : jobs_) {
      if (job->holds && job->unaccounted_deadline <= now) {
        // Only ranks whose own deadline passed; the others keep theirs.
        job->unaccounted_deadline = absl::InfiniteFuture();
        for (size_t rank = 0; rank < job->ranks.size(); ++rank) {
          if (job->ranks[rank] != Job::Rank::kUnaccounted) continue;
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
          cause.set_message(absl::StrCat("rank ", rank, " (node ", placed.node,
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
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second->deadline > now) {
        ++it;
        continue;
      }
      effects.Call([done = std::move(it->second->done), id = it->second->job_id]() mutable {
        std::move(done)(absl::DeadlineExceededError(
            absl::StrCat("job ", id, " did not finish within the wait")));
      });
      it = waiters_.erase(it);
    }
    std::vector<uint64_t> late;
    for (const auto& [handle, request] : log_requests_) {
      if (request->attach_deadline > now) continue;
      for (const auto& [node, ranks] : request->left) {
        if (!ranks.empty() && !request->uploads.contains(node)) {
          late.push_back(handle);
          break;
        }
      }
    }
    for (uint64_t handle : late) {
      LogRequest& request = *log_requests_.at(handle);
      std::string node;
      for (const auto& [name, ranks] : request.left) {
        if (!ranks.empty() && !request.uploads.contains(name)) node = name;
      }
      EndLogRequestLocked(request, absl::UnavailableError(absl::StrCat(
                                       "node ", node, " did not start uploading logs within ",
                                       FormatDurationShort(options_.log_attach_timeout))));
    }
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
      for (auto& [handle, sink] : job->watchers) sink->End(Unavailable());
      job->watchers.clear();
    }
    state_watch_jobs_.clear();
    for (auto& [name, node] : nodes_) {
      if (node->sink != nullptr) node->sink->End(Unavailable());
      node->sink = nullptr;
      node->stream = 0;
    }
    assignment_streams_.clear();
    while (!log_requests_.empty())
      EndLogRequestLocked(*log_requests_.begin()->second, Unavailable());
    for (auto& [handle, upload] : uploads_) {
      if (upload->control != nullptr) upload->control->Abort(Unavailable());
      upload->control = nullptr;
    }
    for (auto& [handle, waiter] : waiters_) {
      effects.Call([done = std::move(waiter->done)]() mutable { std::move(done)(Unavailable()); });
    }
    waiters_.clear();
  }
  effects.Run();
}

}  // namespace mesh::coordinator
