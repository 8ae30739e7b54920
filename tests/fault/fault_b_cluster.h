// Harness of the fault-b reliability tests (issue 10, scenarios 4-8 and 11):
// a real mesh-coordinator and real mesh-agents on this machine, optionally
// with an agent inside a network namespace of its own, and the pieces a
// fault needs (a veth link that can be cut or slowed, a bounded CPU burner).
//
// Everything is RAII: a FaultCluster SIGKILLs its processes (their process
// groups, via Subprocess) and removes its state directory; a NetnsLink
// deletes its veth pair and namespace; a CpuBurner kills its children. No
// process, namespace or file outlives a test, even a failing one. A test
// that crashes may leave a namespace behind: its name carries the creating
// pid ("meshfb<pid>x<n>"), and NetnsLink::Create deletes such leftovers of
// dead pids first.
//
// Thread safety: none; use from the test's thread.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/subprocess.h"

namespace mesh::fault {

// Runs `command` through /bin/sh; returns its exit code (-1 when it could
// not run). stdout and stderr go to `output` when given.
int RunShell(const std::string& command, std::string* output = nullptr);

// A veth pair between this (root) network namespace and a fresh namespace,
// on a private /30: host_ip() here, peer_ip() inside. Lo is up inside.
class NetnsLink {
 public:
  // Why a namespace cannot be made here (not root, no `ip`, no
  // CAP_NET_ADMIN), or nullopt when it can. Tests GTEST_SKIP with it.
  static std::optional<std::string> Unsupported();

  // Possible errors: FAILED_PRECONDITION naming the failed `ip` command.
  static absl::StatusOr<std::unique_ptr<NetnsLink>> Create();
  ~NetnsLink();

  const std::string& ns() const { return ns_; }
  const std::string& host_ip() const { return host_ip_; }
  const std::string& peer_ip() const { return peer_ip_; }
  const std::string& host_dev() const { return host_dev_; }

  // Argv prefix that runs a command inside the namespace.
  std::vector<std::string> ExecPrefix() const;

  // Takes the namespace's end of the link down (the partition) / up again.
  absl::Status Cut();
  absl::Status Heal();

  // `tc qdisc add dev <both ends> root netem delay <delay> <jitter>`.
  // Possible errors: UNIMPLEMENTED when netem is unavailable (no sch_netem),
  // with tc's message.
  absl::Status AddLatency(const std::string& delay, const std::string& jitter);

 private:
  NetnsLink() = default;
  std::string ns_, host_dev_, peer_dev_, host_ip_, peer_ip_;
};

// Keeps `cores` CPUs busy with spinning child processes until it is
// destroyed or `max_duration` has passed (each child exits on its own then),
// so a crashed test cannot leave a burner behind for long.
class CpuBurner {
 public:
  CpuBurner(int cores, absl::Duration max_duration);
  ~CpuBurner();
  CpuBurner(const CpuBurner&) = delete;
  CpuBurner& operator=(const CpuBurner&) = delete;

 private:
  std::vector<pid_t> children_;
};

struct CoordinatorFlags {
  std::string listen = "127.0.0.1";
  double node_heartbeat_interval = 0.2;
  double node_heartbeat_timeout = 2;
  // Rank heartbeats (WorkerService); 0: the coordinator's default.
  double heartbeat_interval = 0;
  double heartbeat_timeout = 0;
  std::vector<std::string> extra;
};

struct AgentFlags {
  std::string name;
  int slots = 2;
  // Address the agent registers (and its workers bind): 127.0.0.1 unless it
  // runs in a namespace.
  std::string address = "127.0.0.1";
  // host:port it dials; empty: the cluster's coordinator address.
  std::string coordinator;
  // Runs it inside this namespace (argv prefix), when set.
  const NetnsLink* netns = nullptr;
};

inline AgentFlags NamedAgent(std::string name) {
  AgentFlags flags;
  flags.name = std::move(name);
  return flags;
}

class FaultCluster {
 public:
  FaultCluster();
  ~FaultCluster();

  // Starts the coordinator and reads its address from its banner.
  absl::Status StartCoordinator(const CoordinatorFlags& flags);
  // Starts an agent; its stderr goes to agent_log(index).
  absl::Status StartAgent(const AgentFlags& flags);

  const std::string& address() const { return address_; }
  int port() const;
  const std::string& dir() const { return dir_; }
  // Tags this cluster's workers (MARKER=<marker>) for /proc scans.
  const std::string& marker() const { return marker_; }
  mesh::testing::Subprocess& coordinator() { return *coordinator_; }
  mesh::testing::Subprocess& agent(int index) { return *agents_.at(index); }
  std::string agent_log(int index) const;
  std::string ReadAgentLog(int index) const;

  mesh::v1::JobService::Stub& jobs() { return *jobs_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10));

  // Polls `condition` every 20 ms for at most `timeout`.
  template <typename Condition>
  static bool Eventually(absl::Duration timeout, Condition condition);

  std::optional<mesh::v1::Node> GetNode(const std::string& name);
  int ReadyNodes();
  bool WaitNodeState(const std::string& name, mesh::v1::NodeState state, absl::Duration timeout);

  // A CPU job running `script` with /bin/sh on `nodes` x `nproc` ranks,
  // tagged with the marker.
  mesh::v1::JobSpec ShellJob(const std::string& script, int nodes, int nproc, int max_restarts = 0);
  // Submits; returns the job id (empty after a failed RPC, also reported).
  std::string Submit(const mesh::v1::JobSpec& spec);
  std::optional<mesh::v1::Job> Get(const std::string& id);
  bool WaitForState(const std::string& id, mesh::v1::JobState state, absl::Duration timeout);
  // The job once terminal, via WaitJob; nullopt on a failed RPC.
  std::optional<mesh::v1::Job> WaitTerminal(const std::string& id, absl::Duration timeout);

  // Live processes of this cluster's workers with these extra env entries
  // (e.g. "MESH_JOB_ID=..", "MESH_NODE_NAME=node-1", "MESH_GENERATION=0").
  std::vector<pid_t> Processes(const std::vector<std::string>& entries = {}) const;

 private:
  std::string dir_;
  std::string marker_;
  std::string address_;
  std::unique_ptr<mesh::testing::Subprocess> coordinator_;
  std::vector<std::unique_ptr<mesh::testing::Subprocess>> agents_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mesh::v1::JobService::Stub> jobs_;
};

template <typename Condition>
bool FaultCluster::Eventually(absl::Duration timeout, Condition condition) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return condition();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace mesh::fault
