#include "backends/nccl/nccl_group.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/nccl/nccl_util.h"
#include "backends/nccl/nccl_watchdog.h"
#include "common/check.h"
#include "mesh/cuda_stream.h"

namespace mesh::nccl {
namespace {

absl::Status WithPrefix(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

std::string Describe(const Tensor& t) {
  return absl::StrCat(DTypeName(t.dtype()), t.ShapeString());
}

char* Bytes(const Tensor& t) { return static_cast<char*>(t.data()); }

}  // namespace

// ---- EventPool -------------------------------------------------------------

EventPool::~EventPool() {
  DeviceGuard guard(device_);
  absl::MutexLock lock(&mu_);
  // An event whose last record has not completed is released by CUDA once
  // it does; cudaEventDestroy does not block.
  for (cudaEvent_t event : free_) cudaEventDestroy(event);
}

absl::StatusOr<cudaEvent_t> EventPool::Acquire() {
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      cudaEvent_t event = free_.back();
      free_.pop_back();
      return event;
    }
  }
  DeviceGuard guard(device_);  // Events belong to the device current at creation.
  if (!guard.status().ok()) return guard.status();
  cudaEvent_t event = nullptr;
  if (cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      err != cudaSuccess) {
    return CudaError("cudaEventCreateWithFlags", err);
  }
  return event;
}

void EventPool::Release(cudaEvent_t event) {
  if (event == nullptr) return;
  absl::MutexLock lock(&mu_);
  free_.push_back(event);
}

// ---- PendingOp -------------------------------------------------------------

PendingOp::PendingOp(std::string description, absl::Time issued, cudaEvent_t done,
                     std::shared_ptr<EventPool> pool)
    : description_(std::move(description)), issued_(issued), done_(done), pool_(std::move(pool)) {}

PendingOp::~PendingOp() { pool_->Release(done_); }

absl::Status PendingOp::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (!result_.has_value()) result_ = std::move(status);
  return *result_;
}

std::optional<absl::Status> PendingOp::result() const {
  absl::MutexLock lock(&mu_);
  return result_;
}

std::optional<absl::Status> PendingOp::Poll() {
  if (std::optional<absl::Status> known = result(); known.has_value()) return known;
  // cudaEventQuery needs no particular current device.
  const cudaError_t err = cudaEventQuery(done_);
  if (err == cudaErrorNotReady) return std::nullopt;
  if (err == cudaSuccess) return Finish(absl::OkStatus());
  return Finish(CudaError(absl::StrCat("cudaEventQuery for ", description_), err));
}

// ---- GroupCore -------------------------------------------------------------

GroupCore::GroupCore(Params params, ncclComm_t comm, cudaStream_t stream, cudaEvent_t ready,
                     void* scratch)
    : params_(std::move(params)),
      what_(absl::StrCat("NCCL group '", params_.name, "' (rank ", params_.rank, " of ",
                         params_.size, ", cuda:", params_.device, ")")),
      stream_(stream),
      ready_(ready),
      scratch_(scratch),
      events_(std::make_shared<EventPool>(params_.device)),
      comm_(comm) {}

GroupCore::~GroupCore() {
  // NcclGroup always closes; this is the last line of defence for a core
  // that leaked past it, and it must not block (it may run on the watchdog).
  absl::MutexLock lock(&issue_mu_);
  if (comm_ != nullptr) ncclCommAbort(comm_);
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
  if (comm_ != nullptr) {
    DeviceGuard guard(params_.device);
    // Also joins any NCCL job still running for this communicator (an
    // abandoned init, split or lazy connection).
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void GroupCore::RetireCompletedLocked() {
  while (!pending_.empty() && pending_.front()->Poll().has_value()) pending_.pop_front();
}

absl::StatusOr<ProcessGroup::WorkPtr> GroupCore::Launch(
    absl::string_view op, absl::FunctionRef<std::string()> detail,
    absl::FunctionRef<ncclResult_t(ncclComm_t, cudaStream_t)> enqueue) {
  if (absl::Status s = Cancelled(); !s.ok()) return s;
  DeviceGuard guard(params_.device);
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
  auto pending = std::make_shared<PendingOp>(
      absl::StrCat(op, " #", next_seq_++, " (", detail(), ")"), absl::Now(), *done, events_);

  // Ordering: the caller's earlier work on its stream, then the op, then
  // the completion event. Recording `ready_` again while an earlier wait on
  // it is still queued is fine: cudaStreamWaitEvent captures the event's
  // state at the time of the call. A failure here has issued nothing, so it
  // is the caller's synchronous error and the group stays healthy.
  if (cudaError_t err = cudaEventRecord(ready_, caller); err != cudaSuccess) {
    return WithPrefix(absl::StrCat(what_, " ", pending->description()),
                      CudaError("cudaEventRecord on the caller's current stream (is it a stream "
                                "of this group's device?)",
                                err));
  }
  if (cudaError_t err = cudaStreamWaitEvent(stream_, ready_, 0); err != cudaSuccess) {
    return WithPrefix(absl::StrCat(what_, " ", pending->description()),
                      CudaError("cudaStreamWaitEvent on the group stream", err));
  }
  absl::Status failure;
  const ncclResult_t r = enqueue(comm_, stream_);
  if (r == ncclInProgress) {
    // First use of a peer connection (lazy connect) runs in NCCL's
    // background thread; nothing is on the stream until it is done.
    failure = AwaitComm(comm_, absl::StrCat("issuing ", pending->description()),
                        absl::Now() + params_.options.timeout, [this] { return Cancelled(); });
  } else if (r != ncclSuccess) {
    failure = NcclError(absl::StrCat("issuing ", pending->description()), r, comm_);
  }
  if (failure.ok()) {
    if (cudaError_t err = cudaEventRecord(*done, stream_); err != cudaSuccess) {
      failure = CudaError("cudaEventRecord on the group stream", err);
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
    RetireCompletedLocked();  // Keeps the queue short between watchdog passes.
    pending_.push_back(pending);
  }
  return std::make_shared<NcclWork>(shared_from_this(), std::move(pending));
}

absl::StatusOr<ncclComm_t> GroupCore::Split(int color, int key, const char* child_name,
                                            absl::string_view child_what, absl::Time deadline,
                                            absl::FunctionRef<absl::Status()> cancelled) {
#if MESH_NCCL_HAS_SPLIT
  DeviceGuard guard(params_.device);
  if (!guard.status().ok()) return guard.status();
  const std::string what = absl::StrCat("ncclCommSplit of ", what_, " into ", child_what);
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
  // NCCL's split job stores the child here from its own thread when it
  // finishes, so the slot lives on the heap: a split this function gives up
  // on must not write into a dead stack frame.
  auto* slot = new ncclComm_t(nullptr);
  absl::Status status;
  const ncclResult_t r = ncclCommSplit(comm_, color, key, slot, &config);
  if (r == ncclInProgress) {
    // The job is attached to the parent: its state reports the split.
    status = AwaitComm(comm_, what, deadline, cancel, absl::StatusCode::kUnavailable);
  } else if (r != ncclSuccess) {
    status = NcclError(what, r, comm_, absl::StatusCode::kUnavailable);
  }
  if (!status.ok()) {
    SetAbortReason(absl::Status(status.code(),
                                absl::StrCat(status.message(), "; the parent ", what_,
                                             " is unusable after a failed split and was aborted")));
    // NCCL 2.2x's ncclCommAbort joins the split job before it returns, so
    // a child the job made meanwhile is in the slot by now and is aborted
    // too. The documentation does not promise that join, so the slot itself
    // is leaked rather than freed under a possible late writer: 8 bytes on
    // a fatal path.
    AbortLocked();
    if (ncclComm_t late = __atomic_load_n(slot, __ATOMIC_ACQUIRE); late != nullptr) {
      ncclCommAbort(late);
    }
    return status;
  }
  ncclComm_t child = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  delete slot;
  if (child == nullptr) {
    return absl::InternalError(absl::StrCat(what, ": NCCL returned no communicator"));
  }
  // The child's own state, normally already ncclSuccess.
  if (absl::Status s = AwaitComm(child, what, deadline, cancel, absl::StatusCode::kUnavailable);
      !s.ok()) {
    ncclCommAbort(child);
    return s;
  }
  return child;
#else
  (void)color;
  (void)key;
  (void)child_name;
  (void)deadline;
  (void)cancelled;
  return absl::FailedPreconditionError(absl::StrCat("cannot split ", what_, " into ", child_what,
                                                    ": ncclCommSplit needs NCCL >= 2.18"));
#endif
}

void GroupCore::WatchdogTick(absl::Time now) {
  if (aborting_.load(std::memory_order_acquire)) return;
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
            what_, ": ", op.description(), " has not completed after ", absl::FormatDuration(age),
            " (timeout ", absl::FormatDuration(params_.options.timeout),
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
      if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        reason = NcclError(absl::StrCat(what_, ": asynchronous NCCL error while ", oldest,
                                        " was pending; the group was aborted"),
                           state, comm_);
      }
    }
    issue_mu_.Unlock();
  }
  if (!reason.ok()) Abort(std::move(reason));
}

void GroupCore::Close(absl::Duration destroy_timeout) {
  DeviceGuard guard(params_.device);
  absl::MutexLock lock(&issue_mu_);
  if (closed_) return;
  closed_ = true;
  if (comm_ != nullptr) {
    absl::Status drained;
    const ncclResult_t r = ncclCommFinalize(comm_);
    if (r == ncclInProgress) {
      drained = AwaitComm(comm_, absl::StrCat("finalizing ", what_), absl::Now() + destroy_timeout,
                          [this] { return Cancelled(); });
    } else if (r != ncclSuccess) {
      drained = NcclError(absl::StrCat("finalizing ", what_), r, comm_);
    }
    if (drained.ok()) {
      // Local and non-blocking once finalized.
      ncclCommDestroy(comm_);
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
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (scratch_ != nullptr) cudaFree(scratch_);
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
  DeviceGuard guard(device);  // "Stream 0" means the current device's.
  if (!guard.status().ok()) return guard.status();
  cudaStream_t current = static_cast<cudaStream_t>(CurrentCudaStream(Device::Cuda(device)));
  if (cudaError_t err = cudaStreamWaitEvent(current, op_->done(), 0); err != cudaSuccess) {
    return CudaError(absl::StrCat("making the current stream wait for ", op_->description(), " of ",
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

absl::StatusOr<std::shared_ptr<NcclGroup>> NcclGroup::Create(GroupCore::Params params,
                                                             std::vector<int> global_ranks,
                                                             ncclComm_t comm,
                                                             std::shared_ptr<Watchdog> watchdog,
                                                             absl::Duration destroy_timeout) {
  MESH_CHECK(comm != nullptr, "NcclGroup::Create needs a communicator");
  const std::string what = absl::StrCat("creating the stream of NCCL group '", params.name, "'");
  DeviceGuard guard(params.device);
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  void* scratch = nullptr;
  absl::Status status = guard.status();
  // Non-blocking: the legacy default stream must not serialize with NCCL's
  // kernels behind the caller's back; ordering is explicit (events).
  if (status.ok()) {
    if (cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        err != cudaSuccess) {
      status = CudaError("cudaStreamCreateWithFlags", err);
    }
  }
  if (status.ok()) {
    if (cudaError_t err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
        err != cudaSuccess) {
      status = CudaError("cudaEventCreateWithFlags", err);
    }
  }
  if (status.ok()) {
    if (cudaError_t err = cudaMalloc(&scratch, sizeof(float)); err != cudaSuccess) {
      status = CudaError("cudaMalloc of the barrier buffer", err);
    } else if (cudaError_t err2 = cudaMemset(scratch, 0, sizeof(float)); err2 != cudaSuccess) {
      // Nobody looks at the barrier's sum, but NCCL reads the buffer, so it
      // should hold a defined value.
      status = CudaError("cudaMemset of the barrier buffer", err2);
    }
  }
  if (!status.ok()) {
    if (scratch != nullptr) cudaFree(scratch);
    if (ready != nullptr) cudaEventDestroy(ready);
    if (stream != nullptr) cudaStreamDestroy(stream);
    ncclCommAbort(comm);
    return WithPrefix(what, status);
  }
  auto core = std::make_shared<GroupCore>(params, comm, stream, ready, scratch);
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
  return core_->Launch(
      kOp, [&] { return absl::StrCat(Describe(tensor), ", ", ReduceOpName(op)); },
      [&](ncclComm_t comm, cudaStream_t stream) {
        // Zero elements on every member (they agree on numel): nothing to
        // do, and NCCL need not see a possibly-null pointer.
        if (count == 0) return ncclSuccess;
        return ncclAllReduce(data, data, count, type, red, comm, stream);
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
      [&] {
        return absl::StrCat(Describe(input), " -> ", Describe(output), ", ",
                            ReduceOpName(reduce_op));
      },
      [&](ncclComm_t comm, cudaStream_t stream) {
        // Zero elements on every member (they agree on numel): nothing to
        // do, and NCCL need not see a possibly-null pointer.
        if (count == 0) return ncclSuccess;
        return call(send, recv, count, type, red, comm, stream);
      });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::AllReduce(Tensor input, Tensor output,
                                                           ReduceOp op) {
  return LaunchReduction(
      "all_reduce", input, output, op,
      [&](const GroupView& view) { return CheckAllReduceBuffers(view, input, output); },
      &ncclAllReduce);
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
  return core_->Launch(
      kOp, [&] { return absl::StrCat(Describe(tensor), ", root ", root); },
      [&](ncclComm_t comm, cudaStream_t stream) {
        if (count == 0) return ncclSuccess;
        return ncclBroadcast(data, data, count, type, root, comm, stream);
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
  return core_->Launch(
      kOp, [&] { return absl::StrCat(Describe(tensor), ", ", ReduceOpName(op), ", root ", root); },
      [&](ncclComm_t comm, cudaStream_t stream) {
        if (count == 0) return ncclSuccess;
        // In place: recvbuff only matters on the root.
        return ncclReduce(data, data, count, type, red, root, comm, stream);
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
  return core_->Launch(
      kOp, [&] { return absl::StrCat(Describe(input), " -> ", Describe(output)); },
      [&](ncclComm_t comm, cudaStream_t stream) {
        if (count == 0) return ncclSuccess;
        return ncclAllGather(send, recv, count, type, comm, stream);
      });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::ReduceScatter(Tensor input, Tensor output,
                                                               ReduceOp op) {
  return LaunchReduction(
      "reduce_scatter", input, output, op,
      [&](const GroupView& view) { return CheckReduceScatterSizes(view, input, output); },
      &ncclReduceScatter);
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
  return core_->Launch(
      kOp,
      [&] {
        return absl::StrCat(Describe(input), " -> ", Describe(output),
                            even ? ", equal splits" : ", uneven splits");
      },
      [&](ncclComm_t comm, cudaStream_t stream) {
        // One group call, so NCCL schedules every pair at once instead of
        // deadlocking on the first blocking send. Zero-sized chunks are
        // skipped on both sides alike (sender's input split j equals the
        // receiver's output split i), as c10d does.
        ncclResult_t first_error = ncclGroupStart();
        if (first_error != ncclSuccess) return first_error;
        for (int peer = 0; peer < view.size; ++peer) {
          const size_t send_count = static_cast<size_t>(plan->send_counts[peer]);
          const size_t recv_count = static_cast<size_t>(plan->recv_counts[peer]);
          if (send_count > 0) {
            const ncclResult_t r =
                ncclSend(send + static_cast<size_t>(plan->send_offsets[peer]) * element, send_count,
                         type, peer, comm, stream);
            if (r != ncclSuccess && first_error == ncclSuccess) first_error = r;
          }
          if (recv_count > 0) {
            const ncclResult_t r =
                ncclRecv(recv + static_cast<size_t>(plan->recv_offsets[peer]) * element, recv_count,
                         type, peer, comm, stream);
            if (r != ncclSuccess && first_error == ncclSuccess) first_error = r;
          }
        }
        // Always end the group: it also discards a group whose calls failed.
        const ncclResult_t end = ncclGroupEnd();
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
      kOp, [&] { return absl::StrCat(Describe(tensor), " to ", peer, ", tag ", tag); },
      [&](ncclComm_t comm, cudaStream_t stream) {
        if (count == 0) return ncclSuccess;
        return ncclSend(data, count, type, peer, comm, stream);
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
      kOp, [&] { return absl::StrCat(Describe(tensor), " from ", peer, ", tag ", tag); },
      [&](ncclComm_t comm, cudaStream_t stream) {
        if (count == 0) return ncclSuccess;
        return ncclRecv(data, count, type, peer, comm, stream);
      });
}

absl::StatusOr<ProcessGroup::WorkPtr> NcclGroup::Barrier() {
  void* scratch = core_->scratch();
  return core_->Launch(
      "barrier", [] { return std::string("1-element all_reduce"); },
      [scratch](ncclComm_t comm, cudaStream_t stream) {
        return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm, stream);
      });
}

}  // namespace mesh::nccl
