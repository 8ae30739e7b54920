#include "libmesh/src/progress_group.h"

#include <atomic>
#include <utility>

namespace mesh::internal {
namespace {

// Holds the backend's Work and completes op `seq` the first time the caller
// sees it done.
class ProgressWork final : public Work {
 public:
  ProgressWork(std::shared_ptr<Work> inner, std::shared_ptr<GroupProgress> progress, uint64_t seq,
               absl::Duration default_timeout)
      : inner_(std::move(inner)),
        progress_(std::move(progress)),
        seq_(seq),
        default_timeout_(default_timeout) {}

  using Work::Wait;
  absl::Status Wait(absl::Duration timeout) override {
    absl::Status status = inner_->Wait(timeout);
    NoteIfCompleted();
    return status;
  }
  bool IsCompleted() const override {
    const bool completed = inner_->IsCompleted();
    if (completed) Note();
    return completed;
  }
  absl::Status status() const override {
    absl::Status status = inner_->status();
    NoteIfCompleted();
    return status;
  }
  void Abort(absl::Status reason) override { inner_->Abort(std::move(reason)); }

 protected:
  absl::Duration default_timeout() const override { return default_timeout_; }

 private:
  void NoteIfCompleted() const {
    if (!noted_.load(std::memory_order_relaxed) && inner_->IsCompleted()) Note();
  }
  void Note() const {
    if (!noted_.exchange(true)) progress_->Complete(seq_);
  }

  const std::shared_ptr<Work> inner_;
  const std::shared_ptr<GroupProgress> progress_;
  const uint64_t seq_;
  const absl::Duration default_timeout_;
  mutable std::atomic<bool> noted_{false};
};

}  // namespace

ProgressProcessGroup::ProgressProcessGroup(std::shared_ptr<ProcessGroup> inner,
                                           ProgressRegistry& registry)
    : ProcessGroup(inner->rank(), inner->global_ranks(), inner->name(), inner->options()),
      inner_(std::move(inner)),
      progress_(registry.Add(inner_->name(), inner_->global_ranks())) {}

absl::StatusOr<ProcessGroup::WorkPtr> ProgressProcessGroup::Track(uint64_t seq,
                                                                  absl::StatusOr<WorkPtr> work) {
  if (!work.ok()) {
    progress_->Complete(seq);
    return work;
  }
  progress_->Attach(seq, *work);
  return WorkPtr(
      std::make_shared<ProgressWork>(*std::move(work), progress_, seq, options().timeout));
}

absl::StatusOr<ProcessGroup::WorkPtr> ProgressProcessGroup::AllReduce(Tensor tensor, ReduceOp op) {
  const uint64_t seq = progress_->Enter(CollectiveKind::kAllReduce);
  return Track(seq, inner_->AllReduce(std::move(tensor), op));
}

absl::StatusOr<ProcessGroup::WorkPtr> ProgressProcessGroup::AllReduce(Tensor input, Tensor output,
                                                                      ReduceOp op) {
  const uint64_t seq = progress_->Enter(CollectiveKind::kAllReduce);
  return Track(seq, inner_->AllReduce(std::move(input), std::move(output), op));
}

absl::StatusOr<ProcessGroup::WorkPtr> ProgressProcessGroup::Broadcast(Tensor tensor, int root) {
  const uint64_t seq = progress_->Enter(CollectiveKind::kBroadcast);
  return Track(seq, inner_->Broadcast(std::move(tensor), root));
}

absl::StatusOr<ProcessGroup::WorkPtr> ProgressProcessGroup::Reduce(Tensor tensor, int root,
                                                                   ReduceOp op) {
  const uint64_t seq = progress_->Enter(CollectiveKind::kReduce);
  return Track(seq, inner_->Reduce(std::move(tensor), root, op));
}

absl::StatusOr<ProcessGroup::WorkPtr> ProgressProcessGroup::AllGather(Tensor input, Tensor output) {
  const uint64_t seq = progress_->Enter(CollectiveKind::kAllGather);
  return Track(seq, inner_->AllGather(std::move(input), std::move(output)));
}

absl::StatusOr<ProcessGroup::WorkPtr> ProgressProcessGroup::ReduceScatter(Tensor input,
                                                                          Tensor output,
                                                                          ReduceOp op) {
  const uint64_t seq = progress_->Enter(CollectiveKind::kReduceScatter);
  return Track(seq, inner_->ReduceScatter(std::move(input), std::move(output), op));
}

absl::StatusOr<ProcessGroup::WorkPtr> ProgressProcessGroup::AllToAll(
    Tensor input, Tensor output, std::vector<int64_t> input_splits,
    std::vector<int64_t> output_splits) {
  const uint64_t seq = progress_->Enter(CollectiveKind::kAllToAll);
  return Track(seq, inner_->AllToAll(std::move(input), std::move(output), std::move(input_splits),
                                     std::move(output_splits)));
}

absl::StatusOr<ProcessGroup::WorkPtr> ProgressProcessGroup::Barrier() {
  const uint64_t seq = progress_->Enter(CollectiveKind::kBarrier);
  return Track(seq, inner_->Barrier());
}

}  // namespace mesh::internal
