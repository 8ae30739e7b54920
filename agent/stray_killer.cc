#include "agent/stray_killer.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace mesh::agent {
namespace {

// The whole of /proc/<pid>/environ (empty when unreadable or gone).
std::string ReadEnviron(const char* pid) {
  std::string path = absl::StrCat("/proc/", pid, "/environ");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  char buffer[8192];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

bool HasAll(const std::string& environ, const std::vector<std::string>& entries) {
  for (const std::string& entry : entries) {
    bool found = false;
    size_t start = 0;
    while (start < environ.size()) {
      size_t end = environ.find('\0', start);
      if (end == std::string::npos) end = environ.size();
      if (std::string_view(environ).substr(start, end - start) == entry) {
        found = true;
        break;
      }
      start = end + 1;
    }
    if (!found) return false;
  }
  return true;
}

// The state letter of /proc/<pid>/stat (R, S, Z, ...); 0 when gone.
char ProcessState(const char* pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buffer[512];
  const ssize_t n = read(fd, buffer, sizeof(buffer) - 1);
  close(fd);
  if (n <= 0) return 0;
  buffer[n] = '\0';
  // "pid (comm) S ...": comm may hold spaces and parentheses; the last ')'
  // ends it.
  const char* paren = strrchr(buffer, ')');
  if (paren == nullptr || paren[1] == '\0' || paren[2] == '\0') return 0;
  return paren[2];
}

}  // namespace

std::string NewAgentInstance(const std::string& name) {
  std::random_device device;
  const uint64_t random = (uint64_t{device()} << 32) | device();
  return absl::StrCat(name, ".", getpid(), ".", absl::Hex(random, absl::kZeroPad16));
}

int KillProcessesWithEnv(const std::vector<std::string>& entries, int max_rounds) {
  if (entries.empty()) return 0;  // Would match everything.
  const pid_t self = getpid();
  std::set<pid_t> signalled;
  for (int round = 0; round < max_rounds; ++round) {
    DIR* proc = opendir("/proc");
    if (proc == nullptr) break;
    int alive = 0;
    while (const dirent* entry = readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0' || pid <= 1 || pid == self) continue;
      if (!HasAll(ReadEnviron(entry->d_name), entries)) continue;
      // A zombie (dead, not yet reaped by its parent) needs no signal and
      // must not keep the scan going.
      const char state = ProcessState(entry->d_name);
      if (state == 'Z' || state == 'X' || state == 0) continue;
      if (kill(static_cast<pid_t>(pid), SIGKILL) == 0) {
        signalled.insert(static_cast<pid_t>(pid));
        ++alive;
      }
    }
    closedir(proc);
    if (alive == 0) break;
    usleep(10'000);  // Let the signalled ones die before looking again.
  }
  return static_cast<int>(signalled.size());
}

int ProcStrayKiller::KillStrays(const std::string& job_id, int64_t generation) {
  return KillProcessesWithEnv({absl::StrCat(kAgentInstanceVariable, "=", instance_),
                               absl::StrCat("MESH_JOB_ID=", job_id),
                               absl::StrCat("MESH_GENERATION=", generation)});
}

}  // namespace mesh::agent
