// MeshCluster: a real mesh-coordinator and mesh-agents on 127.0.0.1 for
// process-level tests (tests/fault/, and any integration test that wants
// it), with the JobService / WorkerService / AdminService stubs and thin
// wrappers over the shared queries of tests/util/cluster_queries.h. The
// free functions below (coordinator and agent command lines, starting a
// coordinator and reading its banner, a private channel) are shared with
// FaultCluster (tests/util/fault_cluster.h).
//
// Ownership: the cluster owns every process it starts (Subprocess: own
// process group, PR_SET_PDEATHSIG) and its temporary directory; the
// destructor SIGKILLs and reaps the agents, then the coordinator, then
// removes the directory, so a failing test leaves nothing behind.
//
// Errors: the Start* calls return INTERNAL (fork failed) or the
// coordinator's banner problem (DEADLINE_EXCEEDED when it did not print
// "mesh-coordinator listening on <addr>" in time, FAILED_PRECONDITION when
// it printed something else). Query wrappers: as cluster_queries.h says
// (the RPC's status), except that ReadyNodes / NodesSeenSince give -1.
//
// Start processes from a thread that outlives them: PR_SET_PDEATHSIG fires
// when the *thread* that forked a child exits, not the process.
//
// Thread safety: none, except that the stubs (jobs(), workers(), admin())
// may be used from several threads; they are replaced by StartCoordinator,
// so do not call it while other threads use them.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/job.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/subprocess.h"

namespace mesh::testing {

struct MeshClusterBinaries {
  std::string coordinator;  // mesh-coordinator
  std::string agent;        // mesh-agent
};

// The command line of a harness coordinator: `binary` with --insecure,
// --listen `listen`, --port `port` (0: any), --state-dir `state_dir`, node
// heartbeats every `node_interval` with a `node_timeout` timeout, a 1 s kill
// grace and a 0.5 s shutdown grace. Append flags to add or override (later
// flags win).
std::vector<std::string> CoordinatorArgv(const std::string& binary, const std::string& listen,
                                         int port, const std::string& state_dir,
                                         absl::Duration node_interval, absl::Duration node_timeout);

// The command line of a harness agent: `binary` dialing `coordinator`,
// registered as `name` at `address`, `slots` slots, `gpus` as its --gpus
// ("none": no GPUs; "auto": NVML discovery), its work directory `work_dir`,
// a 1 s grace.
std::vector<std::string> AgentArgv(const std::string& binary, const std::string& coordinator,
                                   const std::string& name, const std::string& address, int slots,
                                   const std::string& work_dir, const std::string& gpus = "none");

// A coordinator started by StartCoordinatorProcess, and where it listens.
struct StartedCoordinator {
  std::unique_ptr<Subprocess> process;
  std::string address;  // host:port from its banner.
  int port = 0;
};

// Starts `argv` (a mesh-coordinator command line) with `env` ("NAME=value")
// added and waits up to 30 s for its banner "mesh-coordinator listening on
// <host:port>". Errors: INTERNAL (fork failed), DEADLINE_EXCEEDED (no line
// in time), OUT_OF_RANGE (it exited first), FAILED_PRECONDITION (its first
// line was not the banner).
absl::StatusOr<StartedCoordinator> StartCoordinatorProcess(
    const std::vector<std::string>& argv, const std::vector<std::string>& env = {});

// A plaintext channel to `address` on a connection of its own (not shared
// with other channels of this process).
std::shared_ptr<grpc::Channel> NewPrivateChannel(const std::string& address);

class MeshCluster {
 public:
  // Creates a fresh directory /tmp/<prefix>-XXXXXX (dir()).
  MeshCluster(MeshClusterBinaries binaries, const std::string& prefix);
  ~MeshCluster();

  MeshCluster(const MeshCluster&) = delete;
  MeshCluster& operator=(const MeshCluster&) = delete;

  const std::string& dir() const { return dir_; }
  // Where the coordinator keeps its SQLite file: dir()/state unless
  // set_state_dir changed it (before StartCoordinator).
  const std::string& state_dir() const { return state_dir_; }
  void set_state_dir(std::string dir) { state_dir_ = std::move(dir); }
  // "NAME=value" entries added to the environment of every coordinator
  // started after this call (e.g. LD_PRELOAD of a fault-injection library).
  void set_coordinator_env(std::vector<std::string> env) { coordinator_env_ = std::move(env); }

  // Starts mesh-coordinator on `port` (0: any; the same port for a restart)
  // with --insecure, the state directory, fast node heartbeats (0.2 s
  // interval, `node_timeout` timeout), a 1 s kill grace, then `extra` flags
  // (later flags win). Waits for its banner and connects the stubs.
  absl::Status StartCoordinator(int port = 0, const std::vector<std::string>& extra = {},
                                absl::Duration node_timeout = absl::Seconds(5));
  // SIGKILLs the coordinator and reaps it (bounded).
  absl::Status KillCoordinator();
  bool coordinator_running() const { return coordinator_ != nullptr; }
  pid_t coordinator_pid() const;

  // Starts agent `i` named "node-<i>" with `slots` slots, `gpus` as its
  // --gpus (default none), a 1 s grace, its work directory under dir(), and
  // `extra` flags after those. `prefix` goes before the agent's command
  // line (a wrapper such as setpriv that runs it as another user).
  absl::Status StartAgent(int i, int slots = 2, const std::string& gpus = "none",
                          const std::vector<std::string>& extra = {},
                          const std::vector<std::string>& prefix = {});
  Subprocess* agent(int i) { return agents_.at(i).get(); }

  const std::string& address() const { return address_; }
  int port() const { return port_; }

  mesh::v1::JobService::Stub& jobs() { return *jobs_; }
  mesh::v1::WorkerService::Stub& workers() { return *workers_; }
  mesh::v1::AdminService::Stub& admin() { return *admin_; }
  // A fresh channel to the current coordinator (for clients that must not
  // share the stubs' connection).
  std::shared_ptr<grpc::Channel> NewChannel() const;

  // ---- JobService queries (cluster_queries.h, on jobs()) ----------------
  // READY nodes; -1 when ListNodes fails. After a restart, recovered nodes
  // count as READY before their agents are back: see NodesSeenSince.
  int ReadyNodes();
  // Nodes whose last heartbeat or registration is at or after `since`; -1
  // when ListNodes fails.
  int NodesSeenSince(absl::Time since);
  absl::StatusOr<mesh::v1::Job> GetJob(const std::string& id) {
    return ::mesh::testing::GetJob(*jobs_, id);
  }
  absl::StatusOr<std::vector<mesh::v1::Job>> ListAllJobs() {
    return ::mesh::testing::ListAllJobs(*jobs_);
  }
  bool WaitForState(const std::string& id, mesh::v1::JobState state, absl::Duration timeout) {
    return ::mesh::testing::WaitForState(*jobs_, id, state, timeout);
  }
  absl::StatusOr<mesh::v1::Job> WaitTerminal(const std::string& id, absl::Duration timeout) {
    return ::mesh::testing::WaitTerminal(*jobs_, id, timeout);
  }

 private:
  const MeshClusterBinaries binaries_;
  std::string dir_;
  std::string state_dir_;
  std::vector<std::string> coordinator_env_;
  std::string address_;
  int port_ = 0;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> agents_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mesh::v1::JobService::Stub> jobs_;
  std::unique_ptr<mesh::v1::WorkerService::Stub> workers_;
  std::unique_ptr<mesh::v1::AdminService::Stub> admin_;
};

}  // namespace mesh::testing
