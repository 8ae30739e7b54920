// What `meshctl cluster up` runs: ClusterConfig, the resolved settings of
// one local cluster, and the command line each child gets from it (the
// coordinator's, each agent's), with the paths under the state dir that the
// children and meshctl share. Pure: no I/O, so tests compare argv vectors.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::cli {

inline constexpr int kDefaultClusterPort = 7450;

// Everything RunClusterUp needs, resolved: no defaults left to compute.
struct ClusterConfig {
  std::string coordinator_bin;
  std::string agent_bin;
  int agents = 2;
  int slots = 1;
  // Each agent's --gpus, one entry per agent (see SplitGpus).
  std::vector<std::string> agent_gpus;
  // Coordinator port; 0 lets it pick a free one.
  int port = kDefaultClusterPort;
  // Holds coordinator.port, coordinator/, coordinator.log, agent-i/,
  // agent-i.log. Must exist.
  std::string state_dir;
  // Remove state_dir after a clean stop (a temp dir meshctl made). It is
  // kept after a failure, so the logs can be read.
  bool remove_state_dir = false;
  // Written atomically with "127.0.0.1:PORT\n" once every agent is READY,
  // removed on exit. Empty: none.
  std::string ready_file;
  // Also copy every child's output to meshctl's stderr, "[name] " prefixed.
  bool verbose = false;
  // Give the coordinator and each agent a /metrics port (picked free) and
  // have the coordinator keep <state_dir>/prometheus-targets.json, Prometheus
  // file service discovery for all of them (docs/metrics.md).
  bool metrics = false;
  // Each agent's --unowned-job-user: the account the local cluster's jobs
  // (which have no owner: its coordinator runs without authentication) run
  // as when the agents run as root. meshctl sets the user running it; empty:
  // not passed.
  std::string job_user;
  // Deadlines: for the port file, for N READY nodes after the agents
  // started, and between SIGTERM and SIGKILL of each group (agents first,
  // then the coordinator).
  absl::Duration port_timeout = absl::Seconds(10);
  absl::Duration ready_timeout = absl::Seconds(30);
  absl::Duration grace = absl::Seconds(10);
  // How often the port file and ListNodes are checked while waiting.
  absl::Duration poll_interval = absl::Milliseconds(100);
};

std::string AgentName(int index);  // "local-<index>"
// The name of this process's effective user (its uid when it has none): a
// local cluster's ClusterConfig.job_user.
std::string CurrentUserName();
// <state_dir>/coordinator.port: the coordinator writes its bound port there.
std::string CoordinatorPortFile(const ClusterConfig& config);
// <state_dir>/prometheus-targets.json, with --metrics.
std::string TargetsFile(const ClusterConfig& config);

std::vector<std::string> CoordinatorArgv(const ClusterConfig& config);
// `coordinator_address` is "127.0.0.1:PORT".
std::vector<std::string> AgentArgv(const ClusterConfig& config, int index,
                                   const std::string& coordinator_address);

// The default --slots: CPUs shared evenly among the agents, at least 1.
int DefaultSlots(int cpus, int agents);

// Each agent's --gpus from `meshctl cluster up --gpus`: "none" and "auto"
// go to every agent as they are (with auto, every agent offers every GPU);
// a list of ordinals is split into equal contiguous parts, so
// "0,1,2,3" with 2 agents gives "0,1" and "2,3": two hosts of two GPUs.
// Possible errors: INVALID_ARGUMENT for anything else, a repeated ordinal,
// or a list whose length is not a multiple of `agents`.
absl::StatusOr<std::vector<std::string>> SplitGpus(const std::string& gpus, int agents);

}  // namespace mesh::cli
