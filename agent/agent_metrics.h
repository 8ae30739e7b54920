// AgentMetrics: the agent's metric families (docs/metrics.md, "Agent"),
// created once in a metrics::Registry, and the pure helpers that keep their
// label values bounded.
//
//   mesh_agent_slots, mesh_agent_gpus                    gauges, set at start
//   mesh_agent_workers{state=running|stopping}           gauge
//   mesh_agent_worker_exits_total{reason}                counter, see WorkerExitReason
//   mesh_agent_launches_total, mesh_agent_restarts_total counters (ranks)
//   mesh_agent_launch_duration_seconds                   histogram
//   mesh_agent_heartbeat_age_seconds                     gauge
//   mesh_agent_connected                                 gauge, 0 or 1
//   mesh_agent_relay_rank_calls_total,
//   mesh_agent_relay_coordinator_calls_total             counters: the rank
//                                                        relay's calls served
//                                                        and made upstream
//   mesh_agent_job_cpu_seconds{job}, mesh_agent_job_memory_bytes{job},
//   mesh_agent_job_processes{job}, mesh_agent_job_gpus{job},
//   mesh_agent_job_gpu_utilization_ratio{job},
//   mesh_agent_job_gpu_memory_bytes{job}
//                                                        gauges per job with
//                                                        workers here (series
//                                                        removed when it ends)
//
// Thread safety: the children are the registry's, and thread-safe.
// Ownership: the registry is borrowed and must outlive the AgentMetrics.
#pragma once

#include <string>

#include "agent/process_launcher.h"
#include "common/metrics.h"

namespace mesh::agent {

// The `reason` of a worker exit: "exit_0", "exit_1", "exit_2_127",
// "exit_128_255", "signal_<NAME>" for SIGKILL, SIGTERM, SIGSEGV, SIGABRT,
// SIGBUS, SIGFPE, SIGILL and SIGINT, else "signal_other". Never anything
// else, so the counter has at most 14 series (with "launch_error").
std::string WorkerExitReason(const ExitInfo& exit);
inline constexpr const char* kLaunchErrorReason = "launch_error";

struct AgentMetrics {
  explicit AgentMetrics(metrics::Registry& registry);

  metrics::Gauge* slots;
  metrics::Gauge* gpus;
  metrics::Gauge* workers_running;
  metrics::Gauge* workers_stopping;
  metrics::Family<metrics::Counter>* worker_exits;
  metrics::Counter* launches;
  metrics::Counter* restarts;
  metrics::Histogram* launch_duration;
  metrics::Gauge* heartbeat_age;
  metrics::Gauge* connected;
  metrics::Counter* relay_rank_calls;
  metrics::Counter* relay_coordinator_calls;
  metrics::Family<metrics::Gauge>* job_cpu_seconds;
  metrics::Family<metrics::Gauge>* job_memory_bytes;
  metrics::Family<metrics::Gauge>* job_processes;
  metrics::Family<metrics::Gauge>* job_gpus;
  metrics::Family<metrics::Gauge>* job_gpu_utilization;
  metrics::Family<metrics::Gauge>* job_gpu_memory_bytes;
};

}  // namespace mesh::agent
