// ProgressProcessGroup: a ProcessGroup decorator that numbers the group's
// collectives in a GroupProgress (mesh/progress.h), so that the heartbeat
// summary says which op each rank is in. The Runtime wraps every group its
// factory makes with it; backends stay untouched.
//
// For every collective: Enter before the inner call (so an op that blocks
// inside the backend is already counted), Attach the backend's Work so that
// a heartbeat can see it complete, and Complete the first time the caller
// sees it complete (Wait returning with the op done, IsCompleted, status).
// An op the backend refuses counts as completed at once. Send and Recv pass
// through unnumbered (mesh/progress.h says why).
//
// Thread safety: thread-safe, as the group it wraps.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "libmesh/src/decorating_factory.h"
#include "mesh/process_group.h"
#include "mesh/progress.h"

namespace mesh::internal {

class ProgressProcessGroup final : public ProcessGroup {
 public:
  // Registers the group in `registry` under its name and members.
  ProgressProcessGroup(std::shared_ptr<ProcessGroup> inner, ProgressRegistry& registry);

  const std::shared_ptr<ProcessGroup>& inner() const { return inner_; }
  const std::shared_ptr<GroupProgress>& progress() const { return progress_; }

  absl::string_view backend() const override { return inner_->backend(); }
  const ProcessGroup& Underlying() const override { return inner_->Underlying(); }
  absl::StatusOr<WorkPtr> AllReduce(Tensor tensor, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllReduce(Tensor input, Tensor output, ReduceOp op) override;
  absl::StatusOr<WorkPtr> Broadcast(Tensor tensor, int root) override;
  absl::StatusOr<WorkPtr> Reduce(Tensor tensor, int root, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllGather(Tensor input, Tensor output) override;
  absl::StatusOr<WorkPtr> ReduceScatter(Tensor input, Tensor output, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllToAll(Tensor input, Tensor output, std::vector<int64_t> input_splits,
                                   std::vector<int64_t> output_splits) override;
  absl::StatusOr<WorkPtr> Send(Tensor tensor, int peer, int tag) override {
    return inner_->Send(std::move(tensor), peer, tag);
  }
  absl::StatusOr<WorkPtr> Recv(Tensor tensor, int peer, int tag) override {
    return inner_->Recv(std::move(tensor), peer, tag);
  }
  absl::StatusOr<WorkPtr> Barrier() override;
  void Abort(absl::Status reason) override { inner_->Abort(std::move(reason)); }
  absl::Status health() const override { return inner_->health(); }

 private:
  // Records op `seq`'s outcome: a refused op completes at once; an accepted
  // one is attached and wrapped.
  absl::StatusOr<WorkPtr> Track(uint64_t seq, absl::StatusOr<WorkPtr> work);

  const std::shared_ptr<ProcessGroup> inner_;
  const std::shared_ptr<GroupProgress> progress_;
};

class ProgressProcessGroupFactory final : public DecoratingProcessGroupFactory {
 public:
  // `registry` is shared: groups keep recording into it after the Runtime
  // that made them is gone.
  ProgressProcessGroupFactory(std::shared_ptr<ProcessGroupFactory> inner,
                              std::shared_ptr<ProgressRegistry> registry)
      : DecoratingProcessGroupFactory(std::move(inner)), registry_(std::move(registry)) {}

 private:
  std::shared_ptr<ProcessGroup> Wrap(std::shared_ptr<ProcessGroup> group) override {
    return std::make_shared<ProgressProcessGroup>(std::move(group), *registry_);
  }

  const std::shared_ptr<ProgressRegistry> registry_;
};

}  // namespace mesh::internal
