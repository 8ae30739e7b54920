// JobIsolation: what keeps one job's workers on this node away from
// another's (docs/security.md). For each LAUNCH it decides
//   - the Unix account the workers run as (RunAs), and
//   - the generation's cgroup, its per-rank limits and its device rule
//     (CreateCgroup),
// and it prepares the generation's directory so that only that account
// (and the agent) can enter it.
//
// Accounts. An agent running as root with run_as_owner (the default) runs
// each job as the account its LAUNCH names (Assignment.unix_user: the
// owner's `unix_user` in the coordinator's token file). A job whose owner
// has none is refused, and so is a job with no owner (a coordinator without
// authentication) unless the agent names an account for those
// (--unowned-job-user). An account that does not exist on this node is
// refused, and so is uid 0 unless the LAUNCH says allow_root or the operator
// named root as the unowned-job user. An agent not running as root, or with
// run_as_owner off, runs every worker as itself and says so (Describe).
//
// Thread safety: thread-safe (const after construction).
// Ownership: the CgroupManager is borrowed, may be null (no cgroups), and
// must outlive this object.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/cgroup.h"
#include "agent/nvml.h"
#include "agent/process_launcher.h"
#include "mesh/v1/job.pb.h"

namespace mesh::agent {

struct JobIsolationOptions {
  // Run workers as their owner's account when the agent is root.
  bool run_as_owner = true;
  // The account for jobs without an owner; empty: such jobs are refused by
  // an agent that runs workers as their owners.
  std::string unowned_job_user;
  // Where the NVIDIA device nodes are (normally /dev).
  std::string gpu_device_dir = "/dev";
  // The node's GPUs (index -> minor number of /dev/nvidia<minor>).
  std::vector<GpuDevice> gpus;
  // Names the operator lets jobs set although they are refused by default.
  std::vector<std::string> allowed_job_env;
  // Why there is no CgroupManager, when there is none (for Describe); empty:
  // "mesh-agent --cgroups=none".
  std::string no_cgroups_reason;
  // The effective uid of the agent; JobIsolation::Create reads geteuid().
  uid_t agent_uid = 0;
};

class JobIsolation {
 public:
  // Possible errors: INVALID_ARGUMENT when unowned_job_user names no
  // account on this host.
  static absl::StatusOr<std::unique_ptr<JobIsolation>> Create(JobIsolationOptions options,
                                                              CgroupManager* cgroups);

  // Whether workers run as their owners' accounts.
  bool runs_as_owner() const { return run_as_owner_; }

  // The account for a LAUNCH's workers; nullopt: the agent's own.
  // Possible errors: FAILED_PRECONDITION with a reason for people ("job
  // job-7 of alice: alice has no unix_user in the coordinator's token file;
  // this node runs workers as their owner's account").
  absl::StatusOr<std::optional<WorkerCredentials>> RunAs(const v1::Assignment& order) const;

  // Makes the generation directory `dir` (and its parents) and, for a
  // worker account, gives it to that account with mode 0700, so no other
  // job's account can enter it or read the logs inside.
  // Possible errors: FAILED_PRECONDITION when a directory cannot be made or
  // given, or `dir` or its job directory is a symlink (which a worker of an
  // earlier generation could plant: it is refused, never followed).
  absl::Status PrepareDirectory(const std::string& dir,
                                const std::optional<WorkerCredentials>& account) const;

  // The generation's cgroup, with the GPU confinement of the GPUs its ranks
  // on this node hold; nullptr when the node has no cgroups and the order
  // asks for no limit. FAILED_PRECONDITION when the order asks for a limit
  // this node cannot enforce, or the cgroup cannot be made.
  absl::StatusOr<std::unique_ptr<GenerationCgroup>> CreateCgroup(const v1::Assignment& order) const;

  // Each rank's limits from the order.
  static CgroupLimits LimitsOf(const v1::Assignment& order);

  // What this node enforces, for RegisterNodeRequest.isolation and the
  // start-up log.
  v1::NodeIsolation Describe() const;

 private:
  JobIsolation(JobIsolationOptions options, CgroupManager* cgroups, bool run_as_owner,
               std::string users);

  const JobIsolationOptions options_;
  CgroupManager* const cgroups_;  // May be null.
  const bool run_as_owner_;
  const std::string users_;  // NodeIsolation.users
};

// The account `name` on this host, with its supplementary groups.
// NOT_FOUND when there is none.
absl::StatusOr<WorkerCredentials> LookUpAccount(const std::string& name);

// "8 GiB", "512 MiB", "1536 KiB", "100 B": the largest binary unit that
// divides the size evenly, for messages.
std::string FormatBytes(int64_t bytes);

}  // namespace mesh::agent
