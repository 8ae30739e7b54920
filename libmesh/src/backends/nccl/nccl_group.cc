// Over 800 lines on purpose: the event pool, the pending-op records, the
// group core (communicator, streams, retirement), NcclWork and NcclGroup
// share one set of private types and invariants about a communicator's
// lifetime (docs/nccl.md). Splitting them would turn those invariants into
// cross-file friend declarations; each has a section of its own below.

#include "backends/nccl/nccl_group.h"

#include <algorithm>
#include <thread>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/nccl/nccl_util.h"
#include "backends/nccl/nccl_watchdog.h"
#include "common/check.h"
#include "common/duration_format.h"
#include "mesh/cuda_stream.h"

namespace mesh::nccl {
namespace {

absl::Status WithPrefix(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

void AppendTensor(std::string& out, const OpFacts::TensorFacts& t) {
  absl::StrAppend(&out, DTypeName(t.dtype), "[", absl::StrJoin(t.shape, ", "), "]");
}

char* Bytes(const Tensor& t) { return static_cast<char*>(t.data()); }

}  // namespace

// ---- EventPool -------------------------------------------------------------

EventPool::~EventPool() {
  DeviceGuard guard(api_, device_);
  SpinLockHolder lock(&mu_);
  // An event whose last record has not completed is released by CUDA once
  // it does; cudaEventDestroy does not block.
  for (cudaEvent_t event : free_) api_.EventDestroy(event);
}

absl::StatusOr<cudaEvent_t> EventPool::Acquire() {
  {
    SpinLockHolder lock(&mu_);
    if (!free_.empty()) {
      cudaEvent_t event = free_.back();
      free_.pop_back();
      return event;
    }
  }
  DeviceGuard guard(api_, device_);  // Events belong to the device current at creation.
  if (!guard.status().ok()) return guard.status();
  cudaEvent_t event = nullptr;
  if (cudaError_t err = api_.EventCreateWithFlags(&event, cudaEventDisableTiming);
      err != cudaSuccess) {
    return CudaError(api_, "cudaEventCreateWithFlags", err);
  }
  return event;
}

void EventPool::Release(cudaEvent_t event) {
  if (event == nullptr) return;
  SpinLockHolder lock(&mu_);
  free_.push_back(event);
}

// ---- OpFacts and PendingOp ---------------------------------------------------

std::string OpFacts::Detail() const {
  if (!fixed.empty()) return std::string(fixed);
  std::string text;
  if (in.has_value()) AppendTensor(text, *in);
  if (out.has_value()) {
    text += " -> ";
    AppendTensor(text, *out);
  }
  if (!reduce.empty()) absl::StrAppend(&text, ", ", reduce);
  if (!peer_label.empty()) absl::StrAppend(&text, peer_label, peer);
  if (tag.has_value()) absl::StrAppend(&text, ", tag ", *tag);
  absl::StrAppend(&text, suffix);
  return text;
}

PendingOp::PendingOp(absl::string_view op, uint64_t seq, OpFacts facts, absl::Time issued,
                     cudaStream_t stream, cudaEvent_t done, std::shared_ptr<EventPool> pool)
    : op_(op),
      seq_(seq),
      facts_(std::move(facts)),
      issued_(issued),
      stream_(stream),
      done_(done),
      pool_(std::move(pool)) {}

PendingOp::~PendingOp() { pool_->Release(done_); }

std::string PendingOp::description() const {
  return absl::StrCat(op_, " #", seq_, " (", facts_.Detail(), ")");
}

absl::Status PendingOp::Finish(absl::Status status) {
  int expected = kPending;
  if (state_.compare_exchange_strong(expected, kSetting, std::memory_order_acquire)) {
    result_ = std::move(status);
    state_.store(kFinished, std::memory_order_release);
    return result_;
  }
  // Another thread is setting it: a few instructions away.
  while (state_.load(std::memory_order_acquire) != kFinished) std::this_thread::yield();
  return result_;
}

std::optional<absl::Status> PendingOp::result() const {
  if (state_.load(std::memory_order_acquire) != kFinished) return std::nullopt;
  return result_;
}

std::optional<absl::Status> PendingOp::Poll() {
  if (std::optional<absl::Status> known = result(); known.has_value()) return known;
  // cudaEventQuery needs no particular current device.
  NcclApi& api = pool_->api();
  const cudaError_t err = api.EventQuery(done_);
  if (err == cudaErrorNotReady) return std::nullopt;
  if (err == cudaSuccess) return Finish(absl::OkStatus());
  return Finish(CudaError(api, absl::StrCat("cudaEventQuery for ", description()), err));
}

// ---- GroupCore -------------------------------------------------------------

GroupCore::GroupCore(NcclApi& api, Params params, ncclComm_t comm, cudaStream_t stream,
                     cudaEvent_t ready, void* scratch)
    : api_(api),
      params_(std::move(params)),
      what_(absl::StrCat("NCCL group '", params_.name, "' (rank ", params_.rank, " of ",
                         params_.size, ", cuda:", params_.device, ")")),
      stream_(stream),
      ready_(ready),
      scratch_(scratch),
      events_(std::make_shared<EventPool>(api, params_.device)),
      comm_(comm) {}

GroupCore::~GroupCore() {
  // NcclGroup always closes; this is the last line of defence for a core
  // that leaked past it, and it must not block (it may run on the watchdog).
  absl::MutexLock lock(&issue_mu_);
  ReleaseCommLocked();
  if (comm_ != nullptr) AbandonCommLocked();
}

void GroupCore::AbandonCommLocked() {
  // NCCL may still write the slot and run its split job on comm_, so both
  // stay allocated for the life of the process.
#if defined(__SANITIZE_ADDRESS__)
  __lsan_ignore_object(unpublished_split_);
#endif
  comm_ = nullptr;
  unpublished_split_ = nullptr;
}

absl::Status GroupCore::health() const {
  absl::MutexLock lock(&state_mu_);
  return abort_reason_;
}

absl::Status GroupCore::Cancelled() const {
  if (!aborting_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::Status reason = health();
  return reason.ok() ? absl::AbortedError(absl::StrCat(what_, " is being aborted")) : reason;
}

void GroupCore::SetAbortReason(absl::Status reason) {
  {
    absl::MutexLock lock(&state_mu_);
    if (abort_reason_.ok()) abort_reason_ = std::move(reason);
  }
  aborting_.store(true, std::memory_order_release);
}

void GroupCore::Abort(absl::Status reason) {
  if (reason.ok()) {
    reason = absl::AbortedError(absl::StrCat(what_, " was aborted without a reason"));
  }
  SetAbortReason(std::move(reason));
  absl::MutexLock lock(&issue_mu_);
  AbortLocked();
}

void GroupCore::AbortLocked() {
  const absl::Status reason = health();
  std::deque<std::shared_ptr<PendingOp>> ops;
  {
    absl::MutexLock lock(&ops_mu_);
    ops.swap(pending_);
  }
  // Settle every pending op before ncclCommAbort: aborting makes NCCL's
  // kernels exit early, which completes their events, and an op queried
  // after that would pass for a success.
  for (const std::shared_ptr<PendingOp>& op : ops) {
    op->Poll();
    op->Finish(reason).IgnoreError();
  }
  ReleaseCommLocked();
}

void GroupCore::ReleaseCommLocked() {
  if (comm_ == nullptr) return;
  DeviceGuard guard(api_, params_.device);
  ncclComm_t late = nullptr;
  if (unpublished_split_ != nullptr) {
    late = LoadPublished(unpublished_split_);
    // NCCL's split job is still running on comm_ and will write the slot;
    // released now, NCCL would write into freed memory.
    if (late == nullptr) return;
  }
  // Also joins any NCCL job still running for this communicator (an
  // abandoned init or lazy connection). Before the late child: a parent
  // whose child's init failed still points at the child's abort flags.
  api_.CommAbort(comm_);
  comm_ = nullptr;
  if (late != nullptr) {
    api_.CommAbort(late);
    delete unpublished_split_;
    unpublished_split_ = nullptr;
  }
}

void GroupCore::RetireCompletedLocked() {
  if (pending_.empty()) return;
  // One query for the newest op stands for every older op of its stream.
  const std::shared_ptr<PendingOp>& newest = pending_.back();
  std::optional<absl::Status> last = newest->Poll();
  if (last.has_value() && last->ok()) {
    for (const std::shared_ptr<PendingOp>& op : pending_) {
      if (op->stream() == newest->stream()) op->Finish(absl::OkStatus()).IgnoreError();
    }
  }
  while (!pending_.empty() && pending_.front()->Poll().has_value()) pending_.pop_front();
}

absl::StatusOr<ProcessGroup::WorkPtr> GroupCore::Launch(
    absl::string_view op, OpFacts facts,
    absl::FunctionRef<ncclResult_t(ncclComm_t, cudaStream_t)> enqueue) {
  if (absl::Status s = Cancelled(); !s.ok()) return s;
  DeviceGuard guard(api_, params_.device);
  if (!guard.status().ok()) return WithPrefix(absl::StrCat(what_, " ", op), guard.status());
  cudaStream_t caller = static_cast<cudaStream_t>(CurrentCudaStream(Device::Cuda(params_.device)));
  absl::StatusOr<cudaEvent_t> done = events_->Acquire();
  if (!done.ok()) return WithPrefix(absl::StrCat(what_, " ", op), done.status());

  absl::MutexLock lock(&issue_mu_);
  if (comm_ == nullptr || aborting_.load(std::memory_order_acquire)) {
    events_->Release(*done);
    absl::Status reason = Cancelled();
    if (reason.ok()) reason = absl::FailedPreconditionError(absl::StrCat(what_, " is closed"));
    return reason;
  }
  // Ordering: the caller's earlier work on its stream, then the op, then
  // the completion event. On the group stream that takes an event the
  // group stream waits for; recording `ready_` again while an earlier wait
  // on it is still queued is fine, as cudaStreamWaitEvent captures the
  // event's state at the time of the call. A failure here has issued
  // nothing, so it is the caller's synchronous error and the group stays
  // healthy.
  const bool on_caller = params_.stream_mode == NcclStreamMode::kCurrentStream;
  cudaStream_t stream = on_caller ? caller : stream_;
  auto pending = std::make_shared<PendingOp>(op, next_seq_++, std::move(facts), absl::Now(), stream,
                                             *done, events_);
  if (!on_caller) {
    if (cudaError_t err = api_.EventRecord(ready_, caller); err != cudaSuccess) {
      return WithPrefix(absl::StrCat(what_, " ", pending->description()),
                        CudaError(api_,
                                  "cudaEventRecord on the caller's current stream (is it a "
                                  "stream of this group's device?)",
                                  err));
    }
    if (cudaError_t err = api_.StreamWaitEvent(stream_, ready_, 0); err != cudaSuccess) {
      return WithPrefix(absl::StrCat(what_, " ", pending->description()),
                        CudaError(api_, "cudaStreamWaitEvent on the group stream", err));
    }
  }
  absl::Status failure;
  const ncclResult_t r = enqueue(comm_, stream);
  if (r == ncclInProgress) {
    // First use of a peer connection (lazy connect) runs in NCCL's
    // background thread; nothing is on the stream until it is done.
    failure = AwaitComm(api_, comm_, absl::StrCat("issuing ", pending->description()),
                        absl::Now() + params_.options.timeout, [this] { return Cancelled(); });
  } else if (r != ncclSuccess) {
    failure = NcclError(api_, absl::StrCat("issuing ", pending->description()), r, comm_);
  }
  if (failure.ok()) {
    if (cudaError_t err = api_.EventRecord(*done, stream); err != cudaSuccess) {
      failure = CudaError(api_,
                          on_caller ? "cudaEventRecord on the caller's current stream"
                                    : "cudaEventRecord on the group stream",
                          err);
    }
  }
  if (!failure.ok()) {
    // The NCCL call was made (or half made): peers have issued this
    // collective too, and without its completion event nothing can order
    // later work after it, so the group's op order is broken for good.
    SetAbortReason(WithPrefix(absl::StrCat(what_, ": ", pending->description(),
                                           " failed while being issued, so the group was aborted"),
                              failure));
    AbortLocked();
    pending->Finish(health()).IgnoreError();
    return std::make_shared<NcclWork>(shared_from_this(), std::move(pending));
  }
  {
    absl::MutexLock ops_lock(&ops_mu_);
    // Bounds the queue between watchdog passes, polling at most once per
    // kRetireOnIssueEvery ops while the device lags behind.
    if (pending_.size() >= kRetireOnIssueAt && next_seq_ % kRetireOnIssueEvery == 0) {
      RetireCompletedLocked();
    }
    pending_.push_back(pending);
  }
  return std::make_shared<NcclWork>(shared_from_this(), std::move(pending));
}

absl::StatusOr<ncclComm_t> GroupCore::Split(int color, int key, const char* child_name,
                                            absl::string_view child_what, absl::Time deadline,
                                            absl::FunctionRef<absl::Status()> cancelled) {
#if MESH_NCCL_HAS_SPLIT
  return MakeChild("ncclCommSplit", "split", child_name, child_what, deadline, cancelled,
                   [&](ncclComm_t parent, ncclComm_t* slot, ncclConfig_t* config) {
                     return api_.CommSplit(parent, color, key, slot, config);
                   });
#else
  (void)color;
  (void)key;
  (void)child_name;
  (void)deadline;
  (void)cancelled;
  return absl::FailedPreconditionError(absl::StrCat("cannot split ", what_, " into ", child_what,
                                                    ": ncclCommSplit needs NCCL >= 2.19"));
#endif
}

absl::StatusOr<ncclComm_t> GroupCore::Shrink(std::vector<int> exclude, const char* child_name,
                                             absl::string_view child_what, absl::Time deadline,
                                             absl::FunctionRef<absl::Status()> cancelled) {
#if MESH_NCCL_HAS_SHRINK
  if (exclude.empty() || !std::is_sorted(exclude.begin(), exclude.end()) ||
      std::adjacent_find(exclude.begin(), exclude.end()) != exclude.end() || exclude.front() < 0 ||
      exclude.back() >= params_.size ||
      std::binary_search(exclude.begin(), exclude.end(), params_.rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot shrink ", what_, " into ", child_what, ": the excluded ranks [",
                     absl::StrJoin(exclude, ", "), "] must be distinct, sorted, at least one, ",
                     "within the group and without this rank"));
  }
  return MakeChild("ncclCommShrink", "shrink", child_name, child_what, deadline, cancelled,
                   [&](ncclComm_t parent, ncclComm_t* slot, ncclConfig_t* config) {
                     // NCCL_SHRINK_ABORT: ops of the parent still in flight (a collective
                     // that waits for an excluded rank) are ended first.
                     return api_.CommShrink(parent, exclude.data(),
                                            static_cast<int>(exclude.size()), slot, config,
                                            NCCL_SHRINK_ABORT);
                   });
#else
  (void)exclude;
  (void)child_name;
  (void)deadline;
  (void)cancelled;
  return absl::FailedPreconditionError(absl::StrCat("cannot shrink ", what_, " into ", child_what,
                                                    ": ncclCommShrink needs NCCL >= 2.27"));
#endif
}

absl::StatusOr<ncclComm_t> GroupCore::MakeChild(
    const char* call, const char* kind, const char* child_name, absl::string_view child_what,
    absl::Time deadline, absl::FunctionRef<absl::Status()> cancelled,
    absl::FunctionRef<ncclResult_t(ncclComm_t, ncclComm_t*, ncclConfig_t*)> start) {
  DeviceGuard guard(api_, params_.device);
  if (!guard.status().ok()) return guard.status();
  const std::string what = absl::StrCat(call, " of ", what_, " into ", child_what);
  auto cancel = [&]() -> absl::Status {
    if (absl::Status s = Cancelled(); !s.ok()) return s;
    return cancelled();
  };
  absl::MutexLock lock(&issue_mu_);
  if (comm_ == nullptr || aborting_.load(std::memory_order_acquire)) {
    absl::Status reason = Cancelled();
    if (reason.ok()) reason = absl::FailedPreconditionError(absl::StrCat(what_, " is closed"));
    return WithPrefix(what, reason);
  }
  ncclConfig_t config = NonBlockingConfig(child_name);
  // NCCL's child job stores the child here from its own thread, at the end
  // of the child's init, so the slot lives on the heap and is freed only
  // once NCCL has written it (or never started a job).
  auto* slot = new ncclComm_t(nullptr);
  SplitWait wait;
  bool job_started = true;
  const ncclResult_t r = start(comm_, slot, &config);
  if (r == ncclSuccess || r == ncclInProgress) {
    wait = AwaitSplit(api_, comm_, slot, what, deadline, cancel);
  } else {
    // A synchronous failure: NCCL cleaned up and launched no job.
    job_started = false;
    wait.status = NcclError(api_, what, r, comm_, absl::StatusCode::kUnavailable);
  }
  if (wait.status.ok()) {
    delete slot;
    return wait.child;
  }
  const bool published = wait.child != nullptr || !job_started;
  SetAbortReason(absl::Status(
      wait.status.code(),
      absl::StrCat(wait.status.message(), "; the parent ", what_, " is unusable after a failed ",
                   kind,
                   published ? " and was aborted"
                             : absl::StrCat(" and is aborted once NCCL finishes the ", kind))));
  if (published) {
    // The child's init is over (published) or never began, so the slot is
    // ours again. The parent goes first: after a failed child init NCCL's
    // parent still points at the child's abort flags, and aborting the
    // parent writes them, so they must not be freed (by the child's abort)
    // before.
    AbortLocked();
    if (wait.child != nullptr) api_.CommAbort(wait.child);
    delete slot;
  } else {
    unpublished_split_ = slot;  // Still NCCL's; ReleaseCommLocked frees it.
    AbortLocked();
  }
  return wait.status;
}

void GroupCore::WatchdogTick(absl::Time now) {
  if (aborting_.load(std::memory_order_acquire)) {
    // Finishes an abort deferred behind an unpublished split child. TryLock:
    // an aborting thread holds the lock only briefly and finishes itself.
    if (issue_mu_.TryLock()) {
      if (comm_ != nullptr && unpublished_split_ != nullptr) AbortLocked();
      issue_mu_.Unlock();
    }
    return;
  }
  absl::Status reason;
  std::string oldest = "no op";
  {
    absl::MutexLock lock(&ops_mu_);
    while (!pending_.empty()) {
      PendingOp& op = *pending_.front();
      std::optional<absl::Status> result = op.Poll();
      if (result.has_value()) {
        if (!result->ok()) {
          reason = absl::InternalError(absl::StrCat(what_, ": ", op.description(),
                                                    " failed on the device: ", result->message()));
          break;
        }
        pending_.pop_front();
        continue;
      }
      oldest = op.description();
      const absl::Duration age = now - op.issued();
      if (age > params_.options.timeout) {
        reason = absl::DeadlineExceededError(absl::StrCat(
            what_, ": ", op.description(), " has not completed after ", FormatDurationShort(age),
            " (timeout ", FormatDurationShort(params_.options.timeout),
            "); a peer is missing, stuck, or issued a different op; the group was aborted"));
      }
      break;
    }
  }
  // The communicator's asynchronous error (a peer or the network failed).
  // TryLock: an issuing thread polls the same state itself, and the watchdog
  // must never wait behind it.
  if (reason.ok() && issue_mu_.TryLock()) {
    if (comm_ != nullptr) {
      ncclResult_t state = ncclSuccess;
      if (api_.CommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        reason = NcclError(api_,
                           absl::StrCat(what_, ": asynchronous NCCL error while ", oldest,
                                        " was pending; the group was aborted"),
                           state, comm_);
      }
    }
    issue_mu_.Unlock();
  }
  if (!reason.ok()) Abort(std::move(reason));
}

void GroupCore::Close(absl::Duration destroy_timeout) {
  DeviceGuard guard(api_, params_.device);
  absl::MutexLock lock(&issue_mu_);
  if (closed_) return;
  closed_ = true;
  if (comm_ != nullptr && unpublished_split_ != nullptr) {
    // An abort deferred behind a split child: give NCCL the destroy timeout
    // to publish it, asking the parent's state meanwhile so that NCCL can
    // finish the split's group job.
    const absl::Time deadline = absl::Now() + destroy_timeout;
    while (LoadPublished(unpublished_split_) == nullptr && absl::Now() < deadline) {
      ncclResult_t state = ncclSuccess;
      api_.CommGetAsyncError(comm_, &state);
      absl::SleepFor(absl::Milliseconds(1));
    }
    AbortLocked();
    if (comm_ != nullptr) {
      // Never published: the communicator was not aborted, so kernels of its
      // ops may still run on the stream and touch the barrier buffer, and
      // cudaFree would wait for them. Everything stays allocated.
      AbandonCommLocked();
      ready_ = nullptr;
      stream_ = nullptr;
      scratch_ = nullptr;
      return;
    }
  } else if (comm_ != nullptr) {
    absl::Status drained;
    const ncclResult_t r = api_.CommFinalize(comm_);
    if (r == ncclInProgress) {
      drained = AwaitComm(api_, comm_, absl::StrCat("finalizing ", what_),
                          absl::Now() + destroy_timeout, [this] { return Cancelled(); });
    } else if (r != ncclSuccess) {
      drained = NcclError(api_, absl::StrCat("finalizing ", what_), r, comm_);
    }
    if (drained.ok()) {
      // Local and non-blocking once finalized.
      api_.CommDestroy(comm_);
      comm_ = nullptr;
    } else {
      SetAbortReason(WithPrefix(
          absl::StrCat(what_, " was destroyed before its ops drained, so it was aborted"),
          drained));
      AbortLocked();
    }
  }
  // After a finalize every issued op has completed, and after an abort every
  // pending op has failed; either way the stream has nothing left that a
  // Work could still need, and a Work's event lives in the pool, not here.
  if (ready_ != nullptr) api_.EventDestroy(ready_);
  if (stream_ != nullptr) api_.StreamDestroy(stream_);
  if (scratch_ != nullptr) api_.Free(scratch_);
  ready_ = nullptr;
  stream_ = nullptr;
  scratch_ = nullptr;
}

// ---- NcclWork --------------------------------------------------------------

absl::Status NcclWork::Wait(absl::Duration timeout) {
  // Stream semantics: the host has nothing to wait for, so `timeout` has
  // nothing to bound; the watchdog bounds the op on the device.
  (void)timeout;
  if (std::optional<absl::Status> known = op_->result(); known.has_value()) return *known;
  const int device = core_->params().device;
  cudaStream_t current = static_cast<cudaStream_t>(CurrentCudaStream(Device::Cuda(device)));
  // An op that ran on the current stream is already ordered before
  // whatever the caller enqueues next.
  if (current == op_->stream()) return absl::OkStatus();
  DeviceGuard guard(core_->api(), device);  // "Stream 0" means the current device's.
  if (!guard.status().ok()) return guard.status();
  if (cudaError_t err = core_->api().StreamWaitEvent(current, op_->done(), 0); err != cudaSuccess) {
    return CudaError(core_->api(),
                     absl::StrCat("making the current stream wait for ", op_->description(), " of ",
                                  core_->what()),
                     err);
  }
  // The group may have failed the op meanwhile (abort, watchdog).
  if (std::optional<absl::Status> known = op_->result(); known.has_value()) return *known;
  return absl::OkStatus();
}

bool NcclWork::IsCompleted() const { return op_->Poll().has_value(); }

absl::Status NcclWork::status() const {
  std::optional<absl::Status> result = op_->Poll();
  if (!result.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(op_->description(), " of ", core_->what(), " is still pending"));
  }
  return *result;
}

void NcclWork::Abort(absl::Status reason) {
  if (IsCompleted()) return;
  core_->Abort(std::move(reason));
}

// ---- NcclGroup -------------------------------------------------------------

absl::StatusOr<std::shared_ptr<NcclGroup>> NcclGroup::Create(NcclApi& api, GroupCore::Params params,
                                                             std::vector<int> global_ranks,
                                                             ncclComm_t comm,
                                                             std::shared_ptr<Watchdog> watchdog,
                                                             absl::Duration destroy_timeout) {
  MESH_CHECK(comm != nullptr, "NcclGroup::Create needs a communicator");
  const std::string what = absl::StrCat("creating the stream of NCCL group '", params.name, "'");
  DeviceGuard guard(api, params.device);
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  void* scratch = nullptr;
  absl::Status status = guard.status();
  // Non-blocking: the legacy default stream must not serialize with NCCL's
  // kernels behind the caller's back; ordering is explicit (events).
  if (status.ok()) {
    if (cudaError_t err = api.StreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        err != cudaSuccess) {
      status = CudaError(api, "cudaStreamCreateWithFlags", err);
    }
  }
  if (status.ok()) {
    if (cudaError_t err = api.EventCreateWithFlags(&ready, cudaEventDisableTiming);
        err != cudaSuccess) {
      status = CudaError(api, "cudaEventCreateWithFlags", err);
    }
  }
  if (status.ok()) {
    if (cudaError_t err = api.Malloc(&scratch, sizeof(float)); err != cudaSuccess) {
      status = CudaError(api, "cudaMalloc of the barrier buffer", err);
    } else if (cudaError_t err2 = api.Memset(scratch, 0, sizeof(float)); err2 != cudaSuccess) {
      // Nobody looks at the barrier's sum, but NCCL reads the buffer, so it
      // should hold a defined value.
      status = CudaError(api, "cudaMemset of the barrier buffer", err2);
    }
  }
  if (!status.ok()) {
    if (scratch != nullptr) api.Free(scratch);
    if (ready != nullptr) api.EventDestroy(ready);
    if (stream != nullptr) api.StreamDestroy(stream);
    api.CommAbort(comm);
    return WithPrefix(what, status);
  }
  auto core = std::make_shared<GroupCore>(api, params, comm, stream, ready, scratch);
  watchdog->Watch(core);
  return std::shared_ptr<NcclGroup>(new NcclGroup(params, std::move(global_ranks), std::move(core),
                                                  std::move(watchdog), destroy_timeout));
}

NcclGroup::NcclGroup(const GroupCore::Params& params, std::vector<int> global_ranks,
                     std::shared_ptr<GroupCore> core, std::shared_ptr<Watchdog> watchdog,
                     absl::Duration destroy_timeout)
    : ProcessGroupNccl(params.rank, std::move(global_ranks), params.name, params.options,
                       Device::Cuda(params.device)),
      core_(std::move(core)),
      watchdog_(std::move(watchdog)),
      destroy_timeout_(destroy_timeout) {}

NcclGroup::~NcclGroup() { core_->Close(destroy_timeout_); }

GroupView NcclGroup::View() const {
  GroupView view;
  view.name = name();
  view.rank = rank();
  view.size = size();
  view.device = device();
  return view;
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::AllReduce(Tensor tensor, ReduceOp op) {
  static constexpr absl::string_view kOp = "all_reduce";
  const NcclCaps& caps = core_->params().caps;
  const GroupView view = View();
  if (absl::Status s = CheckTensor(view, kOp, "tensor", tensor, caps); !s.ok()) return s;
  if (absl::Status s = CheckReduceOp(view, kOp, tensor.dtype(), op, caps); !s.ok()) return s;
  const ncclDataType_t type = ToNcclDataType(tensor.dtype());
  const ncclRedOp_t red = ToNcclRedOp(op);
  const size_t count = static_cast<size_t>(tensor.numel());
  void* data = tensor.data();
  return core_->Launch(kOp, OpFacts{.in = OpFacts::Of(tensor), .reduce = ReduceOpName(op)},
                       [&](ncclComm_t comm, cudaStream_t stream) {
                         // Zero elements on every member (they agree on numel): nothing to
                         // do, and NCCL need not see a possibly-null pointer.
                         if (count == 0) return ncclSuccess;
                         return core_->api().AllReduce(data, data, count, type, red, comm, stream);
                       });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::LaunchReduction(
    absl::string_view op, const Tensor& input, const Tensor& output, ReduceOp reduce_op,
    absl::FunctionRef<absl::Status(const GroupView&)> sizes, ReductionCall call) {
  const NcclCaps& caps = core_->params().caps;
  const GroupView view = View();
  if (absl::Status s = CheckTensor(view, op, "input", input, caps); !s.ok()) return s;
  if (absl::Status s = CheckTensor(view, op, "output", output, caps); !s.ok()) return s;
  if (absl::Status s = CheckSameDType(view, op, input, output); !s.ok()) return s;
  if (absl::Status s = sizes(view); !s.ok()) return s;
  if (absl::Status s = CheckReduceOp(view, op, input.dtype(), reduce_op, caps); !s.ok()) return s;
  const ncclDataType_t type = ToNcclDataType(input.dtype());
  const ncclRedOp_t red = ToNcclRedOp(reduce_op);
  const size_t count = static_cast<size_t>(output.numel());
  const void* send = input.data();
  void* recv = output.data();
  return core_->Launch(
      op,
      OpFacts{
          .in = OpFacts::Of(input), .out = OpFacts::Of(output), .reduce = ReduceOpName(reduce_op)},
      [&](ncclComm_t comm, cudaStream_t stream) {
        // Zero elements on every member (they agree on numel): nothing to
        // do, and NCCL need not see a possibly-null pointer.
        if (count == 0) return ncclSuccess;
        return (core_->api().*call)(send, recv, count, type, red, comm, stream);
      });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::AllReduce(Tensor input, Tensor output,
                                                           ReduceOp op) {
  return LaunchReduction(
      "all_reduce", input, output, op,
      [&](const GroupView& view) { return CheckAllReduceBuffers(view, input, output); },
      &NcclApi::AllReduce);
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::Broadcast(Tensor tensor, int root) {
  static constexpr absl::string_view kOp = "broadcast";
  const GroupView view = View();
  if (absl::Status s = CheckTensor(view, kOp, "tensor", tensor, core_->params().caps); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRoot(view, kOp, root); !s.ok()) return s;
  const ncclDataType_t type = ToNcclDataType(tensor.dtype());
  const size_t count = static_cast<size_t>(tensor.numel());
  void* data = tensor.data();
  return core_->Launch(kOp,
                       OpFacts{.in = OpFacts::Of(tensor), .peer_label = ", root ", .peer = root},
                       [&](ncclComm_t comm, cudaStream_t stream) {
                         if (count == 0) return ncclSuccess;
                         return core_->api().Broadcast(data, data, count, type, root, comm, stream);
                       });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::Reduce(Tensor tensor, int root, ReduceOp op) {
  static constexpr absl::string_view kOp = "reduce";
  const NcclCaps& caps = core_->params().caps;
  const GroupView view = View();
  if (absl::Status s = CheckTensor(view, kOp, "tensor", tensor, caps); !s.ok()) return s;
  if (absl::Status s = CheckRoot(view, kOp, root); !s.ok()) return s;
  if (absl::Status s = CheckReduceOp(view, kOp, tensor.dtype(), op, caps); !s.ok()) return s;
  const ncclDataType_t type = ToNcclDataType(tensor.dtype());
  const ncclRedOp_t red = ToNcclRedOp(op);
  const size_t count = static_cast<size_t>(tensor.numel());
  void* data = tensor.data();
  return core_->Launch(kOp,
                       OpFacts{.in = OpFacts::Of(tensor),
                               .reduce = ReduceOpName(op),
                               .peer_label = ", root ",
                               .peer = root},
                       [&](ncclComm_t comm, cudaStream_t stream) {
                         if (count == 0) return ncclSuccess;
                         // In place: recvbuff only matters on the root.
                         return core_->api().Reduce(data, data, count, type, red, root, comm,
                                                    stream);
                       });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::AllGather(Tensor input, Tensor output) {
  static constexpr absl::string_view kOp = "all_gather";
  const NcclCaps& caps = core_->params().caps;
  const GroupView view = View();
  if (absl::Status s = CheckTensor(view, kOp, "input", input, caps); !s.ok()) return s;
  if (absl::Status s = CheckTensor(view, kOp, "output", output, caps); !s.ok()) return s;
  if (absl::Status s = CheckSameDType(view, kOp, input, output); !s.ok()) return s;
  if (absl::Status s = CheckAllGatherSizes(view, input, output); !s.ok()) return s;
  const ncclDataType_t type = ToNcclDataType(input.dtype());
  const size_t count = static_cast<size_t>(input.numel());
  const void* send = input.data();
  void* recv = output.data();
  return core_->Launch(kOp, OpFacts{.in = OpFacts::Of(input), .out = OpFacts::Of(output)},
                       [&](ncclComm_t comm, cudaStream_t stream) {
                         if (count == 0) return ncclSuccess;
                         return core_->api().AllGather(send, recv, count, type, comm, stream);
                       });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::ReduceScatter(Tensor input, Tensor output,
                                                               ReduceOp op) {
  return LaunchReduction(
      "reduce_scatter", input, output, op,
      [&](const GroupView& view) { return CheckReduceScatterSizes(view, input, output); },
      &NcclApi::ReduceScatter);
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::AllToAll(Tensor input, Tensor output,
                                                          std::vector<int64_t> input_splits,
                                                          std::vector<int64_t> output_splits) {
  static constexpr absl::string_view kOp = "all_to_all";
  const NcclCaps& caps = core_->params().caps;
  const GroupView view = View();
  if (absl::Status s = CheckTensor(view, kOp, "input", input, caps); !s.ok()) return s;
  if (absl::Status s = CheckTensor(view, kOp, "output", output, caps); !s.ok()) return s;
  if (absl::Status s = CheckSameDType(view, kOp, input, output); !s.ok()) return s;
  absl::StatusOr<AllToAllPlan> plan =
      PlanAllToAll(view, input, output, input_splits, output_splits);
  if (!plan.ok()) return plan.status();
  const ncclDataType_t type = ToNcclDataType(input.dtype());
  const size_t element = input.element_size();
  const char* send = Bytes(input);
  char* recv = Bytes(output);
  const bool even = input_splits.empty() && output_splits.empty();
  return core_->Launch(kOp,
                       OpFacts{.in = OpFacts::Of(input),
                               .out = OpFacts::Of(output),
                               .suffix = even ? ", equal splits" : ", uneven splits"},
                       [&](ncclComm_t comm, cudaStream_t stream) {
                         // One group call, so NCCL schedules every pair at once instead of
                         // deadlocking on the first blocking send. Zero-sized chunks are
                         // skipped on both sides alike (sender's input split j equals the
                         // receiver's output split i), as c10d does.
                         ncclResult_t first_error = core_->api().GroupStart();
                         if (first_error != ncclSuccess) return first_error;
                         for (int peer = 0; peer < view.size; ++peer) {
                           const size_t send_count = static_cast<size_t>(plan->send_counts[peer]);
                           const size_t recv_count = static_cast<size_t>(plan->recv_counts[peer]);
                           if (send_count > 0) {
                             const ncclResult_t r = core_->api().Send(
                                 send + static_cast<size_t>(plan->send_offsets[peer]) * element,
                                 send_count, type, peer, comm, stream);
                             if (r != ncclSuccess && first_error == ncclSuccess) first_error = r;
                           }
                           if (recv_count > 0) {
                             const ncclResult_t r = core_->api().Recv(
                                 recv + static_cast<size_t>(plan->recv_offsets[peer]) * element,
                                 recv_count, type, peer, comm, stream);
                             if (r != ncclSuccess && first_error == ncclSuccess) first_error = r;
                           }
                         }
                         // Always end the group: it also discards a group whose calls failed.
                         const ncclResult_t end = core_->api().GroupEnd();
                         return first_error != ncclSuccess ? first_error : end;
                       });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::Send(Tensor tensor, int peer, int tag) {
  static constexpr absl::string_view kOp = "send";
  const GroupView view = View();
  if (absl::Status s = CheckTensor(view, kOp, "tensor", tensor, core_->params().caps); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPeer(view, kOp, peer); !s.ok()) return s;
  const ncclDataType_t type = ToNcclDataType(tensor.dtype());
  const size_t count = static_cast<size_t>(tensor.numel());
  const void* data = tensor.data();
  return core_->Launch(
      kOp, OpFacts{.in = OpFacts::Of(tensor), .peer_label = " to ", .peer = peer, .tag = tag},
      [&](ncclComm_t comm, cudaStream_t stream) {
        if (count == 0) return ncclSuccess;
        return core_->api().Send(data, count, type, peer, comm, stream);
      });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::Recv(Tensor tensor, int peer, int tag) {
  static constexpr absl::string_view kOp = "recv";
  const GroupView view = View();
  if (absl::Status s = CheckTensor(view, kOp, "tensor", tensor, core_->params().caps); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPeer(view, kOp, peer); !s.ok()) return s;
  const ncclDataType_t type = ToNcclDataType(tensor.dtype());
  const size_t count = static_cast<size_t>(tensor.numel());
  void* data = tensor.data();
  return core_->Launch(
      kOp, OpFacts{.in = OpFacts::Of(tensor), .peer_label = " from ", .peer = peer, .tag = tag},
      [&](ncclComm_t comm, cudaStream_t stream) {
        if (count == 0) return ncclSuccess;
        return core_->api().Recv(data, count, type, peer, comm, stream);
      });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::Barrier() {
  void* scratch = core_->scratch();
  return core_->Launch("barrier", OpFacts{.fixed = "1-element all_reduce"},
                       [this, scratch](ncclComm_t comm, cudaStream_t stream) {
                         return core_->api().AllReduce(scratch, scratch, 1, ncclFloat32, ncclSum,
                                                       comm, stream);
                       });
}

}  // namespace mesh::nccl
