// FakeGroup and FakeFactory: a ProcessGroup and a ProcessGroupFactory for
// tests of code that makes, holds or aborts groups without running
// collectives (DeviceMesh, the Runtime's decorating factory). Every op of a
// FakeGroup is UNIMPLEMENTED; Abort records its first reason as health() and
// counts the calls.
//
// Thread safety: thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "mesh/process_group.h"

namespace mesh::testing {

class FakeGroup final : public ProcessGroup {
 public:
  FakeGroup(int rank, std::vector<int> ranks, std::string name)
      : ProcessGroup(rank, std::move(ranks), std::move(name), ProcessGroupOptions{}) {}

  absl::string_view backend() const override { return "fake"; }
  absl::StatusOr<WorkPtr> AllReduce(Tensor, ReduceOp) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> AllReduce(Tensor, Tensor, ReduceOp) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> Broadcast(Tensor, int) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> Reduce(Tensor, int, ReduceOp) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> AllGather(Tensor, Tensor) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> ReduceScatter(Tensor, Tensor, ReduceOp) override {
    return Unimplemented();
  }
  absl::StatusOr<WorkPtr> AllToAll(Tensor, Tensor, std::vector<int64_t>,
                                   std::vector<int64_t>) override {
    return Unimplemented();
  }
  absl::StatusOr<WorkPtr> Send(Tensor, int, int) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> Recv(Tensor, int, int) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> Barrier() override { return Unimplemented(); }
  void Abort(absl::Status reason) override {
    absl::MutexLock lock(&mu_);
    ++aborts_;
    if (health_.ok()) health_ = std::move(reason);
  }
  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return health_;
  }
  // How many times Abort was called.
  int aborts() const {
    absl::MutexLock lock(&mu_);
    return aborts_;
  }

 private:
  static absl::Status Unimplemented() { return absl::UnimplementedError("fake group"); }
  mutable absl::Mutex mu_;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
};

// A ProcessGroupFactory of FakeGroups named "<family>/<color>". It records
// every NewGroups call and keeps every group it made, so that a test can
// look at a group after whatever wrapped it is gone. FailWith makes the next
// calls fail; CorruptMembers makes groups whose member order (and so the
// caller's rank in them) disagrees with their spec. Thread-safe.
class FakeFactory final : public ProcessGroupFactory {
 public:
  FakeFactory(int rank, int world_size) : rank_(rank), world_size_(world_size) {}

  int world_rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::StatusOr<std::shared_ptr<ProcessGroup>> World() override {
    absl::MutexLock lock(&mu_);
    ++world_calls_;
    if (world_ == nullptr) {
      std::vector<int> all;
      for (int r = 0; r < world_size_; ++r) all.push_back(r);
      world_ = std::make_shared<FakeGroup>(rank_, all, "world");
    }
    return world_;
  }

  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroups(
      const std::vector<GroupSpec>& specs) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back(specs);
    if (!fail_with_.ok()) return fail_with_;
    std::vector<std::shared_ptr<ProcessGroup>> groups;
    for (const GroupSpec& spec : specs) {
      int rank = -1;
      for (size_t i = 0; i < spec.global_ranks.size(); ++i) {
        if (spec.global_ranks[i] == rank_) rank = static_cast<int>(i);
      }
      if (rank < 0) return absl::InvalidArgumentError("spec omits the caller");
      std::vector<int> members = spec.global_ranks;
      if (corrupt_members_) std::reverse(members.begin(), members.end());
      auto group = std::make_shared<FakeGroup>(
          corrupt_members_ ? static_cast<int>(members.size()) - 1 - rank : rank, members,
          absl::StrCat(spec.family, "/", spec.color));
      made_.push_back(group);
      groups.push_back(std::move(group));
    }
    return groups;
  }

  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsAmongMembers(
      const std::vector<GroupSpec>& specs) override {
    {
      absl::MutexLock lock(&mu_);
      ++members_only_calls_;
    }
    return NewGroups(specs);
  }

  // Records the membership each call was within, then NewGroups; the
  // default NewMembership (a plain Membership) stands.
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsWithin(
      const Membership& membership, const std::vector<GroupSpec>& specs) override {
    if (absl::Status s = CheckGroupsWithin(membership, specs); !s.ok()) return s;
    {
      absl::MutexLock lock(&mu_);
      within_.push_back(membership.family());
    }
    return NewGroups(specs);
  }

  void AbortAll(absl::Status) override {}

  // The group named `name` (the latest one made with that name), or null.
  std::shared_ptr<FakeGroup> made(const std::string& name) const {
    absl::MutexLock lock(&mu_);
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      if ((*it)->name() == name) return *it;
    }
    return nullptr;
  }
  std::shared_ptr<FakeGroup> world() const {
    absl::MutexLock lock(&mu_);
    return world_;
  }
  // The specs of every NewGroups (and NewGroupsAmongMembers) call, in order.
  std::vector<std::vector<GroupSpec>> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  int world_calls() const {
    absl::MutexLock lock(&mu_);
    return world_calls_;
  }
  int members_only_calls() const {
    absl::MutexLock lock(&mu_);
    return members_only_calls_;
  }
  // The membership family of each NewGroupsWithin call, in order.
  std::vector<std::string> within() const {
    absl::MutexLock lock(&mu_);
    return within_;
  }
  void FailWith(absl::Status status) {
    absl::MutexLock lock(&mu_);
    fail_with_ = std::move(status);
  }
  void CorruptMembers() {
    absl::MutexLock lock(&mu_);
    corrupt_members_ = true;
  }

 private:
  const int rank_;
  const int world_size_;
  mutable absl::Mutex mu_;
  std::shared_ptr<FakeGroup> world_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<FakeGroup>> made_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<GroupSpec>> calls_ ABSL_GUARDED_BY(mu_);
  int world_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int members_only_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> within_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_with_ ABSL_GUARDED_BY(mu_);
  bool corrupt_members_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mesh::testing
