#include "agent/agent_metrics.h"

#include <signal.h>

#include "absl/strings/str_cat.h"

namespace mesh::agent {

std::string WorkerExitReason(const ExitInfo& exit) {
  if (exit.exited()) {
    // Exit codes are grouped so that a program exiting with random codes
    // cannot grow the series; 128+N is what shells report for signal N.
    if (exit.exit_code == 0) return "exit_0";
    if (exit.exit_code == 1) return "exit_1";
    if (exit.exit_code >= 2 && exit.exit_code <= 127) return "exit_2_127";
    return "exit_128_255";
  }
  switch (exit.signal) {
    case SIGKILL:
      return "signal_SIGKILL";
    case SIGTERM:
      return "signal_SIGTERM";
    case SIGSEGV:
      return "signal_SIGSEGV";
    case SIGABRT:
      return "signal_SIGABRT";
    case SIGBUS:
      return "signal_SIGBUS";
    case SIGFPE:
      return "signal_SIGFPE";
    case SIGILL:
      return "signal_SIGILL";
    case SIGINT:
      return "signal_SIGINT";
    default:
      return "signal_other";
  }
}

AgentMetrics::AgentMetrics(metrics::Registry& registry) {
  slots = registry.AddGauge("mesh_agent_slots", "Worker slots this agent offers.")->Get();
  gpus = registry.AddGauge("mesh_agent_gpus", "GPUs this agent offers.")->Get();
  auto* workers = registry.AddGauge(
      "mesh_agent_workers",
      "Worker processes supervised, by state: running, or stopping (being terminated by the "
      "agent for a kill, a restart or a shutdown).",
      {"state"});
  workers_running = workers->WithLabels({"running"});
  workers_stopping = workers->WithLabels({"stopping"});
  worker_exits = registry.AddCounter(
      "mesh_agent_worker_exits_total",
      "Worker exits by reason: exit code class, terminating signal, or launch_error.", {"reason"});
  // Every reason's series exists from the start, at 0, so that rate() and
  // increase() see the first exit of each kind.
  for (const char* reason :
       {"exit_0", "exit_1", "exit_2_127", "exit_128_255", "signal_SIGKILL", "signal_SIGTERM",
        "signal_SIGSEGV", "signal_SIGABRT", "signal_SIGBUS", "signal_SIGFPE", "signal_SIGILL",
        "signal_SIGINT", "signal_other", kLaunchErrorReason}) {
    worker_exits->WithLabels({reason});
  }
  launches = registry.AddCounter("mesh_agent_launches_total", "Ranks launched.")->Get();
  relay_rank_calls =
      registry
          .AddCounter("mesh_agent_relay_rank_calls_total",
                      "WorkerService calls the rank relay admitted from this node's ranks.")
          ->Get();
  relay_coordinator_calls =
      registry
          .AddCounter("mesh_agent_relay_coordinator_calls_total",
                      "Calls the rank relay made to the coordinator for this node's ranks "
                      "(batches, fetches, watches, forwarded calls).")
          ->Get();
  restarts = registry
                 .AddCounter("mesh_agent_restarts_total",
                             "Ranks launched for a job generation > 0 (a restart).")
                 ->Get();
  launch_duration = registry
                        .AddHistogram("mesh_agent_launch_duration_seconds",
                                      "From receiving a LAUNCH order to every rank of it started.",
                                      {}, metrics::LatencyBuckets())
                        ->Get();
  heartbeat_age = registry
                      .AddGauge("mesh_agent_heartbeat_age_seconds",
                                "Seconds since the coordinator last acknowledged a heartbeat "
                                "or registration.")
                      ->Get();
  connected = registry
                  .AddGauge("mesh_agent_connected",
                            "1 while registered with a live coordinator session, else 0.")
                  ->Get();
  job_cpu_seconds = registry.AddGauge(
      "mesh_agent_job_cpu_seconds",
      "CPU time (user + system) used on this node by the job's current generation, all its "
      "processes, from its cgroup.",
      {"job"});
  job_memory_bytes = registry.AddGauge(
      "mesh_agent_job_memory_bytes",
      "Memory the job's processes on this node use now (page cache included), from its cgroup.",
      {"job"});
  job_processes = registry.AddGauge(
      "mesh_agent_job_processes",
      "Processes and threads of the job on this node now, from its cgroup.", {"job"});
  job_gpus =
      registry.AddGauge("mesh_agent_job_gpus", "GPUs of this node held by the job.", {"job"});
  job_gpu_utilization = registry.AddGauge(
      "mesh_agent_job_gpu_utilization_ratio",
      "Mean utilization (share of time a kernel ran, NVML) of the job's GPUs on this node.",
      {"job"});
  job_gpu_memory_bytes =
      registry.AddGauge("mesh_agent_job_gpu_memory_bytes",
                        "Device memory in use on the job's GPUs on this node (NVML).", {"job"});
}

}  // namespace mesh::agent
