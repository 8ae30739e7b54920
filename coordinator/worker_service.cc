#include "coordinator/worker_service.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "coordinator/rpc_helpers.h"

namespace mesh::coordinator {
namespace {

using namespace mesh::v1;  // NOLINT: the adapter names every message type.

Caller ToCaller(const RankContext& context) {
  return Caller{context.job_id(), context.generation(), context.rank(), context.incarnation()};
}

void FillJobError(const JobError& error, mesh::v1::JobError* out) {
  out->set_rank(error.rank);
  out->set_host(error.host);
  out->set_reason(error.reason);
  out->set_generation(error.generation);
  out->set_message(error.message);
  out->set_hang(error.hang);
}

void FillDevice(const DeviceInfo& device, mesh::v1::DeviceInfo* out) {
  out->set_kind(device.kind);
  out->set_index(device.index);
  out->set_uuid(device.uuid);
  out->set_pci_bus_id(device.pci_bus_id);
}

std::vector<std::string> Keys(const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return {keys.begin(), keys.end()};
}

// Streams WATCHING, then the generation's error (or ends with the status the
// watch ended with). Lifetime: deletes itself in OnDone, which gRPC calls only
// after Finish; Finish is called only once the Coordination callback has run
// or can no longer run (Unwatch succeeded or Watch failed), so the callback
// never outlives the reactor. Finish is called after mu_ is released and
// nothing of the reactor is touched after it: OnResult runs on a
// Coordination thread, which gRPC does not hold OnDone back for, so the
// reactor may be deleted as soon as Finish is called.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(Coordination* coordination, const WatchJobRequest& request)
      : coordination_(coordination) {
    // Not under mu_: the callback may run inside Watch() (a generation that
    // has already failed), and it takes mu_. Until started_, it only records.
    auto handle = coordination_->Watch(ToCaller(request.context()),
                                       [this](absl::StatusOr<JobError> r) { OnResult(r); });
    if (!handle.ok()) {
      // Nothing was registered, so the callback never runs.
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(ToGrpcStatus(handle.status()));
      return;
    }
    absl::MutexLock lock(&mu_);
    handle_ = *handle;
    started_ = true;
    watching_.set_kind(v1::JobEvent::WATCHING);
    writing_ = true;
    StartWrite(&watching_);
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        // The client is gone; stop watching and end the call.
        if (!finish_status_) finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "");
        error_pending_ = false;
      }
      finish = StepLocked();
    }
    if (finish) Finish(*finish);
  }

  void OnCancel() override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!finish_status_) finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "");
      error_pending_ = false;
      finish = StepLocked();
    }
    if (finish) Finish(*finish);
  }

  void OnDone() override { delete this; }

 private:
  void OnResult(const absl::StatusOr<JobError>& result) {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      callback_done_ = true;
      if (!finish_status_) {
        if (result.ok()) {
          error_.set_kind(v1::JobEvent::ERROR);
          FillJobError(*result, error_.mutable_error());
          error_pending_ = true;
          finish_status_ = grpc::Status::OK;
        } else {
          finish_status_ = ToGrpcStatus(result.status());
        }
      }
      finish = StepLocked();
    }
    if (finish) Finish(*finish);
  }

  // Advances the state machine: one write at a time, then, once the callback
  // can no longer run, returns the status to Finish with, which the caller
  // does after releasing mu_ (and touching nothing of the reactor after).
  std::optional<grpc::Status> StepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!started_ || finished_ || writing_) return std::nullopt;
    if (error_pending_) {
      error_pending_ = false;
      writing_ = true;
      StartWrite(&error_);
      return std::nullopt;
    }
    if (!finish_status_) return std::nullopt;
    if (!callback_done_) {
      // It is running; it will step us.
      if (!coordination_->Unwatch(handle_)) return std::nullopt;
      callback_done_ = true;
    }
    finished_ = true;
    return *finish_status_;
  }

  Coordination* const coordination_;
  absl::Mutex mu_;
  v1::JobEvent watching_;
  v1::JobEvent error_ ABSL_GUARDED_BY(mu_);
  uint64_t handle_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool error_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool callback_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
};

JoinArgs JoinArgsOf(const grpc::CallbackServerContext* ctx, const JoinRequest& request) {
  JoinArgs args;
  args.caller = ToCaller(request.context());
  args.host = request.host();
  args.device = DeviceInfo{request.device().kind(), request.device().index(),
                           request.device().uuid(), request.device().pci_bus_id()};
  if (!request.has_device()) args.device.index = -1;
  args.nccl_unique_id = request.nccl_unique_id();
  args.timeout = EffectiveTimeout(ctx, request.timeout_seconds());
  return args;
}

void FillJoinResponse(const JoinResult& r, JoinResponse* response) {
  response->set_rank(r.rank);
  response->set_world_size(r.world_size);
  response->set_local_rank(r.local_rank);
  response->set_local_world_size(r.local_world_size);
  response->set_node_rank(r.node_rank);
  response->set_num_nodes(r.num_nodes);
  for (int64_t d : r.mesh_shape) response->add_mesh_shape(d);
  for (const auto& n : r.mesh_dim_names) response->add_mesh_dim_names(n);
  response->set_generation(r.generation);
  response->set_nccl_unique_id(r.nccl_unique_id);
  response->set_heartbeat_interval_seconds(absl::ToDoubleSeconds(r.heartbeat_interval));
  response->set_heartbeat_timeout_seconds(absl::ToDoubleSeconds(r.heartbeat_timeout));
  response->set_membership_epoch(r.membership_epoch);
  response->set_in_place(r.in_place);
  response->set_in_place_dim(r.in_place_dim);
}

std::vector<GroupProgressReport> GroupsOf(const HeartbeatRequest& request) {
  std::vector<GroupProgressReport> groups;
  groups.reserve(request.groups_size());
  for (const v1::GroupProgress& g : request.groups()) {
    GroupProgressReport& report = groups.emplace_back();
    report.name = g.name();
    report.members.assign(g.members().begin(), g.members().end());
    report.entered = g.entered();
    report.completed = g.completed();
    report.pending_kind = g.pending_kind();
    report.completed_kind = g.completed_kind();
    report.waiting = absl::Milliseconds(g.waiting_ms());
    report.since_completed = absl::Milliseconds(g.since_completed_ms());
  }
  return groups;
}

void FillHeartbeatResponse(const HeartbeatReply& reply, HeartbeatResponse* response) {
  if (reply.error.has_value()) FillJobError(*reply.error, response->mutable_error());
  response->set_send_members(reply.send_members);
  response->set_membership_epoch(reply.membership_epoch);
  for (const JobError& lost : reply.lost) FillJobError(lost, response->add_lost_ranks());
}

void SetEntryStatus(const absl::Status& status, EntryStatus* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
}

// The most entries a batch may carry.
constexpr int kMaxBatchEntries = 4096;

// A batch's checks: at most kMaxBatchEntries entries, all of one job, and
// the caller may act for that job. `job_of(i)` is entry i's job id.
template <typename JobOf>
absl::Status CheckBatch(const CallAuthorizer& authz, const grpc::CallbackServerContext& ctx,
                        int size, JobOf job_of) {
  if (size > kMaxBatchEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch holds at most ", kMaxBatchEntries, " entries, not ", size));
  }
  if (size == 0) return absl::OkStatus();
  const std::string& job = job_of(0);
  for (int i = 1; i < size; ++i) {
    if (job_of(i) != job) {
      return absl::InvalidArgumentError(absl::StrCat("a batch names one job: entry 0 is for '", job,
                                                     "' and entry ", i, " for '", job_of(i), "'"));
    }
  }
  return authz.WorkerCall(ctx, job);
}

// Finishes `reactor` OK when the last of `pending` entries is done.
struct BatchCountdown {
  BatchCountdown(grpc::ServerUnaryReactor* r, int n) : reactor(r), pending(n) {}
  void Done() {
    if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) reactor->Finish(grpc::Status::OK);
  }
  grpc::ServerUnaryReactor* const reactor;
  std::atomic<int> pending;
};

// A batch call: checks it (CheckBatch), makes every reply entry, then
// starts entry i with start(requests[i], entry i, done) and finishes the
// call OK once every entry's `done` has run. Every entry exists before the
// first start, whose `done` may run inside it; each writes only its own.
template <typename Request, typename Entry, typename Start>
grpc::ServerUnaryReactor* RunBatch(grpc::CallbackServerContext* ctx, const CallAuthorizer& authz,
                                   const google::protobuf::RepeatedPtrField<Request>& requests,
                                   google::protobuf::RepeatedPtrField<Entry>* entries,
                                   Start start) {
  if (absl::Status bad =
          CheckBatch(authz, *ctx, requests.size(),
                     [&](int i) -> const std::string& { return requests[i].context().job_id(); });
      !bad.ok()) {
    return FinishUnary(ctx, bad);
  }
  if (requests.empty()) return FinishUnary(ctx, absl::OkStatus());
  for (int i = 0; i < requests.size(); ++i) entries->Add();
  auto countdown = std::make_shared<BatchCountdown>(ctx->DefaultReactor(), requests.size());
  for (int i = 0; i < requests.size(); ++i) {
    start(requests[i], entries->Mutable(i), [countdown] { countdown->Done(); });
  }
  return countdown->reactor;
}

}  // namespace

grpc::ServerUnaryReactor* WorkerServiceImpl::Join(Ctx* ctx, const JoinRequest* request,
                                                  JoinResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordination_->Join(JoinArgsOf(ctx, *request), [reactor, response](absl::StatusOr<JoinResult> r) {
    if (r.ok()) FillJoinResponse(*r, response);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::JoinBatch(Ctx* ctx, const JoinBatchRequest* request,
                                                       JoinBatchResponse* response) {
  return RunBatch(ctx, *authz_, request->joins(), response->mutable_entries(),
                  [&](const JoinRequest& join, JoinBatchEntry* entry, auto done) {
                    coordination_->Join(JoinArgsOf(ctx, join),
                                        [entry, done](absl::StatusOr<JoinResult> r) {
                                          if (r.ok()) FillJoinResponse(*r, entry->mutable_reply());
                                          SetEntryStatus(r.status(), entry->mutable_status());
                                          done();
                                        });
                  });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::DescribeRanks(Ctx* ctx,
                                                           const DescribeRanksRequest* request,
                                                           DescribeRanksResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  auto ranks = coordination_->DescribeRanks(
      ToCaller(request->context()),
      std::vector<int>(request->ranks().begin(), request->ranks().end()));
  if (ranks.ok()) {
    for (const RankDescription& d : *ranks) {
      auto* out = response->add_ranks();
      out->set_rank(d.rank);
      out->set_host(d.host);
      out->set_node_rank(d.node_rank);
      out->set_local_rank(d.local_rank);
      FillDevice(d.device, out->mutable_device());
    }
  }
  return FinishUnary(ctx, ranks.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvSet(Ctx* ctx, const KvSetRequest* request,
                                                   KvSetResponse*) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  return FinishUnary(
      ctx, coordination_->KvSet(ToCaller(request->context()), request->key(), request->value()));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvGet(Ctx* ctx, const KvGetRequest* request,
                                                   KvGetResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordination_->KvGet(ToCaller(request->context()), request->key(), request->wait(),
                       EffectiveTimeout(ctx, request->timeout_seconds()),
                       [reactor, response](absl::StatusOr<std::string> value) {
                         if (value.ok()) response->set_value(*std::move(value));
                         reactor->Finish(ToGrpcStatus(value.status()));
                       });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvAdd(Ctx* ctx, const KvAddRequest* request,
                                                   KvAddResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  auto value = coordination_->KvAdd(ToCaller(request->context()), request->key(), request->delta());
  if (value.ok()) response->set_value(*value);
  return FinishUnary(ctx, value.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvCompareSet(Ctx* ctx,
                                                          const KvCompareSetRequest* request,
                                                          KvCompareSetResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  std::optional<std::string> expected;
  if (request->has_expected()) expected = request->expected();
  auto result = coordination_->KvCompareSet(ToCaller(request->context()), request->key(),
                                            std::move(expected), request->desired());
  if (result.ok()) {
    response->set_swapped(result->swapped);
    response->set_present(result->present);
    response->set_value(std::move(result->value));
  }
  return FinishUnary(ctx, result.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvDelete(Ctx* ctx, const KvDeleteRequest* request,
                                                      KvDeleteResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  auto deleted =
      coordination_->KvDelete(ToCaller(request->context()), request->key(), request->prefix());
  if (deleted.ok()) response->set_deleted(*deleted);
  return FinishUnary(ctx, deleted.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvList(Ctx* ctx, const KvListRequest* request,
                                                    KvListResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  auto result = coordination_->KvList(ToCaller(request->context()), request->prefix(),
                                      request->start_after(), request->limit());
  if (result.ok()) {
    for (auto& key : result->keys) response->add_keys(std::move(key));
    response->set_truncated(result->truncated);
  }
  return FinishUnary(ctx, result.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvNumKeys(Ctx* ctx, const KvNumKeysRequest* request,
                                                       KvNumKeysResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  auto stats = coordination_->KvNumKeys(ToCaller(request->context()));
  if (stats.ok()) {
    response->set_num_keys(stats->num_keys);
    response->set_total_bytes(stats->total_bytes);
  }
  return FinishUnary(ctx, stats.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvWait(Ctx* ctx, const KvWaitRequest* request,
                                                    KvWaitResponse*) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordination_->KvWait(ToCaller(request->context()), Keys(request->keys()),
                        EffectiveTimeout(ctx, request->timeout_seconds()),
                        [reactor](absl::Status status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvMultiGet(Ctx* ctx, const KvMultiGetRequest* request,
                                                        KvMultiGetResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordination_->KvMultiGet(ToCaller(request->context()), Keys(request->keys()), request->wait(),
                            EffectiveTimeout(ctx, request->timeout_seconds()),
                            [reactor, response](absl::StatusOr<std::vector<std::string>> values) {
                              if (values.ok()) {
                                for (auto& v : *values) response->add_values(std::move(v));
                              }
                              reactor->Finish(ToGrpcStatus(values.status()));
                            });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvMultiSet(Ctx* ctx, const KvMultiSetRequest* request,
                                                        KvMultiSetResponse*) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  std::vector<std::pair<std::string, std::string>> entries;
  entries.reserve(request->entries_size());
  for (const auto& e : request->entries()) entries.emplace_back(e.key(), e.value());
  return FinishUnary(ctx,
                     coordination_->KvMultiSet(ToCaller(request->context()), std::move(entries)));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Barrier(Ctx* ctx, const BarrierRequest* request,
                                                     BarrierResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordination_->Barrier(ToCaller(request->context()), request->name(),
                         std::vector<int>(request->ranks().begin(), request->ranks().end()),
                         EffectiveTimeout(ctx, request->timeout_seconds()),
                         [reactor, response](absl::StatusOr<int> participants) {
                           if (participants.ok()) response->set_participants(*participants);
                           reactor->Finish(ToGrpcStatus(participants.status()));
                         });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::AliveRanks(Ctx* ctx, const AliveRanksRequest* request,
                                                        AliveRanksResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordination_->AliveRanks(ToCaller(request->context()),
                            EffectiveTimeout(ctx, request->timeout_seconds()),
                            [reactor, response](absl::StatusOr<AliveSet> set) {
                              if (set.ok()) {
                                response->set_round(set->round);
                                response->set_membership_epoch(set->membership_epoch);
                                for (const auto& alive : set->ranks) {
                                  v1::AliveRank* out = response->add_ranks();
                                  out->set_rank(alive.rank);
                                  out->set_incarnation(alive.incarnation);
                                }
                              }
                              reactor->Finish(ToGrpcStatus(set.status()));
                            });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::BarrierBatch(Ctx* ctx,
                                                          const BarrierBatchRequest* request,
                                                          BarrierBatchResponse* response) {
  return RunBatch(ctx, *authz_, request->arrivals(), response->mutable_entries(),
                  [&](const BarrierRequest& arrival, BarrierBatchEntry* entry, auto done) {
                    coordination_->Barrier(
                        ToCaller(arrival.context()), arrival.name(),
                        std::vector<int>(arrival.ranks().begin(), arrival.ranks().end()),
                        EffectiveTimeout(ctx, arrival.timeout_seconds()),
                        [entry, done](absl::StatusOr<int> participants) {
                          if (participants.ok()) {
                            entry->mutable_reply()->set_participants(*participants);
                          }
                          SetEntryStatus(participants.status(), entry->mutable_status());
                          done();
                        });
                  });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::PublishUniqueIds(
    Ctx* ctx, const PublishUniqueIdsRequest* request, PublishUniqueIdsResponse*) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  std::vector<std::pair<std::string, std::string>> ids(request->ids().begin(),
                                                       request->ids().end());
  return FinishUnary(ctx,
                     coordination_->PublishUniqueIds(ToCaller(request->context()), std::move(ids)));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::GetUniqueIds(Ctx* ctx,
                                                          const GetUniqueIdsRequest* request,
                                                          GetUniqueIdsResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  coordination_->GetUniqueIds(ToCaller(request->context()), Keys(request->keys()),
                              EffectiveTimeout(ctx, request->timeout_seconds()),
                              [reactor, response](absl::StatusOr<std::vector<std::string>> ids) {
                                if (ids.ok()) {
                                  for (auto& id : *ids) response->add_ids(std::move(id));
                                }
                                reactor->Finish(ToGrpcStatus(ids.status()));
                              });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(Ctx* ctx, const HeartbeatRequest* request,
                                                       HeartbeatResponse* response) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  auto reply = coordination_->Heartbeat(ToCaller(request->context()), GroupsOf(*request));
  if (reply.ok()) FillHeartbeatResponse(*reply, response);
  return FinishUnary(ctx, reply.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::HeartbeatBatch(Ctx* ctx,
                                                            const HeartbeatBatchRequest* request,
                                                            HeartbeatBatchResponse* response) {
  return RunBatch(ctx, *authz_, request->heartbeats(), response->mutable_entries(),
                  [&](const HeartbeatRequest& heartbeat, HeartbeatBatchEntry* entry, auto done) {
                    auto reply = coordination_->Heartbeat(ToCaller(heartbeat.context()),
                                                          GroupsOf(heartbeat));
                    if (reply.ok()) FillHeartbeatResponse(*reply, entry->mutable_reply());
                    SetEntryStatus(reply.status(), entry->mutable_status());
                    done();
                  });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportError(Ctx* ctx,
                                                         const ReportErrorRequest* request,
                                                         ReportErrorResponse*) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  return FinishUnary(ctx,
                     coordination_->ReportError(ToCaller(request->context()), request->reason()));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Leave(Ctx* ctx, const LeaveRequest* request,
                                                   LeaveResponse*) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return FinishUnary(ctx, denied);
  }
  return FinishUnary(ctx, coordination_->Leave(ToCaller(request->context())));
}

grpc::ServerWriteReactor<v1::JobEvent>* WorkerServiceImpl::WatchJob(
    Ctx* ctx, const WatchJobRequest* request) {
  if (absl::Status denied = authz_->WorkerCall(*ctx, request->context().job_id()); !denied.ok()) {
    return RejectedStream<v1::JobEvent>(denied);
  }
  return new WatchReactor(coordination_, *request);
}

}  // namespace mesh::coordinator
