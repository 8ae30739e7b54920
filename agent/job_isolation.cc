#include "agent/job_isolation.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/job_paths.h"
#include "common/errno_text.h"

namespace mesh::agent {

absl::StatusOr<WorkerCredentials> LookUpAccount(const std::string& name) {
  struct passwd pw;
  struct passwd* found = nullptr;
  std::vector<char> buffer(16384);
  int err = 0;
  while ((err = getpwnam_r(name.c_str(), &pw, buffer.data(), buffer.size(), &found)) == ERANGE &&
         buffer.size() < (1u << 20)) {
    buffer.resize(buffer.size() * 2);
  }
  if (err != 0) {
    return absl::InternalError(absl::StrCat("looking up user ", name, ": ", ErrnoText(err)));
  }
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("there is no account \"", name, "\" on this node"));
  }
  WorkerCredentials credentials;
  credentials.uid = pw.pw_uid;
  credentials.gid = pw.pw_gid;
  credentials.user = name;
  credentials.home = pw.pw_dir != nullptr ? pw.pw_dir : "";
  int count = 64;
  std::vector<gid_t> groups(count);
  while (getgrouplist(name.c_str(), pw.pw_gid, groups.data(), &count) < 0) {
    if (count <= static_cast<int>(groups.size())) count = static_cast<int>(groups.size()) * 2;
    if (count > 65536) return absl::InternalError("getgrouplist: too many groups");
    groups.resize(count);
  }
  groups.resize(count);
  credentials.groups = std::move(groups);
  return credentials;
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (unit + 1 < 6 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrCat(bytes, " ", kUnits[unit]);
}

absl::StatusOr<std::unique_ptr<JobIsolation>> JobIsolation::Create(JobIsolationOptions options,
                                                                   CgroupManager* cgroups) {
  options.agent_uid = geteuid();
  bool run_as_owner = false;
  std::string users;
  if (!options.run_as_owner) {
    users = absl::StrCat(
        "off (mesh-agent --run-as-owner=false): every worker runs as the agent's "
        "uid ",
        options.agent_uid);
  } else if (options.agent_uid != 0) {
    users = absl::StrCat("off: the agent runs as uid ", options.agent_uid,
                         ", not root, so every worker runs as that uid too");
  } else {
    run_as_owner = true;
    users = "workers run as their owner's account";
    if (!options.unowned_job_user.empty()) {
      absl::StatusOr<WorkerCredentials> account = LookUpAccount(options.unowned_job_user);
      if (!account.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--unowned-job-user: ", account.status().message()));
      }
      absl::StrAppend(&users, "; jobs without an owner as ", options.unowned_job_user);
    }
  }
  return std::unique_ptr<JobIsolation>(
      new JobIsolation(std::move(options), cgroups, run_as_owner, std::move(users)));
}

JobIsolation::JobIsolation(JobIsolationOptions options, CgroupManager* cgroups, bool run_as_owner,
                           std::string users)
    : options_(std::move(options)),
      cgroups_(cgroups),
      run_as_owner_(run_as_owner),
      users_(std::move(users)) {}

absl::StatusOr<std::optional<WorkerCredentials>> JobIsolation::RunAs(
    const v1::Assignment& order) const {
  if (!run_as_owner_) return std::nullopt;
  const std::string job = absl::StrCat("job ", order.job_id());
  std::string user = order.unix_user();
  bool root_allowed = order.allow_root();
  if (user.empty()) {
    if (!order.owner().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          job, " of ", order.owner(), ": ", order.owner(),
          " has no unix_user in the coordinator's token file, and this node runs workers as "
          "their owner's account"));
    }
    if (options_.unowned_job_user.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          job,
          " has no owner (the coordinator runs without authentication), and this node runs "
          "workers as their owner's account; start mesh-agent with --unowned-job-user to "
          "choose one for such jobs"));
    }
    user = options_.unowned_job_user;
    root_allowed = true;  // The operator named this account explicitly.
  }
  absl::StatusOr<WorkerCredentials> account = LookUpAccount(user);
  if (!account.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job, ": ", account.status().message(), " (the unix_user of ",
                     order.owner().empty() ? "unowned jobs" : order.owner(), ")"));
  }
  if (account->uid == 0 && !root_allowed) {
    return absl::FailedPreconditionError(
        absl::StrCat(job, ": ", user, " is uid 0, and the coordinator's token file does not allow ",
                     order.owner(), " to run as root (allow_root: true)"));
  }
  return std::optional<WorkerCredentials>(*std::move(account));
}

absl::Status JobIsolation::PrepareDirectory(const std::string& dir,
                                            const std::optional<WorkerCredentials>& account) const {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", dir, ": ", error.message()));
  if (!account.has_value()) return absl::OkStatus();
  // The job directory too: the names of its generations are its own. The
  // jobs directory above is 0711: every account passes through to its own
  // job directory, and none can list the others'.
  const std::string job_dir = std::filesystem::path(dir).parent_path().string();
  const std::string jobs_dir = std::filesystem::path(job_dir).parent_path().string();
  if (chmod(jobs_dir.c_str(), 0711) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make ", jobs_dir, " passable (0711): ", ErrnoText(errno)));
  }
  // By handle, never by name: the job directory belongs to the account
  // already, so a worker of an earlier generation may have put a symlink
  // where this generation's directory goes (gen-1 -> /etc), and chown(2)
  // by name would follow it and hand the target to the account. The job
  // directory's own parent is the agent's, so its name cannot be swapped.
  for (const std::string& path : {job_dir, dir}) {
    const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot give ", path, " to ", account->user, ": ", ErrnoText(err),
          err == ELOOP || err == ENOTDIR ? " (not a directory the agent made: a symlink?)" : ""));
    }
    const bool given = fchown(fd, account->uid, account->gid) == 0 && fchmod(fd, 0700) == 0;
    const int err = errno;
    close(fd);
    if (!given) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot give ", path, " to ", account->user, ": ", ErrnoText(err)));
    }
  }
  return absl::OkStatus();
}

CgroupLimits JobIsolation::LimitsOf(const v1::Assignment& order) {
  CgroupLimits limits;
  limits.memory_bytes = order.memory_per_proc_bytes();
  limits.max_pids = order.max_pids();
  return limits;
}

absl::StatusOr<std::unique_ptr<GenerationCgroup>> JobIsolation::CreateCgroup(
    const v1::Assignment& order) const {
  const CgroupLimits limits = LimitsOf(order);
  const bool no_cgroups = cgroups_ == nullptr || cgroups_->version() == CgroupVersion::kNone;
  if (no_cgroups) {
    if (limits.memory_bytes > 0 || limits.max_pids > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", order.job_id(), " sets ",
                       limits.memory_bytes > 0 ? "memory_per_proc" : "max_pids",
                       ", and this node cannot enforce it: ",
                       cgroups_ == nullptr ? "cgroups are off" : cgroups_->Describe()));
    }
    return std::unique_ptr<GenerationCgroup>();
  }
  const CgroupCapabilities can = cgroups_->capabilities();
  if ((limits.memory_bytes > 0 && !can.memory_limit) || (limits.max_pids > 0 && !can.pids_limit)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", order.job_id(), " sets ",
                     limits.memory_bytes > 0 && !can.memory_limit ? "memory_per_proc" : "max_pids",
                     ", and this node's cgroups cannot enforce it: ", cgroups_->Describe()));
  }
  // GPU confinement: the minors of the GPUs this node's ranks of the job hold.
  std::set<int> minors;
  for (const v1::RankLaunch& rank : order.ranks()) {
    for (int index : rank.gpus()) {
      int minor = index;
      for (const GpuDevice& gpu : options_.gpus) {
        if (gpu.index == index && gpu.minor >= 0) minor = gpu.minor;
      }
      minors.insert(minor);
    }
  }
  DeviceRules devices;
  if (can.devices) {
    devices = GpuConfinement(FindNvidiaDevices(options_.gpu_device_dir),
                             std::vector<int>(minors.begin(), minors.end()));
  }
  absl::StatusOr<std::unique_ptr<GenerationCgroup>> cgroup =
      cgroups_->CreateGeneration(order.job_id(), order.generation(), devices);
  if (!cgroup.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cgroup of job ", order.job_id(), ": ", cgroup.status().message()));
  }
  return cgroup;
}

v1::NodeIsolation JobIsolation::Describe() const {
  v1::NodeIsolation isolation;
  isolation.set_run_as_owner(run_as_owner_);
  isolation.set_users(users_);
  const bool have_cgroups = cgroups_ != nullptr && cgroups_->version() != CgroupVersion::kNone;
  isolation.set_cgroup_version(cgroups_ == nullptr ? "none"
                                                   : CgroupVersionName(cgroups_->version()));
  isolation.set_cgroups(cgroups_ == nullptr ? absl::StrCat("none (",
                                                           options_.no_cgroups_reason.empty()
                                                               ? "mesh-agent --cgroups=none"
                                                               : options_.no_cgroups_reason,
                                                           ")")
                                            : cgroups_->Describe());
  const CgroupCapabilities can = have_cgroups ? cgroups_->capabilities() : CgroupCapabilities{};
  isolation.set_kill_mechanism(have_cgroups && can.kill ? "cgroup"
                                                        : "process group + environment scan");
  isolation.set_memory_limit(can.memory_limit);
  isolation.set_pids_limit(can.pids_limit);
  isolation.set_device_confinement(can.devices);
  for (const std::string& name : options_.allowed_job_env) isolation.add_allowed_job_env(name);
  return isolation;
}

}  // namespace mesh::agent
