// DecoratingProcessGroupFactory: a ProcessGroupFactory that wraps every group
// another factory makes in a decorator of its subclass's choosing (worker
// metrics, collective progress). The world group is wrapped once and shared,
// as ProcessGroupFactory's contract asks; the inner factory's World and
// NewGroups run without any lock held here (they are collective and may
// block). It remembers the groups it made (weakly) for AbortGroupsWith.
//
// Thread safety: thread-safe, as the inner factory.
#pragma once

#include <algorithm>
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
    return Adopt(inner_->NewGroups(specs));
  }
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsAmongMembers(
      const std::vector<GroupSpec>& specs) final {
    return Adopt(inner_->NewGroupsAmongMembers(specs));
  }
  // A membership is not a group: it is neither wrapped nor remembered, so
  // AbortGroupsWith leaves it alone (the backend derives the survivors'
  // membership from it).
  absl::StatusOr<std::shared_ptr<Membership>> NewMembership(
      const GroupSpec& spec, const std::shared_ptr<Membership>& previous) final {
    return inner_->NewMembership(spec, previous);
  }
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsWithin(
      const Membership& membership, const std::vector<GroupSpec>& specs) final {
    return Adopt(inner_->NewGroupsWithin(membership, specs));
  }
  void AbortAll(absl::Status reason) final { inner_->AbortAll(std::move(reason)); }

  // Aborts (ProcessGroup::Abort) every group made here, the world's
  // included, that is still held and has any of `world_ranks` among its
  // members; the others and later groups are untouched. In-place recovery
  // uses it to end, at once, the collectives that wait for a lost rank.
  void AbortGroupsWith(const std::vector<int>& world_ranks, const absl::Status& reason) {
    std::vector<std::shared_ptr<ProcessGroup>> held;
    {
      absl::MutexLock lock(&mu_);
      if (world_ != nullptr) held.push_back(world_);
      for (const std::weak_ptr<ProcessGroup>& weak : made_) {
        if (std::shared_ptr<ProcessGroup> group = weak.lock()) held.push_back(std::move(group));
      }
    }
    for (const std::shared_ptr<ProcessGroup>& group : held) {
      const std::vector<int>& members = group->global_ranks();
      const bool hit = std::any_of(members.begin(), members.end(), [&](int rank) {
        return std::find(world_ranks.begin(), world_ranks.end(), rank) != world_ranks.end();
      });
      if (hit) group->Abort(reason);
    }
  }

 protected:
  explicit DecoratingProcessGroupFactory(std::shared_ptr<ProcessGroupFactory> inner)
      : inner_(std::move(inner)) {}

  // The decorator around `group`, a group the inner factory made.
  virtual std::shared_ptr<ProcessGroup> Wrap(std::shared_ptr<ProcessGroup> group) = 0;

 private:
  // Wraps every group the inner factory made and remembers it for
  // AbortGroupsWith.
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> Adopt(
      absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> groups) {
    if (!groups.ok()) return groups;
    for (std::shared_ptr<ProcessGroup>& group : *groups) group = Wrap(std::move(group));
    absl::MutexLock lock(&mu_);
    // Forget groups their users dropped, so rebuilding in a loop does not
    // grow the list.
    made_.erase(std::remove_if(made_.begin(), made_.end(),
                               [](const std::weak_ptr<ProcessGroup>& g) { return g.expired(); }),
                made_.end());
    made_.insert(made_.end(), groups->begin(), groups->end());
    return groups;
  }

  const std::shared_ptr<ProcessGroupFactory> inner_;
  absl::Mutex mu_;
  std::shared_ptr<ProcessGroup> world_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<ProcessGroup>> made_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::internal
