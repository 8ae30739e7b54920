// Worker environment: the complete environment an agent gives one worker,
// built from its assignment. Pure (no getenv inside BuildWorkerEnv) so it is
// unit-tested exactly; docs/agent.md has the table.
//
// Layers, later ones winning, except that reserved names cannot be set by
// the user:
//   1. a minimal base inherited from the agent (kInheritedEnvNames);
//   2. the operator's worker environment (--worker-env-file): any name but
//      a reserved one, denied ones (LD_LIBRARY_PATH) included;
//   3. the user's env from the job spec, where a denied name is refused
//      unless the operator allows it (--allow-job-env);
//   4. reserved: MESH_* (docs/runtime.md), the torchrun contract, and
//      CUDA_VISIBLE_DEVICES.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/security.h"

namespace mesh::agent {

// What one worker (one rank of one job generation) is started with.
struct WorkerAssignment {
  std::string coordinator;  // host:port, as MESH_COORDINATOR
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  // The agent's node name (MESH_NODE_NAME): what the coordinator groups
  // ranks by, so two agents on one machine are two nodes. Omitted when empty.
  std::string node_name;
  // How the worker reaches the coordinator: the agent's TLS files and the
  // job's worker token (Assignment.worker_token), passed as MESH_TLS_* and
  // MESH_TOKEN (common/security.h). Empty fields are omitted. The token
  // never appears in error messages.
  security::ClientSecurity security;
  // The torchrun rendezvous endpoint (rank 0's host and a free port there),
  // for programs that call torch.distributed.init_process_group("env://").
  // MASTER_ADDR/MASTER_PORT are omitted when master_addr is empty.
  std::string master_addr;
  int master_port = 0;
  // Restarts so far (TORCHELASTIC_RESTART_COUNT) and allowed
  // (TORCHELASTIC_MAX_RESTARTS).
  int restart_count = 0;
  int max_restarts = 0;
  // GPU job: true, with the CUDA ordinals given to this local rank (not
  // empty). CPU job: false, and CUDA_VISIBLE_DEVICES is set empty so the
  // worker cannot use GPUs given to other jobs.
  bool gpu_job = false;
  std::vector<int> gpus;
  // MESH_METRICS_PORT: where the worker serves its /metrics (libmesh,
  // docs/runtime.md); 0: omitted, the worker exposes none.
  int metrics_port = 0;
  // The agent's instance marker (MESH_AGENT_INSTANCE, agent/stray_killer.h):
  // how the agent finds the worker's descendants that left its process
  // group. Omitted when empty.
  std::string agent_instance;
  // The agent's rank relay socket (MESH_AGENT_SOCKET, agent/rank_relay.h):
  // libmesh then makes every WorkerService call through it. Omitted when
  // empty.
  std::string agent_socket;
  // The user's env from the job spec, in spec order.
  std::vector<std::pair<std::string, std::string>> user_env;
  // Layer 2: the operator's worker environment (agent/worker_env_file.h).
  std::vector<std::pair<std::string, std::string>> operator_env;
  // Denied names the operator lets the job's env set (--allow-job-env).
  std::set<std::string> allowed_job_env;
};

// Variables copied from the agent's environment when set there:
// PATH HOME USER LOGNAME SHELL LANG LANGUAGE LC_ALL TZ TMPDIR.
extern const char* const kInheritedEnvNames[];

// Reads kInheritedEnvNames from this process's environment (getenv).
// Thread safety: as getenv.
std::map<std::string, std::string> InheritedBaseEnv();

// Builds the worker's environment as sorted "NAME=value" entries.
// `base` is layer 1 (normally InheritedBaseEnv()).
// Possible errors: INVALID_ARGUMENT, naming the field or variable, when the
// assignment is inconsistent (rank outside [0, world_size), local rank
// outside [0, local_world_size), node rank outside [0, num_nodes), empty job
// id or coordinator, negative generation or restart counts, a GPU job
// without GPUs or a CPU job with some, master_port outside 1..65535 with a
// master_addr, metrics_port outside 0..65535), or when a user variable is set twice, has a NUL in
// its value, or has a name common/worker_env_policy.h refuses (malformed, denied, or set by the
// agent), the same rule the coordinator applies to job specs.
absl::StatusOr<std::vector<std::string>> BuildWorkerEnv(
    const WorkerAssignment& assignment, const std::map<std::string, std::string>& base);

}  // namespace mesh::agent
