#include "bench/waiters_bench.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include <grpcpp/client_context.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/check.h"
#include "common/grpc_status.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;
using v1::WorkerService;

constexpr char kBarrierName[] = "hold";
constexpr char kReleaseKey[] = "release";
constexpr char kReleaseValue[] = "go";

double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

// A batch of asynchronous calls that must all succeed. Done() is called once
// per call, from whichever thread completes it.
class Batch {
 public:
  explicit Batch(int calls) : calls_(calls), remaining_(calls) {
    if (calls == 0) done_.Notify();
  }

  // `wrong` is empty when the call succeeded and replied what it should.
  void Done(int rank, const std::string& wrong) {
    const SteadyClock::time_point now = SteadyClock::now();
    absl::MutexLock lock(&mu_);
    last_ = std::max(last_, now);
    if (!wrong.empty()) {
      if (failures_++ == 0) first_failure_ = absl::StrCat("rank ", rank, ": ", wrong);
    } else {
      ++ok_;
    }
    if (--remaining_ == 0) done_.Notify();
  }

  bool failed() const {
    absl::MutexLock lock(&mu_);
    return failures_ > 0;
  }

  // Every wait carries a timeout before `limit`, so a live coordinator ends
  // each call in time. Past it the coordinator has stopped answering; the
  // pending calls reference this batch, so it cannot return: abort, loudly.
  void Wait(absl::Duration limit) {
    MESH_CHECK(done_.WaitForNotificationWithTimeout(limit),
               "calls still pending a minute past their timeout: the coordinator is not "
               "answering");
  }

  absl::Status status(const std::string& what) const {
    absl::MutexLock lock(&mu_);
    if (failures_ == 0) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(what, ": ", failures_, " of ", calls_,
                                            " calls failed; first: ", first_failure_));
  }
  int64_t ok() const {
    absl::MutexLock lock(&mu_);
    return ok_;
  }
  SteadyClock::time_point last() const {
    absl::MutexLock lock(&mu_);
    return last_;
  }

 private:
  const int calls_;
  absl::Notification done_;
  mutable absl::Mutex mu_;
  int remaining_ ABSL_GUARDED_BY(mu_);
  int64_t ok_ ABSL_GUARDED_BY(mu_) = 0;
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_failure_ ABSL_GUARDED_BY(mu_);
  SteadyClock::time_point last_ ABSL_GUARDED_BY(mu_);
};

template <typename Request, typename Response>
struct Call {
  int rank = 0;
  grpc::ClientContext context;
  Request request;
  Response response;
};

std::string CallFailed(const char* method, const grpc::Status& status) {
  return absl::StrCat(method, " failed: ", FromGrpcStatus(status).ToString());
}

// Issues the calls of simulated ranks of one job; each completes into a Batch.
class Ranks {
 public:
  Ranks(const std::vector<std::unique_ptr<WorkerService::Stub>>& stubs, std::string job_id,
        int64_t generation, int world, absl::Duration timeout)
      : stubs_(stubs),
        job_id_(std::move(job_id)),
        generation_(generation),
        world_(world),
        timeout_(timeout) {}

  // The limit for Batch::Wait: a minute past the timeout of every wait.
  absl::Duration wait_limit() const { return timeout_ + absl::Seconds(60); }

  void Join(int rank, Batch* batch) {
    auto* call = Start<v1::JoinRequest, v1::JoinResponse>(rank);
    call->request.set_host(absl::StrCat("host-", rank / 8));
    call->request.set_timeout_seconds(absl::ToDoubleSeconds(timeout_));
    Stub(rank)->Join(
        &call->context, &call->request, &call->response, [this, call, batch](grpc::Status status) {
          std::string wrong;
          if (!status.ok()) {
            wrong = CallFailed("Join", status);
          } else if (call->response.rank() != call->rank || call->response.world_size() != world_) {
            wrong = absl::StrCat("Join replied rank ", call->response.rank(), " of ",
                                 call->response.world_size());
          }
          Finish(call, batch, wrong);
        });
  }

  void Barrier(int rank, Batch* batch) {
    auto* call = Start<v1::BarrierRequest, v1::BarrierResponse>(rank);
    call->request.set_name(kBarrierName);
    call->request.set_timeout_seconds(absl::ToDoubleSeconds(timeout_));
    Stub(rank)->Barrier(
        &call->context, &call->request, &call->response, [this, call, batch](grpc::Status status) {
          std::string wrong;
          if (!status.ok()) {
            wrong = CallFailed("Barrier", status);
          } else if (call->response.participants() != world_) {
            wrong =
                absl::StrCat("Barrier replied ", call->response.participants(), " participants");
          }
          Finish(call, batch, wrong);
        });
  }

  void Get(int rank, Batch* batch) {
    auto* call = Start<v1::KvGetRequest, v1::KvGetResponse>(rank);
    call->request.set_key(kReleaseKey);
    call->request.set_wait(true);
    call->request.set_timeout_seconds(absl::ToDoubleSeconds(timeout_));
    Stub(rank)->KvGet(&call->context, &call->request, &call->response,
                      [call, batch](grpc::Status status) {
                        std::string wrong;
                        if (!status.ok()) {
                          wrong = CallFailed("KvGet", status);
                        } else if (call->response.value() != kReleaseValue) {
                          wrong = "KvGet replied another value than the one set";
                        }
                        Finish(call, batch, wrong);
                      });
  }

  void Set(int rank, Batch* batch) {
    auto* call = Start<v1::KvSetRequest, v1::KvSetResponse>(rank);
    call->request.set_key(kReleaseKey);
    call->request.set_value(kReleaseValue);
    Stub(rank)->KvSet(&call->context, &call->request, &call->response,
                      [call, batch](grpc::Status status) {
                        Finish(call, batch, status.ok() ? "" : CallFailed("KvSet", status));
                      });
  }

 private:
  template <typename Request, typename Response>
  Call<Request, Response>* Start(int rank) {
    auto* call = new Call<Request, Response>;
    // No gRPC deadline: the waits carry timeout_seconds, which the
    // coordinator enforces, as in rendezvous_bench.
    call->rank = rank;
    v1::RankContext* context = call->request.mutable_context();
    context->set_job_id(job_id_);
    context->set_generation(generation_);
    context->set_rank(rank);
    context->set_incarnation(static_cast<uint64_t>(rank) + 1);
    return call;
  }

  // Frees the call before reporting it, so no call outlives its batch.
  template <typename CallType>
  static void Finish(CallType* call, Batch* batch, const std::string& wrong) {
    const int rank = call->rank;
    delete call;
    batch->Done(rank, wrong);
  }

  WorkerService::StubInterface::async_interface* Stub(int rank) const {
    return stubs_[static_cast<size_t>(rank) % stubs_.size()]->async();
  }

  const std::vector<std::unique_ptr<WorkerService::Stub>>& stubs_;
  const std::string job_id_;
  const int64_t generation_;
  const int world_;
  const absl::Duration timeout_;
};

absl::StatusOr<WaitersResult> RunKind(
    WaitKind kind, int n, coordinator::CoordinatorServer& server,
    const std::vector<std::unique_ptr<WorkerService::Stub>>& stubs, absl::Duration timeout) {
  coordinator::Coordination& coordination = server.coordination();
  coordinator::JobLayout layout;
  layout.world_size = n + 1;
  auto job = coordination.CreateJob(std::move(layout));
  if (!job.ok()) return job.status();
  // Two timeouts: one to get every wait pending, one to release them.
  Ranks ranks(stubs, job->layout.job_id, job->generation, n + 1, 2 * timeout);

  if (kind != WaitKind::kJoin) {
    Batch joins(n + 1);
    for (int r = 0; r <= n; ++r) ranks.Join(r, &joins);
    joins.Wait(ranks.wait_limit());
    if (absl::Status s = joins.status("joining before the wait"); !s.ok()) return s;
  }

  WaitersResult result;
  result.kind = kind;
  result.ranks = n;
  const int64_t base = static_cast<int64_t>(coordination.PendingWaits());
  // Hand memory freed by earlier kinds back to the kernel, so that this
  // kind's RSS growth is its own and not hidden by reuse of a grown heap.
  malloc_trim(0);
  result.before = ReadProcessStats();

  Batch waits(n);
  const SteadyClock::time_point start = SteadyClock::now();
  for (int r = 0; r < n; ++r) {
    switch (kind) {
      case WaitKind::kJoin:
        ranks.Join(r, &waits);
        break;
      case WaitKind::kBarrier:
        ranks.Barrier(r, &waits);
        break;
      case WaitKind::kGet:
        ranks.Get(r, &waits);
        break;
    }
  }
  // Polling, not a hook: the coordinator's count is what is being checked.
  const SteadyClock::time_point poll_end = start + absl::ToChronoNanoseconds(timeout);
  int64_t pending = 0;
  while ((pending = static_cast<int64_t>(coordination.PendingWaits()) - base) < n &&
         !waits.failed() && SteadyClock::now() < poll_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  result.hold_s = Seconds(SteadyClock::now() - start);
  result.pending = pending;
  result.holding = ReadProcessStats();

  // Release whatever happened above, so that no call is left behind.
  Batch release(1);
  const SteadyClock::time_point release_start = SteadyClock::now();
  switch (kind) {
    case WaitKind::kJoin:
      ranks.Join(n, &release);
      break;
    case WaitKind::kBarrier:
      ranks.Barrier(n, &release);
      break;
    case WaitKind::kGet:
      ranks.Set(n, &release);
      break;
  }
  waits.Wait(ranks.wait_limit());
  release.Wait(ranks.wait_limit());
  result.release_s = Seconds(std::max(waits.last(), release.last()) - release_start);
  result.after = ReadProcessStats();
  result.completed = waits.ok() + release.ok();
  result.rss_per_wait_bytes =
      static_cast<double>(result.holding.rss_bytes - result.before.rss_bytes) / n;

  const std::string what = absl::StrCat(WaitKindName(kind), " waiters");
  if (absl::Status s = waits.status(what); !s.ok()) return s;
  if (absl::Status s = release.status(absl::StrCat(what, ", releasing")); !s.ok()) return s;
  if (pending != n) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": ", pending, " of ", n,
                                                    " waits were pending after ",
                                                    absl::FormatDuration(timeout)));
  }
  return result;
}

}  // namespace

const char* WaitKindName(WaitKind kind) {
  switch (kind) {
    case WaitKind::kJoin:
      return "join";
    case WaitKind::kBarrier:
      return "barrier";
    case WaitKind::kGet:
      return "get";
  }
  return "?";
}

absl::StatusOr<WaitKind> ParseWaitKind(const std::string& name) {
  for (WaitKind kind : {WaitKind::kJoin, WaitKind::kBarrier, WaitKind::kGet}) {
    if (name == WaitKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown wait kind '", name, "'; use join, barrier or get"));
}

absl::StatusOr<WaitersBenchResult> RunWaitersBench(const WaitersBenchOptions& options) {
  if (options.ranks < 1 || options.ranks >= (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks must be in 1..", (1 << 20) - 1, "; got ", options.ranks));
  }
  if (options.channels < 1 || options.channels > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels must be in 1..1024; got ", options.channels));
  }
  if (options.kinds.empty() || options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("need at least one kind and a positive timeout");
  }

  // Declared first so that it outlives the channels and every call.
  auto server = StartBenchCoordinator(/*ranks_heartbeat=*/false);
  if (!server.ok()) return server.status();
  WaitersBenchResult result;
  result.coordinator = (*server)->address();
  result.channels = options.channels;
  result.load_average = LoadAverage();
  const auto channels = MakeConnections(result.coordinator, options.channels);
  if (absl::Status s = Connect(channels, absl::Seconds(10)); !s.ok()) {
    return absl::UnavailableError(absl::StrCat(result.coordinator, ": ", s.message()));
  }
  std::vector<std::unique_ptr<WorkerService::Stub>> stubs;
  for (const auto& channel : channels) stubs.push_back(WorkerService::NewStub(channel));

  for (WaitKind kind : options.kinds) {
    auto one = RunKind(kind, options.ranks, **server, stubs, options.timeout);
    if (!one.ok()) return one.status();
    result.kinds.push_back(*std::move(one));
  }
  return result;
}

nlohmann::json ToJson(const WaitersBenchResult& result) {
  nlohmann::json kinds = nlohmann::json::array();
  for (const WaitersResult& k : result.kinds) {
    kinds.push_back({{"kind", WaitKindName(k.kind)},
                     {"ranks", k.ranks},
                     {"pending", k.pending},
                     {"completed", k.completed},
                     {"before", ToJson(k.before)},
                     {"holding", ToJson(k.holding)},
                     {"after", ToJson(k.after)},
                     {"hold_s", k.hold_s},
                     {"release_s", k.release_s},
                     {"rss_per_wait_bytes", k.rss_per_wait_bytes}});
  }
  return {{"benchmark", "waiters"},
          {"coordinator", result.coordinator},
          {"channels", result.channels},
          {"load_average", result.load_average},
          {"kinds", kinds}};
}

}  // namespace mesh::bench
