// `meshctl cluster up`: a coordinator and N local agents in the foreground,
// for trying Mesh on one machine (docs/cli.md, "Local cluster").
//
// The pieces are separate so that tests can take them one at a time:
//   - FindBinary / BinaryCandidates: where mesh-coordinator and mesh-agent
//     are looked for (pure, with an injectable "is executable" test).
//   - CoordinatorArgv / AgentArgv: the children's command lines (pure).
//   - WaitUntilNodesReady: polls a NodeLister until every local agent is
//     READY (a fake NodeLister in unit tests, JobService.ListNodes for real).
//   - RunClusterUp: starts and supervises the real processes; a `stop_fd`
//     that becomes readable stands for Ctrl-C, so tests need no signals.
//   - RunClusterUpCommand: what the CLI runs: resolves the binaries, makes
//     the state dir, turns SIGINT/SIGTERM into a signalfd, calls
//     RunClusterUp.
//
// Lifecycle of one `cluster up`:
//
//   start coordinator ──port file──▶ start agents ──N READY──▶ UP (banner,
//        │                 │                          │        ready file)
//        └─────────────────┴──── stop (Ctrl-C) ───────┴──────────┤
//                              or a child exits                  ▼
//                                               STOPPING: SIGTERM agents,
//                                               grace, SIGKILL; then the same
//                                               for the coordinator; reap all
//
// Exit codes: 0 when stopped by SIGINT/SIGTERM (a clean Ctrl-C is success),
// 1 when something failed (a child exited while the cluster was up, startup
// timed out, a binary is missing), 2 for bad flags.
//
// Children stay in meshctl's process group, so a terminal's Ctrl-C reaches
// them too; meshctl still sends SIGTERM itself (and SIGKILL after the grace)
// so that `kill -INT <meshctl pid>` stops everything as well. Each child
// gets PR_SET_PDEATHSIG(SIGTERM), so none outlives a killed meshctl.
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "mesh/v1/job.pb.h"

namespace CLI {
class App;
}

namespace mesh::cli {

inline constexpr const char* kCoordinatorBinary = "mesh-coordinator";
inline constexpr const char* kAgentBinary = "mesh-agent";
inline constexpr int kDefaultClusterPort = 7450;

// ---------------------------------------------------------------------------
// Finding the binaries.
// ---------------------------------------------------------------------------

// Where to look for `name` (e.g. "mesh-agent"), in order:
//   1. `self_dir/name`: installed side by side with meshctl;
//   2. `self_dir/../component_dir/name`: the CMake build tree, where meshctl
//      is build/cli/meshctl and the others build/coordinator/mesh-coordinator
//      and build/agent/mesh-agent;
//   3. each directory of `path_env` (empty entries are skipped).
// `self_dir` empty (unknown) skips 1 and 2.
std::vector<std::string> BinaryCandidates(const std::string& name, const std::string& component_dir,
                                          const std::string& self_dir, const std::string& path_env);

// `flag_value` when non-empty (it must then be executable: no fallback, so a
// typo is not silently replaced by another binary), else the first
// executable candidate.
// Possible errors: NOT_FOUND naming the flag value, or every place looked
// in and the flag that overrides them (`flag_name`).
absl::StatusOr<std::string> FindBinary(const std::string& name, const std::string& flag_value,
                                       const std::string& flag_name,
                                       const std::vector<std::string>& candidates,
                                       absl::FunctionRef<bool(const std::string&)> is_executable);

// True for a regular file this process may execute.
bool IsExecutableFile(const std::string& path);

// Directory of the running executable (/proc/self/exe); empty if unknown.
std::string SelfExeDir();

// ---------------------------------------------------------------------------
// The children's command lines.
// ---------------------------------------------------------------------------

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
std::string CoordinatorPortFile(const ClusterConfig& config);

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

// ---------------------------------------------------------------------------
// Readiness.
// ---------------------------------------------------------------------------

// The seam over JobService.ListNodes. Thread safety: used from one thread.
class NodeLister {
 public:
  virtual ~NodeLister() = default;
  // Possible errors: whatever the RPC returns (UNAVAILABLE while the server
  // is starting, UNIMPLEMENTED on a coordinator without JobService).
  virtual absl::StatusOr<mesh::v1::ListNodesResponse> ListNodes(absl::Duration timeout) = 0;
};

// A NodeLister over a gRPC channel to `address`.
std::unique_ptr<NodeLister> MakeGrpcNodeLister(const std::string& address);

// Names in `expected` that `nodes` does not list as READY, in `expected`'s
// order. Nodes not in `expected` are ignored.
std::vector<std::string> MissingReadyNodes(const mesh::v1::ListNodesResponse& nodes,
                                           const std::vector<std::string>& expected);

// Calls `lister` until every name in `expected` is READY, calling
// `wait(poll_interval)` between tries; `wait` returns false to give up at
// once (Ctrl-C, a child died), and is what makes time pass for a FakeClock.
// Errors from ListNodes are retried (the server may still be starting)
// until `deadline`, except UNIMPLEMENTED, returned at once.
// Possible errors: DEADLINE_EXCEEDED naming the missing nodes (k/n READY)
// and the last RPC error; CANCELLED when `wait` returned false;
// UNIMPLEMENTED.
absl::Status WaitUntilNodesReady(NodeLister& lister, const std::vector<std::string>& expected,
                                 absl::Time deadline, absl::Duration poll_interval,
                                 const Clock& clock, absl::FunctionRef<bool(absl::Duration)> wait);

// ---------------------------------------------------------------------------
// Running it.
// ---------------------------------------------------------------------------

// Starts the coordinator, waits for its port file, starts the agents, waits
// until they are READY, prints the banner to `out`, then supervises until
// `stop_fd` becomes readable (returns 0) or a child exits (returns 1, after
// naming it with its exit status and the last lines of its log). Every path
// stops and reaps every child before returning. `stop_fd` is only polled,
// never read. Diagnostics go to `err`.
// Must be called from a thread that outlives the cluster (the children's
// PR_SET_PDEATHSIG fires when the forking thread exits), with SIGCHLD not
// ignored. Not reentrant.
int RunClusterUp(const ClusterConfig& config, int stop_fd, std::ostream& out, std::ostream& err);

// The flags of `meshctl cluster up`, before defaults are resolved.
struct ClusterUpFlags {
  int agents = 2;
  int slots = 0;  // 0: DefaultSlots.
  std::string gpus = "none";
  int port = kDefaultClusterPort;
  std::string state_dir;  // Empty: a new temp dir, removed unless keep_state.
  bool keep_state = false;
  std::string coordinator_bin;
  std::string agent_bin;
  std::string ready_file;
  bool verbose = false;
  bool metrics = false;
  double grace_s = 10.0;
  double ready_timeout_s = 30.0;
};

// Resolves `flags` into a ClusterConfig (binaries, slots, state dir) and
// runs RunClusterUp with SIGINT/SIGTERM as the stop trigger (blocked for
// the duration and read through a signalfd). Returns the exit code.
int RunClusterUpCommand(const ClusterUpFlags& flags, std::ostream& out, std::ostream& err);

// Registers `cluster up` on `app`. The returned object holds the parsed
// flags; after app.parse, Run() executes the command when it was given.
class ClusterCommands {
 public:
  virtual ~ClusterCommands() = default;
  // True when `cluster up` was on the command line.
  virtual bool parsed() const = 0;
  virtual int Run(std::ostream& out, std::ostream& err) = 0;
};
std::unique_ptr<ClusterCommands> AddClusterCommands(CLI::App& app);

}  // namespace mesh::cli
