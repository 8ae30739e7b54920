// The NCCL process group's machinery. Private to libmesh; compiled only when
// MESH_HAVE_NCCL.
//
// Three objects, split by who may hold them and where they may die:
//
//   NcclGroup (the ProcessGroupNccl users hold)
//     │ owns the teardown: ~NcclGroup finalizes or aborts the communicator
//     │ and frees the stream, so that heavy, possibly blocking CUDA and NCCL
//     │ calls only run on user threads
//     ▼
//   GroupCore (shared by the NcclGroup, its Works and the watchdog)
//     │ the communicator, the issue lock, the pending-op queue, the abort
//     │ state; its destructor makes no blocking call, so the watchdog may
//     │ drop the last reference
//     ▼
//   PendingOp (shared by one Work and the core's queue)
//       one op's completion event and final status
//
// Lock order: GroupCore::issue_mu_ → GroupCore::ops_mu_; GroupCore::state_mu_
// and EventPool::mu_ are leaves. A PendingOp's result is set once, lock-free.
//
// Every NCCL and CUDA call goes through the NcclApi the group was made with
// (backends/nccl/nccl_api.h), which must outlive it.
//
// A group's communicator, from the core's point of view:
//
//   LIVE ──Abort / watchdog / failed issue or split──▶ ABORTING ──▶ RELEASED
//    │                                                   │   ncclCommAbort once no
//    │                                                   │   split child of it is
//    │                                                   │   still unpublished
//    └──Close: ncclCommFinalize, ncclCommDestroy ────────┴──────────▶ RELEASED
//
// A split (or shrink) that fails before NCCL has published the child (deadline,
// cancellation, a parent error; see AwaitSplit) leaves NCCL's split job
// running on the parent and writing to the child slot later. The core then
// keeps the slot, fails the group's ops at once, and defers the parent's
// ncclCommAbort until the slot is written: the watchdog (or Close, within its
// destroy timeout) aborts the parent, then the late child, then frees the
// slot. The parent always goes first, for a published child too: after a
// failed child init NCCL's parent keeps a pointer to the child's abort flags
// and writes them when aborted, so the child's abort (which frees them) must
// come after. If NCCL never publishes, the communicator, the slot and the
// group's stream, event and barrier buffer stay allocated for the life of the
// process rather than being released under a possible writer (an NCCL thread
// of the split job stays blocked with them).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/nccl/nccl_api.h"
#include "backends/nccl/nccl_checks.h"
#include "mesh/process_group_nccl.h"
#include "mesh/tensor.h"

namespace mesh::nccl {

class Watchdog;

// A free list of completion events (cudaEventDisableTiming) of one device.
// Recording an event costs far less than creating one, and an op needs one.
// Thread-safe. The destructor destroys the pooled events; it runs when the
// last PendingOp holding the pool is gone, so every event is back by then.
// EventPool's lock. Its critical sections are one vector push or pop, and
// it is taken twice per op (acquire at issue, release when the op is
// dropped), so a spin beats absl::Mutex, whose debug-mode deadlock
// detection (on in Debian's abseil) costs more than the work it guards.
class ABSL_LOCKABLE SpinLock {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

class ABSL_SCOPED_LOCKABLE SpinLockHolder {
 public:
  explicit SpinLockHolder(SpinLock* lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(lock) : lock_(lock) {
    lock_->Lock();
  }
  ~SpinLockHolder() ABSL_UNLOCK_FUNCTION() { lock_->Unlock(); }
  SpinLockHolder(const SpinLockHolder&) = delete;
  SpinLockHolder& operator=(const SpinLockHolder&) = delete;

 private:
  SpinLock* const lock_;
};

class EventPool {
 public:
  EventPool(NcclApi& api, int device) : api_(api), device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // Possible errors: INTERNAL/RESOURCE_EXHAUSTED from cudaEventCreate.
  absl::StatusOr<cudaEvent_t> Acquire();
  void Release(cudaEvent_t event);

  NcclApi& api() const { return api_; }

 private:
  NcclApi& api_;
  const int device_;
  SpinLock mu_;
  std::vector<cudaEvent_t> free_ ABSL_GUARDED_BY(mu_);
};

// What an op's messages say about it, captured at issue without formatting
// or allocating (shapes of up to 4 dims stay inline), and formatted only
// when a message needs it:
//   "<op> #<seq> (<in>[ -> <out>][, <reduce>][<peer_label><peer>][, tag
//   <tag>][<suffix>])", or "<op> #<seq> (<fixed>)".
// Every string_view must point to static storage.
struct OpFacts {
  struct TensorFacts {
    DType dtype = DType::kFloat32;
    absl::InlinedVector<int64_t, 4> shape;
  };
  static TensorFacts Of(const Tensor& t) {
    return TensorFacts{t.dtype(),
                       absl::InlinedVector<int64_t, 4>(t.shape().begin(), t.shape().end())};
  }

  // Every member has an initializer, so designated initializers may name
  // only the ones they set.
  absl::string_view fixed = {};  // Replaces everything else when set.
  std::optional<TensorFacts> in = {};
  std::optional<TensorFacts> out = {};
  absl::string_view reduce = {};      // ReduceOpName.
  absl::string_view peer_label = {};  // ", root ", " to ", " from ".
  int peer = 0;
  std::optional<int> tag = {};
  absl::string_view suffix = {};  // ", equal splits".

  // "float32[1024], sum".
  std::string Detail() const;
};

// One issued op: the stream it ran on, its completion event and, once
// known, its final status. Thread-safe.
class PendingOp {
 public:
  // `done` comes from `pool` and goes back to it on destruction; it is
  // recorded on `stream` behind the op. `op` points to static storage.
  PendingOp(absl::string_view op, uint64_t seq, OpFacts facts, absl::Time issued,
            cudaStream_t stream, cudaEvent_t done, std::shared_ptr<EventPool> pool);
  ~PendingOp();
  PendingOp(const PendingOp&) = delete;
  PendingOp& operator=(const PendingOp&) = delete;

  // "all_reduce #17 (float32[1024], sum)", for messages; formatted on each
  // call.
  std::string description() const;
  absl::Time issued() const { return issued_; }
  cudaStream_t stream() const { return stream_; }
  cudaEvent_t done() const { return done_; }

  // Sets the final status unless one is set already; returns the final one.
  absl::Status Finish(absl::Status status);
  // The final status, if known.
  std::optional<absl::Status> result() const;
  // result(), after asking the event: a completed event makes the op OK, a
  // failed query (a broken device) makes it INTERNAL. Never blocks.
  std::optional<absl::Status> Poll();

 private:
  enum State : int { kPending, kSetting, kFinished };

  const absl::string_view op_;
  const uint64_t seq_;
  const OpFacts facts_;
  const absl::Time issued_;
  const cudaStream_t stream_;
  const cudaEvent_t done_;
  const std::shared_ptr<EventPool> pool_;
  // Set once, without a lock: the thread that moves state_ from kPending
  // to kSetting writes result_, then publishes it with kFinished (release);
  // result_ is read only after an acquire load sees kFinished. A racing
  // Finish waits out the short kSetting window.
  std::atomic<int> state_{kPending};
  absl::Status result_;
};

// The state of one group shared by the group, its Works and the watchdog.
// Thread-safe.
class GroupCore : public std::enable_shared_from_this<GroupCore> {
 public:
  struct Params {
    std::string name;
    int rank = 0;
    int size = 1;
    int device = 0;
    ProcessGroupOptions options;
    NcclCaps caps;
    NcclStreamMode stream_mode = NcclStreamMode::kGroupStream;
  };

  // Takes ownership of every handle; Close() releases them. `api` must
  // outlive the core.
  GroupCore(NcclApi& api, Params params, ncclComm_t comm, cudaStream_t stream, cudaEvent_t ready,
            void* scratch);
  // Makes no blocking call; Close() must have run (NcclGroup guarantees it).
  ~GroupCore();

  const Params& params() const { return params_; }
  NcclApi& api() const { return api_; }
  cudaStream_t stream() const { return stream_; }
  // 4 device bytes the barrier all-reduces.
  void* scratch() const { return scratch_; }
  // "group 'mesh/tp/1' (rank 2 of 4, cuda:0)".
  const std::string& what() const { return what_; }

  // Issues one op on the stream params.stream_mode picks: the group stream
  // (ordered after the caller's current stream by an event) or the caller's
  // current stream itself. Runs `enqueue(comm, stream)` (the NCCL call or
  // calls; it returns NCCL's result), waits out ncclInProgress (bounded by
  // options.timeout), and records the completion event on that stream.
  // `op` (static storage) and `facts` describe the op in messages. Returns
  // the synchronous error (the group's abort reason when already aborted; a
  // CUDA error before anything was issued) or a Work. A failure after the
  // group's stream was touched aborts the group and returns a Work that has
  // failed with the reason.
  absl::StatusOr<ProcessGroup::WorkPtr> Launch(
      absl::string_view op, OpFacts facts,
      absl::FunctionRef<ncclResult_t(ncclComm_t, cudaStream_t)> enqueue);

  // ncclCommSplit of this group's communicator (a collective over all its
  // members) with `color` and `key`; waits (AwaitSplit) until NCCL has
  // published the child and both communicators are ready. A failure of the
  // split leaves this communicator unusable (NCCL records it as its
  // asynchronous error, and peers may have finished the collective), so it
  // aborts this group too, deferring ncclCommAbort while the child is
  // unpublished (see the file comment). Blocks Abort() for at most one poll.
  // `child_name` is a PersistentName (NCCL keeps the pointer).
  // Possible errors: DEADLINE_EXCEEDED, NCCL's errors, `cancelled()`'s
  // status, this group's abort reason, FAILED_PRECONDITION when NCCL has no
  // ncclCommSplit.
  absl::StatusOr<ncclComm_t> Split(int color, int key, const char* child_name,
                                   absl::string_view child_what, absl::Time deadline,
                                   absl::FunctionRef<absl::Status()> cancelled);

  // ncclCommShrink of this group's communicator without the group ranks in
  // `exclude` (sorted, distinct, not this rank), with NCCL_SHRINK_ABORT: a
  // collective among the remaining members only, which first ends any op of
  // this communicator still in flight. The child keeps the members' order.
  // Waits, fails and aborts this group exactly as Split does (NCCL publishes
  // a shrunk child the way it publishes a split one).
  // Possible errors: Split's, INVALID_ARGUMENT for a bad `exclude`,
  // FAILED_PRECONDITION when NCCL has no ncclCommShrink (before 2.27).
  absl::StatusOr<ncclComm_t> Shrink(std::vector<int> exclude, const char* child_name,
                                    absl::string_view child_what, absl::Time deadline,
                                    absl::FunctionRef<absl::Status()> cancelled);

  // See ProcessGroup::Abort. Waits for an op being issued to notice, so it
  // blocks for at most one poll interval of that op, never on peers.
  void Abort(absl::Status reason);
  absl::Status health() const;

  // One watchdog pass: retires completed ops, aborts the group when the
  // oldest pending op is older than options.timeout or the communicator
  // reports an asynchronous error, and finishes a deferred abort once the
  // split child it waited for is published. Never blocks on issue_mu_.
  void WatchdogTick(absl::Time now);

  // Finalizes the communicator (waiting up to `destroy_timeout` for issued
  // ops to drain), destroys it, or aborts it when draining fails; then frees
  // the stream, the ready event and the scratch buffer. Ops still pending
  // after an abort fail. A deferred abort waits up to `destroy_timeout` for
  // the split child to be published, and otherwise leaves the communicator
  // and the slot allocated. Blocking; called once, by ~NcclGroup or a failed
  // creation.
  void Close(absl::Duration destroy_timeout);

 private:
  // Split and Shrink: `start(parent, slot, config)` launches NCCL's child
  // job (`call`, a `kind` in messages), then the wait and the failure
  // handling described at Split.
  absl::StatusOr<ncclComm_t> MakeChild(
      const char* call, const char* kind, const char* child_name, absl::string_view child_what,
      absl::Time deadline, absl::FunctionRef<absl::Status()> cancelled,
      absl::FunctionRef<ncclResult_t(ncclComm_t, ncclComm_t*, ncclConfig_t*)> start);
  // Records `reason` as the abort reason unless one is recorded.
  void SetAbortReason(absl::Status reason) ABSL_LOCKS_EXCLUDED(state_mu_);
  // Fails pending ops with the abort reason (those already complete
  // succeed), then ReleaseCommLocked. The reason must be set.
  void AbortLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);
  // ncclCommAbort of the communicator, unless a split child of it is still
  // unpublished: then nothing, and a later call finishes it. Once the child
  // is published, aborts it first and frees its slot.
  void ReleaseCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);
  // Gives up on a communicator whose abort is still deferred: it and the
  // split slot are left allocated, never released under a possible writer.
  void AbandonCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);
  // Drops completed ops from the front of the queue. Ops on one stream
  // complete in issue order, so once the newest op is complete every older
  // op on its stream is, and is finished without a query of its own.
  void RetireCompletedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);
  // Launch retires ops itself (one cudaEventQuery each) only once this many
  // are queued, and then on every kRetireOnIssueEvery-th op; below it the
  // watchdog does, off the issuing thread. The queue stays bounded because
  // CUDA bounds how far a stream's queue runs ahead of the device.
  static constexpr size_t kRetireOnIssueAt = 256;
  static constexpr uint64_t kRetireOnIssueEvery = 32;
  // The abort reason while aborting, else OK; the cancellation test of
  // every poll this group makes.
  absl::Status Cancelled() const;

  NcclApi& api_;
  const Params params_;
  const std::string what_;
  cudaStream_t stream_;
  cudaEvent_t ready_;
  void* scratch_;
  const std::shared_ptr<EventPool> events_;

  // Set (release) before issue_mu_ is taken to abort, so a thread polling an
  // op inside issue_mu_ gives up at its next poll.
  std::atomic<bool> aborting_{false};

  // Serializes every NCCL call on comm_ (NCCL requires it, and a
  // non-blocking call must be polled to completion before the next).
  absl::Mutex issue_mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(issue_mu_);
  bool closed_ ABSL_GUARDED_BY(issue_mu_) = false;
  // The slot of a split that failed before NCCL published its child; NCCL's
  // split job still owns it. Null when there is none.
  ncclComm_t* unpublished_split_ ABSL_GUARDED_BY(issue_mu_) = nullptr;
  uint64_t next_seq_ ABSL_GUARDED_BY(issue_mu_) = 0;

  // Issued ops not yet known complete, oldest first. Ops of one stream
  // complete in order, so the front is the one the watchdog times.
  absl::Mutex ops_mu_ ABSL_ACQUIRED_AFTER(issue_mu_);
  std::deque<std::shared_ptr<PendingOp>> pending_ ABSL_GUARDED_BY(ops_mu_);

  mutable absl::Mutex state_mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(state_mu_);
};

// The Work of an NCCL op (stream semantics; see mesh/process_group_nccl.h).
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<GroupCore> core, std::shared_ptr<PendingOp> op)
      : core_(std::move(core)), op_(std::move(op)) {}

  absl::Status Wait(absl::Duration timeout) override;
  bool IsCompleted() const override;
  absl::Status status() const override;
  void Abort(absl::Status reason) override;

 protected:
  absl::Duration default_timeout() const override { return core_->params().options.timeout; }

 private:
  const std::shared_ptr<GroupCore> core_;
  const std::shared_ptr<PendingOp> op_;
};

// The ProcessGroupNccl users hold. Thread-safe.
class NcclGroup final : public ProcessGroupNccl {
 public:
  // Wraps an initialized communicator: creates the group's stream, ready
  // event and scratch buffer on params.device and registers the core with
  // `watchdog`. On failure the communicator is aborted. `api` must outlive
  // the group.
  static absl::StatusOr<std::shared_ptr<NcclGroup>> Create(NcclApi& api, GroupCore::Params params,
                                                           std::vector<int> global_ranks,
                                                           ncclComm_t comm,
                                                           std::shared_ptr<Watchdog> watchdog,
                                                           absl::Duration destroy_timeout);
  ~NcclGroup() override;

  const std::shared_ptr<GroupCore>& core() const { return core_; }
  void* stream() const override { return core_->stream(); }

  absl::StatusOr<WorkPtr> AllReduce(Tensor tensor, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllReduce(Tensor input, Tensor output, ReduceOp op) override;
  absl::StatusOr<WorkPtr> Broadcast(Tensor tensor, int root) override;
  absl::StatusOr<WorkPtr> Reduce(Tensor tensor, int root, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllGather(Tensor input, Tensor output) override;
  absl::StatusOr<WorkPtr> ReduceScatter(Tensor input, Tensor output, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllToAll(Tensor input, Tensor output,
                                   std::vector<int64_t> input_splits = {},
                                   std::vector<int64_t> output_splits = {}) override;
  absl::StatusOr<WorkPtr> Send(Tensor tensor, int peer, int tag = 0) override;
  absl::StatusOr<WorkPtr> Recv(Tensor tensor, int peer, int tag = 0) override;
  absl::StatusOr<WorkPtr> Barrier() override;
  void Abort(absl::Status reason) override { core_->Abort(std::move(reason)); }
  absl::Status health() const override { return core_->health(); }

 private:
  NcclGroup(const GroupCore::Params& params, std::vector<int> global_ranks,
            std::shared_ptr<GroupCore> core, std::shared_ptr<Watchdog> watchdog,
            absl::Duration destroy_timeout);

  GroupView View() const;

  // The reductions from `input` into `output` (out-of-place all_reduce,
  // reduce_scatter): the tensor, dtype and reduction checks plus `sizes`
  // (the op's element-count rule), then `call(send, recv, count, type, red,
  // comm, stream)` with count = output's elements, through Launch.
  using ReductionCall = ncclResult_t (NcclApi::*)(const void*, void*, size_t, ncclDataType_t,
                                                  ncclRedOp_t, ncclComm_t, cudaStream_t);
  absl::StatusOr<WorkPtr> LaunchReduction(absl::string_view op, const Tensor& input,
                                          const Tensor& output, ReduceOp reduce_op,
                                          absl::FunctionRef<absl::Status(const GroupView&)> sizes,
                                          ReductionCall call);

  const std::shared_ptr<GroupCore> core_;
  // Keeps the watchdog thread alive while the group lives.
  const std::shared_ptr<Watchdog> watchdog_;
  const absl::Duration destroy_timeout_;
};

}  // namespace mesh::nccl
