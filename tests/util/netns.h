// Pieces of the fault tests that disturb the machine rather than the mesh
//: a shell runner, a veth link into a fresh network namespace
// that can be cut or slowed (netem), and a bounded CPU burner.
//
// Everything is RAII: a NetnsLink deletes its veth pair and namespace; a
// CpuBurner kills its children. A test that crashes may leave a namespace
// behind: its name carries the creating pid ("meshfb<pid>x<n>"), and
// NetnsLink::Create deletes such leftovers of dead pids first.
//
// Errors: see each function. Namespaces need root (CAP_NET_ADMIN) and `ip`;
// NetnsLink::Unsupported says why they cannot be made, for GTEST_SKIP.
//
// Thread safety: none; use from the test's thread.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::testing {

// Runs `command` through /bin/sh; returns its exit code (-1 when it could
// not run). stdout and stderr go to `output` when given.
int RunShell(const std::string& command, std::string* output = nullptr);

// `s` in single quotes for /bin/sh (embedded quotes escaped).
std::string ShellQuote(const std::string& s);

// A veth pair between this (root) network namespace and a fresh namespace,
// on a private /30: host_ip() here, peer_ip() inside. Lo is up inside.
class NetnsLink {
 public:
  // Why a namespace cannot be made here (not root, no `ip`, no
  // CAP_NET_ADMIN), or nullopt when it can. Tests GTEST_SKIP with it.
  static std::optional<std::string> Unsupported();

  // Possible errors: FAILED_PRECONDITION naming the failed `ip` command.
  static absl::StatusOr<std::unique_ptr<NetnsLink>> Create();
  ~NetnsLink();

  const std::string& ns() const { return ns_; }
  const std::string& host_ip() const { return host_ip_; }
  const std::string& peer_ip() const { return peer_ip_; }
  const std::string& host_dev() const { return host_dev_; }

  // Argv prefix that runs a command inside the namespace.
  std::vector<std::string> ExecPrefix() const;

  // Takes the namespace's end of the link down (the partition) / up again.
  // Possible errors: INTERNAL with `ip`'s message.
  absl::Status Cut();
  absl::Status Heal();

  // `tc qdisc add dev <both ends> root netem delay <delay> <jitter>`.
  // Possible errors: UNIMPLEMENTED when netem is unavailable (no sch_netem),
  // with tc's message.
  absl::Status AddLatency(const std::string& delay, const std::string& jitter);

 private:
  NetnsLink() = default;
  std::string ns_, host_dev_, peer_dev_, host_ip_, peer_ip_;
};

// Keeps `cores` CPUs busy with spinning child processes until it is
// destroyed or `max_duration` has passed (each child exits on its own then),
// so a crashed test cannot leave a burner behind for long.
class CpuBurner {
 public:
  CpuBurner(int cores, absl::Duration max_duration);
  ~CpuBurner();
  CpuBurner(const CpuBurner&) = delete;
  CpuBurner& operator=(const CpuBurner&) = delete;

 private:
  std::vector<pid_t> children_;
};

}  // namespace mesh::testing
