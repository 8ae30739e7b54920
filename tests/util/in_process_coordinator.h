// InProcessCoordinator: a real CoordinatorServer in the test's own process,
// for tests of what talks to a coordinator (stores, runtimes, workers
// started as subprocesses, meshctl).
//
//   auto coordinator = testing::InProcessCoordinator::Start();  // 127.0.0.1:0
//   ASSERT_TRUE(coordinator.ok()) << coordinator.status();
//   ASSERT_TRUE((*coordinator)->CreateJob("job", 2).ok());
//   options.coordinator = (*coordinator)->address();
//   ...
//   (*coordinator)->Stop();  // Or let the destructor stop it.
//
// Start takes a full coordinator::CoordinatorConfig; begin from
// DefaultConfig() (loopback, port 0, an in-memory job store, the real clock
// and ticker, heartbeats every 100 ms with a 5 s timeout) and change what
// the test is about: heartbeat timing, KV limits, a FakeClock with
// run_ticker off, a metrics registry, or a fixed port to come back on. The
// config is used as given, so a config not taken from DefaultConfig gets
// CoordinatorConfig's own defaults (port 7450) instead.
//
// Lifecycle:
//
//   Start() ──▶ SERVING ──Stop(grace)──▶ STOPPED (address() and port()
//                                         still name where it listened)
//
// Stop is CoordinatorServer::Shutdown: every pending wait and stream ends
// with UNAVAILABLE, later calls fail to connect. The destructor stops it
// with no grace if Stop was not called.
//
// Errors: Start returns CoordinatorServer::Start's (UNAVAILABLE when the
// port cannot be bound, INVALID_ARGUMENT for a bad config). CreateJob
// returns Coordination::CreateJob's.
// Thread safety: every method may be called from any thread, as the
// server's own; the object must outlive the calls (destroy it after joining
// the threads that use it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordination.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/job_manager.h"

namespace mesh::testing {

class InProcessCoordinator {
 public:
  // Loopback, port 0 (a free port; port() reports it), state_dir empty (an
  // in-memory job store), heartbeats every 100 ms with a 5 s timeout;
  // everything else as CoordinatorConfig's defaults.
  static coordinator::CoordinatorConfig DefaultConfig();

  static absl::StatusOr<std::unique_ptr<InProcessCoordinator>> Start(
      const coordinator::CoordinatorConfig& config = DefaultConfig());
  // DefaultConfig() with these heartbeat settings.
  static absl::StatusOr<std::unique_ptr<InProcessCoordinator>> Start(
      absl::Duration heartbeat_interval, absl::Duration heartbeat_timeout);

  InProcessCoordinator(const InProcessCoordinator&) = delete;
  InProcessCoordinator& operator=(const InProcessCoordinator&) = delete;
  ~InProcessCoordinator() = default;

  // "127.0.0.1:<port>": what a worker's MESH_COORDINATOR or a client dials.
  const std::string& address() const { return address_; }
  // The bound port.
  int port() const { return port_; }

  // The server and its managers, for what a test inspects or drives
  // directly (CreateJob, GetJob, PendingWaits, Tick with a FakeClock).
  coordinator::CoordinatorServer& server() { return *server_; }
  coordinator::Coordination& coordination() { return server_->coordination(); }
  coordinator::JobManager& jobs() { return server_->jobs(); }

  // Creates `job_id` in Coordination at generation 0 (not through the
  // JobManager: nothing is scheduled or launched) with `world_size` ranks
  // and, when given, a mesh shape and dim names (else a 1-D mesh).
  absl::Status CreateJob(const std::string& job_id, int world_size,
                         std::vector<int64_t> mesh_shape = {},
                         std::vector<std::string> mesh_dim_names = {});
  // The same with a whole layout (a hang timeout, say).
  absl::Status CreateJob(coordinator::JobLayout layout);
  // Whether `job_id`'s current generation has failed (false for an unknown
  // job).
  bool JobFailed(const std::string& job_id) const;

  // Shuts the server down, letting in-flight calls finish for up to `grace`.
  // Idempotent.
  void Stop(absl::Duration grace = absl::ZeroDuration());

 private:
  explicit InProcessCoordinator(std::unique_ptr<coordinator::CoordinatorServer> server);

  const std::unique_ptr<coordinator::CoordinatorServer> server_;
  const std::string address_;
  const int port_;
};

}  // namespace mesh::testing
