// DecoratingProcessGroupFactory: a ProcessGroupFactory that wraps every group
// another factory makes in a decorator of its subclass's choosing (worker
// metrics, collective progress). The world group is wrapped once and shared,
// as ProcessGroupFactory's contract asks; the inner factory's World and
// NewGroups run without any lock held here (they are collective and may
// block).
//
// Thread safety: thread-safe, as the inner factory.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "mesh/process_group.h"

namespace mesh::internal {

class DecoratingProcessGroupFactory : public ProcessGroupFactory {
 public:
  int world_rank() const final { return inner_->world_rank(); }
  int world_size() const final { return inner_->world_size(); }
  absl::StatusOr<std::shared_ptr<ProcessGroup>> World() final {
    absl::StatusOr<std::shared_ptr<ProcessGroup>> world = inner_->World();
    if (!world.ok()) return world;
    absl::MutexLock lock(&mu_);
    if (world_ == nullptr) world_ = Wrap(*std::move(world));
    return world_;
  }
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroups(
      const std::vector<GroupSpec>& specs) final {
    absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> groups = inner_->NewGroups(specs);
    if (!groups.ok()) return groups;
    for (std::shared_ptr<ProcessGroup>& group : *groups) group = Wrap(std::move(group));
    return groups;
  }
  void AbortAll(absl::Status reason) final { inner_->AbortAll(std::move(reason)); }

 protected:
  explicit DecoratingProcessGroupFactory(std::shared_ptr<ProcessGroupFactory> inner)
      : inner_(std::move(inner)) {}

  // The decorator around `group`, a group the inner factory made.
  virtual std::shared_ptr<ProcessGroup> Wrap(std::shared_ptr<ProcessGroup> group) = 0;

 private:
  const std::shared_ptr<ProcessGroupFactory> inner_;
  absl::Mutex mu_;
  std::shared_ptr<ProcessGroup> world_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::internal
