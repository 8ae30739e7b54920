#include "agent/worker_env.h"

#include <cstdlib>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/worker_env_policy.h"

namespace mesh::agent {
namespace {

absl::Status CheckRange(const char* field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat("worker assignment: ", field, " is ", value,
                                                   "; it must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckAssignment(const WorkerAssignment& a) {
  if (a.coordinator.empty()) {
    return absl::InvalidArgumentError("worker assignment: coordinator is empty");
  }
  if (a.job_id.empty()) return absl::InvalidArgumentError("worker assignment: job_id is empty");
  for (absl::Status s : {
           CheckRange("world_size", a.world_size, 1, INT32_MAX),
           CheckRange("rank", a.rank, 0, int64_t{a.world_size} - 1),
           CheckRange("local_world_size", a.local_world_size, 1, a.world_size),
           CheckRange("local_rank", a.local_rank, 0, int64_t{a.local_world_size} - 1),
           CheckRange("num_nodes", a.num_nodes, 1, a.world_size),
           CheckRange("node_rank", a.node_rank, 0, int64_t{a.num_nodes} - 1),
           CheckRange("generation", a.generation, 0, INT64_MAX),
           CheckRange("restart_count", a.restart_count, 0, INT32_MAX),
           CheckRange("max_restarts", a.max_restarts, 0, INT32_MAX),
       }) {
    if (!s.ok()) return s;
  }
  if (!a.master_addr.empty()) {
    if (absl::Status s = CheckRange("master_port", a.master_port, 1, 65535); !s.ok()) return s;
  }
  if (absl::Status s = CheckRange("metrics_port", a.metrics_port, 0, 65535); !s.ok()) return s;
  if (a.gpu_job && a.gpus.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker assignment: GPU job but no GPUs given to local rank ", a.local_rank));
  }
  if (!a.gpu_job && !a.gpus.empty()) {
    return absl::InvalidArgumentError("worker assignment: CPU job given GPUs");
  }
  for (int gpu : a.gpus) {
    if (gpu < 0) {
      return absl::InvalidArgumentError(absl::StrCat("worker assignment: negative GPU ", gpu));
    }
  }
  for (const std::string* s : {&a.coordinator, &a.job_id, &a.master_addr, &a.security.token}) {
    if (s->find('\0') != std::string::npos) {
      return absl::InvalidArgumentError("worker assignment: a string field contains a NUL byte");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckUserVariable(const std::string& name, const std::string& value,
                               const std::set<std::string>& allowed = {}) {
  // The coordinator's spec validation applies the same rule; checking again
  // here keeps an agent safe from a coordinator that did not, and applies
  // this node's operator's own allow list.
  if (std::string problem = WorkerEnvNameProblem(name, allowed); !problem.empty()) {
    if (IsDeniedEnvName(name)) {
      // The coordinator allowed it (or did not check): say whose list lacks it.
      problem = absl::StrCat(
          "denied on this node: a job may set it only where the node's operator allows it "
          "(mesh-agent --allow-job-env ",
          name, ")");
    }
    return absl::InvalidArgumentError(absl::StrCat("env: ", absl::CEscape(name), ": ", problem));
  }
  if (value.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("env: value of ", name, " contains a NUL"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* const kInheritedEnvNames[] = {"PATH",     "HOME",   "USER", "LOGNAME", "SHELL", "LANG",
                                          "LANGUAGE", "LC_ALL", "TZ",   "TMPDIR",  nullptr};

std::map<std::string, std::string> InheritedBaseEnv() {
  std::map<std::string, std::string> base;
  for (const char* const* name = kInheritedEnvNames; *name != nullptr; ++name) {
    if (const char* value = std::getenv(*name); value != nullptr) base[*name] = value;
  }
  return base;
}

absl::StatusOr<std::vector<std::string>> BuildWorkerEnv(
    const WorkerAssignment& a, const std::map<std::string, std::string>& base) {
  if (absl::Status s = CheckAssignment(a); !s.ok()) return s;

  std::map<std::string, std::string> env;
  for (const auto& [name, value] : base) {
    // The base comes from the agent's own environment; drop anything that
    // could not be a user variable either, rather than fail the launch.
    if (CheckUserVariable(name, value).ok()) env[name] = value;
  }
  for (const auto& [name, value] : a.operator_env) {
    // Checked when the agent read the file; a reserved name is never set.
    if (!IsAgentSetEnvName(name)) env[name] = value;
  }
  std::set<std::string> seen;
  for (const auto& [name, value] : a.user_env) {
    if (absl::Status s = CheckUserVariable(name, value, a.allowed_job_env); !s.ok()) return s;
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("env: ", name, " is set twice"));
    }
    env[name] = value;
  }

  env["MESH_COORDINATOR"] = a.coordinator;
  env["MESH_JOB_ID"] = a.job_id;
  env["MESH_GENERATION"] = absl::StrCat(a.generation);
  env["MESH_RANK"] = absl::StrCat(a.rank);
  env["MESH_WORLD_SIZE"] = absl::StrCat(a.world_size);
  env["MESH_LOCAL_RANK"] = absl::StrCat(a.local_rank);
  env["MESH_LOCAL_WORLD_SIZE"] = absl::StrCat(a.local_world_size);
  env["MESH_NODE_RANK"] = absl::StrCat(a.node_rank);
  if (!a.node_name.empty()) env["MESH_NODE_NAME"] = a.node_name;
  for (auto& [name, value] : security::ClientSecurityEnv(a.security)) env[name] = value;
  if (a.metrics_port != 0) env["MESH_METRICS_PORT"] = absl::StrCat(a.metrics_port);
  if (!a.agent_instance.empty()) env["MESH_AGENT_INSTANCE"] = a.agent_instance;
  if (!a.agent_socket.empty()) env["MESH_AGENT_SOCKET"] = a.agent_socket;

  env["RANK"] = absl::StrCat(a.rank);
  env["LOCAL_RANK"] = absl::StrCat(a.local_rank);
  env["WORLD_SIZE"] = absl::StrCat(a.world_size);
  env["LOCAL_WORLD_SIZE"] = absl::StrCat(a.local_world_size);
  env["GROUP_RANK"] = absl::StrCat(a.node_rank);
  env["GROUP_WORLD_SIZE"] = absl::StrCat(a.num_nodes);
  // One role, as torchrun's default: role ranks equal global ranks.
  env["ROLE_NAME"] = "default";
  env["ROLE_RANK"] = absl::StrCat(a.rank);
  env["ROLE_WORLD_SIZE"] = absl::StrCat(a.world_size);
  if (!a.master_addr.empty()) {
    env["MASTER_ADDR"] = a.master_addr;
    env["MASTER_PORT"] = absl::StrCat(a.master_port);
  }
  env["TORCHELASTIC_RESTART_COUNT"] = absl::StrCat(a.restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = absl::StrCat(a.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = a.job_id;
  env["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(a.gpus, ",");

  std::vector<std::string> entries;
  entries.reserve(env.size());
  for (const auto& [name, value] : env) entries.push_back(absl::StrCat(name, "=", value));
  return entries;
}

}  // namespace mesh::agent
