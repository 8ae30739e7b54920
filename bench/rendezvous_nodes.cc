// mesh-bench rendezvous --via-agent: the round of rendezvous_bench.cc as the
// coordinator sees it when every node's agent relays its ranks' calls
// (agent/rank_relay.h). Each simulated agent has its own connection and
// makes, per round, what a relay makes for its K ranks:
//
//   JoinBatch (K joins) ──▶ BarrierBatch (K arrivals) ──▶ [node 0: rank 0's
//   PublishUniqueIds] ──▶ one GetUniqueIds ──▶ its K ranks are done
//
// and, while the round lasts, one HeartbeatBatch of its joined ranks per
// flush interval (half the heartbeat interval Join gave, as the relay). The
// ranks' own hop to their agent (a Unix socket on their host) is not
// simulated: on a real cluster it runs on every node at once, and here it
// would measure this one machine's 2 cores instead of the coordinator.
#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bench/rendezvous_internal.h"

namespace mesh::bench::rendezvous_internal {
namespace {

using v1::WorkerService;

class NodeRound {
 public:
  NodeRound(const std::vector<std::unique_ptr<WorkerService::Stub>>& stubs, int ranks,
            int ranks_per_node, JobSpec job, absl::Duration timeout)
      : stubs_(stubs),
        ranks_(ranks),
        per_node_(ranks_per_node),
        nodes_((ranks + ranks_per_node - 1) / ranks_per_node),
        job_(std::move(job)),
        timeout_(timeout),
        state_(ranks, kMeshSteps) {}

  absl::StatusOr<RoundResult> Run() {
    state_.Start();
    std::thread heartbeats([this] { HeartbeatLoop(); });
    for (int node = 0; node < nodes_; ++node) {
      for (int r = First(node); r < End(node); ++r) state_.RankStarted(r);
      StartJoin(node);
    }
    state_.Wait(timeout_ + absl::Seconds(60));
    round_over_.Notify();
    heartbeats.join();
    calls_.Drain();
    // A relay forwards Leave one to one.
    for (int r = 0; r < ranks_; ++r) StartLeave(r);
    calls_.Drain();
    return calls_.Outcome(state_);
  }

 private:
  using JoinCall = Call<v1::JoinBatchRequest, v1::JoinBatchResponse>;
  using BarrierCall = Call<v1::BarrierBatchRequest, v1::BarrierBatchResponse>;
  using PublishCall = Call<v1::PublishUniqueIdsRequest, v1::PublishUniqueIdsResponse>;
  using GetIdsCall = Call<v1::GetUniqueIdsRequest, v1::GetUniqueIdsResponse>;
  using HeartbeatCall = Call<v1::HeartbeatBatchRequest, v1::HeartbeatBatchResponse>;
  using LeaveCall = Call<v1::LeaveRequest, v1::LeaveResponse>;
  static constexpr int kHeartbeatSlices = 10;

  int First(int node) const { return node * per_node_; }
  int End(int node) const { return std::min(ranks_, (node + 1) * per_node_); }
  WorkerService::StubInterface::async_interface* Stub(int node) const {
    return stubs_[static_cast<size_t>(node) % stubs_.size()]->async();
  }
  void FillContext(int rank, v1::RankContext* context) const {
    context->set_job_id(job_.job_id);
    context->set_generation(job_.generation);
    context->set_rank(rank);
    context->set_incarnation((static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull);
  }
  double TimeoutSeconds() const { return absl::ToDoubleSeconds(timeout_); }

  // Ends the chain of every rank of `node` with `what`.
  void FailNode(int node, const std::string& what) {
    for (int r = First(node); r < End(node); ++r) state_.Fail(r, what);
  }

  void StartJoin(int node) {
    auto* call = new JoinCall(node, std::nullopt);
    for (int r = First(node); r < End(node); ++r) {
      v1::JoinRequest* join = call->request.add_joins();
      FillContext(r, join->mutable_context());
      join->set_host(absl::StrCat("host-", node));
      join->set_timeout_seconds(TimeoutSeconds());
      if (r == 0) join->set_nccl_unique_id(job_.world_id);
    }
    Stub(node)->JoinBatch(
        &call->context, &call->request, &call->response,
        [this, call](grpc::Status s) { OnJoin(std::unique_ptr<JoinCall>(call), s); });
  }

  std::string CheckJoin(int node, const JoinCall& call, const grpc::Status& status) const {
    if (!status.ok()) return CallFailed("JoinBatch", status);
    if (call.response.entries_size() != End(node) - First(node)) {
      return absl::StrCat("JoinBatch replied ", call.response.entries_size(), " entries for ",
                          End(node) - First(node), " joins");
    }
    for (int i = 0; i < call.response.entries_size(); ++i) {
      const v1::JoinBatchEntry& entry = call.response.entries(i);
      const int rank = First(node) + i;
      if (entry.status().code() != 0) {
        return absl::StrCat("rank ", rank, "'s Join failed: ", entry.status().message());
      }
      const v1::JoinResponse& r = entry.reply();
      if (r.rank() != rank || r.world_size() != ranks_ || r.node_rank() != node ||
          r.num_nodes() != nodes_ || r.local_rank() != i ||
          r.local_world_size() != End(node) - First(node) || r.nccl_unique_id() != job_.world_id) {
        return absl::StrCat("rank ", rank, "'s Join replied rank ", r.rank(), " of ",
                            r.world_size(), ", node ", r.node_rank(), " of ", r.num_nodes(),
                            ", local ", r.local_rank(), " of ", r.local_world_size(), ", a ",
                            r.nccl_unique_id().size(), "-byte world ID");
      }
    }
    return "";
  }

  void OnJoin(std::unique_ptr<JoinCall> call, const grpc::Status& status) {
    const int node = call->rank;
    const std::string wrong = CheckJoin(node, *call, status);
    if (wrong.empty() && call->response.entries_size() > 0) {
      const v1::JoinResponse& first = call->response.entries(0).reply();
      int64_t expected = 0;
      interval_ns_.compare_exchange_strong(
          expected, absl::ToInt64Nanoseconds(absl::Seconds(first.heartbeat_interval_seconds())));
      timeout_ns_.store(absl::ToInt64Nanoseconds(absl::Seconds(first.heartbeat_timeout_seconds())));
      joined_[node].store(true, std::memory_order_release);
    }
    call.reset();
    if (!wrong.empty()) return FailNode(node, wrong);
    for (int r = First(node); r < End(node); ++r) state_.StepDone(r, kJoin);
    StartBarrier(node);
  }

  void StartBarrier(int node) {
    auto* call = new BarrierCall(node, std::nullopt);
    for (int r = First(node); r < End(node); ++r) {
      v1::BarrierRequest* arrival = call->request.add_arrivals();
      FillContext(r, arrival->mutable_context());
      arrival->set_name(kBarrierName);
      arrival->set_timeout_seconds(TimeoutSeconds());
    }
    Stub(node)->BarrierBatch(
        &call->context, &call->request, &call->response,
        [this, call](grpc::Status s) { OnBarrier(std::unique_ptr<BarrierCall>(call), s); });
  }

  void OnBarrier(std::unique_ptr<BarrierCall> call, const grpc::Status& status) {
    const int node = call->rank;
    std::string wrong;
    if (!status.ok()) {
      wrong = CallFailed("BarrierBatch", status);
    } else if (call->response.entries_size() != End(node) - First(node)) {
      wrong = "BarrierBatch replied another number of entries";
    } else {
      for (const v1::BarrierBatchEntry& entry : call->response.entries()) {
        if (entry.status().code() != 0 || entry.reply().participants() != ranks_) {
          wrong = absl::StrCat("a barrier entry replied code ", entry.status().code(), " (",
                               entry.status().message(), "), ", entry.reply().participants(),
                               " participants");
          break;
        }
      }
    }
    call.reset();
    if (!wrong.empty()) return FailNode(node, wrong);
    for (int r = First(node); r < End(node); ++r) state_.StepDone(r, kBarrier);
    node == 0 ? StartPublish() : StartGetIds(node);
  }

  void StartPublish() {
    auto* call = new PublishCall(0, std::nullopt);
    FillContext(0, call->request.mutable_context());
    (*call->request.mutable_ids())[kGroupKey] = job_.group_id;
    Stub(0)->PublishUniqueIds(&call->context, &call->request, &call->response,
                              [this, call](grpc::Status s) {
                                delete call;
                                if (!s.ok()) return FailNode(0, CallFailed("PublishUniqueIds", s));
                                StartGetIds(0);
                              });
  }

  // One fetch per node, in the name of its first rank.
  void StartGetIds(int node) {
    auto* call = new GetIdsCall(node, std::nullopt);
    FillContext(First(node), call->request.mutable_context());
    call->request.add_keys(kGroupKey);
    call->request.set_timeout_seconds(TimeoutSeconds());
    Stub(node)->GetUniqueIds(
        &call->context, &call->request, &call->response,
        [this, call](grpc::Status s) { OnGetIds(std::unique_ptr<GetIdsCall>(call), s); });
  }

  void OnGetIds(std::unique_ptr<GetIdsCall> call, const grpc::Status& status) {
    const int node = call->rank;
    std::string wrong;
    if (!status.ok()) {
      wrong = CallFailed("GetUniqueIds", status);
    } else if (call->response.ids_size() != 1 || call->response.ids(0) != job_.group_id) {
      wrong = "GetUniqueIds replied ID(s) that differ from the published one";
    }
    call.reset();
    if (!wrong.empty()) return FailNode(node, wrong);
    for (int r = First(node); r < End(node); ++r) {
      state_.StepDone(r, kUniqueId);
      state_.RankDone();
    }
  }

  // ---- Heartbeats: one batch per node per flush -------------------------------

  void HeartbeatLoop() {
    for (int slice = 0; !round_over_.HasBeenNotified(); slice = (slice + 1) % kHeartbeatSlices) {
      const int64_t interval_ns = interval_ns_.load();
      // The relay flushes every half interval.
      const absl::Duration step = interval_ns == 0
                                      ? absl::Milliseconds(10)
                                      : absl::Nanoseconds(interval_ns) / 2 / kHeartbeatSlices;
      if (round_over_.WaitForNotificationWithTimeout(step)) return;
      if (interval_ns == 0) continue;
      for (int node = slice; node < nodes_; node += kHeartbeatSlices) {
        if (joined_[node].load(std::memory_order_acquire)) StartHeartbeat(node);
      }
    }
  }

  void StartHeartbeat(int node) {
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::nanoseconds(timeout_ns_.load());
    auto* call = new HeartbeatCall(node, deadline);
    for (int r = First(node); r < End(node); ++r) {
      FillContext(r, call->request.add_heartbeats()->mutable_context());
    }
    calls_.Started(/*heartbeat=*/true);
    Stub(node)->HeartbeatBatch(
        &call->context, &call->request, &call->response,
        [this, call](grpc::Status s) { OnHeartbeat(std::unique_ptr<HeartbeatCall>(call), s); });
  }

  void OnHeartbeat(std::unique_ptr<HeartbeatCall> call, const grpc::Status& status) {
    if (status.ok()) {
      for (int i = 0; i < call->response.entries_size(); ++i) {
        const v1::HeartbeatBatchEntry& entry = call->response.entries(i);
        if (entry.reply().has_error()) {
          calls_.HeartbeatFoundFailure(absl::StrCat(
              "rank ", First(call->rank) + i,
              "'s heartbeat found its generation failed: ", entry.reply().error().message()));
          break;
        }
      }
    }
    call.reset();
    calls_.Done(/*failed_in_transit=*/!status.ok());
  }

  void StartLeave(int rank) {
    auto* call = new LeaveCall(rank, std::chrono::system_clock::now() + std::chrono::seconds(60));
    FillContext(rank, call->request.mutable_context());
    calls_.Started(/*heartbeat=*/false);
    Stub(rank / per_node_)
        ->Leave(&call->context, &call->request, &call->response, [this, call](grpc::Status) {
          delete call;
          calls_.Done();
        });
  }

  const std::vector<std::unique_ptr<WorkerService::Stub>>& stubs_;
  const int ranks_;
  const int per_node_;
  const int nodes_;
  const JobSpec job_;
  const absl::Duration timeout_;
  RoundState state_;

  std::unique_ptr<std::atomic<bool>[]> joined_ = std::make_unique<std::atomic<bool>[]>(nodes_);
  std::atomic<int64_t> interval_ns_{0};
  std::atomic<int64_t> timeout_ns_{0};
  absl::Notification round_over_;
  RoundCalls calls_;
};

}  // namespace

absl::StatusOr<RoundResult> RunNodeRound(
    const std::vector<std::unique_ptr<v1::WorkerService::Stub>>& stubs, int ranks,
    int ranks_per_node, JobSpec job, absl::Duration timeout) {
  return NodeRound(stubs, ranks, ranks_per_node, std::move(job), timeout).Run();
}

}  // namespace mesh::bench::rendezvous_internal
