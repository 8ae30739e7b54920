// Cgroups for the agent's workers: one cgroup per (job, generation) on this
// node, one per rank below it, on cgroup v2 or on cgroup v1 with its
// controllers mounted separately (memory, pids, freezer, devices, cpuacct).
//
//   <parent>/mesh-<agent name>-<agent pid>/            the agent's subtree
//       <job id>/gen-<g>/                               one generation
//           rank-<r>/                                   one worker and every
//                                                       process it starts
//
// On v1 the same relative path exists in each hierarchy the manager uses;
// on v2 it exists once. <parent> is the agent's own cgroup (from
// /proc/self/cgroup) unless CgroupOptions.parent names another, so the
// agent's limits, and a systemd unit's Delegate=yes subtree, contain its
// workers.
//
// What a cgroup gives the agent, per generation:
//   - Kill by cgroup (KillAll): every process in the generation dies,
//     whatever session, process group or environment it moved to. v2 writes
//     cgroup.kill (Linux 5.14+), or freezes, signals each member and thaws
//     where cgroup.kill is missing; v1 freezes the freezer cgroup, SIGKILLs
//     every task of it and its children, and thaws, so nothing forks
//     between the scan and the kill.
//   - Limits per rank (CgroupLimits): memory (v1 memory.limit_in_bytes, v2
//     memory.max) and processes plus threads (pids.max), each covering the
//     worker and all its descendants; OomKills tells an OOM kill from any
//     other SIGKILL (v1 memory.oom_control "oom_kill", v2 memory.events).
//   - Device rules per generation (DeviceRules): the listed character
//     devices cannot be opened by any process of the generation (open fails
//     with EPERM); v1 writes them to devices.deny, v2 attaches an eBPF
//     program of type BPF_PROG_TYPE_CGROUP_DEVICE. Everything else stays
//     allowed, so devices the agent knows nothing about (InfiniBand, FUSE)
//     keep working.
//   - Usage: CPU time, memory and the number of processes (Usage).
//
// The first Create of an agent removes what earlier agents of the same name
// left behind: subtrees mesh-<name>-<pid> whose pid is no longer alive are
// killed and removed.
//
// Errors: FAILED_PRECONDITION when a cgroup cannot be created or written
// for lack of permission or of the controller (the message names the file
// and the errno); UNIMPLEMENTED when a limit or a device rule is asked of a
// manager that cannot enforce it (Capabilities() says which it can);
// DEADLINE_EXCEEDED when KillAll's processes are still there at its
// deadline; INTERNAL for other system failures.
//
// Thread safety: CgroupManager and GenerationCgroup are thread-safe.
// Ownership: a GenerationCgroup is owned by whoever created it; destroying it
// kills what is left in it and removes its directories (errors logged).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::agent {

enum class CgroupVersion { kNone, kV1, kV2 };

// "none", "v1", "v2".
const char* CgroupVersionName(CgroupVersion version);

struct CgroupOptions {
  enum class Mode {
    kAuto,  // v2 when /sys/fs/cgroup is cgroup2; else v1 when at least the
            // freezer hierarchy is mounted; else none.
    kV1,
    kV2,
    kNone,  // No cgroups: Create returns a manager whose version() is kNone.
  };
  Mode mode = Mode::kAuto;
  // Where the hierarchies are mounted. v1: <v1_root>/<controller>; v2:
  // v2_root itself (a hybrid host mounts it at /sys/fs/cgroup/unified).
  std::string v1_root = "/sys/fs/cgroup";
  std::string v2_root = "/sys/fs/cgroup";
  // The cgroup (relative to each hierarchy's root, "/a/b") under which the
  // agent makes its subtree; empty: the agent's own, from /proc/self/cgroup.
  std::string parent;
  // The agent's node name: its subtree is mesh-<name>-<pid>. Must be a safe
  // path component ([A-Za-z0-9._-]).
  std::string agent_name;
};

// What a manager can enforce on this host.
struct CgroupCapabilities {
  bool kill = false;  // KillAll reaches every process of a generation
  bool memory_limit = false;
  bool pids_limit = false;
  bool devices = false;  // DeviceRules are enforced
  bool cpu_usage = false;
  bool memory_usage = false;
};

// 0 means no limit.
struct CgroupLimits {
  int64_t memory_bytes = 0;
  int64_t max_pids = 0;
};

// A character device, by number; minor -1 means every minor of `major`.
struct CharDevice {
  uint32_t major = 0;
  int64_t minor = -1;
  bool operator==(const CharDevice&) const = default;
};

struct DeviceRules {
  // Character devices no process of the generation may open (read, write
  // or mknod).
  std::vector<CharDevice> deny;
};

struct CgroupUsage {
  double cpu_seconds = 0;    // user + system, since the cgroup was created
  int64_t memory_bytes = 0;  // current, page cache included
  int64_t processes = 0;     // pids.current, or the number of member tasks
};

class GenerationCgroup {
 public:
  virtual ~GenerationCgroup() = default;

  // Creates rank-<r> with `limits` and returns the cgroup directories a
  // process must join to be in it: one per hierarchy (v1) or one (v2).
  // The launcher opens <dir>/cgroup.procs before fork and the child writes
  // "0" into each before it drops privileges and execs. Calling it again for
  // the same rank returns the same directories (limits re-applied).
  // UNIMPLEMENTED for a limit the manager cannot enforce.
  virtual absl::StatusOr<std::vector<std::string>> CreateRank(int rank,
                                                              const CgroupLimits& limits) = 0;

  // SIGKILLs every process of the generation (every rank, every
  // descendant) and waits until the cgroup is empty or `timeout` passes.
  // Returns how many processes were signalled.
  virtual absl::StatusOr<int> KillAll(absl::Duration timeout) = 0;

  // As KillAll, for rank-<r> alone: what its last process left behind
  // (children in their own session or process group), before the rank is
  // started again in place. 0 for a rank never created.
  virtual absl::StatusOr<int> KillRank(int rank, absl::Duration timeout) = 0;

  // True when no process is in the generation's cgroup any more.
  virtual bool Empty() const = 0;

  // OOM kills the kernel made in rank-<r> since it was created; 0 when the
  // manager has no memory controller or the rank is unknown.
  virtual int64_t OomKills(int rank) const = 0;

  // What the generation uses now (fields it cannot read stay 0).
  virtual CgroupUsage Usage() const = 0;

  // Removes the rank and generation directories (and the job's, once it
  // has no generation left). FAILED_PRECONDITION while processes remain.
  virtual absl::Status Remove() = 0;
};

class CgroupManager {
 public:
  // Detects the version per options.mode, finds the parent, creates the
  // agent's subtree (and on v2 enables the memory, pids and cpu
  // controllers it can for it), and removes stale subtrees of earlier
  // agents of the same name. A mode kAuto that finds no usable hierarchy,
  // or mode kNone, gives a manager with version() kNone whose
  // CreateGeneration is FAILED_PRECONDITION. An explicit kV1 or kV2 that
  // cannot be used is an error. On v2, when the parent refuses controllers
  // because it holds processes and the agent is the only one, the agent
  // moves itself into <parent>/mesh-<name>-<pid>-self first; with other
  // processes there, it goes on without them and Describe() says why.
  static absl::StatusOr<std::unique_ptr<CgroupManager>> Create(const CgroupOptions& options);

  virtual ~CgroupManager() = default;

  virtual CgroupVersion version() const = 0;
  virtual CgroupCapabilities capabilities() const = 0;
  // One line for logs and `meshctl nodes`: "cgroup v1 (memory, pids,
  // freezer, devices, cpuacct) at /sys/fs/cgroup/*/user.slice/mesh-n1-4242",
  // "cgroup v2 (pids, cpu; no memory controller) at ...", "none (...why)".
  virtual std::string Describe() const = 0;

  // Creates <job>/gen-<g> with `devices` applied. `job_id` must be a safe
  // path component (IsSafeJobId). UNIMPLEMENTED when `devices` denies
  // something and the manager cannot enforce device rules.
  virtual absl::StatusOr<std::unique_ptr<GenerationCgroup>> CreateGeneration(
      const std::string& job_id, int64_t generation, const DeviceRules& devices) = 0;
};

// Kills every process in the subtree of the agent whose pid is `agent_pid`
// (mesh-<agent_name>-<agent_pid> under the parent, in each hierarchy that
// options.mode selects) and removes the subtree: what the reaper watchdog
// does when the agent dies (agent/reaper_watchdog.h), and what Create does
// for stale subtrees. Safe in a forked single-threaded child. Returns the
// number of processes signalled; errors are logged, not returned.
int KillAgentCgroups(const CgroupOptions& options, pid_t agent_pid);

// The character devices of NVIDIA GPUs under `dev_dir` (normally /dev):
//   gpus:    nvidia<N> for each N (the GPU with minor number N);
//   shared:  nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset and
//            every node under nvidia-caps/.
// Devices that do not exist are skipped; no error when there are none.
struct NvidiaDevices {
  std::vector<std::pair<int, CharDevice>> gpus;  // (minor number N, device)
  std::vector<CharDevice> shared;
};
NvidiaDevices FindNvidiaDevices(const std::string& dev_dir);

// The rule that confines a generation to its own GPUs: a CPU job
// (`job_gpu_minors` empty) may open no NVIDIA device at all; a GPU job may
// open its own GPUs and the shared nodes, and no other GPU.
DeviceRules GpuConfinement(const NvidiaDevices& devices, const std::vector<int>& job_gpu_minors);

}  // namespace mesh::agent
