#include "cli/cluster_argv.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/check.h"

namespace mesh::cli {

std::string AgentName(int index) { return absl::StrCat("local-", index); }

std::string CoordinatorPortFile(const ClusterConfig& config) {
  return config.state_dir + "/coordinator.port";
}

std::string TargetsFile(const ClusterConfig& config) {
  return config.state_dir + "/prometheus-targets.json";
}

std::vector<std::string> CoordinatorArgv(const ClusterConfig& config) {
  // A local cluster listens on loopback only; plaintext must be asked for.
  std::vector<std::string> argv = {config.coordinator_bin,
                                   "--insecure",
                                   "--listen",
                                   "127.0.0.1",
                                   "--port",
                                   absl::StrCat(config.port),
                                   "--port-file",
                                   CoordinatorPortFile(config),
                                   "--state-dir",
                                   config.state_dir + "/coordinator"};
  if (config.metrics) {
    argv.insert(argv.end(), {"--metrics-port", "0", "--sd-file", TargetsFile(config)});
  }
  return argv;
}

std::string CurrentUserName() {
  const struct passwd* pw = getpwuid(geteuid());
  return pw != nullptr ? std::string(pw->pw_name) : absl::StrCat(geteuid());
}

std::vector<std::string> AgentArgv(const ClusterConfig& config, int index,
                                   const std::string& coordinator_address) {
  MESH_CHECK(index >= 0 && index < static_cast<int>(config.agent_gpus.size()),
             "agent_gpus has no entry for this agent");
  std::vector<std::string> argv = {config.agent_bin,
                                   "--coordinator",
                                   coordinator_address,
                                   "--name",
                                   AgentName(index),
                                   "--address",
                                   "127.0.0.1",
                                   "--slots",
                                   absl::StrCat(config.slots),
                                   "--gpus",
                                   config.agent_gpus[index],
                                   "--work-dir",
                                   absl::StrCat(config.state_dir, "/agent-", index)};
  if (config.metrics) argv.insert(argv.end(), {"--metrics-port", "0"});
  if (!config.job_user.empty()) argv.insert(argv.end(), {"--unowned-job-user", config.job_user});
  return argv;
}

int DefaultSlots(int cpus, int agents) {
  if (agents < 1) return 1;
  return std::max(1, cpus / agents);
}

absl::StatusOr<std::vector<std::string>> SplitGpus(const std::string& gpus, int agents) {
  if (agents < 1) return absl::InvalidArgumentError("--agents must be at least 1");
  if (gpus == "none" || gpus == "auto") return std::vector<std::string>(agents, gpus);
  std::vector<std::string> ordinals;
  std::set<int> seen;
  for (absl::string_view part : absl::StrSplit(gpus, ',')) {
    int ordinal = -1;
    if (!absl::SimpleAtoi(part, &ordinal) || ordinal < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus ", gpus, ": expected none, auto or GPU ordinals like 0,1 (bad: '", part, "')"));
    }
    if (!seen.insert(ordinal).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus ", gpus, ": ordinal ", ordinal, " appears twice"));
    }
    ordinals.push_back(absl::StrCat(ordinal));
  }
  if (ordinals.size() % agents != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--gpus ", gpus, ": ", ordinals.size(),
                                                   " GPUs cannot be split evenly among ", agents,
                                                   " agents"));
  }
  const size_t each = ordinals.size() / agents;
  std::vector<std::string> result;
  for (int i = 0; i < agents; ++i) {
    result.push_back(
        absl::StrJoin(ordinals.begin() + i * each, ordinals.begin() + (i + 1) * each, ","));
  }
  return result;
}

}  // namespace mesh::cli
