#include "tests/util/netns.h"

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace mesh::testing {
namespace {

// Deletes namespaces "meshfb<pid>x<n>" whose creating pid is gone (a test
// that crashed before its destructors ran).
void DeleteStaleNamespaces() {
  std::string list;
  if (RunShell("ip netns list", &list) != 0) return;
  for (absl::string_view line : absl::StrSplit(list, '\n', absl::SkipEmpty())) {
    const std::string name(line.substr(0, line.find(' ')));
    if (!absl::StartsWith(name, "meshfb")) continue;
    const size_t x = name.find('x');
    int pid = 0;
    if (x == std::string::npos || !absl::SimpleAtoi(name.substr(6, x - 6), &pid)) continue;
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      RunShell(absl::StrCat("ip netns del ", name));
    }
  }
}

}  // namespace

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

int RunShell(const std::string& command, std::string* output) {
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  if (output != nullptr) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// ---- NetnsLink ------------------------------------------------------------

std::optional<std::string> NetnsLink::Unsupported() {
  if (geteuid() != 0) return "network namespaces need root (CAP_NET_ADMIN); running as non-root";
  if (access("/usr/sbin/ip", X_OK) != 0 && access("/sbin/ip", X_OK) != 0 &&
      access("/usr/bin/ip", X_OK) != 0) {
    return "no `ip` command (iproute2) on this machine";
  }
  std::string out;
  const std::string probe = absl::StrCat("meshfb", getpid(), "xprobe");
  if (RunShell(absl::StrCat("ip netns add ", probe), &out) != 0) {
    return absl::StrCat("`ip netns add` failed (no CAP_NET_ADMIN?): ", out);
  }
  RunShell(absl::StrCat("ip netns del ", probe));
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<NetnsLink>> NetnsLink::Create() {
  DeleteStaleNamespaces();
  static int counter = 0;
  const int n = counter++;
  std::unique_ptr<NetnsLink> link(new NetnsLink());
  link->ns_ = absl::StrCat("meshfb", getpid(), "x", n);
  // Interface names are at most 15 characters.
  const std::string base = absl::StrCat("mfb", getpid() % 1000000, n % 10);
  link->host_dev_ = base + "a";
  link->peer_dev_ = base + "b";
  // 10.213.<a>.<b>/30, from the pid and counter: unique among concurrent
  // runs of these tests on one machine.
  const int block = (getpid() * 4 + n) % 16384;
  const int a = block / 64;
  const int b = (block % 64) * 4;
  link->host_ip_ = absl::StrCat("10.213.", a, ".", b + 1);
  link->peer_ip_ = absl::StrCat("10.213.", a, ".", b + 2);
  const std::string in_ns = absl::StrCat("ip netns exec ", link->ns_, " ");
  for (const std::string& command : {
           absl::StrCat("ip netns add ", link->ns_),
           absl::StrCat("ip link add ", link->host_dev_, " type veth peer name ", link->peer_dev_),
           absl::StrCat("ip link set ", link->peer_dev_, " netns ", link->ns_),
           absl::StrCat("ip addr add ", link->host_ip_, "/30 dev ", link->host_dev_),
           absl::StrCat("ip link set ", link->host_dev_, " up"),
           absl::StrCat(in_ns, "ip addr add ", link->peer_ip_, "/30 dev ", link->peer_dev_),
           absl::StrCat(in_ns, "ip link set ", link->peer_dev_, " up"),
           absl::StrCat(in_ns, "ip link set lo up"),
       }) {
    std::string out;
    if (RunShell(command, &out) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("`", command, "` failed: ", out));
    }
  }
  return link;
}

NetnsLink::~NetnsLink() {
  // Deleting the host end deletes the pair; deleting the namespace after
  // its processes are gone frees it.
  RunShell(absl::StrCat("ip link del ", host_dev_));
  RunShell(absl::StrCat("ip netns del ", ns_));
}

std::vector<std::string> NetnsLink::ExecPrefix() const { return {"ip", "netns", "exec", ns_}; }

absl::Status NetnsLink::Cut() {
  std::string out;
  if (RunShell(absl::StrCat("ip netns exec ", ns_, " ip link set ", peer_dev_, " down"), &out) !=
      0) {
    return absl::InternalError(absl::StrCat("cannot cut ", ns_, ": ", out));
  }
  return absl::OkStatus();
}

absl::Status NetnsLink::Heal() {
  std::string out;
  if (RunShell(absl::StrCat("ip netns exec ", ns_, " ip link set ", peer_dev_, " up"), &out) != 0) {
    return absl::InternalError(absl::StrCat("cannot heal ", ns_, ": ", out));
  }
  return absl::OkStatus();
}

absl::Status NetnsLink::AddLatency(const std::string& delay, const std::string& jitter) {
  std::string out;
  const std::string qdisc = absl::StrCat(" root netem delay ", delay, " ", jitter);
  if (RunShell(absl::StrCat("tc qdisc add dev ", host_dev_, qdisc), &out) != 0) {
    return absl::UnimplementedError(absl::StrCat("tc netem on ", host_dev_, ": ", out));
  }
  if (RunShell(absl::StrCat("ip netns exec ", ns_, " tc qdisc add dev ", peer_dev_, qdisc), &out) !=
      0) {
    return absl::UnimplementedError(absl::StrCat("tc netem on ", peer_dev_, ": ", out));
  }
  return absl::OkStatus();
}

// ---- CpuBurner ------------------------------------------------------------

CpuBurner::CpuBurner(int cores, absl::Duration max_duration) {
  const absl::Time end = absl::Now() + max_duration;
  for (int i = 0; i < cores; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      volatile uint64_t x = 0;
      while (absl::Now() < end) {
        for (int j = 0; j < 1000000; ++j) x = x + j;
      }
      _exit(0);
    }
    if (pid > 0) children_.push_back(pid);
  }
}

CpuBurner::~CpuBurner() {
  for (pid_t pid : children_) kill(pid, SIGKILL);
  for (pid_t pid : children_) waitpid(pid, nullptr, 0);
}

}  // namespace mesh::testing
