// Harness of the fault-b reliability tests (reliability scenarios 4-8 and 11):
// a real mesh-coordinator and real mesh-agents on this machine, optionally
// with an agent inside a network namespace of its own (tests/util/netns.h:
// NetnsLink, and CpuBurner for load). Unlike MeshCluster (mesh_cluster.h,
// whose command lines, banner reading and channel it shares), agents are
// named freely, may dial another address or run in a namespace, and log
// their stderr to agent_log(i); workers carry the cluster's marker.
//
// Everything is RAII: a FaultCluster SIGKILLs its processes (their process
// groups, via Subprocess), then any process tagged with its marker, and
// removes its state directory. No process or file outlives a test, even a
// failing one.
//
// Errors: the Start* calls as MeshCluster's. Query wrappers: as
// cluster_queries.h says (the RPC's status); ReadyNodes gives -1 when
// ListNodes fails; Submit and WaitTerminal also add a gtest failure on a
// failed RPC, as the tests rely on.
//
// Thread safety: none; use from the test's thread.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/netns.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh::fault {

// The machine-level pieces live in tests/util/netns.h; the fault-b tests
// name them unqualified.
using ::mesh::testing::CpuBurner;
using ::mesh::testing::NetnsLink;
using ::mesh::testing::RunShell;

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
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  // Tags this cluster's workers (MARKER=<marker>) for /proc scans.
  const std::string& marker() const { return marker_; }
  mesh::testing::Subprocess& coordinator() { return *coordinator_; }
  mesh::testing::Subprocess& agent(int index) { return *agents_.at(index); }
  std::string agent_log(int index) const;
  std::string ReadAgentLog(int index) const;

  mesh::v1::JobService::Stub& jobs() { return *jobs_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = testing::kRpcTimeout) {
    return testing::ContextWithDeadline(timeout);
  }

  // Polls `condition` every 20 ms for at most `timeout` (WaitUntil).
  template <typename Condition>
  static bool Eventually(absl::Duration timeout, Condition condition) {
    return testing::WaitUntil(std::move(condition), timeout);
  }

  absl::StatusOr<mesh::v1::Node> GetNode(const std::string& name) {
    return testing::GetNode(*jobs_, name);
  }
  int ReadyNodes() { return testing::ReadyNodes(*jobs_).value_or(-1); }
  bool WaitNodeState(const std::string& name, mesh::v1::NodeState state, absl::Duration timeout) {
    return testing::WaitForNodeState(*jobs_, name, state, timeout);
  }

  // A CPU job running `script` with /bin/sh on `nodes` x `nproc` ranks,
  // tagged with the marker.
  mesh::v1::JobSpec ShellJob(const std::string& script, int nodes, int nproc, int max_restarts = 0);
  // Submits; returns the job id (empty after a failed RPC, also reported).
  std::string Submit(const mesh::v1::JobSpec& spec);
  absl::StatusOr<mesh::v1::Job> Get(const std::string& id) { return testing::GetJob(*jobs_, id); }
  bool WaitForState(const std::string& id, mesh::v1::JobState state, absl::Duration timeout) {
    return testing::WaitForState(*jobs_, id, state, timeout);
  }
  // The job once terminal, via WaitJob; the RPC's error (also reported).
  absl::StatusOr<mesh::v1::Job> WaitTerminal(const std::string& id, absl::Duration timeout);

  // Live processes of this cluster's workers with these extra env entries
  // (e.g. "MESH_JOB_ID=..", "MESH_NODE_NAME=node-1", "MESH_GENERATION=0").
  std::vector<pid_t> Processes(const std::vector<std::string>& entries = {}) const;

 private:
  std::string dir_;
  std::string marker_;
  std::string address_;
  int port_ = 0;
  std::unique_ptr<mesh::testing::Subprocess> coordinator_;
  std::vector<std::unique_ptr<mesh::testing::Subprocess>> agents_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mesh::v1::JobService::Stub> jobs_;
};

}  // namespace mesh::fault
