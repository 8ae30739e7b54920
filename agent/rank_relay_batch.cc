// RankRelay (agent/rank_relay.h): the calls that go up once per node. Join
// and barrier arrivals in batches, unique IDs fetched once and kept,
// heartbeats answered here and sent up per flush, and the flusher thread
// that sends what is due. The parts are described in rank_relay_internal.h.
#include <algorithm>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/rank_relay_internal.h"

namespace mesh::agent::relay_internal {
namespace {

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

// Finishes `reactor` with a reply's status, and the reply when OK.
template <typename Response>
std::function<void(const grpc::Status&, const Response*)> ReplyTo(Unary* reactor,
                                                                  Response* response) {
  return [reactor, response](const grpc::Status& status, const Response* reply) {
    if (status.ok()) *response = *reply;
    reactor->Finish(status);
  };
}

// Whether a failed unique-ID fetch failed for the process it was made in the
// name of, not for the generation: that process is lost or fenced out by a
// newer one (ABORTED), or has not joined (FAILED_PRECONDITION). ABORTED is
// also how a failed generation answers; then each waiter hears it in turn.
bool FetcherOwnError(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::ABORTED ||
         status.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
}

}  // namespace

// A live rank's heartbeats reach the coordinator at least every interval
// plus one flush, always short of the timeout.
absl::Duration FlushIntervalFor(double heartbeat_interval_seconds,
                                double heartbeat_timeout_seconds) {
  const absl::Duration interval = absl::Seconds(heartbeat_interval_seconds);
  absl::Duration flush = interval / 2;
  if (heartbeat_timeout_seconds > heartbeat_interval_seconds) {
    flush = std::min(flush, (absl::Seconds(heartbeat_timeout_seconds) - interval) / 2);
  }
  return std::max(flush, absl::Milliseconds(50));
}

// ---- Join and barriers: batched -------------------------------------------------

Unary* RelayImpl::Join(Ctx* ctx, const v1::JoinRequest* request, v1::JoinResponse* response) {
  const GenKey key(request->context().job_id(), request->context().generation());
  // Until the world has formed a Join waits for the node's other ranks;
  // after it, the ranks that are coming have come, and a Join is a process
  // started again (in-place recovery readmits it at once): it goes up alone.
  auto expected = [](const Gen& gen) { return gen.formed ? std::set<int>() : gen.local; };
  return Enqueue(
      ctx, *request, response, [&](Gen& gen) -> JoinBatch& { return gen.joins; }, expected,
      [this, key] { FlushJoins(key); });
}

Unary* RelayImpl::Barrier(Ctx* ctx, const v1::BarrierRequest* request,
                          v1::BarrierResponse* response) {
  const GenKey key(request->context().job_id(), request->context().generation());
  // Arrivals that disagree on the participants go up apart, so the one the
  // coordinator refuses (INVALID_ARGUMENT) does not wait for the others.
  const std::string name =
      absl::StrCat(request->name(), std::string(1, '\0'), absl::StrJoin(request->ranks(), ","));
  // The barrier's local participants: every local rank for a world barrier,
  // else the local ones it lists.
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

// The request's timeout is bounded by the rank's own deadline.
template <typename Request, typename Response, typename BatchOf, typename Expected, typename Flush>
Unary* RelayImpl::Enqueue(Ctx* ctx, const Request& request, Response* response, BatchOf batch_of,
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

void RelayImpl::FlushJoins(const GenKey& key) {
  FlushBatch<v1::JoinBatchRequest, v1::JoinBatchResponse>(
      key, [](Gen& gen) { return &gen.joins; }, [](Gen&) {}, &v1::JoinBatchRequest::add_joins,
      &Stub::async_interface::JoinBatch, "JoinBatch", &stats_.join_batches,
      [this, key](const v1::JoinResponse& reply) { NoteJoined(key, reply); });
}

void RelayImpl::FlushBarrier(const GenKey& key, const std::string& name) {
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
void RelayImpl::FlushBatch(const GenKey& key, BatchOf batch_of, Forget forget, Add add,
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
    // Every local rank has come: nothing more is expected of it here (a rank
    // calling again waits one window), so a barrier's record goes (`forget`;
    // `batch` is not used after it).
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

void RelayImpl::NoteJoined(const GenKey& key, const v1::JoinResponse& reply) {
  absl::MutexLock lock(&mu_);
  auto it = gens_.find(key);
  if (it == gens_.end()) return;
  it->second.formed = true;
  if (reply.heartbeat_interval_seconds() > 0) {
    it->second.flush_interval =
        FlushIntervalFor(reply.heartbeat_interval_seconds(), reply.heartbeat_timeout_seconds());
  }
}

void RelayImpl::EndPendingLocked(Gen& gen, const grpc::Status& status,
                                 std::vector<std::function<void()>>* ends) {
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

// ---- Unique IDs: one fetch per node --------------------------------------------------

Unary* RelayImpl::GetUniqueIds(Ctx* ctx, const v1::GetUniqueIdsRequest* request,
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
  waiter.done = ReplyTo(reactor, response);
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

// With the first waiter's request, timeout and deadline.
void RelayImpl::StartIdFetch(const GenKey& key, const std::string& keys) {
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

// A fetch's outcome: every waiter gets the IDs, or the error. An error that
// is the fetching waiter's own (its timeout; it is lost or fenced out) goes
// to it alone, and the waiters left fetch again in their own names.
void RelayImpl::OnIdFetch(const GenKey& key, const std::string& keys, const grpc::Status& status,
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
    } else if (FetcherOwnError(status) && !shut_down_ && !fetch.waiters.empty()) {
      finished.push_back(std::move(fetch.waiters.front()));
      fetch.waiters.erase(fetch.waiters.begin());
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

// ---- Heartbeats: answered here, sent up per flush --------------------------------------

// Answered from the coordinator's latest answer to this process (rank and
// incarnation): a new process of a rank starts afresh, and is never handed
// the answer meant for the one it replaces (which is lost, or fenced out).
Unary* RelayImpl::Heartbeat(Ctx* ctx, const v1::HeartbeatRequest* request,
                            v1::HeartbeatResponse* response) {
  Unary* reactor = ctx->DefaultReactor();
  grpc::Status status;
  {
    absl::MutexLock lock(&mu_);
    CountServedLocked();
    status = AdmitLocked(*ctx, request->context());
    if (status.ok()) {
      Gen& gen = gens_[GenKey(request->context().job_id(), request->context().generation())];
      const ProcessKey process = ProcessOf(request->context());
      v1::HeartbeatRequest next = *request;
      auto pending = gen.heartbeats.find(process);
      if (pending != gen.heartbeats.end()) MergeHeartbeat(pending->second, &next);
      gen.heartbeats[process] = std::move(next);
      ProcessView& view = gen.views[process];
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

void RelayImpl::FlushHeartbeats(const GenKey& key) {
  v1::HeartbeatBatchRequest request;
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    auto it = gens_.find(key);
    if (it == gens_.end()) return;
    Gen& gen = it->second;
    for (auto& [process, heartbeat] : gen.heartbeats) {
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
        // Processes the coordinator refused (ABORTED: lost, or fenced out by
        // a newer process of their rank), whose local watches end with it.
        std::vector<std::pair<v1::RankContext, grpc::Status>> refused;
        std::shared_ptr<SharedWatch> watch;
        {
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
            const v1::RankContext& process = sent->heartbeats(i).context();
            ProcessView& view = gen.views[ProcessOf(process)];
            view.status = EntryToStatus(entry.status());
            const bool asked = view.reply.send_members();
            view.reply = entry.reply();
            if (asked) view.reply.set_send_members(true);
            if (view.status.error_code() == grpc::StatusCode::ABORTED) {
              refused.emplace_back(process, view.status);
            }
          }
          if (!refused.empty()) watch = gen.watch;
        }
        if (watch == nullptr) return;
        for (const auto& [process, refusal] : refused) watch->EndProcess(process, refusal);
      });
}

// ---- The flusher ---------------------------------------------------------------------

void RelayImpl::FlushLoop() {
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

}  // namespace mesh::agent::relay_internal
