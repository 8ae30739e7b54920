// The rank relay's parts (agent/rank_relay.h), for its own files only:
//
//   rank_relay.cc        Start, the relay's lifecycle (generations,
//                        Shutdown), admission, forwarding one to one, the
//                        WatchJob fan-out and the service's glue
//   rank_relay_batch.cc  what goes up once per node: Join and barrier
//                        batches, unique-ID fetches, heartbeats and their
//                        flushes, and the flusher thread
//   relay_watch.h        SharedWatch: one upstream WatchJob stream per
//                        generation
//
// Per-process state. A rank may be held by several processes in turn within
// one generation (in-place recovery: a new process joins as a lost rank,
// coordinator/coordination.h). State that belongs to a process, not to its
// rank (its pending heartbeat, the coordinator's answer to it), is keyed by
// ProcessKey, (rank, incarnation), so a new process never gets what was
// meant for the one it replaces. State of the generation (its batches, its
// unique IDs, its watch) serves every process alike, with each call's own
// RankContext; an answer that speaks for one process only (it is lost or
// fenced out) reaches that process only.
//
// Thread safety: RelayImpl's state is guarded by its one mutex, mu_. Lock
// order: RelayImpl::mu_, then a SharedWatch's. Calls to the coordinator
// start and reactors finish after mu_ is let go.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/rank_relay.h"
#include "agent/relay_watch.h"
#include "common/coordinator_targets.h"
#include "common/security.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::agent::relay_internal {

using GenKey = std::pair<std::string, int64_t>;
using Stub = v1::WorkerService::Stub;
using Ctx = grpc::CallbackServerContext;
using Unary = grpc::ServerUnaryReactor;

// How often a generation's heartbeats go up, for the heartbeat interval and
// timeout its Join replies gave (rank_relay_batch.cc): half the interval, at
// most half of what the timeout leaves after an interval, at least 50 ms.
absl::Duration FlushIntervalFor(double heartbeat_interval_seconds,
                                double heartbeat_timeout_seconds);

// One process holding a rank: (rank, incarnation).
using ProcessKey = std::pair<int, uint64_t>;
inline ProcessKey ProcessOf(const v1::RankContext& context) {
  return ProcessKey(context.rank(), context.incarnation());
}

inline grpc::Status EntryToStatus(const v1::EntryStatus& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

// The worker token a call carries, or "" without an authorization header.
std::string TokenOf(const Ctx& ctx);

// A request's timeout_seconds bounded by the time left before the incoming
// call's deadline, so the coordinator stops waiting for a rank when the
// rank's own call would end.
double BoundedTimeout(const Ctx& ctx, double timeout_seconds);

// The channels to the coordinator's replicas and the replica in use.
// Thread-safe.
class Upstream {
 public:
  static absl::StatusOr<std::unique_ptr<Upstream>> Make(const std::string& targets,
                                                        const security::ClientSecurity& security);

  // The replica to call, and its stub.
  size_t current() const { return replicas_.current(); }
  Stub* stub(size_t replica) const { return stubs_[replica].get(); }
  // After a call to `replica` ended with `status`.
  void Done(size_t replica, const grpc::Status& status);

 private:
  explicit Upstream(std::vector<std::string> targets) : replicas_(std::move(targets)) {}
  LeaderTracker replicas_;
  std::vector<std::unique_ptr<Stub>> stubs_;
};

// One call to the coordinator: its context, request and reply live until
// the completion callback has run.
template <typename Request, typename Response>
struct UpstreamCall {
  grpc::ClientContext context;
  Request request;
  Response response;
};

template <typename Request, typename Response>
using AsyncMethod = void (Stub::async_interface::*)(grpc::ClientContext*, const Request*, Response*,
                                                    std::function<void(grpc::Status)>);

class RelayImpl;

// The WorkerService the ranks see: every method is RelayImpl's.
class RelayService final : public v1::WorkerService::CallbackService {
 public:
  explicit RelayService(RelayImpl* relay) : relay_(relay) {}

  Unary* Join(Ctx*, const v1::JoinRequest*, v1::JoinResponse*) override;
  Unary* DescribeRanks(Ctx*, const v1::DescribeRanksRequest*, v1::DescribeRanksResponse*) override;
  Unary* KvSet(Ctx*, const v1::KvSetRequest*, v1::KvSetResponse*) override;
  Unary* KvGet(Ctx*, const v1::KvGetRequest*, v1::KvGetResponse*) override;
  Unary* KvAdd(Ctx*, const v1::KvAddRequest*, v1::KvAddResponse*) override;
  Unary* KvCompareSet(Ctx*, const v1::KvCompareSetRequest*, v1::KvCompareSetResponse*) override;
  Unary* KvDelete(Ctx*, const v1::KvDeleteRequest*, v1::KvDeleteResponse*) override;
  Unary* KvList(Ctx*, const v1::KvListRequest*, v1::KvListResponse*) override;
  Unary* KvNumKeys(Ctx*, const v1::KvNumKeysRequest*, v1::KvNumKeysResponse*) override;
  Unary* KvWait(Ctx*, const v1::KvWaitRequest*, v1::KvWaitResponse*) override;
  Unary* KvMultiGet(Ctx*, const v1::KvMultiGetRequest*, v1::KvMultiGetResponse*) override;
  Unary* KvMultiSet(Ctx*, const v1::KvMultiSetRequest*, v1::KvMultiSetResponse*) override;
  Unary* Barrier(Ctx*, const v1::BarrierRequest*, v1::BarrierResponse*) override;
  Unary* AliveRanks(Ctx*, const v1::AliveRanksRequest*, v1::AliveRanksResponse*) override;
  Unary* PublishUniqueIds(Ctx*, const v1::PublishUniqueIdsRequest*,
                          v1::PublishUniqueIdsResponse*) override;
  Unary* GetUniqueIds(Ctx*, const v1::GetUniqueIdsRequest*, v1::GetUniqueIdsResponse*) override;
  Unary* Heartbeat(Ctx*, const v1::HeartbeatRequest*, v1::HeartbeatResponse*) override;
  Unary* ReportError(Ctx*, const v1::ReportErrorRequest*, v1::ReportErrorResponse*) override;
  Unary* Leave(Ctx*, const v1::LeaveRequest*, v1::LeaveResponse*) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(Ctx*, const v1::WatchJobRequest*) override;

 private:
  RelayImpl* const relay_;
};

// The relay. Thread-safe; see the file comment for its lock order.
class RelayImpl final : public RankRelay {
 public:
  RelayImpl(RankRelayOptions options, std::unique_ptr<Upstream> upstream);
  ~RelayImpl() override;

  // Listens and starts the flusher.
  absl::Status Listen();

  // RankRelay.
  std::string target() const override { return absl::StrCat("unix:", options_.socket_path); }
  const std::string& socket_path() const override { return options_.socket_path; }
  void AddGeneration(const std::string& job_id, int64_t generation, std::vector<int> local_ranks,
                     std::string worker_token) override;
  void RemoveGeneration(const std::string& job_id, int64_t generation) override;
  RankRelayStats stats() const override;
  void Shutdown() override;

  // ---- The calls of the ranks (RelayService's) ---------------------------------

  // rank_relay.cc: forwarded one to one. `admitted`: the caller already
  // counted and admitted the call.
  template <typename Request, typename Response>
  Unary* ForwardUnary(Ctx* ctx, AsyncMethod<Request, Response> method, const Request* request,
                      Response* response, bool admitted = false);
  Unary* Leave(Ctx* ctx, const v1::LeaveRequest* request, v1::LeaveResponse* response);
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(Ctx* ctx, const v1::WatchJobRequest* request);

  // rank_relay_batch.cc: once per node.
  Unary* Join(Ctx* ctx, const v1::JoinRequest* request, v1::JoinResponse* response);
  Unary* Barrier(Ctx* ctx, const v1::BarrierRequest* request, v1::BarrierResponse* response);
  Unary* GetUniqueIds(Ctx* ctx, const v1::GetUniqueIdsRequest* request,
                      v1::GetUniqueIdsResponse* response);
  Unary* Heartbeat(Ctx* ctx, const v1::HeartbeatRequest* request, v1::HeartbeatResponse* response);

 private:
  template <typename Request, typename Response>
  struct Batch {
    struct Entry {
      Request request;
      std::function<void(const grpc::Status&, const Response*)> done;
    };
    std::vector<Entry> entries;
    std::set<int> arrived;  // Ranks in `entries`.
    absl::Time opened;
    std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::min();
  };

  using JoinBatch = Batch<v1::JoinRequest, v1::JoinResponse>;
  using BarrierBatch = Batch<v1::BarrierRequest, v1::BarrierResponse>;

  // A rank waiting for unique IDs: its request (timeout bounded by its
  // call's deadline), when its timeout ends, and its call's deadline.
  struct IdWaiter {
    v1::GetUniqueIdsRequest request;
    absl::Time expires;
    std::chrono::system_clock::time_point deadline;
    std::function<void(const grpc::Status&, const v1::GetUniqueIdsResponse*)> done;
  };

  struct IdFetch {
    bool done = false;
    v1::GetUniqueIdsResponse reply;
    std::vector<IdWaiter> waiters;  // The first one's fetch is under way.
  };

  // The coordinator's latest answer to a process's heartbeat.
  struct ProcessView {
    grpc::Status status;
    v1::HeartbeatResponse reply;
  };

  struct Gen {
    std::set<int> local;
    std::string token;
    int64_t served = 0;    // Calls of its ranks admitted here.
    int64_t upstream = 0;  // Calls made to the coordinator for it.
    // A Join came back OK, so the world has formed (a Join returns only
    // then): a later Join (a new process of a rank, say) waits for no
    // other rank here.
    bool formed = false;
    JoinBatch joins;
    std::map<std::string, BarrierBatch> barriers;
    std::map<std::string, IdFetch> ids;
    // Heartbeats not yet sent, the latest of each process.
    std::map<ProcessKey, v1::HeartbeatRequest> heartbeats;
    // One per process that has heartbeated here: few, as a generation's
    // processes on one node are (its ranks, and the processes the agent
    // started again in their place); the generation's record goes with it.
    std::map<ProcessKey, ProcessView> views;
    grpc::Status last_flush;
    absl::Duration flush_interval;
    absl::Time next_flush = absl::InfinitePast();
    bool flush_in_flight = false;
    std::shared_ptr<SharedWatch> watch;
  };

  // ---- rank_relay.cc -------------------------------------------------------------

  void CountServedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountUpstreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A SharedWatch opened its stream again (relay_watch.h); called under the
  // watch's mutex, so it takes no lock of the relay's.
  void CountWatchReopened();

  // OK when the call names a generation registered here and carries its
  // job's token. Admit counts the call as served.
  grpc::Status Admit(const Ctx& ctx, const v1::RankContext& context);
  grpc::Status AdmitLocked(const Ctx& ctx, const v1::RankContext& context)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Sends `request` as is; `done` gets the coordinator's status and reply.
  template <typename Request, typename Response>
  void Forward(const GenKey& key, AsyncMethod<Request, Response> method, const Request& request,
               const std::string& token, std::chrono::system_clock::time_point deadline,
               std::function<void(grpc::Status, Response*)> done);

  static grpc::Status ShuttingDown() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the agent is shutting down");
  }

  // ---- rank_relay_batch.cc ---------------------------------------------------------

  // Admits a rank's Join or barrier arrival and adds it to its batch
  // (`batch_of`), which goes up at once (`flush`) when every local rank it
  // concerns (`expected`) has arrived, else when its window ends.
  template <typename Request, typename Response, typename BatchOf, typename Expected,
            typename Flush>
  Unary* Enqueue(Ctx* ctx, const Request& request, Response* response, BatchOf batch_of,
                 Expected expected, Flush flush);

  // Fetches `keys` of `key` in the name of the first waiter.
  void StartIdFetch(const GenKey& key, const std::string& keys);
  void OnIdFetch(const GenKey& key, const std::string& keys, const grpc::Status& status,
                 const v1::GetUniqueIdsResponse* reply);

  // Ends every waiting call of `gen` with `status` (run after mu_ is let go).
  void EndPendingLocked(Gen& gen, const grpc::Status& status,
                        std::vector<std::function<void()>>* ends)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void FlushJoins(const GenKey& key);
  void FlushBarrier(const GenKey& key, const std::string& name);
  template <typename BatchRequest, typename BatchResponse, typename BatchOf, typename Forget,
            typename Add, typename OnOk>
  void FlushBatch(const GenKey& key, BatchOf batch_of, Forget forget, Add add,
                  AsyncMethod<BatchRequest, BatchResponse> method, const char* rpc,
                  int64_t* counter, OnOk on_ok);
  // A Join of `key` came back OK.
  void NoteJoined(const GenKey& key, const v1::JoinResponse& reply);
  void FlushHeartbeats(const GenKey& key);
  // The flusher thread: sends batches whose window has passed and
  // heartbeats whose flush is due.
  void FlushLoop();

  const RankRelayOptions options_;
  const std::unique_ptr<Upstream> upstream_;
  RelayService service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread flusher_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;  // A batch opened, or shut_down_.
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Calls to the coordinator whose callback has not finished.
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  absl::CondVar in_flight_empty_;
  std::map<GenKey, Gen> gens_ ABSL_GUARDED_BY(mu_);
  // Every SharedWatch made, also those a generation no longer holds (ended,
  // or replaced): Shutdown cancels each that is still alive, so none starts
  // a stream on a stub of upstream_ after the relay has gone.
  std::vector<std::weak_ptr<SharedWatch>> all_watches_ ABSL_GUARDED_BY(mu_);
  RankRelayStats stats_ ABSL_GUARDED_BY(mu_);
  // Upstream watch streams opened again by their SharedWatch (counted
  // without mu_; see CountWatchReopened).
  std::atomic<int64_t> watches_reopened_{0};
};

template <typename Request, typename Response>
void RelayImpl::Forward(const GenKey& key, AsyncMethod<Request, Response> method,
                        const Request& request, const std::string& token,
                        std::chrono::system_clock::time_point deadline,
                        std::function<void(grpc::Status, Response*)> done) {
  auto call = std::make_shared<UpstreamCall<Request, Response>>();
  call->request = request;
  if (!token.empty()) call->context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  if (deadline != std::chrono::system_clock::time_point::max()) {
    call->context.set_deadline(deadline);
  }
  bool refused = false;
  {
    absl::MutexLock lock(&mu_);
    // Once Shutdown has cancelled what was in flight, nothing new starts.
    refused = shut_down_;
    if (!refused) {
      CountUpstreamLocked();
      if (auto gen = gens_.find(key); gen != gens_.end()) ++gen->second.upstream;
      in_flight_.insert(&call->context);
    }
  }
  if (refused) return done(ShuttingDown(), &call->response);
  const size_t replica = upstream_->current();
  (upstream_->stub(replica)->async()->*method)(
      &call->context, &call->request, &call->response,
      [this, call, replica, done = std::move(done)](grpc::Status status) {
        upstream_->Done(replica, status);
        bool shutting_down = false;
        {
          absl::MutexLock lock(&mu_);
          shutting_down = shut_down_;
        }
        if (shutting_down && status.error_code() == grpc::StatusCode::CANCELLED) {
          status = ShuttingDown();
        }
        done(status, &call->response);
        // Last: Shutdown waits for this before the relay may be destroyed.
        absl::MutexLock lock(&mu_);
        in_flight_.erase(&call->context);
        if (in_flight_.empty()) in_flight_empty_.SignalAll();
      });
}

}  // namespace mesh::agent::relay_internal
