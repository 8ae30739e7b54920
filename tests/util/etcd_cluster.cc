#include "tests/util/etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/util/proc.h"

extern char** environ;

namespace mesh::testing {
namespace {

constexpr char kDefaultBinary[] = "/usr/bin/etcd";
// How much of a member's log goes into an error message.
constexpr size_t kLogTail = 4000;
// A port picked free can be taken by another process before etcd binds it;
// Start then tries again with fresh ports.
constexpr int kStartAttempts = 3;

// Ports the kernel calls free now, distinct from one another: each socket
// stays bound until all are picked.
absl::StatusOr<std::vector<int>> PickPorts(int count) {
  std::vector<int> fds;
  std::vector<int> ports;
  absl::Status status;
  for (int i = 0; i < count && status.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      status = absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
      break;
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::InternalError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(errno)));
      break;
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) ::close(fd);
  if (!status.ok()) return status;
  return ports;
}

// One GET /health on 127.0.0.1:`port`, bounded by `timeout`. True when etcd
// says {"health":"true"}; otherwise `detail` says what came back.
bool Healthy(int port, absl::Duration timeout, std::string* detail) {
  const absl::Time deadline = absl::Now() + timeout;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *detail = absl::StrCat("socket: ", std::strerror(errno));
    return false;
  }
  auto wait_for = [&](short events) {
    for (;;) {
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (left <= 0) return false;
      pollfd pfd{fd, events, 0};
      const int ready = ::poll(&pfd, 1, static_cast<int>(left));
      if (ready > 0) return true;
      if (ready < 0 && errno != EINTR) return false;
    }
  };
  auto fail = [&](std::string why) {
    ::close(fd);
    *detail = std::move(why);
    return false;
  };
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) return fail(absl::StrCat("connect: ", std::strerror(errno)));
    if (!wait_for(POLLOUT)) return fail("connect timed out");
    int error = 0;
    socklen_t len = sizeof(error);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) return fail(absl::StrCat("connect: ", std::strerror(error)));
  }
  const std::string request =
      absl::StrCat("GET /health HTTP/1.0\r\nHost: 127.0.0.1:", port, "\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    if (!wait_for(POLLOUT)) return fail("send timed out");
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EINTR && errno != EAGAIN) {
      return fail(absl::StrCat("send: ", std::strerror(errno)));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string response;
  for (;;) {  // HTTP/1.0: the server closes the connection after the body.
    if (!wait_for(POLLIN))
      return fail(absl::StrCat("no full answer in time; got '", response, "'"));
    char buffer[1024];
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return fail(absl::StrCat("recv: ", std::strerror(errno)));
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  if (absl::StrContains(response, "\"health\":\"true\"")) return true;
  const size_t body = response.find("\r\n\r\n");
  *detail = body == std::string::npos ? response : response.substr(body + 4);
  return false;
}

std::string ReadFile(const std::string& path) {
  std::string content;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return content;
  char buffer[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    content.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return content;
}

// Whether every thread of `pid` is stopped ('T' in /proc/<pid>/task/*/stat)
// or not one is. kill(SIGSTOP) returns once the signal is queued; the
// threads stop when the kernel next handles it on each, a little later.
bool AllThreadsStopped(pid_t pid, bool stopped) {
  std::error_code error;
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  int threads = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tasks, error)) {
    const std::string stat = ReadFile(entry.path().string() + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) continue;  // Gone meanwhile.
    ++threads;
    const char state = stat[paren + 2];
    if ((state == 'T' || state == 't') != stopped) return false;
  }
  return !error && threads > 0;
}

std::string Tail(const std::string& text) {
  return text.size() <= kLogTail ? text : "..." + text.substr(text.size() - kLogTail);
}

}  // namespace

std::string EtcdCluster::Binary() {
  const char* env = std::getenv("MESH_ETCD_BIN");
  return env != nullptr && *env != '\0' ? env : kDefaultBinary;
}

bool EtcdCluster::Available(std::string* why) {
  const std::string binary = Binary();
  if (IsExecutableFile(binary)) return true;
  if (why != nullptr) {
    *why = binary == kDefaultBinary
               ? "etcd is not installed (Debian etcd-server; scripts/install-deps.sh)"
               : absl::StrCat("MESH_ETCD_BIN=", binary, " is not an executable file");
  }
  return false;
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(int members) {
  if (members < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("an etcd cluster needs a member, not ", members));
  }
  std::string why;
  if (!Available(&why)) return absl::FailedPreconditionError(why);
  absl::Status last;
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    std::unique_ptr<EtcdCluster> cluster(new EtcdCluster(MakeTempDir("mesh-etcd")));
    absl::StatusOr<std::vector<int>> ports = PickPorts(2 * members);
    if (!ports.ok()) return ports.status();
    cluster->cluster_token_ = absl::StrCat("mesh-test-", ::getpid(), "-", (*ports)[0]);
    std::vector<std::string> peers;
    for (int i = 0; i < members; ++i) {
      Member member;
      member.name = absl::StrCat("m", i);
      member.client_port = (*ports)[2 * i];
      member.peer_port = (*ports)[2 * i + 1];
      member.data_dir = absl::StrCat(cluster->dir_, "/", member.name, ".etcd");
      member.log_path = absl::StrCat(cluster->dir_, "/", member.name, ".log");
      peers.push_back(absl::StrCat(member.name, "=http://127.0.0.1:", member.peer_port));
      cluster->members_.push_back(std::move(member));
    }
    cluster->initial_cluster_ = absl::StrJoin(peers, ",");
    // Every member first, then the waits: none is healthy before a quorum
    // of them runs.
    absl::Status status;
    for (int i = 0; i < members && status.ok(); ++i) status = cluster->Spawn(i);
    const absl::Time deadline = absl::Now() + kStartTimeout;
    for (int i = 0; i < members && status.ok(); ++i) status = cluster->WaitHealthy(i, deadline);
    if (status.ok()) return cluster;
    last = status;
    bool port_taken = false;
    for (int i = 0; i < members; ++i) {
      port_taken = port_taken || absl::StrContains(cluster->log(i), "address already in use");
    }
    if (!port_taken) break;
  }
  return last;
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < size(); ++i) Kill(i).IgnoreError();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> endpoints;
  for (const Member& member : members_) {
    endpoints.push_back(absl::StrCat("127.0.0.1:", member.client_port));
  }
  return endpoints;
}

std::string EtcdCluster::endpoint_list() const { return absl::StrJoin(endpoints(), ","); }

int EtcdCluster::pid(int i) const {
  if (!CheckIndex(i).ok() || !members_[i].process.has_value()) return -1;
  return members_[i].process->pid();
}

absl::Status EtcdCluster::CheckIndex(int i) const {
  if (i < 0 || i >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no etcd member ", i, " in a cluster of ", size()));
  }
  return absl::OkStatus();
}

absl::Status EtcdCluster::Spawn(int i) {
  Member& member = members_[i];
  // Appended to across restarts, so that the log tells the whole story.
  const int log_fd =
      ::open(member.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("open ", member.log_path, ": ", std::strerror(errno)));
  }
  SpawnOptions options;
  const std::string client_url = absl::StrCat("http://127.0.0.1:", member.client_port);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", member.peer_port);
  options.argv = {Binary(),
                  "--name=" + member.name,
                  "--data-dir=" + member.data_dir,
                  "--listen-client-urls=" + client_url,
                  "--advertise-client-urls=" + client_url,
                  "--listen-peer-urls=" + peer_url,
                  "--initial-advertise-peer-urls=" + peer_url,
                  "--initial-cluster=" + initial_cluster_,
                  "--initial-cluster-token=" + cluster_token_,
                  "--initial-cluster-state=new",
                  "--heartbeat-interval=50",
                  "--election-timeout=500",
                  "--logger=zap",
                  "--log-outputs=stderr"};
  // etcd reads ETCD_* variables as flags; the test's environment must not
  // configure it.
  options.env.emplace();
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "ETCD")) options.env->emplace_back(*e);
  }
  options.stdin_to = Redirect::Null();
  options.stdout_to = Redirect::Fd(log_fd);
  options.stderr_to = Redirect::Fd(log_fd);
  options.group = SpawnOptions::Group::kNewGroup;
  options.death_signal = SIGKILL;
  absl::StatusOr<::mesh::Subprocess> process = ::mesh::Subprocess::Spawn(options);
  ::close(log_fd);
  if (!process.ok()) return process.status();
  member.process.emplace(*std::move(process));
  return absl::OkStatus();
}

absl::Status EtcdCluster::WaitHealthy(int i, absl::Time deadline) {
  Member& member = members_[i];
  std::string detail = "not asked yet";
  for (;;) {
    if (!member.process.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat("etcd member ", i, " is killed"));
    }
    if (std::optional<ExitStatus> exit = member.process->TryWait(); exit.has_value()) {
      member.process.reset();
      return absl::UnavailableError(
          absl::StrCat("etcd member ", i, " (127.0.0.1:", member.client_port, ") exited with ",
                       exit->ToString(), "; its log:\n", Tail(log(i))));
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::UnavailableError(absl::StrCat(
          "etcd member ", i, " (127.0.0.1:", member.client_port, ") was not healthy after ",
          absl::FormatDuration(kStartTimeout), ": ", detail, "; its log:\n", Tail(log(i))));
    }
    if (Healthy(member.client_port, std::min(left, absl::Seconds(2)), &detail)) {
      return absl::OkStatus();
    }
    absl::SleepFor(std::min(left, absl::Milliseconds(20)));
  }
}

absl::Status EtcdCluster::Kill(int i) {
  if (absl::Status status = CheckIndex(i); !status.ok()) return status;
  Member& member = members_[i];
  if (!member.process.has_value()) return absl::OkStatus();
  member.process->SignalGroup(SIGKILL).IgnoreError();  // NOT_FOUND once it has exited.
  absl::StatusOr<ExitStatus> exit = member.process->Wait(absl::Seconds(10));
  if (!exit.ok()) {
    return absl::InternalError(absl::StrCat("etcd member ", i, " (pid ", member.process->pid(),
                                            ") survived SIGKILL: ", exit.status().message()));
  }
  member.process.reset();
  return absl::OkStatus();
}

absl::Status EtcdCluster::Restart(int i) {
  if (absl::Status status = Kill(i); !status.ok()) return status;
  if (absl::Status status = Spawn(i); !status.ok()) return status;
  return WaitHealthy(i, absl::Now() + kStartTimeout);
}

absl::Status EtcdCluster::Pause(int i) {
  if (absl::Status status = CheckIndex(i); !status.ok()) return status;
  Member& member = members_[i];
  if (!member.process.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("etcd member ", i, " is killed"));
  }
  if (absl::Status status = member.process->SignalGroup(SIGSTOP); !status.ok()) return status;
  const pid_t pid = member.process->pid();
  if (!WaitUntil([&] { return AllThreadsStopped(pid, true); }, absl::Seconds(5))) {
    return absl::InternalError(
        absl::StrCat("etcd member ", i, " (pid ", pid, ") did not stop within 5 s of SIGSTOP"));
  }
  return absl::OkStatus();
}

absl::Status EtcdCluster::Resume(int i) {
  if (absl::Status status = CheckIndex(i); !status.ok()) return status;
  Member& member = members_[i];
  if (!member.process.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("etcd member ", i, " is killed"));
  }
  if (absl::Status status = member.process->SignalGroup(SIGCONT); !status.ok()) return status;
  const pid_t pid = member.process->pid();
  if (!WaitUntil([&] { return AllThreadsStopped(pid, false); }, absl::Seconds(5))) {
    return absl::InternalError(
        absl::StrCat("etcd member ", i, " (pid ", pid, ") still stopped 5 s after SIGCONT"));
  }
  return absl::OkStatus();
}

std::string EtcdCluster::log(int i) const {
  if (!CheckIndex(i).ok()) return "";
  return ReadFile(members_[i].log_path);
}

}  // namespace mesh::testing
