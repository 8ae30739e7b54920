// A worker for the job isolation tests (isolation_test.cc and
// secure_cluster_test.cc): each mode does one thing the agent's isolation
// must allow or stop, and says what happened on stdout (the rank's log).
//
//   isolation_probe hold SECONDS
//       prints "uid <uid>" and sleeps (a job for another job to probe).
//   isolation_probe probe PID LOG
//       tries to read /proc/PID/environ, to signal PID (signal 0) and to
//       read LOG; prints "environ: <errno>", "kill: <errno>", "log: <errno>"
//       ("ok" when it worked). Exit 0 when all three were refused with
//       EACCES or EPERM, 1 otherwise.
//   isolation_probe escape PIDFILE
//       forks a child that calls setsid() and forks again; the grandchild
//       writes its pid to PIDFILE and execs `sleep 120` with an empty
//       environment. The worker itself then sleeps.
//   isolation_probe oom MIB
//       allocates and touches MIB MiB, 1 MiB at a time; exit 0 if it could.
//   isolation_probe open-gpus DIR
//       opens DIR/nvidia<N> for every N of 0..7 that exists; prints
//       "nvidia<N>: <errno>". Exit 0 when exactly the GPUs in
//       CUDA_VISIBLE_DEVICES opened (none for an empty or unset one) and the
//       others failed with EPERM, 1 otherwise.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

std::string ErrnoName(int err) {
  switch (err) {
    case 0:
      return "ok";
    case EACCES:
      return "EACCES";
    case EPERM:
      return "EPERM";
    case ENOENT:
      return "ENOENT";
    case ESRCH:
      return "ESRCH";
    default:
      return std::string("errno ") + std::to_string(err) + " (" + std::strerror(err) + ")";
  }
}

// 0 when `path` could be opened for reading, else its errno.
int TryOpen(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  close(fd);
  return 0;
}

bool Refused(int err) { return err == EACCES || err == EPERM; }

int Probe(const std::string& pid, const std::string& log) {
  const int environ_err = TryOpen("/proc/" + pid + "/environ");
  const int kill_err = kill(std::atoi(pid.c_str()), 0) == 0 ? 0 : errno;
  const int log_err = TryOpen(log);
  std::printf("environ: %s\nkill: %s\nlog: %s\n", ErrnoName(environ_err).c_str(),
              ErrnoName(kill_err).c_str(), ErrnoName(log_err).c_str());
  return Refused(environ_err) && Refused(kill_err) && Refused(log_err) ? 0 : 1;
}

int Escape(const std::string& pidfile) {
  const pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    setsid();
    const pid_t grandchild = fork();
    if (grandchild != 0) _exit(0);
    FILE* out = std::fopen(pidfile.c_str(), "w");
    if (out != nullptr) {
      std::fprintf(out, "%d\n", static_cast<int>(getpid()));
      std::fclose(out);
    }
    char* const argv[] = {const_cast<char*>("sleep"), const_cast<char*>("120"), nullptr};
    char* const envp[] = {nullptr};
    execve("/bin/sleep", argv, envp);
    _exit(127);
  }
  std::printf("escaped\n");
  std::fflush(stdout);
  sleep(120);
  return 0;
}

int Oom(int mib) {
  std::vector<char*> blocks;
  for (int i = 0; i < mib; ++i) {
    char* block = static_cast<char*>(std::malloc(1 << 20));
    if (block == nullptr) return 3;
    std::memset(block, i & 0xff, 1 << 20);
    blocks.push_back(block);
    if (i % 64 == 0) {
      std::printf("allocated %d MiB\n", i);
      std::fflush(stdout);
    }
  }
  std::printf("allocated all %d MiB\n", mib);
  return 0;
}

int OpenGpus(const std::string& dir) {
  std::set<int> own;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
    std::string list = visible;
    size_t at = 0;
    while (at < list.size()) {
      size_t comma = list.find(',', at);
      if (comma == std::string::npos) comma = list.size();
      if (comma > at) own.insert(std::atoi(list.substr(at, comma - at).c_str()));
      at = comma + 1;
    }
  }
  bool as_expected = true;
  for (int n = 0; n < 8; ++n) {
    const std::string path = dir + "/nvidia" + std::to_string(n);
    struct stat st;
    if (stat(path.c_str(), &st) != 0) continue;
    const int err = TryOpen(path);
    std::printf("nvidia%d: %s\n", n, ErrnoName(err).c_str());
    as_expected = as_expected && (own.count(n) > 0 ? err == 0 : err == EPERM);
  }
  return as_expected ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "hold" && argc == 3) {
    std::printf("uid %d\n", static_cast<int>(getuid()));
    sleep(static_cast<unsigned>(std::atoi(argv[2])));
    return 0;
  }
  if (mode == "probe" && argc == 4) return Probe(argv[2], argv[3]);
  if (mode == "escape" && argc == 3) return Escape(argv[2]);
  if (mode == "oom" && argc == 3) return Oom(std::atoi(argv[2]));
  if (mode == "open-gpus" && argc == 3) return OpenGpus(argv[2]);
  std::fprintf(stderr, "usage: isolation_probe hold|probe|escape|oom|open-gpus ...\n");
  return 64;
}
