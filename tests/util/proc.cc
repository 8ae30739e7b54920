#include "tests/util/proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mesh::testing {

bool EnsureTestUser(const std::string& name, std::string* why) {
  if (getpwnam(name.c_str()) != nullptr) return true;
  if (geteuid() != 0) {
    *why = "account " + name + " is missing and only root can add it";
    return false;
  }
  // Concurrent tests may add the same account: one useradd wins, the other
  // fails with "already exists", and the lookup below settles it.
  const std::string command =
      "useradd --system --no-create-home --shell /usr/sbin/nologin " + name + " >/dev/null 2>&1";
  const int rc = std::system(command.c_str());
  if (getpwnam(name.c_str()) != nullptr) return true;
  *why = "useradd " + name + " failed (status " + std::to_string(rc) + ")";
  return false;
}

std::string CurrentUserName() {
  const struct passwd* pw = getpwuid(geteuid());
  return pw != nullptr ? pw->pw_name : std::to_string(geteuid());
}
namespace {

// The whole file; empty when it cannot be read. POSIX reads, not an
// ifstream: libstdc++ throws from a read error (ESRCH when the process
// exits between open and read), which scans of /proc race with.
std::string ReadFile(const std::string& path) {
  std::string content;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return content;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    content.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return content;
}

// The fields of /proc/<pid>/stat after "pid (comm) ": state ppid pgrp ...
// Empty when the process is gone.
std::vector<std::string> StatFields(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return {};
  return absl::StrSplit(stat.substr(paren + 2), ' ');
}

bool IsLiveState(const std::vector<std::string>& fields) {
  return !fields.empty() && fields[0] != "Z" && fields[0] != "X";
}

std::vector<pid_t> AllPids() {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    int pid = 0;
    if (absl::SimpleAtoi(entry->d_name, &pid)) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

}  // namespace

bool IsAlive(pid_t pid) { return IsLiveState(StatFields(pid)); }

pid_t ParentOf(pid_t pid) {
  const std::vector<std::string> fields = StatFields(pid);
  int parent = -1;
  if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &parent)) return -1;
  return parent;
}

std::vector<pid_t> LiveProcessesInGroup(pid_t pgid) {
  std::vector<pid_t> found;
  for (pid_t pid : AllPids()) {
    const std::vector<std::string> fields = StatFields(pid);
    int group = 0;
    if (IsLiveState(fields) && fields.size() >= 3 && absl::SimpleAtoi(fields[2], &group) &&
        group == pgid) {
      found.push_back(pid);
    }
  }
  return found;
}

std::vector<pid_t> LiveProcessesWithEnv(const std::vector<std::string>& entries) {
  std::vector<pid_t> found;
  for (pid_t pid : AllPids()) {
    if (!IsAlive(pid)) continue;
    const std::string environ = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    std::set<std::string, std::less<>> have;
    for (absl::string_view entry : absl::StrSplit(environ, '\0')) have.emplace(entry);
    bool all = true;
    for (const std::string& entry : entries) all = all && have.contains(entry);
    if (all) found.push_back(pid);
  }
  return found;
}

int ExitCode(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

std::string MakeTempDir(const std::string& prefix) {
  std::string pattern = absl::StrCat("/tmp/", prefix, "-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::fprintf(stderr, "mkdtemp(%s): %s\n", pattern.c_str(), std::strerror(errno));
    std::abort();
  }
  return pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string ScratchDir::Write(const std::string& name, const std::string& contents) const {
  const std::string path = *this / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

}  // namespace mesh::testing
