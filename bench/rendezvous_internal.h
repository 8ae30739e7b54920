// The pieces the rendezvous rounds share (internal to mesh-bench): the
// per-round book-keeping, the pending-call holder, the job a round runs and
// the constants of the simulated world. Used by rendezvous_bench.cc (ranks
// calling the coordinator themselves) and rendezvous_nodes.cc (simulated
// agents calling it per node).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bench/rendezvous_bench.h"
#include "common/check.h"
#include "common/grpc_status.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::bench::rendezvous_internal {

using SteadyClock = std::chrono::steady_clock;
using v1::WorkerService;
using HealthStub = grpc::health::v1::Health::Stub;

constexpr size_t kUniqueIdBytes = 128;
// Simulated hosts hold this many consecutive ranks, so Join's node and local
// ranks can be checked.
constexpr int kRanksPerHost = 8;
constexpr char kBarrierName[] = "bench";
constexpr char kGroupKey[] = "bench/group";
constexpr int kMaxRanks = 1 << 20;  // The coordinator's world-size limit.

// Deterministic, distinct per seed.
inline std::string MakeUniqueId(uint32_t seed) {
  std::string id(kUniqueIdBytes, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : id) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return id;
}

inline std::string CallFailed(const char* method, const grpc::Status& status) {
  return absl::StrCat(method, " failed: ", FromGrpcStatus(status).ToString());
}

inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Book-keeping of one round. A rank's slots are written only by its own
// chain of calls, one call at a time (each call starts from the previous
// one's callback, which orders them), and read only after Wait().
class RoundState {
 public:
  RoundState(int ranks, int steps)
      : ranks_(ranks),
        steps_(steps),
        rank_start_(ranks),
        step_done_(static_cast<size_t>(ranks) * steps),
        remaining_(ranks) {}

  void Start() {
    cpu_start_ = ProcessCpuSeconds();
    start_ = SteadyClock::now();
  }
  void RankStarted(int rank) { rank_start_[rank] = SteadyClock::now(); }
  void StepDone(int rank, int step) {
    step_done_[static_cast<size_t>(rank) * steps_ + step] = SteadyClock::now();
  }

  // Records the rank's failure and ends its chain.
  void Fail(int rank, const std::string& what) {
    {
      absl::MutexLock lock(&mu_);
      if (failures_++ == 0) first_failure_ = absl::StrCat("rank ", rank, ": ", what);
    }
    RankDone();
  }

  // The last thing a rank's chain does; nothing of the round may be touched
  // after it.
  void RankDone() {
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_.Notify();
  }

  // Waits carry the round's timeout (and with --grpc-deadlines every call a
  // gRPC deadline), so a live coordinator ends every chain by then. Past
  // `limit` the coordinator has stopped answering; the calls still pending
  // reference this round, so it cannot return: abort, loudly.
  void Wait(absl::Duration limit) {
    MESH_CHECK(done_.WaitForNotificationWithTimeout(limit),
               "ranks still pending a minute past the round's timeout: the coordinator is not "
               "answering");
    cpu_s_ = ProcessCpuSeconds() - cpu_start_;
  }

  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    if (failures_ == 0) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat(failures_, " of ", ranks_, " ranks failed; first: ", first_failure_));
  }

  RoundResult Result() const {
    RoundResult result;
    result.step_s.assign(steps_, 0);
    result.step_first_s.assign(steps_, std::numeric_limits<double>::infinity());
    std::vector<absl::Duration> latencies;
    latencies.reserve(ranks_);
    SteadyClock::time_point last = start_;
    for (int r = 0; r < ranks_; ++r) {
      for (int s = 0; s < steps_; ++s) {
        const SteadyClock::time_point t = step_done_[static_cast<size_t>(r) * steps_ + s];
        result.step_s[s] = std::max(result.step_s[s], Seconds(t - start_));
        result.step_first_s[s] = std::min(result.step_first_s[s], Seconds(t - start_));
      }
      const SteadyClock::time_point end = step_done_[static_cast<size_t>(r) * steps_ + steps_ - 1];
      last = std::max(last, end);
      latencies.push_back(absl::FromChrono(end - rank_start_[r]));
    }
    result.total_s = Seconds(last - start_);
    result.cpu_s = cpu_s_;
    result.rank_latency = Summarize(std::move(latencies));
    return result;
  }

 private:
  static double Seconds(SteadyClock::duration d) {
    return std::chrono::duration<double>(d).count();
  }

  const int ranks_;
  const int steps_;
  SteadyClock::time_point start_;
  double cpu_start_ = 0;
  double cpu_s_ = 0;
  std::vector<SteadyClock::time_point> rank_start_;
  std::vector<SteadyClock::time_point> step_done_;
  std::atomic<int> remaining_;
  absl::Notification done_;
  mutable absl::Mutex mu_;
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_failure_ ABSL_GUARDED_BY(mu_);
};

// One pending call: everything gRPC needs to outlive it. Owned by the
// callback that completes it.
template <typename Request, typename Response>
struct Call {
  Call(int rank, const std::optional<std::chrono::system_clock::time_point>& deadline)
      : rank(rank) {
    if (deadline.has_value()) context.set_deadline(*deadline);
  }
  int rank;
  int step = 0;  // For chains that repeat one method.
  grpc::ClientContext context;
  Request request;
  Response response;
};

inline std::optional<std::chrono::system_clock::time_point> RoundDeadline(absl::Duration timeout,
                                                                          bool grpc_deadlines) {
  if (!grpc_deadlines) return std::nullopt;
  return std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout);
}

struct JobSpec {
  std::string job_id;
  int64_t generation = 0;
  std::string world_id;  // Rank 0's Join carries it.
  std::string group_id;  // Rank 0 publishes it under kGroupKey.
};

enum MeshStep { kJoin = 0, kBarrier, kUniqueId, kMeshSteps };

// The calls of a round that are not a rank's chain (its heartbeats and the
// Leaves after it), and the first heartbeat that found the generation
// failed. Thread safety: thread-safe.
class RoundCalls {
 public:
  // A call starts; `heartbeat` counts it as one.
  void Started(bool heartbeat) {
    outstanding_.fetch_add(1);
    if (heartbeat) heartbeats_sent_.fetch_add(1);
  }
  // A call ended; `failed_in_transit`: a heartbeat that did not get through
  // (a deadline, the server's backlog), counted.
  void Done(bool failed_in_transit = false) {
    if (failed_in_transit) heartbeat_errors_.fetch_add(1);
    if (outstanding_.fetch_sub(1) == 1) {
      absl::MutexLock lock(&mu_);
      drained_.SignalAll();
    }
  }
  // A heartbeat found the generation failed; the first one is kept.
  void HeartbeatFoundFailure(std::string what) {
    absl::MutexLock lock(&mu_);
    if (failure_.empty()) failure_ = std::move(what);
  }
  // Waits until no call is pending. They all carry deadlines, so a live
  // coordinator ends them in time; past that, abort loudly (they reference
  // the round).
  void Drain() {
    absl::MutexLock lock(&mu_);
    const absl::Time limit = absl::Now() + absl::Seconds(120);
    while (outstanding_.load() > 0) {
      MESH_CHECK(!drained_.WaitWithDeadline(&mu_, limit) || outstanding_.load() == 0,
                 "heartbeats or leaves still pending two minutes after the round");
    }
  }
  // ABORTED with the first failure a heartbeat found, else OK.
  absl::Status HeartbeatStatus() const {
    absl::MutexLock lock(&mu_);
    if (failure_.empty()) return absl::OkStatus();
    return absl::AbortedError(failure_);
  }
  // The round's outcome once its calls are drained: the first failure a
  // heartbeat found (it explains a round's failure best), else the ranks'
  // first failure, else `state`'s result with the heartbeat counts.
  absl::StatusOr<RoundResult> Outcome(const RoundState& state) const {
    if (absl::Status s = HeartbeatStatus(); !s.ok()) return s;
    if (absl::Status s = state.status(); !s.ok()) return s;
    RoundResult result = state.Result();
    result.heartbeats = heartbeats_sent_.load();
    result.heartbeat_errors = heartbeat_errors_.load();
    return result;
  }

 private:
  std::atomic<int64_t> outstanding_{0};
  std::atomic<int64_t> heartbeats_sent_{0};
  std::atomic<int64_t> heartbeat_errors_{0};
  mutable absl::Mutex mu_;
  absl::CondVar drained_;
  std::string failure_ ABSL_GUARDED_BY(mu_);
};

// The round through simulated agents (rendezvous_nodes.cc): node n holds
// ranks [n * ranks_per_node, (n + 1) * ranks_per_node) and calls on
// stubs[n % stubs.size()].
absl::StatusOr<RoundResult> RunNodeRound(
    const std::vector<std::unique_ptr<v1::WorkerService::Stub>>& stubs, int ranks,
    int ranks_per_node, JobSpec job, absl::Duration timeout);

}  // namespace mesh::bench::rendezvous_internal
