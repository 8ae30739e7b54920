#include "agent/order_applier.h"

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "agent/exit_detail.h"
#include "agent/job_paths.h"
#include "agent/order_applier_internal.h"
#include "agent/worker_env.h"
#include "common/duration_format.h"

namespace mesh::agent {

using order_applier_internal::RecordingLauncher;

OrderApplier::OrderApplier(const AgentConfig* config, ProcessLauncher* launcher,
                           ReportOutbox* outbox, AgentMetrics* metrics, StrayKiller* strays,
                           const JobIsolation* isolation)
    : config_(*config),
      launcher_(launcher),
      outbox_(outbox),
      metrics_(metrics),
      strays_(strays),
      isolation_(isolation),
      next_worker_port_(config->worker_metrics_port_first) {}

OrderApplier::~OrderApplier() {
  std::vector<std::shared_ptr<Generation>> generations;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) {
      for (auto& [g, rec] : job->generations) generations.push_back(std::move(rec));
      job->generations.clear();
    }
  }
  generations.clear();  // destroys the supervisors, outside mu_
}

void OrderApplier::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void OrderApplier::Shutdown() {
  std::vector<std::shared_ptr<Generation>> generations;
  std::vector<std::pair<std::string, std::shared_ptr<Generation>>> ended;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, job] : jobs_) {
      for (auto& [g, rec] : job->generations) {
        rec->stopped = true;
        generations.push_back(rec);
        ended.emplace_back(id, rec);
      }
    }
    UpdateWorkerGaugesLocked();
  }
  for (auto& rec : generations) rec->supervisor->Stop();
  for (auto& rec : generations) {
    if (absl::Status s = rec->supervisor->WaitAllExited(config_.grace + kStopMargin); !s.ok()) {
      spdlog::warn("shutdown: {}", std::string(s.message()));
    }
  }
  KillStrays(ended);
  if (relay_ != nullptr) {
    for (const auto& [job_id, rec] : ended) relay_->RemoveGeneration(job_id, rec->generation);
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) job->generations.clear();
    UpdateWorkerGaugesLocked();
  }
  generations.clear();  // destroys the supervisors, outside mu_
}

std::vector<v1::RunningWorker> OrderApplier::RunningWorkers() const {
  absl::MutexLock lock(&mu_);
  return RunningWorkersLocked();
}

std::vector<v1::RunningWorker> OrderApplier::RunningWorkersLocked() const {
  std::vector<v1::RunningWorker> running;
  for (const auto& [id, job] : jobs_) {
    for (const auto& [g, rec] : job->generations) {
      for (const auto& [rank, pid] : rec->running) {
        v1::RunningWorker& w = running.emplace_back();
        w.set_job_id(id);
        w.set_generation(g);
        w.set_rank(rank);
        w.set_pid(pid);
        if (auto port = rec->metrics_ports.find(rank); port != rec->metrics_ports.end()) {
          w.set_metrics_port(port->second);
        }
      }
    }
  }
  return running;
}

std::vector<v1::ReportWorkerExitRequest> OrderApplier::ExitRecords() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ReportWorkerExitRequest> records;
  for (const auto& [id, job] : jobs_) {
    records.insert(records.end(), job->exits.begin(), job->exits.end());
  }
  return records;
}

std::set<int> OrderApplier::GenerationRanks(const std::string& job_id, int64_t generation) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return {};
  auto gen = job->second->generations.find(generation);
  if (gen == job->second->generations.end()) return {};
  return gen->second->ranks;
}

bool OrderApplier::RankFinished(const std::string& job_id, int64_t generation, int rank) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return true;
  auto gen = job->second->generations.find(generation);
  if (gen == job->second->generations.end()) return true;
  const Generation& rec = *gen->second;
  if (rec.ranks.count(rank) == 0) return true;
  if (rec.launching || rec.relaunching.count(rank) > 0) return false;
  return rec.running.count(rank) == 0;
}

void OrderApplier::UpdateWorkerGaugesLocked() {
  size_t running = 0;
  size_t stopping = 0;
  for (const auto& [id, job] : jobs_) {
    for (const auto& [g, rec] : job->generations) {
      (rec->stopped ? stopping : running) += rec->running.size();
    }
  }
  metrics_->workers_running->Set(static_cast<double>(running));
  metrics_->workers_stopping->Set(static_cast<double>(stopping));
}

int OrderApplier::AcquireWorkerMetricsPortLocked() {
  const int first = config_.worker_metrics_port_first;
  const int last = config_.worker_metrics_port_last;
  if (first == 0) return 0;
  const int count = last - first + 1;
  for (int i = 0; i < count; ++i) {
    const int port = first + (next_worker_port_ - first + i) % count;
    if (worker_ports_in_use_.insert(port).second) {
      next_worker_port_ = port == last ? first : port + 1;
      return port;
    }
  }
  return 0;
}

void OrderApplier::ReleaseWorkerMetricsPortLocked(int port) { worker_ports_in_use_.erase(port); }

void OrderApplier::CollectFinishedGenerations() {
  std::vector<std::pair<std::string, std::shared_ptr<Generation>>> ended;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) {
      for (auto it = job->generations.begin(); it != job->generations.end();) {
        const Generation& rec = *it->second;
        if (rec.stopped && !rec.launching && rec.relaunching.empty() && rec.running.empty()) {
          ended.emplace_back(id, std::move(it->second));
          it = job->generations.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  KillStrays(ended);
  if (relay_ != nullptr) {
    for (const auto& [job_id, rec] : ended) relay_->RemoveGeneration(job_id, rec->generation);
  }
  // NVML is asked outside the lock (a sample takes milliseconds).
  const std::vector<GpuUsage> gpu_usage =
      config_.gpu_usage ? config_.gpu_usage() : std::vector<GpuUsage>();
  {
    absl::MutexLock lock(&mu_);
    UpdateJobUsageLocked(gpu_usage);
  }
  // `ended` goes out of scope here, outside mu_.
}

void OrderApplier::UpdateJobUsageLocked(const std::vector<GpuUsage>& gpu_usage) {
  std::map<int, const GpuUsage*> by_index;
  for (const GpuUsage& gpu : gpu_usage) by_index[gpu.index] = &gpu;
  std::set<std::string> live;
  for (const auto& [id, job] : jobs_) {
    if (job->generations.empty()) continue;
    // The newest generation: an older one is only being stopped.
    const Generation& rec = *job->generations.rbegin()->second;
    live.insert(id);
    metrics_->job_gpus->WithLabels({id})->Set(static_cast<double>(rec.gpus.size()));
    // GPUs are the job's alone, so their use is the job's: the mean
    // utilization and the memory in use over the GPUs NVML answered for.
    double utilization = 0;
    int64_t memory = 0;
    int sampled = 0;
    for (int index : rec.gpus) {
      auto it = by_index.find(index);
      if (it == by_index.end()) continue;
      utilization += it->second->utilization;
      memory += it->second->memory_used_bytes;
      ++sampled;
    }
    if (sampled > 0) {
      metrics_->job_gpu_utilization->WithLabels({id})->Set(utilization / sampled);
      metrics_->job_gpu_memory_bytes->WithLabels({id})->Set(static_cast<double>(memory));
    }
    if (rec.cgroup == nullptr) continue;
    const CgroupUsage usage = rec.cgroup->Usage();
    metrics_->job_cpu_seconds->WithLabels({id})->Set(usage.cpu_seconds);
    metrics_->job_memory_bytes->WithLabels({id})->Set(static_cast<double>(usage.memory_bytes));
    metrics_->job_processes->WithLabels({id})->Set(static_cast<double>(usage.processes));
  }
  for (const std::string& id : jobs_with_usage_) {
    if (live.count(id) > 0) continue;
    for (auto* family :
         {metrics_->job_gpus, metrics_->job_cpu_seconds, metrics_->job_memory_bytes,
          metrics_->job_processes, metrics_->job_gpu_utilization, metrics_->job_gpu_memory_bytes}) {
      family->Remove({id});
    }
  }
  jobs_with_usage_ = std::move(live);
}

void OrderApplier::KillStrays(
    const std::vector<std::pair<std::string, std::shared_ptr<Generation>>>& ended) {
  for (const auto& [job_id, rec] : ended) {
    const int64_t generation = rec->generation;
    if (rec->cgroup != nullptr) {
      absl::StatusOr<int> killed = rec->cgroup->KillAll(absl::Seconds(5));
      if (!killed.ok()) {
        spdlog::error("job {} generation {}: killing its cgroup: {}", job_id, generation,
                      std::string(killed.status().message()));
      } else if (*killed > 0) {
        spdlog::warn("job {} generation {}: killed {} process(es) left in its cgroup", job_id,
                     generation, *killed);
      }
      if (absl::Status s = rec->cgroup->Remove(); !s.ok()) {
        spdlog::warn("job {} generation {}: removing its cgroup: {}", job_id, generation,
                     std::string(s.message()));
      }
      continue;
    }
    if (strays_ == nullptr) continue;
    if (const int killed = strays_->KillStrays(job_id, generation); killed > 0) {
      spdlog::warn(
          "job {} generation {}: killed {} process(es) that had left their worker's "
          "process group",
          job_id, generation, killed);
    }
  }
}

absl::StatusOr<OrderApplier::LaunchContext> OrderApplier::PrepareLaunchContext(
    const v1::Assignment& order) const {
  LaunchContext context;
  context.dir = GenerationDir(config_.work_dir, order.job_id(), order.generation());
  if (isolation_ != nullptr) {
    absl::StatusOr<std::optional<WorkerCredentials>> run_as = isolation_->RunAs(order);
    if (!run_as.ok()) return run_as.status();
    context.account = *std::move(run_as);
    if (absl::Status s = isolation_->PrepareDirectory(context.dir, context.account); !s.ok()) {
      return s;
    }
  } else {
    std::error_code error;
    std::filesystem::create_directories(context.dir, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", context.dir, ": ", error.message()));
    }
  }
  // HOME, USER and LOGNAME are the worker account's, not the agent's.
  context.base_env = config_.base_env;
  if (context.account.has_value()) {
    context.base_env["USER"] = context.account->user;
    context.base_env["LOGNAME"] = context.account->user;
    if (!context.account->home.empty()) context.base_env["HOME"] = context.account->home;
  }
  context.user_env.assign(order.env().begin(), order.env().end());
  std::sort(context.user_env.begin(), context.user_env.end());
  return context;
}

int OrderApplier::AcquireWorkerMetricsPort(const std::string& job_id, int64_t generation,
                                           int rank) {
  int port = 0;
  {
    absl::MutexLock lock(&mu_);
    port = AcquireWorkerMetricsPortLocked();
  }
  if (port == 0 && config_.worker_metrics_port_first != 0) {
    spdlog::warn(
        "job {} generation {} rank {}: every worker metrics port ({}-{}) is taken; "
        "launching it without one",
        job_id, generation, rank, config_.worker_metrics_port_first,
        config_.worker_metrics_port_last);
  }
  return port;
}

absl::StatusOr<RankLaunch> OrderApplier::MakeRankLaunch(const v1::Assignment& order,
                                                        const v1::RankLaunch& r,
                                                        const LaunchContext& context,
                                                        int metrics_port,
                                                        GenerationCgroup* cgroup) const {
  WorkerAssignment assignment;
  assignment.coordinator = config_.coordinator;
  assignment.security = config_.security;
  assignment.security.token = order.worker_token();
  assignment.job_id = order.job_id();
  assignment.generation = order.generation();
  assignment.rank = r.rank();
  assignment.world_size = order.world_size();
  assignment.local_rank = r.local_rank();
  assignment.local_world_size = order.local_world_size();
  assignment.node_rank = order.node_rank();
  assignment.num_nodes = order.num_nodes();
  assignment.node_name = config_.name;
  assignment.master_addr = order.master_addr();
  assignment.master_port = order.master_port();
  assignment.restart_count = order.restart_count();
  assignment.max_restarts = order.max_restarts();
  assignment.gpu_job = order.gpu_job();
  assignment.gpus.assign(r.gpus().begin(), r.gpus().end());
  assignment.agent_instance = config_.instance;
  if (relay_ != nullptr) assignment.agent_socket = relay_->socket_path();
  assignment.user_env = context.user_env;
  assignment.operator_env = config_.operator_env;
  assignment.allowed_job_env = config_.allowed_job_env;
  assignment.metrics_port = metrics_port;
  absl::StatusOr<std::vector<std::string>> env = BuildWorkerEnv(assignment, context.base_env);
  if (!env.ok()) {
    return absl::Status(env.status().code(),
                        absl::StrCat("rank ", r.rank(), ": ", env.status().message()));
  }
  RankLaunch launch;
  launch.rank = r.rank();
  launch.spec.argv.assign(order.command().begin(), order.command().end());
  launch.spec.env = std::move(*env);
  launch.spec.working_dir = order.working_dir().empty() ? context.dir : order.working_dir();
  launch.spec.stdout_log =
      RankLogPath(config_.work_dir, order.job_id(), order.generation(), r.rank());
  launch.spec.max_log_bytes = config_.log_max_bytes;
  launch.spec.credentials = context.account;
  if (cgroup != nullptr) {
    // Made again for a rank started again: the same directories, the
    // limits applied anew.
    absl::StatusOr<std::vector<std::string>> dirs =
        cgroup->CreateRank(r.rank(), JobIsolation::LimitsOf(order));
    if (!dirs.ok()) {
      return absl::Status(dirs.status().code(),
                          absl::StrCat("rank ", r.rank(), ": cgroup: ", dirs.status().message()));
    }
    launch.spec.cgroup_dirs = *std::move(dirs);
  }
  return launch;
}

void OrderApplier::ReportLaunchErrorLocked(JobRecord& job, const std::string& job_id,
                                           int64_t generation, int rank, const std::string& why) {
  metrics_->worker_exits->WithLabels({kLaunchErrorReason})->Increment();
  v1::ReportWorkerExitRequest exit;
  exit.set_job_id(job_id);
  exit.set_generation(generation);
  exit.set_rank(rank);
  exit.set_launch_error(why);
  exit.set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
  if (job.exits_generation == generation) job.exits.push_back(exit);
  outbox_->Enqueue(std::move(exit));
}

void OrderApplier::ApplyLaunch(const v1::Assignment& order, absl::Time received) {
  if (order.replace()) return ApplyReplace(order, received);
  const std::string& job_id = order.job_id();
  const int64_t generation = order.generation();
  std::vector<std::shared_ptr<Generation>> older;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<JobRecord>& job = jobs_[job_id];
    if (job == nullptr) job = std::make_unique<JobRecord>();
    if (generation <= job->highest) {
      spdlog::debug("LAUNCH of job {} generation {}: already applied (highest {})", job_id,
                    generation, job->highest);
      return;
    }
    job->highest = generation;
    for (auto& [g, rec] : job->generations) {
      rec->stopped = true;
      older.push_back(rec);
    }
    job->exits.clear();
    job->exits_generation = generation;
    UpdateWorkerGaugesLocked();
  }
  spdlog::info("LAUNCH job {} generation {}: {} rank(s){}{}", job_id, generation,
               order.ranks_size(), order.reason().empty() ? "" : "; ", order.reason());
  // A restart: the old generation goes first, so two generations never
  // hold the same GPUs or ports.
  for (auto& rec : older) rec->supervisor->Stop();
  for (auto& rec : older) {
    if (absl::Status s = rec->supervisor->WaitAllExited(config_.grace + kStopMargin); !s.ok()) {
      spdlog::warn("launching job {} generation {} anyway: {}", job_id, generation,
                   std::string(s.message()));
    }
  }
  older.clear();
  CollectFinishedGenerations();

  std::vector<int> ranks;
  for (const v1::RankLaunch& r : order.ranks()) ranks.push_back(r.rank());
  // MESH_METRICS_PORT of each rank, held until the rank's exit is seen (or
  // the launch fails).
  std::map<int, int> metrics_ports;
  auto fail_all = [&](const std::string& why) {
    spdlog::error("cannot launch job {} generation {}: {}", job_id, generation, why);
    absl::MutexLock lock(&mu_);
    for (const auto& [rank, port] : metrics_ports) ReleaseWorkerMetricsPortLocked(port);
    metrics_ports.clear();
    JobRecord& job = *jobs_[job_id];
    for (int rank : ranks) ReportLaunchErrorLocked(job, job_id, generation, rank, why);
  };
  if (ranks.empty()) {
    spdlog::warn("LAUNCH of job {} generation {} lists no ranks; nothing to do", job_id,
                 generation);
    return;
  }
  if (!IsSafeJobId(job_id)) return fail_all(absl::StrCat("job id '", job_id, "' is not valid"));
  if (order.command().empty()) return fail_all("the command is empty");
  absl::StatusOr<LaunchContext> context = PrepareLaunchContext(order);
  if (!context.ok()) return fail_all(std::string(context.status().message()));
  std::unique_ptr<GenerationCgroup> cgroup;
  if (isolation_ != nullptr) {
    absl::StatusOr<std::unique_ptr<GenerationCgroup>> made = isolation_->CreateCgroup(order);
    if (!made.ok()) return fail_all(std::string(made.status().message()));
    cgroup = *std::move(made);
  }

  std::vector<RankLaunch> launches;
  for (const v1::RankLaunch& r : order.ranks()) {
    const int port = AcquireWorkerMetricsPort(job_id, generation, r.rank());
    if (port != 0) metrics_ports[r.rank()] = port;
    absl::StatusOr<RankLaunch> launch = MakeRankLaunch(order, r, *context, port, cgroup.get());
    if (!launch.ok()) return fail_all(std::string(launch.status().message()));
    launches.push_back(*std::move(launch));
  }

  auto rec = std::make_shared<Generation>();
  rec->generation = generation;
  rec->ranks.insert(ranks.begin(), ranks.end());
  rec->metrics_ports = metrics_ports;
  rec->cgroup = std::move(cgroup);
  rec->memory_limit = order.memory_per_proc_bytes();
  for (const v1::RankLaunch& r : order.ranks()) {
    rec->gpus.insert(rec->gpus.end(), r.gpus().begin(), r.gpus().end());
  }
  rec->recorder = std::make_unique<RecordingLauncher>(launcher_);
  SupervisorOptions options;
  options.grace = config_.grace;
  rec->supervisor =
      std::make_unique<WorkerSupervisor>(rec->recorder.get(), job_id, generation, options,
                                         [this](const RankExit& exit) { OnRankExit(exit); });
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      for (const auto& [rank, port] : metrics_ports) ReleaseWorkerMetricsPortLocked(port);
      return;
    }
    jobs_[job_id]->generations[generation] = rec;
  }
  // Before any worker can call it; CollectFinishedGenerations removes it.
  if (relay_ != nullptr) relay_->AddGeneration(job_id, generation, ranks, order.worker_token());
  // From here the ports belong to `rec`: OnRankExit releases each.
  metrics_ports.clear();
  const absl::Status started = rec->supervisor->Start(std::move(launches));
  if (!started.ok()) {
    {
      absl::MutexLock lock(&mu_);
      rec->launching = false;
      rec->stopped = true;
      rec->held.clear();  // every rank is reported as a launch error instead
      // Ranks whose exit was not seen (never started) give their ports back.
      for (const auto& [rank, port] : rec->metrics_ports) ReleaseWorkerMetricsPortLocked(port);
      rec->metrics_ports.clear();
      UpdateWorkerGaugesLocked();
    }
    return fail_all(std::string(started.message()));
  }
  const std::vector<pid_t> pids = rec->recorder->pids();
  absl::MutexLock lock(&mu_);
  rec->launching = false;
  v1::ReportWorkersStartedRequest report;
  report.set_job_id(job_id);
  report.set_generation(generation);
  for (size_t i = 0; i < ranks.size() && i < pids.size(); ++i) {
    if (rec->exited.count(ranks[i]) == 0) rec->running[ranks[i]] = pids[i];
    v1::RunningWorker* w = report.add_workers();
    w->set_job_id(job_id);
    w->set_generation(generation);
    w->set_rank(ranks[i]);
    w->set_pid(pids[i]);
    if (auto port = rec->metrics_ports.find(ranks[i]); port != rec->metrics_ports.end()) {
      w->set_metrics_port(port->second);
    }
  }
  metrics_->launches->Increment(static_cast<double>(pids.size()));
  if (generation > 0) metrics_->restarts->Increment(static_cast<double>(pids.size()));
  metrics_->launch_duration->Observe(absl::ToDoubleSeconds(absl::Now() - received));
  UpdateWorkerGaugesLocked();
  spdlog::info("job {} generation {}: started {} worker(s)", job_id, generation, pids.size());
  outbox_->Enqueue(std::move(report));
  for (v1::ReportWorkerExitRequest& held : rec->held) outbox_->Enqueue(std::move(held));
  rec->held.clear();
}

void OrderApplier::ApplyKill(const v1::Assignment& order) {
  const std::string& job_id = order.job_id();
  std::vector<std::shared_ptr<Generation>> victims;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<JobRecord>& job = jobs_[job_id];
    if (job == nullptr) job = std::make_unique<JobRecord>();
    job->highest = std::max(job->highest, order.generation());
    for (auto& [g, rec] : job->generations) {
      if (g > order.generation()) continue;
      rec->stopped = true;
      victims.push_back(rec);
    }
    if (job->exits_generation <= order.generation()) job->exits.clear();
    UpdateWorkerGaugesLocked();
  }
  const absl::Duration grace = order.grace_period_seconds() > 0
                                   ? absl::Seconds(order.grace_period_seconds())
                                   : config_.grace;
  spdlog::info("KILL job {} generations <= {} ({} on this node, grace {}){}{}", job_id,
               order.generation(), victims.size(), FormatDurationShort(grace),
               order.reason().empty() ? "" : ": ", order.reason());
  for (auto& rec : victims) {
    rec->recorder->OverrideGrace(grace);
    rec->supervisor->Stop();
  }
}

void OrderApplier::OnRankExit(const RankExit& exit) {
  // Read outside the lock: the log may say why (exit code 127).
  std::string detail;
  if (!exit.stopped && exit.exit.exited() && exit.exit.exit_code == 127) {
    detail = ExitDetail(exit.exit, ReadLogTail(RankLogPath(config_.work_dir, exit.job_id,
                                                           exit.generation, exit.rank)));
  }
  bool collectable = false;
  {
    absl::MutexLock lock(&mu_);
    collectable = OnRankExitLocked(exit, detail);
  }
  if (collectable && on_collectable_) on_collectable_();
}

bool OrderApplier::OnRankExitLocked(const RankExit& exit, const std::string& detail) {
  JobRecord* job = nullptr;
  Generation* rec = nullptr;
  if (auto it = jobs_.find(exit.job_id); it != jobs_.end()) {
    job = it->second.get();
    if (auto g = job->generations.find(exit.generation); g != job->generations.end()) {
      rec = g->second.get();
    }
  }
  if (rec != nullptr) {
    rec->running.erase(exit.rank);
    rec->exited.insert(exit.rank);
    if (auto port = rec->metrics_ports.find(exit.rank); port != rec->metrics_ports.end()) {
      ReleaseWorkerMetricsPortLocked(port->second);
      rec->metrics_ports.erase(port);
    }
  }
  metrics_->worker_exits->WithLabels({WorkerExitReason(exit.exit)})->Increment();
  UpdateWorkerGaugesLocked();
  const bool collectable = rec != nullptr && rec->stopped && !rec->launching &&
                           rec->relaunching.empty() && rec->running.empty();
  if (exit.stopped) return collectable;  // the agent's doing, not the job's failure
  spdlog::info("job {} generation {} rank {} (pid {}) ended: {}", exit.job_id, exit.generation,
               exit.rank, exit.exit.pid, exit.exit.ToString());
  v1::ReportWorkerExitRequest request;
  request.set_job_id(exit.job_id);
  request.set_generation(exit.generation);
  request.set_rank(exit.rank);
  if (exit.exit.pid > 0) request.set_pid(exit.exit.pid);
  if (exit.exit.exited()) {
    request.set_exit_code(exit.exit.exit_code);
  } else {
    request.set_signal(exit.exit.signal);
  }
  // An OOM kill in the rank's cgroup explains a failure: the worker's own
  // SIGKILL, or a child's death it then failed on.
  const bool failed = !exit.exit.exited() || exit.exit.exit_code != 0;
  // A rank started again by a replace order counts only the kills since.
  int64_t oom_kills_before = 0;
  if (rec != nullptr) {
    if (auto it = rec->oom_kills_before.find(exit.rank); it != rec->oom_kills_before.end()) {
      oom_kills_before = it->second;
    }
  }
  if (failed && rec != nullptr && rec->cgroup != nullptr &&
      rec->cgroup->OomKills(exit.rank) > oom_kills_before) {
    const std::string limit =
        rec->memory_limit > 0 ? absl::StrCat(" (memory limit ", FormatBytes(rec->memory_limit), ")")
                              : "";
    request.set_oom_killed(true);
    request.set_detail(exit.exit.signal == SIGKILL
                           ? absl::StrCat("killed by the kernel: out of memory", limit)
                           : absl::StrCat("a process it started was killed by the kernel: out of "
                                          "memory",
                                          limit));
  }
  request.set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
  if (!detail.empty() && request.detail().empty()) request.set_detail(detail);
  if (job != nullptr && job->exits_generation == exit.generation) job->exits.push_back(request);
  if (rec != nullptr && (rec->launching || rec->relaunching.count(exit.rank) > 0)) {
    rec->held.push_back(std::move(request));
  } else {
    outbox_->Enqueue(std::move(request));
  }
  return collectable;
}

}  // namespace mesh::agent
