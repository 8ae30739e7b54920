#include "agent/cgroup_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/errno_text.h"

namespace mesh::agent::cgroup_fs {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", ErrnoText(err));
  switch (err) {
    case EACCES:
    case EPERM:
    case ENOENT:
    case EBUSY:
    case EINVAL:
    case EROFS:
    case ENOTSUP:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

void Pause() { usleep(10'000); }

}  // namespace

absl::StatusOr<std::string> ReadText(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("reading ", path));
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return ErrnoStatus(err, absl::StrCat("reading ", path));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("writing \"", text, "\" to ", path));
  ssize_t n;
  do {
    n = write(fd, text.data(), text.size());
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return ErrnoStatus(n < 0 ? err : EIO, absl::StrCat("writing \"", text, "\" to ", path));
  }
  return absl::OkStatus();
}

absl::Status MakeDir(const std::string& path) {
  if (Exists(path)) return absl::OkStatus();
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status s = MakeDir(path.substr(0, slash)); !s.ok()) return s;
  }
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("creating cgroup ", path));
  }
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::optional<int64_t> ReadKeyedValue(const std::string& path, const std::string& key) {
  absl::StatusOr<std::string> text = ReadText(path);
  if (!text.ok()) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t value = 0;
    if (fields.size() == 2 && fields[0] == key && absl::SimpleAtoi(fields[1], &value)) {
      return value;
    }
  }
  return std::nullopt;
}

std::optional<int64_t> ReadInteger(const std::string& path) {
  absl::StatusOr<std::string> text = ReadText(path);
  int64_t value = 0;
  if (!text.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) {
    return std::nullopt;
  }
  return value;
}

std::vector<std::string> TreeDepthFirst(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str()); d != nullptr) {
    std::vector<std::string> children;
    while (const dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (name == "." || name == ".." || entry->d_type != DT_DIR) continue;
      children.push_back(absl::StrCat(dir, "/", name));
    }
    closedir(d);
    for (const std::string& child : children) {
      for (std::string& below : TreeDepthFirst(child)) out.push_back(std::move(below));
    }
  }
  out.push_back(dir);
  return out;
}

std::vector<pid_t> TreePids(const std::string& dir) {
  std::vector<pid_t> pids;
  for (const std::string& cgroup : TreeDepthFirst(dir)) {
    absl::StatusOr<std::string> text = ReadText(cgroup + "/cgroup.procs");
    if (!text.ok()) continue;
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
      int pid = 0;
      if (absl::SimpleAtoi(line, &pid) && pid > 0) pids.push_back(pid);
    }
  }
  return pids;
}

namespace {

int KillAll(const std::vector<pid_t>& pids) {
  int killed = 0;
  for (pid_t pid : pids) {
    if (pid != getpid() && kill(pid, SIGKILL) == 0) ++killed;
  }
  return killed;
}

// Kills what a scan finds until one finds nothing (at most 20 rounds): a
// fork that raced an earlier scan. Returns the number signalled.
int KillStragglers(const std::string& dir) {
  int killed = 0;
  for (int round = 0; round < 20; ++round) {
    std::vector<pid_t> left = TreePids(dir);
    if (left.empty()) break;
    killed += KillAll(left);
    Pause();
  }
  return killed;
}

// Polls `done` every 10 ms until true or `deadline`.
template <typename F>
bool PollUntil(F done, absl::Time deadline) {
  for (;;) {
    if (done()) return true;
    if (absl::Now() >= deadline) return false;
    Pause();
  }
}

}  // namespace

int KillTreeV1(const std::string& dir, const std::string& freezer_dir, absl::Duration freeze_wait) {
  const bool freeze = !freezer_dir.empty() && Exists(freezer_dir + "/freezer.state");
  if (freeze && WriteText(freezer_dir + "/freezer.state", "FROZEN").ok()) {
    // FREEZING until every task stopped; a task in an uninterruptible sleep
    // may hold it there, and is killed anyway.
    PollUntil(
        [&] {
          absl::StatusOr<std::string> state = ReadText(freezer_dir + "/freezer.state");
          return state.ok() && absl::StripAsciiWhitespace(*state) == "FROZEN";
        },
        absl::Now() + freeze_wait);
  }
  int killed = KillAll(TreePids(dir));
  if (freeze) WriteText(freezer_dir + "/freezer.state", "THAWED").IgnoreError();
  return killed + KillStragglers(dir);
}

int KillTreeV2(const std::string& dir, absl::Duration freeze_wait) {
  if (Exists(dir + "/cgroup.kill")) {
    const int count = static_cast<int>(TreePids(dir).size());
    if (WriteText(dir + "/cgroup.kill", "1").ok()) return count;
  }
  const bool freeze = Exists(dir + "/cgroup.freeze") && WriteText(dir + "/cgroup.freeze", "1").ok();
  if (freeze) {
    PollUntil([&] { return ReadKeyedValue(dir + "/cgroup.events", "frozen").value_or(1) == 1; },
              absl::Now() + freeze_wait);
  }
  int killed = KillAll(TreePids(dir));
  if (freeze) WriteText(dir + "/cgroup.freeze", "0").IgnoreError();
  return killed + KillStragglers(dir);
}

bool WaitTreeEmpty(const std::string& dir, absl::Time deadline) {
  return PollUntil(
      [&] {
        // Zombies stay listed until reaped: count only live ones.
        for (pid_t pid : TreePids(dir)) {
          if (PidAlive(pid)) return false;
        }
        return true;
      },
      deadline);
}

absl::Status RemoveTree(const std::string& dir) {
  absl::Status first = absl::OkStatus();
  for (const std::string& cgroup : TreeDepthFirst(dir)) {
    if (rmdir(cgroup.c_str()) != 0 && errno != ENOENT && first.ok()) {
      first = ErrnoStatus(errno, absl::StrCat("removing cgroup ", cgroup));
    }
  }
  return first;
}

std::optional<std::string> OwnCgroup(const std::string& controller) {
  absl::StatusOr<std::string> text = ReadText("/proc/self/cgroup");
  if (!text.ok()) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (controller.empty()) {
      if (fields[0] == "0" && fields[1].empty()) return std::string(fields[2]);
      continue;
    }
    for (absl::string_view name : absl::StrSplit(fields[1], ',')) {
      if (name == controller) return std::string(fields[2]);
    }
  }
  return std::nullopt;
}

bool PidAlive(pid_t pid) {
  // A zombie has exited: /proc/<pid>/stat says state Z.
  absl::StatusOr<std::string> stat = ReadText(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.ok()) return false;
  const size_t paren = stat->rfind(')');
  return paren == std::string::npos || paren + 2 >= stat->size() || (*stat)[paren + 2] != 'Z';
}

}  // namespace mesh::agent::cgroup_fs
