// ProcessGroupGloo::State: the threads, queues and gloo context behind one
// Gloo process group (internal).
//
//   caller ──AllReduce()──▶ validate ──▶ queue_ ──▶ worker thread: run, Complete(work)
//   caller ──Send()/Recv()─▶ validate, post to gloo ──▶ p2p_ ──▶ p2p thread: wait, Complete(work)
//
// Lifecycle:
//
//   RUNNING ──Abort(reason) / an op fails──▶ ABORTED ──Shutdown()──▶ STOPPED
//      └──────────────────Shutdown()──────────────────────────────────┘
//
// ABORTED: queued ops failed with the reason, the running op unwinds within
// milliseconds (GlooContext::Abort), every later op fails synchronously.
// Shutdown() aborts (CANCELLED) if needed and joins both threads; the gloo
// context is destroyed only after that, so no thread ever sees it die.
//
// Thread safety: thread-safe. The worker and p2p threads use `this` raw;
// ProcessGroupGloo's destructor calls Shutdown() before the State can go.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/gloo/gloo_context.h"
#include "backends/gloo/gloo_staging.h"
#include "backends/gloo/shm_group.h"
#include "mesh/process_group_gloo.h"
#include "work_impl.h"

namespace mesh {

class ProcessGroupGloo::State : public std::enable_shared_from_this<ProcessGroupGloo::State> {
 public:
  // `context` is null for a group of one (every op is local then);
  // `rendezvous_store` is kept alive for as long as the context. `shm` is
  // null unless the group runs its collectives through shared memory.
  State(int rank, std::vector<int> global_ranks, std::string name, GlooOptions options,
        std::shared_ptr<gloo_backend::GlooContext> context,
        std::shared_ptr<::gloo::rendezvous::Store> rendezvous_store,
        std::unique_ptr<gloo_backend::ShmGroup> shm);
  ~State();

  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Starts the worker thread. Call once, right after construction.
  void Start();

  // Queues a collective. `run` executes on the worker thread and may throw
  // gloo's exceptions. Fails synchronously with the abort reason once the
  // group is aborted.
  absl::StatusOr<ProcessGroup::WorkPtr> Enqueue(std::string op, std::function<absl::Status()> run);

  // Posts a send (or a receive into `into`) of `tensor` now and completes it
  // on the p2p thread. `tensor`'s elements must already be validated.
  absl::StatusOr<ProcessGroup::WorkPtr> PostPointToPoint(bool send, const Tensor& tensor, int peer,
                                                         int tag);

  void Abort(absl::Status reason);
  absl::Status health() const;
  // Idempotent.
  void Shutdown();

  // "gloo group 'world' rank 0/2: all_reduce".
  std::string Describe(absl::string_view op) const;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  const GlooOptions& options() const { return options_; }
  // Gloo's per-wait timeout, capped so that gloo's now() + timeout cannot
  // overflow.
  std::chrono::milliseconds op_timeout() const;
  // The group's gloo context; null for a group of one.
  const std::shared_ptr<gloo_backend::GlooContext>& context() const { return context_; }
  // The shared-memory path, or null.
  gloo_backend::ShmGroup* shm() const { return shm_.get(); }

 private:
  struct QueuedOp {
    std::string op;
    std::function<absl::Status()> run;
    std::shared_ptr<internal::HostWork> work;
  };
  struct PendingPointToPoint {
    bool send = false;
    std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
    gloo_backend::Staged staged;  // A receive's destination.
    std::shared_ptr<internal::HostWork> work;
  };

  std::shared_ptr<internal::HostWork> NewWork();
  void WorkerLoop();
  void PointToPointLoop();
  // The status an op ends with: the abort reason once aborted (waiting up
  // to abort_grace for one when `status` is UNAVAILABLE); else `status`,
  // which aborts the group when it is an error.
  absl::Status Finish(absl::Status status);

  const int rank_;
  const std::vector<int> global_ranks_;
  const std::string name_;
  const GlooOptions options_;
  const std::shared_ptr<::gloo::rendezvous::Store> rendezvous_store_;
  const std::shared_ptr<gloo_backend::GlooContext> context_;
  const std::unique_ptr<gloo_backend::ShmGroup> shm_;

  mutable absl::Mutex mu_;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<QueuedOp> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<PendingPointToPoint> p2p_ ABSL_GUARDED_BY(mu_);
  std::thread worker_ ABSL_GUARDED_BY(mu_);
  std::thread p2p_thread_ ABSL_GUARDED_BY(mu_);

  // Serializes posting of sends and receives: their order defines how they
  // match the peer's.
  absl::Mutex post_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace mesh
