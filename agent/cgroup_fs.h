// File-level helpers of agent/cgroup.cc: reading and writing cgroup files,
// walking a cgroup tree, killing its processes. Private to the cgroup
// module (and its tests).
//
// Errors name the file and the errno (FAILED_PRECONDITION for EACCES,
// EPERM, ENOENT, EBUSY and EINVAL: the host does not allow it; INTERNAL
// otherwise). Every wait is bounded by the deadline given.
// Thread safety: pure functions over the file system; safe in a forked,
// single-threaded child.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::agent::cgroup_fs {

absl::StatusOr<std::string> ReadText(const std::string& path);
absl::Status WriteText(const std::string& path, const std::string& text);
absl::Status MakeDir(const std::string& path);  // mkdir -p; OK when it exists
bool Exists(const std::string& path);

// The value of `key` in a "key value" file (memory.events, cpu.stat,
// memory.oom_control); nullopt when the file or the key is missing.
std::optional<int64_t> ReadKeyedValue(const std::string& path, const std::string& key);
// A file holding one integer (pids.current, cpuacct.usage).
std::optional<int64_t> ReadInteger(const std::string& path);

// `dir` and every cgroup below it, children before their parents.
std::vector<std::string> TreeDepthFirst(const std::string& dir);
// The pids in cgroup.procs of `dir` and every cgroup below it.
std::vector<pid_t> TreePids(const std::string& dir);

// SIGKILLs every process of the tree at `dir`: v1 freezes it through
// `freezer_dir` (the same cgroup in the freezer hierarchy; empty: no
// freezer) and thaws it after; v2 writes cgroup.kill, or freezes with
// cgroup.freeze where that is missing. A freeze that has not completed
// after `freeze_wait` (a task in uninterruptible sleep) goes on to the
// kill anyway. Returns the number signalled.
int KillTreeV1(const std::string& dir, const std::string& freezer_dir,
               absl::Duration freeze_wait = absl::Seconds(1));
int KillTreeV2(const std::string& dir, absl::Duration freeze_wait = absl::Seconds(1));
// Waits until no process is left in the tree at `dir` or `deadline`.
bool WaitTreeEmpty(const std::string& dir, absl::Time deadline);
// rmdir of the tree, children first; the first error (ENOENT ignored).
absl::Status RemoveTree(const std::string& dir);

// The cgroup path ("/a/b") of this process for the v1 `controller`, or for
// v2 with an empty controller ("0::" line); nullopt when not listed.
std::optional<std::string> OwnCgroup(const std::string& controller);

bool PidAlive(pid_t pid);

}  // namespace mesh::agent::cgroup_fs
