#include "cli/job_json.h"

#include <string.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/duration_format.h"

namespace mesh::cli {
namespace {

// Strips `prefix` from a generated enum name; the number when the value is
// unknown to this build (a newer server may send one).
std::string EnumName(const std::string& full, absl::string_view prefix, int value) {
  if (full.empty()) return absl::StrCat(value);
  if (absl::StartsWith(full, prefix)) return full.substr(prefix.size());
  return full;
}

template <typename Repeated>
nlohmann::json Array(const Repeated& items) {
  nlohmann::json array = nlohmann::json::array();
  for (const auto& item : items) array.push_back(item);
  return array;
}

template <typename Map>
nlohmann::json Object(const Map& map) {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [key, value] : map) object[key] = value;
  return object;
}

}  // namespace

std::string JobStateName(mesh::v1::JobState state) {
  return EnumName(mesh::v1::JobState_Name(state), "JOB_STATE_", state);
}

std::string HangPolicyName(mesh::v1::HangPolicy policy) {
  if (policy == mesh::v1::HANG_POLICY_UNSPECIFIED) policy = mesh::v1::HANG_POLICY_RESTART;
  return EnumName(mesh::v1::HangPolicy_Name(policy), "HANG_POLICY_", policy);
}

absl::StatusOr<mesh::v1::HangPolicy> ParseHangPolicy(absl::string_view text) {
  std::string upper = absl::AsciiStrToUpper(text);
  if (!absl::StartsWith(upper, "HANG_POLICY_")) upper = "HANG_POLICY_" + upper;
  mesh::v1::HangPolicy policy;
  if (!mesh::v1::HangPolicy_Parse(upper, &policy) || policy == mesh::v1::HANG_POLICY_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a hang policy: restart or fail"));
  }
  return policy;
}

std::string GrowText(const mesh::v1::JobSpec& spec) {
  switch (spec.grow()) {
    case mesh::v1::GROW_POLICY_ON_RESTART:
      return "on_restart";
    case mesh::v1::GROW_POLICY_AFTER:
      return absl::StrCat("after ", absl::FormatDuration(absl::Seconds(spec.grow_after_seconds())));
    default:
      return "never";
  }
}

nlohmann::json ResizeToJson(const mesh::v1::JobResize& resize) {
  return {
      {"time", TimeToJson(resize.time_unix_ms())},
      {"generation", resize.generation()},
      {"from_nodes", resize.from_nodes()},
      {"to_nodes", resize.to_nodes()},
      {"reason", resize.reason()},
  };
}

std::string RestartPolicyText(mesh::v1::RestartPolicy policy) {
  switch (policy) {
    case mesh::v1::RESTART_POLICY_UNSPECIFIED:
    case mesh::v1::RESTART_POLICY_GROUP:
      return "group";
    case mesh::v1::RESTART_POLICY_IN_PLACE:
      return "in_place";
    default:
      return absl::StrCat(static_cast<int>(policy));
  }
}

std::string MembershipKindName(mesh::v1::MembershipChange::Kind kind) {
  return EnumName(mesh::v1::MembershipChange::Kind_Name(kind), "KIND_", kind);
}

nlohmann::json MembershipChangeToJson(const mesh::v1::MembershipChange& change) {
  return {
      {"epoch", change.epoch()},
      {"time", TimeToJson(change.time_unix_ms())},
      {"rank", change.rank()},
      {"kind", MembershipKindName(change.kind())},
      {"incarnation", change.incarnation()},
      {"reason", change.reason()},
  };
}

int64_t HangTimeoutSeconds(const mesh::v1::JobSpec& spec) {
  return spec.hang_timeout_seconds() > 0 ? spec.hang_timeout_seconds() : 300;
}

std::string NodeStateName(mesh::v1::NodeState state) {
  return EnumName(mesh::v1::NodeState_Name(state), "NODE_STATE_", state);
}

std::optional<mesh::v1::JobState> ParseJobState(absl::string_view text) {
  std::string upper = absl::AsciiStrToUpper(text);
  if (!absl::StartsWith(upper, "JOB_STATE_")) upper = "JOB_STATE_" + upper;
  mesh::v1::JobState state;
  if (!mesh::v1::JobState_Parse(upper, &state) || state == mesh::v1::JOB_STATE_UNSPECIFIED) {
    return std::nullopt;
  }
  return state;
}

bool IsTerminal(mesh::v1::JobState state) {
  return state == mesh::v1::JOB_STATE_SUCCEEDED || state == mesh::v1::JOB_STATE_FAILED ||
         state == mesh::v1::JOB_STATE_CANCELLED;
}

nlohmann::json TimeToJson(int64_t unix_ms) {
  if (unix_ms == 0) return nullptr;
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string SignalName(int signal) {
  // sigabbrev_np is glibc >= 2.32; the names are the same everywhere Mesh runs.
  const char* abbrev = sigabbrev_np(signal);
  return abbrev == nullptr ? "" : absl::StrCat("SIG", abbrev);
}

std::string RootCauseLine(const mesh::v1::RootCause& cause) {
  if (!cause.message().empty()) return cause.message();
  std::string line = cause.rank() >= 0 ? absl::StrCat("rank ", cause.rank()) : "job";
  if (!cause.node().empty()) {
    absl::StrAppend(&line, cause.rank() >= 0 ? " on " : " lost node ", cause.node());
    if (!cause.host().empty() && cause.host() != cause.node()) {
      absl::StrAppend(&line, " (", cause.host(), ")");
    }
  }
  switch (cause.termination_case()) {
    case mesh::v1::RootCause::kExitCode:
      absl::StrAppend(&line, " exited with code ", cause.exit_code());
      break;
    case mesh::v1::RootCause::kSignal: {
      absl::StrAppend(&line, " killed by signal ", cause.signal());
      const std::string name = SignalName(cause.signal());
      if (!name.empty()) absl::StrAppend(&line, " (", name, ")");
      break;
    }
    case mesh::v1::RootCause::TERMINATION_NOT_SET:
      break;
  }
  absl::StrAppend(&line, " in generation ", cause.generation());
  if (cause.oom_killed()) absl::StrAppend(&line, ": killed by the kernel, out of memory");
  return line;
}

nlohmann::json JobSpecToJson(const mesh::v1::JobSpec& spec) {
  return {
      {"name", spec.name()},
      {"labels", Object(spec.labels())},
      {"command", Array(spec.command())},
      {"env", Object(spec.env())},
      {"working_dir", spec.working_dir()},
      {"nodes", {{"min", spec.nodes().min()}, {"max", spec.nodes().max()}}},
      {"nproc_per_node", spec.nproc_per_node()},
      {"gpus_per_proc", spec.gpus_per_proc()},
      {"mesh_shape", Array(spec.mesh_shape())},
      {"mesh_dim_names", Array(spec.mesh_dim_names())},
      {"max_restarts", spec.max_restarts()},
      {"deadline_seconds", spec.deadline_seconds()},
      {"hang_timeout_seconds", HangTimeoutSeconds(spec)},
      {"on_hang", HangPolicyName(spec.on_hang())},
      {"memory_per_proc_bytes", spec.memory_per_proc_bytes()},
      {"max_pids", spec.max_pids()},
      {"grow", GrowText(spec)},
      {"restart_policy", RestartPolicyText(spec.restart_policy())},
      {"in_place_dim", spec.in_place_dim()},
      {"idempotency_key", spec.idempotency_key()},
  };
}

nlohmann::json EventToJson(const mesh::v1::JobStateEvent& event) {
  return {
      {"time", TimeToJson(event.time_unix_ms())}, {"from", JobStateName(event.from())},
      {"to", JobStateName(event.to())},           {"reason", event.reason()},
      {"generation", event.generation()},
  };
}

nlohmann::json RootCauseToJson(const mesh::v1::RootCause& cause) {
  nlohmann::json json = {
      {"rank", cause.rank() >= 0 ? nlohmann::json(cause.rank()) : nlohmann::json(nullptr)},
      {"node", cause.node()},
      {"host", cause.host()},
      {"generation", cause.generation()},
      {"exit_code", nullptr},
      {"signal", nullptr},
      {"signal_name", nullptr},
      {"message", RootCauseLine(cause)},
      {"hang", cause.hang()},
      {"oom_killed", cause.oom_killed()},
  };
  if (cause.has_exit_code()) json["exit_code"] = cause.exit_code();
  if (cause.has_signal()) {
    json["signal"] = cause.signal();
    const std::string name = SignalName(cause.signal());
    if (!name.empty()) json["signal_name"] = name;
  }
  return json;
}

nlohmann::json JobToJson(const mesh::v1::Job& job, bool detail) {
  const mesh::v1::JobSpec& spec = job.spec();
  nlohmann::json json = {
      {"id", job.id()},
      {"name", spec.name()},
      {"owner", job.owner()},
      {"state", JobStateName(job.state())},
      {"pending_reason", job.pending_reason()},
      {"generation", job.generation()},
      {"restarts", job.restarts()},
      {"max_restarts", spec.max_restarts()},
      {"nodes", Array(job.nodes())},
      {"world_size", nullptr},
      {"create_time", TimeToJson(job.create_time_unix_ms())},
      {"update_time", TimeToJson(job.update_time_unix_ms())},
      {"labels", Object(spec.labels())},
      {"command", Array(spec.command())},
      {"mesh_shape", Array(spec.mesh_shape())},
      {"mesh_dim_names", Array(spec.mesh_dim_names())},
      {"root_cause", nullptr},
  };
  // The world is known once the job is placed: nodes × processes per node.
  if (job.nodes_size() > 0) {
    json["world_size"] = static_cast<int64_t>(job.nodes_size()) * spec.nproc_per_node();
  }
  if (job.has_root_cause()) json["root_cause"] = RootCauseToJson(job.root_cause());
  nlohmann::json resizes = nlohmann::json::array();
  for (const auto& resize : job.resizes()) resizes.push_back(ResizeToJson(resize));
  json["resizes"] = std::move(resizes);
  nlohmann::json membership = nlohmann::json::array();
  for (const auto& change : job.membership()) membership.push_back(MembershipChangeToJson(change));
  json["membership"] = std::move(membership);
  if (detail) {
    json["spec"] = JobSpecToJson(spec);
    nlohmann::json events = nlohmann::json::array();
    for (const auto& event : job.events()) events.push_back(EventToJson(event));
    json["events"] = std::move(events);
  }
  return json;
}

std::string FormatByteSize(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit + 1 < 5 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrCat(bytes, kUnits[unit]);
}

nlohmann::json IsolationToJson(const mesh::v1::NodeIsolation& isolation) {
  return {
      {"run_as_owner", isolation.run_as_owner()},
      {"users", isolation.users()},
      {"cgroup_version", isolation.cgroup_version()},
      {"cgroups", isolation.cgroups()},
      {"kill_mechanism", isolation.kill_mechanism()},
      {"memory_limit", isolation.memory_limit()},
      {"pids_limit", isolation.pids_limit()},
      {"device_confinement", isolation.device_confinement()},
      {"allowed_job_env", Array(isolation.allowed_job_env())},
  };
}

std::string IsolationCell(const mesh::v1::NodeIsolation& isolation) {
  if (isolation.cgroup_version().empty() && isolation.users().empty()) return "-";  // old agent
  const std::string version = isolation.cgroup_version();
  return absl::StrCat(isolation.run_as_owner() ? "owner-uid" : "agent-uid", ",",
                      version.empty() || version == "none" ? std::string("no-cgroup")
                                                           : absl::StrCat("cgroup-", version));
}

nlohmann::json NodeToJson(const mesh::v1::Node& node) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& gpu : node.gpus()) {
    gpus.push_back({{"index", gpu.index()},
                    {"uuid", gpu.uuid()},
                    {"model", gpu.model()},
                    {"memory_bytes", gpu.memory_bytes()}});
  }
  return {
      {"name", node.name()},
      {"address", node.address()},
      {"state", NodeStateName(node.state())},
      {"slots", node.slots()},
      {"free_slots", node.free_slots()},
      {"gpus", std::move(gpus)},
      {"free_gpus", node.free_gpus()},
      {"agent_version", node.agent_version()},
      {"last_seen", TimeToJson(node.last_seen_unix_ms())},
      {"jobs", Array(node.jobs())},
      {"isolation", IsolationToJson(node.isolation())},
  };
}

std::string Age(int64_t unix_ms, absl::Time now) {
  if (unix_ms == 0) return "-";
  const int64_t seconds = absl::ToInt64Seconds(now - absl::FromUnixMillis(unix_ms));
  if (seconds < 0) return "0s";  // Clock skew between client and coordinator.
  if (seconds < 120) return absl::StrCat(seconds, "s");
  if (seconds < 120 * 60) return absl::StrCat(seconds / 60, "m");
  if (seconds < 48 * 3600) return absl::StrCat(seconds / 3600, "h");
  return absl::StrCat(seconds / 86400, "d");
}

}  // namespace mesh::cli
