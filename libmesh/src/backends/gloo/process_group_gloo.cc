#include "mesh/process_group_gloo.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <utility>

#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/reduce.h>
#include <gloo/types.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/gloo/gloo_errors.h"
#include "backends/gloo/gloo_group_state.h"
#include "backends/gloo/gloo_reduce.h"
#include "backends/gloo/gloo_ring.h"
#include "backends/gloo/gloo_slots.h"
#include "backends/gloo/gloo_staging.h"

namespace mesh {

using gloo_backend::CatchGloo;
using gloo_backend::DispatchElementSize;
using gloo_backend::Staged;

namespace {

using gloo_backend::kSendRecvSlotPrefix;  // gloo_slots.h

// gloo adds the timeout to steady_clock::now(); it caps its own "no
// timeout" at 100 hours for the same reason.
constexpr auto kMaxGlooTimeout = std::chrono::hours(100);

absl::Status CheckCpu(const Tensor& t, absl::string_view what) {
  if (!t.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a CPU tensor for the gloo backend, got ", t.DebugString()));
  }
  return absl::OkStatus();
}

// A written tensor must give each element its own memory.
absl::Status CheckWritable(const Tensor& t, absl::string_view what) {
  for (int d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0 && t.size(d) > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has stride 0 on dimension ", d,
                       " (a broadcast view) and cannot be written: ", t.DebugString()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSameDType(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input and output dtypes differ: ", DTypeName(a.dtype()), " vs ", DTypeName(b.dtype())));
  }
  return absl::OkStatus();
}

// What every op with an input and an output checks: both on the CPU, the
// output writable, one dtype.
absl::Status CheckInputOutput(const Tensor& input, const Tensor& output) {
  if (absl::Status s = CheckCpu(input, "input"); !s.ok()) return s;
  if (absl::Status s = CheckCpu(output, "output"); !s.ok()) return s;
  if (absl::Status s = CheckWritable(output, "output"); !s.ok()) return s;
  return CheckSameDType(input, output);
}

// `status` with `prefix` in front of its message.
absl::Status Prefixed(const std::string& prefix, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

#define MESH_GLOO_RETURN_IF_ERROR(expr) \
  do {                                  \
    absl::Status _status = (expr);      \
    if (!_status.ok()) return _status;  \
  } while (false)

// The in-place form of an out-of-place all-reduce: both contiguous from the
// same address (numel and dtype were checked equal), whatever their shapes,
// as NCCL's sendbuff == recvbuff.
bool SameBuffer(const Tensor& a, const Tensor& b) {
  return a.data() == b.data() && a.is_contiguous() && b.is_contiguous();
}

// `chunk` is exactly member `rank`'s chunk of `whole` (c10d's in-place
// all-gather input and reduce-scatter output): both contiguous, and chunk
// starts rank * its numel elements into whole.
bool IsOwnChunk(const Tensor& chunk, const Tensor& whole, int rank) {
  return chunk.is_contiguous() && whole.is_contiguous() &&
         chunk.data() == static_cast<const unsigned char*>(whole.data()) +
                             static_cast<int64_t>(rank) * chunk.numel() *
                                 static_cast<int64_t>(chunk.element_size());
}

// gloo's allreduce (or the shared-memory one) over `data`, `like`'s numel
// elements of its dtype, in place. (A template only because State is
// private to ProcessGroupGloo.)
template <typename State>
void AllReduceInPlace(State& s, void* data, const Tensor& like, const gloo_backend::ReduceFn& fn,
                      GlooAllreduceAlgorithm algorithm) {
  const size_t n = static_cast<size_t>(like.numel());
  if (gloo_backend::ShmGroup* shm = s.shm()) {
    shm->AllReduce(data, n, like.element_size(), fn, s.op_timeout());
    return;
  }
  ::gloo::AllreduceOptions opts(s.context());
  DispatchElementSize(like.element_size(),
                      [&](auto elem) { opts.setOutput(static_cast<decltype(elem)*>(data), n); });
  opts.setReduceFunction(fn);
  opts.setAlgorithm(algorithm == GlooAllreduceAlgorithm::kRing
                        ? ::gloo::AllreduceOptions::Algorithm::RING
                        : ::gloo::AllreduceOptions::Algorithm::BCUBE);
  opts.setTimeout(s.op_timeout());
  ::gloo::allreduce(opts);
}

}  // namespace

const char* GlooAllreduceAlgorithmName(GlooAllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case GlooAllreduceAlgorithm::kAuto:
      return "auto";
    case GlooAllreduceAlgorithm::kRing:
      return "ring";
    case GlooAllreduceAlgorithm::kBcube:
      return "bcube";
  }
  return "unknown";
}

// ---- State ------------------------------------------------------------------

ProcessGroupGloo::State::State(int rank, std::vector<int> global_ranks, std::string name,
                               GlooOptions options,
                               std::shared_ptr<gloo_backend::GlooContext> context,
                               std::shared_ptr<::gloo::rendezvous::Store> rendezvous_store,
                               std::unique_ptr<gloo_backend::ShmGroup> shm)
    : rank_(rank),
      global_ranks_(std::move(global_ranks)),
      name_(std::move(name)),
      options_(std::move(options)),
      rendezvous_store_(std::move(rendezvous_store)),
      context_(std::move(context)),
      shm_(std::move(shm)) {}

ProcessGroupGloo::State::~State() { Shutdown(); }

void ProcessGroupGloo::State::Start() {
  absl::MutexLock lock(&mu_);
  worker_ = std::thread([this] { WorkerLoop(); });
}

std::string ProcessGroupGloo::State::Describe(absl::string_view op) const {
  return absl::StrCat("gloo group '", name_, "' rank ", rank_, "/", size(), ": ", op);
}

std::chrono::milliseconds ProcessGroupGloo::State::op_timeout() const {
  const std::chrono::milliseconds timeout = absl::ToChronoMilliseconds(options_.group.timeout);
  return std::min<std::chrono::milliseconds>(timeout, kMaxGlooTimeout);
}

std::shared_ptr<internal::HostWork> ProcessGroupGloo::State::NewWork() {
  std::weak_ptr<State> weak = weak_from_this();
  return std::make_shared<internal::HostWork>(options_.group.timeout, [weak](absl::Status reason) {
    if (auto state = weak.lock()) {
      state->Abort(std::move(reason));
    }
  });
}

absl::Status ProcessGroupGloo::State::health() const {
  absl::MutexLock lock(&mu_);
  return abort_status_;
}

void ProcessGroupGloo::State::Abort(absl::Status reason) {
  if (reason.ok()) reason = absl::AbortedError(Describe("aborted"));
  std::deque<QueuedOp> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (!abort_status_.ok()) return;  // The first reason wins.
    abort_status_ = reason;
    dropped.swap(queue_);
  }
  // Wakes the running op and the p2p waits, and closes the connections so
  // that peers blocked in the same op fail now instead of at their timeout.
  if (context_ != nullptr) context_->Abort();
  if (shm_ != nullptr) shm_->Abort();
  for (QueuedOp& op : dropped) op.work->Complete(reason);
}

void ProcessGroupGloo::State::Shutdown() {
  Abort(absl::CancelledError(Describe("process group destroyed")));
  std::thread worker, p2p;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    worker = std::move(worker_);
    p2p = std::move(p2p_thread_);
  }
  if (worker.joinable()) worker.join();
  if (p2p.joinable()) p2p.join();
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::State::Enqueue(
    std::string op, std::function<absl::Status()> run) {
  std::shared_ptr<internal::HostWork> work = NewWork();
  absl::MutexLock lock(&mu_);
  if (!abort_status_.ok()) return abort_status_;
  queue_.push_back(QueuedOp{std::move(op), std::move(run), work});
  return work;
}

absl::Status ProcessGroupGloo::State::Finish(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    // A broken connection usually means a peer died or aborted, and the
    // runtime hears of it from the coordinator at about the same time and
    // calls Abort with a reason that names the culprit. That reason is more
    // useful than "connection reset", so give it a moment to arrive.
    if (status.code() == absl::StatusCode::kUnavailable && abort_status_.ok()) {
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
                                 return !s->abort_status_.ok();
                               },
                               this),
                           options_.abort_grace);
    }
    if (!abort_status_.ok()) return abort_status_;
  }
  // Any failure leaves the members out of step (some finished the op, some
  // did not), so the group cannot go on; aborting it also closes the
  // connections, which fails the peers' copy of this op at once.
  if (!status.ok()) Abort(status);
  return status;
}

void ProcessGroupGloo::State::WorkerLoop() {
  for (;;) {
    QueuedOp op;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](State* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->queue_.empty() || s->stopping_; },
          this));
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status status;
    const absl::Status caught =
        CatchGloo(Describe(op.op), global_ranks_, [&] { status = op.run(); });
    if (!caught.ok()) {
      status = caught;
    } else if (!status.ok()) {
      status = Prefixed(Describe(op.op), status);
    }
    // Drop the op's captures (tensors, staging) before completing it.
    op.run = nullptr;
    op.work->Complete(Finish(std::move(status)));
  }
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::State::PostPointToPoint(
    bool send, const Tensor& tensor, int peer, int tag) {
  const std::string what = Describe(send ? absl::StrCat("send to ", peer, " (tag ", tag, ")")
                                         : absl::StrCat("recv from ", peer, " (tag ", tag, ")"));
  std::shared_ptr<internal::HostWork> work = NewWork();
  absl::MutexLock post_lock(&post_mu_);
  if (absl::Status s = health(); !s.ok()) return s;
  if (tensor.numel() == 0) {
    work->Complete(absl::OkStatus());
    return work;
  }
  absl::StatusOr<Staged> staged = Staged::Of(tensor, /*copy_in=*/send);
  if (!staged.ok()) {
    work->Complete(Finish(Prefixed(what, staged.status())));
    return work;
  }
  PendingPointToPoint pending;
  pending.send = send;
  pending.work = work;
  const uint64_t slot = ::gloo::Slot::build(kSendRecvSlotPrefix, static_cast<uint32_t>(tag));
  const absl::Status posted = CatchGloo(what, global_ranks_, [&] {
    pending.buffer = context_->createUnboundBuffer(staged->data(), staged->nbytes());
    if (send) {
      pending.buffer->send(peer, slot);
    } else {
      pending.buffer->recv(peer, slot);
    }
  });
  if (!posted.ok()) {
    work->Complete(Finish(posted));
    return work;
  }
  pending.staged = *std::move(staged);

  absl::MutexLock lock(&mu_);
  if (stopping_) {
    // Shutdown raced with this post; the abort already failed everything.
    work->Complete(abort_status_);
    return work;
  }
  p2p_.push_back(std::move(pending));
  if (!p2p_thread_.joinable()) p2p_thread_ = std::thread([this] { PointToPointLoop(); });
  return work;
}

void ProcessGroupGloo::State::PointToPointLoop() {
  for (;;) {
    PendingPointToPoint op;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](State* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->p2p_.empty() || s->stopping_; },
          this));
      if (p2p_.empty()) return;
      op = std::move(p2p_.front());
      p2p_.pop_front();
    }
    absl::Status status = CatchGloo(Describe(op.send ? "send" : "recv"), global_ranks_, [&] {
      if (op.send) {
        op.buffer->waitSend(op_timeout());
      } else {
        op.buffer->waitRecv(op_timeout());
      }
    });
    if (status.ok() && !op.send) status = op.staged.CopyBack();
    op.buffer.reset();
    op.work->Complete(Finish(std::move(status)));
  }
}

// ---- ProcessGroupGloo -------------------------------------------------------

ProcessGroupGloo::ProcessGroupGloo(int rank, std::vector<int> global_ranks, std::string name,
                                   const GlooOptions& options, std::shared_ptr<State> state)
    : ProcessGroup(rank, std::move(global_ranks), std::move(name), options.group),
      state_(std::move(state)) {}

ProcessGroupGloo::~ProcessGroupGloo() { state_->Shutdown(); }

void ProcessGroupGloo::Abort(absl::Status reason) { state_->Abort(std::move(reason)); }

absl::Status ProcessGroupGloo::health() const { return state_->health(); }

bool ProcessGroupGloo::uses_shared_memory() const { return state_->shm() != nullptr; }

GlooAllreduceAlgorithm ProcessGroupGloo::AllreduceAlgorithmFor(size_t nbytes) const {
  const GlooOptions& options = state_->options();
  if (options.allreduce_algorithm != GlooAllreduceAlgorithm::kAuto) {
    return options.allreduce_algorithm;
  }
  // Measured (docs/collectives.md): with two members the ring is never
  // slower (both are one exchange, and the ring pipelines segments); with
  // more, bcube's log2(n) steps win until the ring's pipelining takes over.
  if (size() <= 2) return GlooAllreduceAlgorithm::kRing;
  return nbytes < options.allreduce_ring_min_bytes ? GlooAllreduceAlgorithm::kBcube
                                                   : GlooAllreduceAlgorithm::kRing;
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::AllReduce(Tensor tensor, ReduceOp op) {
  const std::string what = state_->Describe("all_reduce");
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckCpu(tensor, "tensor")));
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckWritable(tensor, "tensor")));
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, gloo_backend::CheckReduceSupported(tensor.dtype(), op)));
  const GlooAllreduceAlgorithm algorithm = AllreduceAlgorithmFor(tensor.nbytes());
  State* s = state_.get();
  return s->Enqueue("all_reduce", [s, tensor, op, algorithm]() -> absl::Status {
    if (tensor.numel() == 0 || s->size() == 1) return absl::OkStatus();
    absl::StatusOr<Staged> buf = Staged::Of(tensor, /*copy_in=*/true);
    if (!buf.ok()) return buf.status();
    absl::StatusOr<gloo_backend::ReduceFn> fn = gloo_backend::MakeReduceFn(tensor.dtype(), op);
    if (!fn.ok()) return fn.status();
    AllReduceInPlace(*s, buf->data(), tensor, *fn, algorithm);
    if (op == ReduceOp::kAvg) {
      gloo_backend::DivideInPlace(tensor.dtype(), buf->data(), tensor.numel(), s->size());
    }
    return buf->CopyBack();
  });
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::AllReduce(Tensor input, Tensor output,
                                                                  ReduceOp op) {
  const std::string what = state_->Describe("all_reduce");
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckInputOutput(input, output)));
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, gloo_backend::CheckReduceSupported(input.dtype(), op)));
  if (output.numel() != input.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": output has ", output.numel(),
                                                   " elements; input has ", input.numel()));
  }
  if (SameBuffer(input, output)) return AllReduce(std::move(output), op);
  if (SpansOverlap(input, output)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": input ", input.DebugString(), " and output ", output.DebugString(),
                     " overlap; pass the same tensor for the in-place form"));
  }
  const GlooAllreduceAlgorithm algorithm = AllreduceAlgorithmFor(input.nbytes());
  State* s = state_.get();
  return s->Enqueue("all_reduce", [s, input, output, op, algorithm]() -> absl::Status {
    if (input.numel() == 0) return absl::OkStatus();
    if (s->size() == 1) return gloo_backend::CopyFlat(output, input);
    absl::StatusOr<Staged> in = Staged::Of(input, /*copy_in=*/true);
    if (!in.ok()) return in.status();
    absl::StatusOr<Staged> out = Staged::Of(output, /*copy_in=*/false);
    if (!out.ok()) return out.status();
    absl::StatusOr<gloo_backend::ReduceFn> fn = gloo_backend::MakeReduceFn(input.dtype(), op);
    if (!fn.ok()) return fn.status();
    const size_t n = static_cast<size_t>(input.numel());
    const size_t k = static_cast<size_t>(s->size());
    if (s->shm() == nullptr && algorithm == GlooAllreduceAlgorithm::kRing && n % k == 0) {
      // Straight from the input into the output (gloo_ring.h).
      gloo_backend::RingAllReduceArgs args;
      args.input = in->data();
      args.output = out->data();
      args.count = n / k;
      args.element_size = input.element_size();
      args.reduce = *fn;
      args.timeout = s->op_timeout();
      args.max_segment_bytes = s->options().all_reduce_segment_bytes;
      gloo_backend::RingAllReduce(s->context(), args);
    } else {
      std::memcpy(out->data(), in->data(), input.nbytes());
      AllReduceInPlace(*s, out->data(), input, *fn, algorithm);
    }
    if (op == ReduceOp::kAvg) {
      gloo_backend::DivideInPlace(input.dtype(), out->data(), input.numel(), s->size());
    }
    return out->CopyBack();
  });
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::Broadcast(Tensor tensor, int root) {
  const std::string what = state_->Describe("broadcast");
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckCpu(tensor, "tensor")));
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckWritable(tensor, "tensor")));
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " is not a rank of this group of ", size()));
  }
  State* s = state_.get();
  return s->Enqueue("broadcast", [s, tensor, root]() -> absl::Status {
    if (tensor.numel() == 0 || s->size() == 1) return absl::OkStatus();
    const bool is_root = s->rank() == root;
    absl::StatusOr<Staged> buf = Staged::Of(tensor, /*copy_in=*/is_root);
    if (!buf.ok()) return buf.status();
    const size_t n = static_cast<size_t>(tensor.numel());
    if (gloo_backend::ShmGroup* shm = s->shm()) {
      shm->Broadcast(buf->data(), buf->nbytes(), root, s->op_timeout());
      return is_root ? absl::OkStatus() : buf->CopyBack();
    }
    ::gloo::BroadcastOptions opts(s->context());
    DispatchElementSize(tensor.element_size(), [&](auto elem) {
      opts.setOutput(static_cast<decltype(elem)*>(buf->data()), n);
    });
    opts.setRoot(root);
    opts.setTimeout(s->op_timeout());
    ::gloo::broadcast(opts);
    return is_root ? absl::OkStatus() : buf->CopyBack();
  });
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::Reduce(Tensor tensor, int root,
                                                               ReduceOp op) {
  const std::string what = state_->Describe("reduce");
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckCpu(tensor, "tensor")));
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckWritable(tensor, "tensor")));
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, gloo_backend::CheckReduceSupported(tensor.dtype(), op)));
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " is not a rank of this group of ", size()));
  }
  State* s = state_.get();
  return s->Enqueue("reduce", [s, tensor, root, op]() -> absl::Status {
    if (tensor.numel() == 0 || s->size() == 1) return absl::OkStatus();
    absl::StatusOr<Staged> buf = Staged::Of(tensor, /*copy_in=*/true);
    if (!buf.ok()) return buf.status();
    absl::StatusOr<gloo_backend::ReduceFn> fn = gloo_backend::MakeReduceFn(tensor.dtype(), op);
    if (!fn.ok()) return fn.status();
    const size_t n = static_cast<size_t>(tensor.numel());
    if (gloo_backend::ShmGroup* shm = s->shm()) {
      // Every member ends with the result; non-roots' tensors are scratch.
      shm->AllReduce(buf->data(), n, tensor.element_size(), *fn, s->op_timeout());
    } else {
      ::gloo::ReduceOptions opts(s->context());
      DispatchElementSize(tensor.element_size(), [&](auto elem) {
        opts.setOutput(static_cast<decltype(elem)*>(buf->data()), n);
      });
      opts.setRoot(root);
      opts.setReduceFunction(*fn);
      opts.setTimeout(s->op_timeout());
      ::gloo::reduce(opts);
    }
    if (s->rank() != root) return absl::OkStatus();  // Scratch on non-roots.
    if (op == ReduceOp::kAvg)
      gloo_backend::DivideInPlace(tensor.dtype(), buf->data(), n, s->size());
    return buf->CopyBack();
  });
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::AllGather(Tensor input, Tensor output) {
  const std::string what = state_->Describe("all_gather");
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckInputOutput(input, output)));
  if (output.numel() != input.numel() * size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": output has ", output.numel(),
                                                   " elements; expected group size ", size(),
                                                   " x input's ", input.numel()));
  }
  if (SpansOverlap(input, output) && !IsOwnChunk(input, output, rank())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": input ", input.DebugString(),
                                                   " overlaps output ", output.DebugString(),
                                                   " other than as this rank's chunk of it"));
  }
  State* s = state_.get();
  return s->Enqueue("all_gather", [s, input, output]() -> absl::Status {
    if (input.numel() == 0) return absl::OkStatus();
    if (s->size() == 1) return gloo_backend::CopyFlat(output, input);
    absl::StatusOr<Staged> out = Staged::Of(output, /*copy_in=*/false);
    if (!out.ok()) return out.status();
    const size_t chunk = input.nbytes();
    uint8_t* own_slot = static_cast<uint8_t*>(out->data()) + chunk * s->rank();
    // The in-place form: the input already is this rank's chunk of the
    // output, so gloo must not be given it (memcpy onto itself).
    const bool in_place = input.is_contiguous() && !out->staged() && input.data() == own_slot;
    absl::StatusOr<Staged> in = Staged::Of(input, /*copy_in=*/true);
    if (!in.ok()) return in.status();
    if (gloo_backend::ShmGroup* shm = s->shm()) {
      shm->AllGather(in->data(), out->data(), chunk, s->op_timeout());
      return out->CopyBack();
    }
    gloo_backend::RingAllGatherArgs args;
    args.input = in_place ? own_slot : in->data();
    args.output = out->data();
    args.count = static_cast<size_t>(input.numel());
    args.element_size = input.element_size();
    args.timeout = s->op_timeout();
    args.max_segment_bytes = s->options().all_gather_segment_bytes;
    gloo_backend::RingAllGather(s->context(), args);
    return out->CopyBack();
  });
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::ReduceScatter(Tensor input, Tensor output,
                                                                      ReduceOp op) {
  const std::string what = state_->Describe("reduce_scatter");
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckInputOutput(input, output)));
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, gloo_backend::CheckReduceSupported(input.dtype(), op)));
  if (input.numel() != output.numel() * size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": input has ", input.numel(),
                                                   " elements; expected group size ", size(),
                                                   " x output's ", output.numel()));
  }
  if (SpansOverlap(input, output) && !IsOwnChunk(output, input, rank())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": output ", output.DebugString(),
                                                   " overlaps input ", input.DebugString(),
                                                   " other than as this rank's chunk of it"));
  }
  State* s = state_.get();
  return s->Enqueue("reduce_scatter", [s, input, output, op]() -> absl::Status {
    if (output.numel() == 0) return absl::OkStatus();
    if (s->size() == 1) return gloo_backend::CopyFlat(output, input);
    absl::StatusOr<Staged> in = Staged::Of(input, /*copy_in=*/true);
    if (!in.ok()) return in.status();
    absl::StatusOr<Staged> out = Staged::Of(output, /*copy_in=*/false);
    if (!out.ok()) return out.status();
    absl::StatusOr<gloo_backend::ReduceFn> fn = gloo_backend::MakeReduceFn(input.dtype(), op);
    if (!fn.ok()) return fn.status();
    if (gloo_backend::ShmGroup* shm = s->shm()) {
      const size_t count = static_cast<size_t>(output.numel());
      shm->ReduceScatter(in->data(), out->data(), count, output.element_size(), *fn,
                         s->op_timeout());
      if (op == ReduceOp::kAvg) {
        gloo_backend::DivideInPlace(output.dtype(), out->data(), count, s->size());
      }
      return out->CopyBack();
    }
    gloo_backend::RingReduceScatterArgs args;
    args.input = in->data();
    args.output = out->data();
    args.count = static_cast<size_t>(output.numel());
    args.element_size = output.element_size();
    args.reduce = *fn;
    args.timeout = s->op_timeout();
    args.max_segment_bytes = s->options().reduce_scatter_segment_bytes;
    gloo_backend::RingReduceScatter(s->context(), args);
    if (op == ReduceOp::kAvg) {
      gloo_backend::DivideInPlace(output.dtype(), out->data(), args.count, s->size());
    }
    return out->CopyBack();
  });
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::AllToAll(
    Tensor input, Tensor output, std::vector<int64_t> input_splits,
    std::vector<int64_t> output_splits) {
  const std::string what = state_->Describe("all_to_all");
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckInputOutput(input, output)));
  if (input.dim() == 0 || output.dim() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": input and output need a dimension 0 to split; got ",
                     input.ShapeString(), " and ", output.ShapeString()));
  }
  const int n = size();
  // Element counts per member, from row splits of dimension 0.
  auto counts = [&](const Tensor& t, std::vector<int64_t>& splits,
                    absl::string_view which) -> absl::StatusOr<std::vector<int64_t>> {
    const int64_t rows = t.size(0);
    const int64_t row = rows == 0 ? 0 : t.numel() / rows;
    if (splits.empty()) {
      if (rows % n != 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", which, " dimension 0 (", rows,
                                                       ") is not divisible by the group size ", n,
                                                       " and no splits were given"));
      }
      splits.assign(n, rows / n);
    }
    if (static_cast<int>(splits.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", which, " splits have ",
                                                     splits.size(), " entries; the group has ", n));
    }
    int64_t sum = 0;
    std::vector<int64_t> elements(n);
    for (int j = 0; j < n; ++j) {
      if (splits[j] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": ", which, " split ", j, " is negative (", splits[j], ")"));
      }
      sum += splits[j];
      elements[j] = splits[j] * row;
    }
    if (sum != rows) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", which, " splits [",
                                                     absl::StrJoin(splits, ", "), "] sum to ", sum,
                                                     "; dimension 0 has ", rows, " rows"));
    }
    return elements;
  };
  absl::StatusOr<std::vector<int64_t>> in_counts = counts(input, input_splits, "input");
  if (!in_counts.ok()) return in_counts.status();
  absl::StatusOr<std::vector<int64_t>> out_counts = counts(output, output_splits, "output");
  if (!out_counts.ok()) return out_counts.status();
  if ((*in_counts)[rank()] != (*out_counts)[rank()]) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": this rank sends ", (*in_counts)[rank()],
                                                   " elements to itself but expects ",
                                                   (*out_counts)[rank()]));
  }
  State* s = state_.get();
  return s->Enqueue("all_to_all",
                    [s, input, output, in_counts = *std::move(in_counts),
                     out_counts = *std::move(out_counts)]() -> absl::Status {
                      if (s->size() == 1) return gloo_backend::CopyFlat(output, input);
                      // Never skipped for zero elements: the peers post (empty) messages to
                      // this rank whatever it holds.
                      absl::StatusOr<Staged> in = Staged::Of(input, /*copy_in=*/true);
                      if (!in.ok()) return in.status();
                      absl::StatusOr<Staged> out = Staged::Of(output, /*copy_in=*/false);
                      if (!out.ok()) return out.status();
                      if (gloo_backend::ShmGroup* shm = s->shm()) {
                        const size_t es = input.element_size();
                        const int n = s->size();
                        std::vector<size_t> in_off(n), in_len(n), out_off(n), out_len(n);
                        size_t in_at = 0, out_at = 0;
                        for (int j = 0; j < n; ++j) {
                          in_off[j] = in_at;
                          in_len[j] = static_cast<size_t>(in_counts[j]) * es;
                          in_at += in_len[j];
                          out_off[j] = out_at;
                          out_len[j] = static_cast<size_t>(out_counts[j]) * es;
                          out_at += out_len[j];
                        }
                        shm->AllToAll(in->data(), in_off, in_len, out->data(), out_off, out_len,
                                      s->op_timeout());
                        return out->CopyBack();
                      }
                      ::gloo::AlltoallvOptions opts(s->context());
                      DispatchElementSize(input.element_size(), [&](auto elem) {
                        using T = decltype(elem);
                        opts.setInput(static_cast<T*>(in->data()), in_counts);
                        opts.setOutput(static_cast<T*>(out->data()), out_counts);
                      });
                      opts.setTimeout(s->op_timeout());
                      ::gloo::alltoallv(opts);
                      return out->CopyBack();
                    });
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::Send(Tensor tensor, int peer, int tag) {
  const std::string what = state_->Describe("send");
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckCpu(tensor, "tensor")));
  if (peer < 0 || peer >= size() || peer == rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": peer ", peer, " must be another rank of this group of ", size()));
  }
  if (tag < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": tag ", tag, " is negative"));
  }
  return state_->PostPointToPoint(/*send=*/true, tensor, peer, tag);
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::Recv(Tensor tensor, int peer, int tag) {
  const std::string what = state_->Describe("recv");
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckCpu(tensor, "tensor")));
  MESH_GLOO_RETURN_IF_ERROR(Prefixed(what, CheckWritable(tensor, "tensor")));
  if (peer < 0 || peer >= size() || peer == rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": peer ", peer, " must be another rank of this group of ", size()));
  }
  if (tag < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": tag ", tag, " is negative"));
  }
  return state_->PostPointToPoint(/*send=*/false, tensor, peer, tag);
}

absl::StatusOr<ProcessGroup::WorkPtr> ProcessGroupGloo::Barrier() {
  State* s = state_.get();
  return s->Enqueue("barrier", [s]() -> absl::Status {
    if (s->size() == 1) return absl::OkStatus();
    if (gloo_backend::ShmGroup* shm = s->shm()) {
      shm->Barrier(s->op_timeout());
      return absl::OkStatus();
    }
    ::gloo::BarrierOptions opts(s->context());
    opts.setTimeout(s->op_timeout());
    ::gloo::barrier(opts);
    return absl::OkStatus();
  });
}

}  // namespace mesh
