// `meshctl cluster up`: a coordinator and N local agents in the foreground,
// for trying Mesh on one machine (docs/cli.md, "Local cluster").
//
// The pieces are separate so that tests can take them one at a time:
//   - cli/cluster_binaries.h: where mesh-coordinator and mesh-agent are
//     looked for (pure, with an injectable "is executable" test).
//   - cli/cluster_argv.h: ClusterConfig and the children's command lines
//     (pure).
//   - cli/cluster_readiness.h: polls a NodeLister until every local agent
//     is READY (a fake NodeLister in unit tests, JobService.ListNodes for
//     real).
//   - cli/cluster_supervisor.h: starts, watches and stops the children.
//   - here: RunClusterUp, the startup sequence over the pieces above; a
//     `stop_fd` that becomes readable stands for Ctrl-C, so tests need no
//     signals. RunClusterUpCommand, what the CLI runs: resolves the
//     binaries, makes the state dir, turns SIGINT/SIGTERM into a signalfd,
//     calls RunClusterUp.
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

#include <iosfwd>
#include <memory>
#include <string>

#include "cli/cluster_argv.h"
#include "cli/cluster_binaries.h"
#include "cli/cluster_readiness.h"

namespace CLI {
class App;
}

namespace mesh::cli {

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
