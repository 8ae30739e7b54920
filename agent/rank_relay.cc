#include "agent/rank_relay.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <type_traits>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "agent/relay_watch.h"
#include "common/check.h"
#include "common/coordinator_targets.h"
#include "common/grpc_status.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::agent {
namespace {

using GenKey = std::pair<std::string, int64_t>;
using Stub = v1::WorkerService::Stub;
using Ctx = grpc::CallbackServerContext;
using Unary = grpc::ServerUnaryReactor;

grpc::Status EntryToStatus(const v1::EntryStatus& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

// The worker token a call carries, or "" without an authorization header.
std::string TokenOf(const Ctx& ctx) {
  auto it = ctx.client_metadata().find("authorization");
  if (it == ctx.client_metadata().end()) return "";
  const std::string value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  return absl::StartsWith(value, kBearer) ? value.substr(kBearer.size()) : "";
}

// A request's timeout_seconds bounded by the time left before the incoming
// call's deadline, so the coordinator stops waiting for a rank when the
// rank's own call would end.
double BoundedTimeout(const Ctx& ctx, double timeout_seconds) {
  const auto deadline = ctx.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return timeout_seconds;
  const double left =
      std::chrono::duration<double>(deadline - std::chrono::system_clock::now()).count();
  const double bounded = std::max(left, 0.001);
  return timeout_seconds > 0 ? std::min(timeout_seconds, bounded) : bounded;
}

absl::Duration FlushIntervalFor(double heartbeat_interval_seconds) {
  return std::clamp(absl::Seconds(heartbeat_interval_seconds) / 2, absl::Milliseconds(50),
                    absl::Seconds(1));
}

// Keeps, for each group a newer heartbeat sends without members, the members
// an unsent older one carried (members are sent once, or when asked).
void MergeHeartbeat(const v1::HeartbeatRequest& older, v1::HeartbeatRequest* newer) {
  std::map<std::string, const v1::GroupProgress*> with_members;
  for (const v1::GroupProgress& g : older.groups()) {
    if (g.members_size() > 0) with_members[g.name()] = &g;
  }
  if (with_members.empty()) return;
  for (v1::GroupProgress& g : *newer->mutable_groups()) {
    auto it = with_members.find(g.name());
    if (g.members_size() == 0 && it != with_members.end()) {
      *g.mutable_members() = it->second->members();
    }
  }
}

}  // namespace

namespace relay_internal {

// The channels to the coordinator's replicas and the replica in use.
class Upstream {
 public:
  static absl::StatusOr<std::unique_ptr<Upstream>> Make(const std::string& targets,
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

  // The replica to call, and its stub.
  size_t current() const { return replicas_.current(); }
  Stub* stub(size_t replica) const { return stubs_[replica].get(); }
  // After a call to `replica` ended with `status`.
  void Done(size_t replica, const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && replicas_.size() > 1) {
      replicas_.Rotate(replica);
    }
  }

 private:
  explicit Upstream(std::vector<std::string> targets) : replicas_(std::move(targets)) {}
  LeaderTracker replicas_;
  std::vector<std::unique_ptr<Stub>> stubs_;
};

}  // namespace relay_internal

namespace {

using relay_internal::Upstream;

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

// The WorkerService the ranks see.
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

class RelayImpl final : public RankRelay {
 public:
  RelayImpl(RankRelayOptions options, std::unique_ptr<Upstream> upstream)
      : options_(std::move(options)), upstream_(std::move(upstream)), service_(this) {}

  ~RelayImpl() override { Shutdown(); }

  absl::Status Listen() {
    ::unlink(options_.socket_path.c_str());
    grpc::ServerBuilder builder;
    builder.AddListeningPort(target(), grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    builder.SetMaxReceiveMessageSize(-1);
    // The socket is created with the process umask: open it to the
    // workers, who run as the job's owner (the token authorises them).
    const mode_t old_mask = ::umask(0);
    server_ = builder.BuildAndStart();
    ::umask(old_mask);
    if (server_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("the rank relay cannot listen on ", target()));
    }
    flusher_ = std::thread([this] { FlushLoop(); });
    return absl::OkStatus();
  }

  std::string target() const override { return absl::StrCat("unix:", options_.socket_path); }
  const std::string& socket_path() const override { return options_.socket_path; }

  void AddGeneration(const std::string& job_id, int64_t generation, std::vector<int> local_ranks,
                     std::string worker_token) override {
    absl::MutexLock lock(&mu_);
    Gen& gen = gens_[GenKey(job_id, generation)];
    gen.local = std::set<int>(local_ranks.begin(), local_ranks.end());
    gen.token = std::move(worker_token);
    if (gen.flush_interval == absl::ZeroDuration()) {
      gen.flush_interval = options_.default_heartbeat_flush;
    }
  }

  void RemoveGeneration(const std::string& job_id, int64_t generation) override {
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

  RankRelayStats stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  void Shutdown() override {
    std::vector<std::function<void()>> ends;
    std::vector<std::shared_ptr<SharedWatch>> watches;
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return;
      shut_down_ = true;
      for (auto& [key, gen] : gens_) {
        EndPendingLocked(gen, ShuttingDown(), &ends);
        if (gen.watch != nullptr) watches.push_back(std::move(gen.watch));
      }
    }
    for (auto& end : ends) end();
    for (auto& watch : watches) watch->Cancel(ShuttingDown());
    if (flusher_.joinable()) flusher_.join();
    {
      // Calls to the coordinator end now (CANCELLED, answered to their
      // ranks as UNAVAILABLE); their callbacks touch this relay, so it waits
      // for every one. gRPC runs a cancelled call's callback promptly; the
      // bound only keeps a wedged transport from hanging the agent.
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

  void CountServedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++stats_.served;
    if (options_.rank_calls != nullptr) options_.rank_calls->Increment();
  }
  void CountUpstreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++stats_.upstream_calls;
    if (options_.coordinator_calls != nullptr) options_.coordinator_calls->Increment();
  }

  // ---- Admission ------------------------------------------------------------

  // OK when the call names a generation registered here and carries its
  // job's token.
  grpc::Status Admit(const Ctx& ctx, const v1::RankContext& context) {
    absl::MutexLock lock(&mu_);
    CountServedLocked();
    return AdmitLocked(ctx, context);
  }

  grpc::Status AdmitLocked(const Ctx& ctx, const v1::RankContext& context)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shut_down_)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the agent is shutting down");
    if (context.job_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the request names no job (context)");
    }
    auto it = gens_.find(GenKey(context.job_id(), context.generation()));
    if (it == gens_.end()) {
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
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

  // ---- Forwarding -------------------------------------------------------------

  // Sends `request` as is; `done` gets the coordinator's status and reply.
  template <typename Request, typename Response>
  void Forward(const GenKey& key, AsyncMethod<Request, Response> method, const Request& request,
               const std::string& token, std::chrono::system_clock::time_point deadline,
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

  static grpc::Status ShuttingDown() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the agent is shutting down");
  }

  // `admitted`: the caller already counted and admitted the call.
  template <typename Request, typename Response>
  Unary* ForwardUnary(Ctx* ctx, AsyncMethod<Request, Response> method, const Request* request,
                      Response* response, bool admitted = false) {
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

  // ---- Join and barriers: batched ----------------------------------------------

  Unary* Join(Ctx* ctx, const v1::JoinRequest* request, v1::JoinResponse* response) {
    const GenKey key(request->context().job_id(), request->context().generation());
    return Enqueue(
        ctx, *request, response, [&](Gen& gen) -> JoinBatch& { return gen.joins; },
        [](const Gen& gen) { return gen.local; }, [this, key] { FlushJoins(key); });
  }

  Unary* Barrier(Ctx* ctx, const v1::BarrierRequest* request, v1::BarrierResponse* response) {
    const GenKey key(request->context().job_id(), request->context().generation());
    // Arrivals that disagree on the participants go up apart, so the one the
    // coordinator refuses (INVALID_ARGUMENT) does not wait for the others.
    const std::string name =
        absl::StrCat(request->name(), std::string(1, '\0'), absl::StrJoin(request->ranks(), ","));
    // The barrier's local participants: every local rank for a world
    // barrier, else the local ones it lists.
    auto participants = [request](const Gen& gen) {
      if (request->ranks().empty()) return gen.local;
      std::set<int> local;
      for (int r : request->ranks()) {
        if (gen.local.count(r) > 0) local.insert(r);
      }
      return local;
    };
    return Enqueue(
        ctx, *request, response, [&](Gen& gen) -> BarrierBatch& { return gen.barriers[name]; },
        participants, [this, key, name] { FlushBarrier(key, name); });
  }

  // Admits a rank's Join or barrier arrival and adds it to its batch
  // (`batch_of`), which goes up at once (`flush`) when every local rank it
  // concerns (`expected`) has arrived, else when its window ends. The
  // request's timeout is bounded by the rank's own deadline.
  template <typename Request, typename Response, typename BatchOf, typename Expected,
            typename Flush>
  Unary* Enqueue(Ctx* ctx, const Request& request, Response* response, BatchOf batch_of,
                 Expected expected, Flush flush) {
    Unary* reactor = ctx->DefaultReactor();
    Request entry = request;
    entry.set_timeout_seconds(BoundedTimeout(*ctx, request.timeout_seconds()));
    bool flush_now = false;
    {
      absl::MutexLock lock(&mu_);
      CountServedLocked();
      if (grpc::Status denied = AdmitLocked(*ctx, request.context()); !denied.ok()) {
        reactor->Finish(denied);
        return reactor;
      }
      Gen& gen = gens_[GenKey(request.context().job_id(), request.context().generation())];
      Batch<Request, Response>& batch = batch_of(gen);
      if (batch.entries.empty()) batch.opened = absl::Now();
      batch.deadline = std::max(batch.deadline, ctx->deadline());
      batch.arrived.insert(request.context().rank());
      batch.entries.push_back({std::move(entry), ReplyTo(reactor, response)});
      const std::set<int> local = expected(gen);
      flush_now =
          std::includes(batch.arrived.begin(), batch.arrived.end(), local.begin(), local.end());
      if (!flush_now) wake_.Signal();
    }
    if (flush_now) flush();
    return reactor;
  }

  // Finishes `reactor` with a reply's status, and the reply when OK.
  template <typename Response>
  static std::function<void(const grpc::Status&, const Response*)> ReplyTo(Unary* reactor,
                                                                           Response* response) {
    return [reactor, response](const grpc::Status& status, const Response* reply) {
      if (status.ok()) *response = *reply;
      reactor->Finish(status);
    };
  }

  // ---- Unique IDs: one fetch per node ------------------------------------------

  Unary* GetUniqueIds(Ctx* ctx, const v1::GetUniqueIdsRequest* request,
                      v1::GetUniqueIdsResponse* response) {
    Unary* reactor = ctx->DefaultReactor();
    const std::string keys = absl::StrJoin(request->keys(), std::string(1, '\0'));
    IdWaiter waiter;
    waiter.request = *request;
    waiter.request.set_timeout_seconds(BoundedTimeout(*ctx, request->timeout_seconds()));
    // No timeout and no deadline: the coordinator's default wait, whose end
    // only the coordinator knows.
    waiter.expires = waiter.request.timeout_seconds() > 0
                         ? absl::Now() + absl::Seconds(waiter.request.timeout_seconds())
                         : absl::InfiniteFuture();
    waiter.deadline = ctx->deadline();
    waiter.done = [reactor, response](const grpc::Status& status,
                                      const v1::GetUniqueIdsResponse* reply) {
      if (status.ok()) *response = *reply;
      reactor->Finish(status);
    };
    const GenKey key(request->context().job_id(), request->context().generation());
    {
      absl::MutexLock lock(&mu_);
      CountServedLocked();
      if (grpc::Status denied = AdmitLocked(*ctx, request->context()); !denied.ok()) {
        reactor->Finish(denied);
        return reactor;
      }
      IdFetch& fetch = gens_[key].ids[keys];
      if (fetch.done) {
        waiter.done(grpc::Status::OK, &fetch.reply);
        return reactor;
      }
      fetch.waiters.push_back(std::move(waiter));
      if (fetch.waiters.size() > 1) return reactor;  // A fetch is under way.
    }
    StartIdFetch(key, keys);
    return reactor;
  }

  // Fetches `keys` of `key` in the name of the first waiter: with its
  // request, timeout and deadline.
  void StartIdFetch(const GenKey& key, const std::string& keys) {
    v1::GetUniqueIdsRequest request;
    std::string token;
    std::chrono::system_clock::time_point deadline;
    {
      absl::MutexLock lock(&mu_);
      auto gen = gens_.find(key);
      if (gen == gens_.end()) return;
      auto it = gen->second.ids.find(keys);
      if (it == gen->second.ids.end() || it->second.waiters.empty()) return;
      const IdWaiter& first = it->second.waiters.front();
      request = first.request;
      if (first.expires != absl::InfiniteFuture()) {
        request.set_timeout_seconds(
            std::max(absl::ToDoubleSeconds(first.expires - absl::Now()), 0.001));
      }
      deadline = first.deadline;
      token = gen->second.token;
      ++stats_.unique_id_fetches;
    }
    Forward<v1::GetUniqueIdsRequest, v1::GetUniqueIdsResponse>(
        key, &Stub::async_interface::GetUniqueIds, request, token, deadline,
        [this, key, keys](grpc::Status status, v1::GetUniqueIdsResponse* reply) {
          OnIdFetch(key, keys, status, reply);
        });
  }

  // A fetch's outcome: every waiter gets the IDs, or the error. A timeout
  // is the fetching waiter's own: waiters whose time is not up fetch again.
  void OnIdFetch(const GenKey& key, const std::string& keys, const grpc::Status& status,
                 const v1::GetUniqueIdsResponse* reply) {
    std::vector<IdWaiter> finished;
    bool again = false;
    {
      absl::MutexLock lock(&mu_);
      auto gen = gens_.find(key);
      if (gen == gens_.end()) return;  // Removed: its waiters were ended.
      auto it = gen->second.ids.find(keys);
      if (it == gen->second.ids.end()) return;
      IdFetch& fetch = it->second;
      if (status.ok()) {
        fetch.done = true;
        fetch.reply = *reply;
        finished = std::move(fetch.waiters);
        fetch.waiters.clear();
      } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !shut_down_) {
        const absl::Time now = absl::Now();
        std::vector<IdWaiter> waiting;
        for (IdWaiter& waiter : fetch.waiters) {
          // A waiter on the coordinator's default wait has had it too.
          const bool over = waiter.expires == absl::InfiniteFuture() ||
                            waiter.expires <= now + absl::Milliseconds(10) ||
                            waiter.deadline <= std::chrono::system_clock::now();
          (over ? finished : waiting).push_back(std::move(waiter));
        }
        fetch.waiters = std::move(waiting);
        again = !fetch.waiters.empty();
      } else {
        finished = std::move(fetch.waiters);
        fetch.waiters.clear();
      }
      if (!fetch.done && fetch.waiters.empty()) gen->second.ids.erase(it);
    }
    for (IdWaiter& waiter : finished) waiter.done(status, status.ok() ? reply : nullptr);
    if (again) StartIdFetch(key, keys);
  }

  // ---- Heartbeats: answered here, sent up per flush -----------------------------

  Unary* Heartbeat(Ctx* ctx, const v1::HeartbeatRequest* request, v1::HeartbeatResponse* response) {
    Unary* reactor = ctx->DefaultReactor();
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      CountServedLocked();
      status = AdmitLocked(*ctx, request->context());
      if (status.ok()) {
        Gen& gen = gens_[GenKey(request->context().job_id(), request->context().generation())];
        const int rank = request->context().rank();
        v1::HeartbeatRequest next = *request;
        auto pending = gen.heartbeats.find(rank);
        if (pending != gen.heartbeats.end()) MergeHeartbeat(pending->second, &next);
        gen.heartbeats[rank] = std::move(next);
        RankView& view = gen.views[rank];
        if (!gen.last_flush.ok()) {
          status = gen.last_flush;
        } else if (!view.status.ok()) {
          status = view.status;
        } else {
          *response = view.reply;
          view.reply.set_send_members(false);  // Asked once; the rank sends them next.
        }
      }
    }
    reactor->Finish(status);
    return reactor;
  }

  Unary* Leave(Ctx* ctx, const v1::LeaveRequest* request, v1::LeaveResponse* response) {
    {
      absl::MutexLock lock(&mu_);
      CountServedLocked();
      if (grpc::Status denied = AdmitLocked(*ctx, request->context()); !denied.ok()) {
        Unary* reactor = ctx->DefaultReactor();
        reactor->Finish(denied);
        return reactor;
      }
      // A heartbeat still to be sent must not follow the rank's Leave.
      gens_[GenKey(request->context().job_id(), request->context().generation())].heartbeats.erase(
          request->context().rank());
    }
    return ForwardUnary(ctx, &Stub::async_interface::Leave, request, response,
                        /*admitted=*/true);
  }

  // ---- WatchJob: one upstream watch per generation --------------------------------

  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(Ctx* ctx, const v1::WatchJobRequest* request) {
    std::shared_ptr<SharedWatch> watch;
    bool open = false;  // This watcher opens the upstream stream.
    grpc::ServerWriteReactor<v1::JobEvent>* local = nullptr;
    {
      absl::MutexLock lock(&mu_);
      CountServedLocked();
      if (grpc::Status denied = AdmitLocked(*ctx, request->context()); !denied.ok()) {
        return RejectedWatch(denied);
      }
      Gen& gen = gens_[GenKey(request->context().job_id(), request->context().generation())];
      // Joined under mu_ (lock order: the relay's, then the watch's), so a
      // watch cannot end between the choice and the join; one that has
      // ended (its upstream stream gone without an ERROR) is replaced.
      if (gen.watch != nullptr) local = gen.watch->AddWatcher();
      if (local == nullptr) {
        gen.watch = std::make_shared<SharedWatch>();
        local = gen.watch->AddWatcher();
        open = true;
        ++stats_.watches;
        CountUpstreamLocked();
        ++gen.upstream;
      }
      watch = gen.watch;
    }
    if (open) {
      const size_t replica = upstream_->current();
      watch->Open(upstream_->stub(replica), *request, TokenOf(*ctx));
    }
    return local;
  }

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

  // The coordinator's latest answer to a rank's heartbeat.
  struct RankView {
    grpc::Status status;
    v1::HeartbeatResponse reply;
  };

  struct Gen {
    std::set<int> local;
    std::string token;
    int64_t served = 0;    // Calls of its ranks admitted here.
    int64_t upstream = 0;  // Calls made to the coordinator for it.
    JoinBatch joins;
    std::map<std::string, BarrierBatch> barriers;
    std::map<std::string, IdFetch> ids;
    // Heartbeats not yet sent, the latest of each rank.
    std::map<int, v1::HeartbeatRequest> heartbeats;
    std::map<int, RankView> views;
    grpc::Status last_flush;
    absl::Duration flush_interval;
    absl::Time next_flush = absl::InfinitePast();
    bool flush_in_flight = false;
    std::shared_ptr<SharedWatch> watch;
  };

  static grpc::ServerWriteReactor<v1::JobEvent>* RejectedWatch(const grpc::Status& status) {
    class Rejected final : public grpc::ServerWriteReactor<v1::JobEvent> {
     public:
      explicit Rejected(const grpc::Status& status) { Finish(status); }
      void OnDone() override { delete this; }
    };
    return new Rejected(status);
  }

  // Ends every waiting call of `gen` with `status` (run after mu_ is let go).
  void EndPendingLocked(Gen& gen, const grpc::Status& status,
                        std::vector<std::function<void()>>* ends)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& entry : gen.joins.entries) {
      ends->push_back([done = std::move(entry.done), status] { done(status, nullptr); });
    }
    gen.joins.entries.clear();
    for (auto& [name, batch] : gen.barriers) {
      for (auto& entry : batch.entries) {
        ends->push_back([done = std::move(entry.done), status] { done(status, nullptr); });
      }
      batch.entries.clear();
    }
    for (auto& [keys, fetch] : gen.ids) {
      for (IdWaiter& waiter : fetch.waiters) {
        ends->push_back([done = std::move(waiter.done), status] { done(status, nullptr); });
      }
      fetch.waiters.clear();
    }
  }

  // Sends the pending Joins of `key` as one JoinBatch.
  void FlushJoins(const GenKey& key) {
    FlushBatch<v1::JoinBatchRequest, v1::JoinBatchResponse>(
        key, [](Gen& gen) { return &gen.joins; }, [](Gen&) {}, &v1::JoinBatchRequest::add_joins,
        &Stub::async_interface::JoinBatch, "JoinBatch", &stats_.join_batches,
        [this, key](const v1::JoinResponse& reply) {
          NoteHeartbeatInterval(key, reply.heartbeat_interval_seconds());
        });
  }

  void FlushBarrier(const GenKey& key, const std::string& name) {
    FlushBatch<v1::BarrierBatchRequest, v1::BarrierBatchResponse>(
        key,
        [&name](Gen& gen) -> BarrierBatch* {
          auto it = gen.barriers.find(name);
          return it == gen.barriers.end() ? nullptr : &it->second;
        },
        [&name](Gen& gen) { gen.barriers.erase(name); }, &v1::BarrierBatchRequest::add_arrivals,
        &Stub::async_interface::BarrierBatch, "BarrierBatch", &stats_.barrier_batches,
        [](const v1::BarrierResponse&) {});
  }

  // Sends the pending entries of one batch of `key` (`batch_of`, null when
  // there is none) as one call, and hands each rank its entry's outcome;
  // `on_ok` sees every OK reply first.
  template <typename BatchRequest, typename BatchResponse, typename BatchOf, typename Forget,
            typename Add, typename OnOk>
  void FlushBatch(const GenKey& key, BatchOf batch_of, Forget forget, Add add,
                  AsyncMethod<BatchRequest, BatchResponse> method, const char* rpc,
                  int64_t* counter, OnOk on_ok) {
    using BatchT = std::remove_pointer_t<decltype(batch_of(std::declval<Gen&>()))>;
    using Entries = decltype(BatchT::entries);
    auto entries = std::make_shared<Entries>();
    std::string token;
    std::chrono::system_clock::time_point deadline;
    {
      absl::MutexLock lock(&mu_);
      auto it = gens_.find(key);
      if (it == gens_.end()) return;
      BatchT* batch = batch_of(it->second);
      if (batch == nullptr || batch->entries.empty()) return;
      *entries = std::move(batch->entries);
      batch->entries.clear();
      deadline = batch->deadline;
      batch->deadline = std::chrono::system_clock::time_point::min();
      token = it->second.token;
      ++*counter;
      // Every local rank has come: nothing more is expected of it here (a
      // rank calling again waits one window), so a barrier's record goes
      // (`forget`; `batch` is not used after it).
      if (std::includes(batch->arrived.begin(), batch->arrived.end(), it->second.local.begin(),
                        it->second.local.end())) {
        forget(it->second);
      }
    }
    BatchRequest request;
    for (auto& entry : *entries) *(request.*add)() = std::move(entry.request);
    Forward<BatchRequest, BatchResponse>(
        key, method, request, token, deadline,
        [entries, rpc, on_ok](grpc::Status status, BatchResponse* reply) {
          if (status.ok() && reply->entries_size() != static_cast<int>(entries->size())) {
            status = grpc::Status(grpc::StatusCode::INTERNAL,
                                  absl::StrCat(rpc, " answered a different number of entries"));
          }
          for (size_t i = 0; i < entries->size(); ++i) {
            if (!status.ok()) {
              (*entries)[i].done(status, nullptr);
              continue;
            }
            const auto& entry = reply->entries(static_cast<int>(i));
            if (entry.status().code() == 0) on_ok(entry.reply());
            (*entries)[i].done(EntryToStatus(entry.status()), &entry.reply());
          }
        });
  }

  void NoteHeartbeatInterval(const GenKey& key, double interval_seconds) {
    if (interval_seconds <= 0) return;
    absl::MutexLock lock(&mu_);
    auto it = gens_.find(key);
    if (it != gens_.end()) it->second.flush_interval = FlushIntervalFor(interval_seconds);
  }

  void FlushHeartbeats(const GenKey& key) {
    v1::HeartbeatBatchRequest request;
    std::string token;
    {
      absl::MutexLock lock(&mu_);
      auto it = gens_.find(key);
      if (it == gens_.end()) return;
      Gen& gen = it->second;
      for (auto& [rank, heartbeat] : gen.heartbeats) {
        *request.add_heartbeats() = std::move(heartbeat);
      }
      gen.heartbeats.clear();
      gen.flush_in_flight = true;
      token = gen.token;
      ++stats_.heartbeat_batches;
    }
    auto sent = std::make_shared<v1::HeartbeatBatchRequest>(request);
    // A flush never waits on the server: bound it by the flush interval's
    // order of magnitude, so a stalled coordinator is noticed.
    const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(5);
    Forward<v1::HeartbeatBatchRequest, v1::HeartbeatBatchResponse>(
        key, &Stub::async_interface::HeartbeatBatch, request, token, deadline,
        [this, key, sent](grpc::Status status, v1::HeartbeatBatchResponse* reply) {
          absl::MutexLock lock(&mu_);
          auto it = gens_.find(key);
          if (it == gens_.end()) return;
          Gen& gen = it->second;
          gen.flush_in_flight = false;
          if (status.ok() && reply->entries_size() != sent->heartbeats_size()) {
            status = grpc::Status(grpc::StatusCode::INTERNAL,
                                  "HeartbeatBatch answered a different number of entries");
          }
          gen.last_flush = status.ok() ? grpc::Status::OK
                                       : grpc::Status(status.error_code(),
                                                      absl::StrCat("the agent's heartbeats to the "
                                                                   "coordinator failed: ",
                                                                   status.error_message()));
          // A failed flush is not sent again: only heartbeats the ranks make
          // from now on speak for them (an old one would vouch for a rank
          // that may have died since). Group members it carried are asked
          // for again (send_members) by a coordinator that lacks them.
          if (!status.ok()) return;
          for (int i = 0; i < reply->entries_size(); ++i) {
            const v1::HeartbeatBatchEntry& entry = reply->entries(i);
            RankView& view = gen.views[sent->heartbeats(i).context().rank()];
            view.status = EntryToStatus(entry.status());
            const bool asked = view.reply.send_members();
            view.reply = entry.reply();
            if (asked) view.reply.set_send_members(true);
          }
        });
  }

  // Sends batches whose window has passed and heartbeats whose flush is due.
  void FlushLoop() {
    while (true) {
      std::vector<GenKey> joins;
      std::vector<std::pair<GenKey, std::string>> barriers;
      std::vector<GenKey> heartbeats;
      {
        absl::MutexLock lock(&mu_);
        if (shut_down_) return;
        const absl::Time now = absl::Now();
        absl::Time next = now + absl::Milliseconds(50);
        for (auto& [key, gen] : gens_) {
          if (!gen.joins.entries.empty()) {
            const absl::Time due = gen.joins.opened + options_.batch_window;
            if (due <= now) joins.push_back(key);
            next = std::min(next, due);
          }
          for (auto& [name, batch] : gen.barriers) {
            if (batch.entries.empty()) continue;
            const absl::Time due = batch.opened + options_.batch_window;
            if (due <= now) barriers.emplace_back(key, name);
            next = std::min(next, due);
          }
          if (!gen.heartbeats.empty() && !gen.flush_in_flight) {
            if (gen.next_flush <= now) {
              heartbeats.push_back(key);
              gen.next_flush = now + gen.flush_interval;
            }
            next = std::min(next, gen.next_flush);
          }
        }
        if (joins.empty() && barriers.empty() && heartbeats.empty()) {
          wake_.WaitWithDeadline(&mu_, next);
          continue;
        }
      }
      for (const GenKey& key : joins) FlushJoins(key);
      for (const auto& [key, name] : barriers) FlushBarrier(key, name);
      for (const GenKey& key : heartbeats) FlushHeartbeats(key);
    }
  }

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
  RankRelayStats stats_ ABSL_GUARDED_BY(mu_);
};

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

}  // namespace

absl::StatusOr<std::unique_ptr<RankRelay>> RankRelay::Start(RankRelayOptions options) {
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
