// AgentConfig: everything one mesh-agent is told at start (flags parsed by
// agent/agent_main.cc). Plain data with defaults; the Agent checks it in
// Start. Shared read-only by the Agent's parts.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "agent/nvml.h"
#include "common/security.h"
#include "mesh/v1/job.pb.h"

namespace mesh::agent {

struct AgentConfig {
  // host:port of the coordinator; also each worker's MESH_COORDINATOR.
  std::string coordinator = "127.0.0.1:7450";
  // TLS files and the agent's own token (common/security.h). Workers get
  // the TLS files too, but never this token: each job's workers get that
  // job's worker token instead.
  security::ClientSecurity security;
  // Node name (RegisterNodeRequest.name) and the address workers here are
  // reachable at (MASTER_ADDR when rank 0 runs here).
  std::string name;
  std::string address;
  int slots = 1;
  std::vector<GpuDevice> gpus;
  // Logs go to <work_dir>/jobs/<job>/gen-<g>/rank-<r>.log (stdout and
  // stderr together). That directory is also a worker's working directory
  // when its job names none.
  std::string work_dir;
  // Per-rank log cap; the launcher rotates to "<log>.1" beyond it.
  int64_t log_max_bytes = int64_t{64} << 20;
  // SIGTERM -> SIGKILL when stopping workers (a KILL order may give its own).
  absl::Duration grace = absl::Seconds(10);
  // Deadline of every unary RPC.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Deadline of an UploadLogs stream without / with follow.
  absl::Duration upload_timeout = absl::Minutes(5);
  absl::Duration follow_upload_timeout = absl::Hours(24);
  // Re-registration backoff: initial, doubling up to max, each with +-20%
  // jitter. Reset once a session lasted 5 s or delivered an order. The max
  // also caps gRPC's own reconnect backoff, so that a restarted coordinator
  // is found within about max of serving: a connection attempt a second to a
  // coordinator that is down costs nothing, and a few seconds of needless
  // waiting after it is back can cost the node its liveness.
  absl::Duration backoff_initial = absl::Milliseconds(100);
  absl::Duration backoff_max = absl::Seconds(1);
  // How often a followed log is polled for new output.
  absl::Duration log_poll_interval = absl::Milliseconds(100);
  // UPLOAD_LOGS orders served at once; more are refused with a log line.
  int max_uploads = 16;
  // Layer 1 of each worker's environment (InheritedBaseEnv() in the binary).
  std::map<std::string, std::string> base_env;
  // Layer 2: the operator's variables for every worker on this node
  // (--worker-env-file, agent/worker_env_file.h).
  std::vector<std::pair<std::string, std::string>> operator_env;
  // Denied names jobs may set on this node (--allow-job-env).
  std::set<std::string> allowed_job_env;
  // The node's GPUs' utilization and memory use now (NvmlSampler::Sample in
  // the binary; empty without NVML), for the per-job GPU metrics.
  std::function<std::vector<GpuUsage>()> gpu_usage;
  // Port of this agent's /metrics (RegisterNodeRequest.metrics_port); 0:
  // none. The binary starts the exposer and puts the bound port here.
  int metrics_port = 0;
  // Ports given to workers as MESH_METRICS_PORT, first..last inclusive;
  // first = 0: none (workers expose no metrics).
  int worker_metrics_port_first = 0;
  int worker_metrics_port_last = 0;
  // This agent's instance marker, given to every worker as
  // MESH_AGENT_INSTANCE (agent/stray_killer.h); empty: none.
  std::string instance;
  // What the agent enforces between jobs (JobIsolation::Describe), sent
  // with every registration and shown by `meshctl nodes`.
  v1::NodeIsolation isolation;
  // The rank relay (agent/rank_relay.h): workers reach the coordinator's
  // WorkerService through this agent, on a Unix socket at relay_socket
  // (empty: <work_dir>/relay.sock). Off: workers call the coordinator
  // directly.
  bool rank_relay = true;
  std::string relay_socket;
};

}  // namespace mesh::agent
