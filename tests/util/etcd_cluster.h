// EtcdCluster: real etcd members on 127.0.0.1 for the tests of what talks to
// etcd (the EtcdJobStore, coordinator replicas), with the faults such tests
// need: a member SIGKILLed, restarted on its data, or frozen (SIGSTOP).
//
// Each member gets a client and a peer port picked free at Start, a data
// directory and a log file in one fresh temp dir, and a short heartbeat and
// election timeout (50 ms / 500 ms) so that elections settle in well under a
// second. Members lead process groups of their own and get SIGKILL when the
// thread that started them exits (common/subprocess.h), so none outlives the
// test process, even a crashed one; the destructor kills and reaps them all
// and removes the temp dir.
//
// Every wait is bounded: Start and Restart give up after kStartTimeout with
// the member's log in the message.
//
//   Start ──▶ RUNNING ──Pause──▶ PAUSED ──Resume──▶ RUNNING
//                │  ▲                │
//           Kill │  │ Restart        │ Kill
//                ▼  │                ▼
//               KILLED ◀─────────────┘
//
// Thread safety: not thread-safe; one owner thread, which must outlive the
// members (it is the one whose exit kills them). endpoints() and
// endpoint_list() never change and may be read from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace mesh::testing {

class EtcdCluster {
 public:
  // How long Start and Restart wait for members to answer /health.
  static constexpr absl::Duration kStartTimeout = absl::Seconds(30);

  // The etcd binary: $MESH_ETCD_BIN, or /usr/bin/etcd.
  static std::string Binary();

  // Whether Binary() is an executable file. When not, `why` (may be null)
  // says so in words fit for GTEST_SKIP().
  static bool Available(std::string* why);

  // Starts `members` members as one cluster and waits until each answers
  // /health (which needs a leader and a quorum).
  // Possible errors: INVALID_ARGUMENT (members < 1); FAILED_PRECONDITION
  // (etcd is not Available); UNAVAILABLE (a member exited or did not become
  // healthy within kStartTimeout; the message carries its log); those of
  // Subprocess::Spawn.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(int members = 1);

  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // "127.0.0.1:<client port>" of each member, in member order.
  std::vector<std::string> endpoints() const;
  // endpoints(), comma-joined.
  std::string endpoint_list() const;
  // The temp dir holding every member's data dir and log.
  const std::string& dir() const { return dir_; }
  // The member's process id; -1 while it is killed.
  int pid(int i) const;

  // SIGKILLs member `i` (paused or not) and reaps it. A no-op when it is
  // already killed.
  // Possible errors: INVALID_ARGUMENT (no such member); INTERNAL (it could
  // not be reaped).
  absl::Status Kill(int i);

  // Kills member `i` if it runs, starts it again on the same ports and data
  // dir, and waits until it answers /health (which needs a quorum of the
  // cluster to be up).
  // Possible errors: INVALID_ARGUMENT; UNAVAILABLE (it exited or did not
  // become healthy within kStartTimeout; the message carries its log).
  absl::Status Restart(int i);

  // SIGSTOP / SIGCONT to member `i`, returning once every thread of it is
  // stopped (running again): a frozen member keeps its sockets open and
  // answers nothing, as a hung machine does.
  // Possible errors: INVALID_ARGUMENT; FAILED_PRECONDITION (it is killed);
  // INTERNAL (its threads did not all stop, or start again, within 5 s).
  absl::Status Pause(int i);
  absl::Status Resume(int i);

  // Member `i`'s log (its stdout and stderr, across restarts), for failure
  // messages; empty for no such member.
  std::string log(int i) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::string data_dir;
    std::string log_path;
    std::optional<::mesh::Subprocess> process;  // Empty while killed.
  };

  explicit EtcdCluster(std::string dir) : dir_(std::move(dir)) {}

  // Spawns member `i` (which must not be running).
  absl::Status Spawn(int i);
  // Waits until member `i` answers /health, failing early when it exits.
  absl::Status WaitHealthy(int i, absl::Time deadline);
  absl::Status CheckIndex(int i) const;

  const std::string dir_;
  std::string cluster_token_;
  std::string initial_cluster_;  // "m0=http://127.0.0.1:<peer>,...".
  std::vector<Member> members_;
};

}  // namespace mesh::testing
