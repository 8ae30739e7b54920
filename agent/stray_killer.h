// StrayKiller: finds and kills the processes of a job that left their
// worker's process group (setsid, a double-forked "daemon"), which the
// launcher's group signals and PR_SET_PDEATHSIG cannot reach.
//
// Every worker's environment carries the agent's instance marker
// (MESH_AGENT_INSTANCE, agent/worker_env.h) next to MESH_JOB_ID and
// MESH_GENERATION, and every descendant inherits it whatever session or
// group it moves to. A stray is a live process whose /proc/<pid>/environ
// holds all three. The agent kills a generation's strays once the
// generation has been stopped and its workers have exited (a restart, a
// cancel, any end of the job: the coordinator sends KILL for each), and the
// reaper watchdog kills every process with the marker when the agent dies.
//
// Limits: a process that clears or rewrites its environment before exec
// (env -i) drops the marker and escapes; so does a process of another user
// (its environ is unreadable). Only a cgroup contains those.
//
// Thread safety: implementations are thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mesh::agent {

// "MESH_AGENT_INSTANCE".
inline constexpr char kAgentInstanceVariable[] = "MESH_AGENT_INSTANCE";

// A marker unique to this agent process: "<name>.<pid>.<random hex>".
std::string NewAgentInstance(const std::string& name);

// Sends SIGKILL to every live process (other than the caller) whose
// environment holds every entry of `entries` ("NAME=value"), and scans
// again until a scan finds none (at most `max_rounds` scans: a process may
// fork between a scan and its kill). Returns the number of processes
// signalled. Reads /proc only; processes whose environ is unreadable are
// skipped. Safe to call in a forked child of a single-threaded process.
int KillProcessesWithEnv(const std::vector<std::string>& entries, int max_rounds = 20);

class StrayKiller {
 public:
  virtual ~StrayKiller() = default;
  // Kills what is left of (job_id, generation) on this node; returns how
  // many processes were signalled.
  virtual int KillStrays(const std::string& job_id, int64_t generation) = 0;
};

// The real one: a /proc scan for the instance marker, the job and the
// generation.
class ProcStrayKiller final : public StrayKiller {
 public:
  explicit ProcStrayKiller(std::string instance) : instance_(std::move(instance)) {}
  int KillStrays(const std::string& job_id, int64_t generation) override;

 private:
  const std::string instance_;
};

}  // namespace mesh::agent
