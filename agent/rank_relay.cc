// RankRelay (agent/rank_relay.h): Start, the relay's lifecycle, admission,
// forwarding one to one, the WatchJob fan-out and the service's glue. The
// batched calls are in rank_relay_batch.cc; the parts are described in
// rank_relay_internal.h.
#include "agent/rank_relay.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/rank_relay_internal.h"
#include "common/check.h"

namespace mesh::agent {
namespace relay_internal {

std::string TokenOf(const Ctx& ctx) {
  auto it = ctx.client_metadata().find("authorization");
  if (it == ctx.client_metadata().end()) return "";
  const std::string value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  return absl::StartsWith(value, kBearer) ? value.substr(kBearer.size()) : "";
}

double BoundedTimeout(const Ctx& ctx, double timeout_seconds) {
  const auto deadline = ctx.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return timeout_seconds;
  const double left =
      std::chrono::duration<double>(deadline - std::chrono::system_clock::now()).count();
  const double bounded = std::max(left, 0.001);
  return timeout_seconds > 0 ? std::min(timeout_seconds, bounded) : bounded;
}

// ---- Upstream ---------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Upstream>> Upstream::Make(const std::string& targets,
                                                         const security::ClientSecurity& security) {
  auto upstream = std::unique_ptr<Upstream>(new Upstream(SplitCoordinatorTargets(targets)));
  security::ClientSecurity channel_security = security;
  channel_security.token.clear();
  for (size_t i = 0; i < upstream->replicas_.size(); ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    const std::string& target = upstream->replicas_.target(i);
    AddCoordinatorChannelArgs(target, &args);
    auto channel = security::MakeChannel(target, channel_security, std::move(args));
    if (!channel.ok()) return channel.status();
    upstream->stubs_.push_back(v1::WorkerService::NewStub(*channel));
  }
  if (upstream->stubs_.empty()) return absl::InvalidArgumentError("no coordinator address");
  return upstream;
}

void Upstream::Done(size_t replica, const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && replicas_.size() > 1) {
    replicas_.Rotate(replica);
  }
}

// ---- Lifecycle ----------------------------------------------------------------------

RelayImpl::RelayImpl(RankRelayOptions options, std::unique_ptr<Upstream> upstream)
    : options_(std::move(options)), upstream_(std::move(upstream)), service_(this) {}

RelayImpl::~RelayImpl() { Shutdown(); }

absl::Status RelayImpl::Listen() {
  ::unlink(options_.socket_path.c_str());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(target(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service_);
  builder.SetMaxReceiveMessageSize(-1);
  // The socket is created with the process umask: open it to the workers,
  // who run as the job's owner (the token authorises them).
  const mode_t old_mask = ::umask(0);
  server_ = builder.BuildAndStart();
  ::umask(old_mask);
  if (server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("the rank relay cannot listen on ", target()));
  }
  flusher_ = std::thread([this] { FlushLoop(); });
  return absl::OkStatus();
}

void RelayImpl::AddGeneration(const std::string& job_id, int64_t generation,
                              std::vector<int> local_ranks, std::string worker_token) {
  absl::MutexLock lock(&mu_);
  Gen& gen = gens_[GenKey(job_id, generation)];
  gen.local = std::set<int>(local_ranks.begin(), local_ranks.end());
  gen.token = std::move(worker_token);
  if (gen.flush_interval == absl::ZeroDuration()) {
    gen.flush_interval = options_.default_heartbeat_flush;
  }
}

void RelayImpl::RemoveGeneration(const std::string& job_id, int64_t generation) {
  std::vector<std::function<void()>> ends;
  std::shared_ptr<SharedWatch> watch;
  {
    absl::MutexLock lock(&mu_);
    auto it = gens_.find(GenKey(job_id, generation));
    if (it == gens_.end()) return;
    spdlog::info(
        "rank relay: job {} generation {}: {} call(s) of its {} rank(s) here, {} to "
        "the coordinator",
        job_id, generation, it->second.served, it->second.local.size(), it->second.upstream);
    const grpc::Status gone(
        grpc::StatusCode::ABORTED,
        absl::StrCat("job ", job_id, " generation ", generation, " ended on this node"));
    EndPendingLocked(it->second, gone, &ends);
    watch = std::move(it->second.watch);
    gens_.erase(it);
  }
  for (auto& end : ends) end();
  if (watch != nullptr) watch->Cancel();
}

RankRelayStats RelayImpl::stats() const {
  const int64_t reopened = watches_reopened_.load();
  absl::MutexLock lock(&mu_);
  RankRelayStats stats = stats_;
  stats.watches += reopened;
  stats.upstream_calls += reopened;
  return stats;
}

void RelayImpl::Shutdown() {
  std::vector<std::function<void()>> ends;
  std::vector<std::shared_ptr<SharedWatch>> watches;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& [key, gen] : gens_) {
      EndPendingLocked(gen, ShuttingDown(), &ends);
      gen.watch.reset();
    }
    for (const std::weak_ptr<SharedWatch>& made : all_watches_) {
      if (std::shared_ptr<SharedWatch> watch = made.lock()) watches.push_back(std::move(watch));
    }
    all_watches_.clear();
  }
  for (auto& end : ends) end();
  // Once cancelled a watch starts no stream on our stubs and no longer calls
  // CountWatchReopened (which touches this relay).
  for (auto& watch : watches) watch->Cancel(ShuttingDown());
  if (flusher_.joinable()) flusher_.join();
  {
    // Calls to the coordinator end now (CANCELLED, answered to their ranks
    // as UNAVAILABLE); their callbacks touch this relay, so it waits for
    // every one. gRPC runs a cancelled call's callback promptly; the bound
    // only keeps a wedged transport from hanging the agent.
    absl::MutexLock lock(&mu_);
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
    const absl::Time limit = absl::Now() + absl::Seconds(10);
    while (!in_flight_.empty()) {
      if (in_flight_empty_.WaitWithDeadline(&mu_, limit)) break;
    }
    // Their callbacks would outlive the relay: stop loudly instead.
    MESH_CHECK(in_flight_.empty(),
               "rank relay: calls to the coordinator did not end 10 s after being cancelled");
  }
  if (server_ != nullptr)
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  ::unlink(options_.socket_path.c_str());
}

void RelayImpl::CountServedLocked() {
  ++stats_.served;
  if (options_.rank_calls != nullptr) options_.rank_calls->Increment();
}

void RelayImpl::CountUpstreamLocked() {
  ++stats_.upstream_calls;
  if (options_.coordinator_calls != nullptr) options_.coordinator_calls->Increment();
}

void RelayImpl::CountWatchReopened() {
  ++watches_reopened_;
  if (options_.coordinator_calls != nullptr) options_.coordinator_calls->Increment();
}

// ---- Admission ------------------------------------------------------------------------

grpc::Status RelayImpl::Admit(const Ctx& ctx, const v1::RankContext& context) {
  absl::MutexLock lock(&mu_);
  CountServedLocked();
  return AdmitLocked(ctx, context);
}

grpc::Status RelayImpl::AdmitLocked(const Ctx& ctx, const v1::RankContext& context) {
  if (shut_down_) return ShuttingDown();
  if (context.job_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the request names no job (context)");
  }
  auto it = gens_.find(GenKey(context.job_id(), context.generation()));
  if (it == gens_.end()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("job ", context.job_id(), " generation ", context.generation(),
                                     " has no ranks on this node; call the coordinator"));
  }
  if (!it->second.token.empty() && TokenOf(ctx) != it->second.token) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat("the call does not carry job ", context.job_id(), "'s worker token"));
  }
  ++it->second.served;
  return grpc::Status::OK;
}

// ---- Forwarded one to one ----------------------------------------------------------------

template <typename Request, typename Response>
Unary* RelayImpl::ForwardUnary(Ctx* ctx, AsyncMethod<Request, Response> method,
                               const Request* request, Response* response, bool admitted) {
  Unary* reactor = ctx->DefaultReactor();
  if (grpc::Status denied = admitted ? grpc::Status::OK : Admit(*ctx, request->context());
      !denied.ok()) {
    reactor->Finish(denied);
    return reactor;
  }
  Forward<Request, Response>(GenKey(request->context().job_id(), request->context().generation()),
                             method, *request, TokenOf(*ctx), ctx->deadline(),
                             [reactor, response](grpc::Status status, Response* reply) {
                               if (status.ok()) response->Swap(reply);
                               reactor->Finish(status);
                             });
  return reactor;
}

Unary* RelayImpl::Leave(Ctx* ctx, const v1::LeaveRequest* request, v1::LeaveResponse* response) {
  {
    absl::MutexLock lock(&mu_);
    CountServedLocked();
    if (grpc::Status denied = AdmitLocked(*ctx, request->context()); !denied.ok()) {
      Unary* reactor = ctx->DefaultReactor();
      reactor->Finish(denied);
      return reactor;
    }
    // A heartbeat still to be sent must not follow the process's Leave.
    gens_[GenKey(request->context().job_id(), request->context().generation())].heartbeats.erase(
        ProcessOf(request->context()));
  }
  return ForwardUnary(ctx, &Stub::async_interface::Leave, request, response,
                      /*admitted=*/true);
}

// ---- WatchJob: one upstream watch per generation ------------------------------------------

namespace {

grpc::ServerWriteReactor<v1::JobEvent>* RejectedWatch(const grpc::Status& status) {
  class Rejected final : public grpc::ServerWriteReactor<v1::JobEvent> {
   public:
    explicit Rejected(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  return new Rejected(status);
}

}  // namespace

grpc::ServerWriteReactor<v1::JobEvent>* RelayImpl::WatchJob(Ctx* ctx,
                                                            const v1::WatchJobRequest* request) {
  std::shared_ptr<SharedWatch> watch;
  bool open = false;  // This watcher opens the upstream stream.
  grpc::ServerWriteReactor<v1::JobEvent>* local = nullptr;
  const std::string token = TokenOf(*ctx);
  {
    absl::MutexLock lock(&mu_);
    CountServedLocked();
    if (grpc::Status denied = AdmitLocked(*ctx, request->context()); !denied.ok()) {
      return RejectedWatch(denied);
    }
    Gen& gen = gens_[GenKey(request->context().job_id(), request->context().generation())];
    // Joined under mu_ (lock order: the relay's, then the watch's), so a
    // watch cannot end between the choice and the join; one that has ended
    // (its upstream stream gone without an ERROR) is replaced.
    if (gen.watch != nullptr) local = gen.watch->AddWatcher(*request, token);
    if (local == nullptr) {
      gen.watch = std::make_shared<SharedWatch>(upstream_->stub(upstream_->current()),
                                                [this] { CountWatchReopened(); });
      std::erase_if(all_watches_, [](const auto& w) { return w.expired(); });
      all_watches_.push_back(gen.watch);
      local = gen.watch->AddWatcher(*request, token);
      open = true;
      ++stats_.watches;
      CountUpstreamLocked();
      ++gen.upstream;
    }
    watch = gen.watch;
  }
  if (open) watch->Open();
  return local;
}

// ---- The service's glue --------------------------------------------------------------------

#define MESH_RELAY_FORWARD(Rpc)                                                       \
  Unary* RelayService::Rpc(Ctx* ctx, const v1::Rpc##Request* request,                 \
                           v1::Rpc##Response* response) {                             \
    return relay_->ForwardUnary(ctx, &Stub::async_interface::Rpc, request, response); \
  }
MESH_RELAY_FORWARD(DescribeRanks)
MESH_RELAY_FORWARD(KvSet)
MESH_RELAY_FORWARD(KvGet)
MESH_RELAY_FORWARD(KvAdd)
MESH_RELAY_FORWARD(KvCompareSet)
MESH_RELAY_FORWARD(KvDelete)
MESH_RELAY_FORWARD(KvList)
MESH_RELAY_FORWARD(KvNumKeys)
MESH_RELAY_FORWARD(KvWait)
MESH_RELAY_FORWARD(KvMultiGet)
MESH_RELAY_FORWARD(KvMultiSet)
MESH_RELAY_FORWARD(PublishUniqueIds)
MESH_RELAY_FORWARD(ReportError)
MESH_RELAY_FORWARD(AliveRanks)
#undef MESH_RELAY_FORWARD

Unary* RelayService::Join(Ctx* ctx, const v1::JoinRequest* request, v1::JoinResponse* response) {
  return relay_->Join(ctx, request, response);
}
Unary* RelayService::Barrier(Ctx* ctx, const v1::BarrierRequest* request,
                             v1::BarrierResponse* response) {
  return relay_->Barrier(ctx, request, response);
}
Unary* RelayService::GetUniqueIds(Ctx* ctx, const v1::GetUniqueIdsRequest* request,
                                  v1::GetUniqueIdsResponse* response) {
  return relay_->GetUniqueIds(ctx, request, response);
}
Unary* RelayService::Heartbeat(Ctx* ctx, const v1::HeartbeatRequest* request,
                               v1::HeartbeatResponse* response) {
  return relay_->Heartbeat(ctx, request, response);
}
Unary* RelayService::Leave(Ctx* ctx, const v1::LeaveRequest* request, v1::LeaveResponse* response) {
  return relay_->Leave(ctx, request, response);
}
grpc::ServerWriteReactor<v1::JobEvent>* RelayService::WatchJob(Ctx* ctx,
                                                               const v1::WatchJobRequest* request) {
  return relay_->WatchJob(ctx, request);
}

}  // namespace relay_internal

absl::StatusOr<std::unique_ptr<RankRelay>> RankRelay::Start(RankRelayOptions options) {
  using relay_internal::RelayImpl;
  using relay_internal::Upstream;
  if (options.socket_path.empty()) {
    return absl::InvalidArgumentError("the rank relay needs a socket path");
  }
  if (options.socket_path.size() > 107) {
    return absl::InvalidArgumentError(absl::StrCat("the rank relay's socket path ",
                                                   options.socket_path,
                                                   " is longer than a Unix socket allows (107)"));
  }
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("the rank relay needs the coordinator's address");
  }
  absl::StatusOr<std::unique_ptr<Upstream>> upstream =
      Upstream::Make(options.coordinator, options.security);
  if (!upstream.ok()) return upstream.status();
  auto relay = std::make_unique<RelayImpl>(std::move(options), *std::move(upstream));
  if (absl::Status s = relay->Listen(); !s.ok()) return s;
  return std::unique_ptr<RankRelay>(std::move(relay));
}

}  // namespace mesh::agent
